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
-- ACL without `EXISTS`): the caller stops sending this script.
--
-- The line is read with `EXISTS`, not `LINDEX`: Redis empties a list by deleting it, so a line
-- that exists has someone in it, and `EXISTS` is the cheaper command: in an uncontended cycle it
-- halves what this script costs Redis beyond a plain compare-and-delete. A line key of another
-- type exists too, and is left to the release script.
local waiting = redis.pcall('EXISTS', KEYS[2])
if type(waiting) == 'table' and waiting.err then
  return -1
end
if waiting == 0 and redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
