#include <map>
#include <mutex>
#include <utility>
#include <string>
#include <vector>

#include "edge/common/format.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"

namespace edge::kernels::cuda {

bool compiled() { return true; }

int device_count(std::string* why_none) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    // Clears the sticky "no driver" error so later runtime calls report their own.
    static_cast<void>(cudaGetLastError());
    if (why_none != nullptr) *why_none = format("no CUDA device: {} ({})", cudaGetErrorName(error), cudaGetErrorString(error));
    return 0;
  }
  if (count == 0 && why_none != nullptr) *why_none = "no CUDA device: the driver reports none";
  return count;
}

status from_cuda(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return {};
  // Cleared, so that the next launch's check_launch reports only its own error.
  static_cast<void>(cudaGetLastError());
  return internal_error(format("{}: {} ({})", what, cudaGetErrorName(error), cudaGetErrorString(error)));
}

status check_launch(const char* op) { return from_cuda(cudaGetLastError(), op); }

int multiprocessor_count() {
  // Per thread, so that the launchers (hundreds per step) take no lock for it.
  thread_local std::vector<int> counts;  // by device ordinal; 0 = not read yet
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 1;
  if (counts.size() <= static_cast<std::size_t>(device)) counts.resize(static_cast<std::size_t>(device) + 1, 0);
  int& count = counts[static_cast<std::size_t>(device)];
  if (count == 0 && cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) count = 1;
  return count;
}

status allow_shared_memory(const void* kernel, int bytes) {
  constexpr int default_limit = 48 * 1024;
  if (bytes <= default_limit) return {};
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, int> raised;  // (device, kernel) -> limit set
  int device = 0;
  EDGE_RETURN_IF_ERROR(from_cuda(cudaGetDevice(&device), "cudaGetDevice"));
  const std::lock_guard lock(mutex);
  int& limit = raised[{device, kernel}];
  if (bytes <= limit) return {};
  EDGE_RETURN_IF_ERROR(from_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
                                 "cudaFuncSetAttribute(max dynamic shared memory)"));
  limit = bytes;
  return {};
}

}  // namespace edge::kernels::cuda
