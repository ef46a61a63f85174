// What the tests of usage accounting share: a fixed noon to start their clocks at, and a
// tenant's usage summed over the day around it as the store holds it.
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <string_view>

#include "edge/gateway/tenancy/tenant_store.h"

namespace edge::testing {

inline constexpr gateway::unix_time noon_s = 1777636800;  // 2026-05-01T12:00Z
inline const auto noon = std::chrono::system_clock::time_point(std::chrono::seconds(noon_s));

inline gateway::usage_counts total_usage(const gateway::tenant_store& store, std::string_view tenant) {
  auto rows = store.usage(tenant, noon_s - 86400, noon_s + 86400);
  REQUIRE(rows.ok());
  gateway::usage_counts sum;
  for (const auto& row : *rows) sum += row.counts;
  return sum;
}

}  // namespace edge::testing
