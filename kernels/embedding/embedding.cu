// CUDA token embedding: one block per token, each thread widening a strided share of the row.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"

namespace edge::kernels::cuda {
namespace {

constexpr int embedding_threads = 256;

template <dtype T>
__global__ void embedding_kernel(const std::int32_t* __restrict__ ids,  // [tokens]
                                 const void* __restrict__ table,        // [vocab, hidden] of T
                                 float* __restrict__ out,               // [tokens, hidden]
                                 std::int64_t vocab, std::int64_t hidden) {
  const std::int64_t t = blockIdx.x;
  const std::int32_t id = ids[t];
  float* row = out + t * hidden;
  // An id outside the vocabulary (the caller checks ids on the host) gives a zero row rather
  // than a read outside the table.
  const bool valid = id >= 0 && id < vocab;
  for (std::int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    row[i] = valid ? load_float<T>(table, static_cast<std::int64_t>(id) * hidden + i) : 0.0f;
  }
}

}  // namespace

status run_embedding(const embedding_params& p, const stream& s) {
  if (p.tokens < 0 || p.hidden <= 0 || p.vocab <= 0) return invalid_argument("embedding: bad shape");
  if (p.tokens == 0) return {};
  return dispatch_dtype(p.table_type, [&]<dtype T>() {
    embedding_kernel<T><<<static_cast<unsigned>(p.tokens), embedding_threads, 0, native(s)>>>(p.ids, p.table, p.out,
                                                                                              p.vocab, p.hidden);
    return check_launch("embedding");
  });
}

}  // namespace edge::kernels::cuda
