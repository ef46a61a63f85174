#include "edge/gateway/openai/grammar_compiler.h"

#include <boost/asio/associated_cancellation_slot.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <new>

#include "edge/common/format.h"
#include "edge/monitoring/gateway_metrics.h"

namespace edge::gateway {

namespace asio = boost::asio;
namespace grammar = backend::grammar;
using std::chrono::nanoseconds;

namespace {

// A refusal that a full queue gives: the queue drains a compile at a time, so a second is the
// soonest a retry may find room (and a retry that does not costs nothing).
constexpr std::chrono::milliseconds queue_retry_after = std::chrono::seconds(1);

// The longest a single charge may push a tenant's budget out: far beyond any compile the limits
// allow, and it keeps a clock's arithmetic far from overflowing.
constexpr double max_owed_ns = 24.0 * 3600.0 * 1e9;

std::chrono::milliseconds whole_ms_after(nanoseconds wait) {
  return std::chrono::ceil<std::chrono::milliseconds>(wait);
}

std::string_view reason_label(compile_failure::kind why) {
  switch (why) {
    case compile_failure::kind::tenant_queue: return "tenant_queue";
    case compile_failure::kind::tenant_budget: return "tenant_budget";
    case compile_failure::kind::server_queue: return "server_queue";
    case compile_failure::kind::shutting_down: return "shutting_down";
    case compile_failure::kind::grammar:
    case compile_failure::kind::cancelled: break;
  }
  return "other";
}

}  // namespace

std::string_view compile_failure::limit_name() const noexcept {
  switch (what_) {
    case kind::tenant_queue: return "grammar_compile_queue";
    case kind::tenant_budget: return "grammar_compile_seconds";
    case kind::grammar:
    case kind::server_queue:
    case kind::shutting_down:
    case kind::cancelled: break;
  }
  return {};
}

std::size_t default_grammar_compile_threads(unsigned hardware_threads) {
  return std::clamp<std::size_t>(hardware_threads / 4, 1, 4);
}

// ---- the budget -------------------------------------------------------------------------------

compile_budget::compile_budget(double seconds_per_minute, const time_source& clock)
    : seconds_per_minute_(seconds_per_minute), clock_(clock) {}

std::optional<nanoseconds> compile_budget::admit(const std::string& tenant) const {
  if (seconds_per_minute_ <= 0.0) return std::nullopt;
  const auto it = paid_until_.find(tenant);
  if (it == paid_until_.end()) return std::nullopt;
  const time_point now = clock_.monotonic_time();
  if (it->second - now <= window) return std::nullopt;
  return std::chrono::duration_cast<nanoseconds>(it->second - window - now);
}

void compile_budget::charge(const std::string& tenant, nanoseconds spent) {
  if (seconds_per_minute_ <= 0.0 || spent <= nanoseconds::zero()) return;
  const time_point now = clock_.monotonic_time();
  // Spending s seconds takes s × 60 / budget seconds of the clock to pay back.
  const double owed = std::min(static_cast<double>(spent.count()) * 60.0 / seconds_per_minute_, max_owed_ns);
  time_point& until = paid_until_[tenant];
  until = std::max(until, now) + std::chrono::duration_cast<time_point::duration>(nanoseconds(std::llround(owed)));
  if (paid_until_.size() >= 2 * std::max<std::size_t>(swept_size_, 64)) {
    std::erase_if(paid_until_, [now](const auto& entry) { return entry.second <= now; });
    swept_size_ = paid_until_.size();
  }
}

// ---- the compiler -----------------------------------------------------------------------------

struct grammar_compiler::waiter {
  // Resumes the request on its own executor; called once, by whoever takes the waiter out of its
  // job (under mutex_), or at once for a request that never joined one.
  std::function<void(answer)> resume;
  std::weak_ptr<job> of;  // guarded by mutex_: the compile it waits for, until it leaves it
};

struct grammar_compiler::job {
  std::string tenant;
  std::string key;
  std::shared_ptr<const grammar::grammar> g;
  std::chrono::steady_clock::time_point queued;
  // Guarded by mutex_.
  std::vector<std::shared_ptr<waiter>> waiters;
  bool begun = false;
};

grammar_compiler::grammar_compiler(const backend::tokenizer& tok, grammar_compiler_options options,
                                   monitoring::gateway_metrics* metrics, const time_source& clock)
    : tok_(tok),
      options_(options),
      metrics_(metrics),
      clock_(clock),
      budget_(options.compile_seconds_per_minute, clock),
      pool_(std::make_unique<thread_pool>(std::max<std::size_t>(options.threads, 1))) {}

grammar_compiler::~grammar_compiler() {
  std::vector<std::shared_ptr<waiter>> dropped;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    while (!turns_.empty()) {
      for (auto& w : retire(take_turn(false))) dropped.push_back(std::move(w));
    }
    publish_gauges();
  }
  const compile_failure closing(compile_failure::kind::shutting_down,
                                failed_precondition("the server is shutting down: the grammar was not compiled"));
  for (const auto& w : dropped) w->resume(answer(closing));
  pool_.reset();
}

