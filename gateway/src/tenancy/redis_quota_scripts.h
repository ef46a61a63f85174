// The Lua scripts of redis_quota_store: each runs atomically in Redis, so the read, the
// decision and the write of a tenant's counters cannot interleave with another gateway's.
//
// Times: Redis numbers are doubles, exact to 2^53, which nanoseconds since 1970 exceed. A point
// in time is therefore kept as whole microseconds since 1970 (exact) plus the nanoseconds past
// them (0..999), and only differences (small) are computed in nanoseconds: the same integers
// in_memory_quota_store computes with, so both stores decide alike to the nanosecond. Numbers
// that must survive a round trip exactly (the bucket level) are written with %.17g.
//
// The scripts that read the clock take "now" as their first three arguments: an empty string
// for the server's TIME (the production path: one clock for every gateway), or a test clock's
// readings (microseconds, the nanoseconds past them, calendar seconds).
//
// Reservations are records, so that every call can be repeated, or arrive late, harmlessly:
// a request's max_concurrent slot is the member named by its reservation id in the slots set,
// and the tokens it reserved are the fields bucket / daily / day of its own hash. close gives
// back what the record holds and deletes it (a second close finds nothing); its cancel marks
// (cancel_admit, cancel_reserve) stop an admit or reserve that a gateway gave up on from taking
// anything if it runs after all.
#pragma once

#include <string>
#include <string_view>

namespace edge::gateway::redis_scripts {

// Reads "now" from ARGV[1..3] (or TIME) into now_us, now_ns, now_s; since(us, ns) is the
// nanoseconds from that point to now.
inline constexpr std::string_view clock_prelude = R"lua(
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
local function since(us, ns) return (now_us - us) * 1000 + (now_ns - ns) end
)lua";

// Phase 1. KEYS: rate hash, slots sorted set, the reservation's record hash.
// ARGV: now (3), requests/min, max concurrent (0 = unlimited each), reservation id, slot lease
//       ms, rate key lifetime ms.
// Returns {1 admitted / 0 refused / 2 the id was seen before (nothing taken), GCRA backlog ns,
//          slots in use}: the counters as they read before this request, for
//          quota_rules::judge_admit to explain.
inline const std::string admit = std::string(clock_prelude) + R"lua(
local rpm, concurrent = tonumber(ARGV[4]), tonumber(ARGV[5])
local id, lease = ARGV[6], tonumber(ARGV[7])
if redis.call('HEXISTS', KEYS[3], 'cancel_admit') == 1 or (concurrent > 0 and redis.call('ZSCORE', KEYS[2], id)) then
  return {2, 0, 0}
end
local ok = true

-- Requests per minute (GCRA): the backlog is how far the theoretical arrival time is ahead.
local backlog, interval = 0, 0
if rpm > 0 then
  interval = math.max(math.floor(window / rpm), 1)
  local tat = redis.call('HMGET', KEYS[1], 'tat_us', 'tat_ns')
  if tat[1] then backlog = math.max(-since(tonumber(tat[1]), tonumber(tat[2])), 0) end
  if backlog + interval > window then ok = false end
end

-- Max concurrent: slots whose lease ran out belong to a gateway that stopped renewing them.
local in_flight = 0
local now_ms = math.floor(now_us / 1000)
if concurrent > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
  in_flight = redis.call('ZCARD', KEYS[2])
  if in_flight >= concurrent then ok = false end
end

if ok then
  if rpm > 0 then
    local ahead = now_ns + backlog + interval
    redis.call('HSET', KEYS[1], 'tat_us', now_us + math.floor(ahead / 1000), 'tat_ns', ahead % 1000)
    redis.call('PEXPIRE', KEYS[1], ARGV[8])
  end
  if concurrent > 0 then
    redis.call('ZADD', KEYS[2], now_ms + lease, id)
    redis.call('PEXPIRE', KEYS[2], lease)
  end
end
return {ok and 1 or 0, backlog, in_flight}
)lua";

// Phase 2. KEYS: rate hash, daily hash, the reservation's record hash.
// ARGV: now (3), tokens/min, daily tokens (0 = unlimited each), cost, take ('1' = take it if
//       every limit allows, '0' = only read), rate key lifetime ms, record lifetime ms.
// Returns {1 admitted / 0 refused / 2 the id was seen before (nothing taken), bucket level
//          (%.17g), tokens of today, today (UTC day number), now_s}: the counters as they read
//          before this request, for quota_rules::judge_reserve to explain.
inline const std::string reserve = std::string(clock_prelude) + R"lua(
local tpm, daily, cost = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local ok = ARGV[7] == '1'
if ok then
  local seen = redis.call('HMGET', KEYS[3], 'cancel_reserve', 'day')
  if seen[1] or seen[2] then return {2, '0', 0, 0, now_s} end
