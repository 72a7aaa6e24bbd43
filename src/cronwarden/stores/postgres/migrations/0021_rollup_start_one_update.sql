-- Version 21: a run's start (and a refused start) updates its job's rollup
-- row once, and inserts it only for the job's first: the insert that did
-- nothing and the second update of a row rewritten whole (about 3 KB)
-- were most of what keeping the rollup cost a start.

CREATE OR REPLACE FUNCTION {s}.rollup_start() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    LOOP
        UPDATE {s}.rollups SET
            attempts = CASE WHEN jsonb_array_length(attempts) >= 16 THEN attempts - 0 ELSE attempts END
                       || jsonb_build_array(jsonb_build_array(NEW.started_at, NEW.slot)),
            skips_in_a_row = CASE WHEN last_start IS NULL OR NEW.started_at >= last_start
                                  THEN (SELECT count(*) FROM jsonb_array_elements(skip_times) t
                                        WHERE t::text::double precision >= NEW.started_at)
                                  ELSE skips_in_a_row END,
            last_start = greatest(last_start, NEW.started_at)
        WHERE job = NEW.job;
        EXIT WHEN FOUND;
        INSERT INTO {s}.rollups (job) VALUES (NEW.job) ON CONFLICT (job) DO NOTHING;
    END LOOP;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION {s}.rollup_refusal() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    LOOP
        UPDATE {s}.rollups SET
            last_overlap = CASE WHEN NEW.kind = 'overlap' THEN greatest(last_overlap, NEW.at) ELSE last_overlap END,
            last_refusal = CASE WHEN NEW.kind = 'overlap' THEN last_refusal ELSE greatest(last_refusal, NEW.at) END,
            skips = skips + (NEW.kind = 'skipped')::integer,
            skips_in_a_row = skips_in_a_row
                + (NEW.kind = 'skipped' AND (last_start IS NULL OR NEW.at >= last_start))::integer,
            attempts = CASE WHEN NEW.kind NOT IN ('skipped', 'queue_full') THEN attempts
                            WHEN jsonb_array_length(attempts) >= 16
                            THEN (attempts - 0) || jsonb_build_array(jsonb_build_array(NEW.at, NULL))
                            ELSE attempts || jsonb_build_array(jsonb_build_array(NEW.at, NULL)) END,
            skip_times = CASE WHEN NEW.kind <> 'skipped' THEN skip_times
                              WHEN jsonb_array_length(skip_times) >= 50 THEN (skip_times - 0) || to_jsonb(NEW.at)
                              ELSE skip_times || to_jsonb(NEW.at) END
        WHERE job = NEW.job;
        EXIT WHEN FOUND;
        INSERT INTO {s}.rollups (job) VALUES (NEW.job) ON CONFLICT (job) DO NOTHING;
    END LOOP;
    RETURN NULL;
END $$;
