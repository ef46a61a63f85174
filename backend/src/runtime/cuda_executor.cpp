#include "edge/backend/runtime/cuda_executor.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "cuda_executor_kernels.h"
#include "edge/backend/runtime/cuda_graph_policy.h"
#include "edge/backend/runtime/forward.h"
#include "edge/backend/runtime/sampler.h"
#include "edge/common/format.h"
#include "edge/common/log.h"
#include "edge/common/thread_pool.h"
#include "edge/kernels/numerics.h"
#include "kernels/cuda/launchers.h"
#include "kernels/matmul/cpu_tiles.h"
#include "kernels/matmul/matmul.h"
#include "kernels/mla_attention/mla_attention.h"
#include "kernels/moe_routing/moe_routing.h"
#include "kernels/paged_attention/paged_attention.h"
#include "kernels/quantize/quantize.h"

namespace edge::backend {
namespace {

using kernels::dtype;
using kernels::weight_format;

status cuda_check(cudaError_t error, std::string_view what) {
  if (error == cudaSuccess) return {};
  // Taken out of the runtime's last-error slot, so that the next launch's check does not report
  // it again as its own (a failed graph capture must not fail the step after it).
  static_cast<void>(cudaGetLastError());
  return internal_error(format("{}: {} ({})", what, cudaGetErrorName(error), cudaGetErrorString(error)));
}

// Waits for the stream when a step that was queued returns early with an error: the next step
// rewrites the pinned staging and host buffers that its queued copies may still be reading.
class settle_on_early_return {
 public:
  explicit settle_on_early_return(cudaStream_t stream) : stream_(stream) {}
  ~settle_on_early_return() {
    if (stream_ != nullptr) static_cast<void>(cudaStreamSynchronize(stream_));
  }
  settle_on_early_return(const settle_on_early_return&) = delete;
  settle_on_early_return& operator=(const settle_on_early_return&) = delete;
  // The step was waited for on the way out.
  void settled() { stream_ = nullptr; }

 private:
  cudaStream_t stream_;
};

// Device memory, freed with the owner.
class device_memory {
 public:
  device_memory() = default;
  device_memory(const device_memory&) = delete;
  device_memory& operator=(const device_memory&) = delete;
  device_memory(device_memory&& other) noexcept : data_(std::exchange(other.data_, nullptr)), bytes_(other.bytes_) {}
  device_memory& operator=(device_memory&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  ~device_memory() {
    if (data_ != nullptr) cudaFree(data_);
  }

  static result<device_memory> allocate(std::size_t bytes, std::string_view what) {
    device_memory m;
    if (bytes == 0) return m;
    const cudaError_t error = cudaMalloc(&m.data_, bytes);
    if (error != cudaSuccess) {
      static_cast<void>(cudaGetLastError());
      return resource_exhausted(format("cannot allocate {} of GPU memory for {}: {}", format_bytes(bytes), what,
                                       cudaGetErrorString(error)));
    }
    m.bytes_ = bytes;
    return m;
  }

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// Page-locked host memory (asynchronous copies need it).
class pinned_memory {
 public:
  pinned_memory() = default;
  pinned_memory(const pinned_memory&) = delete;
  pinned_memory& operator=(const pinned_memory&) = delete;
  ~pinned_memory() {
    if (data_ != nullptr) cudaFreeHost(data_);
  }
  status allocate(std::size_t bytes) {
    if (cudaMallocHost(&data_, std::max<std::size_t>(bytes, 1)) != cudaSuccess) {
      static_cast<void>(cudaGetLastError());
      return resource_exhausted(format("cannot allocate {} of pinned host memory", format_bytes(bytes)));
    }
    return {};
  }
  std::byte* data() const { return static_cast<std::byte*>(data_); }

 private:
  void* data_ = nullptr;
};

// Where each per-step array sits in the metadata block for a step of T tokens, S sequences and
// R logits rows. The offsets depend only on (T, S, R), and a CUDA graph's batch has R = S, so a
// graph captured for a batch size keeps reading the right places whatever the step.
struct meta_layout {
  static constexpr std::size_t alignment = 16;
  std::size_t slots = 0;       // int64 [T]
  std::size_t last_token = 0;  // int64 [R]
  std::size_t ids = 0;         // int32 [T]
  std::size_t positions = 0;   // int32 [T]
  std::size_t seq = 0;         // int32 [T]
  std::size_t seq_begin = 0;    // int32 [S + 1]
  std::size_t table_begin = 0;  // int32 [S + 1]
  std::size_t sampling = 0;     // sampling_row [S]
  std::size_t tables = 0;       // int32 [table_entries]: a step copies only the entries it wrote
  std::size_t biases = 0;       // logit_bias [S * max_logit_bias_entries]: a step copies only the entries it wrote
  std::size_t bytes = 0;

  // Every offset depends on tokens, seqs and rows alone (a graph's pointers stay valid for any tables).
  static meta_layout for_step(std::int64_t tokens, std::int64_t seqs, std::int64_t rows, std::int64_t table_entries) {
    meta_layout m;
    std::size_t at = 0;
    const auto take = [&at](std::size_t& field, std::size_t bytes) {
      field = at;
      at += (bytes + alignment - 1) / alignment * alignment;
    };
    const auto t = static_cast<std::size_t>(tokens);
    const auto s = static_cast<std::size_t>(seqs);
    take(m.slots, t * sizeof(std::int64_t));
    take(m.last_token, static_cast<std::size_t>(rows) * sizeof(std::int64_t));
    take(m.ids, t * sizeof(std::int32_t));
    take(m.positions, t * sizeof(std::int32_t));
    take(m.seq, t * sizeof(std::int32_t));
    take(m.seq_begin, (s + 1) * sizeof(std::int32_t));
    take(m.table_begin, (s + 1) * sizeof(std::int32_t));
    take(m.sampling, s * sizeof(kernels::sampling_row));
    take(m.tables, static_cast<std::size_t>(table_entries) * sizeof(std::int32_t));
    take(m.biases, s * static_cast<std::size_t>(max_logit_bias_entries) * sizeof(kernels::logit_bias));
    m.bytes = at;
    return m;
  }
};

// A graph executable, destroyed with its owner.
struct graph_exec {
  cudaGraphExec_t exec = nullptr;
  graph_exec() = default;
  explicit graph_exec(cudaGraphExec_t e) : exec(e) {}
  graph_exec(const graph_exec&) = delete;
  graph_exec& operator=(const graph_exec&) = delete;
  graph_exec(graph_exec&& other) noexcept : exec(std::exchange(other.exec, nullptr)) {}
  ~graph_exec() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
  }
};

}  // namespace

bool cuda_available(std::string* why_not) { return kernels::cuda::device_count(why_not) > 0; }

struct cuda_executor::state {
  model_plan plan;
  model_config config;
  cuda_executor_options options;
  int device = 0;
  cudaStream_t stream = nullptr;
  std::string device_name;
  int multiprocessors = 0;
  std::int64_t table_blocks = 0;  // the most blocks one sequence's table holds
  std::int64_t prompt_rows = 0;   // prompt logits rows a step takes at most

  // Weights.
  std::vector<device_memory> weight_memory;
  std::size_t weight_bytes = 0;
  forward_weights weights;

