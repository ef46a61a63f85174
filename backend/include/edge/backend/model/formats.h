// The format-specific halves of load_model (model.h): hyperparameters and weight views from
// each checkpoint format, before a tokenizer is attached. Every weight is checked for the
// exact shape the configuration implies and for a dtype edgeinfer reads, and the projection
// matrices are converted to the weight format asked for (weight_options).
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <string_view>

#include "edge/backend/io/gguf.h"
#include "edge/backend/model/model.h"
#include "edge/backend/model/model_config.h"
#include "edge/backend/model/tensor.h"
#include "edge/common/status.h"

namespace edge {
class thread_pool;
}

namespace edge::backend {

struct parsed_config {
  model_config config;
  bool synthetic = false;  // written by `edgeinfer make-model`
  // config.json's compressed-tensors quantization_config: int4 (pack-quantized, symmetric,
  // groups or channels) or fp8 (float-quantized, E4M3, channels or the whole tensor).
  std::optional<kernels::weight_format> quantized;
  // quant_method "fp8" with weight_block_size (DeepSeek-V3, Kimi K2, GLM, Qwen3 FP8 releases):
  // E4M3 weights with one weight_scale_inv per block of these rows × columns; 0 otherwise.
  std::int64_t fp8_block_rows = 0;
  std::int64_t fp8_block_cols = 0;
};

// What the weight binders make of the projection matrices (load_options::weight_dtype).
struct weight_options {
  std::optional<kernels::weight_format> target;  // nullopt: as stored
  std::int64_t int4_group_size = kernels::int4_traits::max_group_size;  // target int4: inputs per scale
  bool experts_only = false;                      // target applies to the routed experts only
  bool classifier = false;                        // target applies to the classifier too
  // The checkpoint's FP8 block shape (parsed_config::fp8_block_rows / _cols), 0 when it has none.
  std::int64_t fp8_block_rows = 0;
  std::int64_t fp8_block_cols = 0;
  thread_pool* pool = nullptr;                    // conversions run on it; null: on the caller
  // Told the bytes of each projection that was converted into a buffer of its own: load_model
  // releases those file pages.
  std::function<void(std::span<const std::byte>)> on_converted;
};

// config.json of a Hugging Face folder (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
// MistralForCausalLM, Qwen3MoeForCausalLM, Glm4MoeForCausalLM, DeepseekV3ForCausalLM,
// GlmMoeDsaForCausalLM). RoPE layout half_split, but adjacent_pairs for the latent attention's
// rope_interleave (its default).
// Unsupported features (other rope_scaling types, biases on o_proj or the MLP, activations other
// than SiLU, quantization other than compressed-tensors' symmetric W4A16 and FP8 weights) are
// unimplemented. Activation quantization in a compressed-tensors config (W8A8 FP8 checkpoints)
// is accepted and not applied: activations stay in float.
result<parsed_config> parse_hf_config(std::string_view config_json);

// The hyperparameters in a GGUF's metadata (general.architecture "llama", "qwen2", "qwen3",
// "qwen3moe" or "deepseek2", with the keys llama.cpp's convert_hf_to_gguf.py writes). Llama 3 RoPE
// scaling is recognised from the rope_freqs.weight tensor llama.cpp's converter writes. A qwen3moe
// file has every layer sparse and the chosen experts' weights renormalised, as llama.cpp runs it
// (its converter keeps neither mlp_only_layers / decoder_sparse_step nor norm_topk_prob). A
// deepseek2 file (DeepSeek-V3, Kimi K2) is architecture::deepseek_v3 with latent attention
// (attention.q_lora_rank, kv_lora_rank, key_length = qk_nope + qk_rope, value_length,
// rope.dimension_count = qk_rope), leading_dense_block_count dense layers, expert_count /
// expert_used_count / expert_feed_forward_length / expert_shared_count experts routed by
// expert_gating_func (sigmoid with the exp_probs_b correction bias, or softmax), normalised by
// expert_weights_norm and scaled by expert_weights_scale, in one expert group, and YaRN read as
// llama.cpp runs it (rope.scaling.factor, original_context_length, yarn_log_multiplier; beta_fast
// 32, beta_slow 1, cos and sin unscaled); RoPE on adjacent pairs. The later layout with attn_kv_b
// split into attn_k_b / attn_v_b (attention.key_length_mla) is unimplemented.
result<parsed_config> config_from_gguf(const gguf_file& file);

// deepseek2.rope.scaling.yarn_log_multiplier per unit of transformers' mscale_all_dim: llama.cpp's
// converter writes 0.1 · mscale_all_dim, and llama.cpp's softmax factor (1 + multiplier ·
// ln(factor))² is then transformers' mscale(factor, mscale_all_dim)².
inline constexpr double gguf_yarn_log_multiplier_per_mscale = 0.1;

// general.architecture for the architectures read from GGUF; nullopt for the others.
std::optional<std::string_view> gguf_architecture_name(architecture arch);

// Binds the named tensors of each format to the model's weights. A missing tensor, a shape
// other than the configuration's or an unreadable dtype is invalid_argument naming the tensor.
// Hugging Face projections may be stored as compressed-tensors' `<name>.weight_packed` +
// `weight_scale` + `weight_shape` (INT4) or an F8_E4M3 `<name>.weight` + `weight_scale`. A GGUF
// layer stacks its routed experts in ffn_gate_exps / ffn_up_exps / ffn_down_exps ([experts, rows,
// cols]); each expert's matrices are slices of them, and a deepseek2 layer's shared experts are
// ffn_{gate,up,down}_shexp.
result<model_weights> weights_from_gguf(const gguf_file& file, const model_config& config,
                                        const weight_options& options = {});
result<model_weights> weights_from_hf(std::span<const tensor_view> tensors, const model_config& config,
                                      const weight_options& options = {});

// A llama2.c checkpoint (legacy version 0: seven int32 hyperparameters, then F32 arrays). The
// header must be plausible and the size exact; anything else is invalid_argument, so this also
// serves to recognise the format.
struct llama2c_checkpoint {
  model_config config;
  model_weights weights;  // views into the bytes parsed, or converted per the options
};
result<llama2c_checkpoint> parse_llama2c(std::span<const std::byte> bytes, const weight_options& options = {});

}  // namespace edge::backend
