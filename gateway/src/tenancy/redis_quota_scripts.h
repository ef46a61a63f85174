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
// Keys and limits are bound to Lua locals by a prelude made from quota_kinds (bind_keys,
// bind_limits): the counter key of each kind as <redis_key>_key ("rate_key", "slots_key",
// "daily_key") and each kind's limit as its lua_limit ("rpm", "concurrent", "tpm", "daily"), in
// the order the store passes them. The scripts spell what each counter means in Lua.
//
// Reservations are records, so that every call can be repeated, or arrive late, harmlessly:
// a request's slot among those in flight is the member named by its reservation id in the
// slots set, and the tokens it reserved are the fields bucket / daily / day of its own hash.
// close gives back what the record holds and deletes it (a second close finds nothing); its
// cancel marks (cancel_admit, cancel_reserve) stop an admit or reserve that a gateway gave up
// on from taking anything if it runs after all.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "edge/gateway/tenancy/quota_kinds.h"

namespace edge::gateway::redis_scripts {

// The kinds whose limits a phase's script is given: those of the phase that keep counters, in
// the order of quota_kinds.
inline std::vector<const quota_kind*> counted_kinds(quota_phase phase) {
  std::vector<const quota_kind*> out;
  for (const quota_kind& kind : quota_kinds) {
    if (kind.phase == phase && kind.counted()) out.push_back(&kind);
  }
  return out;
}

// The counter keys (suffixes of `<prefix>{tenant}:`) a script is given: each counted kind's of
// `phase` (of every phase when absent), each key once, in the order of quota_kinds. The
// reservation's record key follows them.
inline std::vector<std::string_view> counter_keys(std::optional<quota_phase> phase) {
  std::vector<std::string_view> out;
  for (const quota_kind& kind : quota_kinds) {
    if (!kind.counted() || (phase && kind.phase != *phase)) continue;
    bool known = false;
    for (const std::string_view key : out) known = known || key == kind.redis_key;
    if (!known) out.push_back(kind.redis_key);
  }
  return out;
}

// "local rate_key, slots_key, record_key = KEYS[1], KEYS[2], KEYS[3]": counter_keys(phase),
// then the record.
inline std::string bind_keys(std::optional<quota_phase> phase) {
  std::string names;
  std::string values;
  std::size_t n = 0;
  const auto bind = [&](std::string_view name) {
    const std::string_view separator = n == 0 ? "" : ", ";
    ++n;
    names += std::string(separator) + std::string(name) + "_key";
    values += std::string(separator) + "KEYS[" + std::to_string(n) + "]";
  };
  for (const std::string_view key : counter_keys(phase)) bind(key);
  bind("record");
  return "local " + names + " = " + values + "\n";
}

// "local rpm, concurrent = tonumber(ARGV[7]), tonumber(ARGV[8])": the limits of
// counted_kinds(phase) after the script's `fixed_arguments` own (0 = unlimited).
inline std::string bind_limits(quota_phase phase, std::size_t fixed_arguments) {
  std::string names;
  std::string values;
  std::size_t n = fixed_arguments;
  for (const quota_kind* kind : counted_kinds(phase)) {
    const std::string_view separator = names.empty() ? "" : ", ";
    ++n;
    names += std::string(separator) + std::string(kind->lua_limit);
    values += std::string(separator) + "tonumber(ARGV[" + std::to_string(n) + "])";
  }
  return names.empty() ? "" : "local " + names + " = " + values + "\n";
}

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

// Phase 1. KEYS: bind_keys(admission): the rate hash, the slots sorted set, the reservation's
// record hash.
// ARGV: now (3), reservation id, slot lease ms, rate key lifetime ms, then the limits
//       (bind_limits: requests/min, max concurrent; 0 = unlimited each).
// Returns {1 admitted / 0 refused / 2 the id was seen before (nothing taken), GCRA backlog ns,
//          slots in use}: the counters as they read before this request, for
//          quota_rules::judge_admit to explain.
inline constexpr std::size_t admit_arguments = 6;
inline const std::string admit = std::string(clock_prelude) + bind_keys(quota_phase::admission) +
                                 bind_limits(quota_phase::admission, admit_arguments) + R"lua(
local id, lease = ARGV[4], tonumber(ARGV[5])
if redis.call('HEXISTS', record_key, 'cancel_admit') == 1 or (concurrent > 0 and redis.call('ZSCORE', slots_key, id)) then
  return {2, 0, 0}
end
local ok = true

-- Requests per minute (GCRA): the backlog is how far the theoretical arrival time is ahead.
local backlog, interval = 0, 0
if rpm > 0 then
  interval = math.max(math.floor(window / rpm), 1)
  local tat = redis.call('HMGET', rate_key, 'tat_us', 'tat_ns')
  if tat[1] then backlog = math.max(-since(tonumber(tat[1]), tonumber(tat[2])), 0) end
  if backlog + interval > window then ok = false end
end

-- Max concurrent: slots whose lease ran out belong to a gateway that stopped renewing them.
local in_flight = 0
local now_ms = math.floor(now_us / 1000)
if concurrent > 0 then
  redis.call('ZREMRANGEBYSCORE', slots_key, '-inf', now_ms)
  in_flight = redis.call('ZCARD', slots_key)
  if in_flight >= concurrent then ok = false end
end

if ok then
  if rpm > 0 then
    local ahead = now_ns + backlog + interval
    redis.call('HSET', rate_key, 'tat_us', now_us + math.floor(ahead / 1000), 'tat_ns', ahead % 1000)
    redis.call('PEXPIRE', rate_key, ARGV[6])
  end
  if concurrent > 0 then
    redis.call('ZADD', slots_key, now_ms + lease, id)
    redis.call('PEXPIRE', slots_key, lease)
  end
end
return {ok and 1 or 0, backlog, in_flight}
)lua";

