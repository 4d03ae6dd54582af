-- floodwall frequency control, "at most M per N": INCRBY + PEXPIRE in one step.
-- KEYS[1]: the counter. ARGV: M (limit), N in milliseconds, cost.
-- A refused call does not count. The window starts at the first counted call and the key
-- expires with it (a fixed window per key, on the server's clock).
-- Returns {allowed (0/1), count after the call, ms until the window resets}.
local limit = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local count = tonumber(redis.call('GET', KEYS[1]) or '0')
if count + cost > limit then
  local left = redis.call('PTTL', KEYS[1])
  if left == -1 then
    redis.call('PEXPIRE', KEYS[1], ttl)
    left = ttl
  elseif left < 0 then
    left = 0
  end
  return {0, count, left}
end
count = redis.call('INCRBY', KEYS[1], cost)
local left = redis.call('PTTL', KEYS[1])
if left < 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
  left = ttl
end
return {1, count, left}
