// The paged KV cache memory: for every layer, a K pool and a V pool of fixed-size blocks, each
// block holding block_size token slots for all KV heads. Which blocks are in use is
// kv_block_pool's business.
//
//   K of layer l:                     [num_blocks, num_kv_heads, block_size, head_dim] of dtype
//   V of layer l:                     [num_blocks, num_kv_heads, block_size, value_dim] of dtype
//   K and V scales of layer l (fp8):  [num_blocks, num_kv_heads, block_size] of f32
//
// Grouped-query attention stores K and V alike (value_dim = head_dim). A latent attention layer
// (MLA) stores one row per token in K: its latent and its rotated key (num_kv_heads 1, head_dim
// kv_lora_rank + qk_rope_head_dim), and in V the DSA indexer's key (value_dim index_head_dim),
// or nothing (value_dim 0).
//
// An fp8_e4m3 cache stores each (token, kv head) row of K and of V with its own f32 scale
// (kernels/kv_cache_write/kv_cache_write.h has the rule); the scales are part of the cache's
// memory and of its byte budget. A sequence owns a block table (its blocks in position order);
// position p lives in block table[p / block_size] at offset p % block_size. Owned by the engine
// thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "edge/common/status.h"
#include "edge/kernels/dtype.h"

namespace edge::backend {

struct model_config;
struct model;

struct kv_cache_layout {
  std::int64_t num_layers = 0;
  std::int64_t num_kv_heads = 0;
  std::int64_t head_dim = 0;   // a K row
  std::int64_t value_dim = 0;  // a V row (0: no V pool)
  std::int64_t block_size = 16;
  std::int64_t num_blocks = 0;
  kernels::dtype dtype = kernels::dtype::f32;

  // K and V of one token in every layer, their scales included.
  std::size_t bytes_per_token() const;
  // The rows a model's layers cache (num_layers, num_kv_heads, head_dim, value_dim), no blocks yet.
  static kv_cache_layout rows_of(const model_config& config);
  bool same_rows(const kv_cache_layout& other) const {
    return num_layers == other.num_layers && num_kv_heads == other.num_kv_heads && head_dim == other.head_dim &&
           value_dim == other.value_dim;
  }
  std::size_t bytes_per_block() const { return bytes_per_token() * static_cast<std::size_t>(block_size); }
  std::int64_t capacity_tokens() const { return num_blocks * block_size; }

  // The layout for a model: as many whole blocks as fit in `budget_bytes`.
  static kv_cache_layout for_budget(const model_config& config, kernels::dtype dtype, std::int64_t block_size,
                                    std::size_t budget_bytes);
  // The layout for a model with room for `tokens` token slots (rounded up to whole blocks).
  static kv_cache_layout for_tokens(const model_config& config, kernels::dtype dtype, std::int64_t block_size,
                                    std::int64_t tokens);
};

// Where every layer's K pool, V pool, K scales and V scales lie in one allocation (in that order,
// layer after layer, each region rounded up to an alignment), wherever the allocation is: host
// memory (kv_cache) or the device (the CUDA executor). What the forward pass reads and writes.
struct kv_cache_view {
  std::byte* base = nullptr;
  kv_cache_layout layout;              // the blocks a kv_block_pool may hand out
  std::int64_t allocated_blocks = 0;   // blocks in the allocation, >= layout.num_blocks (a
                                       // padding block past the pool's, on CUDA)
  std::size_t key_bytes = 0;           // one layer's K pool
  std::size_t value_bytes = 0;         // one layer's V pool (0 without one)
  std::size_t key_scale_bytes = 0;     // one layer's K scales; 0 for unscaled dtypes
  std::size_t value_scale_bytes = 0;   // one layer's V scales; 0 for unscaled dtypes or without a V pool

  // The regions of `layout` with room for `allocated_blocks`, at no address yet.
  static kv_cache_view plan(const kv_cache_layout& layout, std::int64_t allocated_blocks, std::size_t alignment);
  std::size_t layer_bytes() const { return key_bytes + value_bytes + key_scale_bytes + value_scale_bytes; }
  std::size_t total_bytes() const { return layer_bytes() * static_cast<std::size_t>(layout.num_layers); }

  void* keys(std::int64_t layer) const { return region(layer, 0); }
  // Null without a V pool.
  void* values(std::int64_t layer) const { return value_bytes == 0 ? nullptr : region(layer, 1); }
  // Null unless kernels::kv_cache_scaled(layout.dtype) (and, for V, there is a V pool).
  float* key_scales(std::int64_t layer) const {
    return key_scale_bytes == 0 ? nullptr : static_cast<float*>(region(layer, 2));
  }
  float* value_scales(std::int64_t layer) const {
    return value_scale_bytes == 0 ? nullptr : static_cast<float*>(region(layer, 3));
  }

