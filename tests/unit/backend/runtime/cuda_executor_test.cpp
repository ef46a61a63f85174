// The CUDA executor where `make test` runs (no GPU): it refuses to start with the reason, so
// `--device cuda` can say why and `--device auto` can fall back to the CPU. And the host rules
// it runs by: the KV budget it sizes the pool by, and which decode batches run as graphs.
#include <doctest/doctest.h>

#include <string>

#include "edge/backend/model/model.h"
#include "edge/backend/runtime/cuda_executor.h"
#include "edge/backend/runtime/cuda_graph_policy.h"

TEST_CASE("cuda_executor::create without a usable GPU says why") {
  std::string why;
  if (edge::backend::cuda_available(&why)) {
    MESSAGE("a CUDA device is present; tests/gpu covers the executor");
    return;
  }
  CHECK_FALSE(why.empty());
  edge::backend::model m;
  m.config.vocab_size = 8;
  const auto created = edge::backend::cuda_executor::create(m, {});
  REQUIRE_FALSE(created.ok());
  CHECK(created.error().code() == edge::status_code::failed_precondition);
  CHECK(created.error().message() == why);
  const auto synthetic = edge::backend::cuda_executor::create_synthetic(m.config, edge::kernels::weight_format::int4, 1, {});
  CHECK_FALSE(synthetic.ok());
}

TEST_CASE("the utilization rule leaves the runtime its headroom") {
  using edge::backend::utilization_kv_budget;
  constexpr std::size_t gib = std::size_t{1} << 30;
  constexpr std::size_t mib = std::size_t{1} << 20;
  // 141 GiB device, 20 GiB in use: 0.9 allows 126.9 - 20 GiB; the headroom (1.41 GiB) is not reached.
  const std::size_t total = 141 * gib;
  CHECK(utilization_kv_budget(total, total - 20 * gib, 0.9) ==
        static_cast<std::size_t>(0.9 * static_cast<double>(total)) - 20 * gib);
  // A small device keeps 512 MiB even at the largest share (0.98 of 8 GiB would leave 164 MiB).
  CHECK(utilization_kv_budget(8 * gib, 6 * gib, 0.98) == 6 * gib - 512 * mib);
  // Nothing left: in use already past the share, or free memory within the headroom.
  CHECK(utilization_kv_budget(total, 10 * gib, 0.9) == 0);
  CHECK(utilization_kv_budget(8 * gib, 400 * mib, 0.98) == 0);
}

TEST_CASE("CUDA graphs: a size runs eagerly twice, is captured after its second step, then replayed") {
  using edge::backend::cuda_graph_policy;
  cuda_graph_policy policy;
  CHECK(policy.next(4) == cuda_graph_policy::action::eager);
  policy.ran_eagerly(4);
  CHECK(policy.next(4) == cuda_graph_policy::action::eager_capture);
  CHECK(policy.next(8) == cuda_graph_policy::action::eager);  // sizes are independent
  policy.captured(4);
  CHECK(policy.next(4) == cuda_graph_policy::action::replay);
  CHECK(policy.capture_failures() == 0);
}

TEST_CASE("CUDA graphs: a size whose capture failed runs eagerly for good, and the failure is counted once") {
  using edge::backend::cuda_graph_policy;
  cuda_graph_policy policy;
  policy.ran_eagerly(16);
  REQUIRE(policy.next(16) == cuda_graph_policy::action::eager_capture);
  policy.capture_failed(16);
  for (int step = 0; step < 3; ++step) {
    CHECK(policy.next(16) == cuda_graph_policy::action::eager);
    policy.ran_eagerly(16);
  }
  CHECK(policy.capture_failures() == 1);
}
