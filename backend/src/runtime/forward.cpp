#include "edge/backend/runtime/forward.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <variant>

#include "edge/backend/runtime/sampler.h"
#include "edge/common/format.h"
#include "kernels/cpu/load.h"
#include "kernels/embedding/embedding.h"
#include "kernels/kv_cache_write/kv_cache_write.h"
#include "kernels/matmul/matmul.h"
#include "kernels/mla_attention/mla_attention.h"
#include "kernels/moe_routing/moe_routing.h"
#include "kernels/paged_attention/paged_attention.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/silu_mul/silu_mul.h"

namespace edge::backend {
namespace {

std::vector<float> floats_of(const tensor_view& t) {
  std::vector<float> out(static_cast<std::size_t>(t.elements()));
  kernels::cpu::convert_to_float(t.type, t.data, t.elements(), out.data());
  return out;
}

// Places the parts of a projection that lie side by side in its output as one matrix where
// the model stacked them or the placement stacks them, else part by part; biases alike.
result<std::vector<projection_part>> place_projection(weight_placement& place, const weight_matrix& stacked,
                                                      std::span<const weight_matrix* const> parts,
                                                      std::span<const tensor_view* const> biases) {
  std::optional<kernels::weight_view> one;
  if (stacked.present()) {
    EDGE_ASSIGN_OR_RETURN(one, place.matrix(stacked));
  } else if (same_layout(parts)) {
    EDGE_ASSIGN_OR_RETURN(one, place.stack(parts));
  }
  std::vector<projection_part> out;
  if (one) {
    std::int64_t rows = 0;
    std::vector<float> bias;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      rows += parts[i]->rows();
      if (!biases.empty()) {
        const std::vector<float> part = floats_of(*biases[i]);
        bias.insert(bias.end(), part.begin(), part.end());
      }
    }
    projection_part p{.w = *one, .rows = rows};
    if (!bias.empty()) {
      EDGE_ASSIGN_OR_RETURN(p.bias, place.floats(bias));
    }
    out.push_back(p);
    return out;
  }
  for (std::size_t i = 0; i < parts.size(); ++i) {
    projection_part p{.rows = parts[i]->rows()};
    EDGE_ASSIGN_OR_RETURN(p.w, place.matrix(*parts[i]));
    if (!biases.empty()) {
      EDGE_ASSIGN_OR_RETURN(p.bias, place.floats(floats_of(*biases[i])));
    }
    out.push_back(p);
  }
  return out;
}

result<const float*> place_vector(weight_placement& place, const tensor_view& t) { return place.floats(floats_of(t)); }

// An expert's gate and up stacked where the model or the placement stacks them, else apart.
result<kernels::moe_expert_weights> place_expert(weight_placement& place, const expert_weights& e) {
  kernels::moe_expert_weights out;
  const weight_matrix* const parts[] = {&e.w_gate, &e.w_up};
  std::optional<kernels::weight_view> stacked;
  if (e.w_gate_up.present()) {
    EDGE_ASSIGN_OR_RETURN(stacked, place.matrix(e.w_gate_up));
  } else if (same_layout(parts)) {
    EDGE_ASSIGN_OR_RETURN(stacked, place.stack(parts));
  }
  if (stacked) {
    out.gate = *stacked;
  } else {
    EDGE_ASSIGN_OR_RETURN(out.gate, place.matrix(e.w_gate));
    EDGE_ASSIGN_OR_RETURN(out.up, place.matrix(e.w_up));
  }
  EDGE_ASSIGN_OR_RETURN(out.down, place.matrix(e.w_down));
  return out;
}

// Grouped-query attention: Q, K and V (and their biases and per-head norms).
status place_gqa(weight_placement& place, const attention_plan& a, std::int64_t hidden, const layer_weights& l,
                 layer_forward_weights& lw) {
  EDGE_RETURN_IF_ERROR(check_shape(l.wq, {a.num_heads * a.head_dim, hidden}));
  EDGE_RETURN_IF_ERROR(check_shape(l.wk, {a.kv_dim(), hidden}));
  EDGE_RETURN_IF_ERROR(check_shape(l.wv, {a.kv_dim(), hidden}));
  if (a.qkv_bias) {
    EDGE_RETURN_IF_ERROR(check_shape(l.bq, {a.num_heads * a.head_dim}));
    EDGE_RETURN_IF_ERROR(check_shape(l.bk, {a.kv_dim()}));
    EDGE_RETURN_IF_ERROR(check_shape(l.bv, {a.kv_dim()}));
  }
  if (a.qk_norm) {
    EDGE_RETURN_IF_ERROR(check_shape(l.q_norm, {a.head_dim}));
    EDGE_RETURN_IF_ERROR(check_shape(l.k_norm, {a.head_dim}));
    EDGE_ASSIGN_OR_RETURN(lw.q_norm, place_vector(place, l.q_norm));
    EDGE_ASSIGN_OR_RETURN(lw.k_norm, place_vector(place, l.k_norm));
  }
  const weight_matrix* const parts[] = {&l.wq, &l.wk, &l.wv};
  const tensor_view* const biases[] = {&l.bq, &l.bk, &l.bv};
  EDGE_ASSIGN_OR_RETURN(lw.qkv, place_projection(place, l.wqkv, parts,
                                                 a.qkv_bias ? std::span<const tensor_view* const>(biases)
                                                            : std::span<const tensor_view* const>()));
  return {};
}

// Latent attention: the first projection's parts (q_a or q, kv_a, the indexer's key and head
// weights), the norms, q_b, kv_b and its absorbed K part, the indexer's query projection.
status place_mla(weight_placement& place, const attention_plan& a, std::int64_t hidden, const layer_weights& l,
                 layer_forward_weights& lw) {
  const mla_plan& m = a.mla;
  const std::int64_t heads = a.num_heads;
  EDGE_RETURN_IF_ERROR(check_shape(l.wq, {m.q_width(heads), hidden}));
  EDGE_RETURN_IF_ERROR(check_shape(l.wk, {m.cache_row(), hidden}));
  EDGE_RETURN_IF_ERROR(check_shape(l.kv_a_norm, {m.kv_lora_rank}));
  EDGE_RETURN_IF_ERROR(check_shape(l.wkv_b, {heads * (m.nope + m.v_head_dim), m.kv_lora_rank}));
  EDGE_RETURN_IF_ERROR(check_shape(l.w_uk_t, {heads * m.kv_lora_rank, m.nope}));
  if (m.q_lora_rank > 0) {
    EDGE_RETURN_IF_ERROR(check_shape(l.q_a_norm, {m.q_lora_rank}));
    EDGE_RETURN_IF_ERROR(check_shape(l.wq_b, {heads * m.qk_head(), m.q_lora_rank}));
    EDGE_ASSIGN_OR_RETURN(lw.q_a_norm, place_vector(place, l.q_a_norm));
    EDGE_ASSIGN_OR_RETURN(lw.wq_b, place.matrix(l.wq_b));
  }
  EDGE_ASSIGN_OR_RETURN(lw.kv_a_norm, place_vector(place, l.kv_a_norm));
  EDGE_ASSIGN_OR_RETURN(lw.wkv_b, place.matrix(l.wkv_b));
  EDGE_ASSIGN_OR_RETURN(lw.w_uk_t, place.matrix(l.w_uk_t));
  const weight_matrix* const parts[] = {&l.wq, &l.wk};
  EDGE_ASSIGN_OR_RETURN(lw.qkv, place_projection(place, l.wqkv, parts, {}));
  if (m.indexed() && !m.shared_selection) {
    EDGE_RETURN_IF_ERROR(check_shape(l.index_wq, {m.index_heads * m.index_head_dim, m.q_lora_rank}));
    EDGE_RETURN_IF_ERROR(check_shape(l.index_wk, {m.index_head_dim, hidden}));
    EDGE_RETURN_IF_ERROR(check_shape(l.index_k_norm, {m.index_head_dim}));
    EDGE_RETURN_IF_ERROR(check_shape(l.index_k_norm_bias, {m.index_head_dim}));
    EDGE_RETURN_IF_ERROR(check_shape(l.index_weights, {m.index_heads, hidden}));
    EDGE_ASSIGN_OR_RETURN(lw.index_wq, place.matrix(l.index_wq));
    EDGE_ASSIGN_OR_RETURN(lw.index_k_norm, place_vector(place, l.index_k_norm));
    EDGE_ASSIGN_OR_RETURN(lw.index_k_norm_bias, place_vector(place, l.index_k_norm_bias));
    // Their outputs follow kv_a's in the first projection's row: appended as parts of their own.
    const weight_matrix* const index_parts[] = {&l.index_wk, &l.index_weights};
    EDGE_ASSIGN_OR_RETURN(const auto index_projection, place_projection(place, {}, index_parts, {}));
    lw.qkv.insert(lw.qkv.end(), index_projection.begin(), index_projection.end());
  }
  return {};
}

}  // namespace

