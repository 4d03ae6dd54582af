-- floodwall idempotency: read a record. KEYS[1]: the record.
-- Returns {} when absent, else {state, fingerprint, result, ms_left}.
local rec = redis.call('HMGET', KEYS[1], 's', 'f', 'r')
if not rec[1] then
  return {}
end
return {rec[1], rec[2] or '', rec[3] or '', redis.call('PTTL', KEYS[1])}
