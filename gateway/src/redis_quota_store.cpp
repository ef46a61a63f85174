#include "edge/gateway/redis_quota_store.h"

#include <boost/url/parse.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <random>
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
constexpr std::int64_t max_port = 65535;

const logger& log() {
  static const logger instance{"quota"};
  return instance;
}

std::string random_instance_id() {
  std::random_device device;
  std::uint64_t value = (static_cast<std::uint64_t>(device()) << 32) | device();
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, value >>= 4) out[static_cast<std::size_t>(i)] = "0123456789abcdef"[value & 0xf];
  return out;
}

std::optional<std::int64_t> to_integer(std::string_view text) {
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// The acquire script's answer: {admitted, backlog, bucket, in_flight, day_tokens, today, now_s}.
struct acquire_answer {
  bool admitted = false;
  quota_rules::counters seen;
  std::int64_t today = 0;
  unix_time now_s = 0;
};

result<acquire_answer> read_acquire_answer(const redis_reply& reply) {
  if (reply.is_error()) return internal_error(format("the quota script failed: {}", reply.text));
  constexpr std::size_t fields = 7;
  if (reply.type != redis_reply::kind::array || reply.elements.size() != fields) {
    return internal_error("the quota script answered in an unexpected shape");
  }
  const auto& e = reply.elements;
  for (std::size_t i = 0; i < fields; ++i) {
    const auto expected = i == 2 ? redis_reply::kind::string : redis_reply::kind::integer;
    if (e[i].type != expected) return internal_error(format("the quota script's answer {} has an unexpected type", i));
  }
  acquire_answer out;
  out.admitted = e[0].integer == 1;
  out.seen.backlog_ns = e[1].integer;
  const std::string& bucket = e[2].text;
  if (std::from_chars(bucket.data(), bucket.data() + bucket.size(), out.seen.bucket).ec != std::errc()) {
    return internal_error(format("the quota script's bucket level \"{}\" is not a number", bucket));
  }
  out.seen.in_flight = e[3].integer;
  out.seen.day_tokens = e[4].integer;
  out.today = e[5].integer;
  out.now_s = e[6].integer;
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
      acquire_script_{redis_scripts::acquire, {}},
      settle_script_{redis_scripts::settle, {}},
      renew_script_{redis_scripts::renew, {}},
      instance_(random_instance_id()) {
  if (metrics_ != nullptr) metrics_->quota_store_up.Set(1);
}

std::unique_ptr<redis_quota_store> redis_quota_store::create(redis_quota_options options,
                                                             monitoring::gateway_metrics* metrics) {
  std::unique_ptr<redis_quota_store> store(new redis_quota_store(std::move(options), metrics));
  const redis_quota_options& o = store->options_;
  // One round trip: is Redis there, and the scripts are in its cache.
  std::array<script*, 3> scripts{&store->acquire_script_, &store->settle_script_, &store->renew_script_};
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
  store->renewer_ = std::thread([s = store.get()] { s->renew_loop(); });
  return store;
}

redis_quota_store::~redis_quota_store() {
  {
    std::lock_guard lock(slots_mutex_);
    stopping_ = true;
  }
  renew_wakeup_.notify_all();
  if (renewer_.joinable()) renewer_.join();
}

std::string redis_quota_store::key(std::string_view tenant_id, std::string_view part) const {
  return format("{}{{{}}}:{}", options_.key_prefix, tenant_id, part);
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
                                                         std::size_t keys_per_call,
                                                         const std::vector<std::vector<std::string>>& also) {
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
  commands.insert(commands.end(), also.begin(), also.end());
  EDGE_ASSIGN_OR_RETURN(auto replies, redis_->pipeline(commands));

  // Redis lost its script cache (restarted, SCRIPT FLUSH, a failover): load the script and send
  // the calls that missed it again, in one round trip. Only those: the others have run.
  std::vector<std::size_t> missed;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    if (replies[i].is_error("NOSCRIPT")) missed.push_back(i);
  }
  if (missed.empty()) return replies;
  std::vector<redis_command> again{{"SCRIPT", "LOAD", std::string(s.body)}};
  for (const std::size_t i : missed) again.push_back(evalsha(calls[i]));
  EDGE_ASSIGN_OR_RETURN(auto retried, redis_->pipeline(again));
  if (retried[0].is_error()) return internal_error(format("SCRIPT LOAD: {}", retried[0].text));
  for (std::size_t j = 0; j < missed.size(); ++j) replies[missed[j]] = std::move(retried[j + 1]);
  return replies;
}

quota_decision redis_quota_store::try_acquire(const quota_request& request) {
  const tenant_quotas& q = request.quotas;
  if (!q.requests_per_minute && !q.tokens_per_minute && !q.max_concurrent && !q.daily_tokens) {
    return quota_rules::judge(request, {}, 0, 0);  // at most max_tokens_per_request, which counts nothing
  }
  const bool within_request_limit = !q.max_tokens_per_request || request.max_tokens <= *q.max_tokens_per_request;
  const std::string slot_id = q.max_concurrent ? format("{}:{}", instance_, next_slot_.fetch_add(1)) : std::string();

  std::vector<std::string> call{key(request.tenant_id, "rate"), key(request.tenant_id, "slots"),
                                key(request.tenant_id, "daily")};
  for (std::string& now : now_arguments()) call.push_back(std::move(now));
  for (const auto& limit : {q.requests_per_minute, q.tokens_per_minute, q.max_concurrent, q.daily_tokens}) {
    call.push_back(std::to_string(limit.value_or(0)));
  }
  call.push_back(std::to_string(request.cost()));
  // A request over max_tokens_per_request is refused whatever the counters say; they are only
  // read, for the headers.
  call.push_back(within_request_limit ? "1" : "0");
  call.push_back(slot_id);
  call.push_back(std::to_string(options_.slot_lease.count()));
  call.push_back(std::to_string(rate_key_lifetime.count()));

  auto replies = eval(acquire_script_, {call}, 3);
  result<acquire_answer> answer = replies.ok() ? read_acquire_answer((*replies)[0]) : result<acquire_answer>(replies.error());
  if (!answer.ok()) {
    failed("acquire", answer.error());
    return unavailable_decision(request);
  }
  succeeded();
  quota_decision d = quota_rules::judge(request, answer->seen, answer->today, answer->now_s);
  if (d.allowed != answer->admitted) {
    // The script and the rules are written to agree; if they ever do not, the request is
    // treated as if the store were down rather than holding a reservation Redis did not take.
    failed("acquire", internal_error(format("the quota script {} a request the rules {} (tenant '{}')",
                                            answer->admitted ? "admitted" : "refused",
                                            d.allowed ? "admit" : "refuse", request.tenant_id)));
    return unavailable_decision(request);
  }
  if (d.allowed && d.reservation.holds_slot) {
    d.reservation.slot_id = slot_id;
    std::lock_guard lock(slots_mutex_);
    held_slots_[d.reservation.tenant_id].insert(slot_id);
  }
  return d;
}

quota_decision redis_quota_store::unavailable_decision(const quota_request& request) {
  const tenant_quotas& q = request.quotas;
  // What no counter could ever admit (max_tokens_per_request, more than a whole minute's
  // tokens or day's budget) is refused as usual: judged against counters that allow the rest.
  quota_rules::counters idle;
  if (q.tokens_per_minute) idle.bucket = static_cast<double>(*q.tokens_per_minute);
  const unix_time now_s = to_unix_seconds(std::chrono::system_clock::now());
  quota_decision d = quota_rules::judge(request, idle, quota_rules::utc_day(now_s), now_s);
  // Without the store there is nothing true to say in x-ratelimit-* headers.
  d.requests.reset();
  d.tokens.reset();
  if (!d.allowed) return d;
  if (options_.fail_mode == quota_fail_mode::open) {
    // Admitted and counted nowhere: the reservation takes nothing, so settle and release have
    // nothing to give back.
    quota_decision admitted;
    admitted.allowed = true;
    admitted.reservation.tenant_id = std::string(request.tenant_id);
    return admitted;
  }
  quota_decision refused;
  refused.allowed = false;
  refused.limit = quota_limit::quota_store_unavailable;
  refused.retry_after = unavailable_retry_after;
  refused.message = format("Quotas cannot be checked right now: the quota store is unavailable, so requests of tenant "
                           "'{}' are refused until it is back. Please try again in {}.",
                           request.tenant_id, format_reset_duration(unavailable_retry_after));
  return refused;
}

std::vector<std::string> redis_quota_store::settle_call(const quota_reservation& reservation,
                                                        std::int64_t used_tokens) const {
  return {key(reservation.tenant_id, "rate"), key(reservation.tenant_id, "daily"),
          reservation.bucket_tokens > 0 ? std::to_string(reservation.bucket_tokens - used_tokens) : std::string(),
          reservation.daily_tokens > 0 ? std::to_string(reservation.daily_tokens - used_tokens) : std::string(),
          std::to_string(reservation.day)};
}

void redis_quota_store::forget_slot(const quota_reservation& reservation) {
  // No longer renewed, whether or not the ZREM that follows gets through: at worst it lapses.
  std::lock_guard lock(slots_mutex_);
  if (auto it = held_slots_.find(reservation.tenant_id); it != held_slots_.end()) {
    it->second.erase(reservation.slot_id);
    if (it->second.empty()) held_slots_.erase(it);
  }
}

void redis_quota_store::settle(const quota_reservation& reservation, std::int64_t used_tokens) {
  if (reservation.bucket_tokens <= 0 && reservation.daily_tokens <= 0) return;
  auto replies = eval(settle_script_, {settle_call(reservation, used_tokens)}, 2);
  if (!replies.ok()) return failed("settle", replies.error());
  if ((*replies)[0].is_error()) return failed("settle", internal_error((*replies)[0].text));
  succeeded();
}

void redis_quota_store::release(const quota_reservation& reservation) {
  if (!reservation.holds_slot || reservation.slot_id.empty()) return;
  forget_slot(reservation);
  auto reply = redis_->command({"ZREM", key(reservation.tenant_id, "slots"), reservation.slot_id});
  if (!reply.ok()) return failed("release", reply.error());
  if (reply->is_error()) return failed("release", internal_error(reply->text));
  succeeded();
}

void redis_quota_store::finish(const quota_reservation& reservation, std::int64_t used_tokens) {
  const bool refund = reservation.bucket_tokens > 0 || reservation.daily_tokens > 0;
  const bool slot = reservation.holds_slot && !reservation.slot_id.empty();
  if (!refund || !slot) {  // one command or none: nothing to pipeline
    settle(reservation, used_tokens);
    release(reservation);
    return;
  }
  forget_slot(reservation);
  auto replies = eval(settle_script_, {settle_call(reservation, used_tokens)}, 2,
                      {{"ZREM", key(reservation.tenant_id, "slots"), reservation.slot_id}});
  if (!replies.ok()) return failed("finish", replies.error());
  for (const redis_reply& reply : *replies) {
    if (reply.is_error()) return failed("finish", internal_error(reply.text));
  }
  succeeded();
}

void redis_quota_store::renew_slots() {
  std::vector<std::vector<std::string>> calls;
  {
    std::lock_guard lock(slots_mutex_);
    for (const auto& [tenant, slots] : held_slots_) {
      std::vector<std::string> call{key(tenant, "slots"), now_arguments()[0], std::to_string(options_.slot_lease.count())};
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

void redis_quota_store::renew_loop() {
  const auto period = std::max<std::chrono::milliseconds>(options_.slot_lease / 3, 1ms);
  std::unique_lock lock(slots_mutex_);
  while (!stopping_) {
    if (renew_wakeup_.wait_for(lock, period, [this] { return stopping_; })) break;
    if (held_slots_.empty()) continue;
    lock.unlock();
    renew_slots();
    lock.lock();
  }
}

void redis_quota_store::succeeded() {
  if (up_.load(std::memory_order_acquire)) return;
  std::lock_guard lock(state_mutex_);
  if (up_.load(std::memory_order_relaxed)) return;
  up_.store(true, std::memory_order_release);
  if (metrics_ != nullptr) metrics_->quota_store_up.Set(1);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - down_since_).count();
  log().info("quota store {} is back up after {:.1f} s ({} calls failed meanwhile); counting again",
             options_.address.to_string(), seconds, failures_while_down_);
}

void redis_quota_store::failed(std::string_view operation, const status& why) {
  if (metrics_ != nullptr) metrics_->quota_store_errors.Add({{"operation", std::string(operation)}}).Increment();
  std::lock_guard lock(state_mutex_);
  if (!up_.load(std::memory_order_relaxed)) {
    ++failures_while_down_;
    return;
  }
  up_.store(false, std::memory_order_release);
  down_since_ = std::chrono::steady_clock::now();
  failures_while_down_ = 1;
  if (metrics_ != nullptr) metrics_->quota_store_up.Set(0);
  log().error("quota store {} is down ({}: {}); until it is back, requests are {}", options_.address.to_string(),
              operation, why.message(),
              options_.fail_mode == quota_fail_mode::open
                  ? "admitted without being counted (--quota-fail-mode open)"
                  : "refused with 503 (--quota-fail-mode closed)");
}

}  // namespace edge::gateway
