#!lua flags=allow-oom
local n = redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if n == 1 then
  redis.call('XDEL', KEYS[1], ARGV[2])
  redis.call('INCR', KEYS[2])
end
return n
