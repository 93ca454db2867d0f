#!lua flags=allow-oom
local stream, dlq, deadcount, cursor_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, consumer = ARGV[1], ARGV[2]
local want = tonumber(ARGV[3])
local min_idle, max_deliveries = ARGV[4], tonumber(ARGV[5])
local out = {}
local cursor = redis.call('GET', cursor_key) or '0-0'
local claimed = redis.call('XAUTOCLAIM', stream, group, consumer, min_idle, cursor, 'COUNT', want)
redis.call('SET', cursor_key, claimed[1])
for _, e in ipairs(claimed[2]) do
  local id = e[1]
  local p = redis.call('XPENDING', stream, group, id, id, 1)
  local deliveries = 1
  if p[1] then deliveries = p[1][4] end
  if deliveries > max_deliveries then
    local fields = e[2] or {}
    redis.call('XADD', dlq, '*', 'source_id', id, 'deliveries', deliveries - 1, unpack(fields))
    redis.call('XACK', stream, group, id)
    redis.call('XDEL', stream, id)
    redis.call('INCR', deadcount)
  else
    table.insert(out, {id, deliveries, e[2]})
    want = want - 1
  end
end
if want > 0 then
  local r = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', want, 'STREAMS', stream, '>')
  if r then
    for _, e in ipairs(r[1][2]) do table.insert(out, {e[1], 1, e[2]}) end
  end
end
return out
