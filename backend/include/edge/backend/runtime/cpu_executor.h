// The CPU executor: the forward pass (forward.h) on the kernels' CPU implementations, on a
// thread pool. Weights are used where the model keeps them (no copy); norms, biases and RoPE
// tables are widened to f32. Every buffer a step needs is allocated at construction for
// max_batch_tokens tokens, so a step allocates nothing.
#pragma once

#include <memory>

#include "edge/backend/model/model.h"
#include "edge/backend/runtime/executor.h"
#include "edge/backend/runtime/kv_cache.h"

namespace edge {
class thread_pool;
}

namespace edge::backend {

struct cpu_executor_options {
  std::int64_t max_batch_tokens = 2048;
  std::int64_t max_sequences = 256;  // entries in one batch
};

class cpu_executor final : public executor {
 public:
  // The model, cache and pool must outlive the executor; a null pool computes on the calling
  // thread alone. invalid_argument when the cache's layout does not match the model or a
  // weight has the wrong shape.
  static result<std::unique_ptr<cpu_executor>> create(const model& m, kv_cache& cache, thread_pool* pool,
                                                      const cpu_executor_options& options);
  ~cpu_executor() override;

  status forward(const batch_plan& plan, std::span<float> logits) override;
  status forward_sample(const batch_plan& plan, std::span<const row_sampling> rows, std::span<std::int32_t> tokens,
                        std::span<float> logits, const mask_filler& fill_masks) override;
  const kv_cache_layout& kv_layout() const override;
  std::int64_t max_batch_tokens() const override;
  std::int64_t max_sequences() const override;
  std::int64_t vocab_size() const override;
  std::int64_t max_prompt_logits_rows() const override;
  expert_routing last_routing() const override;
  result<std::span<std::byte>> allocate_host_tier(std::int64_t slots) override;
  void take_copy_back_seconds(std::vector<double>& out) override;

 private:
  struct state;
  explicit cpu_executor(std::unique_ptr<state> s);
  std::unique_ptr<state> state_;
};

}  // namespace edge::backend