result<forward_weights> place_weights(const model& m, const model_plan& plan, weight_placement& place) {
  const model_weights& w = m.weights;
  const std::int64_t hidden = plan.hidden;
  if (w.layers.size() != plan.layers.size()) {
    return invalid_argument(format("model has {} layers of weights, its plan {}", w.layers.size(), plan.layers.size()));
  }
  EDGE_RETURN_IF_ERROR(check_shape(w.token_embedding, {plan.vocab, hidden}));
  EDGE_RETURN_IF_ERROR(check_shape(w.lm_head, {plan.vocab, hidden}));
  EDGE_RETURN_IF_ERROR(check_shape(w.final_norm, {hidden}));
  if (w.token_embedding.encoding != tensor_encoding::elements) {
    return invalid_argument("the token embedding must be stored as plain elements");
  }

  forward_weights out;
  EDGE_ASSIGN_OR_RETURN(out.embedding, place.elements(w.token_embedding));
  out.embedding_type = w.token_embedding.type;
  EDGE_ASSIGN_OR_RETURN(out.final_norm, place_vector(place, w.final_norm));
  // A tied classifier that loading kept as the embedding's own bytes is placed once.
  const bool tied = plan.tied_embeddings && w.lm_head.data == w.token_embedding.data &&
                    w.lm_head.format == kernels::weight_format_of(w.token_embedding.type);
  if (tied) {
    out.lm_head = {.format = w.lm_head.format, .values = out.embedding, .scales = nullptr, .group_size = 0};
  } else {
    EDGE_ASSIGN_OR_RETURN(out.lm_head, place.matrix(w.lm_head));
  }

  // One frequency table for all layers that rotate alike (all of them, today).
  std::vector<std::pair<const rope_plan*, const float*>> rope_tables;
  for (std::size_t i = 0; i < plan.layers.size(); ++i) {
    const layer_plan& lp = plan.layers[i];
    const layer_weights& l = w.layers[i];
    const attention_plan& a = lp.attention;
    const mlp_plan& mp = lp.mlp;
    const std::int64_t inter = mp.intermediate;
    EDGE_RETURN_IF_ERROR(check_shape(l.attn_norm, {hidden}));
    EDGE_RETURN_IF_ERROR(check_shape(l.wo, {hidden, a.q_dim()}));
    EDGE_RETURN_IF_ERROR(check_shape(l.ffn_norm, {hidden}));
    if (inter > 0) {
      EDGE_RETURN_IF_ERROR(check_shape(l.w_gate, {inter, hidden}));
      EDGE_RETURN_IF_ERROR(check_shape(l.w_up, {inter, hidden}));
      EDGE_RETURN_IF_ERROR(check_shape(l.w_down, {hidden, inter}));
    }
    if (l.wqkv.present()) {
      // Latent attention stacks q (or q_a) and kv_a only; the indexer's parts stay apart.
      const std::int64_t stacked = a.kind == attention_kind::mla ? a.mla.q_width(a.num_heads) + a.mla.cache_row()
                                                                 : a.qkv_dim();
      EDGE_RETURN_IF_ERROR(check_shape(l.wqkv, {stacked, hidden}));
    }
    if (l.w_gate_up.present()) EDGE_RETURN_IF_ERROR(check_shape(l.w_gate_up, {2 * inter, hidden}));
    if (mp.kind == mlp_kind::moe) {
      EDGE_RETURN_IF_ERROR(check_shape(l.router, {mp.experts, hidden}));
      if (mp.router.correction_bias) EDGE_RETURN_IF_ERROR(check_shape(l.router_bias, {mp.experts}));
      if (static_cast<std::int64_t>(l.experts.size()) != mp.experts) {
        return invalid_argument(format("layer {} has {} experts of weights, its plan {}", i, l.experts.size(), mp.experts));
      }
      for (const expert_weights& e : l.experts) {
        EDGE_RETURN_IF_ERROR(check_shape(e.w_gate, {mp.expert_intermediate, hidden}));
        EDGE_RETURN_IF_ERROR(check_shape(e.w_up, {mp.expert_intermediate, hidden}));
        EDGE_RETURN_IF_ERROR(check_shape(e.w_down, {hidden, mp.expert_intermediate}));
        if (e.w_gate_up.present()) EDGE_RETURN_IF_ERROR(check_shape(e.w_gate_up, {2 * mp.expert_intermediate, hidden}));
      }
    }

    layer_forward_weights lw;
    EDGE_ASSIGN_OR_RETURN(lw.attn_norm, place_vector(place, l.attn_norm));
    EDGE_ASSIGN_OR_RETURN(lw.ffn_norm, place_vector(place, l.ffn_norm));
    switch (a.kind) {
      case attention_kind::gqa: EDGE_RETURN_IF_ERROR(place_gqa(place, a, hidden, l, lw)); break;
      case attention_kind::mla: EDGE_RETURN_IF_ERROR(place_mla(place, a, hidden, l, lw)); break;
    }
    EDGE_ASSIGN_OR_RETURN(lw.wo, place.matrix(l.wo));
    if (inter > 0) {
      const weight_matrix* const gate_up_parts[] = {&l.w_gate, &l.w_up};
      EDGE_ASSIGN_OR_RETURN(lw.gate_up, place_projection(place, l.w_gate_up, gate_up_parts, {}));
      EDGE_ASSIGN_OR_RETURN(lw.w_down, place.matrix(l.w_down));
    }
    if (mp.kind == mlp_kind::moe) {
      EDGE_ASSIGN_OR_RETURN(lw.router, place.matrix(l.router));
      if (mp.router.correction_bias) {
        EDGE_ASSIGN_OR_RETURN(lw.router_bias, place_vector(place, l.router_bias));
      }
      lw.experts.reserve(l.experts.size());
      for (const expert_weights& e : l.experts) {
        EDGE_ASSIGN_OR_RETURN(const kernels::moe_expert_weights placed, place_expert(place, e));
        lw.experts.push_back(placed);
      }
      EDGE_ASSIGN_OR_RETURN(lw.device_experts, place.expert_views(lw.experts));
    }

    if (const auto it = std::find_if(rope_tables.begin(), rope_tables.end(),
                                     [&](const auto& entry) { return *entry.first == a.rope; });
        it != rope_tables.end()) {
      lw.rope_inv_freq = it->second;
    } else {
      EDGE_ASSIGN_OR_RETURN(lw.rope_inv_freq, place.floats(a.rope.inv_freq()));
      rope_tables.emplace_back(&a.rope, lw.rope_inv_freq);
    }
    out.layers.push_back(std::move(lw));
  }
  return out;
}

