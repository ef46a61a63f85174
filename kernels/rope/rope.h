// Rotary position embedding, in place on Q or K rows.
//
// For each token at position p, pair i of every head is rotated by the angle p * inv_freq[i].
// Which elements form pair i depends on the layout: (2i, 2i+1) for GGUF / llama2.c weights,
// (i, i + rotary_dim/2) for Hugging Face weights. Only the leading rotary_dim elements of a
// head rotate (partial rotary, GLM-4.5: half of each head); the rest pass through. inv_freq
// (with any rope scaling already applied) comes from rope_inv_freq(rotary_dim, …). `scale`
// multiplies the rotated elements (YaRN's attention factor, which scales cos and sin).
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

// rope_scaling of type "yarn" (DeepSeek-V3, Kimi K2): pairs that turn fewer than beta_slow
// times over the original context are interpolated (frequency / factor), those that turn more
// than beta_fast times kept, and a linear ramp over the pair index blends the band between.
// With `truncate` the ramp's ends are rounded outwards to whole pairs.
struct rope_yarn_scaling {
  double factor;
  double original_max_position;
  double beta_fast;
  double beta_slow;
  bool truncate;
  friend bool operator==(const rope_yarn_scaling&, const rope_yarn_scaling&) = default;
};

// inv_freq[i] = theta^(-2i/head_dim) for i < head_dim/2, then the Llama-3 or the YaRN frequency
// scaling when given. Computed in double, stored as float.
std::vector<float> rope_inv_freq(std::int64_t head_dim, double theta,
                                 const std::optional<rope_llama3_scaling>& scaling,
                                 const std::optional<rope_yarn_scaling>& yarn = std::nullopt);

struct rope_params {
  float* x;                        // [tokens, heads, head_dim], token stride x_stride
  const std::int32_t* positions;   // [tokens]
  const float* inv_freq;           // [rotary_dim / 2]
  std::int64_t tokens = 0;
  std::int64_t heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t rotary_dim = 0;     // even, at most head_dim; 0: head_dim
  std::int64_t x_stride = 0;
  rope_pairs pairs = rope_pairs::adjacent;
  float scale = 1.0f;              // multiplies the rotated elements
};

// invalid_argument for an odd or oversized rotary_dim.
status run_rope(const rope_params& p, const stream& s);

namespace detail {
// The rotated width of p, or 0 when p's shape is invalid.
constexpr std::int64_t rope_rotated(const rope_params& p) {
  const std::int64_t rotated = p.rotary_dim > 0 ? p.rotary_dim : p.head_dim;
  return rotated > 0 && rotated % 2 == 0 && rotated <= p.head_dim ? rotated : 0;
}
}  // namespace detail

}  // namespace edge::kernels
