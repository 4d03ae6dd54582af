-- floodwall time-slice global limiting: one instance's report at the end of its slice.
-- KEYS[1]: the reports, a hash instance -> "<at_us> <qps>"; KEYS[2]: the elected instance's
-- lease (its id); KEYS[3]: the published drop rate, in parts per million.
-- ARGV: instance id, requests it counted in its slice (admitted or not), the slice's length as it
-- measured it (µs), the global limit (milli-requests per second), the slice length (µs),
-- stale slices (a report older than this many slices no longer counts), lease slices (how long
-- the elected instance's lease and the published rate last without renewal).
-- The reporting instance takes the lease if it is free (renews it if it holds it). The holder
-- sums the live reports into the cluster's QPS and publishes
-- drop = max(0, (QPS - limit) / QPS); the others read what it published (0 when nothing is).
-- The only clock is TIME. Reply: "<drop_ppm> <1 if elected else 0> <qps_milli or -1> <instances>".
-- The same logic as TimeSliceSyncOp.step.
local function fdiv(a, b) -- floor(a / b), exact for integers below 2^53
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local me = ARGV[1]
local count, elapsed = tonumber(ARGV[2]), tonumber(ARGV[3])
local limit = tonumber(ARGV[4]) / 1000
local slice = tonumber(ARGV[5])
local stale = tonumber(ARGV[6]) * slice
local keep = fdiv(tonumber(ARGV[7]) * slice, 1000) + 1
local qps = 0
if elapsed > 0 then qps = count * 1000000 / elapsed end
redis.call('HSET', KEYS[1], me, string.format('%.0f %.17g', now, qps))
redis.call('PEXPIRE', KEYS[1], keep)
local leader = redis.call('GET', KEYS[2])
if not leader then
  redis.call('SET', KEYS[2], me, 'PX', keep)
  leader = me
elseif leader == me then
  redis.call('PEXPIRE', KEYS[2], keep)
end
if leader ~= me then
  return (redis.call('GET', KEYS[3]) or '0') .. ' 0 -1 0'
end
local flat = redis.call('HGETALL', KEYS[1])
local total, n = 0, 0
for i = 1, #flat, 2 do
  local v = flat[i + 1]
  local sp = string.find(v, ' ', 1, true)
  if now - tonumber(string.sub(v, 1, sp - 1)) > stale then
    redis.call('HDEL', KEYS[1], flat[i])
  else
    total, n = total + tonumber(string.sub(v, sp + 1)), n + 1
  end
end
local ppm = 0
if total > limit then ppm = math.floor((total - limit) / total * 1000000 + 0.5) end
redis.call('SET', KEYS[3], string.format('%d', ppm), 'PX', keep)
return string.format('%d 1 %.0f %d', ppm, total * 1000, n)
