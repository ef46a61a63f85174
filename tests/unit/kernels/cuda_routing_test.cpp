// A stream on device::cuda reaches the CUDA launchers, never the CPU code. On a machine
// without a usable GPU (where `make test` runs) every op must then fail with a clear status and
// leave its host buffers alone; on a machine with a GPU, tests/gpu checks the results instead.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kernels/cuda/launchers.h"

namespace {

using namespace edge::kernels;

const stream cuda_stream{.where = device::cuda, .pool = nullptr, .cuda_stream = nullptr};

bool no_gpu() {
  std::string why;
  const bool none = cuda::device_count(&why) == 0;
  if (none) MESSAGE("no CUDA device here: " << why);
  CHECK((none ? !why.empty() : true));
  return none;
}

}  // namespace

TEST_CASE("ops on a CUDA stream fail cleanly without a GPU and do not run on the CPU") {
  if (!no_gpu()) return;  // tests/gpu covers the GPU
  std::vector<float> x(64, 1.0f), weight(64, 1.0f), out(64, -7.0f);
  const edge::status norm = run_rmsnorm({.x = x.data(), .weight = weight.data(), .out = out.data(), .rows = 1,
                                         .cols = 64, .x_stride = 64, .out_stride = 64},
                                        cuda_stream);
  CHECK_FALSE(norm.ok());
  CHECK(out[0] == -7.0f);

  std::vector<float> w(64 * 8, 0.5f), y(8, -7.0f);
  const edge::status mm = run_matmul({.x = x.data(), .w = {.format = weight_format::f32, .values = w.data()},
                                      .y = y.data(), .tokens = 1, .n = 8, .k = 64, .x_stride = 64, .y_stride = 8},
                                     cuda_stream);
  CHECK_FALSE(mm.ok());
  CHECK(y[0] == -7.0f);

  std::vector<float> logits = {0.0f, 3.0f, 1.0f};
  const sampling_row row{.temperature = 0.0f};
  std::int32_t chosen = -1;
  const edge::status sampled = run_sampling({.logits = logits.data(), .config = &row, .out = &chosen, .rows = 1,
                                             .vocab = 3},
                                            cuda_stream);
  CHECK_FALSE(sampled.ok());
  CHECK(chosen == -1);
  MESSAGE("rmsnorm on a CUDA stream: " << norm.to_string());
}

TEST_CASE("the shape checks of the CUDA launchers match the CPU's") {
  // Rejected before any device work, so the answer is the same with or without a GPU.
  std::vector<float> x(8, 1.0f);
  const edge::status bad = run_rope({.x = x.data(), .positions = nullptr, .inv_freq = nullptr, .tokens = 1, .heads = 1,
                                     .head_dim = 3, .x_stride = 3},
                                    cuda_stream);
  CHECK(bad.code() == (cuda::compiled() ? edge::status_code::invalid_argument : edge::status_code::failed_precondition));
}
