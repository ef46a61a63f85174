#include "edge/gateway/tenancy/quota_stores.h"

#include "edge/common/format.h"
#include "edge/monitoring/gateway_metrics.h"

namespace edge::gateway {
namespace {

using namespace std::chrono_literals;

constexpr std::string_view memory_store = "memory";
constexpr std::int64_t max_connections_limit = 1024;

}  // namespace

void add_quota_store_options(config::schema& options) {
  options.add_string("quota-store", std::string(memory_store),
                     "Where per-tenant quota counters live: memory (this process) or redis://HOST[:PORT][/DB] "
                     "(shared by every gateway using the same Redis, so they enforce one limit)");
  options.add_choice("quota-fail-mode", "open", {"open", "closed"},
                     "While the Redis quota store cannot be reached: open admits requests without counting them, "
                     "closed refuses them with 503 and retry-after");
  options.add_duration("quota-store-timeout", "100ms", 1ms, 10s,
                       "Longest wait for one Redis command of the quota store");
  options.add_duration("quota-store-connect-timeout", "200ms", 1ms, 10s,
                       "Longest wait for a new connection to the Redis quota store");
  options.add_integer("quota-store-connections", 16, 1, max_connections_limit,
                      "Connections to the Redis quota store kept at most");
}

result<quota_store_options> quota_store_options_from(const config::values& settings) {
  quota_store_options out;
  const std::string& store = settings.string("quota-store");
  if (store != memory_store) {
    auto address = parse_redis_url(store);
    if (!address.ok()) {
      return invalid_argument(format("--quota-store: {}, or memory", address.error().message()));
    }
    out.redis = *address;
  }
  out.fail_mode = settings.string("quota-fail-mode") == "closed" ? quota_fail_mode::closed : quota_fail_mode::open;
  out.command_timeout = settings.duration("quota-store-timeout");
  out.connect_timeout = settings.duration("quota-store-connect-timeout");
  out.max_connections = static_cast<std::size_t>(settings.integer("quota-store-connections"));
  return out;
}

std::unique_ptr<quota_store> make_quota_store(const quota_store_options& options, const time_source& clock,
                                              monitoring::gateway_metrics* metrics) {
  if (!options.redis) {
    if (metrics != nullptr) metrics->quota_store_up.Set(1);  // memory is always there
    return std::make_unique<in_memory_quota_store>(clock);
  }
  return redis_quota_store::create({.address = *options.redis,
                                    .fail_mode = options.fail_mode,
                                    .connect_timeout = options.connect_timeout,
                                    .command_timeout = options.command_timeout,
                                    .max_connections = options.max_connections},
                                   metrics);
}

}  // namespace edge::gateway
