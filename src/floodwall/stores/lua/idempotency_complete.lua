-- floodwall idempotency: store the result of the request this owner claimed.
-- KEYS[1]: the record. ARGV: owner, fingerprint, result, ttl_ms.
-- Returns 'stored' (also when run again by the same owner); 'stored_late' when the claim had
-- lapsed and nobody else took the key (the result is stored all the same); 'conflict' when
-- another owner holds or finished the key.
local rec = redis.call('HMGET', KEYS[1], 's', 'o')
local status = 'stored'
if rec[1] then
  if rec[2] ~= ARGV[1] then
    return 'conflict'
  end
  if rec[1] == 'd' then
    return 'stored'
  end
else
  status = 'stored_late'
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 's', 'd', 'o', ARGV[1], 'f', ARGV[2], 'r', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return status
