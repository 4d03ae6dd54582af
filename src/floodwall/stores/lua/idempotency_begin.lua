-- floodwall idempotency: claim a request key, or report what holds it.
-- KEYS[1]: the record (a hash: s = 'p' in progress | 'd' done, o = owner, f = fingerprint,
-- r = stored result). ARGV: owner, fingerprint, lock_ms.
-- Returns {'started', ms_left} | {'in_flight', ms_left} | {'done', ms_left, result}
--       | {'mismatch', ms_left}. An in-progress record expires after lock_ms (a crashed owner's
-- claim lapses); the only clock is the server's key expiry. Safe to run twice (a client retry
-- after a lost reply): the owner's own claim answers 'started' again.
local rec = redis.call('HMGET', KEYS[1], 's', 'f', 'r', 'o')
if not rec[1] then
  redis.call('HSET', KEYS[1], 's', 'p', 'o', ARGV[1], 'f', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {'started', tonumber(ARGV[3])}
end
local left = redis.call('PTTL', KEYS[1])
if rec[2] ~= ARGV[2] then
  return {'mismatch', left}
end
if rec[1] == 'p' then
  if rec[4] == ARGV[1] then
    return {'started', left}
  end
  return {'in_flight', left}
end
return {'done', left, rec[3] or ''}
