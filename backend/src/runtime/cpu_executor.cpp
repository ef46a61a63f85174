#include "edge/backend/runtime/cpu_executor.h"

#include <algorithm>
#include <cmath>

#include "edge/common/format.h"
#include "edge/common/thread_pool.h"
#include "kernels/cpu/load.h"
#include "kernels/embedding/embedding.h"
#include "kernels/kv_cache_write/kv_cache_write.h"
#include "kernels/matmul/matmul.h"
#include "kernels/paged_attention/paged_attention.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/silu_mul/silu_mul.h"

namespace edge::backend {
namespace {

using kernels::dtype;

std::vector<float> to_floats(const tensor_view& t) {
  std::vector<float> out(static_cast<std::size_t>(t.elements()));
  kernels::cpu::convert_to_float(t.type, t.data, t.elements(), out.data());
  return out;
}

std::vector<float> optional_floats(const tensor_view& t) { return t.present() ? to_floats(t) : std::vector<float>{}; }

// A tensor_view or a weight_matrix.
template <class Tensor>
status check_shape(const Tensor& t, std::initializer_list<std::int64_t> expected) {
  if (!t.present()) return invalid_argument(format("tensor {} is missing", t.name));
  const std::vector<std::int64_t> want(expected);
  if (t.shape != want) {
    std::string have;
    for (auto d : t.shape) have += (have.empty() ? "" : ", ") + std::to_string(d);
    std::string need;
    for (auto d : want) need += (need.empty() ? "" : ", ") + std::to_string(d);
    return invalid_argument(format("tensor {} has shape [{}], expected [{}]", t.name, have, need));
  }
  return {};
}

// Layer weights widened to float where they are small (norms, biases).
struct layer_vectors {
  std::vector<float> attn_norm;  // [hidden]
  std::vector<float> ffn_norm;   // [hidden]
  std::vector<float> bq;         // [q_dim] or empty
  std::vector<float> bk;         // [kv_dim] or empty
  std::vector<float> bv;         // [kv_dim] or empty
};

const float* data_or_null(const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); }

}  // namespace

struct cpu_executor::state {
  const model& m;
  kv_cache& cache;
  kernels::stream stream;
  cpu_executor_options options;

  // Dimensions.
  std::int64_t hidden, q_dim, kv_dim, inter, vocab, heads, kv_heads, head_dim, block_size, max_table;

  std::vector<layer_vectors> layers;
  std::vector<float> final_norm;  // [hidden]
  std::vector<float> inv_freq;    // [head_dim / 2]
  kernels::rope_pairs rope_pairs;

  // Step buffers, sized for options.max_batch_tokens tokens and options.max_sequences entries.
  std::vector<float> x;       // [tokens, hidden] the residual stream
  std::vector<float> xn;      // [tokens, hidden] normalised
  std::vector<float> q;       // [tokens, q_dim]
  std::vector<float> k;       // [tokens, kv_dim]
  std::vector<float> v;       // [tokens, kv_dim]
  std::vector<float> attn;    // [tokens, q_dim]
  std::vector<float> gate;    // [tokens, inter]
  std::vector<float> up;      // [tokens, inter]
  std::vector<float> last;    // [sequences, hidden] rows that produce logits
  std::vector<std::int32_t> ids;        // [tokens]
  std::vector<std::int32_t> positions;  // [tokens]
  std::vector<std::int32_t> seq;        // [tokens]
  std::vector<std::int64_t> slots;      // [tokens]
  std::vector<std::int32_t> tables;     // [sequences, max_table]
  std::vector<std::int64_t> last_token; // [sequences] token index of each logits row

  state(const model& model_, kv_cache& cache_, thread_pool* pool, const cpu_executor_options& opts)
      : m(model_), cache(cache_), stream{kernels::device::cpu, pool, nullptr}, options(opts) {}

  status step_layer(std::int64_t layer, std::int64_t tokens);
};

cpu_executor::cpu_executor(std::unique_ptr<state> s) : state_(std::move(s)) {}
cpu_executor::~cpu_executor() = default;

std::int64_t cpu_executor::max_batch_tokens() const { return state_->options.max_batch_tokens; }
std::int64_t cpu_executor::max_sequences() const { return state_->options.max_sequences; }
std::int64_t cpu_executor::vocab_size() const { return state_->vocab; }

