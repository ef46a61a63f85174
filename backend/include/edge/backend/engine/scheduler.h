// The continuous-batching scheduler: which sequences compute which tokens in the next step,
// admitted against the KV block pool. It knows token ids, lengths and blocks, not the model:
// the engine runs its plans on an executor, and the trace simulator (tests/bench) runs them on
// a cost model. Engine thread only.
//
// Every step (schedule()) works in two stages, as TensorRT-LLM's capacity and micro-batch
// schedulers do:
//
// 1. Running sequences first, in order (priority, then arrival). Each gets its next chunk: one
//    token when decoding, else as much of its prompt as the step's token budget allows, cut at
//    a block boundary unless it ends the prompt. When its blocks cannot grow (optimistic
//    admission only), the running sequence with the lowest priority and latest arrival is
//    preempted: its blocks are freed (full ones stay in the prefix cache) and it waits again,
//    to be recomputed from its prompt and the tokens it already generated.
// 2. Admission, unless this step preempted: the next waiting request is taken from the tenant
//    that has been served the fewest tokens per unit of weight (see tenant_order), if the blocks
//    it needs right away fit under the free blocks minus a watermark, within max_num_seqs and
//    the token budget. With `reserve`, it needs blocks for prompt + max_tokens up front, so it
//    never grows later and nothing is ever preempted; with `optimistic`, blocks for the tokens it
//    has now. A request that does not fit stops admission for this step: later, smaller ones do
//    not overtake it, so none waits forever.
//
// With prefix caching, admission first looks up the request's full blocks in the pool's cache
// (hash chain seeded by the request's tenant); blocks found are shared, not recomputed. At least
// the last prompt token is always computed, in a block of the sequence's own, so that shared
// blocks are never written. A sequence registers each block it has filled.
//
// With lower tiers (kv_tiers: host memory, and disk below it), full cached blocks that allocate()
// evicts are copied to a host slot first (step_plan::spills, under the tenant's caps), and
// admission looks a block up there when KV memory lacks it: a hit takes a fresh block whose
// contents are copied back (step_plan::restores) before the sequence reads it, registered in the
// prefix cache once the step is done. Cached tokens count hits from
// either. A sequence with a session (sequence_spec::session) marks its blocks to be kept: KV
// memory evicts them after every other free cached block.
//
// A request for several choices (OpenAI's n) is one sequence with forks: it is admitted with
// the blocks of all its choices (and a slot for each under max_num_seqs), computes its prompt
// but for the last token once, then forks: each further choice becomes a sequence of its own
// that shares the prompt's full blocks by reference count and gets a copy of the partly filled
// last one (step_plan::copies, done before the step's tokens are computed). From there on every
// choice computes the last prompt token in its own block and samples on its own; a choice
// preempted later is recomputed like any sequence.
//
// A sequence that asks for prompt logits (the prompt's own log probabilities) computes its whole
// prompt, bypassing the prefix cache, with a logits row for each position but the last; the rows
// of a step are bounded (scheduler_config::max_prompt_logits), so its prompt chunks are too, and
// a prompt recomputed after a preemption does not produce the rows already produced again.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "edge/backend/runtime/kv_block_pool.h"
#include "edge/backend/runtime/kv_tiers.h"
#include "edge/common/status.h"

