// The CUDA executor where `make test` runs (no GPU): it refuses to start with the reason, so
// `--device cuda` can say why and `--device auto` can fall back to the CPU.
#include <doctest/doctest.h>

#include <string>

#include "edge/backend/model/model.h"
#include "edge/backend/runtime/cuda_executor.h"

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
