#include "edge/backend/engine/scheduler.h"

#include <algorithm>
#include <cassert>
#include <limits>
#include <stdexcept>

#include "edge/common/format.h"

namespace edge::backend {
namespace {

// Block tables and the pool's reference counts disagree: a bug here, found before two
// sequences write one block. Thrown on the engine thread, it ends the engine loop (engine.h:
// the engine fails, its requests end with error) instead of serving corrupt attention.
[[noreturn]] void accounting_bug(const std::string& what) {
  throw std::logic_error(format("KV block accounting: {}", what));
}

}  // namespace

std::optional<admission_policy> parse_admission_policy(std::string_view name) {
  if (name == "optimistic") return admission_policy::optimistic;
  if (name == "reserve") return admission_policy::reserve;
  return std::nullopt;
}

std::string_view to_string(admission_policy policy) {
  switch (policy) {
    case admission_policy::optimistic: return "optimistic";
    case admission_policy::reserve: return "reserve";
  }
  return "unknown";
}

struct scheduler::sequence {
  sequence_id id = 0;
  tenant_state* tenant = nullptr;
  std::int32_t priority = 0;
  std::uint64_t arrival = 0;  // order of add(): earlier is smaller
  std::int64_t prompt_length = 0;
  std::int64_t max_tokens = 0;
  std::vector<std::int32_t> tokens;  // prompt, then generated
  std::vector<sequence_id> forks;    // choices still to split off
  // While running with forks: the blocks each fork takes for itself when it splits off,
  // fork_own_blocks() per fork, held from admission on.
  std::vector<std::int32_t> fork_blocks;
  bool prompt_logits = false;
  bool session = false;
  block_owner owner = 0;             // its tenant's number in the lower tiers (kv_tiers::owner)
  std::int64_t prompt_logits_done = 0;  // leading prompt positions whose logits rows were produced
  std::int64_t computed = 0;         // leading tokens whose K/V are in the cache
  std::vector<std::int32_t> blocks;  // block table
  block_hash root{};                 // the salt's chain root
  std::vector<block_hash> hashes;    // chain hashes of the leading full blocks, computed lazily
  std::int64_t registered = 0;       // leading blocks of the table known to the prefix cache
  std::int64_t cached_prompt_tokens = 0;
  bool admitted_before = false;
  sequence_state state = sequence_state::waiting;
};

struct scheduler::tenant_state {
  std::string name;
  double weight = 1.0;
  double deficit = 0.0;  // tokens served / weight: the least-served backlogged tenant goes next
  std::int64_t tokens_served = 0;
  std::int64_t running = 0;
  std::uint64_t last_picked = 0;  // breaks ties in favour of the tenant picked longest ago
  std::set<sequence*, by_priority_then_arrival> waiting;
};

bool scheduler::by_priority_then_arrival::operator()(const sequence* a, const sequence* b) const {
  if (a->priority != b->priority) return a->priority > b->priority;
  return a->arrival < b->arrival;
}

scheduler::scheduler(const scheduler_config& config, kv_block_pool& pool, kv_tiers* tiers)
    : config_(config), pool_(pool), tiers_(config.enable_prefix_caching ? tiers : nullptr) {
  watermark_blocks_ = static_cast<std::int64_t>(config.watermark * static_cast<double>(pool.total_blocks()));
  pool_.record_evictions(tiers_ != nullptr);
}

scheduler::~scheduler() {
  // A destructor must not throw: an accounting mismatch found while tearing down (the engine
  // already failed, or is stopping) has nothing left to protect, and the pool goes with us.
  try {
    for (auto& [id, s] : sequences_) release_blocks(*s);
  } catch (const std::exception&) {
  }
}

result<std::unique_ptr<scheduler>> scheduler::create(const scheduler_config& config, kv_block_pool& pool,
                                                     kv_tiers* tiers) {
  if (config.block_size < 1) return invalid_argument(format("block size {} is not positive", config.block_size));
  if (config.max_num_seqs < 1) return invalid_argument(format("max_num_seqs {} is not positive", config.max_num_seqs));
  if (config.max_num_batched_tokens < config.block_size) {
    // A prompt chunk is a whole number of blocks: a smaller step budget could never take one.
    return invalid_argument(format("max_num_batched_tokens {} is smaller than a block of {} tokens",
                                   config.max_num_batched_tokens, config.block_size));
  }
  if (!(config.watermark >= 0.0 && config.watermark < 1.0)) {
    return invalid_argument(format("watermark {} is not in [0, 1)", config.watermark));
  }
  if (config.max_model_len < 0) return invalid_argument("max_model_len is negative");
  std::unique_ptr<scheduler> s(new scheduler(config, pool, tiers));
  if (pool.total_blocks() <= s->watermark_blocks_) {
    return invalid_argument(format("a KV cache of {} blocks leaves no room above the watermark of {} blocks",
                                   pool.total_blocks(), s->watermark_blocks_));
  }
  return s;
}

std::int64_t scheduler::longest(std::int64_t prompt_tokens, std::int64_t max_tokens) const {
  // max_tokens may be anything a client sent: capped before adding.
  std::int64_t out = prompt_tokens + std::min(max_tokens, std::numeric_limits<std::int64_t>::max() / 2);
  if (config_.max_model_len > 0) out = std::min(out, config_.max_model_len);
  return out;
}

std::int64_t scheduler::fork_own_blocks(std::int64_t prompt_tokens, std::int64_t max_tokens) const {
  // The full blocks before the last prompt token are shared; the rest is the fork's own.
  const std::int64_t shared = (prompt_tokens - 1) / config_.block_size;
  if (config_.admission == admission_policy::optimistic) return 1;
  return blocks_for(longest(prompt_tokens, max_tokens)) - shared;
}

status scheduler::check_fits(std::int64_t prompt_tokens, std::int64_t max_tokens, std::int64_t choices) const {
  if (prompt_tokens < 1) return invalid_argument("the prompt is empty");
  if (max_tokens < 1) return invalid_argument(format("max_tokens must be at least 1, not {}", max_tokens));
  if (choices < 1) return invalid_argument(format("n must be at least 1, not {}", choices));
  if (choices > config_.max_num_seqs) {
    return invalid_argument(format("n = {} choices run as {} sequences; the engine runs at most {} at once", choices,
                                   choices, config_.max_num_seqs));
  }
  if (config_.max_model_len > 0 && prompt_tokens >= config_.max_model_len) {
    return out_of_range(format("the prompt has {} tokens; the model's context is {} tokens", prompt_tokens,
                               config_.max_model_len));
  }
  const std::int64_t top = longest(prompt_tokens, max_tokens);
  // Every choice at its longest: the prompt's full blocks once, the rest per choice.
  const std::int64_t shared = (prompt_tokens - 1) / config_.block_size;
  const std::int64_t blocks = blocks_for(top) + (choices - 1) * (blocks_for(top) - shared);
  const std::int64_t usable = pool_.total_blocks() - watermark_blocks_;
  if (blocks > usable) {
    if (choices == 1) {
      return out_of_range(format("prompt ({} tokens) plus max_tokens ({}) needs up to {} tokens of KV cache; "
                                 "the cache holds {}",
                                 prompt_tokens, max_tokens, top, usable * config_.block_size));
    }
    return out_of_range(format("prompt ({} tokens) plus max_tokens ({}) for {} choices needs up to {} blocks of {} "
                               "tokens of KV cache; the cache holds {}",
                               prompt_tokens, max_tokens, choices, blocks, config_.block_size, usable));
  }
  return {};
}

status scheduler::add(sequence_spec spec) {
  const auto choices = static_cast<std::int64_t>(spec.forks.size()) + 1;
  EDGE_RETURN_IF_ERROR(check_fits(static_cast<std::int64_t>(spec.prompt.size()), spec.max_tokens, choices));
  if (!(spec.weight > 0.0)) return invalid_argument(format("tenant weight {} is not positive", spec.weight));
  const auto taken = [&](sequence_id id) { return sequences_.contains(id) || fork_ids_.contains(id); };
  if (taken(spec.id)) return invalid_argument(format("sequence {} already exists", spec.id));
  for (std::size_t i = 0; i < spec.forks.size(); ++i) {
    const sequence_id f = spec.forks[i];
    if (f == spec.id || taken(f) || std::find(spec.forks.begin(), spec.forks.begin() + static_cast<std::ptrdiff_t>(i), f) !=
                                        spec.forks.begin() + static_cast<std::ptrdiff_t>(i)) {
      return invalid_argument(format("fork {} of sequence {} is not a new id", f, spec.id));
    }
  }
  if (spec.prompt_logits && config_.max_prompt_logits < config_.block_size) {
    return invalid_argument(format("prompt logits need a block of {} rows a step; the executor computes {}",
                                   config_.block_size, config_.max_prompt_logits));
  }

  auto it = tenants_.find(spec.tenant);
  if (it == tenants_.end()) {
    auto t = std::make_unique<tenant_state>();
    t->name = spec.tenant;
    it = tenants_.emplace(spec.tenant, std::move(t)).first;
  }
  tenant_state& tenant = *it->second;
  tenant.weight = spec.weight;

  auto s = std::make_unique<sequence>();
  s->id = spec.id;
  s->tenant = &tenant;
  s->priority = spec.priority;
  s->arrival = next_arrival_++;
  s->prompt_length = static_cast<std::int64_t>(spec.prompt.size());
  s->max_tokens = spec.max_tokens;
  s->tokens = std::move(spec.prompt);
  s->forks = std::move(spec.forks);
  s->prompt_logits = spec.prompt_logits;
  s->session = spec.session;
  s->owner = tiers_ != nullptr ? tiers_->owner(spec.tenant, spec.caps) : 0;
  fork_ids_.insert(s->forks.begin(), s->forks.end());
  s->root = prefix_root_hash(spec.tenant);
  sequence& ref = *s;
  sequences_.emplace(spec.id, std::move(s));
  if (!active(tenant)) activate(tenant);
  enqueue_waiting(ref);
  return {};
}

bool scheduler::remove(sequence_id id) {
  const auto it = sequences_.find(id);
  if (it == sequences_.end()) return false;
  sequence& s = *it->second;
  for (const sequence_id f : s.forks) fork_ids_.erase(f);
  if (s.state == sequence_state::running) {
    release_blocks(s);
    pending_forks_ -= static_cast<std::int64_t>(s.forks.size());
    running_.erase(std::find(running_.begin(), running_.end(), &s));
    --s.tenant->running;
  } else {
    s.tenant->waiting.erase(&s);
    --waiting_count_;
  }
  tenant_state* tenant = s.tenant;
  sequences_.erase(it);
  // A tenant with nothing left is forgotten: tenant names come from clients, so keeping every
  // one ever seen would grow without bound, and an idle tenant's history counts for nothing
  // anyway (activate() levels a returning tenant with the others).
  if (!active(*tenant)) tenants_.erase(tenant->name);
  return true;
}

bool scheduler::active(const tenant_state& t) const { return t.running > 0 || !t.waiting.empty(); }

void scheduler::activate(tenant_state& t) {
  // A tenant returning from idle starts level with the least-served active tenant: it cannot
  // have saved up a claim on the engine while it sent nothing.
  double floor = std::numeric_limits<double>::infinity();
  for (const auto& [name, other] : tenants_) {
    if (other.get() != &t && active(*other)) floor = std::min(floor, other->deficit);
  }
  if (floor != std::numeric_limits<double>::infinity()) t.deficit = std::max(t.deficit, floor);
}

void scheduler::enqueue_waiting(sequence& s) {
  s.state = sequence_state::waiting;
  s.tenant->waiting.insert(&s);
  ++waiting_count_;
}

void scheduler::insert_running(sequence& s) {
  running_.insert(std::upper_bound(running_.begin(), running_.end(), &s, by_priority_then_arrival{}), &s);
  s.state = sequence_state::running;
  ++s.tenant->running;
}

std::int64_t scheduler::chunk_for(std::int64_t computed, std::int64_t length, std::int64_t budget) const {
  const std::int64_t pending = length - computed;
  if (pending <= 0 || budget <= 0) return 0;
  if (pending <= budget) return pending;
  // A partial prompt chunk ends on a block boundary, so the next chunk starts a fresh block.
  const std::int64_t end = (computed + budget) / config_.block_size * config_.block_size;
  return std::max<std::int64_t>(0, end - computed);
}

std::int64_t scheduler::admission_blocks(const sequence& s) const {
  const auto length = static_cast<std::int64_t>(s.tokens.size());
  const std::int64_t own = config_.admission == admission_policy::optimistic
                               ? blocks_for(length)
                               : blocks_for(std::max(longest(s.prompt_length, s.max_tokens), length));
  return own + static_cast<std::int64_t>(s.forks.size()) * fork_own_blocks(s.prompt_length, s.max_tokens);
}

std::int64_t scheduler::compute_target(const sequence& s) const {
  return s.forks.empty() ? static_cast<std::int64_t>(s.tokens.size()) : s.prompt_length - 1;
}

bool scheduler::owes_prompt_logits(const sequence& s) const {
  return s.prompt_logits && s.prompt_logits_done < s.prompt_length - 1;
}

scheduler::chunk_shape scheduler::next_chunk(const sequence& s, std::int64_t computed, std::int64_t budget,
                                             std::int64_t logits_budget) const {
  chunk_shape shape;
  const std::int64_t last_scored = s.prompt_length - 1;  // rows are for positions before it
  const bool scores = owes_prompt_logits(s) && computed < last_scored;
  if (scores) {
    // Positions whose rows were produced before a preemption need none now.
    budget = std::min(budget, logits_budget + std::max<std::int64_t>(0, s.prompt_logits_done - computed));
  }
  shape.count = chunk_for(computed, compute_target(s), budget);
  if (scores && shape.count > 0) {
    const std::int64_t begin = std::max(computed, s.prompt_logits_done);
    const std::int64_t end = std::min(computed + shape.count, last_scored);
    if (end > begin) {
      shape.logits_offset = begin - computed;
      shape.logits_count = end - begin;
    }
  }
  return shape;
}

void scheduler::add_chunk(sequence& s, const chunk_shape& shape, step_plan& plan) {
  const std::int64_t end = s.computed + shape.count;
  plan.chunks.push_back({.id = s.id,
                         .start = s.computed,
                         .tokens = std::span<const std::int32_t>(s.tokens).subspan(static_cast<std::size_t>(s.computed),
                                                                                   static_cast<std::size_t>(shape.count)),
                         .block_table = s.blocks,
                         .samples = s.forks.empty() && end == static_cast<std::int64_t>(s.tokens.size()),
                         .prompt_logits_offset = shape.logits_offset,
                         .prompt_logits_count = shape.logits_count});
  plan.tokens += shape.count;
  charge(*s.tenant, shape.count);
}

const block_hash& scheduler::block_hash_at(sequence& s, std::int64_t block) {
  const auto bs = static_cast<std::size_t>(config_.block_size);
  while (static_cast<std::int64_t>(s.hashes.size()) <= block) {
    const std::size_t k = s.hashes.size();
    const block_hash& parent = k == 0 ? s.root : s.hashes.back();
    s.hashes.push_back(chain_block_hash(parent, std::span<const std::int32_t>(s.tokens).subspan(k * bs, bs)));
  }
  return s.hashes[static_cast<std::size_t>(block)];
}

void scheduler::register_full_blocks(sequence& s) {
  const std::int64_t full = std::min<std::int64_t>(s.computed / config_.block_size,
                                                   static_cast<std::int64_t>(s.blocks.size()));
  for (std::int64_t j = s.registered; j < full; ++j) {
    pool_.register_full(s.blocks[static_cast<std::size_t>(j)], block_hash_at(s, j), s.owner);
  }
  s.registered = std::max(s.registered, full);
}

void scheduler::spill_evictions(step_plan& plan) {
  if (tiers_ == nullptr) return;
  for (const evicted_block& e : pool_.take_evictions()) {
    const auto slot = tiers_->keep(e);
    if (!slot) continue;
    plan.spills.push_back({.block = e.block, .slot = *slot});
    ++counters_.spilled_blocks;
  }
}

void scheduler::release_blocks(sequence& s) {
  // Last block first: the pool evicts free cached blocks least recently freed first, so a
  // sequence's later blocks go before the shared beginnings that other prompts may reuse.
  const auto free_all = [&](std::vector<std::int32_t>& blocks) {
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
      if (*it < 0 || *it >= pool_.total_blocks() || pool_.ref_count(*it) <= 0) {
        accounting_bug(format("sequence {} frees block {}, which nobody holds", s.id, *it));
      }
      if (s.session) pool_.prefer_keeping(*it);
      pool_.free(*it);
    }
    blocks.clear();
  };
  free_all(s.fork_blocks);
  free_all(s.blocks);
  s.registered = 0;
}

