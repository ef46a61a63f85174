#include "edge/backend/runtime/cuda_executor.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "cuda_executor_kernels.h"
#include "edge/common/format.h"
#include "kernels/cpu/load.h"
#include "kernels/cuda/launchers.h"
#include "kernels/embedding/embedding.h"
#include "kernels/kv_cache_write/kv_cache_write.h"
#include "kernels/matmul/matmul.h"
#include "kernels/paged_attention/paged_attention.h"
#include "kernels/quantize/quantize.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/silu_mul/silu_mul.h"

namespace edge::backend {
namespace {

using kernels::dtype;
using kernels::weight_format;

status cuda_check(cudaError_t error, std::string_view what) {
  if (error == cudaSuccess) return {};
  return internal_error(format("{}: {} ({})", what, cudaGetErrorName(error), cudaGetErrorString(error)));
}

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

// Where each per-step array sits in the metadata block for a step of T tokens and S sequences.
// The offsets depend only on (T, S), so a CUDA graph captured for a batch size keeps reading
// the right places whatever the step.
struct meta_layout {
  static constexpr std::size_t alignment = 16;
  std::size_t slots = 0;       // int64 [T]
  std::size_t last_token = 0;  // int64 [S]
  std::size_t ids = 0;         // int32 [T]
  std::size_t positions = 0;   // int32 [T]
  std::size_t seq = 0;         // int32 [T]
  std::size_t seq_begin = 0;   // int32 [S + 1]
  std::size_t tables = 0;      // int32 [S, max_table]
  std::size_t sampling = 0;    // sampling_row [S]
  std::size_t bytes = 0;

  static meta_layout for_step(std::int64_t tokens, std::int64_t seqs, std::int64_t max_table) {
    meta_layout m;
    std::size_t at = 0;
    const auto take = [&at](std::size_t& field, std::size_t bytes) {
      field = at;
      at += (bytes + alignment - 1) / alignment * alignment;
    };
    const auto t = static_cast<std::size_t>(tokens);
    const auto s = static_cast<std::size_t>(seqs);
    take(m.slots, t * sizeof(std::int64_t));
    take(m.last_token, s * sizeof(std::int64_t));
    take(m.ids, t * sizeof(std::int32_t));
    take(m.positions, t * sizeof(std::int32_t));
    take(m.seq, t * sizeof(std::int32_t));
    take(m.seq_begin, (s + 1) * sizeof(std::int32_t));
    take(m.tables, s * static_cast<std::size_t>(max_table) * sizeof(std::int32_t));
    take(m.sampling, s * sizeof(kernels::sampling_row));
    m.bytes = at;
    return m;
  }
};

struct layer_device {
  kernels::weight_view wqkv;     // [q_dim + 2 kv_dim, hidden]
  kernels::weight_view wo;       // [hidden, q_dim]
  kernels::weight_view w_gate_up;  // [2 inter, hidden]
  kernels::weight_view w_down;   // [hidden, inter]
  const float* attn_norm = nullptr;  // [hidden]
  const float* ffn_norm = nullptr;   // [hidden]
  const float* bqkv = nullptr;       // [q_dim + 2 kv_dim] or null
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

std::vector<float> floats_of(const tensor_view& t) {
  std::vector<float> out(static_cast<std::size_t>(t.elements()));
  kernels::cpu::convert_to_float(t.type, t.data, t.elements(), out.data());
  return out;
}

}  // namespace

bool cuda_available(std::string* why_not) { return kernels::cuda::device_count(why_not) > 0; }

struct cuda_executor::state {
  model_config config;
  cuda_executor_options options;
  int device = 0;
  cudaStream_t stream = nullptr;
  std::string device_name;
  int multiprocessors = 0;

  std::int64_t hidden = 0, q_dim = 0, kv_dim = 0, qkv_dim = 0, inter = 0, vocab = 0, heads = 0, kv_heads = 0,
               head_dim = 0, max_table = 0;

  // Weights.
  std::vector<device_memory> weight_memory;
  std::size_t weight_bytes = 0;
  const void* embedding = nullptr;  // [vocab, hidden] of embedding_type
  dtype embedding_type = dtype::f32;
  kernels::weight_view lm_head;     // [vocab, hidden]
  std::vector<layer_device> layers;
  const float* final_norm = nullptr;  // [hidden]
  const float* inv_freq = nullptr;    // [head_dim / 2]
  kernels::rope_pairs rope_pairs = kernels::rope_pairs::adjacent;

  // Activations and workspaces, for max_batch_tokens tokens and max_sequences sequences.
  device_memory buffer_memory;
  float* x = nullptr;        // [T, hidden] the residual stream
  float* xn = nullptr;       // [T, hidden]
  float* qkv = nullptr;      // [T, qkv_dim]
  float* attn = nullptr;     // [T, q_dim]
  float* gate_up = nullptr;  // [T, 2 inter]
  float* last = nullptr;     // [S, hidden]
  float* logits = nullptr;   // [S, vocab]
  std::int32_t* sampled = nullptr;  // [S]
  float* matmul_workspace = nullptr;
  std::int64_t matmul_workspace_floats = 0;
  float* attention_workspace = nullptr;
  std::int64_t attention_workspace_floats = 0;
  std::byte* meta = nullptr;  // the per-step metadata, meta_layout for the step's (T, S)
  std::size_t meta_bytes = 0;

  // Host staging.
  pinned_memory staging;       // meta_bytes
  pinned_memory host_logits;   // [S, vocab]
  pinned_memory host_sampled;  // [S]