namespace edge::backend {

using sequence_id = std::uint64_t;

enum class admission_policy {
  optimistic,  // blocks for the tokens a sequence has; grows per step; preempts by recompute (vLLM)
  reserve,     // blocks for prompt + max_tokens at admission; never preempts (TGI, TensorRT-LLM "no evict")
};

std::optional<admission_policy> parse_admission_policy(std::string_view name);
std::string_view to_string(admission_policy policy);

// How the next request to admit is chosen among tenants.
enum class tenant_order {
  // Weighted fair share: the backlogged tenant with the fewest tokens served per unit of weight
  // (deficit counters charged with the tokens each step schedules for the tenant, as in deficit
  // round robin with the quantum replaced by actual service, since output lengths are not known
  // at admission). A tenant that was idle starts from the least-served active tenant's count, so
  // idling earns no credit.
  fair_share,
  // Priority, then arrival, across all tenants: the baseline that fairness is measured against.
  first_come_first_served,
};

struct scheduler_config {
  std::int64_t block_size = 16;
  std::int64_t max_num_seqs = 256;             // running sequences at most
  std::int64_t max_num_batched_tokens = 2048;  // tokens computed per step at most
  admission_policy admission = admission_policy::optimistic;
  tenant_order order = tenant_order::fair_share;
  bool enable_prefix_caching = true;
  // Share of all blocks that admission leaves free, so that running sequences can grow a
  // little before anything is preempted (vLLM's default).
  double watermark = 0.01;
  std::int64_t max_model_len = 0;  // context: prompt + generated tokens at most; 0 = no limit
  // Prompt logits rows a step computes at most (the executor's bound); requests for prompt
  // logits are refused when it is under a block.
  std::int64_t max_prompt_logits = 0;
  // The executor copies a step's restores beside its compute (a GPU's copy stream), finished
  // before the next step computes: a sequence reading a block restored in a step computes from
  // the next step on. Otherwise the restores are done before the step computes.
  bool restores_overlap_step = false;
};

// What the scheduler needs to know about a request.
struct sequence_spec {
  sequence_id id = 0;
  std::string tenant = "default";  // also the prefix-cache salt
  double weight = 1.0;         // the tenant's share relative to other tenants (> 0)
  std::int32_t priority = 0;   // higher: admitted before, preempted after
  std::vector<std::int32_t> prompt;
  std::int64_t max_tokens = 16;       // per choice
  // The request's further choices (n > 1): the ids of the sequences this one forks into once its
  // prompt but the last token is computed. Unused ids, distinct from each other and from `id`.
  std::vector<sequence_id> forks;
  // Logits rows for every prompt position but the last, in order (scheduled_chunk's window).
  bool prompt_logits = false;
  // The request names a session (an agent's conversation): keep its blocks over others.
  bool session = false;
  // What the tenant's blocks may take in the lower tiers (the latest request's caps count).
  tier_caps caps;
};

enum class sequence_state { waiting, running };

// One sequence's work in a step. `tokens` and `block_table` point into the scheduler's state:
// valid until the next call that changes it (complete, append_token, remove, schedule).
struct scheduled_chunk {
  sequence_id id = 0;
  std::int64_t start = 0;                     // position of the first token computed
  std::span<const std::int32_t> tokens;       // [count] tokens computed in this step
  std::span<const std::int32_t> block_table;  // blocks covering positions [0, start + count)
  bool samples = false;                       // reaches the sequence's end: sample its next token
  // Prompt logits rows: for tokens [prompt_logits_offset, + prompt_logits_count) of `tokens`,
  // each the logits that predict the prompt token after it.
  std::int64_t prompt_logits_offset = 0;
  std::int64_t prompt_logits_count = 0;
};

struct step_plan {
  std::vector<scheduled_chunk> chunks;
  std::vector<sequence_id> admitted;   // moved from waiting to running in this step
  std::vector<sequence_id> preempted;  // moved from running back to waiting in this step
  // (sequence, the fork it split off in this step): a new running sequence whose chunk, when it
  // has one, is in `chunks`.
  std::vector<std::pair<sequence_id, sequence_id>> forked;
  std::vector<block_copy> copies;      // to do before the chunks are computed
  // KV block → host tier slot: blocks evicted in this step, copied before anything else.
  std::vector<tier_copy> spills;
  // Host tier slot → KV block, after the spills and before `copies` (or beside the step's
  // compute, with restores_overlap_step).
  std::vector<tier_copy> restores;
  std::int64_t tokens = 0;             // sum of the chunks' sizes

  bool empty() const { return chunks.empty(); }
};

// Counters since construction.
struct scheduler_counters {
  std::int64_t preemptions = 0;
  std::int64_t prefix_queries = 0;  // tokens looked up in the prefix cache at admission
  std::int64_t prefix_hits = 0;     // of those, tokens found (in KV memory or a lower tier)
  std::int64_t host_tier_hits = 0;  // of those, tokens copied back from a host slot (read from disk first or not)
  std::int64_t spilled_blocks = 0;  // evicted blocks copied to the host tier
  std::int64_t restored_blocks = 0; // blocks copied back from it
  std::int64_t computed_tokens = 0; // tokens scheduled and completed
};

class scheduler {
 public:
  // invalid_argument for an inconsistent configuration.
  // `tiers`, when given, are the tiers below `pool` (they outlive the scheduler).
  static result<std::unique_ptr<scheduler>> create(const scheduler_config& config, kv_block_pool& pool,
                                                   kv_tiers* tiers = nullptr);
  // Returns every block still held to the pool.
  ~scheduler();
  scheduler(const scheduler&) = delete;
  scheduler& operator=(const scheduler&) = delete;

  const scheduler_config& config() const { return config_; }

  // Whether a request of this shape can ever run: its blocks (every choice at its longest) fit
  // the pool under the watermark, its choices fit max_num_seqs, and its prompt fits the context.
  // Thread-safe: reads only what never changes.
  status check_fits(std::int64_t prompt_tokens, std::int64_t max_tokens, std::int64_t choices = 1) const;

  // Queues a request. invalid_argument / out_of_range as check_fits, for a duplicate id (forks
  // included), or for prompt logits when a step computes fewer rows than a block.
  status add(sequence_spec spec);
  // Removes a sequence wherever it is and frees its blocks (a sequence not forked yet gives up
  // its forks too). False when the id is unknown (a fork not split off yet is unknown).
  bool remove(sequence_id id);

  // Plans the next step and allocates the blocks it needs.
  step_plan schedule();
  // The executor ran `plan` (the latest schedule()): its tokens' K/V are in the cache.
  void complete(const step_plan& plan);
  // The executor failed to run `plan` (the latest schedule()): what it was to copy to the host
  // tier is not there. (Its sequences are ended by the caller.)
  void step_failed();
  // The token sampled for a sequence whose chunk had `samples`.
  void append_token(sequence_id id, std::int32_t token);

