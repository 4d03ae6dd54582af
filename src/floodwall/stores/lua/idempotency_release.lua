-- floodwall idempotency: give up this owner's claim (the call failed; a retry may run).
-- KEYS[1]: the record. ARGV: owner. Returns 1 when released, 0 when the claim was not ours.
local rec = redis.call('HMGET', KEYS[1], 's', 'o')
if rec[1] == 'p' and rec[2] == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
