// Rotary position embedding, in place on Q or K rows.
//
// For each token at position p, pair i of every head is rotated by the angle p * inv_freq[i].
// Which elements form pair i depends on the layout: (2i, 2i+1) for GGUF / llama2.c weights,
// (i, i + head_dim/2) for Hugging Face weights. inv_freq (with any rope scaling already
// applied) comes from rope_inv_freq().
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "edge/common/status.h"
#include "edge/kernels/stream.h"

namespace edge::kernels {

enum class rope_pairs { adjacent, half_split };

struct rope_llama3_scaling {
  double factor;
  double low_freq_factor;
  double high_freq_factor;
  double original_max_position;

  friend bool operator==(const rope_llama3_scaling&, const rope_llama3_scaling&) = default;
};

// inv_freq[i] = theta^(-2i/head_dim) for i < head_dim/2, then the Llama-3 frequency scaling
// when given. Computed in double, stored as float.
std::vector<float> rope_inv_freq(std::int64_t head_dim, double theta,
                                 const std::optional<rope_llama3_scaling>& scaling);

struct rope_params {
  float* x;                        // [tokens, heads, head_dim], token stride x_stride
  const std::int32_t* positions;   // [tokens]
  const float* inv_freq;           // [head_dim / 2]
  std::int64_t tokens = 0;
  std::int64_t heads = 0;
  std::int64_t head_dim = 0;       // even
  std::int64_t x_stride = 0;
  rope_pairs pairs = rope_pairs::adjacent;
};

status run_rope(const rope_params& p, const stream& s);

}  // namespace edge::kernels