// Phase 2. KEYS: bind_keys(reservation): the rate hash, the daily hash, the monthly hash, the
// reservation's record hash.
// ARGV: now (3), cost, take ('1' = take it if every limit allows, '0' = only read), rate key
//       lifetime ms, record lifetime ms, then the limits (bind_limits: tokens/min, daily tokens,
//       monthly tokens; 0 = unlimited each).
// Returns {1 admitted / 0 refused / 2 the id was seen before (nothing taken), bucket level
//          (%.17g), tokens of today, today (UTC day number), now_s, tokens of this month}: the
//          counters as they read before this request, for quota_rules::judge_reserve to explain.
// The month is the UTC calendar month, as months since 1970-01 (quota_rules::utc_month).
inline constexpr std::size_t reserve_arguments = 7;
inline const std::string reserve = std::string(clock_prelude) + bind_keys(quota_phase::reservation) +
                                   bind_limits(quota_phase::reservation, reserve_arguments) + R"lua(
local cost = tonumber(ARGV[4])
local ok = ARGV[5] == '1'
if ok then
  local seen = redis.call('HMGET', record_key, 'cancel_reserve', 'day')
  if seen[1] or seen[2] then return {2, '0', 0, 0, now_s} end
end

-- Tokens per minute: the bucket, refilled up to now (full when the key is absent).
local level, at_us, at_ns = 0, now_us, now_ns
if tpm > 0 then
  local rate = redis.call('HMGET', rate_key, 'bucket', 'at_us', 'at_ns')
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
  local day = redis.call('HMGET', daily_key, 'day', 'tokens')
  if tonumber(day[1]) == today then day_tokens = tonumber(day[2]) end
  if day_tokens + cost > daily then ok = false end
end

-- Monthly budget of the UTC calendar month (the civil date of the day number).
local this_month = 0
local month_tokens = 0
if monthly > 0 then
  local z = today + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  this_month = (y - 1970) * 12 + (m - 1)
  local month = redis.call('HMGET', monthly_key, 'month', 'tokens')
  if tonumber(month[1]) == this_month then month_tokens = tonumber(month[2]) end
  if month_tokens + cost > monthly then ok = false end