namespace {

// One array of forward_buffers: its member, its elements for a step's shape, and the member
// that tells the kernels its length (null where the shapes tell them).
struct buffer_row {
  std::variant<float* forward_buffers::*, std::int32_t* forward_buffers::*> data;
  std::int64_t (*elements)(const model_plan& plan, const forward_buffer_shape& shape);
  std::int64_t forward_buffers::*length = nullptr;
};

// `n` on the device named, 0 on any other: its kernels' own workspaces.
std::int64_t only_on(kernels::device device, const forward_buffer_shape& shape, std::int64_t n) {
  return shape.where == device ? n : 0;
}

using plan_t = model_plan;
using shape_t = forward_buffer_shape;

// Every array of forward_buffers, once: forward_buffer_bytes sizes the executors' allocation
// from it and carve_forward_buffers carves it in this order.
constexpr buffer_row buffer_table[] = {
    {&forward_buffers::x, [](const plan_t& p, const shape_t& s) { return s.tokens * p.hidden; }},
    {&forward_buffers::xn, [](const plan_t& p, const shape_t& s) { return s.tokens * p.hidden; }},
    {&forward_buffers::qkv, [](const plan_t& p, const shape_t& s) { return s.tokens * p.max_qkv_dim(); }},
    {&forward_buffers::attn, [](const plan_t& p, const shape_t& s) { return s.tokens * p.max_q_dim(); }},
    {&forward_buffers::gate_up, [](const plan_t& p, const shape_t& s) { return s.tokens * 2 * p.max_intermediate(); }},
    {&forward_buffers::last, [](const plan_t& p, const shape_t& s) { return s.logits_rows * p.hidden; }},
    {&forward_buffers::logits, [](const plan_t& p, const shape_t& s) { return s.logits_rows * p.vocab; }},
    // Split-K over the widest matmul output.
    {&forward_buffers::matmul_workspace,
     [](const plan_t& p, const shape_t& s) {
       const std::int64_t widest = std::max({p.max_qkv_dim(), p.hidden, 2 * p.max_intermediate()});
       return only_on(kernels::device::cuda, s, kernels::matmul_workspace_floats(s.tokens, widest));
     },
     &forward_buffers::matmul_workspace_floats},
    // Splits pay only while the grid is small; 64 tokens (8 for latent attention, whose blocks
    // take 16 or 64 heads) cover every split the launchers pick for batches that small (they use
    // fewer splits when the workspace is short). One workspace serves both kinds of layer.
    {&forward_buffers::attention_workspace,
     [](const plan_t& p, const shape_t& s) {
       std::int64_t floats = 0;
       for (const layer_plan& l : p.layers) {
         const attention_plan& a = l.attention;
         floats = std::max(floats, a.kind == attention_kind::mla
                                       ? kernels::mla_attention_workspace_floats(std::min<std::int64_t>(s.tokens, 8),
                                                                                 a.num_heads, a.mla.kv_lora_rank)
                                       : kernels::paged_attention_workspace_floats(
                                             std::min<std::int64_t>(s.tokens, 64), a.num_heads, a.head_dim));
       }
       return only_on(kernels::device::cuda, s, floats);
     },
     &forward_buffers::attention_workspace_floats},
    // The DSA indexer's scores: every position a block table reaches, for up to
    // dsa_select_chunk_tokens tokens at a time.
    {&forward_buffers::index_scores,
     [](const plan_t& p, const shape_t& s) {
       const std::int64_t scores = kernels::dsa_select_workspace_floats(s.tokens, s.context);
       return p.max_index_topk() > 0 ? only_on(kernels::device::cuda, s, scores) : 0;
     },
     &forward_buffers::index_scores_floats},
    {&forward_buffers::router_logits,
     [](const plan_t& p, const shape_t& s) { return p.moe_layers() > 0 ? s.tokens * p.max_experts() : 0; }},
    {&forward_buffers::route_weights,
     [](const plan_t& p, const shape_t& s) { return p.moe_layers() > 0 ? s.tokens * p.max_top_k() : 0; }},
    {&forward_buffers::route_experts,
     [](const plan_t& p, const shape_t& s) { return p.moe_layers() * s.tokens * p.max_top_k(); }},
    {&forward_buffers::expert_tokens, [](const plan_t& p, const shape_t&) { return p.moe_layers() * p.max_experts(); }},
    {&forward_buffers::moe_workspace,
     [](const plan_t& p, const shape_t& s) {
       return p.moe_layers() > 0 ? kernels::moe_experts_workspace_floats(
                                       std::min(s.tokens, kernels::moe_experts_chunk_tokens), p.max_top_k(),
                                       p.max_experts(), p.hidden, p.max_expert_intermediate())
                                 : 0;
     },
     &forward_buffers::moe_workspace_floats},
    {&forward_buffers::mla_query, [](const plan_t& p, const shape_t& s) { return s.tokens * p.max_mla_query(); }},
    {&forward_buffers::latents, [](const plan_t& p, const shape_t& s) { return s.tokens * p.max_mla_latents(); }},
    {&forward_buffers::index_query, [](const plan_t& p, const shape_t& s) { return s.tokens * p.max_index_query(); }},
    {&forward_buffers::selected, [](const plan_t& p, const shape_t& s) { return s.tokens * p.max_index_topk(); }},
    {&forward_buffers::selected_count,
     [](const plan_t& p, const shape_t& s) { return p.max_index_topk() > 0 ? s.tokens : 0; }},
    // The CUDA kernels run the absorbed form alone.
    {&forward_buffers::mla_workspace,
     [](const plan_t& p, const shape_t& s) {
       return p.max_mla_latents() > 0 ? only_on(kernels::device::cpu, s, p.max_mla_prefill_workspace(s.tokens)) : 0;
     },
     &forward_buffers::mla_workspace_floats},
};

// The bytes of a row's array, rounded up to the alignment of the next.
std::size_t row_bytes(const buffer_row& row, const model_plan& plan, const forward_buffer_shape& shape) {
  const auto elements = static_cast<std::size_t>(row.elements(plan, shape));
  const std::size_t element_bytes =
      std::holds_alternative<float* forward_buffers::*>(row.data) ? sizeof(float) : sizeof(std::int32_t);
  const std::size_t bytes = elements * element_bytes;
  return (bytes + forward_buffer_alignment - 1) / forward_buffer_alignment * forward_buffer_alignment;
}

}  // namespace

