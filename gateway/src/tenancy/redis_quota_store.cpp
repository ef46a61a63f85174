#include "edge/gateway/tenancy/redis_quota_store.h"

#include <boost/url/parse.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <vector>

#include "edge/common/format.h"
#include "edge/common/log.h"
#include "edge/monitoring/gateway_metrics.h"
#include "quota_rules.h"
#include "redis_client.h"
#include "redis_quota_scripts.h"

namespace edge::gateway {
namespace {

using namespace std::chrono_literals;

// How long a client refused because the store is down should wait: about the reconnect backoff.
constexpr std::chrono::milliseconds unavailable_retry_after = 1s;
// The rate hash means nothing a minute after its last write (the GCRA arrival time is then past
// and the bucket full again); one more second covers the rounding of the two clocks.
constexpr std::chrono::milliseconds rate_key_lifetime = 61s;
// A reservation's record outlives the UTC day it was last written in, and so any refund of it
// that could still matter, and any late call it must stop.
constexpr std::chrono::milliseconds record_lifetime = 25h;
// Queued calls: the first attempt, and the most time between two.
constexpr std::chrono::milliseconds first_retry = 50ms;
constexpr std::chrono::milliseconds max_retry = 1s;
// Queued calls sent in one pipeline at most.
constexpr std::size_t max_batch = 256;
// The marks a compensation leaves in a record (redis_quota_scripts.h).
constexpr std::string_view cancel_admit = "cancel_admit";
constexpr std::string_view cancel_reserve = "cancel_reserve";
constexpr std::int64_t max_port = 65535;

const logger& log() {
  static const logger instance{"quota"};
  return instance;
}

std::optional<std::int64_t> to_integer(std::string_view text) {
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// What the admit and reserve scripts say of the reservation (their answer's first element).
enum class script_outcome : std::int64_t { refused = 0, admitted = 1, seen_before = 2 };

// A script's answer: an array whose elements are of the kinds `shape` spells ('i' integer,
// 's' string).
status check_answer(const redis_reply& reply, std::string_view shape) {
  if (reply.is_error()) return internal_error(format("the quota script failed: {}", reply.text));
  if (reply.type != redis_reply::kind::array || reply.elements.size() != shape.size()) {
    return internal_error("the quota script answered in an unexpected shape");
  }
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const auto expected = shape[i] == 's' ? redis_reply::kind::string : redis_reply::kind::integer;
    if (reply.elements[i].type != expected) {
      return internal_error(format("the quota script's answer {} has an unexpected type", i));
    }
  }
  return {};
}

// Redis answers some calls with an error that says "not now", not "never": still loading its
// data after a restart (LOADING), a script past its time limit (BUSY), a replica cut off from
// its master or made read-only by a failover (MASTERDOWN, READONLY), a cluster slot moving
// (TRYAGAIN). The call did not run; it is an outage like a refused connection, so what must
// land is queued and retried, and admission follows the fail mode.
status not_ready(const redis_reply& reply) {
  for (const std::string_view code : {"LOADING", "BUSY", "MASTERDOWN", "READONLY", "TRYAGAIN"}) {
    const std::string_view text = reply.text;
    if (reply.is_error(code) && (text.size() == code.size() || text[code.size()] == ' ')) {
      return unavailable(format("Redis is not ready: {}", reply.text));
    }
  }
  return {};
}

struct admit_answer {
  script_outcome outcome = script_outcome::refused;
  quota_rules::admit_counters seen;
};

// {outcome, backlog, in_flight}
result<admit_answer> read_admit_answer(const redis_reply& reply) {
  EDGE_RETURN_IF_ERROR(check_answer(reply, "iii"));
  const auto& e = reply.elements;
  return admit_answer{static_cast<script_outcome>(e[0].integer), {.backlog_ns = e[1].integer, .in_flight = e[2].integer}};
}

struct reserve_answer {
  script_outcome outcome = script_outcome::refused;
  quota_rules::reserve_counters seen;
  std::int64_t today = 0;
  unix_time now_s = 0;
};

// {outcome, bucket, day_tokens, today, now_s, month_tokens}
result<reserve_answer> read_reserve_answer(const redis_reply& reply) {
  EDGE_RETURN_IF_ERROR(check_answer(reply, "isiiii"));
  const auto& e = reply.elements;
  reserve_answer out;
  out.outcome = static_cast<script_outcome>(e[0].integer);
  const std::string& bucket = e[1].text;
  if (std::from_chars(bucket.data(), bucket.data() + bucket.size(), out.seen.bucket).ec != std::errc()) {
    return internal_error(format("the quota script's bucket level \"{}\" is not a number", bucket));
  }
  out.seen.day_tokens = e[2].integer;
  out.today = e[3].integer;
  out.now_s = e[4].integer;
  out.seen.month_tokens = e[5].integer;
  return out;
}

}  // namespace

std::string_view to_string(quota_fail_mode mode) { return mode == quota_fail_mode::open ? "open" : "closed"; }

std::string redis_address::to_string() const { return format("redis://{}:{}/{}", host, port, db); }

result<redis_address> parse_redis_url(std::string_view url) {
  const auto bad = [&](std::string_view why) {
    return invalid_argument(format("invalid Redis URL \"{}\": {}; expected redis://HOST[:PORT][/DB]", url, why));
  };
  auto parsed = boost::urls::parse_uri(url);
  if (!parsed) return bad("not a URL");
  const boost::urls::url_view& u = *parsed;
  if (u.scheme() != "redis") return bad(format("the scheme is \"{}\", not redis", std::string(u.scheme())));
  if (u.has_userinfo()) return bad("a user or password is not supported");
  if (u.has_query() || u.has_fragment()) return bad("a query or fragment is not supported");
  redis_address out;
  out.host = std::string(u.host_address());
  if (out.host.empty()) return bad("the host is missing");
  if (u.has_port()) {
    const auto port = to_integer(std::string(u.port()));
    if (!port || *port < 1 || *port > max_port) return bad("the port must be a number from 1 to 65535");
    out.port = static_cast<std::uint16_t>(*port);
  }
  std::string path(u.path());
  if (!path.empty() && path != "/") {
    const auto db = to_integer(std::string_view(path).substr(1));
    if (path.front() != '/' || !db || *db < 0) return bad("the database must be a number, as in /0");
    out.db = *db;
  }
  return out;
}


redis_quota_store::redis_quota_store(redis_quota_options options, monitoring::gateway_metrics* metrics)
    : options_(std::move(options)),
      metrics_(metrics),
      redis_(std::make_unique<redis_client>(redis_client_options{.host = options_.address.host,
                                                                 .port = options_.address.port,
                                                                 .db = options_.address.db,
                                                                 .connect_timeout = options_.connect_timeout,
                                                                 .command_timeout = options_.command_timeout,
                                                                 .max_connections = options_.max_connections})),
      admit_script_{redis_scripts::admit, {}},
      reserve_script_{redis_scripts::reserve, {}},
      close_script_{redis_scripts::close, {}},
      renew_script_{redis_scripts::renew, {}} {
  if (metrics_ != nullptr) metrics_->quota_store_up.Set(1);
}

std::unique_ptr<redis_quota_store> redis_quota_store::create(redis_quota_options options,
                                                             monitoring::gateway_metrics* metrics) {
  std::unique_ptr<redis_quota_store> store(new redis_quota_store(std::move(options), metrics));
  const redis_quota_options& o = store->options_;
  // One round trip: is Redis there, and the scripts are in its cache.
  std::array<script*, 4> scripts{&store->admit_script_, &store->reserve_script_, &store->close_script_,
                                 &store->renew_script_};
  std::vector<redis_command> loads;
  for (const script* s : scripts) loads.push_back({"SCRIPT", "LOAD", std::string(s->body)});
  auto loaded = store->redis_->pipeline(loads);
  status outcome = loaded.ok() ? status() : loaded.error();
  if (loaded.ok()) {
    for (std::size_t i = 0; i < scripts.size(); ++i) {
      if ((*loaded)[i].is_error()) outcome = internal_error(format("SCRIPT LOAD: {}", (*loaded)[i].text));
      else scripts[i]->sha = (*loaded)[i].text;
    }
  }
  if (outcome.ok()) {
    log().info("quota store {}: counters shared in Redis (fail mode {}, timeouts {} ms to connect, {} ms per command, "
               "{} connections at most, concurrency slots leased for {} s)",
               o.address.to_string(), to_string(o.fail_mode), o.connect_timeout.count(), o.command_timeout.count(),
               o.max_connections, std::chrono::duration_cast<std::chrono::seconds>(o.slot_lease).count());
  } else {
    store->failed("connect", outcome);
  }
  store->background_ = std::thread([s = store.get()] { s->background_loop(); });
  return store;
}

redis_quota_store::~redis_quota_store() {
  {
    std::lock_guard lock(background_mutex_);
    stopping_ = true;
  }
  background_wakeup_.notify_all();
  if (background_.joinable()) background_.join();
}

std::string redis_quota_store::key(std::string_view tenant_id, std::string_view part) const {
  return format("{}{{{}}}:{}", options_.key_prefix, tenant_id, part);
}

std::string redis_quota_store::record_key(std::string_view tenant_id, std::string_view id) const {
  return format("{}{{{}}}:reservation:{}", options_.key_prefix, tenant_id, id);
}

std::vector<std::string> redis_quota_store::script_keys(std::string_view tenant_id, std::optional<quota_phase> phase,
                                                        std::string_view id) const {
  std::vector<std::string> out;
  for (const std::string_view part : redis_scripts::counter_keys(phase)) out.push_back(key(tenant_id, part));
  out.push_back(record_key(tenant_id, id));
  return out;
}

std::vector<std::string> redis_quota_store::now_arguments() const {
  if (options_.clock == nullptr) return {"", "0", "0"};
  const std::int64_t ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(options_.clock->monotonic_time().time_since_epoch()).count();
  const std::int64_t us = ns >= 0 ? ns / 1000 : -((-ns + 999) / 1000);  // rounded down
  return {std::to_string(us), std::to_string(ns - us * 1000),
          std::to_string(to_unix_seconds(options_.clock->system_time()))};
}

result<std::vector<redis_reply>> redis_quota_store::eval(script& s, const std::vector<std::vector<std::string>>& calls,
                                                         std::size_t keys_per_call) {
  std::string sha;
  {
    std::lock_guard lock(scripts_mutex_);
    sha = s.sha;
  }
  if (sha.empty()) {
    EDGE_ASSIGN_OR_RETURN(const redis_reply loaded, redis_->command({"SCRIPT", "LOAD", std::string(s.body)}));
    if (loaded.is_error()) return internal_error(format("SCRIPT LOAD: {}", loaded.text));
    sha = loaded.text;
    std::lock_guard lock(scripts_mutex_);
    s.sha = sha;
  }
  const auto evalsha = [&](const std::vector<std::string>& call) {
    redis_command command{"EVALSHA", sha, std::to_string(keys_per_call)};
    command.insert(command.end(), call.begin(), call.end());
    return command;
  };
  std::vector<redis_command> commands;
  commands.reserve(calls.size());
  for (const auto& call : calls) commands.push_back(evalsha(call));
  EDGE_ASSIGN_OR_RETURN(auto replies, redis_->pipeline(commands));

  // Redis lost its script cache (restarted, SCRIPT FLUSH, a failover): load the script and send
  // the calls that missed it again, in one round trip. Only those: the others have run.
  std::vector<std::size_t> missed;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    if (replies[i].is_error("NOSCRIPT")) missed.push_back(i);
  }
  if (!missed.empty()) {
    std::vector<redis_command> again{{"SCRIPT", "LOAD", std::string(s.body)}};
    for (const std::size_t i : missed) again.push_back(evalsha(calls[i]));
    EDGE_ASSIGN_OR_RETURN(auto retried, redis_->pipeline(again));
    if (const status busy = not_ready(retried[0]); !busy.ok()) return busy;
    if (retried[0].is_error()) return internal_error(format("SCRIPT LOAD: {}", retried[0].text));
    for (std::size_t j = 0; j < missed.size(); ++j) replies[missed[j]] = std::move(retried[j + 1]);
  }
  for (const redis_reply& reply : replies) {
    if (status busy = not_ready(reply); !busy.ok()) return busy;
  }
  return replies;
}

