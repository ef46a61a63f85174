// `edgeinfer quantize`: writes a loaded model whose projections are INT4 or FP8 as a Hugging Face
// folder in compressed-tensors' layout (what llm-compressor writes and vLLM loads), so that the
// quantized model loads again without re-quantizing and computes exactly the same logits.
//
//   config.json           the model's configuration with a compressed-tensors
//                         "quantization_config": format "pack-quantized" (INT4: symmetric, one
//                         config group per group size) or "float-quantized" (FP8 E4M3, one
//                         scale per output channel); the lm_head is listed in "ignore" when it
//                         stays in 16/32 bits
//   model.safetensors     (or shards and model.safetensors.index.json past max_shard_bytes)
//     INT4 projection P:  P.weight_packed  I32 [rows, ceil(cols / 8)]: element 8w + i in bits
//                                          4i..4i+3 of word w, as q + 8
//                         P.weight_scale   F32 [rows, cols / group_size]
//                         P.weight_shape   I64 [2] = {rows, cols}
//     FP8 projection P:   P.weight         F8_E4M3 [rows, cols]
//                         P.weight_scale   F32 [rows, 1]
//     everything else (embedding, norms, biases, a 16/32-bit lm_head): as the model holds it
//   tokenizer files       a Hugging Face source's own (tokenizer.json, tokenizer_config.json,
//                         chat_template.jinja, ...); for a GGUF source tokenizer.gguf, a GGUF of
//                         its general.* and tokenizer.* metadata only; for a llama2.c source its
//                         tokenizer file as tokenizer.bin
//
// Scales are written as f32, the values the kernels multiply, so nothing is rounded on the way.
// GGUF "llama" and llama2.c models hold their Q/K rows in the adjacent-pair RoPE order; they are
// written back in Hugging Face's half-split order, which (quantization being per row) changes no
// value. The model must have been loaded from `source` with weight_dtype int4 or fp8.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>

#include "edge/backend/model/model.h"
#include "edge/common/status.h"

namespace edge::backend {

struct quantized_checkpoint_options {
  // The options the model was loaded with: where its config.json and tokenizer files are.
  load_options source;
  // A folder that does not exist yet or is empty.
  std::filesystem::path out;
  std::uint64_t max_shard_bytes = 5'000'000'000;
  // Called with (tensor bytes written, bytes in all) as the tensors are written.
  std::function<void(std::uint64_t, std::uint64_t)> progress;
};

// Matrices in a quantized format compressed-tensors has no layout for (INT8, the GGUF K-quants:
// a classifier kept as stored) are written exactly, as f32, and listed as unquantized.
// invalid_argument when the projections are not INT4 or FP8, failed_precondition for a folder
// that is not empty, unimplemented for a model that would need two quantized formats in one
// checkpoint (an INT4 classifier beside FP8 projections); I/O errors name the file.
result<std::filesystem::path> write_quantized_checkpoint(const model& m, const quantized_checkpoint_options& options);

}  // namespace edge::backend
