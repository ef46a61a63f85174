// Which backend a split gateway sends a request to: the routing policy alone, with no sockets,
// so that it is tested with injected load reports and a manual clock.
//
// Each backend has
//   * a health state (its /readyz, and whether it serves the gateway's model),
//   * the latest load report (its /internal/v1/load, polled),
//   * the gateway's own count of requests it sent there and that have not ended, which moves
//     at once (a report is up to a poll interval old),
//   * a run of consecutive failures (refused connection, error before the first event, 5xx);
//     `eject_after_failures` of them eject the backend for a backoff that doubles with each
//     ejection in a row (capped), after which it is tried again.
//
// The score of a backend (lower is better) estimates how long a new request would wait there:
//
//   requests = running + waiting (as reported) + requests sent since the report
//   score    = requests + waiting_weight × waiting + kv_weight × kv usage
//
// so a queue counts double (its requests cannot even start) and a full KV cache counts as
// kv_weight more requests (new work will queue or preempt). Equal scores rotate, so idle
// backends share the load.
//
// Prefix affinity: a request whose prompt holds at least one full KV block has an affinity key,
// the backend's own prefix-cache hash (tenant salt, then the first `affinity_blocks` full blocks
// of tokens; kv_block_pool.h). The backend that last served a key is remembered (a bounded LRU
// map) and chosen again unless it is unavailable or its score exceeds the best one by more than
// `affinity_slack` (overloaded). A key seen for the first time goes to its rendezvous-hash
// backend under the same slack rule, so that several gateways place a new prefix on the same
// backend without talking to each other.
//
// Session affinity: a request that names a session (x-session-affinity, prompt_cache_key) goes
// by its session, never by its prefix or the score. Its key is the tenant's id and the session
// string hashed together (session_route_key), so equal strings of two tenants are unrelated
// keys. The backends are ranked by rendezvous weight for the key, and the request takes the
// first whose load, counting this request, is within
//
//   capacity = ceil((1 + session_load_epsilon) × (total load + 1) / available backends)
//
// (consistent hashing with bounded loads, Mirrokni, Thorup and Zadimoghaddam, 2018). Some
// backend always qualifies (they cannot all be above the average), a hot session spills over
// to the next backend in its own ranking instead of overloading the first, a backend that
// leaves or returns moves only the sessions ranked first there, and gateways that see the same
// backends rank them alike without talking. The load is the gateway's own count of requests
// outstanding on the backend, not the score: it is exact and moves at once (reports are up to
// a poll old, and a session should not hop with them, losing its cache), it is in the units
// the bound is about (requests), and since each gateway bounds its own share, the sum over
// gateways stays within the same bound (plus one request per gateway of rounding).
//
// Thread-compatible: the owner serialises calls (remote_backend_pool holds a mutex).
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "edge/backend/runtime/kv_block_pool.h"
#include "edge/common/sha256.h"
#include "edge/common/time_source.h"
#include "edge/gateway/split/internal_protocol.h"

