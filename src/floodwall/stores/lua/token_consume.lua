-- floodwall one-time tokens: consume. KEYS[1]: the token. ARGV: the consumer's id.
-- Returns 1 for the first consumer of a live token (and again for that consumer, should its
-- client retry after a lost reply), 0 for everyone else. A used token stays, marked, until it
-- expires.
local value = redis.call('GET', KEYS[1])
if value == '1' then
  redis.call('SET', KEYS[1], 'c:' .. ARGV[1], 'KEEPTTL')
  return 1
end
if value == 'c:' .. ARGV[1] then
  return 1
end
return 0