result<std::unique_ptr<cpu_executor>> cpu_executor::create(const model& m, kv_cache& cache, thread_pool* pool,
                                                           const cpu_executor_options& options) {
  const model_config& c = m.config;
  const kv_cache_layout& layout = cache.layout();
  if (layout.num_layers != c.num_layers || layout.num_kv_heads != c.num_kv_heads || layout.head_dim != c.head_dim) {
    return invalid_argument("the KV cache layout does not match the model");
  }
  if (options.max_batch_tokens <= 0 || options.max_sequences <= 0) {
    return invalid_argument("max_batch_tokens and max_sequences must be positive");
  }
  auto s = std::make_unique<state>(m, cache, pool, options);
  s->hidden = c.hidden_size;
  s->heads = c.num_heads;
  s->kv_heads = c.num_kv_heads;
  s->head_dim = c.head_dim;
  s->q_dim = c.num_heads * c.head_dim;
  s->kv_dim = c.num_kv_heads * c.head_dim;
  s->inter = c.intermediate_size;
  s->vocab = c.vocab_size;
  s->block_size = layout.block_size;
  s->max_table = (std::max<std::int64_t>(c.max_position, 1) + layout.block_size - 1) / layout.block_size;

  const model_weights& w = m.weights;
  EDGE_RETURN_IF_ERROR(check_shape(w.token_embedding, {s->vocab, s->hidden}));
  EDGE_RETURN_IF_ERROR(check_shape(w.lm_head, {s->vocab, s->hidden}));
  EDGE_RETURN_IF_ERROR(check_shape(w.final_norm, {s->hidden}));
  if (static_cast<std::int64_t>(w.layers.size()) != c.num_layers) {
    return invalid_argument(format("model has {} layers of weights, config says {}", w.layers.size(), c.num_layers));
  }
  for (const layer_weights& l : w.layers) {
    EDGE_RETURN_IF_ERROR(check_shape(l.attn_norm, {s->hidden}));
    EDGE_RETURN_IF_ERROR(check_shape(l.wq, {s->q_dim, s->hidden}));
    EDGE_RETURN_IF_ERROR(check_shape(l.wk, {s->kv_dim, s->hidden}));
    EDGE_RETURN_IF_ERROR(check_shape(l.wv, {s->kv_dim, s->hidden}));
    EDGE_RETURN_IF_ERROR(check_shape(l.wo, {s->hidden, s->q_dim}));
    EDGE_RETURN_IF_ERROR(check_shape(l.ffn_norm, {s->hidden}));
    EDGE_RETURN_IF_ERROR(check_shape(l.w_gate, {s->inter, s->hidden}));
    EDGE_RETURN_IF_ERROR(check_shape(l.w_up, {s->inter, s->hidden}));
    EDGE_RETURN_IF_ERROR(check_shape(l.w_down, {s->hidden, s->inter}));
    if (c.qkv_bias) {
      EDGE_RETURN_IF_ERROR(check_shape(l.bq, {s->q_dim}));
      EDGE_RETURN_IF_ERROR(check_shape(l.bk, {s->kv_dim}));
      EDGE_RETURN_IF_ERROR(check_shape(l.bv, {s->kv_dim}));
    }
    s->layers.push_back({to_floats(l.attn_norm), to_floats(l.ffn_norm), optional_floats(l.bq), optional_floats(l.bk),
                         optional_floats(l.bv)});
  }
  s->final_norm = to_floats(w.final_norm);

  std::optional<kernels::rope_llama3_scaling> scaling;
  if (c.rope_scaling) {
    scaling = kernels::rope_llama3_scaling{c.rope_scaling->factor, c.rope_scaling->low_freq_factor,
                                           c.rope_scaling->high_freq_factor,
                                           static_cast<double>(c.rope_scaling->original_max_position)};
  }
  s->inv_freq = kernels::rope_inv_freq(c.head_dim, c.rope_theta, scaling);
  s->rope_pairs = c.rope == rope_layout::adjacent_pairs ? kernels::rope_pairs::adjacent : kernels::rope_pairs::half_split;

  const auto tokens = static_cast<std::size_t>(options.max_batch_tokens);
  const auto sequences = static_cast<std::size_t>(options.max_sequences);
  s->x.resize(tokens * static_cast<std::size_t>(s->hidden));
  s->xn.resize(s->x.size());
  s->q.resize(tokens * static_cast<std::size_t>(s->q_dim));
  s->k.resize(tokens * static_cast<std::size_t>(s->kv_dim));
  s->v.resize(s->k.size());
  s->attn.resize(s->q.size());
  s->gate.resize(tokens * static_cast<std::size_t>(s->inter));
  s->up.resize(s->gate.size());
  s->last.resize(sequences * static_cast<std::size_t>(s->hidden));
  s->ids.resize(tokens);
  s->positions.resize(tokens);
  s->seq.resize(tokens);
  s->slots.resize(tokens);
  s->tables.resize(sequences * static_cast<std::size_t>(s->max_table));
  s->last_token.resize(sequences);
  return std::unique_ptr<cpu_executor>(new cpu_executor(std::move(s)));
}