std::string grammar_compiler::key_of(const std::string& tenant, const std::string& text) {
  std::string key = format("{}:", tenant.size());
  key += tenant;
  key += text;
  return key;
}

std::size_t grammar_compiler::cached() const {
  std::lock_guard lock(mutex_);
  return cache_.size();
}

std::int64_t grammar_compiler::cached_bytes() const {
  std::lock_guard lock(mutex_);
  return cache_bytes_;
}

std::size_t grammar_compiler::compiles_waiting() const {
  std::lock_guard lock(mutex_);
  return waiting_count_;
}

grammar_compiler::compiled grammar_compiler::lookup(const std::string& key) {
  std::lock_guard lock(mutex_);
  const auto it = cache_.find(key);
  if (it == cache_.end()) return nullptr;
  std::list<std::string>& order = cache_of_tenant_.at(it->second.tenant).order;
  order.splice(order.begin(), order, it->second.order);
  return it->second.value;
}

grammar_compiler::answer grammar_compiler::compile_now(const grammar::grammar& g) {
  // The pool task is a thread's root: an allocation that fails inside a compile ends that
  // compile, as an answer to its requests, not the job left unanswered.
  try {
    auto made = grammar::compile(g, vocabulary_);
    if (!made.ok()) return compile_failure(made.error());
    return std::move(made).value();
  } catch (const std::bad_alloc&) {
    return compile_failure(grammar::grammar_error("the grammar is too large to compile: out of memory", ""));
  }
}

std::shared_ptr<grammar_compiler::job> grammar_compiler::take_turn(bool begin) {
  auto turn = turns_.extract(turns_.begin());
  const std::string& tenant = turn.value().second;
  tenant_queue& queue = tenants_.at(tenant);
  std::shared_ptr<job> j = std::move(queue.waiting.front());
  queue.waiting.pop_front();
  --waiting_count_;
  if (begin) {
    j->begun = true;
    ++queue.running;
    queue.last_turn = ++served_;
  }
  if (!queue.waiting.empty()) {
    turn.value().first = queue.last_turn;
    turns_.insert(std::move(turn));
  }
  return j;
}

std::vector<std::shared_ptr<grammar_compiler::waiter>> grammar_compiler::retire(const std::shared_ptr<job>& j) {
  in_flight_.erase(j->key);
  --in_flight_count_;
  const auto queue = tenants_.find(j->tenant);
  if (j->begun) --queue->second.running;
  if (queue->second.running == 0 && queue->second.waiting.empty()) tenants_.erase(queue);
  std::vector<std::shared_ptr<waiter>> waiting = std::move(j->waiters);
  j->waiters.clear();
  for (const auto& w : waiting) w->of.reset();
  return waiting;
}

void grammar_compiler::run_next() {
  std::shared_ptr<job> j;
  std::vector<std::pair<std::shared_ptr<waiter>, compile_failure>> refused;
  std::vector<std::string> refused_tenants;
  {
    std::lock_guard lock(mutex_);
    while (!turns_.empty()) {
      const std::string tenant = turns_.begin()->second;
      // A tenant overdrawn since its compile was queued: refused now, before it costs anything.
      if (const auto wait = budget_.admit(tenant)) {
        const compile_failure failure(
            compile_failure::kind::tenant_budget,
            resource_exhausted(format("the tenant's grammar compile time ({} s per minute) is spent: try again in {} ms",
                                      options_.compile_seconds_per_minute, whole_ms_after(*wait).count())),
            whole_ms_after(*wait));
        for (auto& w : retire(take_turn(false))) {
          refused.emplace_back(std::move(w), failure);
          refused_tenants.push_back(tenant);  // one rejection per request, as when refused at once
        }
        continue;
      }
      j = take_turn(true);
      break;
    }
    publish_gauges();
  }
  for (const std::string& tenant : refused_tenants) count_rejection(tenant, compile_failure::kind::tenant_budget);
  for (auto& [w, failure] : refused) w->resume(answer(failure));
  if (j == nullptr) return;

  // Made once, by the first compile, and not charged to its tenant: the vocabulary is the server's.
  std::call_once(vocabulary_once_, [this] { vocabulary_ = grammar::token_vocabulary::create(tok_); });
  const auto started = std::chrono::steady_clock::now();
  if (metrics_ != nullptr) {
    metrics_->grammar_compile_wait_seconds.Observe(std::chrono::duration<double>(started - j->queued).count());
  }
  const answer made = compile_now(*j->g);
  finish(j, made, std::chrono::duration_cast<nanoseconds>(std::chrono::steady_clock::now() - started));
}

