-- floodwall durable queue: acknowledge processed entries and delete them, in one step.
-- KEYS[1]: the stream. ARGV[1]: the consumer group; ARGV[2..]: entry ids.
-- Returns how many entries were pending (XACK's count). Deleting keeps the stream's length
-- equal to its backlog, which is what the bound in stream_add.lua counts.
local acked = redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 2))
redis.call('XDEL', KEYS[1], unpack(ARGV, 2))
return acked
