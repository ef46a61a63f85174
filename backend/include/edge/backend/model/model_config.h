// The hyperparameters of a Llama-family decoder, whatever file format they came from.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace edge::backend {

enum class architecture { llama, qwen2, mistral, qwen3 };

std::string_view to_string(architecture arch);

// Which elements of a head RoPE rotates together.
enum class rope_layout {
  adjacent_pairs,  // (0,1), (2,3), ...: GGUF "llama" and llama2.c checkpoints
  half_split,      // (i, i + head_dim/2): Hugging Face checkpoints
};

// rope_scaling of type "llama3" (Llama 3.1+): long wavelengths are slowed by `factor`, short
// ones kept, and the band between interpolated.
struct rope_scaling_llama3 {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  std::int64_t original_max_position = 8192;
};

struct model_config {
  architecture arch = architecture::llama;
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;        // model width ("dim")
  std::int64_t intermediate_size = 0;  // feed-forward width
  std::int64_t num_layers = 0;
  std::int64_t num_heads = 0;
  std::int64_t num_kv_heads = 0;       // < num_heads: grouped-query attention
  std::int64_t head_dim = 0;           // usually hidden_size / num_heads
  std::int64_t max_position = 0;       // context length the model was trained for
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  rope_layout rope = rope_layout::adjacent_pairs;
  std::optional<rope_scaling_llama3> rope_scaling;
  bool tie_embeddings = false;  // the classifier is the token embedding
  bool qkv_bias = false;        // Qwen2: biases on the Q, K and V projections
  bool qk_norm = false;         // Qwen3: an RMSNorm over each head of Q and of K ([head_dim] weights), before RoPE
};

}  // namespace edge::backend
