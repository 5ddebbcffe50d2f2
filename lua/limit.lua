--[[
sluice limit: decides every key of one request in one atomic call, each key by its own algorithm.

KEYS    The keys of one request, or of several (a batch), all in one Cluster slot (the caller
        groups by slot). Keys of one request are distinct; requests of a batch may share keys.
ARGV[1] Now in ms, or "" to read Redis TIME. Production always passes "": Redis's clock is the
        only clock, so replicas whose own clocks disagree still decide alike. A number is a
        test-only override that lets a suite step time.
ARGV[2] Expiry jitter in ms (>= 0), added to every key's TTL so keys written together do not all
        expire together (envoyproxy/ratelimit's EXPIRATION_JITTER_MAX_SECONDS); the caller draws it.
        Or `peek`: a read-only call (the admin listener's `GET /buckets`). Every key must then
        ask 0 hits with flags 0; each is read and brought to now by the same code as a decision
        and answered as a check-only demand, and nothing is written: no HSET, no PEXPIRE, no
        repair (a key holding foreign data is read as fresh and reported, not deleted).
ARGV[3 + 6*(i-1) ...] Six values for KEYS[i]:
        algorithm (1 token_bucket, 2 fixed_window, 3 sliding_window, 4 gcra, 5 in_flight,
        6 reservation ledger; + 16 on the first
        key of every request of a batch after the first: a group starts there), capacity,
        requests_per_unit, unit_ms, hits, flags = refund (1) + shadow (2) + quota (4) +
        always (8) + 16 * lease, where lease > 0 makes a take of `hits` also take up to `lease`
        more whole tokens when it is taken (token_bucket and gcra; the windows ignore it), for the
        caller to spend locally, quota marks a quota-mode key (see below), and always marks an
        always-charged take (`charge: always`): counted whatever the answer, into debt.
        For in_flight, capacity is the cap (slots), unit_ms the longest hold, hits >= 1 a take,
        0 a check, refund a release; requests_per_unit is only reported.
        A reservation ledger (src/algorithm/reservation.rs) comes right before the key of its
        bucket, in the same group: unit_ms is the longest hold, hits the descriptor's hits,
        flags 0. Before the group is read, a live reservation of r hits turns the bucket's demand
        of h into h - r: a refund of r - h (or of nothing), or an always-charged take of h - r,
        and the ledger is deleted; without one, the ledger records h (when h >= 1) if the bucket
        takes it. Its reply: allowed 1, remaining = the r settled (0: none), retry and until_full
        0, granted = the hits reserved.
ARGV[3 + 6*#KEYS + h] The holder of the h-th in_flight key (in KEYS order): an opaque string (the
        caller's 16 hex digits); present for every in_flight key, peeks included (ignored there).
State   One hash per key, its fields by algorithm (the key itself carries the algorithm, so a
        rule whose algorithm changes never reads another algorithm's state):
          token_bucket    t <tokens> u <updated_ms>      (unchanged since the first release)
          fixed_window    w <window start> c <count>
          sliding_window  w <window start> c <count> p <previous window's count>
          gcra            a <arrival time, whole ms> f <its fraction of a ms>
          in_flight       a ZSET, not a hash: member = holder, score = its slot's expiry (ms);
                          members scored <= now are expired and removed when the key is read
                          (src/algorithm/in_flight.rs, written at once, not at the flush)
          reservation     a string, not a hash: "<hits> <expiry ms>", read as none from its
                          expiry on, its TTL the hold plus the margin (written at once)
        Fractions are written with %.17g, which round-trips a double exactly (tostring keeps 14
        digits and would drift from the Rust side). A missing key has nothing counted, so a key
        expires once its state settles (bucket full, windows over, arrival time passed), plus
        1000 ms and the jitter, at most 2^53 ms: expiry is exact semantics, not a cache eviction.
Returns A flat array, 5 integers per key, in KEYS order:
        allowed (0/1), remaining, retry_after_ms (-1 = never: demand above the limit),
        until_full_ms (the reset Envoy reports), granted (tokens this call took from the key:
        hits plus a lease take's extra; 0 when nothing was taken; in_flight: 1 for a slot taken
        or freed by its holder's release);
        then r, the number of keys repaired, and r integers: the position in KEYS (from 1) of
        each. A key that is not a hash (WRONGTYPE: foreign data, say a SET by hand) is deleted
        and decided as a fresh bucket, so one bad key never fails the call (nor, through the
        circuit breaker, every other client of the server). Any other error reading a key fails
        the call before anything is written.
        Redis truncates Lua numbers to integers through a C cast that is undefined out of the
        int64 range, so each count goes through `wire`: values in [2^63, 2^64) are sent as
        value - 2^64 (the caller reads the bits as u64), values from 2^64 up as -2 (saturated:
        u64::MAX), NaN and negatives as 0 -- exactly what Rust's `f64 as u64` gives.
        A peek returns 9 values per key: the 5 above (granted is 0), the key's PTTL (-2: no key,
        -1: no expiry, -3: PTTL refused, say by an ACL without it), and the state brought to now
        as three strings, the algorithm's fields in the State order below, %.17g, "" past the
        last (in_flight: slots held, first expiry, last expiry); then now (ms), then r and
        the positions of the keys that are not hashes (or, for in_flight, ZSETs).

Why groups: concurrent requests on one connection can share a call (the caller batches them),
which pays Redis's fixed cost of a call -- the command, EVALSHA's lookup, the script's set-up,
TIME -- once for all of them. Each group is decided as its own call would decide it, in KEYS
order: all of a group's keys are read only after every earlier group wrote (to the call's own
view of its keys, which reaches Redis once at the end: a key shared by many requests of a batch
costs one read and one write), so a batch answers exactly as its requests would one after
another, at one `now`. A call without +16 is one group.

Why one script for every algorithm: all of a request's keys are decided in one call whatever
their algorithms, in two passes -- first every key is read, brought to now and asked whether its
demand fits; then, only if the request is allowed, the takes that fit are counted. A request is
allowed when every ordinary demand passes and, if it has quota-mode demands, at least one of
them does; a demand passes when it fits or is a shadow one. So a shadow or quota take that does
not fit counts nothing. Refunds are always applied, and so are always-charged takes, fitting or
not (the key goes into debt: negative tokens, a count past the limit, an arrival time past the
burst). So a rejected request counts nothing anywhere but on its always-charged keys.

The arithmetic is src/algorithm/{token_bucket,fixed_window,sliding_window,gcra}.rs operation for
operation (same doubles, same order; each file states its contract), so this script and
`algorithm::decide` give bit-identical answers. need = max(hits, 1) everywhere.
One HMGET (in redis.pcall, for the repair) per distinct key to read and one HSET + PEXPIRE per
distinct key to write, at the end:
O(keys), no scans; the searches for retry-after and remaining take at most 8 steps per key. An
in_flight key costs O(log n) ZSET commands on its n slots (ZREMRANGEBYSCORE, ZCOUNT, ZSCORE, two
one-member ZRANGEBYSCOREs, ZADD or ZREM, PEXPIRE), written at once.
Needs Redis >= 5 (effects replication, so reading TIME before writing is allowed).
--]]

local WIDTH = 6
local GROUP_START = 16
-- Why the body is shaped so: Redis runs this whole chunk on every call, so every closure, table
-- and table field it creates is built anew and then collected -- at one key that set-up, not the
-- four Redis commands, was most of the call. So the set-up is a fixed handful of flat arrays
-- whatever the number of keys (no table per key, none per algorithm), an algorithm is a branch on
-- its code whose functions are built only when the call uses it, and a key's state is HMGET's own
-- reply, brought to now and then updated in place.
-- Locals, not `math.*` lookups: the script is interpreted on every call.
local floor, ceil, min, max, format = math.floor, math.ceil, math.min, math.max, string.format
local tonumber = tonumber
local nkeys = #KEYS
if nkeys == 0 or #ARGV < 2 + WIDTH * nkeys then
  return redis.error_reply('ERR sluice limit: expected 2 + 6 ARGV per key + 1 per in_flight key')
end

local now
if ARGV[1] == '' then
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + floor(tonumber(time[2]) / 1000)
else
  now = tonumber(ARGV[1])
  if not now then
    return redis.error_reply('ERR sluice limit: ARGV[1] must be empty or a number')
  end
end
local peek = ARGV[2] == 'peek'
local jitter = 0
if not peek then
  jitter = tonumber(ARGV[2])
  if not jitter or jitter < 0 then
    return redis.error_reply('ERR sluice limit: ARGV[2] must be a number >= 0 or peek')
  end
end

-- Every key's values are parsed before anything is read or written, so a malformed call fails
-- having changed nothing: `arg[b + 1 .. b + 6]`, b = 6 * (i - 1), are key i's algorithm code
-- (group mark removed), capacity, per_unit, unit_ms, hits and flags. `ends` lists the last key
-- of every group; `uses[code]` which algorithms the call needs.
local arg, ends, uses = {}, {}, {false, false, false, false, false, false}
-- `holder_of[i]`: the holder of in_flight key i.
local holder_of, nholders = {}, 0
for i = 1, nkeys do
  local b = WIDTH * (i - 1)
  local code = tonumber(ARGV[b + 3])
  local capacity = tonumber(ARGV[b + 4])
  local per_unit = tonumber(ARGV[b + 5])
  local unit = tonumber(ARGV[b + 6])
  local hits = tonumber(ARGV[b + 7])
  local flags = tonumber(ARGV[b + 8])
  if not (code and capacity and per_unit and unit and hits and flags) then
    return redis.error_reply('ERR sluice limit: non-numeric ARGV for key ' .. i)
  end
  if peek and (hits ~= 0 or flags ~= 0) then
    return redis.error_reply('ERR sluice limit: a peek asks 0 hits with flags 0, key ' .. i)
  end
  if code >= GROUP_START then
    code = code - GROUP_START
    if i > 1 then ends[#ends + 1] = i - 1 end
  end
  if uses[code] == nil then
    return redis.error_reply('ERR sluice limit: unknown algorithm ' .. code .. ' for key ' .. i)
  end
  uses[code] = true
  if code == 5 then
    nholders = nholders + 1
    holder_of[i] = ARGV[2 + WIDTH * nkeys + nholders]
  end
  arg[b + 1], arg[b + 2], arg[b + 3], arg[b + 4], arg[b + 5], arg[b + 6] =
    code, capacity, per_unit, unit, hits, flags
end
ends[#ends + 1] = nkeys
if #ARGV ~= 2 + WIDTH * nkeys + nholders then
  return redis.error_reply('ERR sluice limit: expected 2 + 6 ARGV per key + 1 per in_flight key')
end

local TWO_63 = 9223372036854775808
local TWO_64 = 18446744073709551616
-- 2^53 ms is 285,000 years: a key further from settling is as good as never settled, and the
-- cap keeps PEXPIRE far from its overflow.
local MAX_TTL_MS = 9007199254740992
local EXPIRY_MARGIN_MS = 1000
-- Steps of the searches from an estimate to the exact answer (the estimates are off by a
-- rounding at most); the bound keeps them finite where doubles stop counting.
local SEARCH_STEPS = 4
-- The longest retry-after of an in_flight refusal (RETRY_HINT_MS in src/algorithm/in_flight.rs).
local RETRY_HINT_MS = 1000

local function wire(x)
  if x ~= x or x <= 0 then return 0 end
  if x >= TWO_64 then return -2 end
  if x >= TWO_63 then return x - TWO_64 end
  return x
end

-- The smallest d >= 1 near guess with ok(d), ok monotone: the first ms a demand fits.
local function first_fit(guess, ok)
  local d = guess
  if not (d >= 1) then d = 1 end
  for _ = 1, SEARCH_STEPS do
    if ok(d) then break end
    d = d + 1
  end
  for _ = 1, SEARCH_STEPS do
    if d > 1 and ok(d - 1) then d = d - 1 else break end
  end
  return d
end

-- A key's state as this call sees it, and its deferred write: requests of a batch often share a
-- key (a hot tenant), so each distinct key is read from Redis once, kept here between its
-- requests, and written once at the end. No other client runs while the script does, so the
-- result is the same as reading and writing every time. `seen[key]` is the array of the key's
-- algorithm's fields in its HSET order -- HMGET's reply, then brought to now by `load` and
-- updated by `settle` in place -- and `code_of[key]` that algorithm: a key names its algorithm
-- (sluice tags every key but a token bucket's), so one key never has two in a call, and a call
-- that tries fails before anything is written. Values stay numbers until the flush formats them:
-- the formats round-trip (%.17g any double, %.0f the whole numbers it is given), so `tonumber` of
-- a kept number is what reading the written string back would give.
-- `ttl_of[key]` is the TTL of its last state, `write_order` the keys in first-write order.
local seen, code_of, ttl_of, write_order = {}, {}, {}, {}

-- Each algorithm: `load(i, b, v)` brings the state `v` of key i (its values start at arg[b + 1])
-- to now (in place; GCRA keeps how far ahead of now it is in `backlog[i]`) and returns whether
-- its demand fits; `settle(i, b, v, fit, take)` updates `v` to the new state and returns remaining,
-- retry_after, until_full, granted and the ms until the state settles (the TTL's base).
-- flags = refund (1) + shadow (2) + quota (4) + always (8) + 16 * lease.

-- 1: token bucket. tokens = min(capacity, tokens + elapsed * per_unit / unit_ms); the waits are
-- ceil(tokens short * unit_ms / per_unit), retry-after corrected by first_fit against the refill.
-- Each product before its division, never a rate per ms: a rate is rounded once and again when
-- used (2 per hour over 1,800,000 ms came to 0.9999999999999999 tokens, a wait of 1,800,001 ms);
-- multiplied first, only the division rounds, and a product of whole numbers is exact below 2^53.
local function bucket_load(i, b, v)
  local capacity = arg[b + 2]
  local stored_tokens, stored_updated = tonumber(v[1]), tonumber(v[2])
  local tokens
  if stored_tokens and stored_updated then
    local elapsed = now - stored_updated
    if elapsed < 0 then elapsed = 0 end
    tokens = min(capacity, stored_tokens + elapsed * arg[b + 3] / arg[b + 4])
    v[2] = max(stored_updated, now)
  else
    tokens = capacity
    v[2] = now
  end
  v[1] = tokens
  return arg[b + 6] % 2 == 1 or tokens >= max(arg[b + 5], 1)
end

local function bucket_settle(i, b, v, fit, take)
  local capacity, per_unit, unit, hits, flags = arg[b + 2], arg[b + 3], arg[b + 4], arg[b + 5], arg[b + 6]
  local tokens = v[1]
  local after, granted = tokens, 0
  if flags % 2 == 1 then
    after = min(tokens + hits, capacity)
  elseif take then
    local left = tokens - hits
    -- Never negative: an always-charged take may leave the bucket in debt.
    local extra = max(0, min(floor(left), floor(flags / 16)))
    granted = hits + extra
    after = left - extra
  end
  local need = max(hits, 1)
  local retry
  if fit then
    retry = 0
  elseif need > capacity then
    retry = -1
  else
    -- The estimate can be a ms off from a fraction of a token; the search finds the first ms
    -- the refill admits.
    retry = wire(first_fit(ceil((need - after) * unit / per_unit), function(d)
      return min(capacity, after + d * per_unit / unit) >= need
    end))
  end
  local until_full = ceil((capacity - after) * unit / per_unit)
  if until_full ~= until_full then until_full = 0 end
  v[1] = after
  return wire(floor(after)), retry, wire(until_full), granted, until_full
end

local window_load, window_settle, sliding_load, sliding_settle, gcra_load, gcra_settle
local backlog

-- The largest n in [0, cap] near guess with ok(n): hits that would still fit now.
local most_that_fit
if uses[3] or uses[4] then
  most_that_fit = function(guess, cap, ok)
    local n = floor(guess)
    if n ~= n or n < 0 then n = 0 end
    if n > cap then n = cap end
    for _ = 1, SEARCH_STEPS do
      if n > 0 and not ok(n) then n = n - 1 else break end
    end
    for _ = 1, SEARCH_STEPS do
      if n < cap and ok(n + 1) then n = n + 1 else break end
    end
    return n
  end
end

if uses[2] then
  -- 2: fixed window, aligned to the unit on the clock (envoyproxy/ratelimit's windows).
  window_load = function(i, b, v)
    local window = max(arg[b + 4], 1)
    local start = now - now % window
    local stored_start, stored_count = tonumber(v[1]), tonumber(v[2])
    if stored_start and stored_count and stored_start >= start then
      v[1], v[2] = stored_start, stored_count
    else
      v[1], v[2] = start, 0
    end
    return arg[b + 6] % 2 == 1 or v[2] + max(arg[b + 5], 1) <= arg[b + 3]
  end

  window_settle = function(i, b, v, fit, take)
    local limit, hits = arg[b + 3], arg[b + 5]
    local start = v[1]
    local window_end = start + max(arg[b + 4], 1)
    local count, granted = v[2], 0
    if arg[b + 6] % 2 == 1 then
      count = max(count - hits, 0)
    elseif take then
      count = count + hits
      granted = hits
    end
    local retry
    if fit then
      retry = 0
    elseif max(hits, 1) > limit then
      retry = -1
    else
      retry = wire(window_end - now)
    end
    -- envoyproxy/ratelimit's duration_until_reset: whole seconds from the start of now's second.
    local reset = window_end - (now - now % 1000)
    local settles_in = 0
    if count > 0 then settles_in = window_end - now end
    v[2] = count
    return wire(max(limit - count, 0)), retry, wire(reset), granted, settles_in
  end
end

if uses[3] then
  -- 3: sliding window counter: previous * (W - elapsed) / W + current.
  local function roll(start, current, previous, t, window)
    local now_start = t - t % window
    if start == nil then return now_start, 0, 0 end
    if start >= now_start then return start, current, previous end
    if start + window == now_start then return now_start, 0, current end
    return now_start, 0, 0
  end

  local function estimate(start, current, previous, t, window)
    local elapsed = t - start
    if elapsed < 0 then elapsed = 0 end
    return previous * (window - elapsed) / window + current
  end

  sliding_load = function(i, b, v)
    local window = max(arg[b + 4], 1)
    local start, current, previous = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
    if not (start and current and previous) then start = nil end
    start, current, previous = roll(start, current, previous, now, window)
    v[1], v[2], v[3] = start, current, previous
    local estimated = estimate(start, current, previous, now, window)
    return arg[b + 6] % 2 == 1 or estimated + max(arg[b + 5], 1) <= arg[b + 3]
  end

  sliding_settle = function(i, b, v, fit, take)
    local window, limit, hits = max(arg[b + 4], 1), arg[b + 3], arg[b + 5]
    local start, current, previous = v[1], v[2], v[3]
    local granted = 0
    if arg[b + 6] % 2 == 1 then
      local from_current = min(hits, current)
      current = current - from_current
      previous = max(previous - (hits - from_current), 0)
    elseif take then
      current = current + hits
      granted = hits
    end
    local estimated = estimate(start, current, previous, now, window)
    local remaining = most_that_fit(limit - estimated, limit, function(n)
      return estimated + n <= limit
    end)
    local need = max(hits, 1)
    local retry
    if fit then
      retry = 0
    elseif need > limit then
      retry = -1
    else
      local function fits_at(d)
        local t = now + d
        local s, c, p = roll(start, current, previous, t, window)
        return estimate(s, c, p, t, window) + need <= limit
      end
      local elapsed = now - start
      if elapsed < 0 then elapsed = 0 end
      local guess
      if current + need <= limit and previous > 0 then
        guess = ceil((window - elapsed) - (limit - need - current) * window / previous)
      else
        local into_next = 0
        if current > 0 then into_next = window - (limit - need) * window / current end
        if into_next < 0 then into_next = 0 end
        guess = (start + window - now) + ceil(into_next)
      end
      retry = wire(first_fit(guess, fits_at))
    end
    local until_full = 0
    if current > 0 then
      until_full = start + 2 * window - now
    elseif previous > 0 then
      until_full = start + window - now
    end
    v[2], v[3] = current, previous
    return wire(remaining), retry, wire(until_full), granted, until_full
  end
end

if uses[4] then
  -- 4: GCRA. T = unit_ms / per_unit, tolerance = T * capacity, slack = min(T / 2^20, 1 ms).
  -- The state is the arrival time in whole ms and its fraction; `backlog[i]`, how far it is ahead
  -- of now, is what load and settle share.
  backlog = {}
  local function shape(b)
    local interval = max(arg[b + 4], 1) / max(arg[b + 3], 1)
    local slack = interval / 1048576
    if slack > 1 then slack = 1 end
    return interval, interval * arg[b + 2], slack
  end

  gcra_load = function(i, b, v)
    local interval, tolerance, slack = shape(b)
    local whole, frac = tonumber(v[1]), tonumber(v[2])
    local ahead = 0
    if whole and frac then
      ahead = (whole - now) + frac
      if ahead < 0 then ahead = 0 end
    end
    backlog[i] = ahead
    local need = max(arg[b + 5], 1)
    return arg[b + 6] % 2 == 1
      or (need <= arg[b + 2] and ahead + need * interval <= tolerance + slack)
  end

  gcra_settle = function(i, b, v, fit, take)
    local interval, tolerance, slack = shape(b)
    local burst, hits, flags = arg[b + 2], arg[b + 5], arg[b + 6]
    local after, granted = backlog[i], 0
    if flags % 2 == 1 then
      after = after - hits * interval
      if after < 0 then after = 0 end
    elseif take then
      after = after + hits * interval
      local extra = 0
      local lease = floor(flags / 16)
      if lease > 0 then
        extra = most_that_fit((tolerance + slack - after) / interval, lease, function(n)
          return after + n * interval <= tolerance + slack
        end)
        after = after + extra * interval
      end
      granted = hits + extra
    end
    local whole = floor(after)
    local frac = after - whole
    local tat = now + whole
    local remaining = most_that_fit((tolerance + slack - after) / interval, burst, function(n)
      return after + n * interval <= tolerance + slack
    end)
    local need = max(hits, 1)
    local retry
    if fit then
      retry = 0
    elseif need > burst then
      retry = -1
    else
      local function fits_at(d)
        local ahead = (tat - (now + d)) + frac
        if ahead < 0 then ahead = 0 end
        return need <= burst and ahead + need * interval <= tolerance + slack
      end
      local guess = ceil(after + need * interval - tolerance - slack)
      retry = wire(first_fit(guess, fits_at))
    end
    local until_full = tat - now
    if frac > 0 then until_full = until_full + 1 end
    v[1], v[2] = tat, frac
    return wire(remaining), retry, wire(until_full), granted, until_full
  end
end

local slots_read, slots_empty, slots_fit, slots_settle, slots_state
if uses[5] then
  -- 5: in-flight cap. The ZSET is read and written at once, not kept in `seen`: each request of
  -- a batch has its own holder, and a group reads what the groups before it wrote. Bringing the
  -- key to now removes the expired slots (a peek only counts around them). `live`, `holds`,
  -- `first` and `last` per key are the Slots of src/algorithm/in_flight.rs.
  local live, holds, first, last = {}, {}, {}, {}
  local function bound(key, lo, hi, rev)
    local cmd = 'ZRANGEBYSCORE'
    if rev then cmd = 'ZREVRANGEBYSCORE' end
    local r = redis.call(cmd, key, lo, hi, 'WITHSCORES', 'LIMIT', 0, 1)
    if r[2] then return tonumber(r[2]) end
    return 0
  end

  -- Returns true, or the error reply of a key that is not a ZSET.
  slots_read = function(i, key)
    local after = '(' .. format('%.0f', now)
    if not peek then
      local removed = redis.pcall('ZREMRANGEBYSCORE', key, '-inf', format('%.0f', now))
      if type(removed) == 'table' then return removed end
    end
    local n = redis.pcall('ZCOUNT', key, after, '+inf')
    if type(n) == 'table' then return n end
    live[i] = n
    holds[i] = not peek and redis.call('ZSCORE', key, holder_of[i]) ~= false
    first[i] = bound(key, after, '+inf', false)
    last[i] = bound(key, '+inf', after, true)
    return true
  end

  -- A key read as holding no slot (a repaired one).
  slots_empty = function(i)
    live[i], holds[i], first[i], last[i] = 0, false, 0, 0
  end

  slots_fit = function(i, b)
    return arg[b + 6] % 2 == 1 or holds[i] or live[i] < arg[b + 2]
  end

  slots_settle = function(i, b, key, fit, take)
    local capacity, hold, hits = arg[b + 2], arg[b + 4], arg[b + 5]
    local n, f, l, granted = live[i], first[i], last[i], 0
    if arg[b + 6] % 2 == 1 then
      if holds[i] then
        redis.call('ZREM', key, holder_of[i])
        n = n - 1
        granted = 1
      end
    elseif take and hits > 0 and not holds[i] then
      local expiry = now + hold
      redis.call('ZADD', key, format('%.0f', expiry), holder_of[i])
      if n == 0 then f = expiry else f = min(f, expiry) end
      l = max(l, expiry)
      n = n + 1
      granted = 1
      local ttl = l - now + EXPIRY_MARGIN_MS + jitter
      if ttl > MAX_TTL_MS then ttl = MAX_TTL_MS end
      redis.call('PEXPIRE', key, format('%.0f', ttl))
    end
    if n == 0 then f, l = 0, 0 end
    local retry = 0
    if not fit then
      retry = f - now
      if retry < 1 then retry = 1 end
      if retry > RETRY_HINT_MS then retry = RETRY_HINT_MS end
    end
    live[i], first[i], last[i] = n, f, l
    return wire(max(capacity - n, 0)), retry, wire(max(l - now, 0)), granted
  end

  slots_state = function(i)
    return {live[i], first[i], last[i]}
  end
end

local reply, fits, repaired = {}, {}, {}

local ledger_read, ledger_settle
if uses[6] then
  -- 6: reservation ledger, read before the rest of its group so that its bucket, the next key,
  -- is decided as settled. `found[i]`: the live reservation (0: none); `lapses[i]` its expiry.
  local found, lapses = {}, {}

  -- Returns true, or the error reply of a key that is not a string.
  ledger_read = function(i, key, last)
    local v = redis.pcall('GET', key)
    if type(v) == 'table' and v.err then
      if not string.find(v.err, 'WRONGTYPE', 1, true) then return v end
      if not peek then redis.call('PEXPIRE', key, 0) end
      repaired[#repaired + 1] = i
      v = false
    end
    local amount, expires = 0, 0
    if v then
      local a, e = string.match(v, '^(%d+) (%d+)$')
      a, e = tonumber(a), tonumber(e)
      if a and e and e > now then amount, expires = a, e end
    end
    found[i], lapses[i] = amount, expires
    if amount > 0 and i < last then
      -- The bucket's demand h becomes h - r: a refund of r - h (or of nothing), else an
      -- always-charged take; shadow (2) and quota (4) stay, a lease does not.
      local b = WIDTH * i
      local hits, flags = arg[b + 5], arg[b + 6]
      local asked = hits
      if flags % 2 == 1 then asked = -hits end
      local net = asked - amount
      local keep = flags % 8 - flags % 2
      if net > 0 then
        arg[b + 5], arg[b + 6] = net, keep + 8
      else
        arg[b + 5], arg[b + 6] = -net, keep + 1
      end
    end
    return true
  end

  -- Deletes a settled reservation, or records one when the bucket took the hits.
  ledger_settle = function(i, b, key, last, allowed)
    local granted = 0
    if not peek then
      if found[i] > 0 then
        redis.call('PEXPIRE', key, 0)
      elseif i < last and arg[b + 5] >= 1 then
        local flags = arg[b + WIDTH + 6]
        if flags % 2 == 0 and (floor(flags / 8) % 2 == 1 or (allowed and fits[i + 1])) then
          local hold = arg[b + 4]
          local ttl = hold + EXPIRY_MARGIN_MS + jitter
          if ttl > MAX_TTL_MS then ttl = MAX_TTL_MS end
          redis.call('SET', key, format('%.0f %.0f', arg[b + 5], now + hold),
            'PX', format('%.0f', ttl))
          granted = arg[b + 5]
        end
      end
    end
    return found[i], 0, 0, granted, {found[i], lapses[i], false}
  end
end
local width = 5
if peek then width = 9 end
local first = 1
for g = 1, #ends do
  local last = ends[g]
  -- ordinary: every ordinary demand passes; quota_seen, quota_passed: of the quota ones.
  local ordinary, quota_seen, quota_passed = true, false, false
  if uses[6] then
    for i = first, last do
      if arg[WIDTH * (i - 1) + 1] == 6 then
        local read = ledger_read(i, KEYS[i], last)
        if read ~= true then return read end
      end
    end
  end
  for i = first, last do
    local b = WIDTH * (i - 1)
    local code = arg[b + 1]
    local key = KEYS[i]
    local v = seen[key]
    if code == 6 then
      -- Read before the group.
    elseif code == 5 then
      local read = slots_read(i, key)
      if read ~= true then
        if not string.find(read.err, 'WRONGTYPE', 1, true) then return read end
        if not peek then redis.call('PEXPIRE', key, 0) end
        repaired[#repaired + 1] = i
        slots_empty(i)
      end
    elseif v then
      if code_of[key] ~= code then
        error('sluice limit: key ' .. key .. ' has two algorithms in one call')
      end
    else
      if code == 1 then
        v = redis.pcall('HMGET', key, 't', 'u')
      elseif code == 2 then
        v = redis.pcall('HMGET', key, 'w', 'c')
      elseif code == 3 then
        v = redis.pcall('HMGET', key, 'w', 'c', 'p')
      else
        v = redis.pcall('HMGET', key, 'a', 'f')
      end
      if v.err then
        -- Not a hash (WRONGTYPE): foreign data under a bucket's name. It is that key's problem,
        -- not the server's: deleted, read as a fresh bucket, and reported. PEXPIRE 0 deletes a
        -- key (as documented) with a command the script already needs, so the least-privilege
        -- ACL user (docs/security.md, no DEL) can repair too.
        if not string.find(v.err, 'WRONGTYPE', 1, true) then return v end
        if not peek then redis.call('PEXPIRE', key, 0) end
        repaired[#repaired + 1] = i
        v = {false, false, false}
      end
      seen[key], code_of[key] = v, code
    end
    local fit
    if code == 6 then
      fit = true
    elseif code == 5 then
      fit = slots_fit(i, b)
    elseif code == 1 then
      fit = bucket_load(i, b, v)
    elseif code == 2 then
      fit = window_load(i, b, v)
    elseif code == 3 then
      fit = sliding_load(i, b, v)
    else
      fit = gcra_load(i, b, v)
    end
    fits[i] = fit
    local flags = arg[b + 6]
    local passes = fit or flags % 4 >= 2
    if floor(flags / 4) % 2 == 1 then
      quota_seen = true
      if passes then quota_passed = true end
    elseif not passes then
      ordinary = false
    end
  end
  local all_allowed = ordinary and (quota_passed or not quota_seen)
  for i = first, last do
    local b = WIDTH * (i - 1)
    local code, fit = arg[b + 1], fits[i]
    local flags = arg[b + 6]
    local take = not peek and flags % 2 == 0
      and (floor(flags / 8) % 2 == 1 or (all_allowed and fit))
    local key = KEYS[i]
    local v = seen[key]
    local remaining, retry, until_full, granted, settles_in
    if code == 6 then
      remaining, retry, until_full, granted, v = ledger_settle(i, b, key, last, all_allowed)
    elseif code == 5 then
      remaining, retry, until_full, granted = slots_settle(i, b, key, fit, take)
      v = slots_state(i)
    elseif code == 1 then
      remaining, retry, until_full, granted, settles_in = bucket_settle(i, b, v, fit, take)
    elseif code == 2 then
      remaining, retry, until_full, granted, settles_in = window_settle(i, b, v, fit, take)
    elseif code == 3 then
      remaining, retry, until_full, granted, settles_in = sliding_settle(i, b, v, fit, take)
    else
      remaining, retry, until_full, granted, settles_in = gcra_settle(i, b, v, fit, take)
    end
    -- The key is written at the flush with this state, to expire once it settles (an
    -- in_flight key or a ledger is written already).
    if code < 5 then
      local ttl = settles_in + EXPIRY_MARGIN_MS + jitter
      if ttl > MAX_TTL_MS then ttl = MAX_TTL_MS end
      if not ttl_of[key] then write_order[#write_order + 1] = key end
      ttl_of[key] = ttl
    end
    local at = width * (i - 1)
    reply[at + 1] = fit and 1 or 0
    reply[at + 2] = remaining
    reply[at + 3] = retry
    reply[at + 4] = until_full
    reply[at + 5] = wire(granted)
    if peek then
      local pttl = redis.pcall('PTTL', key)
      if type(pttl) ~= 'number' then pttl = -3 end
      reply[at + 6] = pttl
      for f = 1, 3 do
        if type(v[f]) == 'number' then
          reply[at + 6 + f] = format('%.17g', v[f])
        else
          reply[at + 6 + f] = ''
        end
      end
    end
  end
  first = last + 1
end

-- One HSET + PEXPIRE per written key, with its last state and TTL, in first-write order; a
-- peek writes nothing.
if peek then write_order = {} end
for n = 1, #write_order do
  local key = write_order[n]
  local code, v = code_of[key], seen[key]
  if code == 1 then
    redis.call('HSET', key, 't', format('%.17g', v[1]), 'u', format('%.0f', v[2]))
  elseif code == 2 then
    redis.call('HSET', key, 'w', format('%.0f', v[1]), 'c', format('%.0f', v[2]))
  elseif code == 3 then
    redis.call('HSET', key, 'w', format('%.0f', v[1]), 'c', format('%.0f', v[2]),
      'p', format('%.0f', v[3]))
  else
    redis.call('HSET', key, 'a', format('%.0f', v[1]), 'f', format('%.17g', v[2]))
  end
  redis.call('PEXPIRE', key, format('%.0f', ttl_of[key]))
end
local at = width * nkeys
if peek then
  reply[at + 1] = now
  at = at + 1
end
reply[at + 1] = #repaired
for n = 1, #repaired do reply[at + 1 + n] = repaired[n] end
return reply