void scheduler::preempt(sequence& s, step_plan& plan) {
  // A fork split off in this step and preempted in it needs its copy no more.
  std::erase_if(plan.copies, [&](const block_copy& c) {
    return std::find(s.blocks.begin(), s.blocks.end(), c.to) != s.blocks.end();
  });
  release_blocks(s);
  s.computed = 0;
  pending_forks_ -= static_cast<std::int64_t>(s.forks.size());
  running_.erase(std::find(running_.begin(), running_.end(), &s));
  --s.tenant->running;
  enqueue_waiting(s);
  ++counters_.preemptions;
}

void scheduler::charge(tenant_state& t, std::int64_t tokens) {
  // Charged when planned, not when computed, so that the next admission in the same step
  // already sees it: otherwise the least-served tenant would take every free slot of a step.
  t.tokens_served += tokens;
  t.deficit += static_cast<double>(tokens) / t.weight;
}

scheduler::tenant_state* scheduler::next_tenant() {
  tenant_state* best = nullptr;
  for (const auto& [name, t] : tenants_) {
    if (t->waiting.empty()) continue;
    if (best == nullptr) {
      best = t.get();
      continue;
    }
    if (config_.order == tenant_order::first_come_first_served) {
      if (by_priority_then_arrival{}(*t->waiting.begin(), *best->waiting.begin())) best = t.get();
    } else if (t->deficit < best->deficit || (t->deficit == best->deficit && t->last_picked < best->last_picked)) {
      best = t.get();
    }
  }
  return best;
}