std::size_t forward_buffer_bytes(const model_plan& plan, const forward_buffer_shape& shape) {
  std::size_t bytes = 0;
  for (const buffer_row& row : buffer_table) bytes += row_bytes(row, plan, shape);
  return bytes;
}

forward_buffers carve_forward_buffers(const model_plan& plan, const forward_buffer_shape& shape, std::byte* memory) {
  forward_buffers out;
  std::byte* at = memory;
  for (const buffer_row& row : buffer_table) {
    const std::int64_t elements = row.elements(plan, shape);
    std::visit(
        [&](auto member) {
          using element = std::remove_pointer_t<std::remove_reference_t<decltype(out.*member)>>;
          out.*member = elements > 0 ? reinterpret_cast<element*>(at) : nullptr;
        },
        row.data);
    if (row.length != nullptr) out.*row.length = elements;
    at += row_bytes(row, plan, shape);
  }
  return out;
}

std::int64_t max_table_blocks(const model_plan& plan, std::int64_t block_size) {
  return (std::max<std::int64_t>(plan.context, 1) + block_size - 1) / block_size;
}

std::int64_t prompt_logits_rows_per_step(std::int64_t block_size) {
  constexpr std::int64_t at_least = 64;
  const std::int64_t b = std::max<std::int64_t>(block_size, 1);
  return (std::max(at_least, b) + b - 1) / b * b;
}

status check_tier_copies(const batch_plan& plan, std::int64_t blocks, std::int64_t slots) {
  if (plan.spills.empty() && plan.restores.empty()) return {};
  if (slots == 0) return failed_precondition("the plan copies to a host tier and there is none");
  for (const auto* copies : {&plan.spills, &plan.restores}) {
    for (const tier_copy& c : *copies) {
      if (c.block < 0 || c.block >= blocks || c.slot < 0 || c.slot >= slots) {
        return invalid_argument(format("host tier copy of block {} (of {}) and slot {} (of {}) is out of range", c.block,
                                       blocks, c.slot, slots));
      }
    }
  }
  return {};
}

status check_batch_limits(const batch_plan& plan, std::int64_t max_tokens, std::int64_t max_seqs,
                          std::int64_t max_prompt_logits) {
  if (plan.total_tokens() > max_tokens) {
    return invalid_argument(format("batch of {} tokens exceeds max_batch_tokens {}", plan.total_tokens(), max_tokens));
  }
  if (static_cast<std::int64_t>(plan.entries.size()) > max_seqs) {
    return invalid_argument(format("batch of {} sequences exceeds max_sequences {}", plan.entries.size(), max_seqs));
  }
  for (const batch_entry& e : plan.entries) {
    const auto count = static_cast<std::int64_t>(e.tokens.size());
    if (e.prompt_logits_count < 0 || e.prompt_logits_offset < 0 ||
        e.prompt_logits_offset + e.prompt_logits_count > count) {
      return invalid_argument(format("prompt logits rows [{}, +{}) outside an entry of {} tokens", e.prompt_logits_offset,
                                     e.prompt_logits_count, count));
    }
  }
  if (plan.prompt_logits_rows() > max_prompt_logits) {
    return invalid_argument(format("batch of {} prompt logits rows exceeds {}", plan.prompt_logits_rows(), max_prompt_logits));
  }
  return {};
}

status check_sampling_args(const batch_plan& plan, std::span<const row_sampling> rows, std::span<std::int32_t> tokens,
                           std::span<float> logits, std::int64_t vocab) {
  const std::int64_t wanted = plan.logits_rows();
  const auto copied = static_cast<std::int64_t>(
      std::count_if(rows.begin(), rows.end(), [](const row_sampling& r) { return r.copy_logits; }));
  if (static_cast<std::int64_t>(rows.size()) != wanted || static_cast<std::int64_t>(tokens.size()) != wanted) {
    return invalid_argument(format("forward_sample: {} sampling rows and {} tokens for {} logits rows", rows.size(),
                                   tokens.size(), wanted));
  }
  const std::int64_t out_rows = copied + plan.prompt_logits_rows();
  if (static_cast<std::int64_t>(logits.size()) != out_rows * vocab) {
    return invalid_argument(format("forward_sample: a logits buffer of {} floats for {} rows to copy", logits.size(), out_rows));
  }
  return {};
}

result<staged_sampling> stage_sampling(std::span<const row_sampling> sampling, std::int64_t rows, std::int64_t vocab,
                                       const sampling_arrays& out) {
  staged_sampling staged;
  const auto words = static_cast<std::size_t>(kernels::allowed_words(vocab));
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto i = static_cast<std::size_t>(r);
    const bool given = i < sampling.size() && sampling[i].sample;
    kernels::sampling_row& config = out.config[r];
    config = given ? sampling[i].config : kernels::sampling_row{.temperature = 0.0f};
    config.allowed_row = -1;
    if (!given) continue;
    const std::span<const kernels::logit_bias> bias = sampling[i].bias;
    if (static_cast<std::int64_t>(bias.size()) > max_logit_bias_entries) {
      return invalid_argument(format("a row of {} logit biases; at most {}", bias.size(), max_logit_bias_entries));
    }
    config.bias_begin = static_cast<std::int32_t>(staged.bias_entries);
    config.bias_count = static_cast<std::int32_t>(bias.size());
    std::copy(bias.begin(), bias.end(), out.biases + staged.bias_entries);
    staged.bias_entries += static_cast<std::int64_t>(bias.size());
    const std::span<const std::uint32_t> mask = sampling[i].allowed;
    if (mask.empty()) continue;
    if (mask.size() != words) return invalid_argument("forward_sample: a token mask of the wrong size");
    config.allowed_row = static_cast<std::int32_t>(staged.masks.size());
    staged.masks.push_back(mask);
  }
  return staged;
}

