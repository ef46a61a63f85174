// Where a kernel runs: the CPU (on a thread pool) or a CUDA stream. Every op's host API takes
// one, so an executor passes the same value to each op of a step.
#pragma once

namespace edge {
class thread_pool;
}

namespace edge::kernels {

enum class device { cpu, cuda };

struct stream {
  device where = device::cpu;
  thread_pool* pool = nullptr;  // cpu: workers for the op's parallel loops; null runs on the caller
  void* cuda_stream = nullptr;  // cuda: the cudaStream_t
};

}  // namespace edge::kernels
