// RMSNorm: out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight.
//
// With `residual`, the residual add is fused in front: x[t] += residual[t] first (x is updated
// in place), then the normalised row is written to out. With `row_index`, output row r
// normalises row row_index[r] of x (a gather: the rows that produce logits, before the
// classifier); x is then only read. With `groups` > 1 a row holds that many vectors of `cols`
// side by side, each normalised on its own with the same weight (per-head norms of Q and K).
// Sums run in float in a fixed order, independent of how many rows are processed together.
//
// With `center`, LayerNorm instead: out[t] = (x[t] - mean) / sqrt(var + eps) * weight + bias
// (the DSA indexer's key norm); not with a residual.
#pragma once

#include <cstdint>

#include "edge/common/status.h"
#include "edge/kernels/stream.h"

namespace edge::kernels {

struct rmsnorm_params {
  float* x;                       // [rows, groups * cols], row stride x_stride
  const float* residual = nullptr;  // [rows, cols] added into x first, or null
  const std::int64_t* row_index = nullptr;  // [rows] the row of x each output row normalises, or null;
                                            // not with residual
  const float* weight;            // [cols]
  float* out;                     // [rows, groups * cols], row stride out_stride; may equal x
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t groups = 1;        // > 1: not with residual or row_index
  std::int64_t x_stride = 0;
  std::int64_t out_stride = 0;
  float eps = 1e-5f;
  bool center = false;            // LayerNorm: subtract the mean, add `bias`
  const float* bias = nullptr;    // [cols] (center only)
};

// invalid_argument for bad shapes or strides, and for groups with a residual or a gather (on
// either device: the checks run before the call is routed).
status run_rmsnorm(const rmsnorm_params& p, const stream& s);

}  // namespace edge::kernels
