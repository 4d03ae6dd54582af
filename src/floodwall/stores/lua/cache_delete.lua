-- floodwall cache, second level: drop an entry. KEYS[1]: the entry. Returns 1 if it existed.
return redis.call('DEL', KEYS[1])
