-- Lua shared by [`EXTEND`], [`RELEASE`] and [`HOLD`] for a lock that is not the caller's.
--
-- `not_ours(held, forced, token)`: why the lock whose key read `held` (a `GET` through
-- `pcall`) is not `token`'s — -2 when the `forced` mark (a key name; `nil`: none passed) holds
-- `token`, -1 when someone else holds it, 0 when nobody does — or the error of a lock key of
-- another type, naming it. A mark of another type is no mark: it only costs the cause.
local function not_ours(held, forced, token)
  if type(held) == 'table' then
    return redis.error_reply('WRONGTYPE distlock: the lock key ' .. KEYS[1] ..
      ' holds a value of another type, not a lock')
  end
  if forced then
    local mark = redis.pcall('GET', forced)
    if mark == token then
      return -2
    end
  end
  if held then
    return -1
  end
  return 0
end
