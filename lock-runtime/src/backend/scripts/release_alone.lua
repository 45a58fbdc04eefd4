-- Release a lock held alone: taken by a first try's `SET NX` (so nothing but the lock key was
-- written for it) and with nobody in its line. It deletes the lock if it is still ours and the
-- line is empty, on the keys of a plain compare-and-delete plus the line. Anything else (a
-- waiter in line, a lock that is no longer ours, a key of another type) changes nothing: the
-- caller then sends the release script, which hands the lock on or says whose it is.
--
-- KEYS[1]  the lock key
-- KEYS[2]  its line
-- ARGV[1]  token
--
-- Reply: 1 ours, now free; 0 nothing done; -1 nothing done, and the line cannot be read (an
-- ACL without `LINDEX`): the caller stops sending this script.
local first = redis.pcall('LINDEX', KEYS[2], 0)
if type(first) == 'table' and first.err then
  if string.find(first.err, 'WRONGTYPE', 1, true) then
    return 0
  end
  return -1
end
if not first and redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
