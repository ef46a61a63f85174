#include "weight_binding.h"

#include <cstring>

#include "edge/backend/model/formats.h"
#include "edge/common/format.h"

namespace edge::backend {

tensor_index::tensor_index(std::span<const tensor_view> tensors, std::int64_t fp8_block_rows,
                           std::int64_t fp8_block_cols)
    : fp8_block_rows_(fp8_block_rows), fp8_block_cols_(fp8_block_cols) {
  by_name_.reserve(tensors.size());
  for (const auto& tensor : tensors) by_name_.emplace(tensor.name, &tensor);
}

const tensor_view* tensor_index::find(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

result<tensor_view> tensor_index::require(std::string_view name, const std::vector<std::int64_t>& shape) const {
  const auto* tensor = find(name);
  if (tensor == nullptr) {
    return invalid_argument(edge::format("missing tensor \"{}\" (expected shape {})", name, shape_to_string(shape)));
  }
  EDGE_RETURN_IF_ERROR(check_shape(*tensor, shape));
  return *tensor;
}

result<tensor_view> tensor_index::require_vector(std::string_view name, std::int64_t length) const {
  EDGE_ASSIGN_OR_RETURN(auto tensor, require(name, {length}));
  if (tensor.encoding != tensor_encoding::elements || tensor.type == kernels::dtype::fp8_e4m3) {
    return invalid_argument(edge::format("tensor \"{}\" is {}; norms and biases must be F32, F16 or BF16", tensor.name,
                                         type_name(tensor)));
  }
  return tensor;
}

namespace {

constexpr std::string_view weight_suffix = "weight";
// compressed-tensors packs eight 4-bit values into each int32 of a row.
constexpr std::int64_t int4_per_int32 = 8;

status check_float_scales(const tensor_view& scales) {
  if (scales.encoding != tensor_encoding::elements || scales.type == kernels::dtype::fp8_e4m3) {
    return invalid_argument(edge::format("tensor \"{}\" is {}; scales must be F32, F16 or BF16", scales.name,
                                         type_name(scales)));
  }
  return {};
}

// weight_shape, when present, must say [rows, cols].
status check_weight_shape(const tensor_view& shape, std::int64_t rows, std::int64_t cols) {
  const bool integers = shape.encoding == tensor_encoding::int32 || shape.encoding == tensor_encoding::int64;
  if (!integers || shape.elements() != 2) {
    return invalid_argument(edge::format("tensor \"{}\" must be two integers", shape.name));
  }
  std::int64_t stored[2];
  for (int i = 0; i < 2; ++i) {
    if (shape.encoding == tensor_encoding::int32) {
      std::int32_t value;
      std::memcpy(&value, shape.data + i * sizeof(value), sizeof(value));
      stored[i] = value;
    } else {
      std::memcpy(&stored[i], shape.data + i * sizeof(std::int64_t), sizeof(std::int64_t));
    }
  }
  if (stored[0] != rows || stored[1] != cols) {
    return invalid_argument(edge::format("tensor \"{}\" says [{}, {}], expected [{}, {}]", shape.name, stored[0],
                                         stored[1], rows, cols));
  }
  return {};
}

// A quantized matrix: its stored values and their scales, checked by the caller.
matrix_source scaled_source(matrix_source::kind kind, const tensor_view& values, const tensor_view& scales,
                            std::int64_t rows, std::int64_t cols) {
  matrix_source source;
  source.stored = kind;
  source.name = values.name;
  source.rows = rows;
  source.cols = cols;
  source.values = values;
  source.scales = scales;
  return source;
}

}  // namespace

result<matrix_source> tensor_index::require_matrix(std::string_view name, std::int64_t rows, std::int64_t cols) const {
  const std::string stem(name.ends_with(weight_suffix) ? name.substr(0, name.size() - weight_suffix.size()) : name);
  const bool named_weight = name.ends_with(weight_suffix);
  const tensor_view* tensor = find(name);
  const tensor_view* packed = named_weight ? find(stem + "weight_packed") : nullptr;
  if (tensor == nullptr && packed == nullptr) {
    return invalid_argument(edge::format("missing tensor \"{}\" (expected shape {})", name,
                                         shape_to_string(std::vector<std::int64_t>{rows, cols})));
  }
  const tensor_view* scales = named_weight ? find(stem + "weight_scale") : nullptr;

  if (packed != nullptr) {
    for (const char* unsupported : {"weight_zero_point", "weight_g_idx"}) {
      if (find(stem + unsupported) != nullptr) {
        return status(status_code::unimplemented,
                      edge::format("tensor \"{}{}\": asymmetric or activation-ordered INT4 weights are not supported "
                                   "(symmetric groups and channels are)",
                                   stem, unsupported));
      }
    }
    const std::vector<std::int64_t> packed_shape{rows, (cols + int4_per_int32 - 1) / int4_per_int32};
    if (packed->encoding != tensor_encoding::int32 || packed->shape != packed_shape) {
      return invalid_argument(edge::format("tensor \"{}\" is {} {}, expected I32 {}", packed->name, type_name(*packed),
                                           shape_to_string(packed->shape), shape_to_string(packed_shape)));
    }
    if (const auto* shape = find(stem + "weight_shape")) EDGE_RETURN_IF_ERROR(check_weight_shape(*shape, rows, cols));
    if (scales == nullptr) return invalid_argument(edge::format("missing tensor \"{}weight_scale\"", stem));
    EDGE_RETURN_IF_ERROR(check_float_scales(*scales));
    const std::int64_t groups = scales->shape.size() == 2 ? scales->shape[1] : 0;
    if (scales->shape.size() != 2 || scales->shape[0] != rows || groups < 1 || cols % groups != 0) {
      return status(status_code::unimplemented,
                    edge::format("tensor \"{}\" has shape {}: INT4 scales must be [{}, groups] with groups dividing {}",
                                 scales->name, shape_to_string(scales->shape), rows, cols));
    }
    matrix_source source = scaled_source(matrix_source::kind::packed_int4, *packed, *scales, rows, cols);
    source.group_size = cols / groups;
    return source;
  }

  const tensor_view* scale_inv = named_weight ? find(stem + "weight_scale_inv") : nullptr;
  if (tensor->encoding == tensor_encoding::elements && tensor->type == kernels::dtype::fp8_e4m3 && scale_inv != nullptr) {
    EDGE_RETURN_IF_ERROR(check_shape(*tensor, {rows, cols}));
    if (fp8_block_rows_ < 1 || fp8_block_cols_ < 1) {
      return invalid_argument(edge::format("tensor \"{}\" has block scales, but config.json's quantization_config "
                                           "gives no weight_block_size",
                                           scale_inv->name));
    }
    EDGE_RETURN_IF_ERROR(check_float_scales(*scale_inv));
    EDGE_RETURN_IF_ERROR(check_shape(*scale_inv, {(rows + fp8_block_rows_ - 1) / fp8_block_rows_,
                                                  (cols + fp8_block_cols_ - 1) / fp8_block_cols_}));
    matrix_source source = scaled_source(matrix_source::kind::fp8_block, *tensor, *scale_inv, rows, cols);
    source.block_rows = fp8_block_rows_;
    source.group_size = fp8_block_cols_;
    return source;
  }
  if (tensor->encoding == tensor_encoding::elements && tensor->type == kernels::dtype::fp8_e4m3) {
    EDGE_RETURN_IF_ERROR(check_shape(*tensor, {rows, cols}));
    if (scales == nullptr) return invalid_argument(edge::format("missing tensor \"{}weight_scale\" for F8_E4M3 \"{}\"", stem, name));
    EDGE_RETURN_IF_ERROR(check_float_scales(*scales));
    // One scale per row ([rows] or [rows, 1]) or one for the whole matrix.
    if (scales->elements() != rows && scales->elements() != 1) {
      return status(status_code::unimplemented,
                    edge::format("tensor \"{}\" has shape {}: FP8 scales must be one per row or one per tensor",
                                 scales->name, shape_to_string(scales->shape)));
    }
    return scaled_source(matrix_source::kind::fp8, *tensor, *scales, rows, cols);
  }
  return matrix_source_of(*tensor, rows, cols);
}

result<matrix_source> tensor_index::require_matrix_slice(std::string_view name, std::int64_t index, std::int64_t count,
                                                         std::int64_t rows, std::int64_t cols) const {
  EDGE_ASSIGN_OR_RETURN(const auto stacked, require(name, {count, rows, cols}));
  if (index < 0 || index >= count) {
    return invalid_argument(edge::format("matrix {} of tensor \"{}\" is outside its {}", index, name, count));
  }
  tensor_view slice = stacked;
  slice.name = edge::format("{}[{}]", name, index);
  slice.shape = {rows, cols};
  // Whole rows of whole blocks: every matrix starts at a multiple of the block (or element) size.
  slice.data = stacked.data + static_cast<std::size_t>(index) * slice.bytes();
  return matrix_source_of(slice, rows, cols);
}

namespace {

// A latent attention layer's weights (model.h), and the absorbed-query matrix w_uk_t computed
// from kv_b_proj: per head h, its rows h·(nope + v) .. + nope transposed to [kv_lora_rank, nope].
status bind_latent_attention(const tensor_index& tensors, const model_config& config, std::int64_t i,
                             const layer_tensor_names& name, weight_converter& convert, layer_weights& layer) {
  const mla_config& m = *config.mla;
  const std::int64_t hidden = config.hidden_size;
  const std::int64_t heads = config.num_heads;
  const auto matrix = [&](const std::string& tensor, std::int64_t rows, std::int64_t cols,
                          matrix_role role) -> result<weight_matrix> {
    EDGE_ASSIGN_OR_RETURN(const auto source, tensors.require_matrix(tensor, rows, cols));
    return convert.matrix(source, role);
  };
  const auto projection = [&](const std::string& tensor, std::int64_t rows, std::int64_t cols) {
    return matrix(tensor, rows, cols, matrix_role::projection);
  };
  if (m.q_lora_rank > 0) {
    EDGE_ASSIGN_OR_RETURN(layer.wq, projection(name.wq, m.q_lora_rank, hidden));
    EDGE_ASSIGN_OR_RETURN(layer.q_a_norm, tensors.require_vector(name.q_a_norm, m.q_lora_rank));
    EDGE_ASSIGN_OR_RETURN(layer.wq_b, projection(name.wq_b, heads * m.qk_head_dim(), m.q_lora_rank));
  } else {
    EDGE_ASSIGN_OR_RETURN(layer.wq, projection(name.wq, heads * m.qk_head_dim(), hidden));
  }
  EDGE_ASSIGN_OR_RETURN(layer.wk, projection(name.wk, m.cache_row(), hidden));
  EDGE_ASSIGN_OR_RETURN(layer.kv_a_norm, tensors.require_vector(name.kv_a_norm, m.kv_lora_rank));
  EDGE_ASSIGN_OR_RETURN(layer.wo, projection(name.wo, hidden, heads * m.v_head_dim));

  const std::int64_t per_head = m.qk_nope_head_dim + m.v_head_dim;
  EDGE_ASSIGN_OR_RETURN(const auto kv_b, tensors.require_matrix(name.wkv_b, heads * per_head, m.kv_lora_rank));
  std::vector<float> transposed(static_cast<std::size_t>(heads * m.kv_lora_rank * m.qk_nope_head_dim));
  for (std::int64_t h = 0; h < heads; ++h) {
    const std::vector<float> k_rows = weight_converter::decode(kv_b, h * per_head, m.qk_nope_head_dim);  // [nope, rank]
    float* out = transposed.data() + h * m.kv_lora_rank * m.qk_nope_head_dim;                          // [rank, nope]
    for (std::int64_t r = 0; r < m.qk_nope_head_dim; ++r) {
      for (std::int64_t c = 0; c < m.kv_lora_rank; ++c) {
        out[c * m.qk_nope_head_dim + r] = k_rows[static_cast<std::size_t>(r * m.kv_lora_rank + c)];
      }
    }
  }
  EDGE_ASSIGN_OR_RETURN(layer.wkv_b, convert.matrix(kv_b, matrix_role::projection));
  EDGE_ASSIGN_OR_RETURN(layer.w_uk_t, convert.computed(name.wkv_b + ".k_transposed", transposed, heads * m.kv_lora_rank,
                                                       m.qk_nope_head_dim, layer.wkv_b));

  weight_matrix* const first[] = {&layer.wq, &layer.wk};
  layer.wqkv = convert.stack(name.wq + "+" + name.wk, first);
  if (config.dsa && !config.dsa->shared(i)) {
    const dsa_config& d = *config.dsa;
    EDGE_ASSIGN_OR_RETURN(layer.index_wq, projection(name.index_wq, d.index_heads * d.index_head_dim, m.q_lora_rank));
    EDGE_ASSIGN_OR_RETURN(layer.index_wk, projection(name.index_wk, d.index_head_dim, hidden));
    EDGE_ASSIGN_OR_RETURN(layer.index_k_norm, tensors.require_vector(name.index_k_norm, d.index_head_dim));
    EDGE_ASSIGN_OR_RETURN(layer.index_k_norm_bias, tensors.require_vector(name.index_k_norm_bias, d.index_head_dim));
    // transformers keeps weights_proj in f32: it weighs the index heads, as a router weighs experts.
    EDGE_ASSIGN_OR_RETURN(layer.index_weights, matrix(name.index_weights, d.index_heads, hidden, matrix_role::router));
  }
  return {};
}

}  // namespace

result<model_weights> bind_weights(const tensor_index& tensors, const model_config& config, const tensor_names& names,
                                   const weight_options& options) {
  const std::int64_t hidden = config.hidden_size;
  const std::int64_t q_width = config.num_heads * config.head_dim;
  const std::int64_t kv_width = config.num_kv_heads * config.head_dim;
  const std::int64_t ffn = config.intermediate_size;

  model_weights weights;
  weight_converter convert(options, weights.storage);
  EDGE_ASSIGN_OR_RETURN(const auto embedding, tensors.require(names.token_embedding, {config.vocab_size, hidden}));
  EDGE_ASSIGN_OR_RETURN(weights.final_norm, tensors.require_vector(names.final_norm, hidden));
  if (config.tie_embeddings) {
    EDGE_ASSIGN_OR_RETURN(const auto source, matrix_source_of(embedding, config.vocab_size, hidden));
    EDGE_ASSIGN_OR_RETURN(weights.lm_head, convert.matrix(source, matrix_role::classifier));
  } else {
    EDGE_ASSIGN_OR_RETURN(const auto source, tensors.require_matrix(names.lm_head, config.vocab_size, hidden));
    EDGE_ASSIGN_OR_RETURN(weights.lm_head, convert.matrix(source, matrix_role::classifier));
  }
  const auto classifier_type = kernels::element_dtype(weights.lm_head.format);
  if (config.tie_embeddings && weights.lm_head.data != embedding.data && classifier_type &&
      *classifier_type != kernels::dtype::fp8_e4m3) {
    // A tied classifier converted to a plain format holds exactly what the embedding table
    // would become: they share the buffer.
    weights.token_embedding = embedding;
    weights.token_embedding.type = *classifier_type;
    weights.token_embedding.encoding = tensor_encoding::elements;
    weights.token_embedding.data = weights.lm_head.data;
  } else {
    EDGE_ASSIGN_OR_RETURN(weights.token_embedding, convert.embedding(embedding));
  }

  weights.layers.reserve(static_cast<std::size_t>(config.num_layers));
  for (std::int64_t i = 0; i < config.num_layers; ++i) {
    const auto name = names.layer(i);
    layer_weights layer;
    const auto projection = [&](const std::string& tensor, std::int64_t rows, std::int64_t cols) -> result<weight_matrix> {
      EDGE_ASSIGN_OR_RETURN(const auto source, tensors.require_matrix(tensor, rows, cols));
      return convert.matrix(source, matrix_role::projection);
    };
    EDGE_ASSIGN_OR_RETURN(layer.attn_norm, tensors.require_vector(name.attn_norm, hidden));
    EDGE_ASSIGN_OR_RETURN(layer.ffn_norm, tensors.require_vector(name.ffn_norm, hidden));
    if (config.mla) {
      EDGE_RETURN_IF_ERROR(bind_latent_attention(tensors, config, i, name, convert, layer));
    } else {
      EDGE_ASSIGN_OR_RETURN(layer.wq, projection(name.wq, q_width, hidden));
      EDGE_ASSIGN_OR_RETURN(layer.wk, projection(name.wk, kv_width, hidden));
      EDGE_ASSIGN_OR_RETURN(layer.wv, projection(name.wv, kv_width, hidden));
      EDGE_ASSIGN_OR_RETURN(layer.wo, projection(name.wo, hidden, q_width));
      if (config.qkv_bias) {
        EDGE_ASSIGN_OR_RETURN(layer.bq, tensors.require_vector(name.bq, q_width));
        EDGE_ASSIGN_OR_RETURN(layer.bk, tensors.require_vector(name.bk, kv_width));
        EDGE_ASSIGN_OR_RETURN(layer.bv, tensors.require_vector(name.bv, kv_width));
      }
      if (config.qk_norm) {
        EDGE_ASSIGN_OR_RETURN(layer.q_norm, tensors.require_vector(name.q_norm, config.head_dim));
        EDGE_ASSIGN_OR_RETURN(layer.k_norm, tensors.require_vector(name.k_norm, config.head_dim));
      }
      weight_matrix* const qkv[] = {&layer.wq, &layer.wk, &layer.wv};
      layer.wqkv = convert.stack(name.wq + "+" + name.wk + "+" + name.wv, qkv);
    }

    const bool sparse = config.moe && config.moe->sparse(i);
    // A dense layer's SwiGLU, or a sparse layer's shared experts (when it has them).
    const std::int64_t swiglu = sparse ? config.moe->shared_intermediate() : ffn;
    if (swiglu > 0) {
      EDGE_ASSIGN_OR_RETURN(layer.w_gate, projection(name.w_gate, swiglu, hidden));
      EDGE_ASSIGN_OR_RETURN(layer.w_up, projection(name.w_up, swiglu, hidden));
      EDGE_ASSIGN_OR_RETURN(layer.w_down, projection(name.w_down, hidden, swiglu));
      weight_matrix* const gate_up[] = {&layer.w_gate, &layer.w_up};
      layer.w_gate_up = convert.stack(name.w_gate + "+" + name.w_up, gate_up);
    }
    if (sparse) {
      const moe_config& moe = *config.moe;
      const std::int64_t width = moe.expert_intermediate;
      EDGE_ASSIGN_OR_RETURN(const auto router, tensors.require_matrix(name.router, moe.num_experts, hidden));
      EDGE_ASSIGN_OR_RETURN(layer.router, convert.matrix(router, matrix_role::router));
      if (moe.correction_bias) {
        EDGE_ASSIGN_OR_RETURN(layer.router_bias, tensors.require_vector(name.router_bias, moe.num_experts));
      }
      layer.experts.resize(static_cast<std::size_t>(moe.num_experts));
      for (std::int64_t e = 0; e < moe.num_experts; ++e) {
        const expert_tensor_names expert = name.expert(e);
        const auto expert_projection = [&](const std::string& tensor, std::int64_t rows,
                                           std::int64_t cols) -> result<weight_matrix> {
          EDGE_ASSIGN_OR_RETURN(const auto source,
                                expert.stacked_index ? tensors.require_matrix_slice(tensor, *expert.stacked_index,
                                                                                    moe.num_experts, rows, cols)
                                                     : tensors.require_matrix(tensor, rows, cols));
          return convert.matrix(source, matrix_role::expert);
        };
        expert_weights& w = layer.experts[static_cast<std::size_t>(e)];
        EDGE_ASSIGN_OR_RETURN(w.w_gate, expert_projection(expert.w_gate, width, hidden));
        EDGE_ASSIGN_OR_RETURN(w.w_up, expert_projection(expert.w_up, width, hidden));
        EDGE_ASSIGN_OR_RETURN(w.w_down, expert_projection(expert.w_down, hidden, width));
        weight_matrix* const parts[] = {&w.w_gate, &w.w_up};
        w.w_gate_up = convert.stack(w.w_gate.name + "+" + w.w_up.name, parts);
      }
    }
    weights.layers.push_back(std::move(layer));
  }
  return weights;
}

weight_footprint footprint_of(const model_config& config, const model_weights& weights) {
  weight_footprint out;
  out.total_bytes = weights.lm_head.bytes();
  for (const layer_weights& l : weights.layers) {
    std::uint64_t layer = 0;
    for (const weight_matrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.wq_b, &l.wkv_b, &l.w_uk_t, &l.index_wq, &l.index_wk,
                                   &l.index_weights, &l.w_gate, &l.w_up, &l.w_down, &l.router}) {
      layer += m->bytes();
    }
    std::uint64_t experts = 0;
    for (const expert_weights& e : l.experts) experts += e.w_gate.bytes() + e.w_up.bytes() + e.w_down.bytes();
    out.total_bytes += layer + experts;
    out.routed_expert_bytes += experts;
    out.active_bytes_per_token += layer;
    if (!l.experts.empty() && config.moe) {
      out.active_bytes_per_token += experts / l.experts.size() * static_cast<std::uint64_t>(config.moe->experts_per_token);
    }
  }
  out.active_bytes_per_token += weights.lm_head.bytes();
  return out;
}

std::string describe_architecture(const model_config& config) {
  std::string out(to_string(config.arch));
  if (config.mla) {
    out += edge::format(", latent attention (kv_lora_rank {} + rope {}", config.mla->kv_lora_rank,
                        config.mla->qk_rope_head_dim);
    if (config.dsa) out += edge::format(", DSA top {}", config.dsa->index_topk);
    out += ")";
  }
  if (config.moe) {
    const moe_config& m = *config.moe;
    out += edge::format(", {} experts ({} per token, {} shared)", m.num_experts, m.experts_per_token, m.shared_experts);
  }
  return out;
}

kernels::weight_format projection_format(const model_weights& weights) {
  // The routed experts when there are any (they hold most of the bytes, and are what
  // --quantize-layers experts quantizes), else the attention's.
  for (const layer_weights& l : weights.layers) {
    if (!l.experts.empty()) return l.experts.front().w_gate.format;
  }
  return weights.layers.empty() ? weights.lm_head.format : weights.layers.front().wq.format;
}

}  // namespace edge::backend
