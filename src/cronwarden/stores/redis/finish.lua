-- with: limits, fence, rollup, ledger
-- types: hash string hash hash zset hash zset hash hash hash hash zset
-- Store.finish: the terminal record, the release, or the hand-over to the
-- queued start `then` with the next token.
-- KEYS: 1 lease, 2 live, 3 open runs, 4 finished runs, 5 job index, 6 event records,
--       7 run id index, 8 jobs -> events written, 9-11 rollups (rollup.lua), and with then:
--       12 then's job index
-- ARGV[1]: a JSON array of texts: 1 run id, 2 job, 3 key, 4 the terminal event's kind, 5 the end of
--          the run record, 6 at, 7 athex, 8 the event's data without its closing brace, 9 its event id,
--          10 '1' for a side lease, and with then: 11-21 then's start (read_start)
ROLLUPS = {KEYS[9], KEYS[10], KEYS[11]}
local a = cjson.decode(ARGV[1])
local run_id, job, at = a[1], a[2], a[6]
local h = redis.call('HMGET', KEYS[1], 'owner', 'token', 'srv', 'pending', 'job', 'host', 'pid', 'started',
  'slot', 'rseq')
-- While a run is open its lease names it: abandonment, hand-over and
-- release all close the run in the same step that changes the owner.
-- So a run that does not own its lease has its terminal record already.
if h[1] ~= run_id then
  -- A retried finish whose first try (reply lost) handed the lease to the
  -- queued run: report that hand-over again instead of losing the run.
  if a[11] and h[1] == a[11] then return {1, 0, h[2]} end
  -- A retried finish whose first try released: its run record ends as this
  -- call says (same outcome, time, exit code and detail). Owned, and recorded
  -- already, as the hand-over's retry reports.
  local done = redis.call('HGET', KEYS[4], run_id)
  if done and string.find(done, ',' .. a[5] .. '}', 1, true) then return {1, 0} end
  return {0, 0}
end
local recorded = 0
if redis.call('HDEL', KEYS[3], run_id) == 1 then
  redis.call('HSET', KEYS[4], run_id, run_record(h[5] or job, a[3], h[6] or '?', h[7] or '0', h[2],
    h[9] or 'null', h[8] or at, a[5]))
  add_event(KEYS[5], a[9], a[4], job, run_id, at, a[7],
    a[8] .. ',"duration":' .. string.format('%.6f', tonumber(at) - tonumber(h[8] or at)) .. '}',
    h[10] ~= '' and h[10] or nil, {h[8] or at, a[3]})
  recorded = 1
end
if a[10] == '1' then
  redis.call('DEL', KEYS[1], KEYS[2])
  flush(KEYS[6], KEYS[7], KEYS[8], KEYS[4])
  return {1, recorded}
end
if a[11] and tonumber(h[4] or '0') > 0 then
  redis.call('HINCRBY', KEYS[1], 'pending', -1)
  local ts = grant(KEYS[1], KEYS[2], KEYS[3], KEYS[12], h[2], h[3], read_start(a, 11))
  flush(KEYS[6], KEYS[7], KEYS[8], KEYS[4])
  return {1, recorded, ts}
end
-- Released: the owner field goes (with the fields of earlier versions that
-- only an open run had). The live key is left to expire by its PX: nothing
-- reads it without an owner (acquire, renew and the read side all start from
-- the owner field), and the next grant overwrites it.
redis.call('HDEL', KEYS[1], 'owner', 'revoked_by', 'rseq', 'rec', 'hold', 'recfor')
flush(KEYS[6], KEYS[7], KEYS[8], KEYS[4])
return {1, recorded}
