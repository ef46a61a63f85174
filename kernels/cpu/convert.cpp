#include "kernels/cpu/load.h"

namespace edge::kernels::cpu {

void convert_to_float(dtype type, const void* src, std::int64_t count, float* dst) {
  dispatch_dtype(type, [&]<dtype T>() {
    for (std::int64_t i = 0; i < count; ++i) dst[i] = load_as_float<T>(src, i);
  });
}

}  // namespace edge::kernels::cpu
