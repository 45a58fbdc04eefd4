-- The release of a lock nobody waits for, which every uncontended cycle runs: it returns
-- before the line's helpers are defined, since Lua builds a script's local functions anew on
-- every run and that costs Redis more than the commands of this path.
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