void grammar_compiler::finish(const std::shared_ptr<job>& j, const answer& made, nanoseconds spent) {
  std::vector<std::shared_ptr<waiter>> waiting;
  {
    std::lock_guard lock(mutex_);
    budget_.charge(j->tenant, spent);
    if (made.ok() && !stopping_) remember(j->tenant, j->key, *made);
    waiting = retire(j);
    publish_gauges();
  }
  if (metrics_ != nullptr) {
    const double seconds = std::chrono::duration<double>(spent).count();
    metrics_->grammar_compile_seconds.Observe(seconds);
    metrics_->tenant_grammar_compile_seconds.Add({{"tenant", metrics_->tenant_labels.label(j->tenant)}})
        .Increment(seconds);
  }
  for (const auto& w : waiting) w->resume(made);
}

void grammar_compiler::remember(const std::string& tenant, const std::string& key, compiled value) {
  const std::int64_t bytes =
      std::max<std::int64_t>(value->stats().memory_bytes, 0) + static_cast<std::int64_t>(key.size());
  if (bytes > options_.cache_bytes) return;  // larger than the whole cache: kept by its requests only
  while (cache_bytes_ + bytes > options_.cache_bytes) evict_one();
  tenant_cache& mine = cache_of_tenant_[tenant];
  tenants_by_bytes_.erase({mine.bytes, tenant});
  mine.order.push_front(key);
  mine.bytes += bytes;
  tenants_by_bytes_.insert({mine.bytes, tenant});
  cache_.emplace(key, cache_entry{.tenant = tenant, .value = std::move(value), .bytes = bytes, .order = mine.order.begin()});
  cache_bytes_ += bytes;
}

void grammar_compiler::evict_one() {
  // The tenant holding the most gives its least recently used grammar.
  const std::string tenant = std::prev(tenants_by_bytes_.end())->second;
  tenant_cache& theirs = cache_of_tenant_.at(tenant);
  tenants_by_bytes_.erase(std::prev(tenants_by_bytes_.end()));
  const auto entry = cache_.find(theirs.order.back());
  theirs.bytes -= entry->second.bytes;
  cache_bytes_ -= entry->second.bytes;
  theirs.order.pop_back();
  cache_.erase(entry);
  if (theirs.order.empty()) {
    cache_of_tenant_.erase(tenant);
  } else {
    tenants_by_bytes_.insert({theirs.bytes, tenant});
  }
}

void grammar_compiler::leave(const std::shared_ptr<waiter>& w) {
  bool dropped = false;
  {
    std::lock_guard lock(mutex_);
    const std::shared_ptr<job> j = w->of.lock();
    if (j == nullptr) return;  // answered already: its answer is on its way
    std::erase(j->waiters, w);
    w->of.reset();
    if (!j->begun && j->waiters.empty()) {
      tenant_queue& queue = tenants_.at(j->tenant);
      std::erase(queue.waiting, j);
      --waiting_count_;
      if (queue.waiting.empty()) turns_.erase({queue.last_turn, j->tenant});
      retire(j);
      publish_gauges();
      dropped = true;
    }
  }
  if (dropped && metrics_ != nullptr) metrics_->grammar_compiles_dropped.Increment();
  w->resume(answer(compile_failure(compile_failure::kind::cancelled,
                                   status(status_code::cancelled, "the request stopped waiting for its grammar"))));
}

void grammar_compiler::count_rejection(const std::string& tenant, compile_failure::kind why) {
  if (metrics_ == nullptr) return;
  metrics_->grammar_compile_rejections
      .Add({{"tenant", metrics_->tenant_labels.label(tenant)}, {"reason", std::string(reason_label(why))}})
      .Increment();
}

