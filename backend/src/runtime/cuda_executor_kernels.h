// Small device helpers of the CUDA executor (cuda_executor_kernels.cu): seeded random fills for
// synthetic weights and KV contents. Free of CUDA headers; `stream` is a cudaStream_t.
#pragma once

#include <cstdint>

#include "edge/common/status.h"
#include "edge/kernels/dtype.h"

namespace edge::backend::cuda_detail {

// count values uniform in [low, high), stored as `type` (rounded as numerics.h rounds); the same
// seed gives the same values.
status fill_uniform(void* out, kernels::dtype type, std::int64_t count, std::uint64_t seed, float low, float high,
                    void* stream);

// count floats set to `value`.
status fill_constant(float* out, std::int64_t count, float value, void* stream);

}  // namespace edge::backend::cuda_detail
