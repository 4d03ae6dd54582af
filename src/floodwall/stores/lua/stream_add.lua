-- floodwall durable queue: append an entry unless the stream is full.
-- KEYS[1]: the stream. ARGV[1]: the most entries it may hold (acknowledged entries are deleted,
-- so its length is the backlog); ARGV[2..]: field, value, field, value...
-- Returns the new entry's id, or nil when the stream is full (the writer is refused: a bounded
-- queue applies backpressure instead of trimming entries nobody has processed).
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[1]) then
  return false
end
return redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2))