  // A block outside the cache (a host tier slot, a disk file) is packed region kind by region
  // kind, each layer after layer: every layer's K rows of the block, then every layer's V rows,
  // then the K scales, then the V scales; layout.bytes_per_block() in all. Each piece is one
  // contiguous run in the cache (a block's rows of one layer's region), so a device copies a
  // region kind as one strided (2D) copy: width piece_bytes(which), pitch layer_bytes().
  static constexpr int region_kinds = 4;  // K pool, V pool, K scales, V scales
  // One block's bytes in one layer's region `which` (0 K, 1 V, 2 K scales, 3 V scales); 0 when
  // the cache has no such region.
  std::size_t piece_bytes(int which) const;
  // Where that piece of `block` lies in the cache.
  std::byte* piece(std::int64_t layer, int which, std::int32_t block) const {
    return static_cast<std::byte*>(region(layer, which)) + static_cast<std::size_t>(block) * piece_bytes(which);
  }
  // Where region kind `which` starts in a packed block.
  std::size_t packed_offset(int which) const;

 private:
  // 0 K pool, 1 V pool, 2 K scales, 3 V scales.
  void* region(std::int64_t layer, int which) const;
};

// Copies between a cache in host memory (kv_cache, the CPU executor's) and a packed block
// (kv_cache_view's packing); `packed` holds layout.bytes_per_block() bytes.
void pack_kv_block(const kv_cache_view& kv, std::int32_t block, std::span<std::byte> packed);
void unpack_kv_block(const kv_cache_view& kv, std::span<const std::byte> packed, std::int32_t block);

class kv_cache {
 public:
  // resource_exhausted when the memory cannot be allocated; invalid_argument for an empty layout.
  static result<std::unique_ptr<kv_cache>> create(const kv_cache_layout& layout);

  const kv_cache_layout& layout() const { return view_.layout; }
  const kv_cache_view& view() const { return view_; }

  void* keys(std::int64_t layer) { return view_.keys(layer); }
  void* values(std::int64_t layer) { return view_.values(layer); }
  // Null unless kernels::kv_cache_scaled(layout().dtype).
  float* key_scales(std::int64_t layer) { return view_.key_scales(layer); }
  float* value_scales(std::int64_t layer) { return view_.value_scales(layer); }

 private:
  explicit kv_cache(const kv_cache_view& view) : view_(view) {}

  kv_cache_view view_;
  // An anonymous mapping: the kernel hands out zeroed pages when they are first touched, so a
  // large cache costs nothing at start-up and nothing reads indeterminate bytes.
  struct unmap {
    std::size_t bytes;  // the mapping's length (no default initializer: GCC would not see the type as
                        // default-constructible inside the enclosing class)
    void operator()(std::byte* memory) const;
  };
  std::unique_ptr<std::byte, unmap> memory_;
};

// ---- KV dtype choice --------------------------------------------------------------------

// A --kv-cache-dtype value: "fp8" (E4M3; also "fp8_e4m3"), "bf16", "f16", "f32" (also
// "fp16", "fp32"), or "auto" (nullopt). invalid_argument for anything else.
result<std::optional<kernels::dtype>> parse_kv_cache_dtype(std::string_view name);

// What "auto" means, as vLLM's auto does: the model's own dtype, i.e. that of its
// floating-point weights (f32, f16 or bf16; bf16 when every weight is quantized). Never fp8:
// an FP8 cache trades accuracy for capacity, which the user chooses.
kernels::dtype auto_kv_cache_dtype(const model& m);

// `requested`, or auto_kv_cache_dtype(m) when it is nullopt.
kernels::dtype resolve_kv_cache_dtype(std::optional<kernels::dtype> requested, const model& m);

// ---- capacity ----------------------------------------------------------------------------

// What a KV budget holds, for the start-up log and the metrics. For the engine: log
// format_kv_cache_capacity(capacity) once at start; export `tokens` as
// edgeinfer_kv_cache_capacity_tokens, `num_blocks` as edgeinfer_kv_cache_blocks, and
// cache_config_info{kv_dtype = kernels::to_string(dtype), block_size = block_size}. The layout
// to allocate is kv_cache_layout::for_budget with the same arguments (its num_blocks is this
// num_blocks).
struct kv_cache_capacity {
  kernels::dtype dtype = kernels::dtype::f32;
  std::int64_t block_size = 0;
  std::int64_t num_blocks = 0;
  std::int64_t tokens = 0;         // num_blocks × block_size
  std::size_t budget_bytes = 0;    // the budget asked for
  std::size_t used_bytes = 0;      // what the whole blocks take (≤ budget_bytes)
  std::size_t bytes_per_token = 0; // K and V of one token in every layer, scales included
  std::int64_t bf16_tokens = 0;    // what a bf16 cache holds in the same budget
  // Tokens per byte relative to a bf16 cache (bf16 bytes per token ÷ this dtype's): 0.5 for
  // f32, 1 for f16, and for fp8 under 2 because of the scales: 1.94 at head_dim 128, 1.88 at
  // 64, 1.33 at 8.
  double ratio_to_bf16 = 0.0;
};

kv_cache_capacity kv_cache_capacity_for(const model_config& config, kernels::dtype dtype, std::int64_t block_size,
                                        std::size_t budget_bytes);

// "KV cache: fp8_e4m3, 1234 blocks × 16 tokens = 19744 tokens, 1.94× bf16 (10176 tokens) in 2 GiB"
std::string format_kv_cache_capacity(const kv_cache_capacity& capacity);

}  // namespace edge::backend