bool scheduler::try_admit(sequence& s, std::int64_t budget, std::int64_t& logits_budget, step_plan& plan) {
  const auto length = static_cast<std::int64_t>(s.tokens.size());
  const auto choices = static_cast<std::int64_t>(s.forks.size()) + 1;
  if (num_running() + pending_forks_ + choices > config_.max_num_seqs) return false;
  std::vector<prefix_hit> hits;
  // A sequence still owed prompt logits computes every position: a hit would skip their rows.
  if (config_.enable_prefix_caching && !owes_prompt_logits(s)) {
    // The last token is always computed (its logits are needed), in a block of this sequence's
    // own; with forks, the last prompt token of every choice.
    const std::int64_t candidates = (std::min(length, compute_target(s) + 1) - 1) / config_.block_size;
    for (std::int64_t j = 0; j < candidates; ++j) {
      const block_hash& hash = block_hash_at(s, j);
      if (const auto block = pool_.find_cached(hash)) {
        hits.push_back({.block = *block});
        continue;
      }
      // Pinned until the step's copies are done, whether or not this admission goes through.
      const auto slot = tiers_ == nullptr ? std::nullopt : tiers_->find(hash, s.owner);
      if (!slot) break;
      hits.push_back({.slot = *slot});
    }
  }
  const auto hit_blocks = static_cast<std::int64_t>(hits.size());
  const std::int64_t start = hit_blocks * config_.block_size;
  const auto in_memory = static_cast<std::int64_t>(
      std::count_if(hits.begin(), hits.end(), [](const prefix_hit& h) { return h.block >= 0; }));

  // With forks and the whole prompt but its last token found, the forks split off at once.
  const bool forks_now = !s.forks.empty() && start == compute_target(s);
  const chunk_shape shape = forks_now ? chunk_shape{.count = std::min<std::int64_t>(1, budget)}
                                      : next_chunk(s, start, budget, logits_budget);
  if (shape.count == 0) return false;

  // Blocks found in the host tier take fresh blocks too.
  const std::int64_t fresh = admission_blocks(s) - in_memory;
  const auto revived = static_cast<std::int64_t>(std::count_if(
      hits.begin(), hits.end(), [&](const prefix_hit& h) { return h.block >= 0 && pool_.ref_count(h.block) == 0; }));
  if (pool_.free_blocks() - revived - fresh < watermark_blocks_) return false;

  const auto allocate = [&] {
    const auto block = pool_.allocate();
    if (!block) accounting_bug(format("admitting sequence {} found fewer free blocks than counted", s.id));
    return *block;
  };
  // The hits in KV memory are taken first: allocating for the host tier's could evict them.
  for (const prefix_hit& h : hits) {
    if (h.block >= 0) pool_.acquire(h.block);
  }
  std::int64_t restored = 0;  // blocks copied back for it in this step
  std::int64_t registered = hit_blocks;  // leading blocks known to the prefix cache
  for (std::size_t j = 0; j < hits.size(); ++j) {
    std::int32_t block = hits[j].block;
    if (block < 0) {
      // Registered once the step is done, as a block computed is: a failed step copies nothing.
      block = allocate();
      registered = std::min(registered, static_cast<std::int64_t>(j));
      plan.restores.push_back({.block = block, .slot = hits[j].slot});
      ++restored;
    }
    s.blocks.push_back(block);
  }
  const std::int64_t for_forks =
      static_cast<std::int64_t>(s.forks.size()) * fork_own_blocks(s.prompt_length, s.max_tokens);
  for (std::int64_t i = restored; i < fresh; ++i) (i < fresh - for_forks ? s.blocks : s.fork_blocks).push_back(allocate());
  spill_evictions(plan);
  s.computed = start;
  s.registered = registered;
  if (config_.enable_prefix_caching) {
    counters_.prefix_queries += length;
    counters_.prefix_hits += start;
    counters_.host_tier_hits += restored * config_.block_size;
    counters_.restored_blocks += restored;
  }
  if (!s.admitted_before) {
    s.cached_prompt_tokens = std::min(start, s.prompt_length);
    s.admitted_before = true;
  }
  s.tenant->waiting.erase(&s);
  --waiting_count_;
  insert_running(s);
  pending_forks_ += static_cast<std::int64_t>(s.forks.size());
  plan.admitted.push_back(s.id);
  // Its copies back run beside this step: it computes (and forks) from the next one.
  if (config_.restores_overlap_step && restored > 0) return true;
  logits_budget -= shape.logits_count;
  if (!forks_now) {
    add_chunk(s, shape, plan);
    return true;
  }
  // Each choice computes the last prompt token in a block of its own, within the step's budget;
  // those that do not fit wait for the next step as running sequences.
  const std::size_t first_fork = plan.forked.size();
  fork(s, plan);
  std::int64_t left = budget;
  add_chunk(s, shape, plan);
  left -= shape.count;
  for (std::size_t f = first_fork; f < plan.forked.size() && left > 0; ++f, --left) {
    add_chunk(*sequences_.at(plan.forked[f].second), chunk_shape{.count = 1}, plan);
  }
  return true;
}