  std::int64_t num_running() const { return static_cast<std::int64_t>(running_.size()); }
  std::int64_t num_waiting() const { return waiting_count_; }
  bool idle() const { return sequences_.empty(); }
  bool contains(sequence_id id) const { return sequences_.contains(id); }
  std::optional<sequence_state> state_of(sequence_id id) const;
  // Prompt tokens found in the prefix cache when the sequence was first admitted.
  std::int64_t cached_prompt_tokens(sequence_id id) const;
  // Tokens whose K/V are in the cache, and the sequence's length (prompt + generated).
  std::int64_t computed_tokens(sequence_id id) const;
  std::int64_t sequence_length(sequence_id id) const;
  std::span<const std::int32_t> block_table(sequence_id id) const;
  // The blocks a sequence holds for the forks it has not split off yet (empty otherwise).
  std::span<const std::int32_t> fork_blocks(sequence_id id) const;
  // Its tokens: the prompt, then what it generated.
  std::span<const std::int32_t> tokens(sequence_id id) const;

  const scheduler_counters& counters() const { return counters_; }
  // Tokens scheduled for a tenant (prefill, recompute and decode) since it last had no request
  // here: a tenant with nothing queued or running is forgotten, and counts 0.
  std::int64_t tokens_served(std::string_view tenant) const;

  // Block accounting across the pool and every block table: internal on any mismatch. For
  // tests; linear in blocks and sequences.
  status check_invariants() const;

 private:
  struct tenant_state;
  struct sequence;
  struct by_priority_then_arrival {
    bool operator()(const sequence* a, const sequence* b) const;
  };

  scheduler(const scheduler_config& config, kv_block_pool& pool, kv_tiers* tiers);

  // What a sequence computes next: `count` tokens from its `computed`, with a window of prompt
  // logits rows.
  struct chunk_shape {
    std::int64_t count = 0;
    std::int64_t logits_offset = 0;
    std::int64_t logits_count = 0;
  };

  std::int64_t blocks_for(std::int64_t tokens) const { return (tokens + config_.block_size - 1) / config_.block_size; }
  // Tokens a sequence with `computed` of `length` tokens in the cache computes under `budget`.
  std::int64_t chunk_for(std::int64_t computed, std::int64_t length, std::int64_t budget) const;
  // Where the sequence's computing stops for now: before its last prompt token while it has
  // forks to split off, else its end.
  std::int64_t compute_target(const sequence& s) const;
  // Its next chunk from `computed` under `budget` tokens and `logits_budget` prompt logits rows.
  chunk_shape next_chunk(const sequence& s, std::int64_t computed, std::int64_t budget, std::int64_t logits_budget) const;
  // Appends the chunk to the plan and charges its tenant.
  void add_chunk(sequence& s, const chunk_shape& shape, step_plan& plan);
  // Longest sequence a request may reach (prompt + max_tokens within the context).
  std::int64_t longest(std::int64_t prompt_tokens, std::int64_t max_tokens) const;
  // Blocks each fork takes for itself when it splits off.
  std::int64_t fork_own_blocks(std::int64_t prompt_tokens, std::int64_t max_tokens) const;
  std::int64_t admission_blocks(const sequence& s) const;
  // A prompt block found at admission: in KV memory (block), or in the host tier (slot).
  struct prefix_hit {
    std::int32_t block = -1;
    std::int32_t slot = -1;
  };
  bool owes_prompt_logits(const sequence& s) const;
  tenant_state* next_tenant();
  void charge(tenant_state& t, std::int64_t tokens);
  bool try_admit(sequence& s, std::int64_t budget, std::int64_t& logits_budget, step_plan& plan);
  // Splits the forks off `s` (its prompt but the last token is in the cache).
  void fork(sequence& s, step_plan& plan);
  void preempt(sequence& s, step_plan& plan);
  void release_blocks(sequence& s);
  void enqueue_waiting(sequence& s);
  void insert_running(sequence& s);
  const block_hash& block_hash_at(sequence& s, std::int64_t block);
  void register_full_blocks(sequence& s);
  // Copies the blocks allocate() evicted into the host tier (plan.spills), under their owners' caps.
  void spill_evictions(step_plan& plan);
  void activate(tenant_state& t);
  bool active(const tenant_state& t) const;

  scheduler_config config_;
  kv_block_pool& pool_;
  std::int64_t watermark_blocks_ = 0;
  std::uint64_t next_arrival_ = 0;
  std::unordered_map<sequence_id, std::unique_ptr<sequence>> sequences_;
  std::map<std::string, std::unique_ptr<tenant_state>, std::less<>> tenants_;
  std::vector<sequence*> running_;  // by priority, then arrival: preemption takes from the back
  std::int64_t waiting_count_ = 0;
  // Forks of running sequences not split off yet: each holds a max_num_seqs slot already.
  std::int64_t pending_forks_ = 0;
  std::unordered_set<sequence_id> fork_ids_;  // ids of every fork not split off yet
  kv_tiers* tiers_ = nullptr;
  scheduler_counters counters_;
};

}  // namespace edge::backend