status check_logits_buffer(const batch_plan& plan, std::span<float> logits, std::int64_t vocab) {
  const std::int64_t rows = plan.logits_rows() + plan.prompt_logits_rows();
  if (static_cast<std::int64_t>(logits.size()) != rows * vocab) {
    return invalid_argument(format("logits buffer holds {} floats, the batch needs {}", logits.size(), rows * vocab));
  }
  return {};
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

std::int64_t batch_plan::prompt_logits_rows() const {
  std::int64_t n = 0;
  for (const auto& e : entries) n += e.prompt_logits_count;
  return n;
}

std::int64_t padded_tokens(const batch_plan& plan, std::int64_t padded_seqs) {
  return plan.total_tokens() + std::max<std::int64_t>(0, padded_seqs - static_cast<std::int64_t>(plan.entries.size()));
}

result<staged_step> stage_step(const batch_plan& plan, std::int64_t padded_seqs, std::int64_t vocab,
                               const kv_cache_layout& kv, std::int64_t max_table_blocks, std::int64_t pad_block,
                               const step_arrays& out) {
  const auto entries = static_cast<std::int64_t>(plan.entries.size());
  const std::int64_t seqs = std::max(entries, padded_seqs);
  for (const block_copy& c : plan.copies) {
    if (c.from < 0 || c.from >= kv.num_blocks || c.to < 0 || c.to >= kv.num_blocks || c.from == c.to) {
      return invalid_argument(format("block copy {} -> {} outside the KV cache of {} blocks", c.from, c.to, kv.num_blocks));
    }
  }
  std::int64_t t = 0;
  std::int64_t row = 0;
  std::int64_t max_run = 0;
  std::int64_t table_at = 0;
  for (std::int64_t e = 0; e < seqs; ++e) {
    out.seq_begin[e] = static_cast<std::int32_t>(t);
    out.table_begin[e] = static_cast<std::int32_t>(table_at);
    std::int32_t* table = out.block_tables + table_at;
    if (e >= entries) {
      table[0] = static_cast<std::int32_t>(pad_block);
      ++table_at;
      out.ids[t] = 0;
      out.positions[t] = 0;
      out.seq[t] = static_cast<std::int32_t>(e);
      // Written nowhere (the device kernel skips a negative slot): the padding rows of a graph
      // batch all sit at position 0 of the pad block, which stays zero, and would otherwise
      // race to write its first row.
      out.slots[t] = -1;
      out.last_token[row++] = t;
      ++t;
      max_run = std::max<std::int64_t>(max_run, 1);
      continue;
    }
    const batch_entry& entry = plan.entries[static_cast<std::size_t>(e)];
    const auto count = static_cast<std::int64_t>(entry.tokens.size());
    const std::int64_t end_position = entry.start_position + count;
    const std::int64_t blocks_needed = (end_position + kv.block_size - 1) / kv.block_size;
    if (count == 0 || entry.start_position < 0) return invalid_argument("batch entry without tokens");
    if (blocks_needed > static_cast<std::int64_t>(entry.block_table.size()) || blocks_needed > max_table_blocks) {
      return invalid_argument(format("block table of {} blocks cannot hold position {} (limit {} blocks)",
                                     entry.block_table.size(), end_position - 1, max_table_blocks));
    }
    table_at += blocks_needed;
    for (std::int64_t b = 0; b < blocks_needed; ++b) {
      const std::int32_t block = entry.block_table[static_cast<std::size_t>(b)];
      if (block < 0 || block >= kv.num_blocks) {
        return invalid_argument(format("block {} outside the KV cache of {} blocks", block, kv.num_blocks));
      }
      table[b] = block;
    }
    for (std::int64_t i = 0; i < count; ++i, ++t) {
      const std::int32_t id = entry.tokens[static_cast<std::size_t>(i)];
      if (id < 0 || id >= vocab) return invalid_argument(format("token id {} is outside the vocabulary of {}", id, vocab));
      const std::int64_t position = entry.start_position + i;
      out.ids[t] = id;
      out.positions[t] = static_cast<std::int32_t>(position);
      out.seq[t] = static_cast<std::int32_t>(e);
      out.slots[t] = static_cast<std::int64_t>(table[position / kv.block_size]) * kv.block_size + position % kv.block_size;
    }
    max_run = std::max(max_run, count);
    if (entry.compute_logits) out.last_token[row++] = t - 1;
  }
  out.seq_begin[seqs] = static_cast<std::int32_t>(t);
  out.table_begin[seqs] = static_cast<std::int32_t>(table_at);
  const std::int64_t sampled_rows = row;
  for (std::int64_t e = 0; e < entries; ++e) {
    const batch_entry& entry = plan.entries[static_cast<std::size_t>(e)];
    const std::int64_t first = out.seq_begin[e] + entry.prompt_logits_offset;
    for (std::int64_t i = 0; i < entry.prompt_logits_count; ++i) out.last_token[row++] = first + i;
  }
  return staged_step{.tokens = t,
                     .seqs = seqs,
                     .rows = row,
                     .sampled_rows = sampled_rows,
                     .max_run = max_run,
                     .table_entries = table_at};
}

namespace {

// One forward pass in progress: what every layer kind reads. A new kind of attention or MLP is
// one more member here and one more case in run_forward's switches.
struct forward_pass {
  const model_plan& plan;
  const forward_buffers& b;
  const forward_step& step;
  const kv_cache_view& kv;
  const kernels::stream& s;
  // Where each MoE layer's choices and counts sit in route_experts / expert_tokens (the plan's
  // widest, read once per pass rather than once per layer).
  std::int64_t choice_stride = 0;
  std::int64_t count_stride = 0;

  status matmul(const float* in, std::int64_t in_stride, const kernels::weight_view& w, const float* bias, float* out,
                std::int64_t out_stride, std::int64_t n, std::int64_t k, bool accumulate, std::int64_t rows) const {
    return kernels::run_matmul({.x = in, .w = w, .bias = bias, .y = out, .tokens = rows, .n = n, .k = k,
                                .x_stride = in_stride, .y_stride = out_stride, .accumulate = accumulate,
                                .workspace = b.matmul_workspace, .workspace_floats = b.matmul_workspace_floats},
                               s);
  }

  // The parts of a side-by-side projection of xn, each into its columns of `out` ([tokens, width]).
  status project(const std::vector<projection_part>& parts, float* out, std::int64_t width) const {
    std::int64_t column = 0;
    for (const projection_part& p : parts) {
      EDGE_RETURN_IF_ERROR(matmul(b.xn, plan.hidden, p.w, p.bias, out + column, width, p.rows, plan.hidden, false,
                                  step.tokens));
      column += p.rows;
    }
    return {};
  }

  // xn = rmsnorm(x)
  status norm(const float* weight) const {
    return kernels::run_rmsnorm({.x = b.x, .weight = weight, .out = b.xn, .rows = step.tokens, .cols = plan.hidden,
                                 .x_stride = plan.hidden, .out_stride = plan.hidden, .eps = plan.norm_eps},
                                s);
  }

  // x += attention(rmsnorm(x)): Q/K/V projections, (Qwen3) an RMSNorm over each head of Q and
  // K, RoPE on Q and K, K/V into the cache, paged attention over it (grouped-query), the output
  // projection.
  status gqa_attention(std::int64_t layer, const attention_plan& a, const layer_forward_weights& w) const {
    const std::int64_t qkv_dim = a.qkv_dim();
    float* q = b.qkv;
    float* k = b.qkv + a.q_dim();
    float* v = k + a.kv_dim();
    EDGE_RETURN_IF_ERROR(norm(w.attn_norm));
    EDGE_RETURN_IF_ERROR(project(w.qkv, b.qkv, qkv_dim));
    if (a.qk_norm) {
      EDGE_RETURN_IF_ERROR(kernels::run_rmsnorm({.x = q, .weight = w.q_norm, .out = q, .rows = step.tokens,
                                                 .cols = a.head_dim, .groups = a.num_heads, .x_stride = qkv_dim,
                                                 .out_stride = qkv_dim, .eps = plan.norm_eps},
                                                s));
      EDGE_RETURN_IF_ERROR(kernels::run_rmsnorm({.x = k, .weight = w.k_norm, .out = k, .rows = step.tokens,
                                                 .cols = a.head_dim, .groups = a.num_kv_heads, .x_stride = qkv_dim,
                                                 .out_stride = qkv_dim, .eps = plan.norm_eps},
                                                s));
    }
    EDGE_RETURN_IF_ERROR(kernels::run_rope({.x = q, .positions = step.positions, .inv_freq = w.rope_inv_freq,
                                            .tokens = step.tokens, .heads = a.num_heads, .head_dim = a.head_dim,
                                            .rotary_dim = a.rope.rotary_dim, .x_stride = qkv_dim,
                                            .pairs = a.rope.pairs},
                                           s));
    EDGE_RETURN_IF_ERROR(kernels::run_rope({.x = k, .positions = step.positions, .inv_freq = w.rope_inv_freq,
                                            .tokens = step.tokens, .heads = a.num_kv_heads, .head_dim = a.head_dim,
                                            .rotary_dim = a.rope.rotary_dim, .x_stride = qkv_dim,
                                            .pairs = a.rope.pairs},
                                           s));
    EDGE_RETURN_IF_ERROR(kernels::run_kv_cache_write(
        {.k = k, .v = v, .k_cache = kv.keys(layer), .v_cache = kv.values(layer), .k_scales = kv.key_scales(layer),
         .v_scales = kv.value_scales(layer), .kv_type = kv.layout.dtype, .slots = step.slots, .tokens = step.tokens,
         .num_kv_heads = a.num_kv_heads, .head_dim = a.head_dim, .block_size = kv.layout.block_size,
         .num_blocks = kv.allocated_blocks, .kv_stride = qkv_dim},
        s));
    EDGE_RETURN_IF_ERROR(kernels::run_paged_attention(
        {.q = q, .out = b.attn, .k_cache = kv.keys(layer), .v_cache = kv.values(layer),
         .k_scales = kv.key_scales(layer), .v_scales = kv.value_scales(layer), .kv_type = kv.layout.dtype,
         .seq = step.seq, .pos = step.positions, .block_tables = step.block_tables,
         .table_begin = step.table_begin, .tokens = step.tokens, .num_heads = a.num_heads,
         .num_kv_heads = a.num_kv_heads, .head_dim = a.head_dim, .block_size = kv.layout.block_size,
         .num_blocks = kv.allocated_blocks, .q_stride = qkv_dim, .out_stride = a.q_dim(),
         .scale = a.softmax_scale, .seq_token_begin = step.seq_begin, .num_seqs = step.seqs,
         .max_seq_tokens = step.max_run, .workspace = b.attention_workspace,
         .workspace_floats = b.attention_workspace_floats},
        s));
    // x += attn · woᵀ
    return matmul(b.attn, a.q_dim(), w.wo, nullptr, b.x, plan.hidden, plan.hidden, a.q_dim(), true, step.tokens);
  }

  // x += mla(rmsnorm(x)), as model_plan.h lists the steps. Layer `layer`'s cache rows are
  // [latent | k_pe] in K and, for an indexer, its keys in V.
  status mla_attention(std::int64_t layer, const attention_plan& a, const layer_forward_weights& w) const {
    const mla_plan& m = a.mla;
    const std::int64_t heads = a.num_heads;
    const std::int64_t width = a.qkv_dim();
    const bool own_indexer = m.indexed() && !m.shared_selection;
    float* q_a = b.qkv;                               // [tokens, q_width] of the first projection
    float* latent = q_a + m.q_width(heads);           // [tokens, kv_lora_rank], then k_pe [rope]
    float* k_pe = latent + m.kv_lora_rank;
    float* index_key = k_pe + m.rope;                 // [tokens, index_head_dim] (own indexer)
    float* index_weights = index_key + m.index_head_dim;  // [tokens, index_heads]
    const auto norm_part = [&](float* part, const float* weight, std::int64_t cols) {
      return kernels::run_rmsnorm({.x = part, .weight = weight, .out = part, .rows = step.tokens, .cols = cols,
                                   .x_stride = width, .out_stride = width, .eps = mla_plan::lora_norm_eps},
                                  s);
    };
    const auto rotate = [&](float* x, std::int64_t heads_of, std::int64_t head_dim, std::int64_t stride) {
      return kernels::run_rope({.x = x, .positions = step.positions, .inv_freq = w.rope_inv_freq,
                                .tokens = step.tokens, .heads = heads_of, .head_dim = head_dim, .rotary_dim = m.rope,
                                .x_stride = stride, .pairs = a.rope.pairs, .scale = m.rope_scale},
                               s);
    };

    EDGE_RETURN_IF_ERROR(norm(w.attn_norm));
    EDGE_RETURN_IF_ERROR(project(w.qkv, b.qkv, width));
    float* q = q_a;  // [tokens, heads, qk_head]: q_nope then q_pe per head
    std::int64_t q_stride = width;
    if (m.q_lora_rank > 0) {
      EDGE_RETURN_IF_ERROR(norm_part(q_a, w.q_a_norm, m.q_lora_rank));
      q = b.mla_query;
      q_stride = heads * m.qk_head();
      EDGE_RETURN_IF_ERROR(matmul(q_a, width, w.wq_b, nullptr, q, q_stride, q_stride, m.q_lora_rank, false, step.tokens));
    }
    EDGE_RETURN_IF_ERROR(norm_part(latent, w.kv_a_norm, m.kv_lora_rank));
    EDGE_RETURN_IF_ERROR(rotate(q + m.nope, heads, m.qk_head(), q_stride));
    EDGE_RETURN_IF_ERROR(rotate(k_pe, 1, m.rope, width));
    EDGE_RETURN_IF_ERROR(cache_rows(latent, width, m.cache_row(), kv.keys(layer), kv.key_scales(layer)));

    if (own_indexer) {
      EDGE_RETURN_IF_ERROR(kernels::run_rmsnorm({.x = index_key, .weight = w.index_k_norm, .out = index_key,
                                                 .rows = step.tokens, .cols = m.index_head_dim, .x_stride = width,
                                                 .out_stride = width, .eps = mla_plan::index_norm_eps, .center = true,
                                                 .bias = w.index_k_norm_bias},
                                                s));
      EDGE_RETURN_IF_ERROR(rotate(index_key, 1, m.index_head_dim, width));
      EDGE_RETURN_IF_ERROR(cache_rows(index_key, width, m.index_head_dim, kv.values(layer), kv.value_scales(layer)));
      const std::int64_t index_width = m.index_heads * m.index_head_dim;
      EDGE_RETURN_IF_ERROR(
          matmul(q_a, width, w.index_wq, nullptr, b.index_query, index_width, index_width, m.q_lora_rank, false, step.tokens));
      EDGE_RETURN_IF_ERROR(rotate(b.index_query, m.index_heads, m.index_head_dim, index_width));
      EDGE_RETURN_IF_ERROR(kernels::run_dsa_select(
          {.q = b.index_query, .head_weights = index_weights,
           .weight_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(m.index_heads * m.index_head_dim))),
           .key_cache = kv.values(layer), .key_scales = kv.value_scales(layer), .kv_type = kv.layout.dtype,
           .seq = step.seq, .pos = step.positions, .block_tables = step.block_tables, .table_begin = step.table_begin,
           .selected = b.selected, .selected_count = b.selected_count, .tokens = step.tokens,
           .index_heads = m.index_heads, .index_dim = m.index_head_dim, .top_k = m.index_topk,
           .block_size = kv.layout.block_size, .num_blocks = kv.allocated_blocks, .q_stride = index_width,
           .weights_stride = width, .workspace = b.index_scores, .workspace_floats = b.index_scores_floats,
           .workspace_context = max_table_blocks(plan, kv.layout.block_size) * kv.layout.block_size},
          s));
    }

    // Each run (one sequence's tokens of the step) takes the form with fewer flops: prefill
    // chunks long enough the expanded one (CPU), everything else the absorbed one, consecutive
    // absorbed runs in one call. Both write every head's output to b.attn.
    std::int64_t absorbed_from = 0;  // the first token of the absorbed runs not yet computed
    for (std::int64_t r = 0; r < step.seqs && s.where == kernels::device::cpu; ++r) {
      const std::int64_t first = step.seq_begin[r];
      const std::int64_t count = step.seq_begin[r + 1] - first;
      const std::int64_t context = static_cast<std::int64_t>(step.positions[first + count - 1]) + 1;
      if (count < 2 || !kernels::mla_expanded_pays(count, context, m.kv_lora_rank, m.rope, m.nope, m.v_head_dim)) continue;
      EDGE_RETURN_IF_ERROR(absorbed_mla(layer, a, w, q, q_stride, absorbed_from, first));
      EDGE_RETURN_IF_ERROR(kernels::run_mla_prefill(
          {.q = q + first * q_stride, .out = b.attn + first * a.q_dim(), .cache = kv.keys(layer),
           .scales = kv.key_scales(layer), .kv_type = kv.layout.dtype,
           .block_table = step.block_tables + step.table_begin[r],
           .selected = m.indexed() ? b.selected + first * m.index_topk : nullptr,
           .selected_count = m.indexed() ? b.selected_count + first : nullptr, .select_stride = m.index_topk,
           .kv_b = w.wkv_b, .first_position = step.positions[first], .tokens = count, .heads = heads,
           .latent_dim = m.kv_lora_rank, .rope_dim = m.rope, .nope = m.nope, .v_head_dim = m.v_head_dim,
           .block_size = kv.layout.block_size, .num_blocks = kv.allocated_blocks, .q_stride = q_stride,
           .out_stride = a.q_dim(), .scale = a.softmax_scale, .workspace = b.mla_workspace,
           .workspace_floats = b.mla_workspace_floats},
          s));
      absorbed_from = first + count;
    }
    EDGE_RETURN_IF_ERROR(absorbed_mla(layer, a, w, q, q_stride, absorbed_from, step.tokens));
    return matmul(b.attn, a.q_dim(), w.wo, nullptr, b.x, plan.hidden, plan.hidden, a.q_dim(), true, step.tokens);
  }

  // The absorbed form for tokens [begin, end) of the step, whose rotated queries are q ([tokens,
  // heads, nope + rope], token stride q_stride): q_nope folded through kv_b_proj's K part per
  // head (w_uk_t's rows for a head are W_UKᵀ), attention over the cached latents (in place), the
  // latents through kv_b_proj's V rows per head into b.attn; each projection one call for every
  // head (run_head_matmul).
  status absorbed_mla(std::int64_t layer, const attention_plan& a, const layer_forward_weights& w, const float* q,
                      std::int64_t q_stride, std::int64_t begin, std::int64_t end) const {
    if (end <= begin) return {};
    const mla_plan& m = a.mla;
    const std::int64_t heads = a.num_heads;
    const std::int64_t tokens = end - begin;
    const std::int64_t stride = heads * m.kv_lora_rank;
    float* latents = b.latents + begin * stride;
    const float* queries = q + begin * q_stride;
    EDGE_RETURN_IF_ERROR(kernels::run_head_matmul({.x = queries, .w = w.w_uk_t, .y = latents, .tokens = tokens,
                                                   .heads = heads, .n = m.kv_lora_rank, .k = m.nope, .first_row = 0,
                                                   .head_rows = m.kv_lora_rank, .x_stride = q_stride,
                                                   .x_head_stride = m.qk_head(), .y_stride = stride,
                                                   .y_head_stride = m.kv_lora_rank},
                                                  s));
    EDGE_RETURN_IF_ERROR(kernels::run_mla_attention(
        {.q_latent = latents, .q_rope = queries + m.nope, .out = latents, .cache = kv.keys(layer),
         .scales = kv.key_scales(layer), .kv_type = kv.layout.dtype, .seq = step.seq + begin,
         .pos = step.positions + begin, .block_tables = step.block_tables, .table_begin = step.table_begin,
         .selected = m.indexed() ? b.selected + begin * m.index_topk : nullptr,
         .selected_count = m.indexed() ? b.selected_count + begin : nullptr, .select_stride = m.index_topk,
         .tokens = tokens, .num_heads = heads, .latent_dim = m.kv_lora_rank, .rope_dim = m.rope,
         .block_size = kv.layout.block_size, .num_blocks = kv.allocated_blocks, .q_latent_stride = stride,
         .q_rope_stride = q_stride, .q_rope_head_stride = m.qk_head(), .out_stride = stride,
         .scale = a.softmax_scale, .workspace = b.attention_workspace,
         .workspace_floats = b.attention_workspace_floats},
        s));
    return kernels::run_head_matmul({.x = latents, .w = w.wkv_b, .y = b.attn + begin * a.q_dim(), .tokens = tokens,
                                     .heads = heads, .n = m.v_head_dim, .k = m.kv_lora_rank, .first_row = m.nope,
                                     .head_rows = m.nope + m.v_head_dim, .x_stride = stride,
                                     .x_head_stride = m.kv_lora_rank, .y_stride = a.q_dim(),
                                     .y_head_stride = m.v_head_dim},
                                    s);
  }

  // Each token's `row_width` values at `rows` (token stride `stride`) into a one-row-per-token
  // cache pool (kv_cache_write with one head, no V).
  status cache_rows(const float* rows, std::int64_t stride, std::int64_t row_width, void* pool, float* scales) const {
    return kernels::run_kv_cache_write({.k = rows, .v = nullptr, .k_cache = pool, .v_cache = nullptr,
                                        .k_scales = scales, .kv_type = kv.layout.dtype, .slots = step.slots,
                                        .tokens = step.tokens, .num_kv_heads = 1, .head_dim = row_width,
                                        .block_size = kv.layout.block_size, .num_blocks = kv.allocated_blocks,
                                        .kv_stride = stride},
                                       s);
  }

  // x += down(silu(gate(xn)) * up(xn)), xn = rmsnorm(x)
  status dense_mlp(const mlp_plan& m, const layer_forward_weights& w) const {
    EDGE_RETURN_IF_ERROR(norm(w.ffn_norm));
    return swiglu(m.intermediate, w);
  }

  // x += Σ weight · expert(xn) over each token's chosen experts, + shared(xn), xn = rmsnorm(x).
  // `moe_index` counts the MoE layers before this one: where its choices are kept.
  status moe_mlp(std::int64_t moe_index, const mlp_plan& m, const layer_forward_weights& w) const {
    const router_plan& r = m.router;
    std::int32_t* experts = b.route_experts + moe_index * step.tokens * choice_stride;
    EDGE_RETURN_IF_ERROR(norm(w.ffn_norm));
    EDGE_RETURN_IF_ERROR(matmul(b.xn, plan.hidden, w.router, nullptr, b.router_logits, m.experts, m.experts,
                                plan.hidden, false, step.tokens));
    EDGE_RETURN_IF_ERROR(kernels::run_moe_routing({.logits = b.router_logits, .correction_bias = w.router_bias,
                                                   .experts = experts, .weights = b.route_weights,
                                                   .tokens = step.tokens, .num_experts = m.experts, .top_k = m.top_k,
                                                   .logits_stride = m.experts, .scoring = r.scoring,
                                                   .groups = r.groups, .top_groups = r.top_groups,
                                                   .normalize = r.normalize, .scaling = r.scaling},
                                                  s));
    EDGE_RETURN_IF_ERROR(kernels::run_moe_experts(
        {.x = b.xn, .experts = experts, .weights = b.route_weights, .matrices = w.experts.data(), .out = b.x,
         .expert_tokens = b.expert_tokens + moe_index * count_stride, .tokens = step.tokens, .top_k = m.top_k,
         .num_experts = m.experts, .hidden = plan.hidden, .intermediate = m.expert_intermediate,
         .x_stride = plan.hidden, .out_stride = plan.hidden, .workspace = b.moe_workspace,
         .workspace_floats = b.moe_workspace_floats, .device_matrices = w.device_experts},
        s));
    return m.intermediate > 0 ? swiglu(m.intermediate, w) : status{};
  }

  // x += down(silu(gate(xn)) * up(xn)) with the layer's gate_up and w_down.
  status swiglu(std::int64_t inter, const layer_forward_weights& w) const {
    EDGE_RETURN_IF_ERROR(project(w.gate_up, b.gate_up, 2 * inter));
    EDGE_RETURN_IF_ERROR(kernels::run_silu_mul({.gate = b.gate_up, .up = b.gate_up + inter, .out = b.gate_up,
                                                .rows = step.tokens, .cols = inter, .in_stride = 2 * inter,
                                                .out_stride = 2 * inter},
                                               s));
    return matmul(b.gate_up, 2 * inter, w.w_down, nullptr, b.x, plan.hidden, plan.hidden, inter, true, step.tokens);
  }
};

}  // namespace

