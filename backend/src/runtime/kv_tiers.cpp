#include "edge/backend/runtime/kv_tiers.h"

namespace edge::backend {

kv_tiers::kv_tiers(std::span<std::byte> host_memory, std::size_t block_bytes, std::shared_ptr<kv_disk_tier> disk,
                   std::function<void()> finish_copies)
    : host_memory_(host_memory),
      block_bytes_(block_bytes),
      host_(block_bytes == 0 ? 0 : static_cast<std::int64_t>(host_memory.size() / block_bytes)),
      disk_(std::move(disk)),
      finish_copies_(std::move(finish_copies)) {}

block_owner kv_tiers::owner(const std::string& tenant, const tier_caps& caps) {
  const auto [it, added] = numbers_.try_emplace(tenant, static_cast<block_owner>(owners_.size() + 1));
  if (added) owners_.push_back({.tenant = tenant});
  owners_[it->second - 1].caps = caps;
  return it->second;
}

const tier_caps& kv_tiers::caps_of(block_owner owner) const {
  // Owner 0 (a block registered without tiers) keeps nothing.
  static const tier_caps none{.host_blocks = 0, .disk_bytes = 0};
  return owner == 0 || owner > owners_.size() ? none : owners_[owner - 1].caps;
}

std::span<std::byte> kv_tiers::slot_bytes(std::int32_t slot) const {
  return host_memory_.subspan(static_cast<std::size_t>(slot) * block_bytes_, block_bytes_);
}

void kv_tiers::touch_host_memory() {
  if (copies_finished_) return;
  if (finish_copies_) finish_copies_();
  copies_finished_ = true;
}

std::optional<std::int32_t> kv_tiers::keep(const evicted_block& e) {
  const auto placed = host_.place(e.hash, e.owner, caps_of(e.owner).host_blocks);
  if (!placed || placed->present) return std::nullopt;
  host_.pin(placed->slot);
  spills_.push_back({.slot = placed->slot, .hash = e.hash, .owner = e.owner});
  return placed->slot;
}

std::optional<std::int32_t> kv_tiers::find(const block_hash& hash, block_owner owner) {
  if (const auto slot = host_.find(hash)) {
    host_.pin(*slot);
    return slot;
  }
  if (!disk_ || !disk_->contains(hash)) return std::nullopt;
  const auto placed = host_.place(hash, owner, caps_of(owner).host_blocks);
  if (!placed) return std::nullopt;
  touch_host_memory();
  if (!disk_->get(hash, slot_bytes(placed->slot))) {
    host_.erase(placed->slot);
    ++counters_.disk_failures;
    return std::nullopt;
  }
  ++counters_.disk_hits;
  host_.pin(placed->slot);
  return placed->slot;
}

void kv_tiers::begin_step() {
  copies_finished_ = false;
  // A plan the executor never saw (neither done nor failed) had no copies to leave behind.
  if (!spills_.empty()) step_failed();
  host_.unpin_all();
}

void kv_tiers::step_done() {
  if (disk_ && !spills_.empty()) {
    touch_host_memory();
    for (const spilled& s : spills_) {
      const owner_state& o = owners_[s.owner - 1];
      disk_->put(s.hash, o.tenant, o.caps.disk_bytes, slot_bytes(s.slot));
    }
  }
  spills_.clear();
  host_.unpin_all();
}

void kv_tiers::step_failed() {
  for (const spilled& s : spills_) host_.erase(s.slot);
  spills_.clear();
  host_.unpin_all();
}

}  // namespace edge::backend
