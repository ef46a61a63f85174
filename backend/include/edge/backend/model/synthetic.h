// Synthetic models (`edgeinfer make-model`): seeded random weights at the exact shapes of real
// models, with a byte-level BPE tokenizer of the model's vocabulary size, for load and speed
// tests where real weights are too big to ship. Clearly marked as synthetic: config.json
// "edgeinfer_synthetic": true (and the safetensors __metadata__ "edgeinfer_synthetic": "true"),
// or the GGUF metadata flag edgeinfer.synthetic = true; load_model sets model::synthetic.
//
// Weights are uniform with the standard deviation of N(0, 0.02) (norms are 1.0), so a forward
// pass gives finite logits. Every element's value depends only on the seed, the tensor and its
// position, so the same seed gives the same bytes every time, and the GGUF and safetensors
// forms of a model hold the same network, laid out as llama.cpp's converter lays it out: a GGUF
// "llama"'s Q/K rows permuted for its adjacent-pair RoPE, a "qwen3moe"'s or "deepseek2"'s experts
// stacked per layer, norms, biases, routers and correction biases in F32 (holding the dtype's
// values). GGUF holds no GLM-4.5 or GLM-5, a qwen3moe GGUF no dense layer, and a deepseek2 GGUF
// no DeepSeek-V3 that llama.cpp would run differently (expert groups, rope_interleave false, YaRN
// with mscale other than mscale_all_dim or betas other than 32 / 1, rms_norm_eps other than the
// q_a / kv_a norms' 1e-6, q_lora present exactly when there are 27 layers, tied embeddings, no
// shared experts): write_synthetic_model refuses those as unimplemented.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "edge/backend/model/model_config.h"
#include "edge/common/status.h"
#include "edge/kernels/dtype.h"

namespace edge::backend {

enum class synthetic_format {
  safetensors,  // a Hugging Face folder: config.json, model.safetensors (or shards + index), tokenizer files
  gguf,         // one .gguf file, tokenizer in its metadata
};

std::optional<synthetic_format> parse_synthetic_format(std::string_view name);

struct synthetic_preset {
  std::string name;         // "tiny", "llama-3.2-1b", ...
  std::string description;  // one line, for --help
  model_config config;
  std::int64_t special_tokens = 0;  // the last ids of the vocabulary: special and reserved tokens
};

// tiny (milliseconds to write, for tests), tiny-qwen2, tiny-hd128 (heads of 128), tiny-qwen3,
// tiny-qwen3-moe, tiny-qwen3-moe-sparse (every layer sparse, as GGUF holds it), tiny-glm4-moe,
// deepseek-v3-tiny, deepseek-v3-tiny-gguf (as GGUF deepseek2 holds it), deepseek-v3-tiny-qproj,
// glm-5-tiny, llama-3.2-1b, llama-3-8b, qwen2.5-0.5b, qwen3-30b-a3b, qwen3-30b-a3b-dense,
// deepseek-v3-small (a few GB, GGUF-able), kimi-k2, glm-5, glm-4.5-air.
std::span<const synthetic_preset> synthetic_presets();
const synthetic_preset* find_synthetic_preset(std::string_view name);

struct synthetic_options {
  std::string preset = "tiny";
  synthetic_format format = synthetic_format::safetensors;
  std::uint64_t seed = 0;
  kernels::dtype dtype = kernels::dtype::bf16;
  // safetensors: the projections (attention, MLPs, routed and shared experts) as FP8 E4M3 with a
  // weight_scale_inv per 128 × 128 block, DeepSeek-V3's FP8 format (quant_method "fp8"); the
  // embedding, classifier, routers and norms stay in `dtype`.
  bool fp8_blocks = false;
  // The preset's first `layers` layers only (each at its real shape); 0: all of them.
  std::int64_t layers = 0;
  // A Mixture-of-Experts preset's first `experts` routed experts only (each at its real shape,
  // experts_per_token kept, expert groups merged into one where they no longer divide); 0: all.
  // What a token reads is unchanged; a batch finds fewer distinct experts to share.
  std::int64_t experts = 0;
  // The context length the model declares (max_position_embeddings, GGUF context_length) in
  // place of the preset's; 0: the preset's. A longer context makes a small model fit for
  // long-prompt serving tests (prompt caching across long sessions) on a CPU.
  std::int64_t context_length = 0;
  // safetensors: the folder to create (an existing one must be empty or an earlier make-model
  // output, whose files are replaced); gguf: the file to write.
  std::filesystem::path out;
  // safetensors: largest shard; a bigger model is split into model-0000N-of-0000M.safetensors
  // files listed by model.safetensors.index.json.
  std::uint64_t max_shard_bytes = 5'000'000'000;
  // Called with (bytes of weights written, bytes in all) as the weights are written.
  std::function<void(std::uint64_t, std::uint64_t)> progress;
};

// Writes the model and returns the path written (folder or file). Weights are streamed: memory
// use stays a few megabytes whatever the model size.
result<std::filesystem::path> write_synthetic_model(const synthetic_options& options);

}  // namespace edge::backend
