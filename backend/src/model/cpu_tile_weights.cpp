#include "cpu_tile_weights.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <vector>

#include "edge/backend/io/mapped_file.h"
#include "kernels/matmul/cpu_tiles.h"

namespace edge::backend {
namespace {

using kernels::cpu_tiles;

// Whole cache lines: the kernels' 64-byte loads then never straddle two.
constexpr std::size_t tile_alignment = 64;

std::shared_ptr<std::byte[]> allocate_aligned(std::size_t bytes) {
  auto* data = static_cast<std::byte*>(::operator new[](std::max<std::size_t>(bytes, 1), std::align_val_t{tile_alignment}));
  return {data, [](std::byte* p) { ::operator delete[](p, std::align_val_t{tile_alignment}); }};
}

class tiler {
 public:
  tiler(model& m, thread_pool* pool, const cpu_tile_formats& formats) : m_(m), pool_(pool), formats_(formats) {}

  // Tiles `whole` and re-points `parts` (absent ones skipped), views of its rows, at their tiles.
  // Leaves everything as it was where the tiles do not hold the matrix or a part does not start
  // at a whole tile.
  void tile(weight_matrix& whole, std::span<weight_matrix* const> parts = {}) {
    if (!whole.present() || whole.layout != kernels::weight_layout::rows ||
        !cpu_tiles::takes(whole.format, whole.group_size) || whole.rows() <= 0 ||
        !wanted(whole.format)) {
      return;
    }
    const std::int64_t cols = whole.cols();
    const std::int64_t row_bytes = kernels::weight_values_bytes(whole.format, 1, cols);
    std::vector<std::int64_t> first_rows;
    for (const weight_matrix* part : parts) {
      if (!part->present()) {
        first_rows.push_back(-1);
        continue;
      }
      const std::int64_t offset = part->data - whole.data;
      if (offset < 0 || offset % row_bytes != 0 || offset / row_bytes % cpu_tiles::rows != 0) return;
      first_rows.push_back(offset / row_bytes);
    }
    const auto values_bytes = static_cast<std::size_t>(cpu_tiles::values_bytes(whole.format, whole.rows(), cols));
    const auto scale_count =
        static_cast<std::size_t>(cpu_tiles::scale_count(whole.format, whole.rows(), cols, whole.group_size));
    std::shared_ptr<std::byte[]> values = allocate_aligned(values_bytes);
    std::shared_ptr<std::byte[]> scales;  // none for f16 and bf16
    if (scale_count > 0) scales = allocate_aligned(scale_count * sizeof(float));
    auto* tiled_scales = reinterpret_cast<float*>(scales.get());
    if (!kernels::pack_cpu_tiles(whole.view(), whole.rows(), cols, values.get(), tiled_scales, pool_).ok()) return;

    const weight_matrix before = whole;
    whole.data = values.get();
    whole.scales = tiled_scales;
    whole.layout = kernels::weight_layout::cpu_tiles;
    m_.weights.storage.push_back(std::move(values));
    if (scales) m_.weights.storage.push_back(std::move(scales));
    for (std::size_t i = 0; i < parts.size(); ++i) {
      if (first_rows[i] < 0) continue;
      const kernels::weight_view view = kernels::weight_rows_from(whole.view(), first_rows[i], cols);
      parts[i]->data = static_cast<const std::byte*>(view.values);
      parts[i]->scales = view.scales;
      parts[i]->layout = kernels::weight_layout::cpu_tiles;
    }
    release(before.data, static_cast<std::size_t>(kernels::weight_values_bytes(before.format, before.rows(), cols)));
    if (before.scales != nullptr) {
      release(reinterpret_cast<const std::byte*>(before.scales),
              static_cast<std::size_t>(kernels::weight_scale_count(before.format, before.rows(), cols, before.group_size)) *
                  sizeof(float));
    }
    ++done_.matrices;
    done_.bytes += whole.bytes();
  }

  tiled_weights done() const { return done_; }

 private:
  bool wanted(kernels::weight_format format) const {
    if (cpu_tiles::integer(format)) return formats_.integer;
    return format == kernels::weight_format::fp8_e4m3 ? formats_.fp8 : formats_.floats;
  }

  // Frees a buffer of the model's own that began at `data` (nothing else points into it: a
  // stacked matrix's buffer is its parts', re-pointed above), or lets the pages of a file
  // mapping go.
  void release(const std::byte* data, std::size_t bytes) {
    auto& storage = m_.weights.storage;
    const auto owned = std::find_if(storage.begin(), storage.end(), [&](const auto& b) { return b.get() == data; });
    if (owned != storage.end()) {
      storage.erase(owned);
      return;
    }
    for (const auto& f : m_.files) {
      const auto mapped = f->bytes();
      if (data >= mapped.data() && data + bytes <= mapped.data() + mapped.size()) {
        f->release(static_cast<std::size_t>(data - mapped.data()), bytes);
      }
    }
  }

  model& m_;
  thread_pool* pool_;
  cpu_tile_formats formats_;
  tiled_weights done_;
};

}  // namespace

tiled_weights tile_weights_for_cpu(model& m, thread_pool* pool, const cpu_tile_formats& formats) {
  tiler t(m, pool, formats);
  const std::optional<mla_config>& mla = m.config.mla;
  // The latent attention's per-head views (forward.cpp): w_uk_t's at multiples of kv_lora_rank,
  // wkv_b's V rows at h · (nope + v) + nope.
  const bool head_views_whole = !mla || (mla->kv_lora_rank % cpu_tiles::rows == 0 &&
                                         mla->qk_nope_head_dim % cpu_tiles::rows == 0 &&
                                         mla->v_head_dim % cpu_tiles::rows == 0);
  for (layer_weights& l : m.weights.layers) {
    if (l.wqkv.present()) {
      weight_matrix* const parts[] = {&l.wq, &l.wk, &l.wv};
      t.tile(l.wqkv, parts);
    } else {
      for (weight_matrix* w : {&l.wq, &l.wk, &l.wv}) t.tile(*w);
    }
    if (l.w_gate_up.present()) {
      weight_matrix* const parts[] = {&l.w_gate, &l.w_up};
      t.tile(l.w_gate_up, parts);
    } else {
      for (weight_matrix* w : {&l.w_gate, &l.w_up}) t.tile(*w);
    }
    for (weight_matrix* w : {&l.wo, &l.w_down, &l.wq_b, &l.index_wq, &l.index_wk}) t.tile(*w);
    if (head_views_whole) {
      t.tile(l.wkv_b);
      t.tile(l.w_uk_t);
    }
    for (expert_weights& e : l.experts) {
      if (e.w_gate_up.present()) {
        weight_matrix* const parts[] = {&e.w_gate, &e.w_up};
        t.tile(e.w_gate_up, parts);
      } else {
        t.tile(e.w_gate);
        t.tile(e.w_up);
      }
      t.tile(e.w_down);
    }
  }
  // A classifier tied to the embedding table is that table: its lookups read rows.
  if (m.weights.lm_head.data != m.weights.token_embedding.data) t.tile(m.weights.lm_head);
  return t.done();
}

}  // namespace edge::backend
