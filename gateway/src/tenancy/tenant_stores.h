// What the two tenant stores share: how a tenant and a key are laid out in a row, the names of
// the audit log's actions, and their constructors (tenant_store::open picks one).
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "edge/common/status.h"
#include "edge/common/time_source.h"
#include "edge/gateway/tenancy/tenant_store.h"

namespace edge::gateway {

result<std::unique_ptr<tenant_store>> open_sqlite_tenant_store(const std::filesystem::path& state_dir,
                                                               const time_source& clock);
result<std::unique_ptr<tenant_store>> open_postgres_tenant_store(const tenant_store_options& options,
                                                                 const time_source& clock);

namespace store_rows {

// The tenants table's columns as the stores read and write them: id, weight, one per quota kind
// (named as the kind, in the order of quota_kinds; NULL for unlimited), created_at, updated_at.
inline constexpr int first_quota_column = 2;  // 0-based, as a row is read
inline constexpr int created_at_column = first_quota_column + static_cast<int>(quota_kinds.size());
inline constexpr int tenant_column_count = created_at_column + 2;

// Each quota kind's column followed by `suffix` and ", ".
std::string quota_columns(std::string_view suffix);
// "id, weight, <quota columns>, created_at, updated_at".
const std::string& tenant_columns();

inline constexpr std::string_view key_columns = "id, tenant_id, secret_sha256, created_at, expires_at, revoked_at";

// The meta row whose presence says the default tenant was made (or the store found tenants).
inline constexpr std::string_view bootstrapped_key = "bootstrapped_at";

// How long the id of an added usage batch is remembered: far longer than a retry can come.
inline constexpr unix_time ledger_batch_memory_seconds = 7 * seconds_per_day;

status no_such_tenant(std::string_view id);
status no_such_key(std::string_view id);
status tenant_exists(std::string_view id);

}  // namespace store_rows
}  // namespace edge::gateway