namespace edge::gateway {

struct router_options {
  double kv_weight = 4.0;        // a full KV cache counts as this many more requests
  double waiting_weight = 1.0;   // each waiting request counts this much more than a running one
  double affinity_slack = 4.0;   // how much worse than the best a remembered backend may score
  // How far above the average load a session's backend may be before the session spills to
  // its next backend (>= 0; 0.25: at most 25% above the average, rounded up).
  double session_load_epsilon = 0.25;
  std::int64_t affinity_blocks = 4;       // full blocks hashed into the affinity key (K)
  std::size_t affinity_capacity = 65536;  // keys remembered at most (LRU)
  int eject_after_failures = 3;           // consecutive failures that eject a backend
  std::chrono::milliseconds ejection_base{std::chrono::seconds(5)};
  std::chrono::milliseconds ejection_max{std::chrono::seconds(60)};
  // A load report older than this is ignored (the gateway's own count still counts).
  std::chrono::milliseconds report_max_age{std::chrono::seconds(2)};
};

// A prompt's affinity key; absent when the prompt holds no full block.
using affinity_key = backend::block_hash;

// The key of `prompt` for prefix-cache salt `salt` (the tenant's id, as the backends' engines
// salt their caches), with the backends' `block_size`.
std::optional<affinity_key> prompt_affinity_key(std::string_view salt, std::span<const std::int32_t> prompt,
                                                std::int64_t block_size, std::int64_t affinity_blocks);

// A request's session as the router keys it: the tenant's id and the session string under a
// domain prefix of their own (so no key of another kind, nor another tenant's session, is ever
// the same). Absent when the request names no session.
using session_key = sha256_digest;
std::optional<session_key> session_route_key(std::string_view tenant, std::string_view session);

// What a request is routed by.
struct route_keys {
  std::optional<affinity_key> prefix;  // prompt_affinity_key
  std::optional<session_key> session;  // session_route_key: wins over the prefix
};

// Why a backend was chosen, for metrics.
enum class route_reason { affinity, rendezvous, least_loaded, session };
std::string_view to_string(route_reason reason);

struct route_choice {
  std::size_t backend = 0;
  route_reason reason = route_reason::least_loaded;
};

class backend_router {
 public:
  // `names` identify the backends (their URLs): the rendezvous hash is over them.
  backend_router(std::vector<std::string> names, router_options options, const time_source& clock);

  std::size_t size() const { return backends_.size(); }

  // ---- what the pollers learn ----
  // Ready and serving the gateway's model, or not.
  void set_healthy(std::size_t backend, bool healthy);
  void report_load(std::size_t backend, const backend_load_report& load);

  // ---- what requests learn ----
  // A request was sent to `backend` (counts until finished()).
  void dispatched(std::size_t backend);
  void finished(std::size_t backend);
  // The backend accepted a request (a 200 with its stream): ends a run of failures.
  void succeeded(std::size_t backend);
  // Connection refused or broken before the first event, a 5xx: one more in a run. True when
  // this failure ejected the backend.
  bool failed(std::size_t backend);
  // Remembers that `backend` now holds the prefix `key`.
  void remember(const affinity_key& key, std::size_t backend);

  // ---- the choice ----
  // The backend for a request with `keys`, skipping `excluded` (backends already tried for
  // it); nothing when no backend is available.
  std::optional<route_choice> choose(const route_keys& keys, std::span<const std::size_t> excluded);

  // Healthy and not ejected now.
  bool available(std::size_t backend) const;
  std::size_t available_count() const;
  bool healthy(std::size_t backend) const { return backends_[backend].healthy; }
  bool ejected(std::size_t backend) const;
  std::int64_t outstanding(std::size_t backend) const { return backends_[backend].outstanding; }
  double score(std::size_t backend) const;
  std::size_t remembered_keys() const { return affinity_.size(); }

 private:
  struct backend_state {
    std::string name;
    bool healthy = false;
    std::optional<backend_load_report> load;
    std::chrono::steady_clock::time_point load_time{};
    std::int64_t outstanding = 0;            // sent by this gateway, not finished
    std::int64_t outstanding_at_report = 0;  // `outstanding` when the report arrived
    int consecutive_failures = 0;
    int ejections_in_a_row = 0;
    std::chrono::steady_clock::time_point ejected_until{};
  };

  struct key_hash {
    std::size_t operator()(const affinity_key& key) const noexcept;
  };

  std::uint64_t rendezvous_weight(const sha256_digest& key, std::size_t backend) const;
  std::size_t rendezvous(const affinity_key& key, std::span<const std::size_t> candidates) const;
  std::size_t bounded_rendezvous(const session_key& key, std::span<const std::size_t> candidates) const;
  void touch(const affinity_key& key, std::size_t backend);

  router_options options_;
  const time_source& clock_;
  std::vector<backend_state> backends_;
  std::size_t rotation_ = 0;  // where ties start, advanced per choice
  // Affinity: most recently used first; the map points into the list.
  std::list<std::pair<affinity_key, std::size_t>> lru_;
  std::unordered_map<affinity_key, std::list<std::pair<affinity_key, std::size_t>>::iterator, key_hash> affinity_;
};

}  // namespace edge::gateway
