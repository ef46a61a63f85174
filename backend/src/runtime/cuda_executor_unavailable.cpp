// The CUDA executor of a build without CUDA: it cannot be created, and no device is available.
#include "edge/backend/runtime/cuda_executor.h"

#include "kernels/cuda/launchers.h"

namespace edge::backend {
namespace {

// The same reason cuda_available() gives.
status not_built() {
  std::string why;
  kernels::cuda::device_count(&why);
  return failed_precondition(why);
}

}  // namespace

struct cuda_executor::state {
  kv_cache_layout kv;
};

bool cuda_available(std::string* why_not) { return kernels::cuda::device_count(why_not) > 0; }

cuda_executor::cuda_executor(std::unique_ptr<state> s) : state_(std::move(s)) {}
cuda_executor::~cuda_executor() = default;

result<std::unique_ptr<cuda_executor::state>> cuda_executor::begin(const cuda_executor_options&) { return not_built(); }
result<std::unique_ptr<cuda_executor>> cuda_executor::create(const model&, const cuda_executor_options&) {
  return not_built();
}
result<std::unique_ptr<cuda_executor>> cuda_executor::create_synthetic(const model_config&, kernels::weight_format,
                                                                       std::uint64_t, const cuda_executor_options&) {
  return not_built();
}
status cuda_executor::forward(const batch_plan&, std::span<float>) { return not_built(); }
status cuda_executor::forward_sample(const batch_plan&, std::span<const row_sampling>, std::span<std::int32_t>,
                                     std::span<float>, const mask_filler&) {
  return not_built();
}
std::int64_t cuda_executor::max_batch_tokens() const { return 0; }
std::int64_t cuda_executor::max_sequences() const { return 0; }
std::int64_t cuda_executor::vocab_size() const { return 0; }
std::int64_t cuda_executor::max_prompt_logits_rows() const { return 0; }
executor_counters cuda_executor::counters() const { return {}; }
expert_routing cuda_executor::last_routing() const { return {}; }
result<std::span<std::byte>> cuda_executor::allocate_host_tier(std::int64_t) { return not_built(); }
status cuda_executor::finish_tier_copies() { return not_built(); }
void cuda_executor::take_copy_back_seconds(std::vector<double>&) {}
const kv_cache_layout& cuda_executor::kv_layout() const { return state_->kv; }
kv_cache_capacity cuda_executor::kv_capacity() const { return {}; }
std::string cuda_executor::describe() const { return "no CUDA in this build"; }
status cuda_executor::fill_kv_random(std::uint64_t) { return not_built(); }

}  // namespace edge::backend
