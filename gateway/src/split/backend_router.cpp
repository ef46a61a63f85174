#include "edge/gateway/split/backend_router.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

namespace edge::gateway {
namespace {

// Scores closer than this are equal (they are sums of small counts and a ratio).
constexpr double score_tolerance = 1e-9;

// FNV-1a, then SplitMix64's finaliser so that nearby inputs land far apart.
std::uint64_t mix_hash(std::span<const std::uint8_t> key, std::string_view name) {
  constexpr std::uint64_t fnv_offset = 14695981039346656037ull;
  constexpr std::uint64_t fnv_prime = 1099511628211ull;
  std::uint64_t h = fnv_offset;
  for (const std::uint8_t byte : key) h = (h ^ byte) * fnv_prime;
  for (const char c : name) h = (h ^ static_cast<std::uint8_t>(c)) * fnv_prime;
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

// Session keys' own domain: a session key never equals a prefix-cache hash or any other digest.
constexpr std::string_view session_key_domain{"edgeinfer session affinity v1\0", 30};

}  // namespace

std::optional<session_key> session_route_key(std::string_view tenant, std::string_view session) {
  if (session.empty()) return std::nullopt;
  // The tenant's length first, so that ("ab", "c") and ("a", "bc") are different keys.
  std::array<char, 8> length{};
  std::uint64_t n = tenant.size();
  for (char& byte : length) {
    byte = static_cast<char>(n & 0xff);
    n >>= 8;
  }
  sha256_hasher hasher;
  hasher.update(session_key_domain);
  hasher.update(std::string_view(length.data(), length.size()));
  hasher.update(tenant);
  hasher.update(session);
  return hasher.finish();
}

std::optional<affinity_key> prompt_affinity_key(std::string_view salt, std::span<const std::int32_t> prompt,
                                                std::int64_t block_size, std::int64_t affinity_blocks) {
  if (block_size < 1 || affinity_blocks < 1) return std::nullopt;
  const auto full_blocks = static_cast<std::int64_t>(prompt.size()) / block_size;
  const std::int64_t blocks = std::min(full_blocks, affinity_blocks);
  if (blocks == 0) return std::nullopt;
  // The chain the backend's prefix cache computes for the same tokens (kv_block_pool.h).
  affinity_key hash = backend::prefix_root_hash(salt);
  for (std::int64_t b = 0; b < blocks; ++b) {
    hash = backend::chain_block_hash(hash, prompt.subspan(static_cast<std::size_t>(b * block_size),
                                                          static_cast<std::size_t>(block_size)));
  }
  return hash;
}

std::string_view to_string(route_reason reason) {
  switch (reason) {
    case route_reason::affinity: return "affinity";
    case route_reason::rendezvous: return "rendezvous";
    case route_reason::least_loaded: return "least_loaded";
    case route_reason::session: return "session";
  }
  return "least_loaded";
}

std::size_t backend_router::key_hash::operator()(const affinity_key& key) const noexcept {
  std::size_t h = 0;
  std::memcpy(&h, key.data(), sizeof h);
  return h;
}

backend_router::backend_router(std::vector<std::string> names, router_options options, const time_source& clock)
    : options_(options), clock_(clock) {
  backends_.resize(names.size());
  for (std::size_t i = 0; i < names.size(); ++i) backends_[i].name = std::move(names[i]);
}

void backend_router::set_healthy(std::size_t backend, bool healthy) { backends_[backend].healthy = healthy; }

void backend_router::report_load(std::size_t backend, const backend_load_report& load) {
  backend_state& b = backends_[backend];
  b.load = load;
  b.load_time = clock_.monotonic_time();
  b.outstanding_at_report = b.outstanding;
}

void backend_router::dispatched(std::size_t backend) { ++backends_[backend].outstanding; }

void backend_router::finished(std::size_t backend) {
  backend_state& b = backends_[backend];
  if (b.outstanding > 0) --b.outstanding;
  b.outstanding_at_report = std::min(b.outstanding_at_report, b.outstanding);
}

void backend_router::succeeded(std::size_t backend) {
  backend_state& b = backends_[backend];
  b.consecutive_failures = 0;
  b.ejections_in_a_row = 0;
}

bool backend_router::failed(std::size_t backend) {
  backend_state& b = backends_[backend];
  if (ejected(backend)) return false;  // already out: failures of requests sent before do not extend it
  if (++b.consecutive_failures < options_.eject_after_failures) return false;
  b.consecutive_failures = 0;
  // The backoff doubles with each ejection in a row: base, 2 base, 4 base, ... up to the cap.
  auto backoff = options_.ejection_base;
  for (int i = 0; i < b.ejections_in_a_row && backoff < options_.ejection_max; ++i) backoff *= 2;
  backoff = std::min(backoff, options_.ejection_max);
  ++b.ejections_in_a_row;
  b.ejected_until = clock_.monotonic_time() + backoff;
  return true;
}

bool backend_router::ejected(std::size_t backend) const {
  return clock_.monotonic_time() < backends_[backend].ejected_until;
}

bool backend_router::available(std::size_t backend) const {
  return backends_[backend].healthy && !ejected(backend);
}

std::size_t backend_router::available_count() const {
  std::size_t n = 0;
  for (std::size_t i = 0; i < backends_.size(); ++i) n += available(i) ? 1 : 0;
  return n;
}

double backend_router::score(std::size_t backend) const {
  const backend_state& b = backends_[backend];
  const bool fresh = b.load && clock_.monotonic_time() - b.load_time <= options_.report_max_age;
  if (!fresh) return static_cast<double>(b.outstanding);
  const std::int64_t sent_since = std::max<std::int64_t>(0, b.outstanding - b.outstanding_at_report);
  const auto requests = static_cast<double>(b.load->running + b.load->waiting + sent_since);
  return requests + options_.waiting_weight * static_cast<double>(b.load->waiting) +
         options_.kv_weight * std::clamp(b.load->kv_usage, 0.0, 1.0);
}

std::uint64_t backend_router::rendezvous_weight(const sha256_digest& key, std::size_t backend) const {
  return mix_hash(key, backends_[backend].name);
}

std::size_t backend_router::rendezvous(const affinity_key& key, std::span<const std::size_t> candidates) const {
  std::size_t best = candidates.front();
  std::uint64_t best_weight = 0;
  for (const std::size_t c : candidates) {
    const std::uint64_t weight = rendezvous_weight(key, c);
    if (weight > best_weight || (weight == best_weight && c < best)) {
      best = c;
      best_weight = weight;
    }
  }
  return best;
}

std::size_t backend_router::bounded_rendezvous(const session_key& key, std::span<const std::size_t> candidates) const {
  std::vector<std::pair<std::uint64_t, std::size_t>> ranked;  // (weight, backend), heaviest first
  ranked.reserve(candidates.size());
  std::int64_t total = 0;
  for (const std::size_t c : candidates) {
    ranked.emplace_back(rendezvous_weight(key, c), c);
    total += backends_[c].outstanding;
  }
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  // The tolerance keeps an exact quotient (2.0) from rounding up to the next request.
  const double capacity = std::ceil((1.0 + std::max(options_.session_load_epsilon, 0.0)) *
                                        static_cast<double>(total + 1) / static_cast<double>(candidates.size()) -
                                    score_tolerance);
  for (const auto& [weight, c] : ranked) {
    if (static_cast<double>(backends_[c].outstanding + 1) <= capacity) return c;
  }
  return ranked.front().second;  // not reached: the least loaded is at most the average
}

void backend_router::touch(const affinity_key& key, std::size_t backend) {
  if (auto found = affinity_.find(key); found != affinity_.end()) {
    found->second->second = backend;
    lru_.splice(lru_.begin(), lru_, found->second);
    return;
  }
  if (options_.affinity_capacity == 0) return;
  if (affinity_.size() >= options_.affinity_capacity) {
    affinity_.erase(lru_.back().first);
    lru_.pop_back();
  }
  lru_.emplace_front(key, backend);
  affinity_.emplace(key, lru_.begin());
}

void backend_router::remember(const affinity_key& key, std::size_t backend) { touch(key, backend); }

std::optional<route_choice> backend_router::choose(const route_keys& keys, std::span<const std::size_t> excluded) {
  std::vector<std::size_t> candidates;
  candidates.reserve(backends_.size());
  for (std::size_t i = 0; i < backends_.size(); ++i) {
    if (available(i) && std::find(excluded.begin(), excluded.end(), i) == excluded.end()) candidates.push_back(i);
  }
  if (candidates.empty()) return std::nullopt;
  if (keys.session) return route_choice{bounded_rendezvous(*keys.session, candidates), route_reason::session};
  const std::optional<affinity_key>& key = keys.prefix;

  // The least loaded, equal scores taken in turn from a rotating start.
  const std::size_t start = rotation_++ % candidates.size();
  std::size_t best = candidates[start];
  double best_score = score(best);
  for (std::size_t k = 1; k < candidates.size(); ++k) {
    const std::size_t c = candidates[(start + k) % candidates.size()];
    const double s = score(c);
    if (s < best_score - score_tolerance) {
      best = c;
      best_score = s;
    }
  }
  if (!key) return route_choice{best, route_reason::least_loaded};

  const auto within_slack = [&](std::size_t c) { return score(c) <= best_score + options_.affinity_slack; };
  if (auto found = affinity_.find(*key); found != affinity_.end()) {
    const std::size_t remembered = found->second->second;
    const bool candidate = std::find(candidates.begin(), candidates.end(), remembered) != candidates.end();
    if (candidate && within_slack(remembered)) {
      lru_.splice(lru_.begin(), lru_, found->second);
      return route_choice{remembered, route_reason::affinity};
    }
    return route_choice{best, route_reason::least_loaded};
  }
  const std::size_t placed = rendezvous(*key, candidates);
  if (within_slack(placed)) return route_choice{placed, route_reason::rendezvous};
  return route_choice{best, route_reason::least_loaded};
}

}  // namespace edge::gateway
