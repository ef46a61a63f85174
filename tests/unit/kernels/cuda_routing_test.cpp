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

  std::vector<float> logits8(8, 0.5f), route_weights(2, -7.0f);
  std::vector<std::int32_t> route_experts(2, -1);
  const edge::status routed = run_moe_routing({.logits = logits8.data(), .experts = route_experts.data(),
                                               .weights = route_weights.data(), .tokens = 1, .num_experts = 8,
                                               .top_k = 2, .logits_stride = 8},
                                              cuda_stream);
  CHECK_FALSE(routed.ok());
  CHECK(route_experts[0] == -1);
  CHECK(route_weights[0] == -7.0f);

  const std::vector<moe_expert_weights> matrices(8, moe_expert_weights{.gate = {.values = w.data()},
                                                                        .down = {.values = w.data()}});
  std::vector<float> workspace(static_cast<std::size_t>(moe_experts_workspace_floats(1, 2, 8, 64, 4)));
  const std::vector<std::int32_t> experts = {1, 5};
  const std::vector<float> weights = {0.5f, 0.5f};
  const edge::status ran = run_moe_experts({.x = x.data(), .experts = experts.data(), .weights = weights.data(),
                                            .matrices = matrices.data(), .out = out.data(), .tokens = 1, .top_k = 2,
                                            .num_experts = 8, .hidden = 64, .intermediate = 4, .x_stride = 64,
                                            .out_stride = 64, .workspace = workspace.data(),
                                            .workspace_floats = static_cast<std::int64_t>(workspace.size()),
                                            .device_matrices = matrices.data()},
                                           cuda_stream);
  CHECK_FALSE(ran.ok());
  CHECK(out[0] == -7.0f);
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

TEST_CASE("the MoE kernels check on the host what the CPU checks, and the CUDA layout rules") {
  const edge::status_code refused =
      cuda::compiled() ? edge::status_code::invalid_argument : edge::status_code::failed_precondition;
  std::vector<float> logits(8, 0.5f), route_weights(2);
  std::vector<std::int32_t> route_experts(2);
  const moe_routing_params routing{.logits = logits.data(), .experts = route_experts.data(),
                                   .weights = route_weights.data(), .tokens = 1, .num_experts = 8, .top_k = 9,
                                   .logits_stride = 8};
  CHECK(run_moe_routing(routing, cuda_stream).code() == refused);
  CHECK(run_moe_routing(routing, {}).code() == edge::status_code::invalid_argument);

  constexpr std::int64_t hidden = 64, inter = 32, experts_count = 4;
  std::vector<float> gate_up(static_cast<std::size_t>(2 * inter * hidden)), down(static_cast<std::size_t>(hidden * inter));
  std::vector<float> x(hidden), out(hidden);
  const moe_expert_weights stacked{.gate = {.values = gate_up.data()}, .down = {.values = down.data()}};
  std::vector<moe_expert_weights> matrices(experts_count, stacked);
  std::vector<float> workspace(static_cast<std::size_t>(moe_experts_workspace_floats(1, 2, experts_count, hidden, inter)));
  const std::vector<std::int32_t> experts = {0, 3};
  const std::vector<float> weights = {0.5f, 0.5f};
  moe_experts_params p{.x = x.data(), .experts = experts.data(), .weights = weights.data(), .matrices = matrices.data(),
                       .out = out.data(), .tokens = 1, .top_k = 2, .num_experts = experts_count, .hidden = hidden,
                       .intermediate = inter, .x_stride = hidden, .out_stride = hidden, .workspace = workspace.data(),
                       .workspace_floats = static_cast<std::int64_t>(workspace.size()),
                       .device_matrices = matrices.data()};
  // The CPU's checks: a workspace one float short.
  p.workspace_floats -= 1;
  CHECK(run_moe_experts(p, cuda_stream).code() == refused);
  CHECK(run_moe_experts(p, {}).code() == edge::status_code::invalid_argument);
  p.workspace_floats += 1;
  if (!cuda::compiled()) return;
  // CUDA's own: the device copy of the matrices, one layout for all experts.
  p.device_matrices = nullptr;
  CHECK(run_moe_experts(p, cuda_stream).code() == edge::status_code::invalid_argument);
  p.device_matrices = matrices.data();
  matrices[2].gate.format = weight_format::bf16;
  CHECK(run_moe_experts(p, cuda_stream).code() == edge::status_code::invalid_argument);
  matrices[2] = stacked;
  matrices[1].up = {.values = gate_up.data() + inter * hidden};  // apart among stacked ones
  matrices[1].gate.values = gate_up.data();
  CHECK(run_moe_experts(p, cuda_stream).code() == edge::status_code::invalid_argument);
  matrices[1] = stacked;
  matrices[3].down.format = weight_format::int4;  // without scales
  CHECK(run_moe_experts(p, cuda_stream).code() == edge::status_code::invalid_argument);
  // Experts without weights are allowed (the caller says they are never chosen); none at all is not.
  for (auto& m : matrices) m = {};
  CHECK(run_moe_experts(p, cuda_stream).code() == edge::status_code::invalid_argument);
  matrices[1] = stacked;
  if (!no_gpu()) return;  // the buffers are host memory: nothing may launch on a real device
  CHECK(run_moe_experts(p, cuda_stream).code() != edge::status_code::invalid_argument);
}
