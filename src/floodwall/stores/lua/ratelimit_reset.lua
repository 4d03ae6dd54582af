-- floodwall global rate limit: forget a key's state (operator action). KEYS[1]. Returns 1.
redis.call('DEL', KEYS[1])
return 1
