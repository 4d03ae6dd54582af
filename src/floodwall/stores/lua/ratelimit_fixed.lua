-- floodwall global rate limit: fixed window, a batch of requests on one key.
-- KEYS[1]: "<count> <window_end_us>". ARGV: limit, period_us, then one (cost_min, cost_max)
-- pair per request, in arrival order.
-- A window opens at the first request after the previous one closed and lasts period_us; a
-- request is admitted while the window's count stays within limit, and takes
-- min(cost_max, what is left) when at least cost_min is left (cost_min = cost_max: a plain
-- decision; cost_min < cost_max: a lease). The only clock is TIME, in whole microseconds.
-- Reply: "<now_us>" then per request "<allowed> <granted> <remaining> <reset_us> <retry_us>"
-- (retry_us -1: never, the cost exceeds the limit). The mirror of FixedWindowStep in
-- floodwall/ratelimit/_steps.py (take, figures) and FixedWindowOp's record.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local limit = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local count, wend = 0, nil
local v = redis.call('GET', KEYS[1])
if v then
  local sp = string.find(v, ' ', 1, true)
  count = tonumber(string.sub(v, 1, sp - 1))
  wend = tonumber(string.sub(v, sp + 1))
end
local opened = false
if not wend or now >= wend then
  count, wend, opened = 0, now + period, true
end
local left = wend - now
local out = {string.format('%.0f', now)}
local granted = 0
for i = 3, #ARGV, 2 do
  local cmin, cmax = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  local take = math.min(cmax, limit - count)
  local allowed, retry = 0, 0
  if take >= cmin then
    allowed, count, granted = 1, count + take, granted + take
  else
    take = 0
    retry = left
    if cmin > limit then retry = -1 end
  end
  out[#out + 1] = string.format('%d %.0f %.0f %.0f %.0f', allowed, take, limit - count, left, retry)
end
if opened or granted > 0 then
  redis.call('SET', KEYS[1], string.format('%.0f %.0f', count, wend), 'PX',
    math.floor(left / 1000) + 1)
end
return table.concat(out, ' ')
