-- floodwall cache, second level: read an entry and its age.
-- KEYS[1]: the entry (a hash: t = stored at, server milliseconds; v = the encoded value).
-- Returns nil when absent (never stored, or expired after its keep time), else {v, age_ms}.
-- The age comes from the server's clock only (TIME), so every process sees the same age.
local rec = redis.call('HMGET', KEYS[1], 't', 'v')
if not rec[1] then
  return false
end
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local age = ms - tonumber(rec[1])
if age < 0 then
  age = 0
end
return {rec[2], age}