void scheduler::fork(sequence& s, step_plan& plan) {
  const std::int64_t point = s.prompt_length - 1;
  assert(s.computed == point);
  const std::int64_t shared = point / config_.block_size;
  const bool partial = point % config_.block_size != 0;
  const std::int64_t own = fork_own_blocks(s.prompt_length, s.max_tokens);
  if (static_cast<std::int64_t>(s.fork_blocks.size()) != own * static_cast<std::int64_t>(s.forks.size())) {
    accounting_bug(format("sequence {} holds {} blocks for {} forks of {} blocks each", s.id, s.fork_blocks.size(),
                          s.forks.size(), own));
  }
  auto next_block = s.fork_blocks.begin();
  for (const sequence_id id : s.forks) {
    auto c = std::make_unique<sequence>();
    c->id = id;
    c->tenant = s.tenant;
    c->priority = s.priority;
    c->arrival = next_arrival_++;
    c->prompt_length = s.prompt_length;
    c->max_tokens = s.max_tokens;
    c->tokens = s.tokens;
    c->computed = point;
    c->session = s.session;
    c->owner = s.owner;
    c->root = s.root;
    c->hashes.assign(s.hashes.begin(), s.hashes.begin() + std::min<std::ptrdiff_t>(static_cast<std::ptrdiff_t>(shared),
                                                                                 static_cast<std::ptrdiff_t>(s.hashes.size())));
    c->registered = std::min(s.registered, shared);
    c->cached_prompt_tokens = s.cached_prompt_tokens;
    c->admitted_before = true;
    for (std::int64_t j = 0; j < shared; ++j) {
      const std::int32_t b = s.blocks[static_cast<std::size_t>(j)];
      pool_.share(b);
      c->blocks.push_back(b);
    }
    c->blocks.insert(c->blocks.end(), next_block, next_block + own);
    next_block += own;
    if (partial) {
      plan.copies.push_back({.from = s.blocks[static_cast<std::size_t>(shared)],
                             .to = c->blocks[static_cast<std::size_t>(shared)]});
    }
    sequence& child = *c;
    sequences_.emplace(id, std::move(c));
    fork_ids_.erase(id);
    insert_running(child);
    plan.forked.emplace_back(s.id, id);
  }
  pending_forks_ -= static_cast<std::int64_t>(s.forks.size());
  s.forks.clear();
  s.fork_blocks.clear();
}

