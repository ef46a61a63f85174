// A loaded Llama-family model: hyperparameters, weight views, tokenizer and chat template.
//
// Formats (chosen by content, not by name):
//   * a GGUF file (architectures "llama", "qwen2", "qwen3", "qwen3moe" and "deepseek2" (DeepSeek-V3,
//     Kimi K2: latent attention with attn_kv_b whole, as llama.cpp's converter wrote it before
//     splitting it into attn_k_b / attn_v_b), experts stacked per layer; tensors
//     F32/F16/BF16/Q4_0/Q8_0/Q4_K/Q5_K/Q6_K; tokenizer from its metadata)
//   * a llama2.c checkpoint (.bin), with its tokenizer file beside it or given explicitly
//   * a Hugging Face folder: config.json (LlamaForCausalLM, Qwen2ForCausalLM,
//     Qwen3ForCausalLM, MistralForCausalLM, Qwen3MoeForCausalLM, Glm4MoeForCausalLM,
//     DeepseekV3ForCausalLM, GlmMoeDsaForCausalLM),
//     model.safetensors or sharded *.safetensors with model.safetensors.index.json,
//     tokenizer.json, tokenizer_config.json (or, for folders that `edgeinfer quantize` wrote from
//     a GGUF or llama2.c model, tokenizer.gguf / tokenizer.bin);
//     weights in F32/F16/BF16 or compressed-tensors' pack-quantized INT4 (weight_packed,
//     weight_scale, weight_shape) and float-quantized FP8 (F8_E4M3 weight, weight_scale)
//
// Projection matrices (Q, K, V, O, gate, up, down) become load_options::weight_dtype: as stored
// by default, where GGUF Q4_0 is repacked into INT4 with groups of 32 (the same numbers, no
// requantization), GGUF Q8_0 becomes f16 (every value is an int8 times an f16 scale; f16 rounds
// it to 11 significant bits, bf16 would keep 8) and GGUF Q4_K / Q5_K / Q6_K stay as the file's
// blocks (weight formats of their own, used in place); or quantized on load to int4 / fp8 (round to
// nearest, edge/kernels/weight_format.h), or converted to bf16 / f16 / f32. A quantized source
// is dequantized exactly before it is converted. The token embedding and the classifier are
// never quantized on load (as llm-compressor's W4A16 / W8A16 recipes leave lm_head and the
// embedding in 16 bits): with int4 or fp8 they stay as stored (Q4_0/Q8_0/K-quant embedding
// tables are decoded to f16), with bf16 / f16 / f32 they are converted too.
//
// Weights are used in place from the file mappings wherever their layout allows (a tensor a
// file places at an address misaligned for its type is copied into a buffer the model owns);
// converted matrices live in model_weights::storage, and the file pages they came from are
// released. Every page of every tensor is read in before load_model returns, so the first
// request does not wait on the disk. RoPE layout: adjacent_pairs for GGUF "llama" (llama.cpp's
// converter permutes the Q/K rows of Hugging Face checkpoints for it), GGUF "deepseek2" (the
// rotated parts of Q and K, unpermuted: DeepSeek-V3's rope_interleave) and llama2.c; half_split
// for Hugging Face folders (but DeepSeek-V3's with rope_interleave) and GGUF "qwen2", "qwen3" and
// "qwen3moe".
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "edge/backend/io/mapped_file.h"
#include "edge/backend/model/model_config.h"
#include "edge/backend/model/tensor.h"
#include "edge/backend/tokenizer/chat_template.h"
#include "edge/backend/tokenizer/tokenizer.h"
#include "edge/common/status.h"

