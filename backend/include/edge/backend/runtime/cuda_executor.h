// The CUDA executor: the forward pass (forward.h) on the CUDA kernels (kernels/<op>/<op>.cu), on
// one GPU and one stream.
//
// * Weights are uploaded once at creation, in the model's projection format (int4 / fp8 as
//   quantized on the host at load, or bf16 / f16 / f32) and layout (Q/K/V and gate/up stacked
//   where the model stacked them: model.h). Norm weights and biases become f32. A tied
//   classifier shares the embedding's device copy.
// * Every buffer (weights, activations for max_batch_tokens tokens, workspaces, the KV pool,
//   pinned staging for the per-step metadata and the logits) is an RAII allocation made at
//   creation: a step allocates nothing.
// * The KV pool lives on the device, in the layout of kv_cache.h. Its size is --kv-cache-memory
//   when given, else utilization_kv_budget(): gpu_memory_utilization of the device's memory
//   minus what is in use once weights and buffers are allocated (vLLM's rule), leaving free at
//   least a headroom for what the runtime allocates later (kernel modules loaded lazily at
//   their first launch, CUDA graphs). One extra block past kv_layout().num_blocks is reserved
//   for the padding rows of CUDA-graph batches.
// * Decode steps (every entry one token with logits) run as CUDA graphs captured per padded
//   batch size (1, 2, 4, 8, ... up to max_sequences), the first step of a size eagerly.
//
// forward() copies the logits back to the host; forward_sample() (the serving path) samples on
// the device and copies back token ids, plus the logits rows asked for.
//
// Built without CUDA, create() returns failed_precondition. Owned by one thread at a time (the
// engine thread); every call selects the executor's device first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "edge/backend/model/model.h"
#include "edge/backend/runtime/executor.h"
#include "edge/backend/runtime/kv_cache.h"
#include "kernels/sampling/sampling.h"

namespace edge::backend {

struct cuda_executor_options {
  std::int64_t max_batch_tokens = 2048;
  std::int64_t max_sequences = 256;
  kernels::dtype kv_dtype = kernels::dtype::bf16;
  std::int64_t block_size = 16;
  double gpu_memory_utilization = 0.9;      // of the device's whole memory, weights included; at most max_gpu_memory_utilization
  std::optional<std::size_t> kv_cache_bytes;  // a fixed KV budget instead
  int device = 0;
  bool cuda_graphs = true;
};

// The largest gpu_memory_utilization accepted: at 1.0 nothing would be left for the runtime.
inline constexpr double max_gpu_memory_utilization = 0.98;

// Device memory the KV pool may take under the utilization rule: utilization × total minus
// what is in use (total − free), but never so much that less than the headroom stays free
// (512 MiB, or 1% of a device larger than 50 GiB). 0 when nothing is left.
constexpr std::size_t utilization_kv_budget(std::size_t total_bytes, std::size_t free_bytes, double utilization) {
  constexpr std::size_t min_headroom = std::size_t{512} << 20;
  const std::size_t headroom = total_bytes / 100 > min_headroom ? total_bytes / 100 : min_headroom;
  const double allowed = utilization * static_cast<double>(total_bytes);
  const double in_use = static_cast<double>(total_bytes - free_bytes);
  if (allowed <= in_use || free_bytes <= headroom) return 0;
  const auto by_utilization = static_cast<std::size_t>(allowed - in_use);
  return by_utilization < free_bytes - headroom ? by_utilization : free_bytes - headroom;
}

// Whether a CUDA device can be used, and if not why ("no CUDA device: ..."); the CLI's
// --device auto asks this.
bool cuda_available(std::string* why_not = nullptr);

class cuda_executor final : public executor {
 public:
  // invalid_argument for weights the executor cannot run (shapes, mixed projection formats);
  // resource_exhausted when the weights or a KV pool of at least one block do not fit.
  static result<std::unique_ptr<cuda_executor>> create(const model& m, const cuda_executor_options& options);

  // A model of `config`'s shape with seeded random weights made on the device (int4 / fp8 by
  // quantizing random rows there, or bf16), token embedding and classifier in bf16: for speed
  // measurements of shapes too big to ship (tests/gpu benchmarks). Outputs are noise.
  static result<std::unique_ptr<cuda_executor>> create_synthetic(const model_config& config,
                                                                 kernels::weight_format weights, std::uint64_t seed,
                                                                 const cuda_executor_options& options);
  ~cuda_executor() override;

  status forward(const batch_plan& plan, std::span<float> logits) override;
  status forward_sample(const batch_plan& plan, std::span<const row_sampling> rows, std::span<std::int32_t> tokens,
                        std::span<float> logits, const mask_filler& fill_masks) override;

  std::int64_t max_batch_tokens() const override;
  std::int64_t max_sequences() const override;
  std::int64_t vocab_size() const override;
  std::int64_t max_prompt_logits_rows() const override;
  executor_counters counters() const override;
  // Tokens per expert of each MoE layer of the last step, copied to the host with its tokens;
  // the choices themselves stay on the device (choices is empty).
  expert_routing last_routing() const override;
  result<std::span<std::byte>> allocate_host_tier(std::int64_t slots) override;
  bool restores_overlap_step() const override { return true; }
  status finish_tier_copies() override;
  void take_copy_back_seconds(std::vector<double>& out) override;

  // The device KV pool (blocks a kv_block_pool may hand out), and what it holds.
  const kv_cache_layout& kv_layout() const override;
  kv_cache_capacity kv_capacity() const;
  // "NVIDIA H200 (132 SMs): weights 4.3 GiB, KV pool 112.0 GiB, buffers 1.2 GiB; a decode step
  // queues 291 kernels" (count_decode_launches: the launches of a one-token step, without its
  // sampler's)
  std::string describe() const;

  // Fills every KV block with seeded random values (FP8: random codes with scales), so decode
  // can be measured at a context length without prefilling it. Benchmarks only.
  status fill_kv_random(std::uint64_t seed);

 private:
  struct state;
  explicit cuda_executor(std::unique_ptr<state> s);
  // The device selected, its stream made, the options checked.
  static result<std::unique_ptr<state>> begin(const cuda_executor_options& options);
  // The buffers, a warm-up forward over a pool of its own, then the KV pool from what is left.
  static result<std::unique_ptr<cuda_executor>> finish(std::unique_ptr<state> s);
  status warm_up(std::int64_t prefill, std::int64_t blocks);
  // Tokens of the warm-up's prefill (fewer when a step holds fewer).
  static constexpr std::int64_t warm_up_prefill_tokens = 64;
  std::unique_ptr<state> state_;
};

}  // namespace edge::backend