quota_decision redis_quota_store::try_admit(const admit_request& request) {
  const tenant_quotas& q = request.quotas;
  if (!uses_counters(q, quota_phase::admission)) return quota_rules::judge_admit(request, {});  // nothing to count
  const std::string tenant(request.tenant_id);
  const std::string id(request.reservation_id);
  const auto unavailable = [&] { return unavailable_decision(quota_rules::judge_admit(request, {}), {tenant, id}); };
  if (id.empty()) {
    failed("acquire", internal_error(format("a request of tenant '{}' came without a reservation id", tenant)));
    return unavailable();
  }

  std::vector<std::string> call = script_keys(tenant, quota_phase::admission, id);
  const std::size_t keys = call.size();
  for (std::string& now : now_arguments()) call.push_back(std::move(now));
  // The script's own arguments (redis_scripts::admit_arguments of them), then the limits.
  call.push_back(id);
  call.push_back(std::to_string(options_.slot_lease.count()));
  call.push_back(std::to_string(rate_key_lifetime.count()));
  for (const quota_kind* kind : redis_scripts::counted_kinds(quota_phase::admission)) {
    call.push_back(std::to_string(kind->of(q).value_or(0)));
  }
  // What a call that did run took and nobody holds, it gives back (and a late one takes nothing).
  const auto undo = [&] { enqueue({true, close_call(tenant, id, "", true, cancel_admit)}); };

  auto replies = eval(admit_script_, {call}, keys);
  if (!replies.ok()) {
    failed("acquire", replies.error());
    if (quota_rules::holds_slot(q) && may_have_run(replies.error())) undo();
    return unavailable();
  }
  const result<admit_answer> answer = read_admit_answer((*replies)[0]);
  if (!answer.ok()) {
    failed("acquire", answer.error());
    return unavailable();
  }
  if (answer->outcome == script_outcome::seen_before) {
    failed("acquire", internal_error(format("reservation id '{}' of tenant '{}' was used before", id, tenant)));
    return unavailable();
  }
  succeeded();
  quota_decision d = quota_rules::judge_admit(request, answer->seen);
  if (d.allowed != (answer->outcome == script_outcome::admitted)) {
    // The script and the rules are written to agree; if they ever do not, the request is
    // treated as if the store were down, and what the script took is given back.
    failed("acquire", internal_error(format("the admit script {} a request the rules {} (tenant '{}')",
                                            d.allowed ? "refused" : "admitted", d.allowed ? "admit" : "refuse",
                                            tenant)));
    if (!d.allowed && quota_rules::holds_slot(q)) undo();
    return unavailable();
  }
  if (d.allowed && d.reservation.holds_slot) {
    std::lock_guard lock(background_mutex_);
    held_slots_[tenant].insert(id);
  }
  return d;
}