namespace {

// The step's block copies, region kind by region kind (each kind's blocks lie at the same place
// in every layer): K pool, V pool, K scales, V scales.
status copy_kv_blocks(const kv_cache_view& kv, std::span<const block_copy> copies, const kernels::stream& stream) {
  if (copies.empty() || kv.layout.num_layers == 0) return {};
  std::vector<std::int32_t> from(copies.size());
  std::vector<std::int32_t> to(copies.size());
  for (std::size_t i = 0; i < copies.size(); ++i) {
    from[i] = copies[i].from;
    to[i] = copies[i].to;
  }
  const kv_cache_layout& l = kv.layout;
  const auto rows = static_cast<std::size_t>(l.num_kv_heads * l.block_size);  // per block
  const std::size_t element = kernels::dtype_size(l.dtype);
  const std::pair<void*, std::size_t> regions[] = {
      {kv.keys(0), rows * static_cast<std::size_t>(l.head_dim) * element},
      {kv.values(0), rows * static_cast<std::size_t>(l.value_dim) * element},
      {kv.key_scales(0), rows * sizeof(float)},
      {kv.value_scales(0), rows * sizeof(float)}};
  for (const auto& [first, block_bytes] : regions) {
    if (first == nullptr || block_bytes == 0) continue;
    EDGE_RETURN_IF_ERROR(kernels::run_kv_block_copy({.first_region = first,
                                                     .layer_stride = kv.layer_bytes(),
                                                     .block_bytes = block_bytes,
                                                     .layers = l.num_layers,
                                                     .num_blocks = kv.allocated_blocks,
                                                     .from = from.data(),
                                                     .to = to.data(),
                                                     .count = static_cast<std::int64_t>(copies.size())},
                                                    stream));
  }
  return {};
}

}  // namespace

