-- floodwall global rate limit: GCRA (generic cell rate algorithm), a batch of requests on one key.
-- KEYS[1]: "<tat_us> <frac>": the theoretical arrival time is tat_us + frac / scale µs.
-- ARGV: scale (time units per µs), T (emission interval, units), tau (tolerance = T ×
-- capacity, units), then one (cost_min, cost_max) pair per request. Units are 1/scale µs with
-- scale chosen so that T is whole: integers throughout, no drift.
-- With d = max(tat - now, 0), a cost c is admitted when d + T × c <= tau (then d += T × c); a
-- lease takes the largest c <= cost_max. The only clock is TIME, in whole microseconds.
-- Reply as ratelimit_fixed.lua. The mirror of GcraStep in floodwall/ratelimit/_steps.py (d is
-- its max(tat - now, 0), kept small for Lua's 53-bit integers) and GcraOp's record.
local function fdiv(a, b) -- floor(a / b), exact for integers below 2^53
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local scale = tonumber(ARGV[1])
local T = tonumber(ARGV[2])
local tau = tonumber(ARGV[3])
local d = 0
local v = redis.call('GET', KEYS[1])
if v then
  local sp = string.find(v, ' ', 1, true)
  d = (tonumber(string.sub(v, 1, sp - 1)) - now) * scale + tonumber(string.sub(v, sp + 1))
  if d < 0 then d = 0 end
end
local out = {string.format('%.0f', now)}
local granted = 0
for i = 4, #ARGV, 2 do
  local cmin, cmax = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  local take = math.min(cmax, fdiv(tau - d, T))
  local allowed, retry = 0, 0
  if take >= cmin then
    allowed, d, granted = 1, d + T * take, granted + take
  else
    take = 0
    if T * cmin > tau then retry = -1 else retry = -fdiv(tau - d - T * cmin, scale) end
  end
  out[#out + 1] = string.format('%d %.0f %.0f %.0f %.0f', allowed, take, fdiv(tau - d, T),
    -fdiv(-d, scale), retry)
end
if granted > 0 then
  local whole = fdiv(d, scale)
  redis.call('SET', KEYS[1], string.format('%.0f %.0f', now + whole, d - whole * scale), 'PX',
    math.floor(-fdiv(-d, scale) / 1000) + 1)
end
return table.concat(out, ' ')
