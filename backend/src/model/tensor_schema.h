// Every tensor of a configuration, under each format's name, with its shape and what it is: the
// one list that the readers (hf_model.cpp, gguf_model.cpp, through names_for and the weight
// binding) and the writers (synthetic.cpp, quantized_checkpoint.cpp) take tensor names from.
// Which tensors a configuration has follows its fields (mla, dsa, moe, qkv_bias, qk_norm, tied
// embeddings), never its architecture's name.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "edge/backend/model/model.h"
#include "weight_binding.h"

namespace edge::backend {

enum class tensor_format { hf, gguf };

// What a synthetic checkpoint fills a tensor with.
enum class tensor_fill {
  random,
  ones,
  rope_factors,  // llama.cpp's rope_freqs of the configuration's RoPE scaling
};

struct schema_tensor {
  std::string hf;    // the Hugging Face name; "" where such checkpoints have none (rope_freqs)
  std::string gguf;  // the GGUF name ("" where llama.cpp's converter leaves the tensor out); a
                     // routed expert's matrix names the layer's stack of them ([experts, rows, cols])
  std::vector<std::int64_t> shape;  // [rows, cols] or [n], as Hugging Face stores it
  std::int64_t layer = -1;          // -1: the model's own
  std::int64_t expert = -1;         // a routed expert's matrix
  // Where the weights hold it; all null for tensors the loaders skip (multi-token prediction).
  std::string tensor_names::* model_slot = nullptr;
  std::string layer_tensor_names::* layer_slot = nullptr;
  std::string expert_tensor_names::* expert_slot = nullptr;
  weight_matrix layer_weights::* layer_matrix = nullptr;  // the layer's matrix, or
  tensor_view layer_weights::* layer_vector = nullptr;    // the layer's norm or bias
  weight_matrix expert_weights::* expert_matrix = nullptr;
  bool projection = false;  // a matrix that FP8 releases store in blocks, quantization quantizes
  bool router = false;      // kept in float by llama.cpp's converter
  bool rope_rows = false;   // Q and K (weights and biases): rows in the order of the RoPE layout
  tensor_fill fill = tensor_fill::random;
};

std::vector<schema_tensor> tensor_schema(const model_config& c);

// The names the weight binding finds a checkpoint's tensors by.
tensor_names names_for(const model_config& c, tensor_format format);

// What reading a GGUF's configuration looks for before the configuration is known: the
// classifier (absent when it is tied to the embedding), the RoPE scaling factors, a router's
// correction bias.
std::string_view gguf_classifier_name();
std::string_view gguf_rope_factors_name();
// A layer's router correction bias, which tells whether a GGUF's router has one.
std::string gguf_router_bias_name(std::int64_t layer);

}  // namespace edge::backend
