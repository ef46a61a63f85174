#include "edge/backend/runtime/cpu_executor.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>

#include "edge/backend/runtime/forward.h"
#include "edge/backend/runtime/sampler.h"
#include "edge/common/format.h"
#include "edge/common/thread_pool.h"

namespace edge::backend {
namespace {

// Host placement: matrices and the embedding are used in place; f32 vectors are kept here.
class host_placement final : public weight_placement {
 public:
  result<kernels::weight_view> matrix(const weight_matrix& w) override { return w.view(); }
  result<std::optional<kernels::weight_view>> stack(std::span<const weight_matrix* const>) override {
    return std::optional<kernels::weight_view>{};
  }
  result<const float*> floats(std::span<const float> values) override {
    if (values.empty()) return static_cast<const float*>(nullptr);
    return kept_.emplace_back(values.begin(), values.end()).data();
  }
  result<const void*> elements(const tensor_view& t) override { return static_cast<const void*>(t.data); }
  result<const kernels::moe_expert_weights*> expert_views(std::span<const kernels::moe_expert_weights>) override {
    return static_cast<const kernels::moe_expert_weights*>(nullptr);  // the CPU reads the host array
  }

  // Moved into the executor, so that the pointers handed out stay valid.
  std::deque<std::vector<float>> kept_;
};

}  // namespace

struct cpu_executor::state {
  const model& m;
  kv_cache& cache;
  kernels::stream stream;
  cpu_executor_options options;
  model_plan plan;
  forward_weights weights;
  std::deque<std::vector<float>> weight_vectors;  // what weights' norms, biases and RoPE tables point into
  std::int64_t table_blocks = 0;  // the most blocks one sequence's table holds
  std::int64_t prompt_rows = 0;   // prompt logits rows a step takes at most

  // Step buffers, sized for options.max_batch_tokens tokens and sequences + prompt_rows logits
  // rows: `buffers` points into buffer_memory (zeroed; aligned at forward_buffer_alignment).
  // buffers.logits holds forward_sample's rows; forward writes the caller's.
  std::vector<std::byte> buffer_memory;
  forward_buffers buffers;
  std::int64_t last_tokens = 0;                        // of the last step
  std::vector<kernels::sampling_row> sampling;         // [sequences]
  std::vector<kernels::logit_bias> biases;             // [sequences * max_logit_bias_entries] room
  std::vector<std::int32_t> sampled;                   // [sequences]
  std::vector<std::uint32_t> allowed;                  // [constrained rows, allowed_words(vocab)]
  std::vector<std::int32_t> ids, positions, seq;       // [tokens]
  std::vector<std::int64_t> slots;                     // [tokens]
  // The host tier: [host_tier_slots, bytes_per_block] packed blocks (allocate_host_tier).
  std::unique_ptr<std::byte[]> host_tier;
  std::int64_t host_tier_slots = 0;
  std::vector<double> copy_back_seconds;  // per step with restores, until taken
  std::vector<std::int32_t> tables;                    // [sequences * table_blocks] room, ragged
  std::vector<std::int32_t> table_begin;               // [sequences + 1]
  std::vector<std::int32_t> seq_begin;                 // [sequences + 1]
  std::vector<std::int64_t> last_token;                // [sequences + prompt_rows]

  state(const model& model_, kv_cache& cache_, thread_pool* pool, const cpu_executor_options& opts)
      : m(model_), cache(cache_), stream{kernels::device::cpu, pool, nullptr}, options(opts) {}

