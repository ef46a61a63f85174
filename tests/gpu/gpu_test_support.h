// What the GPU test programs share: device arrays, a result table, random inputs. Plain C++
// with the CUDA runtime API (no doctest: tests/gpu builds on a bare CUDA machine).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "edge/common/status.h"

namespace edge::gpu_test {

// Exit codes: 0 all passed, 1 a comparison failed, 2 the test could not run (a CUDA error, a
// fixture named but missing), 77 skipped (no CUDA device here, or no fixture where none was
// named: ctest's SKIP_RETURN_CODE). tests/gpu/run.sh counts anything but 0 as a failure.
constexpr int exit_failed = 1;
constexpr int exit_cannot_run = 2;
constexpr int exit_skipped = 77;

[[noreturn]] inline void cannot_run(const std::string& why) {
  std::fprintf(stderr, "cannot run: %s\n", why.c_str());
  std::exit(exit_cannot_run);
}

[[noreturn]] inline void skip(const std::string& why) {
  std::fprintf(stderr, "skipped: %s\n", why.c_str());
  std::exit(exit_skipped);
}

inline void check_cuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) cannot_run(std::string(what) + ": " + cudaGetErrorString(error));
}

inline void check_ok(const status& s, const char* what) {
  if (!s.ok()) cannot_run(std::string(what) + ": " + s.to_string());
}

// A device copy of a host vector, or an uninitialised device array.
template <class T>
class device_array {
 public:
  explicit device_array(std::size_t count) : count_(count) {
    check_cuda(cudaMalloc(&data_, std::max<std::size_t>(count, 1) * sizeof(T)), "cudaMalloc");
  }
  explicit device_array(const std::vector<T>& host) : device_array(host.size()) { upload(host); }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  ~device_array() { cudaFree(data_); }

  void upload(const std::vector<T>& host) {
    check_cuda(cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    check_cuda(cudaMemcpy(host.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return host;
  }
  T* get() const { return data_; }
  std::size_t size() const { return count_; }

 private:
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

// One line per comparison, and the count of failures for the exit code.
class results {
 public:
  explicit results(std::string program) : program_(std::move(program)) {}

  // `error` against `tolerance` (both in the units the caller states in `what`).
  void check(const std::string& what, double error, double tolerance) {
    const bool pass = error <= tolerance;
    std::printf("%-4s %-86s err %.3g (tol %.3g)\n", pass ? "ok" : "FAIL", what.c_str(), error, tolerance);
    ++checks_;
    if (!pass) ++failures_;
  }
  void expect(const std::string& what, bool pass, const std::string& detail = "") {
    std::printf("%-4s %-86s %s\n", pass ? "ok" : "FAIL", what.c_str(), detail.c_str());
    ++checks_;
    if (!pass) ++failures_;
  }
  int finish() const {
    std::printf("%s: %d checks, %d failed\n", program_.c_str(), checks_, failures_);
    return failures_ == 0 ? 0 : exit_failed;
  }

 private:
  std::string program_;
  int checks_ = 0;
  int failures_ = 0;
};

inline std::vector<float> random_floats(std::size_t count, std::uint32_t seed, float low = -1.0f, float high = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> v(count);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Prints the device, or ends the program when there is none.
inline cudaDeviceProp require_device(const char* program) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) skip("no CUDA device");
  cudaDeviceProp properties{};
  check_cuda(cudaGetDeviceProperties(&properties, 0), "cudaGetDeviceProperties");
  std::printf("%s on %s (compute capability %d.%d, %d SMs, %.1f GiB)\n", program, properties.name, properties.major,
              properties.minor, properties.multiProcessorCount,
              static_cast<double>(properties.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
  return properties;
}

}  // namespace edge::gpu_test