step_plan scheduler::schedule() {
  step_plan plan;
  if (tiers_ != nullptr) tiers_->begin_step();
  std::int64_t budget = config_.max_num_batched_tokens;
  std::int64_t logits_budget = config_.max_prompt_logits;

  // 1. Running sequences, in order; preemption takes from the back of the same order. A
  // sequence whose prompt is in the cache but for the last token forks first: its forks join
  // the running list after it (they arrive last) and get their chunks further on in this loop.
  for (std::size_t i = 0; i < running_.size();) {
    sequence& s = *running_[i];
    if (!s.forks.empty() && s.computed == compute_target(s)) fork(s, plan);
    const chunk_shape shape = next_chunk(s, s.computed, budget, logits_budget);
    if (shape.count == 0) {
      ++i;
      continue;
    }
    const std::int64_t needed = blocks_for(s.computed + shape.count) - static_cast<std::int64_t>(s.blocks.size());
    bool preempted_self = false;
    while (needed > pool_.free_blocks()) {
      // Only optimistic admission grows a sequence after admission.
      if (config_.admission != admission_policy::optimistic) {
        accounting_bug(format("sequence {} outgrew the blocks reserved at its admission", s.id));
      }
      sequence& victim = *running_.back();
      plan.preempted.push_back(victim.id);
      preempt(victim, plan);
      if (&victim == &s) {
        preempted_self = true;
        break;
      }
    }
    // Everything after s has been preempted before s itself was.
    if (preempted_self) break;
    for (std::int64_t n = 0; n < needed; ++n) {
      const auto block = pool_.allocate();
      if (!block) accounting_bug(format("growing sequence {} found fewer free blocks than counted", s.id));
      s.blocks.push_back(*block);
    }
    spill_evictions(plan);
    add_chunk(s, shape, plan);
    budget -= shape.count;
    logits_budget -= shape.logits_count;
    ++i;
  }

  // 2. Admission; not in a step that had to preempt, which would only thrash.
  if (plan.preempted.empty()) {
    std::uint64_t pick = 0;
    for (const auto& [name, t] : tenants_) pick = std::max(pick, t->last_picked);
    while (num_running() + pending_forks_ < config_.max_num_seqs && budget > 0) {
      tenant_state* tenant = next_tenant();
      if (tenant == nullptr) break;
      sequence& head = **tenant->waiting.begin();
      const std::int64_t before = plan.tokens;
      if (!try_admit(head, budget, logits_budget, plan)) break;
      tenant->last_picked = ++pick;
      budget -= plan.tokens - before;
    }
  }
  return plan;
}