namespace edge::backend {

// Q, K and V (and gate and up) are stacked into one matrix each when loading converted them
// (quantized, repacked or widened into buffers of the model's own) and they share a format:
// wqkv and w_gate_up then hold the data, and wq, wk, wv, w_gate, w_up are views of their rows.
// Weights used in place from a file stay separate (stacking would copy them out of the file's
// pages), and wqkv / w_gate_up are absent: the CPU executor runs the parts as they are and the
// CUDA executor stacks them as it uploads them.
// One routed expert of a Mixture-of-Experts layer: a SwiGLU block.
struct expert_weights {
  weight_matrix w_gate;     // [expert_intermediate, hidden]
  weight_matrix w_up;       // [expert_intermediate, hidden]
  weight_matrix w_down;     // [hidden, expert_intermediate]
  weight_matrix w_gate_up;  // [2 expert_intermediate, hidden]: rows of w_gate, w_up; or absent
};

// In a Mixture-of-Experts layer (model_plan's mlp_kind::moe) w_gate, w_up and w_down are the
// shared experts' (absent when it has none), beside the router and the routed experts.
// In a latent attention layer (mla_config) wq is q_a_proj ([q_lora_rank, hidden]) or, without
// q_lora_rank, q_proj ([num_heads * qk_head_dim, hidden]); wk is kv_a_proj_with_mqa
// ([kv_lora_rank + qk_rope_head_dim, hidden]); wv is absent; wo is [hidden, num_heads *
// v_head_dim]; wqkv stacks wq and wk.
struct layer_weights {
  tensor_view attn_norm;   // [hidden]
  weight_matrix wq;        // [num_heads * head_dim, hidden]
  weight_matrix wk;        // [num_kv_heads * head_dim, hidden]
  weight_matrix wv;        // [num_kv_heads * head_dim, hidden]
  weight_matrix wo;        // [hidden, num_heads * head_dim]
  // Latent attention only.
  tensor_view q_a_norm;    // [q_lora_rank] (q_lora_rank > 0)
  weight_matrix wq_b;      // [num_heads * qk_head_dim, q_lora_rank] (q_lora_rank > 0)
  tensor_view kv_a_norm;   // [kv_lora_rank]
  weight_matrix wkv_b;     // [num_heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]: per head K rows, then V rows
  // [num_heads * kv_lora_rank, qk_nope_head_dim]: per head, wkv_b's K rows transposed, which
  // the absorbed query multiplies by; computed on load in wkv_b's format.
  weight_matrix w_uk_t;
  // DeepSeek Sparse Attention's indexer (a layer that runs its own).
  weight_matrix index_wq;        // [index_heads * index_head_dim, q_lora_rank]
  weight_matrix index_wk;        // [index_head_dim, hidden]
  tensor_view index_k_norm;      // [index_head_dim] LayerNorm weight
  tensor_view index_k_norm_bias; // [index_head_dim]
  weight_matrix index_weights;   // [index_heads, hidden] (never quantized on load)
  tensor_view bq;          // [num_heads * head_dim]     (Qwen2 only; absent otherwise)
  tensor_view bk;          // [num_kv_heads * head_dim]  (Qwen2 only)
  tensor_view bv;          // [num_kv_heads * head_dim]  (Qwen2 only)
  tensor_view q_norm;      // [head_dim] every Q head's RMSNorm weight (qk_norm only)
  tensor_view k_norm;      // [head_dim] every K head's (qk_norm only)
  tensor_view ffn_norm;    // [hidden]
  weight_matrix w_gate;    // [intermediate, hidden]
  weight_matrix w_up;      // [intermediate, hidden]
  weight_matrix w_down;    // [hidden, intermediate]
  weight_matrix wqkv;      // [(num_heads + 2 num_kv_heads) * head_dim, hidden]: rows of wq, wk, wv; or absent
  weight_matrix w_gate_up; // [2 intermediate, hidden]: rows of w_gate, w_up; or absent
  weight_matrix router;    // [experts, hidden] (MoE layers; never quantized on load)
  tensor_view router_bias; // [experts] the correction bias of a sigmoid router (when it has one)
  std::vector<expert_weights> experts;  // [experts] (MoE layers)
};

struct model_weights {
  tensor_view token_embedding;  // [vocab, hidden]
  std::vector<layer_weights> layers;
  tensor_view final_norm;       // [hidden]
  weight_matrix lm_head;        // [vocab, hidden]; the token embedding's data when tied and not converted
  // Buffers that converted or realigned weights point into.
  std::vector<std::shared_ptr<const std::byte[]>> storage;
};

// The format of the projection matrices (what --weight-dtype chose): the routed experts' in a
// Mixture-of-Experts model, else the attention's.
kernels::weight_format projection_format(const model_weights& weights);

// Bytes of the weight matrices (values and scales; norms, biases and the embedding table left
// out): all of them, the routed experts' share, and what one token reads on its way through the
// model: every matrix but the routed experts, plus each MoE layer's experts_per_token experts
// (their average size).
struct weight_footprint {
  std::uint64_t total_bytes = 0;
  std::uint64_t routed_expert_bytes = 0;
  std::uint64_t active_bytes_per_token = 0;
};
weight_footprint footprint_of(const model_config& config, const model_weights& weights);

// "qwen3_moe, 128 experts (8 per token, 0 shared)", "deepseek_v3, latent attention (kv_lora_rank
// 512 + rope 64), 384 experts (8 per token, 1 shared)", or the architecture alone for a dense
// grouped-query model.
std::string describe_architecture(const model_config& config);

enum class model_format { gguf, llama2c, hugging_face };

struct model {
  std::string name;  // the served model id by default
  model_format format = model_format::gguf;
  model_config config;
  model_weights weights;
  std::unique_ptr<tokenizer> tok;
  backend::chat_template chat_template;  // the model's own, or the one --chat-template chose
  bool synthetic = false;  // written by `edgeinfer make-model`: random weights