  // Activations and workspaces, for max_batch_tokens tokens and max_sequences sequences.
  device_memory buffer_memory;
  forward_buffers buffers;
  std::int32_t* sampled = nullptr;  // [S]
  std::int32_t* allowed = nullptr;  // [S, allowed_words(vocab)] the step's token masks (bits), constrained rows first
  std::byte* meta = nullptr;        // the per-step metadata, meta_layout for the step's (T, S)
  std::size_t meta_bytes = 0;

  // Host staging.
  pinned_memory staging;       // meta_bytes
  pinned_memory host_logits;   // [S + prompt_rows, vocab]
  pinned_memory host_sampled;  // [S]
  pinned_memory host_allowed;  // [S, allowed_words(vocab)] staging of `allowed`
  // The masks of the step last executed, in the order of their rows of `allowed` (read once the
  // forward pass is queued: forward_sample's mask_filler writes them meanwhile).
  std::vector<std::span<const std::uint32_t>> step_masks;
  pinned_memory host_expert_tokens;  // [moe_layers, max_experts] of the last step (MoE)
  std::int64_t last_tokens = 0;      // of the last step, padding included

  // The KV pool, as kv_cache.h lays it out, with one block past kv.layout.num_blocks: the
  // padding block of CUDA-graph batches.
  device_memory kv_memory;
  kv_cache_view kv;

  // The host tier (allocate_host_tier): [host_tier_slots, bytes_per_block] packed blocks, and the
  // stream its copies run on, so that a copy back runs beside other requests' steps.
  pinned_memory host_tier;
  std::int64_t host_tier_slots = 0;
  cudaStream_t copy_stream = nullptr;
  cudaEvent_t steps_done = nullptr;     // on `stream`: what earlier steps wrote is there
  cudaEvent_t spills_done = nullptr;    // on copy_stream: the step may overwrite the blocks spilled
  cudaEvent_t restores_done = nullptr;  // on copy_stream: the next step may read the blocks restored
  bool restores_pending = false;        // restores_done was recorded and no step has waited for it yet
  // Timed around a step's restores, for the copy-back histogram; read once the copies are done.
  cudaEvent_t restores_timed_begin = nullptr;
  cudaEvent_t restores_timed_end = nullptr;
  bool restores_timed = false;          // the pair was recorded and not read yet
  std::vector<double> copy_back_seconds;

  // Reads the timed pair when its copies are done.
  void collect_copy_back_time() {
    if (!restores_timed || cudaEventQuery(restores_timed_end) != cudaSuccess) return;
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, restores_timed_begin, restores_timed_end) == cudaSuccess) {
      copy_back_seconds.push_back(static_cast<double>(ms) / 1000.0);
    }
    restores_timed = false;
  }

  meta_layout step_meta;                      // the layout of the step last executed
  std::map<std::int64_t, graph_exec> graphs;  // by padded decode batch size
  cuda_graph_policy graph_policy;             // which sizes run as graphs
  logger log{"cuda"};

