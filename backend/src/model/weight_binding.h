// Binding a format's named tensors to model_weights, with the shape checks every format shares.
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "edge/backend/model/formats.h"
#include "edge/backend/model/model.h"
#include "edge/common/status.h"
#include "weight_conversion.h"

namespace edge::backend {

class tensor_index {
 public:
  // fp8_block_rows / _cols: the block of the checkpoint's weight_scale_inv scales (0: none).
  explicit tensor_index(std::span<const tensor_view> tensors, std::int64_t fp8_block_rows = 0,
                        std::int64_t fp8_block_cols = 0);

  const tensor_view* find(std::string_view name) const;
  // The tensor `name`, which must have exactly `shape`: invalid_argument otherwise.
  result<tensor_view> require(std::string_view name, const std::vector<std::int64_t>& shape) const;
  // The same for a norm or bias, which must also be float elements.
  result<tensor_view> require_vector(std::string_view name, std::int64_t length) const;
  // The weight matrix `name` ([rows, cols]): that tensor (float elements, GGUF Q4_0 / Q8_0 /
  // Q4_K / Q5_K / Q6_K), an
  // F8_E4M3 tensor with its `…weight_scale` (per row or tensor) or `…weight_scale_inv` (per
  // block), or for a name ending in "weight" compressed-tensors' `…weight_packed` +
  // `…weight_scale` (+ `…weight_shape`). Asymmetric (`…weight_zero_point`)
  // and activation-ordered (`…weight_g_idx`) INT4 is unimplemented.
  result<matrix_source> require_matrix(std::string_view name, std::int64_t rows, std::int64_t cols) const;
  // Matrix `index` of the stacked tensor `name`, which must be [count, rows, cols] of float
  // elements or GGUF Q4_0 / Q8_0 / K-quant blocks: a view of its bytes (each matrix of a stack is
  // contiguous, and starts at a multiple of its element or block size), named "name[index]".
  result<matrix_source> require_matrix_slice(std::string_view name, std::int64_t index, std::int64_t count,
                                             std::int64_t rows, std::int64_t cols) const;

 private:
  std::unordered_map<std::string_view, const tensor_view*> by_name_;
  std::int64_t fp8_block_rows_ = 0;
  std::int64_t fp8_block_cols_ = 0;
};

// One routed expert's matrices, by name: each its own 2-D tensor, or (stacked_index set) the
// layer's stacked tensors of every expert's matrix ([experts, rows, cols], GGUF's ffn_*_exps),
// of which this expert is matrix stacked_index.
struct expert_tensor_names {
  std::string w_gate, w_up, w_down;
  std::optional<std::int64_t> stacked_index;
};

// What a format calls each weight. In a Mixture-of-Experts layer (moe_config::sparse) w_gate,
// w_up and w_down name the shared experts (used when there are any).
// Latent attention (mla_config): wq names q_a_proj (or q_proj without q_lora_rank), wk
// kv_a_proj_with_mqa, and wv goes unused.
struct layer_tensor_names {
  std::string attn_norm, wq, wk, wv, wo;
  std::string q_a_norm, wq_b, kv_a_norm, wkv_b;  // latent attention
  std::string index_wq, index_wk, index_k_norm, index_k_norm_bias, index_weights;  // DSA
  std::string bq, bk, bv;  // used when the configuration has qkv_bias
  std::string q_norm, k_norm;  // used when the configuration has qk_norm
  std::string ffn_norm, w_gate, w_up, w_down;
  std::string router;       // MoE layers
  std::string router_bias;  // MoE layers whose router has a correction bias
  std::function<expert_tensor_names(std::int64_t expert)> expert;  // MoE layers
};
struct tensor_names {
  std::string token_embedding;
  std::string final_norm;
  std::string lm_head;  // used unless the configuration ties it to the token embedding
  std::function<layer_tensor_names(std::int64_t layer)> layer;
};

// Binds and converts (weight_conversion.h) every weight.
result<model_weights> bind_weights(const tensor_index& tensors, const model_config& config, const tensor_names& names,
                                   const weight_options& options);

}  // namespace edge::backend