status cpu_executor::state::step_layer(std::int64_t layer, std::int64_t tokens) {
  const layer_weights& w = m.weights.layers[static_cast<std::size_t>(layer)];
  const layer_vectors& lv = layers[static_cast<std::size_t>(layer)];

  EDGE_RETURN_IF_ERROR(kernels::run_rmsnorm({.x = x.data(), .weight = lv.attn_norm.data(), .out = xn.data(),
                                             .rows = tokens, .cols = hidden, .x_stride = hidden,
                                             .out_stride = hidden, .eps = static_cast<float>(m.config.rms_norm_eps)},
                                            stream));
  const auto project = [&](const weight_matrix& weight, const std::vector<float>& bias, std::vector<float>& out,
                           std::int64_t n) {
    return kernels::run_matmul({.x = xn.data(), .w = weight.view(), .bias = data_or_null(bias),
                                .y = out.data(), .tokens = tokens, .n = n, .k = hidden, .x_stride = hidden,
                                .y_stride = n},
                               stream);
  };
  EDGE_RETURN_IF_ERROR(project(w.wq, lv.bq, q, q_dim));
  EDGE_RETURN_IF_ERROR(project(w.wk, lv.bk, k, kv_dim));
  EDGE_RETURN_IF_ERROR(project(w.wv, lv.bv, v, kv_dim));

  EDGE_RETURN_IF_ERROR(kernels::run_rope({.x = q.data(), .positions = positions.data(), .inv_freq = inv_freq.data(),
                                          .tokens = tokens, .heads = heads, .head_dim = head_dim, .x_stride = q_dim,
                                          .pairs = rope_pairs},
                                         stream));
  EDGE_RETURN_IF_ERROR(kernels::run_rope({.x = k.data(), .positions = positions.data(), .inv_freq = inv_freq.data(),
                                          .tokens = tokens, .heads = kv_heads, .head_dim = head_dim,
                                          .x_stride = kv_dim, .pairs = rope_pairs},
                                         stream));

  const kv_cache_layout& layout = cache.layout();
  EDGE_RETURN_IF_ERROR(kernels::run_kv_cache_write(
      {.k = k.data(), .v = v.data(), .k_cache = cache.keys(layer), .v_cache = cache.values(layer),
       .k_scales = cache.key_scales(layer), .v_scales = cache.value_scales(layer), .kv_type = layout.dtype,
       .slots = slots.data(), .tokens = tokens, .num_kv_heads = kv_heads,
       .head_dim = head_dim, .block_size = block_size, .num_blocks = layout.num_blocks, .kv_stride = kv_dim},
      stream));
  EDGE_RETURN_IF_ERROR(kernels::run_paged_attention(
      {.q = q.data(), .out = attn.data(), .k_cache = cache.keys(layer), .v_cache = cache.values(layer),
       .k_scales = cache.key_scales(layer), .v_scales = cache.value_scales(layer), .kv_type = layout.dtype,
       .seq = seq.data(), .pos = positions.data(), .block_tables = tables.data(),
       .tokens = tokens, .num_heads = heads, .num_kv_heads = kv_heads, .head_dim = head_dim,
       .block_size = block_size, .num_blocks = layout.num_blocks, .block_table_stride = max_table,
       .q_stride = q_dim, .out_stride = q_dim, .scale = 1.0f / std::sqrt(static_cast<float>(head_dim))},
      stream));
  // x += attn · woᵀ
  EDGE_RETURN_IF_ERROR(kernels::run_matmul({.x = attn.data(), .w = w.wo.view(), .y = x.data(),
                                            .tokens = tokens, .n = hidden, .k = q_dim, .x_stride = q_dim,
                                            .y_stride = hidden, .accumulate = true},
                                           stream));

  EDGE_RETURN_IF_ERROR(kernels::run_rmsnorm({.x = x.data(), .weight = lv.ffn_norm.data(), .out = xn.data(),
                                             .rows = tokens, .cols = hidden, .x_stride = hidden,
                                             .out_stride = hidden, .eps = static_cast<float>(m.config.rms_norm_eps)},
                                            stream));
  const std::vector<float> no_bias;
  EDGE_RETURN_IF_ERROR(project(w.w_gate, no_bias, gate, inter));
  EDGE_RETURN_IF_ERROR(project(w.w_up, no_bias, up, inter));
  EDGE_RETURN_IF_ERROR(kernels::run_silu_mul({.gate = gate.data(), .up = up.data(), .out = gate.data(),
                                              .rows = tokens, .cols = inter, .in_stride = inter,
                                              .out_stride = inter},
                                             stream));
  // x += silu(gate) * up · w_downᵀ
  return kernels::run_matmul({.x = gate.data(), .w = w.w_down.view(), .y = x.data(),
                              .tokens = tokens, .n = hidden, .k = inter, .x_stride = inter, .y_stride = hidden,
                              .accumulate = true},
                             stream);
}

