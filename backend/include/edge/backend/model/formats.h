// The format-specific halves of load_model (model.h): hyperparameters and weight views from
// each checkpoint format, before a tokenizer is attached. Every weight is checked for the
// exact shape the configuration implies and for a dtype edgeinfer reads.
#pragma once

#include <span>
#include <string_view>

#include "edge/backend/model/gguf.h"
#include "edge/backend/model/model.h"
#include "edge/backend/model/model_config.h"
#include "edge/backend/model/tensor.h"
#include "edge/common/status.h"

namespace edge::backend {

struct parsed_config {
  model_config config;
  bool synthetic = false;  // written by `edgeinfer make-model`
};

// config.json of a Hugging Face folder (LlamaForCausalLM, Qwen2ForCausalLM,
// MistralForCausalLM). RoPE layout half_split. Unsupported features (other rope_scaling types,
// biases on o_proj or the MLP, activations other than SiLU) are unimplemented.
result<parsed_config> parse_hf_config(std::string_view config_json);

// The hyperparameters in a GGUF's metadata (general.architecture "llama" or "qwen2"). Llama 3
// RoPE scaling is recognised from the rope_freqs.weight tensor llama.cpp's converter writes.
result<parsed_config> config_from_gguf(const gguf_file& file);

// Binds the named tensors of each format to the model's weights. A missing tensor, a shape
// other than the configuration's or an unreadable dtype is invalid_argument naming the tensor.
result<model_weights> weights_from_gguf(const gguf_file& file, const model_config& config);
result<model_weights> weights_from_hf(std::span<const tensor_view> tensors, const model_config& config);

// A llama2.c checkpoint (legacy version 0: seven int32 hyperparameters, then F32 arrays). The
// header must be plausible and the size exact; anything else is invalid_argument, so this also
// serves to recognise the format.
struct llama2c_checkpoint {
  model_config config;
  model_weights weights;  // views into the bytes parsed
};
result<llama2c_checkpoint> parse_llama2c(std::span<const std::byte> bytes);

// "[4096, 128256]".
std::string shape_to_string(std::span<const std::int64_t> shape);

}  // namespace edge::backend