end

-- Tokens per minute: the bucket, refilled up to now (full when the key is absent).
local level, at_us, at_ns = 0, now_us, now_ns
if tpm > 0 then
  local rate = redis.call('HMGET', KEYS[1], 'bucket', 'at_us', 'at_ns')
  if rate[1] and rate[2] then
    level, at_us, at_ns = tonumber(rate[1]), tonumber(rate[2]), tonumber(rate[3])
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

-- Daily budget of the UTC day.
local today = math.floor(now_s / 86400)
local day_tokens = 0
if daily > 0 then
  local day = redis.call('HMGET', KEYS[2], 'day', 'tokens')
  if tonumber(day[1]) == today then day_tokens = tonumber(day[2]) end
  if day_tokens + cost > daily then ok = false end
end

-- The refill is kept whether or not the request is admitted (as in memory).
if tpm > 0 then
  local after = level
  if ok then after = level - cost end
  redis.call('HSET', KEYS[1], 'bucket', string.format('%.17g', after), 'at_us', at_us, 'at_ns', at_ns)
  redis.call('PEXPIRE', KEYS[1], ARGV[8])
end
if ok then
  local record = {'day', today}
  if tpm > 0 then
    table.insert(record, 'bucket')
    table.insert(record, cost)
  end
  if daily > 0 then
    redis.call('HSET', KEYS[2], 'day', today, 'tokens', day_tokens + cost)
    redis.call('PEXPIRE', KEYS[2], ((today + 1) * 86400 - now_s + 60) * 1000)
    table.insert(record, 'daily')
    table.insert(record, cost)
  end
  redis.call('HSET', KEYS[3], unpack(record))
  redis.call('PEXPIRE', KEYS[3], ARGV[9])
end
return {ok and 1 or 0, string.format('%.17g', level), day_tokens, today, now_s}
)lua";

// Gives back what a reservation holds. KEYS: rate hash, daily hash, slots sorted set, the
// reservation's record hash.
// ARGV: reservation id, tokens used ('' = leave the tokens), '1' = free the slot, a cancel mark
//       to leave ('' = none), record lifetime ms.
// The unused tokens go back to the bucket (one whose key expired is full already) and to the
// day's count (a past day's count is not touched), once: the record's fields go with them.
inline constexpr std::string_view close = R"lua(
if ARGV[2] ~= '' then
  local held = redis.call('HMGET', KEYS[4], 'bucket', 'daily', 'day')
  local used = tonumber(ARGV[2])
  if held[1] then
    local level = redis.call('HGET', KEYS[1], 'bucket')
    if level then
      redis.call('HSET', KEYS[1], 'bucket', string.format('%.17g', tonumber(level) + (tonumber(held[1]) - used)))
    end
  end
  if held[2] then
    local day = redis.call('HMGET', KEYS[2], 'day', 'tokens')
    if day[1] and tonumber(day[1]) == tonumber(held[3]) then
      redis.call('HSET', KEYS[2], 'tokens', math.max(tonumber(day[2]) - (tonumber(held[2]) - used), 0))
    end
  end
  redis.call('HDEL', KEYS[4], 'bucket', 'daily', 'day')
end
if ARGV[3] == '1' then redis.call('ZREM', KEYS[3], ARGV[1]) end
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[4], ARGV[4], 1)
  redis.call('PEXPIRE', KEYS[4], ARGV[5])
end
return 1
)lua";

// Renews the leases of slots still held. KEYS: slots sorted set.
// ARGV: now (3), lease ms, then the reservation ids. A slot already dropped stays dropped.
inline const std::string renew = std::string(clock_prelude) + R"lua(
local lease = tonumber(ARGV[4])
local deadline = math.floor(now_us / 1000) + lease
for i = 5, #ARGV do redis.call('ZADD', KEYS[1], 'XX', deadline, ARGV[i]) end
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('PEXPIRE', KEYS[1], lease) end
return 1
)lua";

}  // namespace edge::gateway::redis_scripts
