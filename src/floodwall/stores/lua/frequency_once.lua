-- floodwall frequency control, "once per N": SET NX PX.
-- KEYS[1]: the key. ARGV[1]: N in milliseconds.
-- Returns {1, ttl_ms} when this call took the slot, {0, ms_left} when the slot was taken.
-- The only clock is the server's key expiry.
local ttl = tonumber(ARGV[1])
if redis.call('SET', KEYS[1], '1', 'PX', ttl, 'NX') then
  return {1, ttl}
end
local left = redis.call('PTTL', KEYS[1])
if left < 0 then
  -- a key without expiry cannot come from floodwall; repair it rather than block forever
  redis.call('PEXPIRE', KEYS[1], ttl)
  left = ttl
end
return {0, left}
