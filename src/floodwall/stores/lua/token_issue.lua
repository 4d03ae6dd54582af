-- floodwall one-time tokens: issue. KEYS[1]: the token. ARGV: ttl_ms. Returns 1.
redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
return 1
