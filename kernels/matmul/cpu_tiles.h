// Converting INT4 (groups of 32 or more), INT8, f16, bf16 and FP8 matrices between the row layout
// and the CPU's row tiles (weight_layout::cpu_tiles; the layout is described in
// edge/kernels/weight_format.h).
// The conversion moves bytes and copies scales: no value changes, and the two directions are
// exact inverses on every element of the matrix.
#pragma once

#include <cstdint>

#include "edge/common/status.h"
#include "edge/kernels/weight_format.h"

namespace edge {
class thread_pool;
}

namespace edge::kernels {

// `rows` [n, k] in the row layout → values [cpu_tiles::values_bytes(format, n, k)] and scales
// [cpu_tiles::scale_count(format, n, k, group_size)] (none for f16 and bf16). invalid_argument where cpu_tiles::takes
// refuses the format or the view is not in the row layout. Tiles are split across `pool`'s
// threads when it is given.
status pack_cpu_tiles(const weight_view& rows, std::int64_t n, std::int64_t k, void* values, float* scales,
                      thread_pool* pool = nullptr);

// `tiles` [n, k] in CPU row tiles → values [weight_values_bytes(format, n, k)] and scales
// [weight_scale_count(format, n, k, group_size)] in the row layout.
status unpack_cpu_tiles(const weight_view& tiles, std::int64_t n, std::int64_t k, void* values, float* scales,
                        thread_pool* pool = nullptr);

}  // namespace edge::kernels
