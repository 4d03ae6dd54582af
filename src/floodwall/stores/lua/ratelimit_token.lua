-- floodwall global rate limit: token bucket, a batch of requests on one key.
-- KEYS[1]: "<tokens> <stamp_us>", tokens in units of 1/period_us of a token, so the refill of
-- `count` tokens per period is exactly `count` units per microsecond: integers throughout.
-- ARGV: capacity (units), unit (= period_us: units per token), refill (units per µs), initial
-- (units, a new key's tokens), then one (cost_min, cost_max) pair per request.
-- The bucket refills (capped) at every decision; a cost c is admitted when it holds c tokens;
-- a lease takes up to cost_max whole tokens. The only clock is TIME, in whole microseconds.
-- Reply as ratelimit_fixed.lua. The mirror of TokenBucketStep in floodwall/ratelimit/_steps.py
-- and TokenBucketOp's record.
local function fdiv(a, b) -- floor(a / b), exact for integers below 2^53
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cap = tonumber(ARGV[1])
local unit = tonumber(ARGV[2])
local refill = tonumber(ARGV[3])
local tokens, fresh = tonumber(ARGV[4]), true
local v = redis.call('GET', KEYS[1])
if v then
  local sp = string.find(v, ' ', 1, true)
  local elapsed = now - tonumber(string.sub(v, sp + 1))
  if elapsed < 0 then elapsed = 0 end
  tokens = math.min(tonumber(string.sub(v, 1, sp - 1)) + elapsed * refill, cap)
  fresh = false
end
local out = {string.format('%.0f', now)}
local granted = 0
for i = 5, #ARGV, 2 do
  local cmin, cmax = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  local take = math.min(cmax, fdiv(tokens, unit))
  local allowed, retry = 0, 0
  if take >= cmin then
    allowed, tokens, granted = 1, tokens - take * unit, granted + take
  else
    take = 0
    if cmin * unit > cap then retry = -1 else retry = -fdiv(tokens - cmin * unit, refill) end
  end
  out[#out + 1] = string.format('%d %.0f %.0f %.0f %.0f', allowed, take, fdiv(tokens, unit),
    -fdiv(tokens - cap, refill), retry)
end
if (granted > 0 or fresh) and tokens < cap then
  redis.call('SET', KEYS[1], string.format('%.0f %.0f', tokens, now), 'PX',
    math.floor(-fdiv(tokens - cap, refill) / 1000) + 1)
end
return table.concat(out, ' ')
