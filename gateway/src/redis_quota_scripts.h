// The Lua scripts of redis_quota_store: each runs atomically in Redis, so the read, the
// decision and the write of a tenant's counters cannot interleave with another gateway's.
//
// Times: Redis numbers are doubles, exact to 2^53, which nanoseconds since 1970 exceed. A point
// in time is therefore kept as whole microseconds since 1970 (exact) plus the nanoseconds past
// them (0..999), and only differences (small) are computed in nanoseconds: the same integers
// in_memory_quota_store computes with, so both stores decide alike to the nanosecond. Numbers
// that must survive a round trip exactly (the bucket level) are written with %.17g.
//
// Each script takes "now" as its first arguments: an empty string for the server's TIME (the
// production path: one clock for every gateway), or a test clock's readings.
#pragma once

#include <string_view>

namespace edge::gateway::redis_scripts {

// KEYS: rate hash, slots sorted set, daily hash.
// ARGV: now_us ('' = TIME), now_ns (0..999), now_s (calendar seconds), requests/min, tokens/min,
//       max concurrent, daily tokens (0 = unlimited each), cost, admit ('1' = take it if every
//       limit allows, '0' = only read), slot id, slot lease ms, rate key lifetime ms.
// Returns {admitted 1/0, GCRA backlog ns, bucket level (%.17g), slots in use, tokens of today,
//          today (UTC day number), now_s}: the counters as they read before this request, for
//          quota_rules::judge to explain.
inline constexpr std::string_view acquire = R"lua(
if redis.replicate_commands then redis.replicate_commands() end  -- Redis < 5: writes after TIME
local now_us, now_ns, now_s
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now_s = tonumber(t[1])
  now_us = now_s * 1000000 + tonumber(t[2])
  now_ns = 0
else
  now_us, now_ns, now_s = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
end
local window = 60000000000
local rpm, tpm, concurrent, daily = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local cost = tonumber(ARGV[8])
local ok = ARGV[9] == '1'
local lease = tonumber(ARGV[11])
-- Nanoseconds from the point (us, ns) to now.
local function since(us, ns) return (now_us - us) * 1000 + (now_ns - ns) end

local rate = {}
if rpm > 0 or tpm > 0 then rate = redis.call('HMGET', KEYS[1], 'tat_us', 'tat_ns', 'bucket', 'at_us', 'at_ns') end

-- Requests per minute (GCRA): the backlog is how far the theoretical arrival time is ahead.
local backlog, interval = 0, 0
if rpm > 0 then
  interval = math.max(math.floor(window / rpm), 1)
  if rate[1] then backlog = math.max(-since(tonumber(rate[1]), tonumber(rate[2])), 0) end
  if backlog + interval > window then ok = false end
end

-- Tokens per minute: the bucket, refilled up to now (full when the key is absent).
local level, at_us, at_ns = 0, now_us, now_ns
if tpm > 0 then
  if rate[3] and rate[4] then
    level, at_us, at_ns = tonumber(rate[3]), tonumber(rate[4]), tonumber(rate[5])
    local elapsed = since(at_us, at_ns)
    if elapsed > 0 then
      level = level + elapsed * tpm / window
      at_us, at_ns = now_us, now_ns
    end
  else
    level = tpm
  end
  level = math.min(level, tpm)
  if cost > level then ok = false end
end

-- Max concurrent: slots whose lease ran out belong to a gateway that stopped renewing them.
local in_flight = 0
local now_ms = math.floor(now_us / 1000)
if concurrent > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
  in_flight = redis.call('ZCARD', KEYS[2])
  if in_flight >= concurrent then ok = false end
end

-- Daily budget of the UTC day.
local today = math.floor(now_s / 86400)
local day_tokens = 0
if daily > 0 then
  local day = redis.call('HMGET', KEYS[3], 'day', 'tokens')
  if tonumber(day[1]) == today then day_tokens = tonumber(day[2]) end
  if day_tokens + cost > daily then ok = false end
end

-- The refill is kept whether or not the request is admitted (as in memory).
if tpm > 0 then
  local after = level
  if ok then after = level - cost end
  redis.call('HSET', KEYS[1], 'bucket', string.format('%.17g', after), 'at_us', at_us, 'at_ns', at_ns)
end
if ok then
  if rpm > 0 then
    local ahead = now_ns + backlog + interval
    redis.call('HSET', KEYS[1], 'tat_us', now_us + math.floor(ahead / 1000), 'tat_ns', ahead % 1000)
  end
  if concurrent > 0 then
    redis.call('ZADD', KEYS[2], now_ms + lease, ARGV[10])
    redis.call('PEXPIRE', KEYS[2], lease)
  end
  if daily > 0 then
    redis.call('HSET', KEYS[3], 'day', today, 'tokens', day_tokens + cost)
    redis.call('PEXPIRE', KEYS[3], ((today + 1) * 86400 - now_s + 60) * 1000)
  end
end
if tpm > 0 or (ok and rpm > 0) then redis.call('PEXPIRE', KEYS[1], ARGV[12]) end
return {ok and 1 or 0, backlog, string.format('%.17g', level), in_flight, day_tokens, today, now_s}
)lua";

// The unused part of a reservation goes back. KEYS: rate hash, daily hash.
// ARGV: tokens back to the bucket ('' = none), tokens back to the day ('' = none), the day.
// A bucket whose key expired is full already; a past day's count is not touched.
inline constexpr std::string_view settle = R"lua(
if ARGV[1] ~= '' then
  local level = redis.call('HGET', KEYS[1], 'bucket')
  if level then
    redis.call('HSET', KEYS[1], 'bucket', string.format('%.17g', tonumber(level) + tonumber(ARGV[1])))
  end
end
if ARGV[2] ~= '' then
  local day = redis.call('HMGET', KEYS[2], 'day', 'tokens')
  if day[1] and tonumber(day[1]) == tonumber(ARGV[3]) then
    redis.call('HSET', KEYS[2], 'tokens', math.max(tonumber(day[2]) - tonumber(ARGV[2]), 0))
  end
end
return 1
)lua";

// Renews the leases of slots still held. KEYS: slots sorted set.
// ARGV: now_us ('' = TIME), lease ms, then the slot ids. A slot already dropped stays dropped.
inline constexpr std::string_view renew = R"lua(
if redis.replicate_commands then redis.replicate_commands() end
local now_us
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now_us = tonumber(ARGV[1])
end
local lease = tonumber(ARGV[2])
local deadline = math.floor(now_us / 1000) + lease
for i = 3, #ARGV do redis.call('ZADD', KEYS[1], 'XX', deadline, ARGV[i]) end
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('PEXPIRE', KEYS[1], lease) end
return 1
)lua";

}  // namespace edge::gateway::redis_scripts
