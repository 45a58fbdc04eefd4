-- Lua shared by `rw_acquire.lua` and `rw_release.lua` (after `family_prelude.lua`): the fair
-- line of a read-write lock.
--
-- The lock key is a string while a writer holds it (exactly a mutex: `SET key value PX ttl`),
-- a leased set with the marker `#read` while readers hold it, and absent while free. Readers
-- and writers wait in one line, the mutex's own (helper `line`), entries in the mutex's format;
-- a reader's value carries `;m=r`.
--
-- `rw_admit(lock, line, fence, fences, now, me, claim, counted, writer, readers)`: lets in the
-- head of the line while it can: a run of readers while no writer holds the lock (all of them
-- together), or one writer once nobody holds it; it stops at the first live entry that cannot
-- come in, so a writer at the head is never overtaken by the readers behind it, and a reader
-- never overtakes a writer ahead of it. Dead entries (lease run out) are dropped on the way.
-- Each admitted waiter gets its lease by `grant` (`family_prelude.lua`): other than `me`, a
-- lease of `min(its ttl, claim)` and a message
-- `"<token> <fence>"` on its channel (with `counted`, one nobody heard is taken back and its
-- place lost, as in a mutex hand-off); `me` (the caller, or `nil`) gets its full ttl and no
-- message. `writer`, `readers`: whether a writer holds the lock and how many readers do (the
-- lock key must not be a marker-only set when `readers` is 0). Returns the reply for `me` when
-- it was let in (or the error reply of its fencing token), how many were let in, and the new
-- `writer`, `readers`.
local function rw_admit(lock, line, fence_key, fences, now, me, claim, counted, writer, readers)
  local mine, admitted = nil, 0
  while not writer do
    local entry = redis.call('LINDEX', line, 0)
    if not entry then
      break
    end
    local token, deadline, wanted, fencing, channel = parse(entry)
    if not token or (token ~= me and tonumber(deadline) < now) then
      redis.call('LPOP', line)
    else
      local reader = is_reader(token)
      if not reader and readers > 0 then
        break
      end
      redis.call('LPOP', line)
      local outcome, reply = grant(token, wanted, fencing, channel, me, claim, counted, fence_key,
        function(px, fence)
          if reader then
            redis.call('ZADD', lock, '+inf', '#read')
            redis.call('ZADD', lock, now + px, token)
            if fence > 0 then
              redis.call('HSET', fences, token, fence)
            end
          else
            redis.call('SET', lock, token, 'PX', px)
          end
        end,
        function()
          if reader then
            redis.call('ZREM', lock, token)
            redis.call('HDEL', fences, token)
            if readers == 0 then
              redis.call('DEL', lock, fences)
            end
          else
            redis.call('DEL', lock)
          end
        end)
      if outcome == 'failed' then
        return reply, admitted, writer, readers
      end
      if outcome == 'mine' or outcome == 'given' then
        admitted = admitted + 1
        if reader then
          readers = readers + 1
        else
          writer = true
        end
        if outcome == 'mine' then
          mine = reply
        end
      end
    end
  end
  return mine, admitted, writer, readers
end
