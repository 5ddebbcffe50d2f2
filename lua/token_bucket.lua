--[[
sluice token bucket: decides every bucket of one request in one atomic call.

KEYS    The request's bucket keys, distinct, all in one Cluster slot (the caller groups by slot).
ARGV[1] Now in ms, or "" to read Redis TIME. Production always passes "": Redis's clock is the
        only clock, so replicas whose own clocks disagree still decide alike. A number is a
        test-only override that lets a suite step time.
ARGV[2 + 5*(i-1) ...] Five values for KEYS[i]:
        capacity, requests_per_unit, unit_ms, tokens, flags (1 = refund, 2 = shadow, 3 = both).
State   HSET key t <tokens> u <updated_ms>. Tokens are written with %.17g, which round-trips a
        double exactly (tostring keeps 14 digits and would drift from the Rust side). A missing
        key is a full bucket, so a key expires once the bucket would be full again
        (PEXPIRE until_full_ms + 1000, at most 2^53): expiry is exact semantics, not a cache
        eviction.
Returns A flat array, 4 integers per key, in KEYS order:
        allowed (0/1), remaining, retry_after_ms (-1 = never: demand above capacity),
        until_full_ms.
        Redis truncates Lua numbers to integers through a C cast that is undefined out of the
        int64 range, so each count goes through `wire`: values in [2^63, 2^64) are sent as
        value - 2^64 (the caller reads the bits as u64), values from 2^64 up as -2 (saturated:
        u64::MAX), NaN and negatives as 0 -- exactly what Rust's `f64 as u64` gives.

The arithmetic is src/algorithm/token_bucket.rs operation for operation (same doubles, same
order), so this script and `token_bucket::decide` give bit-identical answers:
  rate       = requests_per_unit / unit_ms
  tokens     = min(capacity, tokens + max(0, now - updated) * rate); updated = max(updated, now)
  need       = max(demand, 1); a take fits when tokens >= need; a refund always fits
  the request is allowed when every non-shadow take fits; only then are fitting takes
  deducted; refunds are always applied, capped at capacity
  remaining  = floor(after); retry = ceil((need - tokens) / rate), never when need > capacity;
  until_full = ceil((capacity - after) / rate)
One HMGET per key to read and one HSET + PEXPIRE per key to write: O(keys), no scans.
Needs Redis >= 5 (effects replication, so reading TIME before writing is allowed).
--]]

local nkeys = #KEYS
if nkeys == 0 or #ARGV ~= 1 + 5 * nkeys then
  return redis.error_reply('ERR sluice token_bucket: expected 1 + 5 ARGV per key')
end

local now
if ARGV[1] == '' then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
else
  now = tonumber(ARGV[1])
  if not now then
    return redis.error_reply('ERR sluice token_bucket: ARGV[1] must be empty or a number')
  end
end

local TWO_63 = 9223372036854775808
local TWO_64 = 18446744073709551616
-- 2^53 ms is 285,000 years: a bucket further from full is as good as never full, and the cap
-- keeps PEXPIRE far from its overflow.
local MAX_TTL_MS = 9007199254740992
local EXPIRY_MARGIN_MS = 1000

local function wire(x)
  if x ~= x or x <= 0 then return 0 end
  if x >= TWO_64 then return -2 end
  if x >= TWO_63 then return x - TWO_64 end
  return x
end

local capacities, rates, demands, refunds, shadows = {}, {}, {}, {}, {}
local levels, updates, fits = {}, {}, {}
local all_allowed = true

for i = 1, nkeys do
  local base = 2 + 5 * (i - 1)
  local capacity = tonumber(ARGV[base])
  local per_unit = tonumber(ARGV[base + 1])
  local unit_ms = tonumber(ARGV[base + 2])
  local demand = tonumber(ARGV[base + 3])
  local flags = tonumber(ARGV[base + 4])
  if not (capacity and per_unit and unit_ms and demand and flags) then
    return redis.error_reply('ERR sluice token_bucket: non-numeric ARGV for key ' .. i)
  end
  local rate = per_unit / unit_ms
  local refund = flags % 2 == 1
  local shadow = flags % 4 >= 2

  local state = redis.call('HMGET', KEYS[i], 't', 'u')
  local tokens, updated
  local stored_tokens, stored_updated = tonumber(state[1]), tonumber(state[2])
  if stored_tokens and stored_updated then
    local elapsed = now - stored_updated
    if elapsed < 0 then elapsed = 0 end
    tokens = math.min(capacity, stored_tokens + elapsed * rate)
    updated = math.max(stored_updated, now)
  else
    tokens = capacity
    updated = now
  end

  local fit = refund or tokens >= math.max(demand, 1)
  if not fit and not shadow then all_allowed = false end

  capacities[i], rates[i], demands[i], refunds[i], shadows[i] = capacity, rate, demand, refund, shadow
  levels[i], updates[i], fits[i] = tokens, updated, fit
end

local reply = {}
for i = 1, nkeys do
  local capacity, rate, demand, tokens = capacities[i], rates[i], demands[i], levels[i]
  local after
  if refunds[i] then
    after = math.min(tokens + demand, capacity)
  elseif all_allowed and fits[i] then
    after = tokens - demand
  else
    after = tokens
  end

  local need = math.max(demand, 1)
  local retry
  if fits[i] then
    retry = 0
  elseif need > capacity then
    retry = -1
  else
    retry = wire(math.ceil((need - tokens) / rate))
  end
  local until_full = math.ceil((capacity - after) / rate)
  if until_full ~= until_full then until_full = 0 end

  local ttl = until_full + EXPIRY_MARGIN_MS
  if ttl > MAX_TTL_MS then ttl = MAX_TTL_MS end
  redis.call('HSET', KEYS[i], 't', string.format('%.17g', after), 'u', string.format('%.0f', updates[i]))
  redis.call('PEXPIRE', KEYS[i], string.format('%.0f', ttl))

  local at = 4 * (i - 1)
  reply[at + 1] = fits[i] and 1 or 0
  reply[at + 2] = wire(math.floor(after))
  reply[at + 3] = retry
  reply[at + 4] = wire(until_full)
end
return reply