quota_decision redis_quota_store::try_reserve(const quota_reservation& held, const quota_request& request) {
  const tenant_quotas& q = request.quotas;
  if (!uses_counters(q, quota_phase::reservation)) {
    return quota_rules::judge_reserve(held, request, {}, 0, 0);  // at most the per-request limits, which count nothing
  }
  const auto unavailable = [&] {
    // What no counter could ever admit (a request over the per-request limits, more than a
    // whole minute's tokens or day's budget) is refused as usual: judged against counters that
    // allow the rest.
    const quota_rules::reserve_counters idle = quota_rules::idle_reserve_counters(q);
    const unix_time now_s = to_unix_seconds((options_.clock != nullptr ? *options_.clock : process_time()).system_time());
    return unavailable_decision(quota_rules::judge_reserve(held, request, idle, quota_rules::utc_day(now_s), now_s),
                                held);
  };
  if (held.id.empty()) {
    failed("acquire", internal_error(format("a request of tenant '{}' came without a reservation id", held.tenant_id)));
    return unavailable();
  }
  // A request over the per-request limits is refused whatever the counters say; they are only
  // read, for the headers.
  const bool take = quota_rules::within_request_limits(request);

  std::vector<std::string> call = script_keys(held.tenant_id, quota_phase::reservation, held.id);
  const std::size_t keys = call.size();
  for (std::string& now : now_arguments()) call.push_back(std::move(now));
  // The script's own arguments (redis_scripts::reserve_arguments of them), then the limits.
  call.push_back(std::to_string(request.cost()));
  call.push_back(take ? "1" : "0");
  call.push_back(std::to_string(rate_key_lifetime.count()));
  call.push_back(std::to_string(record_lifetime.count()));
  for (const quota_kind* kind : redis_scripts::counted_kinds(quota_phase::reservation)) {
    call.push_back(std::to_string(kind->of(q).value_or(0)));
  }
  const auto undo = [&] { enqueue({true, close_call(held.tenant_id, held.id, "0", false, cancel_reserve)}); };

  auto replies = eval(reserve_script_, {call}, keys);
  if (!replies.ok()) {
    failed("acquire", replies.error());
    if (take && may_have_run(replies.error())) undo();
    return unavailable();
  }
  const result<reserve_answer> answer = read_reserve_answer((*replies)[0]);
  if (!answer.ok()) {
    failed("acquire", answer.error());
    return unavailable();
  }
  if (answer->outcome == script_outcome::seen_before) {
    failed("acquire", internal_error(format("reservation id '{}' of tenant '{}' reserved tokens before", held.id,
                                            held.tenant_id)));
    return unavailable();
  }
  succeeded();
  quota_decision d = quota_rules::judge_reserve(held, request, answer->seen, answer->today, answer->now_s);
  if (d.allowed != (answer->outcome == script_outcome::admitted)) {
    failed("acquire", internal_error(format("the reserve script {} a request the rules {} (tenant '{}')",
                                            d.allowed ? "refused" : "admitted", d.allowed ? "admit" : "refuse",
                                            held.tenant_id)));
    if (!d.allowed) undo();
    return unavailable();
  }
  return d;
}

