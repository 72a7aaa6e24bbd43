ALTER TABLE {s}.runs DISABLE TRIGGER rollup_end;
CREATE FUNCTION {s}.rollup_floor() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN UPDATE {s}.rollups SET ended = ended + 1 WHERE job = NEW.job; RETURN NULL; END $$;
CREATE TRIGGER rollup_floor AFTER UPDATE OF outcome ON {s}.runs FOR EACH ROW WHEN (OLD.outcome IS NULL AND NEW.outcome IS NOT NULL) EXECUTE FUNCTION {s}.rollup_floor();
