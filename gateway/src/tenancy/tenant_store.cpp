#include "edge/gateway/tenancy/tenant_store.h"

#include "edge/common/format.h"
#include "tenant_stores.h"

namespace edge::gateway {

usage_counts& usage_counts::operator+=(const usage_counts& other) {
  requests += other.requests;
  prompt_tokens += other.prompt_tokens;
  completion_tokens += other.completion_tokens;
  cached_tokens += other.cached_tokens;
  rejections += other.rejections;
  return *this;
}

bool usage_counts::empty() const { return *this == usage_counts{}; }

void tenant_patch::apply_to(tenant_record& tenant) const {
  if (weight) tenant.weight = *weight;
  for (const quota_kind& kind : quota_kinds) {
    if (const quota_change& change = quota(kind)) kind.of(tenant.quotas) = *change;
  }
}

tenant_snapshot::tenant_snapshot(std::vector<tenant_record> tenants, std::vector<api_key_record> keys,
                                 std::uint64_t version)
    : version_(version) {
  for (auto& t : tenants) {
    std::string id = t.id;
    tenants_.emplace(std::move(id), std::make_shared<const tenant_record>(std::move(t)));
  }
  for (auto& k : keys) {
    std::string id = k.id;
    keys_.emplace(std::move(id), std::move(k));
  }
}

std::shared_ptr<const tenant_record> tenant_snapshot::tenant(std::string_view id) const {
  const auto it = tenants_.find(id);
  return it == tenants_.end() ? nullptr : it->second;
}

const api_key_record* tenant_snapshot::key(std::string_view id) const {
  const auto it = keys_.find(id);
  return it == keys_.end() ? nullptr : &it->second;
}

bool is_postgres_url(std::string_view url) {
  return url.starts_with("postgres://") || url.starts_with("postgresql://");
}

result<std::unique_ptr<tenant_store>> tenant_store::open(const std::filesystem::path& state_dir,
                                                         const time_source& clock) {
  return open_sqlite_tenant_store(state_dir, clock);
}

result<std::unique_ptr<tenant_store>> tenant_store::open(const tenant_store_options& options,
                                                         const time_source& clock) {
  if (options.url.empty() || options.url == "sqlite") return open_sqlite_tenant_store(options.state_dir, clock);
  if (is_postgres_url(options.url)) return open_postgres_tenant_store(options, clock);
  return invalid_argument(format("--tenant-store '{}': expected sqlite (in --state-dir) or a postgres:// URL",
                                 options.url));
}

namespace store_rows {

std::string quota_columns(std::string_view suffix) {
  std::string out;
  for (const quota_kind& kind : quota_kinds) out += format("{}{}, ", kind.name, suffix);
  return out;
}

const std::string& tenant_columns() {
  static const std::string columns = "id, weight, " + quota_columns("") + "created_at, updated_at";
  return columns;
}

status no_such_tenant(std::string_view id) { return not_found(format("no tenant '{}'", id)); }
status no_such_key(std::string_view id) { return not_found(format("no API key '{}'", id)); }
status tenant_exists(std::string_view id) {
  return status(status_code::already_exists, format("tenant '{}' already exists", id));
}

}  // namespace store_rows
}  // namespace edge::gateway