quota_decision redis_quota_store::unavailable_decision(quota_decision idle, quota_reservation uncounted) const {
  // Without the store there is nothing true to say in x-ratelimit-* headers.
  idle.requests.reset();
  idle.tokens.reset();
  if (!idle.allowed) return idle;
  if (options_.fail_mode == quota_fail_mode::open) {
    // Admitted and counted nowhere: the reservation takes nothing more, so settle and release
    // have nothing more to give back.
    quota_decision admitted;
    admitted.allowed = true;
    admitted.reservation = std::move(uncounted);
    return admitted;
  }
  quota_decision refused;
  refused.allowed = false;
  refused.limit = quota_limit::quota_store_unavailable;
  refused.retry_after = unavailable_retry_after;
  refused.message = format("Quotas cannot be checked right now: the quota store is unavailable, so requests of tenant "
                           "'{}' are refused until it is back. Please try again in {}.",
                           uncounted.tenant_id, format_reset_duration(unavailable_retry_after));
  return refused;
}

std::vector<std::string> redis_quota_store::close_call(std::string_view tenant_id, std::string_view id,
                                                       std::string used_tokens, bool release_slot,
                                                       std::string_view cancel) const {
  std::vector<std::string> call = script_keys(tenant_id, std::nullopt, id);
  call.push_back(std::string(id));
  call.push_back(std::move(used_tokens));
  call.push_back(release_slot ? "1" : "0");
  call.push_back(std::string(cancel));
  call.push_back(std::to_string(record_lifetime.count()));
  return call;
}