  // The KV pool: per layer [K pool][V pool][K scales][V scales], as kv_cache.h lays it out.
  kv_cache_layout kv;  // usable blocks; block kv.num_blocks is the padding block
  device_memory kv_memory;
  std::size_t kv_pool_bytes = 0;
  std::size_t kv_scale_bytes = 0;

  meta_layout step_meta;                      // the layout of the step last executed
  std::map<std::int64_t, graph_exec> graphs;  // by padded decode batch size
  std::set<std::int64_t> warmed;              // sizes run eagerly once (kernel attributes set)

  ~state() {
    graphs.clear();
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  kernels::stream kstream() const { return {.where = kernels::device::cuda, .pool = nullptr, .cuda_stream = stream}; }
  status select_device() const { return cuda_check(cudaSetDevice(device), "cudaSetDevice"); }

  void* kv_region(std::int64_t layer, int which) const {
    const std::size_t layer_bytes = 2 * (kv_pool_bytes + kv_scale_bytes);
    std::size_t offset = static_cast<std::size_t>(layer) * layer_bytes;
    if (which == 1) offset += kv_pool_bytes;
    if (which == 2) offset += 2 * kv_pool_bytes;
    if (which == 3) offset += 2 * kv_pool_bytes + kv_scale_bytes;
    return static_cast<std::byte*>(kv_memory.data()) + offset;
  }
  void* keys(std::int64_t layer) const { return kv_region(layer, 0); }
  void* values(std::int64_t layer) const { return kv_region(layer, 1); }
  float* key_scales(std::int64_t layer) const {
    return kv_scale_bytes == 0 ? nullptr : static_cast<float*>(kv_region(layer, 2));
  }
  float* value_scales(std::int64_t layer) const {
    return kv_scale_bytes == 0 ? nullptr : static_cast<float*>(kv_region(layer, 3));
  }

  result<void*> allocate_weight(std::size_t bytes, std::string_view what) {
    EDGE_ASSIGN_OR_RETURN(device_memory m, device_memory::allocate(bytes, what));
    void* p = m.data();
    weight_bytes += m.bytes();
    weight_memory.push_back(std::move(m));
    return p;
  }

  result<const float*> upload_floats(const std::vector<float>& values, std::string_view what) {
    if (values.empty()) return static_cast<const float*>(nullptr);
    EDGE_ASSIGN_OR_RETURN(void* p, allocate_weight(values.size() * sizeof(float), what));
    EDGE_RETURN_IF_ERROR(cuda_check(cudaMemcpy(p, values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice),
                                    "upload"));
    return static_cast<const float*>(p);
  }

  // Several host matrices of one format stacked into one device matrix (their rows in order).
  result<kernels::weight_view> upload_stacked(std::initializer_list<const weight_matrix*> parts, std::string_view what) {
    const weight_matrix& first = **parts.begin();
    std::int64_t rows = 0;
    for (const weight_matrix* w : parts) {
      if (w->format != first.format || w->group_size != first.group_size || w->cols() != first.cols()) {
        return invalid_argument(format("{}: the fused matrices must share one format and group size", what));
      }
      rows += w->rows();
    }
    const std::int64_t k = first.cols();
    const std::size_t value_bytes = static_cast<std::size_t>(kernels::weight_values_bytes(first.format, rows, k));
    const std::size_t scale_count =
        static_cast<std::size_t>(kernels::weight_scale_count(first.format, rows, k, first.group_size));
    EDGE_ASSIGN_OR_RETURN(void* values, allocate_weight(value_bytes, what));
    float* scales = nullptr;
    if (scale_count > 0) {
      EDGE_ASSIGN_OR_RETURN(void* s, allocate_weight(scale_count * sizeof(float), what));
      scales = static_cast<float*>(s);
    }
    std::size_t value_offset = 0;
    std::size_t scale_offset = 0;
    for (const weight_matrix* w : parts) {
      const auto bytes = static_cast<std::size_t>(kernels::weight_values_bytes(w->format, w->rows(), k));
      EDGE_RETURN_IF_ERROR(cuda_check(
          cudaMemcpy(static_cast<std::byte*>(values) + value_offset, w->data, bytes, cudaMemcpyHostToDevice), "upload"));
      value_offset += bytes;
      const auto count = static_cast<std::size_t>(kernels::weight_scale_count(w->format, w->rows(), k, w->group_size));
      if (count > 0) {
        EDGE_RETURN_IF_ERROR(
            cuda_check(cudaMemcpy(scales + scale_offset, w->scales, count * sizeof(float), cudaMemcpyHostToDevice), "upload"));
        scale_offset += count;
      }
    }
    return kernels::weight_view{.format = first.format, .values = values, .scales = scales, .group_size = first.group_size};
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

  status set_dimensions(const model_config& c) {
    config = c;
    hidden = c.hidden_size;
    heads = c.num_heads;
    kv_heads = c.num_kv_heads;
    head_dim = c.head_dim;
    q_dim = heads * head_dim;
    kv_dim = kv_heads * head_dim;
    qkv_dim = q_dim + 2 * kv_dim;
    inter = c.intermediate_size;
    vocab = c.vocab_size;
    max_table = (std::max<std::int64_t>(c.max_position, 1) + options.block_size - 1) / options.block_size;
    if (hidden <= 0 || heads <= 0 || kv_heads <= 0 || head_dim <= 0 || inter <= 0 || vocab <= 0 || c.num_layers <= 0) {
      return invalid_argument("the model configuration has an empty dimension");
    }
    rope_pairs = c.rope == rope_layout::adjacent_pairs ? kernels::rope_pairs::adjacent : kernels::rope_pairs::half_split;
    std::optional<kernels::rope_llama3_scaling> scaling;
    if (c.rope_scaling) {
      scaling = kernels::rope_llama3_scaling{c.rope_scaling->factor, c.rope_scaling->low_freq_factor,
                                             c.rope_scaling->high_freq_factor,
                                             static_cast<double>(c.rope_scaling->original_max_position)};
    }
    EDGE_ASSIGN_OR_RETURN(inv_freq, upload_floats(kernels::rope_inv_freq(head_dim, c.rope_theta, scaling), "rope"));
    return {};
  }

  // Activation buffers, workspaces, metadata and staging.
  status allocate_buffers() {
    const auto T = options.max_batch_tokens;
    const auto S = options.max_sequences;
    const std::int64_t widest = std::max({qkv_dim, hidden, 2 * inter});
    matmul_workspace_floats = kernels::matmul_workspace_floats(T, widest);
    // Splits pay only while the grid is small; 64 tokens cover every split the launcher picks
    // for batches that small (it uses fewer splits when the workspace is short).
    attention_workspace_floats = kernels::paged_attention_workspace_floats(std::min<std::int64_t>(T, 64), heads, head_dim);
    meta_bytes = meta_layout::for_step(T, S, max_table).bytes;
    const std::vector<std::pair<float**, std::int64_t>> float_buffers = {
        {&x, T * hidden},        {&xn, T * hidden},     {&qkv, T * qkv_dim},
        {&attn, T * q_dim},      {&gate_up, T * 2 * inter}, {&last, S * hidden},
        {&logits, S * vocab},    {&matmul_workspace, matmul_workspace_floats},
        {&attention_workspace, attention_workspace_floats}};
    constexpr std::size_t align = 256;
    std::size_t total = 0;
    const auto round = [](std::size_t v) { return (v + align - 1) / align * align; };
    for (const auto& [ptr, count] : float_buffers) total += round(static_cast<std::size_t>(count) * sizeof(float));
    total += round(static_cast<std::size_t>(S) * sizeof(std::int32_t)) + round(meta_bytes);
    EDGE_ASSIGN_OR_RETURN(buffer_memory, device_memory::allocate(total, "activations"));
    auto* at = static_cast<std::byte*>(buffer_memory.data());
    for (const auto& [ptr, count] : float_buffers) {
      *ptr = reinterpret_cast<float*>(at);
      at += round(static_cast<std::size_t>(count) * sizeof(float));
    }
    sampled = reinterpret_cast<std::int32_t*>(at);
    at += round(static_cast<std::size_t>(S) * sizeof(std::int32_t));
    meta = at;
    EDGE_RETURN_IF_ERROR(staging.allocate(meta_bytes));
    EDGE_RETURN_IF_ERROR(host_logits.allocate(static_cast<std::size_t>(S * vocab) * sizeof(float)));
    return host_sampled.allocate(static_cast<std::size_t>(S) * sizeof(std::int32_t));
  }

  // The KV pool from what is left of the device: --kv-cache-memory, or the utilization rule.
  status allocate_kv() {
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    EDGE_RETURN_IF_ERROR(cuda_check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
    std::size_t budget = 0;
    if (options.kv_cache_bytes) {
      budget = *options.kv_cache_bytes;
    } else {
      const double allowed = options.gpu_memory_utilization * static_cast<double>(total_bytes);
      const auto in_use = static_cast<double>(total_bytes - free_bytes);
      if (allowed <= in_use) {
        return resource_exhausted(format("--gpu-memory-utilization {:.2f} of {} leaves nothing for the KV cache: {} is "
                                         "already in use (weights {})",
                                         options.gpu_memory_utilization, format_bytes(total_bytes),
                                         format_bytes(total_bytes - free_bytes), format_bytes(weight_bytes)));
      }
      budget = static_cast<std::size_t>(allowed - in_use);
    }
    kv_cache_layout layout = kv_cache_layout::for_budget(config, options.kv_dtype, options.block_size, budget);
    // One block of the budget is the padding block of CUDA-graph batches.
    if (layout.num_blocks < 2) {
      return resource_exhausted(format("a KV budget of {} holds no usable block of {} tokens", format_bytes(budget),
                                       options.block_size));
    }
    const auto rows = static_cast<std::size_t>(layout.num_blocks * layout.num_kv_heads * layout.block_size);
    constexpr std::size_t align = 256;
    const auto round = [](std::size_t v) { return (v + align - 1) / align * align; };
    kv_pool_bytes = round(rows * static_cast<std::size_t>(layout.head_dim) * kernels::dtype_size(layout.dtype));
    kv_scale_bytes = kernels::kv_cache_scaled(layout.dtype) ? round(rows * sizeof(float)) : 0;
    const std::size_t total = 2 * (kv_pool_bytes + kv_scale_bytes) * static_cast<std::size_t>(layout.num_layers);
    EDGE_ASSIGN_OR_RETURN(kv_memory, device_memory::allocate(total, "the KV cache"));
    // Zeroed so that a stale block table never reads indeterminate bytes (NaN codes).
    EDGE_RETURN_IF_ERROR(cuda_check(cudaMemsetAsync(kv_memory.data(), 0, total, stream), "cudaMemset"));
    layout.num_blocks -= 1;
    kv = layout;
    return cuda_check(cudaStreamSynchronize(stream), "KV cache initialisation");
  }

  std::int64_t pad_block() const { return kv.num_blocks; }

  // Checks the plan and writes the step's metadata into the staging buffer; `padded` entries
  // beyond the plan's are padding rows (decode graphs). Returns the layout used.
  result<meta_layout> stage(const batch_plan& plan, std::int64_t padded, std::span<const kernels::sampling_row> sampling,
                            std::int64_t& tokens_out, std::int64_t& rows_out, std::int64_t& max_run) {
    const auto entries = static_cast<std::int64_t>(plan.entries.size());
    const std::int64_t tokens = plan.total_tokens() + (padded - entries);
    const std::int64_t seqs = padded;
    const meta_layout m = meta_layout::for_step(tokens, seqs, max_table);
    std::byte* base = staging.data();
    auto* slots = reinterpret_cast<std::int64_t*>(base + m.slots);
    auto* last_token = reinterpret_cast<std::int64_t*>(base + m.last_token);
    auto* ids = reinterpret_cast<std::int32_t*>(base + m.ids);
    auto* positions = reinterpret_cast<std::int32_t*>(base + m.positions);
    auto* seq = reinterpret_cast<std::int32_t*>(base + m.seq);
    auto* seq_begin = reinterpret_cast<std::int32_t*>(base + m.seq_begin);
    auto* tables = reinterpret_cast<std::int32_t*>(base + m.tables);
    auto* rows_config = reinterpret_cast<kernels::sampling_row*>(base + m.sampling);

    std::int64_t t = 0;
    std::int64_t row = 0;
    max_run = 0;
    for (std::int64_t e = 0; e < seqs; ++e) {
      seq_begin[e] = static_cast<std::int32_t>(t);
      std::int32_t* table = tables + e * max_table;
      if (e >= entries) {
        // Padding: one token at position 0 writing into the padding block, its logits unused.
        table[0] = static_cast<std::int32_t>(pad_block());
        ids[t] = 0;
        positions[t] = 0;
        seq[t] = static_cast<std::int32_t>(e);
        slots[t] = pad_block() * kv.block_size;
        last_token[row++] = t;
        ++t;
        max_run = std::max<std::int64_t>(max_run, 1);
        continue;
      }
      const batch_entry& entry = plan.entries[static_cast<std::size_t>(e)];
      const auto count = static_cast<std::int64_t>(entry.tokens.size());
      const std::int64_t end_position = entry.start_position + count;
      const std::int64_t blocks_needed = (end_position + kv.block_size - 1) / kv.block_size;
      if (count == 0 || entry.start_position < 0) return invalid_argument("batch entry without tokens");
      if (blocks_needed > static_cast<std::int64_t>(entry.block_table.size()) || blocks_needed > max_table) {
        return invalid_argument(format("block table of {} blocks cannot hold position {} (limit {} blocks)",
                                       entry.block_table.size(), end_position - 1, max_table));
      }
      for (std::int64_t b = 0; b < blocks_needed; ++b) {
        const std::int32_t block = entry.block_table[static_cast<std::size_t>(b)];
        if (block < 0 || block >= kv.num_blocks) {
          return invalid_argument(format("block {} outside the KV cache of {} blocks", block, kv.num_blocks));
        }
        table[b] = block;
      }
      for (std::int64_t i = 0; i < count; ++i, ++t) {
        const std::int32_t id = entry.tokens[static_cast<std::size_t>(i)];
        if (id < 0 || id >= vocab) return invalid_argument(format("token id {} is outside the vocabulary of {}", id, vocab));
        const std::int64_t position = entry.start_position + i;
        ids[t] = id;
        positions[t] = static_cast<std::int32_t>(position);
        seq[t] = static_cast<std::int32_t>(e);
        slots[t] = static_cast<std::int64_t>(entry.block_table[static_cast<std::size_t>(position / kv.block_size)]) *
                       kv.block_size + position % kv.block_size;
      }
      max_run = std::max(max_run, count);
      if (entry.compute_logits) last_token[row++] = t - 1;
    }
    seq_begin[seqs] = static_cast<std::int32_t>(t);
    for (std::int64_t r = 0; r < row; ++r) {
      rows_config[r] = r < static_cast<std::int64_t>(sampling.size()) ? sampling[static_cast<std::size_t>(r)]
                                                                      : kernels::sampling_row{.temperature = 0.0f};
    }
    tokens_out = tokens;
    rows_out = row;
    return m;
  }

  // Queues the whole forward pass for a staged step.
  status run_step(const meta_layout& m, std::int64_t tokens, std::int64_t seqs, std::int64_t rows,
                  std::int64_t max_run) {
    const kernels::stream s = kstream();
    const auto* slots = reinterpret_cast<const std::int64_t*>(meta + m.slots);
    const auto* last_token = reinterpret_cast<const std::int64_t*>(meta + m.last_token);
    const auto* ids = reinterpret_cast<const std::int32_t*>(meta + m.ids);
    const auto* positions = reinterpret_cast<const std::int32_t*>(meta + m.positions);
    const auto* seq = reinterpret_cast<const std::int32_t*>(meta + m.seq);
    const auto* seq_begin = reinterpret_cast<const std::int32_t*>(meta + m.seq_begin);
    const auto* tables = reinterpret_cast<const std::int32_t*>(meta + m.tables);
    const float eps = static_cast<float>(config.rms_norm_eps);
    const auto matmul = [&](const float* in, std::int64_t in_stride, const kernels::weight_view& w, const float* bias,
                            float* out, std::int64_t n, std::int64_t k, bool accumulate, std::int64_t count) {
      return kernels::run_matmul({.x = in, .w = w, .bias = bias, .y = out, .tokens = count, .n = n, .k = k,
                                  .x_stride = in_stride, .y_stride = n, .accumulate = accumulate,
                                  .workspace = matmul_workspace, .workspace_floats = matmul_workspace_floats},
                                 s);
    };

    EDGE_RETURN_IF_ERROR(kernels::run_embedding({.ids = ids, .table = embedding, .table_type = embedding_type, .out = x,
                                                 .tokens = tokens, .vocab = vocab, .hidden = hidden},
                                                s));
    for (std::int64_t l = 0; l < config.num_layers; ++l) {
      const layer_device& w = layers[static_cast<std::size_t>(l)];
      EDGE_RETURN_IF_ERROR(kernels::run_rmsnorm({.x = x, .weight = w.attn_norm, .out = xn, .rows = tokens, .cols = hidden,
                                                 .x_stride = hidden, .out_stride = hidden, .eps = eps},
                                                s));
      EDGE_RETURN_IF_ERROR(matmul(xn, hidden, w.wqkv, w.bqkv, qkv, qkv_dim, hidden, false, tokens));
      float* q = qkv;
      float* k = qkv + q_dim;
      float* v = qkv + q_dim + kv_dim;
      EDGE_RETURN_IF_ERROR(kernels::run_rope({.x = q, .positions = positions, .inv_freq = inv_freq, .tokens = tokens,
                                              .heads = heads, .head_dim = head_dim, .x_stride = qkv_dim,
                                              .pairs = rope_pairs},
                                             s));
      EDGE_RETURN_IF_ERROR(kernels::run_rope({.x = k, .positions = positions, .inv_freq = inv_freq, .tokens = tokens,
                                              .heads = kv_heads, .head_dim = head_dim, .x_stride = qkv_dim,
                                              .pairs = rope_pairs},
                                             s));
      EDGE_RETURN_IF_ERROR(kernels::run_kv_cache_write(
          {.k = k, .v = v, .k_cache = keys(l), .v_cache = values(l), .k_scales = key_scales(l),
           .v_scales = value_scales(l), .kv_type = kv.dtype, .slots = slots, .tokens = tokens, .num_kv_heads = kv_heads,
           .head_dim = head_dim, .block_size = kv.block_size, .num_blocks = kv.num_blocks + 1, .kv_stride = qkv_dim},
          s));
      EDGE_RETURN_IF_ERROR(kernels::run_paged_attention(
          {.q = q, .out = attn, .k_cache = keys(l), .v_cache = values(l), .k_scales = key_scales(l),
           .v_scales = value_scales(l), .kv_type = kv.dtype, .seq = seq, .pos = positions, .block_tables = tables,
           .tokens = tokens, .num_heads = heads, .num_kv_heads = kv_heads, .head_dim = head_dim,
           .block_size = kv.block_size, .num_blocks = kv.num_blocks + 1, .block_table_stride = max_table,
           .q_stride = qkv_dim, .out_stride = q_dim, .scale = 1.0f / std::sqrt(static_cast<float>(head_dim)),
           .seq_token_begin = seq_begin, .num_seqs = seqs, .max_seq_tokens = max_run,
           .workspace = attention_workspace, .workspace_floats = attention_workspace_floats},
          s));
      EDGE_RETURN_IF_ERROR(matmul(attn, q_dim, w.wo, nullptr, x, hidden, q_dim, true, tokens));
      EDGE_RETURN_IF_ERROR(kernels::run_rmsnorm({.x = x, .weight = w.ffn_norm, .out = xn, .rows = tokens, .cols = hidden,
                                                 .x_stride = hidden, .out_stride = hidden, .eps = eps},
                                                s));
      EDGE_RETURN_IF_ERROR(matmul(xn, hidden, w.w_gate_up, nullptr, gate_up, 2 * inter, hidden, false, tokens));
      EDGE_RETURN_IF_ERROR(kernels::run_silu_mul({.gate = gate_up, .up = gate_up + inter, .out = gate_up, .rows = tokens,
                                                  .cols = inter, .in_stride = 2 * inter, .out_stride = 2 * inter},
                                                 s));
      EDGE_RETURN_IF_ERROR(matmul(gate_up, 2 * inter, w.w_down, nullptr, x, hidden, inter, true, tokens));
    }
    if (rows == 0) return {};
    EDGE_RETURN_IF_ERROR(cuda_detail::gather_rows(x, hidden, last_token, rows, hidden, last, stream));
    EDGE_RETURN_IF_ERROR(kernels::run_rmsnorm({.x = last, .weight = final_norm, .out = last, .rows = rows, .cols = hidden,
                                               .x_stride = hidden, .out_stride = hidden, .eps = eps},
                                              s));
    return matmul(last, hidden, lm_head, nullptr, logits, vocab, hidden, false, rows);
  }

  // The padded batch size a decode step of `entries` runs as, or 0 when it runs eagerly.
  std::int64_t graph_size(const batch_plan& plan) const {
    if (!options.cuda_graphs) return 0;
    for (const batch_entry& e : plan.entries) {
      if (e.tokens.size() != 1 || !e.compute_logits) return 0;
    }
    const auto n = static_cast<std::int64_t>(plan.entries.size());
    std::int64_t size = 1;
    while (size < n) size *= 2;
    return std::min(size, options.max_sequences);
  }

  // Stages, uploads and runs one step; the logits rows are on the device afterwards.
  status execute(const batch_plan& plan, std::span<const kernels::sampling_row> sampling, std::int64_t& rows) {
    EDGE_RETURN_IF_ERROR(select_device());
    const auto entries = static_cast<std::int64_t>(plan.entries.size());
    if (plan.total_tokens() > options.max_batch_tokens) {
      return invalid_argument(format("batch of {} tokens exceeds max_batch_tokens {}", plan.total_tokens(),
                                     options.max_batch_tokens));
    }
    if (entries > options.max_sequences) {
      return invalid_argument(format("batch of {} sequences exceeds max_sequences {}", entries, options.max_sequences));
    }
    const std::int64_t graph_batch = graph_size(plan);
    // Padding tokens count against the buffers too.
    const std::int64_t padded = std::max(entries, std::min(graph_batch, entries + (options.max_batch_tokens - plan.total_tokens())));
    std::int64_t tokens = 0;
    std::int64_t max_run = 0;
    EDGE_ASSIGN_OR_RETURN(const meta_layout m, stage(plan, padded, sampling, tokens, rows, max_run));
    step_meta = m;
    EDGE_RETURN_IF_ERROR(cuda_check(cudaMemcpyAsync(meta, staging.data(), m.bytes, cudaMemcpyHostToDevice, stream),
                                    "metadata upload"));
    const bool use_graph = graph_batch > 0 && padded == graph_batch;
    if (use_graph) {
      if (const auto it = graphs.find(graph_batch); it != graphs.end()) {
        return cuda_check(cudaGraphLaunch(it->second.exec, stream), "cudaGraphLaunch");
      }
    }
    EDGE_RETURN_IF_ERROR(run_step(m, tokens, padded, rows, max_run));
    if (use_graph && !warmed.insert(graph_batch).second) {
      // Second step of this size: the eager runs have set every kernel attribute, so capture.
      EDGE_RETURN_IF_ERROR(capture(graph_batch, m, tokens, rows, max_run));
    }
    return {};
  }

  status capture(std::int64_t size, const meta_layout& m, std::int64_t tokens, std::int64_t rows, std::int64_t max_run) {
    EDGE_RETURN_IF_ERROR(cuda_check(cudaStreamSynchronize(stream), "synchronise before capture"));
    EDGE_RETURN_IF_ERROR(cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture"));
    const status queued = run_step(m, tokens, size, rows, max_run);
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    EDGE_RETURN_IF_ERROR(queued);
    EDGE_RETURN_IF_ERROR(cuda_check(ended, "end capture"));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    EDGE_RETURN_IF_ERROR(cuda_check(made, "cudaGraphInstantiate"));
    graphs.emplace(size, graph_exec(exec));
    return {};
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
  if (!(options.gpu_memory_utilization > 0.0 && options.gpu_memory_utilization <= 1.0)) {
    return invalid_argument(format("gpu_memory_utilization must be in (0, 1], not {}", options.gpu_memory_utilization));
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

result<std::unique_ptr<cuda_executor>> cuda_executor::create(const model& m, const cuda_executor_options& options) {
  EDGE_ASSIGN_OR_RETURN(auto s, begin(options));
  const model_config& c = m.config;
  EDGE_RETURN_IF_ERROR(s->set_dimensions(c));
  const model_weights& w = m.weights;
  if (static_cast<std::int64_t>(w.layers.size()) != c.num_layers) {
    return invalid_argument(format("model has {} layers of weights, config says {}", w.layers.size(), c.num_layers));
  }
  const auto expect = [](const auto& t, std::int64_t rows, std::int64_t cols) -> status {
    if (!t.present() || t.rows() != rows || t.cols() != cols) {
      return invalid_argument(format("tensor {} is missing or has the wrong shape (expected [{}, {}])", t.name, rows, cols));
    }
    return {};
  };
  EDGE_RETURN_IF_ERROR(expect(w.token_embedding, s->vocab, s->hidden));
  EDGE_RETURN_IF_ERROR(expect(w.lm_head, s->vocab, s->hidden));
  if (w.token_embedding.encoding != tensor_encoding::elements) {
    return invalid_argument("the token embedding must be stored as plain elements");
  }
  for (const layer_weights& l : w.layers) {
    EDGE_RETURN_IF_ERROR(expect(l.wq, s->q_dim, s->hidden));
    EDGE_RETURN_IF_ERROR(expect(l.wk, s->kv_dim, s->hidden));
    EDGE_RETURN_IF_ERROR(expect(l.wv, s->kv_dim, s->hidden));
    EDGE_RETURN_IF_ERROR(expect(l.wo, s->hidden, s->q_dim));
    EDGE_RETURN_IF_ERROR(expect(l.w_gate, s->inter, s->hidden));
    EDGE_RETURN_IF_ERROR(expect(l.w_up, s->inter, s->hidden));
    EDGE_RETURN_IF_ERROR(expect(l.w_down, s->hidden, s->inter));
    layer_device d;
    EDGE_ASSIGN_OR_RETURN(d.wqkv, s->upload_stacked({&l.wq, &l.wk, &l.wv}, "qkv"));
    EDGE_ASSIGN_OR_RETURN(d.wo, s->upload_stacked({&l.wo}, "o"));
    EDGE_ASSIGN_OR_RETURN(d.w_gate_up, s->upload_stacked({&l.w_gate, &l.w_up}, "gate_up"));
    EDGE_ASSIGN_OR_RETURN(d.w_down, s->upload_stacked({&l.w_down}, "down"));
    EDGE_ASSIGN_OR_RETURN(d.attn_norm, s->upload_floats(floats_of(l.attn_norm), "norm"));
    EDGE_ASSIGN_OR_RETURN(d.ffn_norm, s->upload_floats(floats_of(l.ffn_norm), "norm"));
    if (c.qkv_bias) {
      std::vector<float> bias = floats_of(l.bq);
      for (const tensor_view* b : {&l.bk, &l.bv}) {
        const std::vector<float> part = floats_of(*b);
        bias.insert(bias.end(), part.begin(), part.end());
      }
      EDGE_ASSIGN_OR_RETURN(d.bqkv, s->upload_floats(bias, "bias"));
    }
    s->layers.push_back(d);
  }
  EDGE_ASSIGN_OR_RETURN(s->final_norm, s->upload_floats(floats_of(w.final_norm), "norm"));

  const auto embedding_bytes = w.token_embedding.bytes();
  EDGE_ASSIGN_OR_RETURN(void* embedding, s->allocate_weight(embedding_bytes, "the token embedding"));
  EDGE_RETURN_IF_ERROR(
      cuda_check(cudaMemcpy(embedding, w.token_embedding.data, embedding_bytes, cudaMemcpyHostToDevice), "upload"));
  s->embedding = embedding;
  s->embedding_type = w.token_embedding.type;
  const bool tied = w.lm_head.data == w.token_embedding.data &&
                    w.lm_head.format == kernels::weight_format_of(w.token_embedding.type);
  if (tied) {
    s->lm_head = {.format = w.lm_head.format, .values = embedding, .scales = nullptr, .group_size = 0};
  } else {
    EDGE_ASSIGN_OR_RETURN(s->lm_head, s->upload_stacked({&w.lm_head}, "the classifier"));
  }
  EDGE_RETURN_IF_ERROR(s->allocate_buffers());
  EDGE_RETURN_IF_ERROR(s->allocate_kv());
  return std::unique_ptr<cuda_executor>(new cuda_executor(std::move(s)));
}

result<std::unique_ptr<cuda_executor>> cuda_executor::create_synthetic(const model_config& config,
                                                                       kernels::weight_format weights,
                                                                       std::uint64_t seed,
                                                                       const cuda_executor_options& options) {
  if (weights != weight_format::int4 && weights != weight_format::fp8_e4m3 && weights != weight_format::bf16) {
    return invalid_argument("synthetic CUDA models have int4, fp8 or bf16 projections");
  }
  EDGE_ASSIGN_OR_RETURN(auto s, begin(options));
  EDGE_RETURN_IF_ERROR(s->set_dimensions(config));
  // Random rows are made in slabs of this scratch before quantization.
  constexpr std::int64_t scratch_floats = std::int64_t{1} << 26;
  EDGE_ASSIGN_OR_RETURN(device_memory scratch, device_memory::allocate(scratch_floats * sizeof(float), "scratch"));
  auto* scratch_data = static_cast<float*>(scratch.data());
  std::uint64_t next_seed = seed;
  const auto matrix = [&](std::int64_t rows, std::int64_t k, std::string_view what) {
    next_seed += 0x1'0000'0000ull;
    return s->random_matrix(weights, rows, k, next_seed, scratch_data, scratch_floats, what);
  };
  const std::vector<float> ones(static_cast<std::size_t>(s->hidden), 1.0f);
  for (std::int64_t l = 0; l < config.num_layers; ++l) {
    layer_device d;
    EDGE_ASSIGN_OR_RETURN(d.wqkv, matrix(s->qkv_dim, s->hidden, "qkv"));
    EDGE_ASSIGN_OR_RETURN(d.wo, matrix(s->hidden, s->q_dim, "o"));
    EDGE_ASSIGN_OR_RETURN(d.w_gate_up, matrix(2 * s->inter, s->hidden, "gate_up"));
    EDGE_ASSIGN_OR_RETURN(d.w_down, matrix(s->hidden, s->inter, "down"));
    EDGE_ASSIGN_OR_RETURN(d.attn_norm, s->upload_floats(ones, "norm"));
    EDGE_ASSIGN_OR_RETURN(d.ffn_norm, s->upload_floats(ones, "norm"));
    s->layers.push_back(d);
  }
  EDGE_ASSIGN_OR_RETURN(s->final_norm, s->upload_floats(ones, "norm"));
  // Embedding and classifier stay 16-bit, as llm-compressor's W4A16 / W8A16 recipes leave them.
  EDGE_ASSIGN_OR_RETURN(void* embedding, s->allocate_weight(static_cast<std::size_t>(s->vocab * s->hidden) * 2, "embedding"));
  EDGE_RETURN_IF_ERROR(cuda_detail::fill_uniform(embedding, dtype::bf16, s->vocab * s->hidden, seed, -1.0f, 1.0f, s->stream));
  s->embedding = embedding;
  s->embedding_type = dtype::bf16;
  EDGE_ASSIGN_OR_RETURN(void* head, s->allocate_weight(static_cast<std::size_t>(s->vocab * s->hidden) * 2, "classifier"));
  const float bound = 1.0f / std::sqrt(static_cast<float>(s->hidden));
  EDGE_RETURN_IF_ERROR(cuda_detail::fill_uniform(head, dtype::bf16, s->vocab * s->hidden, seed + 1, -bound, bound, s->stream));
  s->lm_head = {.format = weight_format::bf16, .values = head, .scales = nullptr, .group_size = 0};
  EDGE_RETURN_IF_ERROR(cuda_check(cudaStreamSynchronize(s->stream), "synthetic weights"));
  scratch = device_memory();
  EDGE_RETURN_IF_ERROR(s->allocate_buffers());
  EDGE_RETURN_IF_ERROR(s->allocate_kv());
  return std::unique_ptr<cuda_executor>(new cuda_executor(std::move(s)));
}

status cuda_executor::forward(const batch_plan& plan, std::span<float> logits) {
  state& s = *state_;
  if (plan.total_tokens() == 0) return {};
  if (static_cast<std::int64_t>(logits.size()) != plan.logits_rows() * s.vocab) {
    return invalid_argument(format("logits buffer holds {} floats, the batch needs {}", logits.size(),
                                   plan.logits_rows() * s.vocab));
  }
  std::int64_t rows = 0;
  EDGE_RETURN_IF_ERROR(s.execute(plan, {}, rows));
  const std::size_t bytes = logits.size() * sizeof(float);  // the plan's rows; padding rows stay behind
  if (bytes > 0) {
    EDGE_RETURN_IF_ERROR(cuda_check(
        cudaMemcpyAsync(s.host_logits.data(), s.logits, bytes, cudaMemcpyDeviceToHost, s.stream), "logits download"));
  }
  EDGE_RETURN_IF_ERROR(cuda_check(cudaStreamSynchronize(s.stream), "forward"));
  if (bytes > 0) std::memcpy(logits.data(), s.host_logits.data(), bytes);
  return {};
}

status cuda_executor::forward_sample(const batch_plan& plan, std::span<const kernels::sampling_row> config,
                                     std::span<std::int32_t> out) {
  state& s = *state_;
  const std::int64_t wanted = plan.logits_rows();
  if (static_cast<std::int64_t>(config.size()) != wanted || static_cast<std::int64_t>(out.size()) != wanted) {
    return invalid_argument(format("forward_sample: {} sampling rows and {} outputs for {} logits rows", config.size(),
                                   out.size(), wanted));
  }
  if (plan.total_tokens() == 0) return {};
  std::int64_t rows = 0;
  EDGE_RETURN_IF_ERROR(s.execute(plan, config, rows));
  if (wanted > 0) {
    const auto* device_config = reinterpret_cast<const kernels::sampling_row*>(s.meta + s.step_meta.sampling);
    EDGE_RETURN_IF_ERROR(kernels::run_sampling(
        {.logits = s.logits, .config = device_config, .out = s.sampled, .rows = wanted, .vocab = s.vocab}, s.kstream()));
    EDGE_RETURN_IF_ERROR(cuda_check(cudaMemcpyAsync(s.host_sampled.data(), s.sampled, out.size() * sizeof(std::int32_t),
                                                    cudaMemcpyDeviceToHost, s.stream),
                                    "token download"));
  }
  EDGE_RETURN_IF_ERROR(cuda_check(cudaStreamSynchronize(s.stream), "forward_sample"));
  if (wanted > 0) std::memcpy(out.data(), s.host_sampled.data(), out.size() * sizeof(std::int32_t));
  return {};
}

std::int64_t cuda_executor::max_batch_tokens() const { return state_->options.max_batch_tokens; }
std::int64_t cuda_executor::max_sequences() const { return state_->options.max_sequences; }
std::int64_t cuda_executor::vocab_size() const { return state_->vocab; }
const kv_cache_layout& cuda_executor::kv_layout() const { return state_->kv; }

kv_cache_capacity cuda_executor::kv_capacity() const {
  const kv_cache_layout& kv = state_->kv;
  return kv_cache_capacity_for(state_->config, kv.dtype, kv.block_size,
                               static_cast<std::size_t>(kv.num_blocks) * kv.bytes_per_block());
}

std::string cuda_executor::describe() const {
  const state& s = *state_;
  return format("{} ({} SMs): weights {}, KV pool {}, buffers {}", s.device_name, s.multiprocessors,
                format_bytes(s.weight_bytes), format_bytes(s.kv_memory.bytes()), format_bytes(s.buffer_memory.bytes()));
}

status cuda_executor::fill_kv_random(std::uint64_t seed) {
  state& s = *state_;
  EDGE_RETURN_IF_ERROR(s.select_device());
  const auto elements = static_cast<std::int64_t>(s.kv_pool_bytes / kernels::dtype_size(s.kv.dtype));
  // Values of a typical magnitude; FP8 codes up to ±240 with scales near amax / 448.
  const bool scaled = s.kv_scale_bytes != 0;
  for (std::int64_t l = 0; l < s.config.num_layers; ++l) {
    for (int which = 0; which < 2; ++which) {
      const auto layer_seed = seed + static_cast<std::uint64_t>(l * 4 + which) * 0x1'0000'0000ull;
      EDGE_RETURN_IF_ERROR(cuda_detail::fill_uniform(s.kv_region(l, which), s.kv.dtype, elements, layer_seed,
                                                     scaled ? -240.0f : -2.0f, scaled ? 240.0f : 2.0f, s.stream));
      if (scaled) {
        EDGE_RETURN_IF_ERROR(cuda_detail::fill_uniform(s.kv_region(l, which + 2), dtype::f32,
                                                       static_cast<std::int64_t>(s.kv_scale_bytes / sizeof(float)),
                                                       layer_seed + 1, 0.002f, 0.006f, s.stream));
      }
    }
  }
  return cuda_check(cudaStreamSynchronize(s.stream), "fill_kv_random");
}

}  // namespace edge::backend