  // Stages and runs the plan, its logits rows into `logits_out` ([rows, vocab]).
  status run(const batch_plan& batch, float* logits_out);
  // The plan's host tier copies: spills, then restores (before the step computes).
  status copy_tiers(const batch_plan& batch);
};

cpu_executor::cpu_executor(std::unique_ptr<state> s) : state_(std::move(s)) {}
cpu_executor::~cpu_executor() = default;

std::int64_t cpu_executor::max_batch_tokens() const { return state_->options.max_batch_tokens; }
std::int64_t cpu_executor::max_sequences() const { return state_->options.max_sequences; }
std::int64_t cpu_executor::vocab_size() const { return state_->plan.vocab; }
std::int64_t cpu_executor::max_prompt_logits_rows() const { return state_->prompt_rows; }
const kv_cache_layout& cpu_executor::kv_layout() const { return state_->cache.layout(); }

result<std::unique_ptr<cpu_executor>> cpu_executor::create(const model& m, kv_cache& cache, thread_pool* pool,
                                                           const cpu_executor_options& options) {
  const model_config& c = m.config;
  const kv_cache_layout& layout = cache.layout();
  if (!layout.same_rows(kv_cache_layout::rows_of(c))) {
    return invalid_argument("the KV cache layout does not match the model");
  }
  if (options.max_batch_tokens <= 0 || options.max_sequences <= 0) {
    return invalid_argument("max_batch_tokens and max_sequences must be positive");
  }
  auto s = std::make_unique<state>(m, cache, pool, options);
  EDGE_ASSIGN_OR_RETURN(s->plan, plan_model(c));
  host_placement place;
  EDGE_ASSIGN_OR_RETURN(s->weights, place_weights(m, s->plan, place));
  s->weight_vectors = std::move(place.kept_);
  s->table_blocks = max_table_blocks(s->plan, layout.block_size);

  const auto tokens = options.max_batch_tokens;
  const auto sequences = options.max_sequences;
  s->prompt_rows = prompt_logits_rows_per_step(layout.block_size);
  const forward_buffer_shape shape{.tokens = tokens,
                                   .logits_rows = sequences + s->prompt_rows,
                                   .context = s->table_blocks * layout.block_size,
                                   .where = kernels::device::cpu};
  const std::size_t bytes = forward_buffer_bytes(s->plan, shape);
  s->buffer_memory.resize(bytes + forward_buffer_alignment - 1);
  void* base = s->buffer_memory.data();
  std::size_t room = s->buffer_memory.size();
  std::align(forward_buffer_alignment, bytes, base, room);
  s->buffers = carve_forward_buffers(s->plan, shape, static_cast<std::byte*>(base));
  const auto size = [](std::int64_t n) { return static_cast<std::size_t>(n); };
  s->sampling.resize(size(sequences));
  s->biases.resize(size(sequences * max_logit_bias_entries));
  s->sampled.resize(size(sequences));
  s->ids.resize(size(tokens));
  s->positions.resize(size(tokens));
  s->seq.resize(size(tokens));
  s->slots.resize(size(tokens));
  s->tables.resize(size(sequences * s->table_blocks));
  s->table_begin.resize(size(sequences + 1));
  s->seq_begin.resize(size(sequences + 1));
  s->last_token.resize(size(sequences + s->prompt_rows));
  return std::unique_ptr<cpu_executor>(new cpu_executor(std::move(s)));
}

status cpu_executor::state::copy_tiers(const batch_plan& batch) {
  EDGE_RETURN_IF_ERROR(check_tier_copies(batch, cache.layout().num_blocks, host_tier_slots));
  const std::size_t bytes = cache.layout().bytes_per_block();
  const auto slot = [&](std::int32_t s) { return std::span(host_tier.get() + static_cast<std::size_t>(s) * bytes, bytes); };
  for (const tier_copy& c : batch.spills) pack_kv_block(cache.view(), c.block, slot(c.slot));
  if (batch.restores.empty()) return {};
  const auto started = std::chrono::steady_clock::now();
  for (const tier_copy& c : batch.restores) unpack_kv_block(cache.view(), slot(c.slot), c.block);
  copy_back_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  return {};
}

void cpu_executor::take_copy_back_seconds(std::vector<double>& out) {
  out.insert(out.end(), state_->copy_back_seconds.begin(), state_->copy_back_seconds.end());
  state_->copy_back_seconds.clear();
}

result<std::span<std::byte>> cpu_executor::allocate_host_tier(std::int64_t slots) {
  state& s = *state_;
  if (s.host_tier) return failed_precondition("the host tier is allocated already");
  if (slots < 1) return invalid_argument(format("a host tier of {} blocks", slots));
  const std::size_t bytes = static_cast<std::size_t>(slots) * s.cache.layout().bytes_per_block();
  // Not value-initialised: pages are committed as spills first touch them.
  s.host_tier.reset(new (std::nothrow) std::byte[bytes]);
  if (!s.host_tier) return resource_exhausted(format("cannot allocate {} for the host KV tier", format_bytes(bytes)));
  s.host_tier_slots = slots;
  return std::span(s.host_tier.get(), bytes);
}

status cpu_executor::state::run(const batch_plan& batch, float* logits_out) {
  EDGE_RETURN_IF_ERROR(check_batch_limits(batch, options.max_batch_tokens, options.max_sequences, prompt_rows));
  const step_arrays arrays{.ids = ids.data(), .positions = positions.data(), .seq = seq.data(), .slots = slots.data(),
                           .block_tables = tables.data(), .table_begin = table_begin.data(),
                           .seq_begin = seq_begin.data(), .last_token = last_token.data()};
  EDGE_ASSIGN_OR_RETURN(const staged_step staged,
                        stage_step(batch, 0, plan.vocab, cache.layout(), table_blocks, 0, arrays));
  const forward_step step{.ids = ids.data(), .positions = positions.data(), .seq = seq.data(), .slots = slots.data(),
                          .block_tables = tables.data(), .table_begin = table_begin.data(),
                          .seq_begin = seq_begin.data(), .last_token = last_token.data(), .tokens = staged.tokens,
                          .seqs = staged.seqs, .rows = staged.rows, .max_run = staged.max_run, .copies = batch.copies};
  forward_buffers step_buffers = buffers;
  step_buffers.logits = logits_out;
  last_tokens = staged.tokens;
  return run_forward(plan, weights, step_buffers, step, cache.view(), stream);
}

expert_routing cpu_executor::last_routing() const {
  const state& s = *state_;
  const std::int64_t layers = s.plan.moe_layers();
  if (layers == 0 || s.last_tokens == 0) return {};
  const std::int64_t top_k = s.plan.max_top_k();
  const std::int64_t experts = s.plan.max_experts();
  return {.moe_layers = layers,
          .tokens = s.last_tokens,
          .top_k = top_k,
          .experts = experts,
          .choices = std::span<const std::int32_t>(s.buffers.route_experts,
                                                   static_cast<std::size_t>(layers * s.last_tokens * top_k)),
          .expert_tokens = std::span<const std::int32_t>(s.buffers.expert_tokens,
                                                         static_cast<std::size_t>(layers * experts))};
}

status cpu_executor::forward(const batch_plan& plan, std::span<float> logits) {
  state& s = *state_;
  EDGE_RETURN_IF_ERROR(s.copy_tiers(plan));
  if (plan.total_tokens() == 0) return {};
  EDGE_RETURN_IF_ERROR(check_logits_buffer(plan, logits, s.plan.vocab));
  return s.run(plan, logits.data());
}

status cpu_executor::forward_sample(const batch_plan& plan, std::span<const row_sampling> rows,
                                    std::span<std::int32_t> tokens, std::span<float> logits,
                                    const mask_filler& fill_masks) {
  state& s = *state_;
  const std::int64_t vocab = s.plan.vocab;
  EDGE_RETURN_IF_ERROR(check_sampling_args(plan, rows, tokens, logits, vocab));
  EDGE_RETURN_IF_ERROR(s.copy_tiers(plan));
  if (plan.total_tokens() == 0) return {};
  EDGE_RETURN_IF_ERROR(s.run(plan, s.buffers.logits));
  // The forward pass has had every core: the masks come after it.
  if (fill_masks) fill_masks();
  // Raw rows first: sampling uses its rows as scratch. Then the prompt logits rows, which follow
  // the sampled ones.
  const auto row_floats = static_cast<std::size_t>(vocab);
  std::size_t copied = 0;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    if (!rows[r].copy_logits) continue;
    std::memcpy(logits.data() + copied * row_floats, s.buffers.logits + r * row_floats, row_floats * sizeof(float));
    ++copied;
  }
  const auto prompt_rows = static_cast<std::size_t>(plan.prompt_logits_rows());
  if (prompt_rows > 0) {
    std::memcpy(logits.data() + copied * row_floats, s.buffers.logits + rows.size() * row_floats,
                prompt_rows * row_floats * sizeof(float));
  }
  // Rows the caller samples get a greedy draw here that nobody reads.
  const auto n = static_cast<std::int64_t>(rows.size());
  EDGE_ASSIGN_OR_RETURN(const staged_sampling staged,
                        stage_sampling(rows, n, vocab, {.config = s.sampling.data(), .biases = s.biases.data()}));
  s.allowed.clear();
  for (const std::span<const std::uint32_t> mask : staged.masks) {
    s.allowed.insert(s.allowed.end(), mask.begin(), mask.end());
  }
  EDGE_RETURN_IF_ERROR(kernels::run_sampling({.logits = s.buffers.logits,
                                              .config = s.sampling.data(),
                                              .out = s.sampled.data(),
                                              .rows = n,
                                              .vocab = vocab,
                                              .biases = s.biases.data(),
                                              .allowed = s.allowed.data()},
                                             s.stream));
  for (std::size_t r = 0; r < rows.size(); ++r) {
    if (rows[r].sample) tokens[r] = s.sampled[r];
  }
  return {};
}

}  // namespace edge::backend