void scheduler::step_failed() {
  if (tiers_ != nullptr) tiers_->step_failed();
}

void scheduler::complete(const step_plan& plan) {
  if (tiers_ != nullptr) tiers_->step_done();
  for (const scheduled_chunk& chunk : plan.chunks) {
    const auto it = sequences_.find(chunk.id);
    if (it == sequences_.end()) continue;
    sequence& s = *it->second;
    const auto count = static_cast<std::int64_t>(chunk.tokens.size());
    s.computed = chunk.start + count;
    counters_.computed_tokens += count;
    if (chunk.prompt_logits_count > 0) {
      s.prompt_logits_done =
          std::max(s.prompt_logits_done, chunk.start + chunk.prompt_logits_offset + chunk.prompt_logits_count);
    }
    if (config_.enable_prefix_caching) register_full_blocks(s);
  }
}

void scheduler::append_token(sequence_id id, std::int32_t token) {
  const auto it = sequences_.find(id);
  assert(it != sequences_.end());
  if (it == sequences_.end()) return;
  it->second->tokens.push_back(token);
}

std::optional<sequence_state> scheduler::state_of(sequence_id id) const {
  const auto it = sequences_.find(id);
  if (it == sequences_.end()) return std::nullopt;
  return it->second->state;
}

std::int64_t scheduler::cached_prompt_tokens(sequence_id id) const {
  const auto it = sequences_.find(id);
  return it == sequences_.end() ? 0 : it->second->cached_prompt_tokens;
}