status run_forward(const model_plan& plan, const forward_weights& weights, const forward_buffers& buffers,
                   const forward_step& step, const kv_cache_view& kv, const kernels::stream& stream) {
  EDGE_RETURN_IF_ERROR(copy_kv_blocks(kv, step.copies, stream));
  const forward_pass pass{.plan = plan, .b = buffers, .step = step, .kv = kv, .s = stream,
                          .choice_stride = plan.max_top_k(), .count_stride = plan.max_experts()};
  EDGE_RETURN_IF_ERROR(kernels::run_embedding({.ids = step.ids, .table = weights.embedding,
                                               .table_type = weights.embedding_type, .out = buffers.x,
                                               .tokens = step.tokens, .vocab = plan.vocab, .hidden = plan.hidden},
                                              stream));
  std::int64_t moe_index = 0;
  for (std::size_t l = 0; l < plan.layers.size(); ++l) {
    const layer_plan& lp = plan.layers[l];
    const layer_forward_weights& w = weights.layers[l];
    switch (lp.attention.kind) {
      case attention_kind::gqa:
        EDGE_RETURN_IF_ERROR(pass.gqa_attention(static_cast<std::int64_t>(l), lp.attention, w));
        break;
      case attention_kind::mla:
        EDGE_RETURN_IF_ERROR(pass.mla_attention(static_cast<std::int64_t>(l), lp.attention, w));
        break;
    }
    switch (lp.mlp.kind) {
      case mlp_kind::dense: EDGE_RETURN_IF_ERROR(pass.dense_mlp(lp.mlp, w)); break;
      case mlp_kind::moe: EDGE_RETURN_IF_ERROR(pass.moe_mlp(moe_index++, lp.mlp, w)); break;
    }
  }
  if (step.rows == 0) return {};

  // Only the rows that produce logits go through the final norm and the classifier.
  EDGE_RETURN_IF_ERROR(kernels::run_rmsnorm({.x = buffers.x, .row_index = step.last_token,
                                             .weight = weights.final_norm, .out = buffers.last, .rows = step.rows,
                                             .cols = plan.hidden, .x_stride = plan.hidden, .out_stride = plan.hidden,
                                             .eps = plan.norm_eps},
                                            stream));
  return pass.matmul(buffers.last, plan.hidden, weights.lm_head, nullptr, buffers.logits, plan.vocab, plan.vocab,
                     plan.hidden, false, step.rows);
}

std::int64_t count_decode_launches(const model_plan& plan, const forward_weights& weights,
                                   const forward_buffers& buffers, const kv_cache_view& kv) {
  const std::int32_t ids[] = {0}, positions[] = {0}, seq[] = {0}, tables[] = {0}, table_begin[] = {0, 1};
  const std::int32_t seq_begin[] = {0, 1};
  const std::int64_t slots[] = {0}, last[] = {0};
  const forward_step step{.ids = ids, .positions = positions, .seq = seq, .slots = slots, .block_tables = tables,
                          .table_begin = table_begin, .seq_begin = seq_begin, .last_token = last, .tokens = 1,
                          .seqs = 1, .rows = 1, .max_run = 1};
  std::int64_t launches = 0;
  const kernels::stream count{.where = kernels::device::count, .launches = &launches};
  return run_forward(plan, weights, buffers, step, kv, count).ok() ? launches : -1;
}

}  // namespace edge::backend
