--[[
sluice limit: decides every key of one request in one atomic call, each key by its own algorithm.

KEYS    The keys of one request, or of several (a batch), all in one Cluster slot (the caller
        groups by slot). Keys of one request are distinct; requests of a batch may share keys.
ARGV[1] Now in ms, or "" to read Redis TIME. Production always passes "": Redis's clock is the
        only clock, so replicas whose own clocks disagree still decide alike. A number is a
        test-only override that lets a suite step time.
ARGV[2] Expiry jitter in ms (>= 0), added to every key's TTL so keys written together do not all
        expire together (envoyproxy/ratelimit's EXPIRATION_JITTER_MAX_SECONDS); the caller draws it.
ARGV[3 + 6*(i-1) ...] Six values for KEYS[i]:
        algorithm (1 token_bucket, 2 fixed_window, 3 sliding_window, 4 gcra; + 16 on the first
        key of every request of a batch after the first: a group starts there), capacity,
        requests_per_unit, unit_ms, hits, flags = refund (1) + shadow (2) + 4 * lease, where
        lease > 0 makes a take of `hits` also take up to `lease` more whole tokens when it is
        taken (token_bucket and gcra; the windows ignore it), for the caller to spend locally.
State   One hash per key, its fields by algorithm (the key itself carries the algorithm, so a
        rule whose algorithm changes never reads another algorithm's state):
          token_bucket    t <tokens> u <updated_ms>      (unchanged since the first release)
          fixed_window    w <window start> c <count>
          sliding_window  w <window start> c <count> p <previous window's count>
          gcra            a <arrival time, whole ms> f <its fraction of a ms>
        Fractions are written with %.17g, which round-trips a double exactly (tostring keeps 14
        digits and would drift from the Rust side). A missing key has nothing counted, so a key
        expires once its state settles (bucket full, windows over, arrival time passed), plus
        1000 ms and the jitter, at most 2^53 ms: expiry is exact semantics, not a cache eviction.
Returns A flat array, 5 integers per key, in KEYS order:
        allowed (0/1), remaining, retry_after_ms (-1 = never: demand above the limit),
        until_full_ms (the reset Envoy reports), granted (tokens this call took from the key:
        hits plus a lease take's extra; 0 when nothing was taken).
        Redis truncates Lua numbers to integers through a C cast that is undefined out of the
        int64 range, so each count goes through `wire`: values in [2^63, 2^64) are sent as
        value - 2^64 (the caller reads the bits as u64), values from 2^64 up as -2 (saturated:
        u64::MAX), NaN and negatives as 0 -- exactly what Rust's `f64 as u64` gives.

Why groups: concurrent requests on one connection can share a call (the caller batches them),
which pays Redis's fixed cost of a call -- the command, EVALSHA's lookup, the script's set-up,
TIME -- once for all of them. Each group is decided as its own call would decide it, in KEYS
order: all of a group's keys are read only after every earlier group wrote (to the call's own
view of its keys, which reaches Redis once at the end: a key shared by many requests of a batch
costs one read and one write), so a batch answers exactly as its requests would one after
another, at one `now`. A call without +16 is one group.

Why one script for every algorithm: all of a request's keys are decided in one call whatever
their algorithms, in two passes -- first every key is read, brought to now and asked whether its
demand fits; then, only if every non-shadow demand fits, takes are counted (a shadow take only
when it fits itself). Refunds are always applied. So a rejected request counts nothing anywhere.

The arithmetic is src/algorithm/{token_bucket,fixed_window,sliding_window,gcra}.rs operation for
operation (same doubles, same order; each file states its contract), so this script and
`algorithm::decide` give bit-identical answers. need = max(hits, 1) everywhere.
One HMGET per distinct key to read and one HSET + PEXPIRE per distinct key to write, at the end:
O(keys), no scans; the searches for retry-after and remaining take at most 8 steps per key.
Needs Redis >= 5 (effects replication, so reading TIME before writing is allowed).
--]]

local WIDTH = 6
local GROUP_START = 16
-- Locals, not `math.*` lookups: the script is interpreted on every call.
local floor, ceil, min, max, format = math.floor, math.ceil, math.min, math.max, string.format
local nkeys = #KEYS
if nkeys == 0 or #ARGV ~= 2 + WIDTH * nkeys then
  return redis.error_reply('ERR sluice limit: expected 2 + 6 ARGV per key')
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
local jitter = tonumber(ARGV[2])
if not jitter or jitter < 0 then
  return redis.error_reply('ERR sluice limit: ARGV[2] must be a number >= 0')
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

local function wire(x)
  if x ~= x or x <= 0 then return 0 end
  if x >= TWO_64 then return -2 end
  if x >= TWO_63 then return x - TWO_64 end
  return x
end

local function exact(x) return format('%.0f', x) end
local function double(x) return format('%.17g', x) end

-- Which algorithms this call uses: only their tables and closures are built (building all four
-- on every call cost a sixth of the script's time).
local used = {}
for i = 1, nkeys do
  used[(tonumber(ARGV[3 + WIDTH * (i - 1)]) or 0) % GROUP_START] = true
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

local most_that_fit
if used[3] or used[4] then
  -- The largest n in [0, cap] near guess with ok(n): hits that would still fit now.
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

-- A key's state as this call sees it, and its deferred write: requests of a batch often share a
-- key (a hot tenant), so each distinct key is read from Redis once, kept here between its
-- requests, and written once at the end (`flush`). No other client runs while the script does,
-- so the result is the same as reading and writing every time. `seen[key]` is the array of the
-- key's algorithm's fields in `fields` order -- HMGET's reply, then updated in place -- and
-- `algorithm_of[key]` that algorithm: a key names its algorithm (sluice tags every key but a
-- token bucket's), so one key never has two in a call, and a call that tries fails before
-- anything is written. Written values stay numbers until the flush formats them: the formats
-- round-trip (%.17g any double, %.0f the whole numbers it is given), so `tonumber` of a kept
-- number is what reading the written string back would give. Plain arrays and no varargs: this
-- runs for every key of every call, and each table the script builds is garbage Redis's Lua
-- must collect.
local seen, algorithm_of, ttl_of, write_order = {}, {}, {}, {}

local function read(key, algorithm)
  local values = seen[key]
  if values then
    if algorithm_of[key] ~= algorithm then
      error('sluice limit: key ' .. key .. ' has two algorithms in one call')
    end
    return values
  end
  values = redis.call('HMGET', key, unpack(algorithm.fields))
  seen[key], algorithm_of[key] = values, algorithm
  return values
end

-- The key's new state, in its algorithm's field order (c only for three fields).
local function store(key, settles_in, a, b, c)
  local ttl = settles_in + EXPIRY_MARGIN_MS + jitter
  if ttl > MAX_TTL_MS then ttl = MAX_TTL_MS end
  if not ttl_of[key] then write_order[#write_order + 1] = key end
  ttl_of[key] = ttl
  local values = seen[key]
  values[1], values[2], values[3] = a, b, c
end

-- One HSET + PEXPIRE per written key, with its last state and TTL, in first-write order.
local function flush()
  for i = 1, #write_order do
    local key = write_order[i]
    local algorithm, values = algorithm_of[key], seen[key]
    local f, as = algorithm.fields, algorithm.formats
    if #f == 2 then
      redis.call('HSET', key, f[1], as[1](values[1]), f[2], as[2](values[2]))
    else
      redis.call('HSET', key, f[1], as[1](values[1]), f[2], as[2](values[2]),
        f[3], as[3](values[3]))
    end
    redis.call('PEXPIRE', key, exact(ttl_of[key]))
  end
end

-- Each algorithm: `fields` to HMGET, `load(k, values)` brings the state to now and returns
-- whether the demand fits, `settle(k, take)` writes the new state and returns the reply values.
local ALGORITHMS = {}

-- 1: token bucket. tokens = min(capacity, tokens + elapsed * per_unit / unit_ms); the waits are
-- ceil(tokens short * unit_ms / per_unit), retry-after corrected by first_fit against the refill. Each product before its division, never a rate per
-- ms: a rate is rounded once and again when used (2 per hour over 1,800,000 ms came to
-- 0.9999999999999999 tokens, a wait of 1,800,001 ms); multiplied first, only the division
-- rounds, and a product of whole numbers is exact below 2^53.
ALGORITHMS[1] = {
  fields = {'t', 'u'},
  formats = {double, exact},
  load = function(k, v)
    local stored_tokens, stored_updated = tonumber(v[1]), tonumber(v[2])
    if stored_tokens and stored_updated then
      local elapsed = now - stored_updated
      if elapsed < 0 then elapsed = 0 end
      k.tokens = min(k.capacity, stored_tokens + elapsed * k.per_unit / k.unit)
      k.updated = max(stored_updated, now)
    else
      k.tokens = k.capacity
      k.updated = now
    end
    return k.refund or k.tokens >= max(k.hits, 1)
  end,
  settle = function(k, take)
    local capacity, per_unit, unit, hits, tokens = k.capacity, k.per_unit, k.unit, k.hits, k.tokens
    local after
    if k.refund then
      after = min(tokens + hits, capacity)
    elseif take then
      local left = tokens - hits
      local extra = min(floor(left), k.lease)
      k.granted = hits + extra
      after = left - extra
    else
      after = tokens
    end
    local need = max(hits, 1)
    local retry
    if k.fit then
      retry = 0
    elseif need > capacity then
      retry = -1
    else
      -- The estimate can be a ms off from a fraction of a token; the search finds the first ms
      -- the refill admits.
      retry = wire(first_fit(ceil((need - tokens) * unit / per_unit), function(d)
        return min(capacity, tokens + d * per_unit / unit) >= need
      end))
    end
    local until_full = ceil((capacity - after) * unit / per_unit)
    if until_full ~= until_full then until_full = 0 end
    store(k.key, until_full, after, k.updated)
    return wire(floor(after)), retry, wire(until_full)
  end,
}

if used[2] then
  -- 2: fixed window, aligned to the unit on the clock (envoyproxy/ratelimit's windows).
  ALGORITHMS[2] = {
    fields = {'w', 'c'},
    formats = {exact, exact},
    load = function(k, v)
      local start = now - now % k.window
      local stored_start, stored_count = tonumber(v[1]), tonumber(v[2])
      if stored_start and stored_count and stored_start >= start then
        k.start, k.count = stored_start, stored_count
      else
        k.start, k.count = start, 0
      end
      return k.refund or k.count + max(k.hits, 1) <= k.per_unit
    end,
    settle = function(k, take)
      local limit, hits = k.per_unit, k.hits
      local window_end = k.start + k.window
      local count = k.count
      if k.refund then
        count = max(count - hits, 0)
      elseif take then
        count = count + hits
        k.granted = hits
      end
      local retry
      if k.fit then
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
      store(k.key, settles_in, k.start, count)
      return wire(max(limit - count, 0)), retry, wire(reset)
    end,
  }

  -- 3: sliding window counter: previous * (W - elapsed) / W + current.
end

if used[3] then
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

  ALGORITHMS[3] = {
    fields = {'w', 'c', 'p'},
    formats = {exact, exact, exact},
    load = function(k, v)
      local start, current, previous = tonumber(v[1]), tonumber(v[2]), tonumber(v[3])
      if not (start and current and previous) then start = nil end
      k.start, k.current, k.previous = roll(start, current, previous, now, k.window)
      local estimated = estimate(k.start, k.current, k.previous, now, k.window)
      return k.refund or estimated + max(k.hits, 1) <= k.per_unit
    end,
    settle = function(k, take)
      local window, limit, hits, start = k.window, k.per_unit, k.hits, k.start
      local current, previous = k.current, k.previous
      if k.refund then
        local from_current = min(hits, current)
        current = current - from_current
        previous = max(previous - (hits - from_current), 0)
      elseif take then
        current = current + hits
        k.granted = hits
      end
      local estimated = estimate(start, current, previous, now, window)
      local remaining = most_that_fit(limit - estimated, limit, function(n)
        return estimated + n <= limit
      end)
      local need = max(hits, 1)
      local retry
      if k.fit then
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
      store(k.key, until_full, start, current, previous)
      return wire(remaining), retry, wire(until_full)
    end,
  }
end

if used[4] then
  -- 4: GCRA. T = unit_ms / per_unit, tolerance = T * capacity, slack = min(T / 2^20, 1 ms).
  ALGORITHMS[4] = {
    fields = {'a', 'f'},
    formats = {exact, double},
    load = function(k, v)
      local interval = k.window / max(k.per_unit, 1)
      local slack = interval / 1048576
      if slack > 1 then slack = 1 end
      k.interval, k.tolerance, k.slack = interval, interval * k.capacity, slack
      local whole, frac = tonumber(v[1]), tonumber(v[2])
      local backlog = 0
      if whole and frac then
        backlog = (whole - now) + frac
        if backlog < 0 then backlog = 0 end
      end
      k.backlog = backlog
      local need = max(k.hits, 1)
      return k.refund or (need <= k.capacity and backlog + need * interval <= k.tolerance + slack)
    end,
    settle = function(k, take)
      local interval, tolerance, slack, burst = k.interval, k.tolerance, k.slack, k.capacity
      local hits = k.hits
      local after = k.backlog
      if k.refund then
        after = after - hits * interval
        if after < 0 then after = 0 end
      elseif take then
        after = after + hits * interval
        local extra = 0
        if k.lease > 0 then
          extra = most_that_fit((tolerance + slack - after) / interval, k.lease, function(n)
            return after + n * interval <= tolerance + slack
          end)
          after = after + extra * interval
        end
        k.granted = hits + extra
      end
      local whole = floor(after)
      local frac = after - whole
      local tat = now + whole
      local remaining = most_that_fit((tolerance + slack - after) / interval, burst, function(n)
        return after + n * interval <= tolerance + slack
      end)
      local need = max(hits, 1)
      local retry
      if k.fit then
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
      store(k.key, until_full, tat, frac)
      return wire(remaining), retry, wire(until_full)
    end,
  }
end

-- Every key's values are parsed before anything is read or written, so a malformed call fails
-- having changed nothing. `ends` lists the last key of every group.
local keys, ends = {}, {}
for i = 1, nkeys do
  local base = 3 + WIDTH * (i - 1)
  local code = tonumber(ARGV[base])
  local capacity = tonumber(ARGV[base + 1])
  local per_unit = tonumber(ARGV[base + 2])
  local unit = tonumber(ARGV[base + 3])
  local hits = tonumber(ARGV[base + 4])
  local flags = tonumber(ARGV[base + 5])
  if not (code and capacity and per_unit and unit and hits and flags) then
    return redis.error_reply('ERR sluice limit: non-numeric ARGV for key ' .. i)
  end
  if code >= GROUP_START then
    code = code - GROUP_START
    if i > 1 then ends[#ends + 1] = i - 1 end
  end
  local algorithm = ALGORITHMS[code]
  if not algorithm then
    return redis.error_reply('ERR sluice limit: unknown algorithm ' .. code .. ' for key ' .. i)
  end
  keys[i] = {
    key = KEYS[i], algorithm = algorithm, capacity = capacity, per_unit = per_unit,
    unit = unit, window = max(unit, 1), hits = hits,
    refund = flags % 2 == 1, shadow = flags % 4 >= 2, lease = floor(flags / 4),
    granted = 0,
  }
end
ends[#ends + 1] = nkeys

local reply = {}
local first = 1
for g = 1, #ends do
  local last = ends[g]
  local all_allowed = true
  for i = first, last do
    local k = keys[i]
    local state = read(k.key, k.algorithm)
    k.fit = k.algorithm.load(k, state)
    if not k.fit and not k.shadow then all_allowed = false end
  end
  for i = first, last do
    local k = keys[i]
    local take = all_allowed and k.fit and not k.refund
    local remaining, retry, until_full = k.algorithm.settle(k, take)
    local at = 5 * (i - 1)
    reply[at + 1] = k.fit and 1 or 0
    reply[at + 2] = remaining
    reply[at + 3] = retry
    reply[at + 4] = until_full
    reply[at + 5] = wire(k.granted)
  end
  first = last + 1
end
flush()
return reply