void grammar_compiler::publish_gauges() {
  if (metrics_ == nullptr) return;
  metrics_->grammar_compiles_waiting.Set(static_cast<double>(waiting_count_));
  metrics_->grammar_cache_bytes.Set(static_cast<double>(cache_bytes_));
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

asio::awaitable<grammar_compiler::answer> grammar_compiler::compile(std::string tenant,
                                                                    std::shared_ptr<const grammar::grammar> g) {
  const std::string key = key_of(tenant, g->text());
  if (compiled hit = lookup(key)) {
    if (metrics_ != nullptr) metrics_->grammar_cache_hits.Increment();
    co_return answer(std::move(hit));
  }
  enum class role { joined, compiles, refused } taken = role::compiles;
  std::optional<compile_failure> refusal;
  answer out = co_await asio::async_initiate<const asio::use_awaitable_t<>&, void(answer)>(
      [this, &g, &key, &tenant, &taken, &refusal](auto resume) {
        // Resumes the request on its own executor, with its own copy of the answer.
        auto handler = std::make_shared<decltype(resume)>(std::move(resume));
        auto w = std::make_shared<waiter>();
        w->resume = [handler](answer made) {
          const auto executor = asio::get_associated_executor(*handler);
          asio::post(executor, [handler, made = std::move(made)]() mutable {
            asio::get_associated_cancellation_slot(*handler).clear();
            std::move(*handler)(std::move(made));
          });
        };
        // Installed before the waiter can be answered: a cancellation comes on this executor too.
        if (auto slot = asio::get_associated_cancellation_slot(*handler); slot.is_connected()) {
          slot.assign([this, weak = std::weak_ptr<waiter>(w)](asio::cancellation_type) {
            if (const auto still = weak.lock()) leave(still);
          });
        }
        compiled found;
        {
          std::lock_guard lock(mutex_);
          const auto queue = tenants_.find(tenant);
          const std::size_t tenant_in_flight =
              queue == tenants_.end() ? 0 : queue->second.waiting.size() + queue->second.running;
          if (stopping_) {
            refusal.emplace(compile_failure::kind::shutting_down,
                            failed_precondition("the server is shutting down: the grammar was not compiled"));
          } else if (const auto cached = cache_.find(key); cached != cache_.end()) {  // finished since the lookup
            taken = role::joined;
            found = cached->second.value;
          } else if (const auto it = in_flight_.find(key); it != in_flight_.end()) {
            taken = role::joined;
            it->second->waiters.push_back(w);
            w->of = it->second;
          } else if (const auto wait = budget_.admit(tenant)) {
            refusal.emplace(compile_failure::kind::tenant_budget,
                            resource_exhausted(format("the tenant's grammar compile time ({} s per minute) is spent: "
                                                      "try again in {} ms",
                                                      options_.compile_seconds_per_minute,
                                                      whole_ms_after(*wait).count())),
                            whole_ms_after(*wait));
          } else if (tenant_in_flight >= options_.max_queued_per_tenant) {
            refusal.emplace(compile_failure::kind::tenant_queue,
                            resource_exhausted(format("the tenant has {} grammars waiting to be compiled: try again "
                                                      "shortly",
                                                      tenant_in_flight)),
                            queue_retry_after);
          } else if (in_flight_count_ >= options_.max_queued) {
            refusal.emplace(compile_failure::kind::server_queue,
                            resource_exhausted(format("{} grammars are waiting to be compiled: try again shortly",
                                                      in_flight_count_)),
                            queue_retry_after);
          } else {
            auto j = std::make_shared<job>();
            j->tenant = tenant;
            j->key = key;
            j->g = g;
            j->queued = std::chrono::steady_clock::now();
            j->waiters.push_back(w);
            w->of = j;
            in_flight_.emplace(key, j);
            tenant_queue& mine = tenants_[tenant];
            if (mine.waiting.empty()) turns_.insert({mine.last_turn, tenant});
            mine.waiting.push_back(std::move(j));
            ++in_flight_count_;
            ++waiting_count_;
            publish_gauges();
          }
        }
        if (refusal) {
          taken = role::refused;
          w->resume(answer(*refusal));
        } else if (found != nullptr) {
          w->resume(answer(std::move(found)));
        } else if (taken == role::compiles) {
          // One worker task per compile queued; each runs whichever compile's turn it is then.
          pool_->submit([this] { run_next(); });
        }
      },
      asio::use_awaitable);
  if (metrics_ != nullptr) {
    if (taken == role::joined) {
      metrics_->grammar_cache_hits.Increment();
    } else if (taken == role::compiles) {
      metrics_->grammar_cache_misses.Increment();
    }
  }
  if (refusal) count_rejection(tenant, refusal->what());
  co_return out;
}

asio::awaitable<std::optional<grammar_compiler::answer>> grammar_compiler::compile_unless(
    std::string tenant, std::shared_ptr<const grammar::grammar> g, asio::awaitable<void> gone) {
  using namespace asio::experimental::awaitable_operators;
  std::optional<answer> out;
  const auto which = co_await (compile_into(out, std::move(tenant), std::move(g)) || std::move(gone));
  if (which.index() == 1) co_return std::nullopt;
  co_return out;
}

asio::awaitable<void> grammar_compiler::compile_into(std::optional<answer>& out, std::string tenant,
                                                     std::shared_ptr<const grammar::grammar> g) {
  answer made = co_await compile(std::move(tenant), std::move(g));
  out.emplace(std::move(made));
}

#pragma GCC diagnostic pop

}  // namespace edge::gateway
