-- floodwall global rate limit: sliding window counter, a batch of requests on one key.
-- KEYS[1]: "<previous> <current> <window_end_us>" for a grid of period_us windows aligned to
-- multiples of period_us on the server's clock. ARGV: limit, period_us, then one
-- (cost_min, cost_max) pair per request.
-- A cost c is admitted when previous × (end - now) + (current + c) × period <= limit × period
-- (Cloudflare's weighted estimate, free of division); a lease takes the largest c <= cost_max.
-- The only clock is TIME, in whole microseconds. Reply as ratelimit_fixed.lua. The mirror of
-- SlidingCounterStep in floodwall/ratelimit/_steps.py and SlidingWindowOp's record.
local function fdiv(a, b) -- floor(a / b), exact for integers below 2^53
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local limit = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local prev, cur, wend = 0, 0, nil
local v = redis.call('GET', KEYS[1])
if v then
  local a = string.find(v, ' ', 1, true)
  local b = string.find(v, ' ', a + 1, true)
  prev = tonumber(string.sub(v, 1, a - 1))
  cur = tonumber(string.sub(v, a + 1, b - 1))
  wend = tonumber(string.sub(v, b + 1))
end
local rolled = false
if not wend or now >= wend then
  if wend and now < wend + period then prev = cur else prev = 0 end
  cur, wend, rolled = 0, (fdiv(now, period) + 1) * period, true
end
local w = wend - now
local room = fdiv(limit * period - prev * w, period) -- current + cost may reach this
local out = {string.format('%.0f', now)}
local granted = 0
local function reset_us() -- until the state is idle again: its TTL
  if cur > 0 then return w + period elseif prev > 0 then return w end
  return 0
end
for i = 3, #ARGV, 2 do
  local cmin, cmax = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  local take = math.min(cmax, room - cur)
  local allowed, retry = 0, 0
  if take >= cmin then
    allowed, cur, granted = 1, cur + take, granted + take
  else
    take = 0
    if cmin > limit then
      retry = -1
    else
      local spare = limit - cmin
      if cur <= spare then
        retry = w - fdiv(period * (spare - cur), prev)
      else
        retry = w + period - fdiv(period * spare, cur)
      end
      if retry < 0 then retry = 0 end
    end
  end
  out[#out + 1] = string.format('%d %.0f %.0f %.0f %.0f', allowed, take,
    math.max(0, room - cur), reset_us(), retry)
end
if granted > 0 or rolled then
  if cur > 0 or prev > 0 then
    redis.call('SET', KEYS[1], string.format('%.0f %.0f %.0f', prev, cur, wend), 'PX',
      math.floor(reset_us() / 1000) + 1)
  elseif v then
    redis.call('DEL', KEYS[1])
  end
end
return table.concat(out, ' ')
