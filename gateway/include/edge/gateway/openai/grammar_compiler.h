// Where a request's grammar is compiled for the model's tokenizer: on a small pool of its own,
// so that neither an HTTP thread nor the engine thread ever spends the compile's time (the
// awaiting coroutine resumes on its own executor).
//
// Shared by every tenant, so built so that no tenant's compiles cost another anything:
//   * Fair: each tenant has its own queue, and a free worker takes the next compile of the
//     tenant served least recently, so a tenant's compile waits behind at most one compile of
//     each other tenant (plus those already running), however many another tenant queued.
//   * Bounded: a tenant may have max_queued_per_tenant compiles waiting or running (past it a new
//     grammar is refused, 429), all tenants together max_queued (503, a safety net).
//   * Paid for: each tenant's compile time (measured on the worker's steady clock, the shared
//     vocabulary's one-time build left out) is charged to a budget of compile seconds per minute
//     (compile_budget, which refills by the injected clock); a tenant past it is refused new
//     grammars (429 with when to come back) while the grammars it has cached still serve, and its
//     compile time is a metric.
//   * Scoped: the cache of compiled grammars and the compiles in flight that later requests of
//     the same grammar wait for are per tenant (keyed by tenant and the grammar's canonical text,
//     as the prefix cache is salted per tenant), so a request's timing says nothing of what
//     another tenant asked for.
//   * Bounded in bytes: the cache holds compiled grammars up to cache_bytes of their
//     memory_bytes; to make room it drops the least recently used grammar of the tenant holding
//     the most, so a tenant holding no more than any other keeps its grammars. A grammar larger
//     than the whole cache is not kept.
//   * Cheap to leave: a request whose client left before its compile began stops waiting, and a
//     compile nobody waits for any more is dropped before it starts (compile_unless).
//
// `edgeinfer serve` compiles here before it submits; `edgeinfer backend` compiles what a split
// gateway sent (the gateway itself never compiles: the grammar's text travels to the backend).
#pragma once

#include <boost/asio/awaitable.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "edge/backend/grammar/compiled_grammar.h"
#include "edge/common/thread_pool.h"
#include "edge/common/time_source.h"

namespace edge::monitoring {
struct gateway_metrics;
}

namespace edge::gateway {

struct grammar_compiler_options {
  std::size_t threads = 1;                     // compiles at once (default_grammar_compile_threads)
  std::int64_t cache_bytes = std::int64_t{1} << 30;  // compiled grammars kept, by their memory_bytes
  // Compiles waiting or running, all tenants (503 past it): a safety net for memory (a waiting
  // compile holds its grammar), eight tenants at their bound.
  std::size_t max_queued = 256;
  // Compiles waiting or running of one tenant (429 past it): room for an agent's burst of
  // parallel requests, each with its own tools; the turns keep it from delaying other tenants.
  std::size_t max_queued_per_tenant = 32;
  // Compile seconds each tenant may spend per minute, in bursts of up to a minute's worth; 0: no
  // limit.
  double compile_seconds_per_minute = 0.0;
};

// The workers a server gives compiles on a machine of `hardware_threads` (0: unknown): a quarter
// of them, from 1 to 4. A compile is one thread's CPU work, and the CPU engine's pool and the HTTP
// threads already take a thread per core, so compiles get a share that a burst of them cannot
// take from decoding; a GPU host's idle cores run up to 4 at once. More would not make a queue
// fairer (one free worker is what a waiting tenant needs) and each running compile holds its
// working memory.
std::size_t default_grammar_compile_threads(unsigned hardware_threads);

// Why a request got no compiled grammar.
class compile_failure : public status {
 public:
  enum class kind {
    grammar,        // the grammar's own fault (invalid_argument; path() names the piece)
    tenant_queue,   // the tenant has max_queued_per_tenant compiles waiting or running
    tenant_budget,  // the tenant spent its compile seconds for now
    server_queue,   // max_queued compiles are waiting or running, all tenants together
    shutting_down,  // the compiler is being destroyed: queued compiles are dropped
    cancelled,      // the request stopped waiting (its client left)
  };

