local stream, completed, deadcount = KEYS[1], KEYS[2], KEYS[3]
local group, retry = ARGV[1], ARGV[2]
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local info = redis.call('XINFO', 'STREAM', stream)
local added, xlen = 0, 0
for i = 1, #info, 2 do
  if info[i] == 'entries-added' then added = info[i + 1] end
  if info[i] == 'length' then xlen = info[i + 1] end
end
local last = '0-0'
for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
  local name, ldi = nil, nil
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1] end
    if g[i] == 'last-delivered-id' then ldi = g[i + 1] end
  end
  if name == group then last = ldi end
end
local summary = redis.call('XPENDING', stream, group)
local pending = summary[1]
local retrying = 0
if summary[4] then
  for _, c in ipairs(summary[4]) do
    if c[1] == retry then retrying = tonumber(c[2]) end
  end
end
local oldest = ''
local first = redis.call('XRANGE', stream, '(' .. last, '+', 'COUNT', 1)
if first[1] then oldest = first[1][1] end
return {now_ms, added, xlen, pending, retrying, oldest,
        tonumber(redis.call('GET', completed) or '0'), tonumber(redis.call('GET', deadcount) or '0')}