status cpu_executor::forward(const batch_plan& plan, std::span<float> logits) {
  state& s = *state_;
  const std::int64_t tokens = plan.total_tokens();
  const std::int64_t rows = plan.logits_rows();
  const auto entries = static_cast<std::int64_t>(plan.entries.size());
  if (tokens == 0) return {};
  if (tokens > s.options.max_batch_tokens) {
    return invalid_argument(format("batch of {} tokens exceeds max_batch_tokens {}", tokens, s.options.max_batch_tokens));
  }
  if (entries > s.options.max_sequences) {
    return invalid_argument(format("batch of {} sequences exceeds max_sequences {}", entries, s.options.max_sequences));
  }
  if (static_cast<std::int64_t>(logits.size()) != rows * s.vocab) {
    return invalid_argument(format("logits buffer holds {} floats, the batch needs {}", logits.size(), rows * s.vocab));
  }

  std::int64_t t = 0;
  std::int64_t row = 0;
  for (std::int64_t e = 0; e < entries; ++e) {
    const batch_entry& entry = plan.entries[static_cast<std::size_t>(e)];
    const auto count = static_cast<std::int64_t>(entry.tokens.size());
    const std::int64_t end_position = entry.start_position + count;
    const std::int64_t blocks_needed = (end_position + s.block_size - 1) / s.block_size;
    if (count == 0 || entry.start_position < 0) return invalid_argument("batch entry without tokens");
    if (blocks_needed > static_cast<std::int64_t>(entry.block_table.size()) || blocks_needed > s.max_table) {
      return invalid_argument(format("block table of {} blocks cannot hold position {} (limit {} blocks)",
                                     entry.block_table.size(), end_position - 1, s.max_table));
    }
    std::copy(entry.block_table.begin(), entry.block_table.begin() + blocks_needed,
              s.tables.begin() + e * s.max_table);
    for (std::int64_t i = 0; i < count; ++i, ++t) {
      const std::int64_t position = entry.start_position + i;
      s.ids[static_cast<std::size_t>(t)] = entry.tokens[static_cast<std::size_t>(i)];
      s.positions[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(position);
      s.seq[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(e);
      s.slots[static_cast<std::size_t>(t)] =
          static_cast<std::int64_t>(entry.block_table[static_cast<std::size_t>(position / s.block_size)]) *
              s.block_size + position % s.block_size;
    }
    if (entry.compute_logits) s.last_token[static_cast<std::size_t>(row++)] = t - 1;
  }

  const tensor_view& embedding = s.m.weights.token_embedding;
  EDGE_RETURN_IF_ERROR(kernels::run_embedding({.ids = s.ids.data(), .table = embedding.data,
                                               .table_type = embedding.type, .out = s.x.data(), .tokens = tokens,
                                               .vocab = s.vocab, .hidden = s.hidden},
                                              s.stream));
  for (std::int64_t layer = 0; layer < s.m.config.num_layers; ++layer) {
    EDGE_RETURN_IF_ERROR(s.step_layer(layer, tokens));
  }
  if (rows == 0) return {};

  // Only the rows that produce logits go through the final norm and the classifier.
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* src = s.x.data() + s.last_token[static_cast<std::size_t>(r)] * s.hidden;
    std::copy(src, src + s.hidden, s.last.data() + r * s.hidden);
  }
  EDGE_RETURN_IF_ERROR(kernels::run_rmsnorm({.x = s.last.data(), .weight = s.final_norm.data(), .out = s.last.data(),
                                             .rows = rows, .cols = s.hidden, .x_stride = s.hidden,
                                             .out_stride = s.hidden,
                                             .eps = static_cast<float>(s.m.config.rms_norm_eps)},
                                            s.stream));
  const weight_matrix& head = s.m.weights.lm_head;
  return kernels::run_matmul({.x = s.last.data(), .w = head.view(), .y = logits.data(),
                              .tokens = rows, .n = s.vocab, .k = s.hidden, .x_stride = s.hidden,
                              .y_stride = s.vocab},
                             s.stream);
}

std::int64_t batch_plan::total_tokens() const {
  std::int64_t n = 0;
  for (const auto& e : entries) n += static_cast<std::int64_t>(e.tokens.size());
  return n;
}

std::int64_t batch_plan::logits_rows() const {
  std::int64_t n = 0;
  for (const auto& e : entries) n += e.compute_logits ? 1 : 0;
  return n;
}

}  // namespace edge::backend