  compile_failure() = default;
  explicit compile_failure(const backend::grammar::grammar_error& e) : status(e), path_(e.path()) {}
  compile_failure(kind what, status why, std::chrono::milliseconds retry_after = std::chrono::milliseconds(0))
      : status(std::move(why)), what_(what), retry_after_(retry_after) {}

  kind what() const noexcept { return what_; }
  const std::string& path() const noexcept { return path_; }
  // For the refusals that waiting can cure: how long (at least until then nothing would change).
  std::chrono::milliseconds retry_after() const noexcept { return retry_after_; }
  // The tenant's limit that refused it, as an error's type ("grammar_compile_queue",
  // "grammar_compile_seconds"); empty for the other kinds.
  std::string_view limit_name() const noexcept;

 private:
  kind what_ = kind::grammar;
  std::string path_;
  std::chrono::milliseconds retry_after_{0};
};

// A budget of compile seconds per minute for each tenant: spending is charged after the fact
// (a compile's cost is known once it ends) and may overdraw; a tenant is refused while it is
// overdrawn, until the budget has refilled to zero. GCRA over the injected monotonic clock: each
// tenant's `paid_until` moves forward by charged seconds × 60 / budget; the tenant may spend while
// paid_until is at most one minute ahead (so a minute's worth in a burst after a quiet minute).
// Not thread-safe: its owner's mutex guards it.
class compile_budget {
 public:
  // `seconds_per_minute` 0: no limit (admit() always passes, charge() keeps nothing).
  compile_budget(double seconds_per_minute, const time_source& clock);

  // Nothing when `tenant` may start a compile now; else how long until it may.
  std::optional<std::chrono::nanoseconds> admit(const std::string& tenant) const;
  void charge(const std::string& tenant, std::chrono::nanoseconds spent);

  std::size_t tracked() const { return paid_until_.size(); }

 private:
  using time_point = std::chrono::steady_clock::time_point;
  static constexpr std::chrono::nanoseconds window = std::chrono::minutes(1);

  double seconds_per_minute_;
  const time_source& clock_;
  // Tenants whose paid_until is ahead of now (an entry at or behind now means what no entry does:
  // nothing owed); swept when the map doubles.
  std::unordered_map<std::string, time_point> paid_until_;
  std::size_t swept_size_ = 0;
};

class grammar_compiler {
 public:
  // `tok`, `clock` (and `metrics`, when not null) must outlive the compiler.
  grammar_compiler(const backend::tokenizer& tok, grammar_compiler_options options,
                   monitoring::gateway_metrics* metrics, const time_source& clock);
  // Answers the requests whose compiles have not begun (shutting_down), then waits for the
  // compiles running (their requests resume on executors that must still run).
  ~grammar_compiler();

  using compiled = std::shared_ptr<const backend::grammar::compiled_grammar>;
  using answer = result<compiled, compile_failure>;

  // The grammar compiled for `tenant`: from its cache, from its compile of the same text in
  // flight, or made now off this thread, once its turn comes. Failures: compile_failure's kinds
  // but cancelled (the grammar's own, the tenant's or the server's limits, shutting down).
  // Cancellable through the awaiting coroutine's cancellation slot (terminal, partial or total):
  // the request stops waiting (cancelled), and the compile is dropped if it had not begun and
  // nobody else waits for it.
  boost::asio::awaitable<answer> compile(std::string tenant, std::shared_ptr<const backend::grammar::grammar> g);

  // compile(), unless `gone` completes first (the request's client left; exchange's
  // watch_disconnect): then nothing, and the compile as compile() says when cancelled.
  boost::asio::awaitable<std::optional<answer>> compile_unless(std::string tenant,
                                                               std::shared_ptr<const backend::grammar::grammar> g,
                                                               boost::asio::awaitable<void> gone);

  std::size_t cached() const;               // compiled grammars kept
  std::int64_t cached_bytes() const;        // their memory_bytes, together
  std::size_t compiles_waiting() const;     // compiles queued, not begun

