// Where a kernel runs: the CPU (on a thread pool) or a CUDA stream. Every op's host API takes
// one, so an executor passes the same value to each op of a step.
#pragma once

#include <cstdint>

namespace edge {
class thread_pool;
}

namespace edge::kernels {

// device::count runs nothing and reads nothing: each op adds to stream::launches the CUDA
// kernels it would queue for its params (the fewest: without a split's combine, which a device's
// SM count decides) and returns. A test holds a model's decode step to a launch count that way,
// at the real shapes, on a machine without a GPU and without the weights.
enum class device { cpu, cuda, count };

struct stream {
  device where = device::cpu;
  thread_pool* pool = nullptr;  // cpu: workers for the op's parallel loops; null runs on the caller
  void* cuda_stream = nullptr;  // cuda: the cudaStream_t
  std::int64_t* launches = nullptr;  // count: where the launches are added
};

// For device::count: adds an op's launches.
inline void count_launches(const stream& s, std::int64_t launches) {
  if (s.launches != nullptr) *s.launches += launches;
}

}  // namespace edge::kernels