void redis_quota_store::close_now(std::string_view operation, std::vector<std::string> call) {
  auto replies = eval(close_script_, {call}, redis_scripts::close_keys);
  if (!replies.ok()) {
    failed(operation, replies.error());
    enqueue({false, std::move(call)});
    return;
  }
  // An error reply would be the same the next time: nothing to retry.
  if ((*replies)[0].is_error()) return failed(operation, internal_error((*replies)[0].text));
  succeeded();
}

void redis_quota_store::forget_slot(const quota_reservation& reservation) {
  // No longer renewed, whether or not the release that follows gets through: at worst it lapses.
  std::lock_guard lock(background_mutex_);
  if (auto it = held_slots_.find(reservation.tenant_id); it != held_slots_.end()) {
    it->second.erase(reservation.id);
    if (it->second.empty()) held_slots_.erase(it);
  }
}

void redis_quota_store::settle(const quota_reservation& reservation, std::int64_t used_tokens) {
  if (!reservation.holds_tokens()) return;
  close_now("settle", close_call(reservation.tenant_id, reservation.id, std::to_string(used_tokens), false, ""));
}

void redis_quota_store::release(const quota_reservation& reservation) {
  if (!reservation.holds_slot) return;
  forget_slot(reservation);
  close_now("release", close_call(reservation.tenant_id, reservation.id, "", true, ""));
}

