--[[
sluice replica heartbeat: "I am alive", and how many replicas are.

KEYS[1] The replica set: a sorted set, member = replica id, score = Redis TIME (ms) of that
        replica's last heartbeat.
ARGV[1] This replica's id.
ARGV[2] TTL in ms: a replica not heard from for longer is not counted (and is removed).
Returns Two integers: the number of live replicas, this one included (>= 1), and 1 when
        KEYS[1] held something other than a sorted set and was replaced (else 0).

Why so: the `local` failure policy divides each limit by the number of replicas, and it needs
that number exactly when Redis is gone, so every replica keeps the last count it saw. Scores
come from Redis's TIME, so replicas whose clocks disagree still agree on who is live. One call
per replica per interval: ZADD, a trim of the expired members, ZCARD, PEXPIRE (the set vanishes
TTL after the last replica stopped). O(log N + expired). Needs Redis >= 5 (effects
replication, so reading TIME before writing is allowed).
--]]

local ttl = tonumber(ARGV[2])
if #KEYS ~= 1 or not ttl or ttl <= 0 or ARGV[1] == nil or ARGV[1] == '' then
  return redis.error_reply('ERR sluice heartbeat: expected 1 key, an id and a positive TTL')
end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

-- A set that is not a sorted set (WRONGTYPE: foreign data under the set's name) would fail every
-- heartbeat while Redis is healthy: it is deleted and the heartbeat written afresh, and reported.
local repaired = 0
local added = redis.pcall('ZADD', KEYS[1], string.format('%.0f', now), ARGV[1])
if type(added) == 'table' and added.err then
  if not string.find(added.err, 'WRONGTYPE', 1, true) then return added end
  redis.call('PEXPIRE', KEYS[1], 0) -- deletes it, with a command this script already needs
  redis.call('ZADD', KEYS[1], string.format('%.0f', now), ARGV[1])
  repaired = 1
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. string.format('%.0f', now - ttl))
redis.call('PEXPIRE', KEYS[1], string.format('%.0f', ttl))
return {redis.call('ZCARD', KEYS[1]), repaired}
