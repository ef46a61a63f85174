// load_options::cpu_tiles: a loaded model's INT4 and INT8 projection matrices rearranged into
// the CPU's row tiles (edge/kernels/weight_format.h), in place of the row layout.
#pragma once

#include <cstdint>

#include "edge/backend/model/model.h"

namespace edge {
class thread_pool;
}

namespace edge::backend {

// Which formats to tile: the integer ones (INT4, INT8) where the CPU runs their matmul on AVX-512
// VNNI, f16 and bf16 where it has AVX-512, FP8 where it has AVX-512 VBMI too: the paths the
// tiles are for.
struct cpu_tile_formats {
  bool integer = false;
  bool floats = false;
  bool fp8 = false;
};

struct tiled_weights {
  std::int64_t matrices = 0;   // matrices rearranged (a stacked matrix and its parts count once)
  std::uint64_t bytes = 0;     // their values and scales, in tiles
};

// Tiles every projection, expert and classifier matrix of `formats` the tiles hold
// (cpu_tiles::takes) that is not read in rows elsewhere: the parts of a stacked matrix and the
// per-head views of the latent attention's kv_b_proj (and its transposed K part) must start at
// whole tiles, else that matrix stays in rows; a classifier tied to the embedding stays too.
// The row-layout buffers the model owned are freed and the file pages of weights used in place
// are let go, so the model's memory does not grow beyond the tiles' padding.
tiled_weights tile_weights_for_cpu(model& m, thread_pool* pool, const cpu_tile_formats& formats);

}  // namespace edge::backend
