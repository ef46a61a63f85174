#include "weight_binding.h"

#include "edge/backend/model/formats.h"
#include "edge/common/format.h"

namespace edge::backend {

tensor_index::tensor_index(std::span<const tensor_view> tensors) {
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

status check_shape(const tensor_view& tensor, const std::vector<std::int64_t>& shape) {
  if (tensor.shape == shape) return {};
  return invalid_argument(edge::format("tensor \"{}\" has shape {}, expected {}", tensor.name,
                                       shape_to_string(tensor.shape), shape_to_string(shape)));
}

result<model_weights> bind_weights(const tensor_index& tensors, const model_config& config, const tensor_names& names) {
  const std::int64_t hidden = config.hidden_size;
  const std::int64_t q_width = config.num_heads * config.head_dim;
  const std::int64_t kv_width = config.num_kv_heads * config.head_dim;
  const std::int64_t ffn = config.intermediate_size;

  model_weights weights;
  EDGE_ASSIGN_OR_RETURN(weights.token_embedding, tensors.require(names.token_embedding, {config.vocab_size, hidden}));
  EDGE_ASSIGN_OR_RETURN(weights.final_norm, tensors.require(names.final_norm, {hidden}));
  if (config.tie_embeddings) {
    weights.lm_head = weights.token_embedding;
  } else {
    EDGE_ASSIGN_OR_RETURN(weights.lm_head, tensors.require(names.lm_head, {config.vocab_size, hidden}));
  }

  weights.layers.reserve(static_cast<std::size_t>(config.num_layers));
  for (std::int64_t i = 0; i < config.num_layers; ++i) {
    const auto name = names.layer(i);
    layer_weights layer;
    EDGE_ASSIGN_OR_RETURN(layer.attn_norm, tensors.require(name.attn_norm, {hidden}));
    EDGE_ASSIGN_OR_RETURN(layer.wq, tensors.require(name.wq, {q_width, hidden}));
    EDGE_ASSIGN_OR_RETURN(layer.wk, tensors.require(name.wk, {kv_width, hidden}));
    EDGE_ASSIGN_OR_RETURN(layer.wv, tensors.require(name.wv, {kv_width, hidden}));
    EDGE_ASSIGN_OR_RETURN(layer.wo, tensors.require(name.wo, {hidden, q_width}));
    if (config.qkv_bias) {
      EDGE_ASSIGN_OR_RETURN(layer.bq, tensors.require(name.bq, {q_width}));
      EDGE_ASSIGN_OR_RETURN(layer.bk, tensors.require(name.bk, {kv_width}));
      EDGE_ASSIGN_OR_RETURN(layer.bv, tensors.require(name.bv, {kv_width}));
    }
    EDGE_ASSIGN_OR_RETURN(layer.ffn_norm, tensors.require(name.ffn_norm, {hidden}));
    EDGE_ASSIGN_OR_RETURN(layer.w_gate, tensors.require(name.w_gate, {ffn, hidden}));
    EDGE_ASSIGN_OR_RETURN(layer.w_up, tensors.require(name.w_up, {ffn, hidden}));
    EDGE_ASSIGN_OR_RETURN(layer.w_down, tensors.require(name.w_down, {hidden, ffn}));
    weights.layers.push_back(std::move(layer));
  }
  return weights;
}

}  // namespace edge::backend
