#include "edge/backend/runtime/kv_cache.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "edge/backend/model/model.h"
#include "edge/backend/model/model_config.h"
#include "edge/common/format.h"
#include "kernels/kv_cache_write/kv_cache_write.h"

namespace edge::backend {
namespace {

// Block pools and scale arrays start on cache-line (and vector-register) boundaries.
constexpr std::size_t pool_alignment = 64;

std::size_t round_up(std::size_t value, std::size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

bool is_float_dtype(kernels::dtype type) {
  return type == kernels::dtype::f32 || type == kernels::dtype::f16 || type == kernels::dtype::bf16;
}

}  // namespace

std::size_t kv_cache_layout::bytes_per_token() const {
  const std::size_t values = value_dim > 0 ? kernels::kv_cache_row_bytes(dtype, value_dim) : 0;
  return static_cast<std::size_t>(num_layers * num_kv_heads) * (kernels::kv_cache_row_bytes(dtype, head_dim) + values);
}

kv_cache_layout kv_cache_layout::rows_of(const model_config& config) {
  kv_cache_layout layout;
  layout.num_layers = config.num_layers;
  if (config.mla) {
    layout.num_kv_heads = 1;
    layout.head_dim = config.mla->cache_row();
    layout.value_dim = config.dsa ? config.dsa->index_head_dim : 0;
  } else {
    layout.num_kv_heads = config.num_kv_heads;
    layout.head_dim = config.head_dim;
    layout.value_dim = config.head_dim;
  }
  return layout;
}

kv_cache_layout kv_cache_layout::for_budget(const model_config& config, kernels::dtype dtype, std::int64_t block_size,
                                            std::size_t budget_bytes) {
  kv_cache_layout layout = rows_of(config);
  layout.block_size = block_size;
  layout.dtype = dtype;
  const std::size_t per_block = layout.bytes_per_block();
  layout.num_blocks = per_block == 0 ? 0 : static_cast<std::int64_t>(budget_bytes / per_block);
  return layout;
}

kv_cache_layout kv_cache_layout::for_tokens(const model_config& config, kernels::dtype dtype, std::int64_t block_size,
                                            std::int64_t tokens) {
  kv_cache_layout layout = for_budget(config, dtype, block_size, 0);
  layout.num_blocks = (tokens + block_size - 1) / block_size;
  return layout;
}

kv_cache_view kv_cache_view::plan(const kv_cache_layout& layout, std::int64_t allocated_blocks, std::size_t alignment) {
  kv_cache_view v;
  v.layout = layout;
  v.allocated_blocks = allocated_blocks;
  const auto rows = static_cast<std::size_t>(allocated_blocks * layout.num_kv_heads * layout.block_size);
  const std::size_t element = kernels::dtype_size(layout.dtype);
  const bool scaled = kernels::kv_cache_scaled(layout.dtype);
  v.key_bytes = round_up(rows * static_cast<std::size_t>(layout.head_dim) * element, alignment);
  v.value_bytes = round_up(rows * static_cast<std::size_t>(layout.value_dim) * element, alignment);
  v.key_scale_bytes = scaled ? round_up(rows * sizeof(float), alignment) : 0;
  v.value_scale_bytes = scaled && layout.value_dim > 0 ? round_up(rows * sizeof(float), alignment) : 0;
  return v;
}

void* kv_cache_view::region(std::int64_t layer, int which) const {
  std::size_t offset = static_cast<std::size_t>(layer) * layer_bytes();
  switch (which) {
    case 1: offset += key_bytes; break;
    case 2: offset += key_bytes + value_bytes; break;
    case 3: offset += key_bytes + value_bytes + key_scale_bytes; break;
    default: break;
  }
  return base + offset;
}

std::size_t kv_cache_view::piece_bytes(int which) const {
  const auto rows = static_cast<std::size_t>(layout.num_kv_heads * layout.block_size);
  const std::size_t element = kernels::dtype_size(layout.dtype);
  switch (which) {
    case 0: return rows * static_cast<std::size_t>(layout.head_dim) * element;
    case 1: return rows * static_cast<std::size_t>(layout.value_dim) * element;
    case 2: return key_scale_bytes == 0 ? 0 : rows * sizeof(float);
    case 3: return value_scale_bytes == 0 ? 0 : rows * sizeof(float);
    default: return 0;
  }
}

std::size_t kv_cache_view::packed_offset(int which) const {
  std::size_t offset = 0;
  for (int w = 0; w < which; ++w) offset += piece_bytes(w) * static_cast<std::size_t>(layout.num_layers);
  return offset;
}

void pack_kv_block(const kv_cache_view& kv, std::int32_t block, std::span<std::byte> packed) {
  std::byte* out = packed.data();
  for (int which = 0; which < kv_cache_view::region_kinds; ++which) {
    const std::size_t bytes = kv.piece_bytes(which);
    if (bytes == 0) continue;
    for (std::int64_t layer = 0; layer < kv.layout.num_layers; ++layer, out += bytes) {
      std::memcpy(out, kv.piece(layer, which, block), bytes);
    }
  }
}

void unpack_kv_block(const kv_cache_view& kv, std::span<const std::byte> packed, std::int32_t block) {
  const std::byte* in = packed.data();
  for (int which = 0; which < kv_cache_view::region_kinds; ++which) {
    const std::size_t bytes = kv.piece_bytes(which);
    if (bytes == 0) continue;
    for (std::int64_t layer = 0; layer < kv.layout.num_layers; ++layer, in += bytes) {
      std::memcpy(kv.piece(layer, which, block), in, bytes);
    }
  }
}

void kv_cache::unmap::operator()(std::byte* memory) const {
  if (memory != nullptr) ::munmap(memory, bytes);
}

result<std::unique_ptr<kv_cache>> kv_cache::create(const kv_cache_layout& layout) {
  if (layout.num_blocks <= 0 || layout.block_size <= 0 || layout.num_layers <= 0 || layout.head_dim <= 0 ||
      layout.num_kv_heads <= 0) {
    return invalid_argument(format("KV cache layout has no room: {} blocks of {} tokens", layout.num_blocks,
                                   layout.block_size));
  }
  kv_cache_view view = kv_cache_view::plan(layout, layout.num_blocks, pool_alignment);
  const std::size_t total = view.total_bytes();
  // Page-aligned (beyond pool_alignment) and zeroed on first touch, so that nothing reads
  // indeterminate bytes even through a stale block table.
  void* memory = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) {
    return resource_exhausted(format("cannot allocate {} for the KV cache", format_bytes(total)));
  }
  view.base = static_cast<std::byte*>(memory);
  std::unique_ptr<kv_cache> cache(new kv_cache(view));
  cache->memory_ = std::unique_ptr<std::byte, unmap>(view.base, unmap{total});
  return cache;
}

result<std::optional<kernels::dtype>> parse_kv_cache_dtype(std::string_view name) {
  if (name == "auto") return std::optional<kernels::dtype>{};
  // Only the dtypes the cache stores; parse_dtype knows spellings ("float8_e4m3fn") too.
  if (name == "fp8" || name == "fp8_e4m3") return std::optional<kernels::dtype>{kernels::dtype::fp8_e4m3};
  if (name == "bf16") return std::optional<kernels::dtype>{kernels::dtype::bf16};
  if (name == "f16" || name == "fp16") return std::optional<kernels::dtype>{kernels::dtype::f16};
  if (name == "f32" || name == "fp32") return std::optional<kernels::dtype>{kernels::dtype::f32};
  return invalid_argument(format("unknown KV cache dtype \"{}\": expected fp8, bf16, f16, f32 or auto", name));
}

kernels::dtype auto_kv_cache_dtype(const model& m) {
  // The attention projections say what the checkpoint was trained and stored in; the token
  // embedding is the fallback when they are quantized (it usually is not).
  std::vector<std::optional<kernels::dtype>> candidates;
  if (!m.weights.layers.empty()) {
    for (const weight_matrix* w : {&m.weights.layers.front().wq, &m.weights.layers.front().wk}) {
      if (w->present()) candidates.push_back(kernels::element_dtype(w->format));  // nullopt for int4
    }
  }
  if (m.weights.token_embedding.present()) candidates.push_back(m.weights.token_embedding.type);
  for (const auto& type : candidates) {
    if (type && is_float_dtype(*type)) return *type;
  }
  return kernels::dtype::bf16;
}

kernels::dtype resolve_kv_cache_dtype(std::optional<kernels::dtype> requested, const model& m) {
  return requested ? *requested : auto_kv_cache_dtype(m);
}

kv_cache_capacity kv_cache_capacity_for(const model_config& config, kernels::dtype dtype, std::int64_t block_size,
                                        std::size_t budget_bytes) {
  const kv_cache_layout layout = kv_cache_layout::for_budget(config, dtype, block_size, budget_bytes);
  const kv_cache_layout bf16 = kv_cache_layout::for_budget(config, kernels::dtype::bf16, block_size, budget_bytes);
  kv_cache_capacity c;
  c.dtype = dtype;
  c.block_size = block_size;
  c.num_blocks = layout.num_blocks;
  c.tokens = layout.capacity_tokens();
  c.budget_bytes = budget_bytes;
  c.used_bytes = static_cast<std::size_t>(layout.num_blocks) * layout.bytes_per_block();
  c.bytes_per_token = layout.bytes_per_token();
  c.bf16_tokens = bf16.capacity_tokens();
  c.ratio_to_bf16 = c.bytes_per_token == 0 ? 0.0
                                           : static_cast<double>(bf16.bytes_per_token()) /
                                                 static_cast<double>(c.bytes_per_token);
  return c;
}

std::string format_kv_cache_capacity(const kv_cache_capacity& c) {
  return format("KV cache: {}, {} blocks × {} tokens = {} tokens, {:.2f}× bf16 ({} tokens) in {}",
                kernels::to_string(c.dtype), c.num_blocks, c.block_size, c.tokens, c.ratio_to_bf16, c.bf16_tokens,
                format_bytes(c.budget_bytes));
}

}  // namespace edge::backend