std::int64_t scheduler::computed_tokens(sequence_id id) const {
  const auto it = sequences_.find(id);
  return it == sequences_.end() ? 0 : it->second->computed;
}

std::int64_t scheduler::sequence_length(sequence_id id) const {
  const auto it = sequences_.find(id);
  return it == sequences_.end() ? 0 : static_cast<std::int64_t>(it->second->tokens.size());
}

std::span<const std::int32_t> scheduler::block_table(sequence_id id) const {
  const auto it = sequences_.find(id);
  if (it == sequences_.end()) return {};
  return it->second->blocks;
}

std::span<const std::int32_t> scheduler::fork_blocks(sequence_id id) const {
  const auto it = sequences_.find(id);
  if (it == sequences_.end()) return {};
  return it->second->fork_blocks;
}

std::span<const std::int32_t> scheduler::tokens(sequence_id id) const {
  const auto it = sequences_.find(id);
  if (it == sequences_.end()) return {};
  return it->second->tokens;
}

std::int64_t scheduler::tokens_served(std::string_view tenant) const {
  const auto it = tenants_.find(tenant);
  return it == tenants_.end() ? 0 : it->second->tokens_served;
}

status scheduler::check_invariants() const {
  EDGE_RETURN_IF_ERROR(pool_.check_consistency());
  if (tiers_ != nullptr) EDGE_RETURN_IF_ERROR(tiers_->check_consistency());
  std::vector<std::int32_t> holders(static_cast<std::size_t>(pool_.total_blocks()), 0);
  // Per block, whether some holder may still write it: it lies at or past that holder's last
  // full computed block (a block several tables hold must be read-only for all of them).
  std::vector<bool> writable(static_cast<std::size_t>(pool_.total_blocks()), false);
  std::int64_t waiting = 0;
  std::int64_t pending_forks = 0;
  for (const auto& [id, s] : sequences_) {
    if (s->state == sequence_state::waiting) {
      ++waiting;
      if (!s->blocks.empty() || !s->fork_blocks.empty()) {
        return internal_error(format("waiting sequence {} holds {} blocks", id, s->blocks.size() + s->fork_blocks.size()));
      }
      continue;
    }
    pending_forks += static_cast<std::int64_t>(s->forks.size());
    if (static_cast<std::int64_t>(s->fork_blocks.size()) !=
        static_cast<std::int64_t>(s->forks.size()) * fork_own_blocks(s->prompt_length, s->max_tokens)) {
      return internal_error(format("sequence {} holds {} blocks for {} forks", id, s->fork_blocks.size(), s->forks.size()));
    }
    for (const std::int32_t b : s->fork_blocks) {
      if (b < 0 || b >= pool_.total_blocks()) return internal_error(format("sequence {} holds block {}", id, b));
      ++holders[static_cast<std::size_t>(b)];
      writable[static_cast<std::size_t>(b)] = true;
    }
    if (s->computed > static_cast<std::int64_t>(s->tokens.size())) {
      return internal_error(format("sequence {} computed {} of {} tokens", id, s->computed, s->tokens.size()));
    }
    if (static_cast<std::int64_t>(s->blocks.size()) < blocks_for(s->computed)) {
      return internal_error(format("sequence {} has {} blocks for {} computed tokens", id, s->blocks.size(), s->computed));
    }
    const std::int64_t read_only = s->computed / config_.block_size;
    for (std::size_t j = 0; j < s->blocks.size(); ++j) {
      const std::int32_t b = s->blocks[j];
      if (b < 0 || b >= pool_.total_blocks()) return internal_error(format("sequence {} holds block {}", id, b));
      ++holders[static_cast<std::size_t>(b)];
      if (static_cast<std::int64_t>(j) >= read_only) writable[static_cast<std::size_t>(b)] = true;
    }
  }
  if (pending_forks != pending_forks_) {
    return internal_error(format("{} forks are pending, counted {}", pending_forks, pending_forks_));
  }
  for (std::int64_t b = 0; b < pool_.total_blocks(); ++b) {
    const std::int32_t held = holders[static_cast<std::size_t>(b)];
    if (held != pool_.ref_count(static_cast<std::int32_t>(b))) {
      return internal_error(format("block {} is in {} block tables but has {} references", b, held,
                                   pool_.ref_count(static_cast<std::int32_t>(b))));
    }
    if (held > 1 && writable[static_cast<std::size_t>(b)]) {
      return internal_error(format("block {} is shared by {} sequences and one may still write it", b, held));
    }
  }
  if (waiting != waiting_count_) return internal_error(format("{} sequences wait, counted {}", waiting, waiting_count_));
  if (num_running() + pending_forks_ > config_.max_num_seqs) {
    return internal_error(format("{} sequences run and {} forks wait to, more than max_num_seqs {}", num_running(),
                                 pending_forks_, config_.max_num_seqs));
  }
  for (std::size_t i = 1; i < running_.size(); ++i) {
    if (by_priority_then_arrival{}(running_[i], running_[i - 1])) return internal_error("running list out of order");
  }
  return {};
}

}  // namespace edge::backend
