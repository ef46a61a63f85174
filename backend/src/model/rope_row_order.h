// Llama's Q and K rows in a GGUF: llama.cpp's converter reorders the rows of each head from the
// half-split RoPE order transformers uses (row half * d/2 + i) to the adjacent-pair order ggml
// rotates in (row 2i + half). Both directions, here once: the synthetic writer makes a GGUF's
// rows from the half-split ones, the checkpoint writer writes an adjacent-pair model's rows back.
#pragma once

#include <cstdint>

namespace edge::backend {

// The adjacent-pair row that holds half-split row `row` (heads of `head_dim` rows).
inline std::int64_t adjacent_pair_row(std::int64_t row, std::int64_t head_dim) {
  const std::int64_t head = row / head_dim;
  const std::int64_t within = row % head_dim;
  const std::int64_t half_length = head_dim / 2;
  return head * head_dim + (within % half_length) * 2 + within / half_length;
}

// The half-split row that adjacent-pair row `row` holds: adjacent_pair_row's inverse.
inline std::int64_t half_split_row(std::int64_t row, std::int64_t head_dim) {
  const std::int64_t head = row / head_dim;
  const std::int64_t within = row % head_dim;
  return head * head_dim + (within % 2) * (head_dim / 2) + within / 2;
}

}  // namespace edge::backend
