-- KEYS[1] stock key, KEYS[2] bought-users set, ARGV[1] user, ARGV[2] qty, ARGV[3] limit
local bought = redis.call('SISMEMBER', KEYS[2], ARGV[1]) if bought == 1 then return -3 end
local stock = tonumber(redis.call('GET', KEYS[1]) or '-1') if stock < 0 then return -1 end
local num = tonumber(ARGV[2]) if stock < num then return -2 end
redis.call('DECRBY', KEYS[1], num) redis.call('SADD', KEYS[2], ARGV[1]) return stock - num