 private:
  struct waiter;  // one request waiting for a compile
  struct job;     // one compile, waiting or running, and the requests waiting for it
  struct tenant_queue {
    std::deque<std::shared_ptr<job>> waiting;  // not begun, in arrival order
    std::size_t running = 0;
    std::uint64_t last_turn = 0;  // served_ when its last compile began; 0: not since it was idle
  };
  struct cache_entry {
    std::string tenant;
    compiled value;
    std::int64_t bytes = 0;
    std::list<std::string>::iterator order;  // in its tenant's order
  };
  struct tenant_cache {
    std::list<std::string> order;  // keys, most recently used first
    std::int64_t bytes = 0;
  };

  // The cache key: the tenant, then the grammar's text (the tenant's length first, so that no two
  // pairs make one key).
  static std::string key_of(const std::string& tenant, const std::string& text);

  answer compile_now(const backend::grammar::grammar& g);
  compiled lookup(const std::string& key);  // a hit moves to the front of its tenant's order
  // Under mutex_, with a tenant's turn due: takes that tenant's next compile out of its queue. Begun,
  // the tenant's next turn comes after every tenant now waiting; not begun (refused), it stays.
  std::shared_ptr<job> take_turn(bool begin);
  // Runs the next compile by turn on the calling pool worker (none when nothing waits).
  void run_next();
  // Ends a compile: caches its grammar, charges its time and resumes everyone waiting for it.
  void finish(const std::shared_ptr<job>& j, const answer& made, std::chrono::nanoseconds spent);
  // Under mutex_: the job leaves in_flight_ and its tenant's counts; its waiters are returned.
  std::vector<std::shared_ptr<waiter>> retire(const std::shared_ptr<job>& j);
  void remember(const std::string& tenant, const std::string& key, compiled value);  // mutex_ held
  void evict_one();                                                                 // mutex_ held
  // The request of `w` stopped waiting: it is answered cancelled, and its compile dropped when it
  // had not begun and nobody else waits for it. On the request's executor; mutex_ not held.
  void leave(const std::shared_ptr<waiter>& w);
  boost::asio::awaitable<void> compile_into(std::optional<answer>& out, std::string tenant,
                                            std::shared_ptr<const backend::grammar::grammar> g);
  void count_rejection(const std::string& tenant, compile_failure::kind why);
  void publish_gauges();  // mutex_ held

  const backend::tokenizer& tok_;
  const grammar_compiler_options options_;
  monitoring::gateway_metrics* metrics_;
  const time_source& clock_;
  std::once_flag vocabulary_once_;
  std::shared_ptr<const backend::grammar::token_vocabulary> vocabulary_;  // made by the first compile, then read-only

  mutable std::mutex mutex_;
  // Everything below is guarded by mutex_.
  //
  // The cache: by key, the entry; per tenant, its keys most recently used first and the bytes
  // they hold; the tenants by bytes held (the largest gives room first).
  std::unordered_map<std::string, cache_entry> cache_;
  std::unordered_map<std::string, tenant_cache> cache_of_tenant_;
  std::set<std::pair<std::int64_t, std::string>> tenants_by_bytes_;
  std::int64_t cache_bytes_ = 0;
  // Compiles waiting or running, by key, with the requests waiting for each.
  std::unordered_map<std::string, std::shared_ptr<job>> in_flight_;
  // Tenants with compiles waiting or running; and, of those with compiles waiting, the order of
  // their turns: by when each was last served (0: not since it was idle), then by name.
  std::unordered_map<std::string, tenant_queue> tenants_;
  std::set<std::pair<std::uint64_t, std::string>> turns_;
  std::uint64_t served_ = 0;       // compiles begun: the last one's turn number
  std::size_t in_flight_count_ = 0;  // compiles waiting or running, all tenants
  std::size_t waiting_count_ = 0;    // of which not begun
  compile_budget budget_;
  bool stopping_ = false;

  std::unique_ptr<thread_pool> pool_;  // declared last, destroyed first: compiles running finish while the rest exists
};

}  // namespace edge::gateway