  // What the views point into, besides weights.storage.
  std::vector<std::shared_ptr<const mapped_file>> files;
};

struct load_options {
  std::filesystem::path path;                     // file or folder
  // llama2.c: the tokenizer file; by default tokenizer.bin, else tok<vocab_size>.bin, beside it.
  std::optional<std::filesystem::path> tokenizer;
  // A built-in chat template instead of the model's own Jinja template (GGUF
  // tokenizer.chat_template, tokenizer_config.json "chat_template" or chat_template.jinja), or a
  // Jinja template read from a file instead. The built-in one wins when both are given.
  std::optional<chat_template_kind> chat_template;
  std::optional<std::filesystem::path> chat_template_file;
  // What the projection matrices become (see above); nullopt ("auto"): as stored.
  std::optional<kernels::weight_format> weight_dtype;
  // int4 on load: inputs per scale (a power of two up to 128; rows it does not divide take the
  // largest power of two that does).
  std::int64_t int4_group_size = kernels::int4_traits::max_group_size;
  // weight_dtype applies to the routed experts only; the other projections stay as stored.
  bool quantize_experts_only = false;
  // weight_dtype applies to the classifier as well (llama.cpp's quantized files have it so); a
  // token embedding tied to it stays as stored, its lookups reading one row a token.
  bool quantize_classifier = false;
  // For the CPU executor: projection, expert and classifier matrices are rearranged into CPU
  // row tiles (edge/kernels/weight_format.h): INT4 (groups of 32 or more) and INT8 where this CPU
  // runs the integer matmul on AVX-512 VNNI, f16, bf16 and FP8 where it has AVX-512 (weights used
  // in place from a file are copied out of it). The same numbers; writers (quantize) and the
  // CUDA executor read the row layout (the CUDA placement unpacks tiles as it uploads).
  bool cpu_tiles = false;
  // Called with (bytes done, bytes total) while weights are read; may be empty.
  std::function<void(std::uint64_t, std::uint64_t)> progress;
};

// Errors say which file: not_found for a missing model or tokenizer; invalid_argument for a file
// in no format edgeinfer reads, a tensor type it does not read (GGUF's Q4_1 or IQ types, for example) or
// a tensor whose shape disagrees with the configuration; data_loss for truncation;
// unimplemented for architectures and features not supported (e.g. other RoPE scaling types,
// asymmetric or activation-ordered compressed-tensors checkpoints).
result<std::unique_ptr<model>> load_model(const load_options& options);

// The chat template load_model would serve options.path with (chosen by the same rules, from
// the same files, with --chat-template's choice in options), without reading its weights: for
// `edgeinfer render-chat`. A folder needs no config.json or weights: its tokenizer_config.json
// (or chat_template.jinja) is enough. Errors: a template that does not parse (line and column),
// a file that cannot be read.
result<chat_template> load_chat_template(const load_options& options);

}  // namespace edge::backend
