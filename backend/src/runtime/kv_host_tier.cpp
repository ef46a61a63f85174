#include "edge/backend/runtime/kv_host_tier.h"

#include <cassert>
#include <cstring>

#include "edge/common/format.h"

namespace edge::backend {

std::size_t kv_host_tier::hash_of_digest::operator()(const block_hash& h) const noexcept {
  std::size_t value = 0;
  std::memcpy(&value, h.data(), sizeof(value));
  return value;
}

kv_host_tier::kv_host_tier(std::int64_t slots) : slots_(static_cast<std::size_t>(std::max<std::int64_t>(slots, 0))) {
  free_.reserve(slots_.size());
  for (auto s = static_cast<std::int64_t>(slots_.size()) - 1; s >= 0; --s) free_.push_back(static_cast<std::int32_t>(s));
}

std::int64_t kv_host_tier::used_by(block_owner owner) const {
  const auto it = owners_.find(owner);
  return it == owners_.end() ? 0 : it->second.count;
}

std::optional<std::int32_t> kv_host_tier::find(const block_hash& hash) {
  const auto it = index_.find(hash);
  if (it == index_.end()) return std::nullopt;
  const std::int32_t slot = it->second;
  unlink(slot);
  link(slot);
  return slot;
}

std::optional<kv_host_tier::placement> kv_host_tier::place(const block_hash& hash, block_owner owner,
                                                          std::int64_t cap) {
  if (cap <= 0 || slots_.empty()) return std::nullopt;
  if (const auto found = find(hash)) return placement{.slot = *found, .present = true};

  std::optional<std::int32_t> slot;
  std::optional<evicted_block> displaced;
  if (used_by(owner) >= cap) {
    // At its cap, an owner makes room only among its own slots.
    slot = oldest_unpinned(owners_[owner].head, true);
  } else if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else {
    slot = oldest_unpinned(head_, false);
  }
  if (!slot) return std::nullopt;
  if (slots_[static_cast<std::size_t>(*slot)].used) displaced = drop(*slot);

  slot_state& s = slots_[static_cast<std::size_t>(*slot)];
  s.used = true;
  s.hash = hash;
  s.owner = owner;
  ++used_;
  index_.emplace(hash, *slot);
  link(*slot);
  return placement{.slot = *slot, .present = false, .displaced = displaced};
}

void kv_host_tier::erase(std::int32_t slot) {
  assert(slot >= 0 && static_cast<std::size_t>(slot) < slots_.size());
  if (!slots_[static_cast<std::size_t>(slot)].used) return;
  drop(slot);
  free_.push_back(slot);
}

evicted_block kv_host_tier::drop(std::int32_t slot) {
  slot_state& s = slots_[static_cast<std::size_t>(slot)];
  unlink(slot);
  index_.erase(s.hash);
  const evicted_block gone{.block = slot, .hash = s.hash, .owner = s.owner};
  s.used = false;
  --used_;
  return gone;
}

void kv_host_tier::pin(std::int32_t slot) {
  slot_state& s = slots_[static_cast<std::size_t>(slot)];
  if (s.pinned) return;
  s.pinned = true;
  pinned_.push_back(slot);
}

void kv_host_tier::unpin_all() {
  for (const std::int32_t slot : pinned_) slots_[static_cast<std::size_t>(slot)].pinned = false;
  pinned_.clear();
}

std::optional<std::int32_t> kv_host_tier::oldest_unpinned(std::int32_t head, bool along_owner) const {
  for (std::int32_t s = head; s != none;) {
    const slot_state& state = slots_[static_cast<std::size_t>(s)];
    if (!state.pinned) return s;
    s = along_owner ? state.owner_next : state.next;
  }
  return std::nullopt;
}

void kv_host_tier::link(std::int32_t slot) {
  slot_state& s = slots_[static_cast<std::size_t>(slot)];
  s.prev = tail_;
  s.next = none;
  (tail_ == none ? head_ : slots_[static_cast<std::size_t>(tail_)].next) = slot;
  tail_ = slot;

  owner_list& o = owners_[s.owner];
  s.owner_prev = o.tail;
  s.owner_next = none;
  (o.tail == none ? o.head : slots_[static_cast<std::size_t>(o.tail)].owner_next) = slot;
  o.tail = slot;
  ++o.count;
}

void kv_host_tier::unlink(std::int32_t slot) {
  slot_state& s = slots_[static_cast<std::size_t>(slot)];
  (s.prev == none ? head_ : slots_[static_cast<std::size_t>(s.prev)].next) = s.next;
  (s.next == none ? tail_ : slots_[static_cast<std::size_t>(s.next)].prev) = s.prev;
  s.prev = s.next = none;

  const auto it = owners_.find(s.owner);
  assert(it != owners_.end());
  owner_list& o = it->second;
  (s.owner_prev == none ? o.head : slots_[static_cast<std::size_t>(s.owner_prev)].owner_next) = s.owner_next;
  (s.owner_next == none ? o.tail : slots_[static_cast<std::size_t>(s.owner_next)].owner_prev) = s.owner_prev;
  s.owner_prev = s.owner_next = none;
  // An owner with nothing here is forgotten: owners are bounded by the slots, not by history.
  if (--o.count == 0) owners_.erase(it);
}

status kv_host_tier::check_consistency() const {
  std::int64_t used = 0;
  std::unordered_map<block_owner, std::int64_t> per_owner;
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    const slot_state& s = slots_[i];
    if (!s.used) continue;
    ++used;
    ++per_owner[s.owner];
    const auto it = index_.find(s.hash);
    if (it == index_.end() || it->second != static_cast<std::int32_t>(i)) {
      return internal_error(format("host tier slot {} is not indexed", i));
    }
  }
  if (used != used_ || used != static_cast<std::int64_t>(index_.size())) {
    return internal_error(format("host tier: {} slots used, counted {}, indexed {}", used, used_, index_.size()));
  }
  if (used + static_cast<std::int64_t>(free_.size()) != slots()) {
    return internal_error(format("host tier: {} used and {} free of {} slots", used, free_.size(), slots()));
  }
  std::int64_t listed = 0;
  for (std::int32_t s = head_, prev = none; s != none; prev = s, s = slots_[static_cast<std::size_t>(s)].next) {
    if (slots_[static_cast<std::size_t>(s)].prev != prev || !slots_[static_cast<std::size_t>(s)].used) {
      return internal_error(format("host tier LRU list broken at slot {}", s));
    }
    if (++listed > used) return internal_error("host tier LRU list is too long");
  }
  if (listed != used) return internal_error(format("host tier LRU list holds {} of {} slots", listed, used));
  if (per_owner.size() != owners_.size()) return internal_error("host tier owner lists disagree with the slots");
  for (const auto& [owner, list] : owners_) {
    std::int64_t n = 0;
    for (std::int32_t s = list.head; s != none; s = slots_[static_cast<std::size_t>(s)].owner_next) {
      if (slots_[static_cast<std::size_t>(s)].owner != owner) return internal_error("host tier slot on another owner's list");
      if (++n > used) return internal_error("host tier owner list is too long");
    }
    if (n != list.count || n != per_owner[owner]) {
      return internal_error(format("host tier owner {} lists {} slots, counted {}", owner, n, list.count));
    }
  }
  return {};
}

}  // namespace edge::backend
