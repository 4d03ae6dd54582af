-- floodwall cache, second level: store an entry, stamped with the server's time.
-- KEYS[1]: the entry. ARGV: the encoded value, keep_ms (how long it may be served, stale
-- included; the key expires then). Returns 1. Last writer wins.
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 't', ms, 'v', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
