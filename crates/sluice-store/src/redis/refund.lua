-- sluice: give back what an admitted request consumed.
--
-- On Redis Cluster a decision that involves a global valve is two calls on
-- two slots: the tenant's rules, then the valve. When the valve denies after
-- the tenant's rules admitted, this script undoes the tenant's consumption,
-- so that a denied request consumes nothing.
--
-- It also releases a concurrency lease (`/v1/release`, the end of a
-- response): the same call, naming the lease.
--
-- KEYS[1..m]          the keys the decision wrote (rules of one group
--                     name the same key)
-- ARGV[1], ARGV[2]    the rules and the header, as the decision takes them
--                     (see arguments in common.lua); the lease is the one
--                     to release of concurrency rules ("": none)
-- ARGV[3]             the admission time (ms, as the decision script
--                     returned it)
--
-- Returns how many concurrency rules held the lease, unexpired.
--
-- Each undo is the inverse of the admission, applied to the state as it is
-- now (others may have consumed since): gcra moves its TAT back by
-- cost·per/limit, token_bucket adds the tokens back, the window algorithms
-- take the units off the window they were counted in (if it is still
-- there), sliding_log removes that many entries of the admission time,
-- concurrency removes the lease. TTLs are kept. gcra and token_bucket note
-- the time in their record (see give_back).

bind()
local rules, n, now, lease = arguments(ARGV)
local at = num(ARGV[3])
local released = 0
local pos = 1
for _ = 1, n do
  local algorithm, _, _, k, limit, per, burst, cost, _, name, after = sunpack(RULE, rules, pos)
  pos = after
  released = released + give_back(KEYS[k], algorithm, limit, per, burst, cost, name, at, now, lease)
end
return released