  ~state() {
    graphs.clear();
    if (copy_stream != nullptr) {
      // Its copies read and write host_tier, which goes with this state.
      static_cast<void>(cudaStreamSynchronize(copy_stream));
      cudaStreamDestroy(copy_stream);
    }
    for (cudaEvent_t e : {steps_done, spills_done, restores_done, restores_timed_begin, restores_timed_end}) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  // Queues the plan's host tier copies on copy_stream, each region kind of a block as one
  // strided copy (kv_cache_view's packing). This step's kernels wait for the spills (they may
  // overwrite the blocks spilled); the next step's wait for the restores, which only sequences
  // that compute from the next step on read (scheduler_config::restores_overlap_step).
  status queue_tier_copies(const batch_plan& batch) {
    EDGE_RETURN_IF_ERROR(check_tier_copies(batch, kv.layout.num_blocks, host_tier_slots));
    if (restores_pending) {
      EDGE_RETURN_IF_ERROR(cuda_check(cudaStreamWaitEvent(stream, restores_done, 0), "wait for restores"));
      restores_pending = false;
    }
    if (batch.spills.empty() && batch.restores.empty()) return {};
    EDGE_RETURN_IF_ERROR(cuda_check(cudaEventRecord(steps_done, stream), "record steps"));
    EDGE_RETURN_IF_ERROR(cuda_check(cudaStreamWaitEvent(copy_stream, steps_done, 0), "wait for steps"));
    for (const tier_copy& c : batch.spills) EDGE_RETURN_IF_ERROR(queue_block_copy(c, cudaMemcpyDeviceToHost));
    if (!batch.spills.empty()) {
      EDGE_RETURN_IF_ERROR(cuda_check(cudaEventRecord(spills_done, copy_stream), "record spills"));
      EDGE_RETURN_IF_ERROR(cuda_check(cudaStreamWaitEvent(stream, spills_done, 0), "wait for spills"));
    }
    if (!batch.restores.empty()) {
      // A pair still in flight is not timed again (its measurement would be lost).
      collect_copy_back_time();
      const bool timed = !restores_timed;
      if (timed) EDGE_RETURN_IF_ERROR(cuda_check(cudaEventRecord(restores_timed_begin, copy_stream), "record"));
      for (const tier_copy& c : batch.restores) EDGE_RETURN_IF_ERROR(queue_block_copy(c, cudaMemcpyHostToDevice));
      EDGE_RETURN_IF_ERROR(cuda_check(cudaEventRecord(restores_done, copy_stream), "record restores"));
      if (timed) EDGE_RETURN_IF_ERROR(cuda_check(cudaEventRecord(restores_timed_end, copy_stream), "record"));
      restores_timed = timed;
      restores_pending = true;
    }
    return {};
  }

  status queue_block_copy(const tier_copy& c, cudaMemcpyKind kind) {
    std::byte* packed = host_tier.data() + static_cast<std::size_t>(c.slot) * kv.layout.bytes_per_block();
    for (int which = 0; which < kv_cache_view::region_kinds; ++which) {
      const std::size_t piece = kv.piece_bytes(which);
      if (piece == 0) continue;
      std::byte* host = packed + kv.packed_offset(which);
      std::byte* on_device = kv.piece(0, which, c.block);
      const auto layers = static_cast<std::size_t>(kv.layout.num_layers);
      const cudaError_t queued =
          kind == cudaMemcpyDeviceToHost
              ? cudaMemcpy2DAsync(host, piece, on_device, kv.layer_bytes(), piece, layers, kind, copy_stream)
              : cudaMemcpy2DAsync(on_device, kv.layer_bytes(), host, piece, piece, layers, kind, copy_stream);
      EDGE_RETURN_IF_ERROR(cuda_check(queued, "host tier copy"));
    }
    return {};
  }

  kernels::stream kstream() const { return {.where = kernels::device::cuda, .pool = nullptr, .cuda_stream = stream}; }
  status select_device() const { return cuda_check(cudaSetDevice(device), "cudaSetDevice"); }

  result<void*> allocate_weight(std::size_t bytes, std::string_view what) {
    EDGE_ASSIGN_OR_RETURN(device_memory m, device_memory::allocate(bytes, what));
    void* p = m.data();
    weight_bytes += m.bytes();
    weight_memory.push_back(std::move(m));
    return p;
  }

  // Copies on the executor's stream: a plain cudaMemcpy runs on the legacy stream, which the
  // non-blocking stream the kernels run on does not wait for. (From pageable memory the call
  // returns once the bytes are staged, so `host` may go away at once.) The executor
  // synchronises its stream before its first step.
  status copy_to_device(void* target, const void* host, std::size_t bytes) {
    return cuda_check(cudaMemcpyAsync(target, host, bytes, cudaMemcpyHostToDevice, stream), "upload");
  }

  result<void*> upload(const void* host, std::size_t bytes, std::string_view what) {
    EDGE_ASSIGN_OR_RETURN(void* p, allocate_weight(bytes, what));
    EDGE_RETURN_IF_ERROR(copy_to_device(p, host, bytes));
    return p;
  }

  // A [rows, k] matrix of seeded random weights made on the device: uniform in ±1/sqrt(k) (so
  // activations keep their scale), quantized there for int4 / fp8.
  result<kernels::weight_view> random_matrix(weight_format f, std::int64_t rows, std::int64_t k, std::uint64_t seed,
                                             float* scratch, std::int64_t scratch_floats, std::string_view what) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(k));
    const std::size_t value_bytes = static_cast<std::size_t>(kernels::weight_values_bytes(f, rows, k));
    const std::int64_t group = f == weight_format::int4 ? kernels::int4_group_size_for(k) : 0;
    const auto scale_count = static_cast<std::size_t>(kernels::weight_scale_count(f, rows, k, group));
    EDGE_ASSIGN_OR_RETURN(void* values, allocate_weight(value_bytes, what));
    float* scales = nullptr;
    if (scale_count > 0) {
      EDGE_ASSIGN_OR_RETURN(void* s, allocate_weight(scale_count * sizeof(float), what));
      scales = static_cast<float*>(s);
    }
    if (!kernels::is_quantized(f)) {
      EDGE_RETURN_IF_ERROR(cuda_detail::fill_uniform(values, *kernels::element_dtype(f), rows * k, seed, -bound, bound,
                                                     stream));
    } else {
      // Row slabs of random floats through the scratch, quantized by the device kernel.
      const std::int64_t slab = std::max<std::int64_t>(1, scratch_floats / k);
      for (std::int64_t r = 0; r < rows; r += slab) {
        const std::int64_t n = std::min(slab, rows - r);
        EDGE_RETURN_IF_ERROR(cuda_detail::fill_uniform(scratch, dtype::f32, n * k, seed + static_cast<std::uint64_t>(r),
                                                       -bound, bound, stream));
        auto* out_values = static_cast<std::byte*>(values) + kernels::weight_values_bytes(f, r, k);
        float* out_scales = scales + kernels::weight_scale_count(f, r, k, group);
        EDGE_RETURN_IF_ERROR(kernels::run_quantize({.x = scratch, .rows = n, .k = k, .x_stride = k, .format = f,
                                                    .group_size = group, .values = out_values, .scales = out_scales},
                                                   kstream()));
      }
    }
    return kernels::weight_view{.format = f, .values = values, .scales = scales, .group_size = group};
  }

  status set_plan(const model_config& c) {
    config = c;
    EDGE_ASSIGN_OR_RETURN(plan, plan_model(c));
    if (plan.max_experts() > kernels::max_router_experts) {
      return invalid_argument(format("{} experts per layer; the CUDA kernels take at most {}", plan.max_experts(),
                                     kernels::max_router_experts));
    }
    table_blocks = max_table_blocks(plan, options.block_size);
    prompt_rows = prompt_logits_rows_per_step(options.block_size);
    return {};
  }

  // Activation buffers, workspaces, metadata and staging.
  status allocate_buffers() {
    const auto T = options.max_batch_tokens;
    const auto S = options.max_sequences;
    const auto R = S + prompt_rows;
    const forward_buffer_shape shape{
        .tokens = T, .logits_rows = R, .context = table_blocks * options.block_size, .where = kernels::device::cuda};
    meta_bytes = meta_layout::for_step(T, S, R, S * table_blocks).bytes;
    // The forward pass's buffers, then the sampled tokens, the token masks and the metadata.
    const std::size_t forward_bytes = forward_buffer_bytes(plan, shape);
    const auto round = [](std::size_t v) {
      return (v + forward_buffer_alignment - 1) / forward_buffer_alignment * forward_buffer_alignment;
    };
    const std::size_t sampled_bytes = round(static_cast<std::size_t>(S) * sizeof(std::int32_t));
    const std::size_t allowed_bytes =
        round(static_cast<std::size_t>(S * kernels::allowed_words(plan.vocab)) * sizeof(std::int32_t));
    EDGE_ASSIGN_OR_RETURN(buffer_memory, device_memory::allocate(forward_bytes + sampled_bytes + allowed_bytes +
                                                                     round(meta_bytes),
                                                                 "activations"));
    auto* at = static_cast<std::byte*>(buffer_memory.data());
    buffers = carve_forward_buffers(plan, shape, at);
    at += forward_bytes;
    sampled = reinterpret_cast<std::int32_t*>(at);
    at += sampled_bytes;
    allowed = reinterpret_cast<std::int32_t*>(at);
    at += allowed_bytes;
    meta = at;
    // A layer of fewer experts than the most writes fewer counts: the rest stay 0.
    const auto expert_count_bytes = static_cast<std::size_t>(expert_counts()) * sizeof(std::int32_t);
    if (expert_count_bytes > 0) {
      EDGE_RETURN_IF_ERROR(
          cuda_check(cudaMemsetAsync(buffers.expert_tokens, 0, expert_count_bytes, stream), "cudaMemset"));
    }
    EDGE_RETURN_IF_ERROR(staging.allocate(meta_bytes));
    EDGE_RETURN_IF_ERROR(host_logits.allocate(static_cast<std::size_t>(R * plan.vocab) * sizeof(float)));
    EDGE_RETURN_IF_ERROR(host_allowed.allocate(static_cast<std::size_t>(S * kernels::allowed_words(plan.vocab)) *
                                               sizeof(std::uint32_t)));
    EDGE_RETURN_IF_ERROR(host_expert_tokens.allocate(expert_count_bytes));
    return host_sampled.allocate(static_cast<std::size_t>(S) * sizeof(std::int32_t));
  }

  // forward_buffers::expert_tokens: [moe_layers, max_experts].
  std::int64_t expert_counts() const { return plan.moe_layers() * plan.max_experts(); }

  // Queues the copy of the step's tokens per expert to the host (MoE models).
  status queue_routing_download() {
    const std::int64_t count = expert_counts();
    if (count == 0) return {};
    return cuda_check(cudaMemcpyAsync(host_expert_tokens.data(), buffers.expert_tokens,
                                      static_cast<std::size_t>(count) * sizeof(std::int32_t), cudaMemcpyDeviceToHost,
                                      stream),
                      "expert counts download");
  }

  // The KV pool from what is left of the device: --kv-cache-memory, or the utilization rule.
  // Measured after the warm-up has freed its own pool.
  status allocate_kv() {
    kv_memory = device_memory();
    kv = kv_cache_view{};
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    EDGE_RETURN_IF_ERROR(cuda_check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
    std::size_t budget = 0;
    if (options.kv_cache_bytes) {
      budget = *options.kv_cache_bytes;
    } else {
      budget = utilization_kv_budget(total_bytes, free_bytes, options.gpu_memory_utilization);
      if (budget == 0) {
        return resource_exhausted(format("--gpu-memory-utilization {:.2f} of {} leaves nothing for the KV cache: {} is "
                                         "already in use (weights {}), and {} of it is free",
                                         options.gpu_memory_utilization, format_bytes(total_bytes),
                                         format_bytes(total_bytes - free_bytes), format_bytes(weight_bytes),
                                         format_bytes(free_bytes)));
      }
    }
    const kv_cache_layout layout = kv_cache_layout::for_budget(config, options.kv_dtype, options.block_size, budget);
    // One block of the budget is the padding block of CUDA-graph batches.
    if (layout.num_blocks < 2) {
      return resource_exhausted(format("a KV budget of {} holds no usable block of {} tokens", format_bytes(budget),
                                       options.block_size));
    }
    return place_kv(layout);
  }

  // Allocates and zeroes a pool of `layout`, whose last block becomes the padding block.
  status place_kv(kv_cache_layout layout) {
    const std::int64_t allocated = layout.num_blocks;
    layout.num_blocks -= 1;
    constexpr std::size_t align = 256;
    kv = kv_cache_view::plan(layout, allocated, align);
    EDGE_ASSIGN_OR_RETURN(kv_memory, device_memory::allocate(kv.total_bytes(), "the KV cache"));
    kv.base = static_cast<std::byte*>(kv_memory.data());
    // Zeroed so that a stale block table never reads indeterminate bytes (NaN codes).
    EDGE_RETURN_IF_ERROR(cuda_check(cudaMemsetAsync(kv_memory.data(), 0, kv.total_bytes(), stream), "cudaMemset"));
    return cuda_check(cudaStreamSynchronize(stream), "KV cache initialisation");
  }

  std::int64_t pad_block() const { return kv.layout.num_blocks; }

  // Queues the whole forward pass for a staged step, its block copies first.
  status run_step(const meta_layout& m, const staged_step& staged, std::span<const block_copy> copies) {
    const auto at = [&](std::size_t offset) { return meta + offset; };
    const forward_step step{.ids = reinterpret_cast<const std::int32_t*>(at(m.ids)),
                            .positions = reinterpret_cast<const std::int32_t*>(at(m.positions)),
                            .seq = reinterpret_cast<const std::int32_t*>(at(m.seq)),
                            .slots = reinterpret_cast<const std::int64_t*>(at(m.slots)),
                            .block_tables = reinterpret_cast<const std::int32_t*>(at(m.tables)),
                            .table_begin = reinterpret_cast<const std::int32_t*>(at(m.table_begin)),
                            .seq_begin = reinterpret_cast<const std::int32_t*>(at(m.seq_begin)),
                            .last_token = reinterpret_cast<const std::int64_t*>(at(m.last_token)),
                            .tokens = staged.tokens,
                            .seqs = staged.seqs,
                            .rows = staged.rows,
                            .max_run = staged.max_run,
                            .copies = copies};
    return run_forward(plan, weights, buffers, step, kv, kstream());
  }

  // The padded batch size a decode step of `entries` runs as, or 0 when it runs eagerly (as a
  // step with block copies or prompt logits rows always does).
  std::int64_t graph_size(const batch_plan& batch) const {
    if (!options.cuda_graphs || !batch.copies.empty()) return 0;
    for (const batch_entry& e : batch.entries) {
      if (e.tokens.size() != 1 || !e.compute_logits || e.prompt_logits_count != 0) return 0;
    }
    const auto n = static_cast<std::int64_t>(batch.entries.size());
    std::int64_t size = 1;
    while (size < n) size *= 2;
    return std::min(size, options.max_sequences);
  }

  // Stages, uploads and runs one step; the logits rows are on the device afterwards. `sampling`
  // holds one row per logits row of the plan (or is empty: greedy).
  status execute(const batch_plan& batch, std::span<const row_sampling> sampling) {
    EDGE_RETURN_IF_ERROR(select_device());
    EDGE_RETURN_IF_ERROR(check_batch_limits(batch, options.max_batch_tokens, options.max_sequences, prompt_rows));
    const auto entries = static_cast<std::int64_t>(batch.entries.size());
    const std::int64_t graph_batch = graph_size(batch);
    // Padding tokens count against the buffers too: a graph size whose padding does not fit
    // runs eagerly, unpadded (padding short of the graph's size would be computed for nothing).
    const bool padding_fits = graph_batch - entries <= options.max_batch_tokens - batch.total_tokens();
    const std::int64_t padded = graph_batch > 0 && padding_fits ? graph_batch : entries;
    // Room for every entry's whole table; only the entries written are copied (launch).
    const meta_layout m = meta_layout::for_step(padded_tokens(batch, padded), padded,
                                                padded + batch.prompt_logits_rows(), padded * table_blocks);
    std::byte* base = staging.data();
    const step_arrays arrays{.ids = reinterpret_cast<std::int32_t*>(base + m.ids),
                             .positions = reinterpret_cast<std::int32_t*>(base + m.positions),
                             .seq = reinterpret_cast<std::int32_t*>(base + m.seq),
                             .slots = reinterpret_cast<std::int64_t*>(base + m.slots),
                             .block_tables = reinterpret_cast<std::int32_t*>(base + m.tables),
                             .table_begin = reinterpret_cast<std::int32_t*>(base + m.table_begin),
                             .seq_begin = reinterpret_cast<std::int32_t*>(base + m.seq_begin),
                             .last_token = reinterpret_cast<std::int64_t*>(base + m.last_token)};
    EDGE_ASSIGN_OR_RETURN(const staged_step staged,
                          stage_step(batch, padded, plan.vocab, kv.layout, table_blocks, pad_block(), arrays));
    EDGE_ASSIGN_OR_RETURN(staged_sampling staged_rows,
                          stage_sampling(sampling, staged.sampled_rows, plan.vocab,
                                         {.config = reinterpret_cast<kernels::sampling_row*>(base + m.sampling),
                                          .biases = reinterpret_cast<kernels::logit_bias*>(base + m.biases)}));
    step_masks = std::move(staged_rows.masks);
    step_meta = m;
    last_tokens = staged.tokens;
    const status queued = launch(m, staged, staged_rows.bias_entries, batch.copies,
                                 graph_batch > 0 && padded == graph_batch ? graph_batch : 0);
    // The staging buffer is rewritten by the next step: a failed step must not leave its copy
    // in flight.
    if (!queued.ok()) static_cast<void>(cudaStreamSynchronize(stream));
    return queued;
  }

  // Uploads the staged metadata and queues the step: a CUDA graph of size `graph_batch` (0:
  // eagerly), capturing it on the size's second eager run.
  status launch(const meta_layout& m, const staged_step& staged, std::int64_t bias_entries,
                std::span<const block_copy> copies, std::int64_t graph_batch) {
    // Everything before the tables, and the table entries the step wrote.
    const std::size_t used = m.tables + static_cast<std::size_t>(staged.table_entries) * sizeof(std::int32_t);
    EDGE_RETURN_IF_ERROR(cuda_check(cudaMemcpyAsync(meta, staging.data(), used, cudaMemcpyHostToDevice, stream),
                                    "metadata upload"));
    if (bias_entries > 0) {
      EDGE_RETURN_IF_ERROR(cuda_check(cudaMemcpyAsync(meta + m.biases, staging.data() + m.biases,
                                                      static_cast<std::size_t>(bias_entries) * sizeof(kernels::logit_bias),
                                                      cudaMemcpyHostToDevice, stream),
                                      "logit bias upload"));
    }
    const cuda_graph_policy::action act =
        graph_batch > 0 ? graph_policy.next(graph_batch) : cuda_graph_policy::action::eager;
    if (act == cuda_graph_policy::action::replay) {
      return cuda_check(cudaGraphLaunch(graphs.at(graph_batch).exec, stream), "cudaGraphLaunch");
    }
    EDGE_RETURN_IF_ERROR(run_step(m, staged, copies));
    if (graph_batch == 0) return {};
    if (act == cuda_graph_policy::action::eager) {
      graph_policy.ran_eagerly(graph_batch);
      return {};
    }
    // The step itself has run: a capture that fails costs only the graph.
    if (const status captured = capture(graph_batch, m, staged); !captured.ok()) {
      graph_policy.capture_failed(graph_batch);
      log.warn("decode batches of {} run without a CUDA graph: {}", graph_batch, captured.message());
    } else {
      graph_policy.captured(graph_batch);
    }
    return {};
  }

  // Captures the step's graph for `size`.
  status capture(std::int64_t size, const meta_layout& m, const staged_step& staged) {
    EDGE_RETURN_IF_ERROR(cuda_check(cudaStreamSynchronize(stream), "synchronise before capture"));
    EDGE_RETURN_IF_ERROR(cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture"));
    const status queued = run_step(m, staged, {});
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    cudaGraphExec_t exec = nullptr;
    cudaError_t made = cudaErrorUnknown;
    if (queued.ok() && ended == cudaSuccess) made = cudaGraphInstantiate(&exec, graph, 0);
    if (graph != nullptr) cudaGraphDestroy(graph);
    EDGE_RETURN_IF_ERROR(queued);
    EDGE_RETURN_IF_ERROR(cuda_check(ended, "end capture"));
    EDGE_RETURN_IF_ERROR(cuda_check(made, "cudaGraphInstantiate"));
    graphs.emplace(size, graph_exec(exec));
    return {};
  }

  // Device placement: every weight is uploaded once; vectors as f32. A matrix in a format the
  // CUDA kernels do not read (kernels::cuda_matmul_reads: the GGUF K-quants) is decoded exactly
  // on the host and uploaded as bf16, rounded once; the formats widened are logged once.
  class placement final : public weight_placement {
   public:
    explicit placement(state& s) : s_(s) {}

    // Once all weights are placed: which formats were widened, and what it cost.
    void log_widened() const {
      if (widened_.empty()) return;
      std::string names;
      for (const weight_format f : widened_) names += (names.empty() ? "" : ", ") + std::string(kernels::to_string(f));
      s_.log.info("the CUDA kernels do not read {} weights: {} matrices widened to bf16 on upload ({} on the device)",
                  names, widened_matrices_, format_bytes(widened_bytes_));
    }

    result<kernels::weight_view> matrix(const weight_matrix& w) override {
      const weight_matrix* const one[] = {&w};
      EDGE_ASSIGN_OR_RETURN(const auto placed, stack(one));
      return *placed;
    }
    // One device matrix of the parts' rows in order (the CPU runs in-place weights separately).
    result<std::optional<kernels::weight_view>> stack(std::span<const weight_matrix* const> parts) override {
      const weight_matrix& first = *parts.front();
      const bool widen = !kernels::cuda_matmul_reads(first.format);
      const weight_format format = widen ? weight_format::bf16 : first.format;
      const std::int64_t group_size = widen ? 0 : first.group_size;
      const std::int64_t k = first.cols();
      std::int64_t rows = 0;
      for (const weight_matrix* p : parts) rows += p->rows();
      const auto value_bytes = static_cast<std::size_t>(kernels::weight_values_bytes(format, rows, k));
      const auto scale_count = static_cast<std::size_t>(kernels::weight_scale_count(format, rows, k, group_size));
      EDGE_ASSIGN_OR_RETURN(void* values, s_.allocate_weight(value_bytes, first.name));
      float* scales = nullptr;
      if (scale_count > 0) {
        EDGE_ASSIGN_OR_RETURN(void* p, s_.allocate_weight(scale_count * sizeof(float), first.name));
        scales = static_cast<float*>(p);
      }
      std::int64_t row = 0;
      for (const weight_matrix* part : parts) {
        // A model loaded for the CPU may hold CPU row tiles: the device reads rows.
        weight_matrix p = *part;
        std::vector<std::byte> row_values;
        std::vector<float> row_scales;
        if (p.layout == kernels::weight_layout::cpu_tiles) {
          row_values.resize(static_cast<std::size_t>(kernels::weight_values_bytes(p.format, p.rows(), k)));
          row_scales.resize(static_cast<std::size_t>(kernels::weight_scale_count(p.format, p.rows(), k, p.group_size)));
          EDGE_RETURN_IF_ERROR(kernels::unpack_cpu_tiles(p.view(), p.rows(), k, row_values.data(), row_scales.data()));
          p.data = row_values.data();
          p.scales = row_scales.data();
          p.layout = kernels::weight_layout::rows;
        }
        auto* value_at = static_cast<std::byte*>(values) + kernels::weight_values_bytes(format, row, k);
        if (widen) {
          EDGE_RETURN_IF_ERROR(upload_as_bf16(p, value_at));
        } else {
          EDGE_RETURN_IF_ERROR(s_.copy_to_device(
              value_at, p.data, static_cast<std::size_t>(kernels::weight_values_bytes(p.format, p.rows(), k))));
        }
        if (scales != nullptr) {
          const auto count = kernels::weight_scale_count(p.format, p.rows(), k, p.group_size);
          EDGE_RETURN_IF_ERROR(s_.copy_to_device(scales + kernels::weight_scale_count(format, row, k, group_size),
                                                 p.scales, static_cast<std::size_t>(count) * sizeof(float)));
        }
        row += p.rows();
      }
      return std::optional<kernels::weight_view>{
          kernels::weight_view{.format = format, .values = values, .scales = scales, .group_size = group_size}};
    }
    result<const float*> floats(std::span<const float> values) override {
      if (values.empty()) return static_cast<const float*>(nullptr);
      EDGE_ASSIGN_OR_RETURN(void* p, s_.upload(values.data(), values.size_bytes(), "vector"));
      return static_cast<const float*>(p);
    }
    result<const void*> elements(const tensor_view& t) override {
      EDGE_ASSIGN_OR_RETURN(void* p, s_.upload(t.data, t.bytes(), t.name));
      return static_cast<const void*>(p);
    }
    result<const kernels::moe_expert_weights*> expert_views(std::span<const kernels::moe_expert_weights> views) override {
      if (views.empty()) return static_cast<const kernels::moe_expert_weights*>(nullptr);
      EDGE_ASSIGN_OR_RETURN(void* p, s_.upload(views.data(), views.size_bytes(), "expert views"));
      return static_cast<const kernels::moe_expert_weights*>(p);
    }

   private:
    // Rows decoded per upload: a few megabytes of host scratch.
    static constexpr std::int64_t widen_elements_per_chunk = std::int64_t{1} << 22;
    static constexpr std::size_t bf16_grain = std::size_t{1} << 16;

    // w's values decoded exactly to float (kernels::run_dequantize, on a host pool made for the
    // purpose), rounded once to bf16, copied to `target` chunk by chunk.
    status upload_as_bf16(const weight_matrix& w, void* target) {
      if (pool_ == nullptr) pool_ = std::make_unique<thread_pool>(std::max(1u, std::thread::hardware_concurrency()));
      const kernels::stream host{.where = kernels::device::cpu, .pool = pool_.get(), .cuda_stream = nullptr};
      const std::int64_t k = w.cols();
      const std::int64_t chunk_rows = std::max<std::int64_t>(1, widen_elements_per_chunk / k);
      std::vector<float> decoded(static_cast<std::size_t>(std::min(chunk_rows, w.rows()) * k));  // [chunk rows, k]
      std::vector<std::uint16_t> bf16(decoded.size());                                          // [chunk rows, k]
      for (std::int64_t r = 0; r < w.rows(); r += chunk_rows) {
        const std::int64_t n = std::min(chunk_rows, w.rows() - r);
        EDGE_RETURN_IF_ERROR(kernels::run_dequantize(
            {.w = w.view(), .k = k, .row_begin = r, .rows = n, .y = decoded.data(), .y_stride = k}, host));
        pool_->parallel_for(0, static_cast<std::size_t>(n * k), bf16_grain, [&](std::size_t begin, std::size_t end) {
          for (std::size_t i = begin; i < end; ++i) bf16[i] = kernels::float_to_bf16(decoded[i]);
        });
        // From pageable memory the copy has staged the bytes when it returns: the buffer is free.
        EDGE_RETURN_IF_ERROR(s_.copy_to_device(static_cast<std::byte*>(target) + r * k * sizeof(std::uint16_t),
                                               bf16.data(), static_cast<std::size_t>(n * k) * sizeof(std::uint16_t)));
      }
      if (std::find(widened_.begin(), widened_.end(), w.format) == widened_.end()) widened_.push_back(w.format);
      ++widened_matrices_;
      widened_bytes_ += static_cast<std::uint64_t>(w.elements()) * sizeof(std::uint16_t);
      return {};
    }

    state& s_;
    std::unique_ptr<thread_pool> pool_;  // made by the first widened matrix
    std::vector<weight_format> widened_;
    std::int64_t widened_matrices_ = 0;
    std::uint64_t widened_bytes_ = 0;
  };

  // Queues the copy of logits row `row` (on the device) to host_logits row `slot`.
  status queue_logits_row(std::int64_t row, std::int64_t slot) {
    const auto vocab = static_cast<std::size_t>(plan.vocab);
    return cuda_check(cudaMemcpyAsync(reinterpret_cast<float*>(host_logits.data()) + static_cast<std::size_t>(slot) * vocab,
                                      buffers.logits + static_cast<std::size_t>(row) * vocab, vocab * sizeof(float),
                                      cudaMemcpyDeviceToHost, stream),
                      "logits download");
  }
};

cuda_executor::cuda_executor(std::unique_ptr<state> s) : state_(std::move(s)) {}
cuda_executor::~cuda_executor() {
  if (state_) static_cast<void>(state_->select_device());
}

result<std::unique_ptr<cuda_executor::state>> cuda_executor::begin(const cuda_executor_options& options) {
  std::string why;
  if (kernels::cuda::device_count(&why) <= options.device) {
    return failed_precondition(why.empty() ? format("CUDA device {} does not exist", options.device) : why);
  }
  if (options.max_batch_tokens <= 0 || options.max_sequences <= 0 || options.block_size <= 0) {
    return invalid_argument("max_batch_tokens, max_sequences and block_size must be positive");
  }
  if (!(options.gpu_memory_utilization > 0.0 && options.gpu_memory_utilization <= max_gpu_memory_utilization)) {
    return invalid_argument(format("gpu_memory_utilization must be in (0, {}], not {}", max_gpu_memory_utilization,
                                   options.gpu_memory_utilization));
  }
  auto s = std::make_unique<cuda_executor::state>();
  s->options = options;
  s->device = options.device;
  EDGE_RETURN_IF_ERROR(s->select_device());
  cudaDeviceProp properties{};
  EDGE_RETURN_IF_ERROR(cuda_check(cudaGetDeviceProperties(&properties, s->device), "cudaGetDeviceProperties"));
  s->device_name = properties.name;
  s->multiprocessors = properties.multiProcessorCount;
  EDGE_RETURN_IF_ERROR(cuda_check(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  return s;
}

result<std::unique_ptr<cuda_executor>> cuda_executor::finish(std::unique_ptr<state> s) {
  EDGE_RETURN_IF_ERROR(s->allocate_buffers());
  const std::int64_t prefill = std::min(s->options.max_batch_tokens, warm_up_prefill_tokens);
  const std::int64_t blocks = (prefill + 1 + s->options.block_size - 1) / s->options.block_size;
  kv_cache_layout warm = kv_cache_layout::for_tokens(s->config, s->options.kv_dtype, s->options.block_size,
                                                     (blocks + 1) * s->options.block_size);
  EDGE_RETURN_IF_ERROR(s->place_kv(warm));
  std::unique_ptr<cuda_executor> e(new cuda_executor(std::move(s)));
  if (const status warmed = e->warm_up(prefill, blocks); !warmed.ok()) {
    return status(warmed.code(), format("the warm-up forward failed: {}", warmed.message()));
  }
  EDGE_RETURN_IF_ERROR(e->state_->allocate_kv());
  return e;
}

// A prefill of `prefill` tokens (at 9 or more, the tensor-core GEMM and prefill attention),
// then a one-token decode (the GEMV and decode attention), each sampled: with lazy module
// loading, the CUDA default, a kernel's code is loaded at its first launch, and the pool sized
// after this leaves room for what loaded. It also proves at start-up that the kernels run on
// this device. The tokens are id 0; what they compute is thrown away.
status cuda_executor::warm_up(std::int64_t prefill, std::int64_t blocks) {
  std::vector<std::int32_t> table(static_cast<std::size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  const std::vector<token_id> ids(static_cast<std::size_t>(prefill), 0);
  const row_sampling drawn{.config = {.temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .min_p = 0.01f, .uniform = 0.5f}};
  std::int32_t token = 0;
  const batch_plan first{.entries = {{.tokens = ids, .start_position = 0, .block_table = table, .compute_logits = true}}};
  EDGE_RETURN_IF_ERROR(forward_sample(first, std::span(&drawn, 1), std::span(&token, 1), {}, {}));
  const batch_plan next{
      .entries = {{.tokens = std::span(ids.data(), 1), .start_position = prefill, .block_table = table, .compute_logits = true}}};
  return forward_sample(next, std::span(&drawn, 1), std::span(&token, 1), {}, {});
}

result<std::unique_ptr<cuda_executor>> cuda_executor::create(const model& m, const cuda_executor_options& options) {
  EDGE_ASSIGN_OR_RETURN(auto s, begin(options));
  EDGE_RETURN_IF_ERROR(s->set_plan(m.config));
  state::placement place(*s);
  EDGE_ASSIGN_OR_RETURN(s->weights, place_weights(m, s->plan, place));
  place.log_widened();
  return finish(std::move(s));
}

result<std::unique_ptr<cuda_executor>> cuda_executor::create_synthetic(const model_config& config,
                                                                       kernels::weight_format weights,
                                                                       std::uint64_t seed,
                                                                       const cuda_executor_options& options) {
  if (weights != weight_format::int4 && weights != weight_format::fp8_e4m3 && weights != weight_format::bf16) {
    return invalid_argument("synthetic CUDA models have int4, fp8 or bf16 projections");
  }
  if (config.qkv_bias || config.qk_norm || config.rotary_dim != 0 || config.moe) {
    return invalid_argument("synthetic CUDA models have Llama's layers: no Q/K/V biases, no per-head Q/K norms, "
                            "RoPE over whole heads, dense MLPs");
  }
  EDGE_ASSIGN_OR_RETURN(auto s, begin(options));
  EDGE_RETURN_IF_ERROR(s->set_plan(config));
  const model_plan& plan = s->plan;
  // Random rows are made in slabs of this scratch before quantization.
  constexpr std::int64_t scratch_floats = std::int64_t{1} << 26;
  EDGE_ASSIGN_OR_RETURN(device_memory scratch, device_memory::allocate(scratch_floats * sizeof(float), "scratch"));
  auto* scratch_data = static_cast<float*>(scratch.data());
  std::uint64_t next_seed = seed;
  const auto matrix = [&](std::int64_t rows, std::int64_t k, std::string_view what) {
    next_seed += 0x1'0000'0000ull;
    return s->random_matrix(weights, rows, k, next_seed, scratch_data, scratch_floats, what);
  };
  const std::vector<float> ones(static_cast<std::size_t>(plan.hidden), 1.0f);
  state::placement place(*s);
  forward_weights& w = s->weights;
  EDGE_ASSIGN_OR_RETURN(const float* norm, place.floats(ones));
  EDGE_ASSIGN_OR_RETURN(const float* inv_freq, place.floats(plan.layers.front().attention.rope.inv_freq()));
  for (const layer_plan& l : plan.layers) {
    const std::int64_t qkv_rows = l.attention.qkv_dim();
    const std::int64_t gate_up_rows = 2 * l.mlp.intermediate;
    layer_forward_weights d;
    d.attn_norm = norm;
    d.ffn_norm = norm;
    d.rope_inv_freq = inv_freq;
    EDGE_ASSIGN_OR_RETURN(const kernels::weight_view qkv, matrix(qkv_rows, plan.hidden, "qkv"));
    d.qkv = {{.w = qkv, .rows = qkv_rows}};
    EDGE_ASSIGN_OR_RETURN(d.wo, matrix(plan.hidden, l.attention.q_dim(), "o"));
    EDGE_ASSIGN_OR_RETURN(const kernels::weight_view gate_up, matrix(gate_up_rows, plan.hidden, "gate_up"));
    d.gate_up = {{.w = gate_up, .rows = gate_up_rows}};
    EDGE_ASSIGN_OR_RETURN(d.w_down, matrix(plan.hidden, l.mlp.intermediate, "down"));
    w.layers.push_back(std::move(d));
  }
  w.final_norm = norm;
  // Embedding and classifier stay 16-bit, as llm-compressor's W4A16 / W8A16 recipes leave them.
  const auto table_bytes = static_cast<std::size_t>(plan.vocab * plan.hidden) * 2;
  EDGE_ASSIGN_OR_RETURN(void* embedding, s->allocate_weight(table_bytes, "embedding"));
  EDGE_RETURN_IF_ERROR(
      cuda_detail::fill_uniform(embedding, dtype::bf16, plan.vocab * plan.hidden, seed, -1.0f, 1.0f, s->stream));
  w.embedding = embedding;
  w.embedding_type = dtype::bf16;
  EDGE_ASSIGN_OR_RETURN(void* head, s->allocate_weight(table_bytes, "classifier"));
  const float bound = 1.0f / std::sqrt(static_cast<float>(plan.hidden));
  EDGE_RETURN_IF_ERROR(
      cuda_detail::fill_uniform(head, dtype::bf16, plan.vocab * plan.hidden, seed + 1, -bound, bound, s->stream));
  w.lm_head = {.format = weight_format::bf16, .values = head, .scales = nullptr, .group_size = 0};
  EDGE_RETURN_IF_ERROR(cuda_check(cudaStreamSynchronize(s->stream), "synthetic weights"));
  scratch = device_memory();
  return finish(std::move(s));
}

result<std::span<std::byte>> cuda_executor::allocate_host_tier(std::int64_t slots) {
  state& s = *state_;
  if (s.host_tier_slots > 0) return failed_precondition("the host tier is allocated already");
  if (slots < 1) return invalid_argument(format("a host tier of {} blocks", slots));
  EDGE_RETURN_IF_ERROR(s.select_device());
  const std::size_t bytes = static_cast<std::size_t>(slots) * s.kv.layout.bytes_per_block();
  EDGE_RETURN_IF_ERROR(s.host_tier.allocate(bytes));
  EDGE_RETURN_IF_ERROR(
      cuda_check(cudaStreamCreateWithFlags(&s.copy_stream, cudaStreamNonBlocking), "cudaStreamCreate (copies)"));
  for (cudaEvent_t* e : {&s.steps_done, &s.spills_done, &s.restores_done}) {
    EDGE_RETURN_IF_ERROR(cuda_check(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "cudaEventCreate"));
  }
  for (cudaEvent_t* e : {&s.restores_timed_begin, &s.restores_timed_end}) {
    EDGE_RETURN_IF_ERROR(cuda_check(cudaEventCreate(e), "cudaEventCreate"));
  }
  s.host_tier_slots = slots;
  return std::span(s.host_tier.data(), bytes);
}

void cuda_executor::take_copy_back_seconds(std::vector<double>& out) {
  state& s = *state_;
  s.collect_copy_back_time();
  out.insert(out.end(), s.copy_back_seconds.begin(), s.copy_back_seconds.end());
  s.copy_back_seconds.clear();
}

status cuda_executor::finish_tier_copies() {
  state& s = *state_;
  if (s.copy_stream == nullptr) return {};
  EDGE_RETURN_IF_ERROR(s.select_device());
  return cuda_check(cudaStreamSynchronize(s.copy_stream), "host tier copies");
}

status cuda_executor::forward(const batch_plan& plan, std::span<float> logits) {
  state& s = *state_;
  EDGE_RETURN_IF_ERROR(s.select_device());
  EDGE_RETURN_IF_ERROR(s.queue_tier_copies(plan));
  if (plan.total_tokens() == 0) return {};
  EDGE_RETURN_IF_ERROR(check_logits_buffer(plan, logits, s.plan.vocab));
  EDGE_RETURN_IF_ERROR(s.execute(plan, {}));
  settle_on_early_return settle(s.stream);
  // The plan's rows (sampled, then prompt logits rows; a padded graph batch has no prompt rows):
  // padding rows stay behind.
  const std::size_t bytes = logits.size() * sizeof(float);
  if (bytes > 0) {
    EDGE_RETURN_IF_ERROR(cuda_check(
        cudaMemcpyAsync(s.host_logits.data(), s.buffers.logits, bytes, cudaMemcpyDeviceToHost, s.stream),
        "logits download"));
  }
  EDGE_RETURN_IF_ERROR(s.queue_routing_download());
  EDGE_RETURN_IF_ERROR(cuda_check(cudaStreamSynchronize(s.stream), "forward"));
  settle.settled();
  if (bytes > 0) std::memcpy(logits.data(), s.host_logits.data(), bytes);
  return {};
}

status cuda_executor::forward_sample(const batch_plan& plan, std::span<const row_sampling> rows,
                                     std::span<std::int32_t> tokens, std::span<float> logits,
                                     const mask_filler& fill_masks) {
  state& s = *state_;
  EDGE_RETURN_IF_ERROR(check_sampling_args(plan, rows, tokens, logits, s.plan.vocab));
  EDGE_RETURN_IF_ERROR(s.select_device());
  EDGE_RETURN_IF_ERROR(s.queue_tier_copies(plan));
  if (plan.total_tokens() == 0) return {};
  EDGE_RETURN_IF_ERROR(s.execute(plan, rows));
  settle_on_early_return settle(s.stream);
  const auto wanted = static_cast<std::int64_t>(rows.size());
  // Raw rows first: sampling uses the device logits as scratch.
  std::int64_t copied = 0;
  for (std::int64_t r = 0; r < wanted; ++r) {
    if (rows[static_cast<std::size_t>(r)].copy_logits) EDGE_RETURN_IF_ERROR(s.queue_logits_row(r, copied++));
  }
  // The prompt logits rows follow the sampled rows (this step ran eagerly, unpadded).
  const std::int64_t prompt_rows = plan.prompt_logits_rows();
  if (prompt_rows > 0) {
    const auto vocab = static_cast<std::size_t>(s.plan.vocab);
    EDGE_RETURN_IF_ERROR(cuda_check(cudaMemcpyAsync(reinterpret_cast<float*>(s.host_logits.data()) + static_cast<std::size_t>(copied) * vocab,
                                                    s.buffers.logits + static_cast<std::size_t>(wanted) * vocab,
                                                    static_cast<std::size_t>(prompt_rows) * vocab * sizeof(float),
                                                    cudaMemcpyDeviceToHost, s.stream),
                                    "prompt logits download"));
  }
  // The device computes the step meanwhile: the host fills the grammars' masks now (rows sampled
  // on the host read them too), and those sampled here are staged behind the step on the stream.
  if (fill_masks) fill_masks();
  const bool any_sampled = std::any_of(rows.begin(), rows.end(), [](const row_sampling& r) { return r.sample; });
  if (any_sampled) {
    if (!s.step_masks.empty()) {
      const auto words = static_cast<std::size_t>(kernels::allowed_words(s.plan.vocab));
      auto* staged = reinterpret_cast<std::uint32_t*>(s.host_allowed.data());
      for (std::size_t k = 0; k < s.step_masks.size(); ++k) {
        std::memcpy(staged + k * words, s.step_masks[k].data(), words * sizeof(std::uint32_t));
      }
      const std::size_t bytes = s.step_masks.size() * words * sizeof(std::uint32_t);
      EDGE_RETURN_IF_ERROR(cuda_check(cudaMemcpyAsync(s.allowed, s.host_allowed.data(), bytes, cudaMemcpyHostToDevice,
                                                      s.stream),
                                      "token mask upload"));
    }
    const auto* device_config = reinterpret_cast<const kernels::sampling_row*>(s.meta + s.step_meta.sampling);
    const auto* device_biases = reinterpret_cast<const kernels::logit_bias*>(s.meta + s.step_meta.biases);
    EDGE_RETURN_IF_ERROR(kernels::run_sampling({.logits = s.buffers.logits,
                                                .config = device_config,
                                                .out = s.sampled,
                                                .rows = wanted,
                                                .vocab = s.plan.vocab,
                                                .biases = device_biases,
                                                .allowed = reinterpret_cast<const std::uint32_t*>(s.allowed)},
                                               s.kstream()));
    EDGE_RETURN_IF_ERROR(cuda_check(cudaMemcpyAsync(s.host_sampled.data(), s.sampled,
                                                    static_cast<std::size_t>(wanted) * sizeof(std::int32_t),
                                                    cudaMemcpyDeviceToHost, s.stream),
                                    "token download"));
  }
  EDGE_RETURN_IF_ERROR(s.queue_routing_download());
  EDGE_RETURN_IF_ERROR(cuda_check(cudaStreamSynchronize(s.stream), "forward_sample"));
  settle.settled();
  if (!logits.empty()) std::memcpy(logits.data(), s.host_logits.data(), logits.size_bytes());
  if (any_sampled) {
    const auto* sampled = reinterpret_cast<const std::int32_t*>(s.host_sampled.data());
    for (std::int64_t r = 0; r < wanted; ++r) {
      if (rows[static_cast<std::size_t>(r)].sample) tokens[static_cast<std::size_t>(r)] = sampled[r];
    }
  }
  return {};
}

std::int64_t cuda_executor::max_batch_tokens() const { return state_->options.max_batch_tokens; }
std::int64_t cuda_executor::max_sequences() const { return state_->options.max_sequences; }
std::int64_t cuda_executor::vocab_size() const { return state_->plan.vocab; }
std::int64_t cuda_executor::max_prompt_logits_rows() const { return state_->prompt_rows; }
executor_counters cuda_executor::counters() const {
  return {.graph_capture_failures = state_->graph_policy.capture_failures()};
}
const kv_cache_layout& cuda_executor::kv_layout() const { return state_->kv.layout; }

expert_routing cuda_executor::last_routing() const {
  const state& s = *state_;
  const std::int64_t layers = s.plan.moe_layers();
  if (layers == 0 || s.last_tokens == 0) return {};
  const std::int64_t experts = s.plan.max_experts();
  return {.moe_layers = layers,
          .tokens = s.last_tokens,
          .top_k = s.plan.max_top_k(),
          .experts = experts,
          .choices = {},
          .expert_tokens = std::span<const std::int32_t>(
              reinterpret_cast<const std::int32_t*>(s.host_expert_tokens.data()), static_cast<std::size_t>(layers * experts))};
}

kv_cache_capacity cuda_executor::kv_capacity() const {
  const kv_cache_layout& kv = state_->kv.layout;
  return kv_cache_capacity_for(state_->config, kv.dtype, kv.block_size,
                               static_cast<std::size_t>(kv.num_blocks) * kv.bytes_per_block());
}

std::string cuda_executor::describe() const {
  const state& s = *state_;
  return format("{} ({} SMs): weights {}, KV pool {}, buffers {}; a decode step queues {} kernels", s.device_name,
                s.multiprocessors, format_bytes(s.weight_bytes), format_bytes(s.kv_memory.bytes()),
                format_bytes(s.buffer_memory.bytes()), count_decode_launches(s.plan, s.weights, s.buffers, s.kv));
}

status cuda_executor::fill_kv_random(std::uint64_t seed) {
  state& s = *state_;
  EDGE_RETURN_IF_ERROR(s.select_device());
  const kv_cache_view& kv = s.kv;
  // Values of a typical magnitude; FP8 codes up to ±240 with scales near amax / 448.
  const bool scaled = kv.key_scale_bytes != 0;
  const std::size_t element = kernels::dtype_size(kv.layout.dtype);
  for (std::int64_t l = 0; l < kv.layout.num_layers; ++l) {
    for (int which = 0; which < 2; ++which) {
      void* pool = which == 0 ? kv.keys(l) : kv.values(l);
      if (pool == nullptr) continue;
      const auto layer_seed = seed + static_cast<std::uint64_t>(l * 4 + which) * 0x1'0000'0000ull;
      const auto elements = static_cast<std::int64_t>((which == 0 ? kv.key_bytes : kv.value_bytes) / element);
      EDGE_RETURN_IF_ERROR(cuda_detail::fill_uniform(pool, kv.layout.dtype, elements, layer_seed,
                                                     scaled ? -240.0f : -2.0f, scaled ? 240.0f : 2.0f, s.stream));
      if (scaled) {
        const std::size_t scale_bytes = which == 0 ? kv.key_scale_bytes : kv.value_scale_bytes;
        EDGE_RETURN_IF_ERROR(cuda_detail::fill_uniform(which == 0 ? kv.key_scales(l) : kv.value_scales(l), dtype::f32,
                                                       static_cast<std::int64_t>(scale_bytes / sizeof(float)),
                                                       layer_seed + 1, 0.002f, 0.006f, s.stream));
      }
    }
  }
  return cuda_check(cudaStreamSynchronize(s.stream), "fill_kv_random");
}

}  // namespace edge::backend
