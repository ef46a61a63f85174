// Choosing where quota counters live, for every command that runs a gateway:
//
//   --quota-store memory                    this process (the default; one gateway)
//   --quota-store redis://HOST[:PORT][/DB]  Redis, shared by every gateway that names it
//   --quota-fail-mode open|closed           with Redis down: admit uncounted, or refuse with 503
//   --quota-store-timeout 100ms             longest wait for one Redis command
//   --quota-store-connect-timeout 200ms     longest wait for a new Redis connection
//   --quota-store-connections 16            Redis connections kept at most
//
// (also EDGE_QUOTA_STORE, ..., and quota_store = "..." in the config file.)
//
//   config::schema s; gateway::add_quota_store_options(s);
//   EDGE_ASSIGN_OR_RETURN(auto options, gateway::quota_store_options_from(settings));
//   EDGE_ASSIGN_OR_RETURN(auto quotas, gateway::make_quota_store(options, clock, &metrics));
#pragma once

#include <chrono>
#include <memory>
#include <optional>

#include "edge/common/config.h"
#include "edge/common/status.h"
#include "edge/common/time_source.h"
#include "edge/gateway/tenancy/quota.h"
#include "edge/gateway/tenancy/redis_quota_store.h"

namespace edge::monitoring {
struct gateway_metrics;
}

namespace edge::gateway {

struct quota_store_options {
  std::optional<redis_address> redis;  // absent: in memory
  quota_fail_mode fail_mode = quota_fail_mode::open;
  std::chrono::milliseconds command_timeout{100};
  std::chrono::milliseconds connect_timeout{200};
  std::size_t max_connections = 16;
};

// Adds the options above to a command's schema.
void add_quota_store_options(config::schema& options);
// Reads them back; a --quota-store that is neither "memory" nor a redis:// URL is an error that
// says what is expected.
result<quota_store_options> quota_store_options_from(const config::values& settings);

// An in_memory_quota_store on `clock`, or a redis_quota_store (on the Redis server's clock).
// `clock` and `metrics` (may be null) must outlive the store.
std::unique_ptr<quota_store> make_quota_store(const quota_store_options& options, const time_source& clock,
                                              monitoring::gateway_metrics* metrics);

}  // namespace edge::gateway
