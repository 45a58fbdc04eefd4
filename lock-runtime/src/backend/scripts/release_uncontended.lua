-- Release the lock if it is still ours, handing it to the first live waiter in line. The script
-- is this file, line_prelude.lua, not_ours.lua and release_contended.lua, in that order.
--
-- KEYS[1]  the lock key
-- KEYS[2]  its line
-- KEYS[3]  its fencing counter
-- KEYS[4]  its `since` record (deleted with the lock)
-- KEYS[5]  its `forced` mark
-- KEYS[6]  its `released` marker, only when ARGV[4] is not ""
-- last     its lease table
-- ARGV[1]  token
-- ARGV[2]  claim, ms (see acquire.lua)
-- ARGV[3]  "1" also leave the line (a waiter giving up, maybe handed the lock meanwhile), "0" not
-- ARGV[4]  how long the `released` marker is kept, ms ("" no marker)
-- ARGV[5]  "1" when PUBLISH counts receivers, "0" not
-- ARGV[6]  Redis time as the caller knows it, ms ("" unknown; see hand_off)
--
-- Reply: 1 ours, now free (or this same release, re-sent: the marker holds the token);
-- 2 ours, now handed to a waiter; not ours, nothing of the lock touched: -2 force-released,
-- -1 another holder's, 0 nobody's; error: the lock key holds another type, or the line does
-- (the lock is deleted).
--
-- This part is all an uncontended release runs: it returns before the helpers are defined,
-- since Lua builds a script's local functions anew on every run, which costs more than this
-- path's commands.
local held = redis.pcall('GET', KEYS[1])
local ours = held == ARGV[1]
local waiter = nil
if ours and ARGV[3] ~= '1' then
  if ARGV[4] ~= '' then
    redis.call('SET', KEYS[6], ARGV[1], 'PX', ARGV[4])
  end
  waiter = redis.pcall('LPOP', KEYS[2])
  if not waiter then
    redis.call('DEL', KEYS[1], KEYS[4])
    return 1
  end
end