end

-- The refill is kept whether or not the request is admitted (as in memory).
if tpm > 0 then
  local after = level
  if ok then after = level - cost end
  redis.call('HSET', rate_key, 'bucket', string.format('%.17g', after), 'at_us', at_us, 'at_ns', at_ns)
  redis.call('PEXPIRE', rate_key, ARGV[6])
end
if ok then
  local record = {'day', today}
  if tpm > 0 then
    table.insert(record, 'bucket')
    table.insert(record, cost)
  end
  if daily > 0 then
    redis.call('HSET', daily_key, 'day', today, 'tokens', day_tokens + cost)
    redis.call('PEXPIRE', daily_key, ((today + 1) * 86400 - now_s + 60) * 1000)
    table.insert(record, 'daily')
    table.insert(record, cost)
  end
  if monthly > 0 then
    redis.call('HSET', monthly_key, 'month', this_month, 'tokens', month_tokens + cost)
    redis.call('PEXPIRE', monthly_key, 32 * 86400 * 1000)
    table.insert(record, 'monthly')
    table.insert(record, cost)
    table.insert(record, 'month')
    table.insert(record, this_month)
  end
  redis.call('HSET', record_key, unpack(record))
  redis.call('PEXPIRE', record_key, ARGV[7])
end
return {ok and 1 or 0, string.format('%.17g', level), day_tokens, today, now_s, month_tokens}
)lua";

// Gives back what a reservation holds. KEYS: bind_keys(every phase): the rate hash, the slots
// sorted set, the daily hash, the monthly hash, the reservation's record hash.
// ARGV: reservation id, tokens used ('' = leave the tokens), '1' = free the slot, a cancel mark
//       to leave ('' = none), record lifetime ms.
// The unused tokens go back to the bucket (one whose key expired is full already) and to the
// day's and the month's counts (a past day's or month's count is not touched), once: the
// record's fields go with them.
inline const std::size_t close_keys = counter_keys(std::nullopt).size() + 1;
inline const std::string close = bind_keys(std::nullopt) + R"lua(
if ARGV[2] ~= '' then
  local held = redis.call('HMGET', record_key, 'bucket', 'daily', 'day', 'monthly', 'month')
  local used = tonumber(ARGV[2])
  if held[1] then
    local level = redis.call('HGET', rate_key, 'bucket')
    if level then
      redis.call('HSET', rate_key, 'bucket', string.format('%.17g', tonumber(level) + (tonumber(held[1]) - used)))
    end
  end
  if held[2] then
    local day = redis.call('HMGET', daily_key, 'day', 'tokens')
    if day[1] and tonumber(day[1]) == tonumber(held[3]) then
      redis.call('HSET', daily_key, 'tokens', math.max(tonumber(day[2]) - (tonumber(held[2]) - used), 0))
    end
  end
  if held[4] then
    local month = redis.call('HMGET', monthly_key, 'month', 'tokens')
    if month[1] and tonumber(month[1]) == tonumber(held[5]) then
      redis.call('HSET', monthly_key, 'tokens', math.max(tonumber(month[2]) - (tonumber(held[4]) - used), 0))
    end
  end
  redis.call('HDEL', record_key, 'bucket', 'daily', 'day', 'monthly', 'month')
end
if ARGV[3] == '1' then redis.call('ZREM', slots_key, ARGV[1]) end
if ARGV[4] ~= '' then
  redis.call('HSET', record_key, ARGV[4], 1)
  redis.call('PEXPIRE', record_key, ARGV[5])
end
return 1
)lua";

// The key of the slots sorted set, which renew is given (the redis_key of the requests in
// flight in quota_kinds).
inline constexpr std::string_view slots_key = "slots";

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