void redis_quota_store::finish(const quota_reservation& reservation, std::int64_t used_tokens) {
  const bool refund = reservation.holds_tokens();
  if (!refund && !reservation.holds_slot) return;
  if (reservation.holds_slot) forget_slot(reservation);
  close_now("finish", close_call(reservation.tenant_id, reservation.id, refund ? std::to_string(used_tokens) : "",
                                 reservation.holds_slot, ""));
}

void redis_quota_store::enqueue(pending_call call) {
  std::unique_lock lock(background_mutex_);
  if (pending_.size() >= options_.max_pending) {
    if (metrics_ != nullptr) metrics_->quota_store_dropped.Increment();
    if (dropped_++ == 0) {
      lock.unlock();
      log().error("quota store {}: {} calls are queued until Redis answers, the most kept; more are dropped "
                  "(edgeinfer_quota_store_dropped_total; a slot so dropped lapses with its lease)",
                  options_.address.to_string(), options_.max_pending);
    }
    return;
  }
  const bool first = pending_.empty();
  if (first) {
    pending_since_ = process_time().monotonic_time();
    applied_ = compensated_ = dropped_ = 0;
    retry_backoff_ = first_retry;
    retry_at_ = pending_since_ + first_retry;
  }
  const bool compensation = call.compensation;
  pending_.push_back(std::move(call));
  if (metrics_ != nullptr) metrics_->quota_store_pending.Set(static_cast<double>(pending_.size()));
  lock.unlock();
  background_wakeup_.notify_all();
  if (first) {
    log().warn("quota store {}: {} queued, with any that follow, until Redis answers (edgeinfer_quota_store_pending)",
               options_.address.to_string(),
               compensation ? "undoing a call that got no answer is" : "a settlement that failed is");
  }
}

std::size_t redis_quota_store::pending() const {
  std::lock_guard lock(background_mutex_);
  return pending_.size();
}

bool redis_quota_store::apply_pending() {
  // The batch stays at the front of the queue until it is applied (calls only join at the
  // back, and only this thread takes them off), so pending() counts it while it is sent.
  std::vector<pending_call> batch;
  {
    std::lock_guard lock(background_mutex_);
    const std::size_t n = std::min(pending_.size(), max_batch);
    batch.assign(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(n));
  }
  if (batch.empty()) return false;
  std::vector<std::vector<std::string>> calls;
  calls.reserve(batch.size());
  for (const pending_call& p : batch) calls.push_back(p.call);
  // Every close can be repeated harmlessly, so a batch that may have run goes again whole.
  auto replies = eval(close_script_, calls, redis_scripts::close_keys);

  std::unique_lock lock(background_mutex_);
  if (!replies.ok()) {
    retry_backoff_ = std::min(retry_backoff_ * 2, max_retry);
    retry_at_ = process_time().monotonic_time() + retry_backoff_;
    lock.unlock();
    failed("retry", replies.error());
    return false;
  }
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(batch.size()));
  std::size_t errors = 0;
  std::string first_error;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    if (!(*replies)[i].is_error()) {
      ++applied_;
      if (batch[i].compensation) ++compensated_;
    } else if (errors++ == 0) {
      first_error = (*replies)[i].text;
    }
  }
  retry_backoff_ = first_retry;
  retry_at_ = process_time().monotonic_time();
  if (metrics_ != nullptr) metrics_->quota_store_pending.Set(static_cast<double>(pending_.size()));
  const bool drained = pending_.empty();
  const double seconds = std::chrono::duration<double>(process_time().monotonic_time() - pending_since_).count();
  const std::int64_t applied = applied_, compensated = compensated_, dropped = dropped_;
  lock.unlock();
  succeeded();
  if (errors > 0) {
    log().error("quota store {}: {} queued calls were refused by Redis and dropped ({})", options_.address.to_string(),
                errors, first_error);
  }
  if (drained) {
    log().info("quota store {}: {} queued calls applied ({} undoing calls that got no answer), {} dropped, {:.1f} s "
               "after the first was queued",
               options_.address.to_string(), applied, compensated, dropped, seconds);
  }
  return true;
}

