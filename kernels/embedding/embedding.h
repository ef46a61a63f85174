// Token embedding lookup: out[t] = table[ids[t]], widened to float.
#pragma once

#include <cstdint>

#include "edge/common/status.h"
#include "edge/kernels/dtype.h"
#include "edge/kernels/stream.h"

namespace edge::kernels {

struct embedding_params {
  const std::int32_t* ids;  // [tokens]
  const void* table;        // [vocab, hidden] of table_type
  dtype table_type = dtype::f32;
  float* out;               // [tokens, hidden]
  std::int64_t tokens = 0;
  std::int64_t vocab = 0;
  std::int64_t hidden = 0;
};

// invalid_argument when an id is outside [0, vocab).
status run_embedding(const embedding_params& p, const stream& s);

}  // namespace edge::kernels