void redis_quota_store::renew_slots() {
  std::vector<std::vector<std::string>> calls;
  {
    std::lock_guard lock(background_mutex_);
    for (const auto& [tenant, slots] : held_slots_) {
      std::vector<std::string> call{key(tenant, redis_scripts::slots_key)};
      for (std::string& now : now_arguments()) call.push_back(std::move(now));
      call.push_back(std::to_string(options_.slot_lease.count()));
      call.insert(call.end(), slots.begin(), slots.end());
      calls.push_back(std::move(call));
    }
  }
  if (calls.empty()) return;
  auto replies = eval(renew_script_, calls, 1);  // one pipeline for every tenant
  if (!replies.ok()) return failed("renew", replies.error());
  for (const redis_reply& reply : *replies) {
    if (reply.is_error()) return failed("renew", internal_error(reply.text));
  }
  succeeded();
}

void redis_quota_store::background_loop() {
  const auto period = std::max<std::chrono::milliseconds>(options_.slot_lease / 3, 1ms);
  std::unique_lock lock(background_mutex_);
  auto next_renewal = process_time().monotonic_time() + period;
  while (!stopping_) {
    const auto wake = pending_.empty() ? next_renewal : std::min(next_renewal, retry_at_);
    background_wakeup_.wait_until(lock, wake);
    if (stopping_) break;
    const auto now = process_time().monotonic_time();
    if (!pending_.empty() && now >= retry_at_) {
      lock.unlock();
      apply_pending();
      lock.lock();
    }
    if (now >= next_renewal) {
      next_renewal = now + period;
      if (held_slots_.empty()) continue;
      lock.unlock();
      renew_slots();
      lock.lock();
    }
  }
  // Stopping: what is still queued gets one more chance, as long as Redis takes it.
  lock.unlock();
  while (apply_pending()) {}
}

void redis_quota_store::succeeded() {
  if (up_.load(std::memory_order_acquire)) return;
  {
    std::lock_guard lock(state_mutex_);
    if (up_.load(std::memory_order_relaxed)) return;
    up_.store(true, std::memory_order_release);
    if (metrics_ != nullptr) metrics_->quota_store_up.Set(1);
    const double seconds = std::chrono::duration<double>(process_time().monotonic_time() - down_since_).count();
    log().info("quota store {} is back up after {:.1f} s ({} calls failed meanwhile); counting again",
               options_.address.to_string(), seconds, failures_while_down_);
  }
  // Redis answers again: what is queued goes now rather than after the retry backoff.
  {
    std::lock_guard lock(background_mutex_);
    retry_at_ = process_time().monotonic_time();
  }
  background_wakeup_.notify_all();
}

void redis_quota_store::failed(std::string_view operation, const status& why) {
  if (metrics_ != nullptr) metrics_->quota_store_errors.Add({{"operation", std::string(operation)}}).Increment();
  std::lock_guard lock(state_mutex_);
  if (!up_.load(std::memory_order_relaxed)) {
    ++failures_while_down_;
    return;
  }
  up_.store(false, std::memory_order_release);
  down_since_ = process_time().monotonic_time();
  failures_while_down_ = 1;
  if (metrics_ != nullptr) metrics_->quota_store_up.Set(0);
  log().error("quota store {} is down ({}: {}); until it is back, requests are {}", options_.address.to_string(),
              operation, why.message(),
              options_.fail_mode == quota_fail_mode::open
                  ? "admitted without being counted (--quota-fail-mode open)"
                  : "refused with 503 (--quota-fail-mode closed)");
}

}  // namespace edge::gateway
