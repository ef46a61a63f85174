// load_options::cpu_tiles: a model's INT4 / INT8 matrices in CPU row tiles give the CPU forward
// pass the logits (and expert choices) of the row layout, within the rounding of another
// summation order, stacked parts and per-head views included; what the tiles cannot hold stays
// in rows; writers refuse tiled models.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "edge/backend/model/model.h"
#include "edge/backend/model/quantized_checkpoint.h"
#include "forward_test_support.h"
#include "kernels/cpu/isa.h"
#include "kernels/quantize/quantize.h"
#include "synthetic_test_support.h"
#include "test_support.h"

namespace {

using edge::backend::load_model;
using edge::backend::weight_matrix;
using edge::kernels::weight_format;
using edge::kernels::weight_layout;

// Whether this process tiles a format (the layouts are for the AVX-512 kernels, the integer one
// for AVX-512 VNNI over int8 activations).
bool tiles_here(weight_format format) {
  if (format == weight_format::int4 || format == weight_format::int8) {
    return edge::kernels::cpu::active_isa() >= edge::kernels::cpu::isa::avx512_vnni &&
           edge::kernels::cpu::quantized_activations();
  }
  return edge::kernels::cpu::active_isa() >= edge::kernels::cpu::isa::avx512;
}

// A matrix's values, decoded exactly (either layout).
std::vector<float> decoded(const weight_matrix& w) {
  std::vector<float> out(static_cast<std::size_t>(w.elements()));  // [rows, cols]
  REQUIRE(edge::kernels::run_dequantize(
              {.w = w.view(), .k = w.cols(), .row_begin = 0, .rows = w.rows(), .y = out.data(), .y_stride = w.cols()}, {})
              .ok());
  return out;
}

std::unique_ptr<edge::backend::model> load(const std::filesystem::path& path, std::optional<weight_format> format,
                                           bool tiles) {
  auto loaded = load_model({.path = path, .weight_dtype = format, .int4_group_size = 32, .cpu_tiles = tiles});
  REQUIRE_MESSAGE(loaded.ok(), loaded.error().to_string());
  return std::move(loaded).value();
}

void check_same_run(const edge::backend::model& rows, const edge::backend::model& tiles) {
  const std::vector<edge::backend::token_id> tokens = {1, 17, 300, 42, 5, 99, 411, 7, 250, 3};
  const edge::testing::forced_run a = edge::testing::force(rows, tokens);
  const edge::testing::forced_run b = edge::testing::force(tiles, tokens);
  REQUIRE(a.logits.size() == b.logits.size());
  for (std::size_t i = 0; i < a.logits.size(); ++i) {
    CAPTURE(i);
    float scale = 0.0f, difference = 0.0f;
    for (std::size_t v = 0; v < a.logits[i].size(); ++v) {
      scale = std::max(scale, std::fabs(a.logits[i][v]));
      difference = std::max(difference, std::fabs(a.logits[i][v] - b.logits[i][v]));
    }
    CAPTURE(difference);
    REQUIRE(difference <= 1e-4f * scale);
  }
  CHECK(a.choices == b.choices);
}

}  // namespace

TEST_CASE("CPU row tiles: the same logits and expert choices as rows, stacked parts re-pointed") {
  edge::testing::temp_dir dir;
  for (const std::string preset : {"tiny", "tiny-qwen3-moe", "tiny-glm4-moe"}) {
    const auto path = edge::testing::make_synthetic(dir / preset, preset, edge::backend::synthetic_format::safetensors, 3);
    for (const weight_format format : {weight_format::int4, weight_format::int8, weight_format::fp8_e4m3}) {
      CAPTURE(preset);
      CAPTURE(edge::kernels::to_string(format));
      const auto rows = load(path, format, false);
      const auto tiles = load(path, format, true);
      const auto& l = tiles->weights.layers[0];
      if (tiles_here(format)) {
        // Q, K and V were stacked on conversion: the stack and its parts are tiles now.
        REQUIRE(l.wqkv.present());
        CHECK(l.wqkv.layout == weight_layout::cpu_tiles);
        for (const weight_matrix* part : {&l.wq, &l.wk, &l.wv}) CHECK(part->layout == weight_layout::cpu_tiles);
        // Every part still reads as the rows model's part: the same numbers element by element.
        const auto& r = rows->weights.layers[0];
        CHECK(decoded(l.wk) == decoded(r.wk));
        // The down projection's rows are 176 wide: INT4 groups of 16, which the tiles do not hold.
        if (format == weight_format::int4 && preset == "tiny") CHECK(l.w_down.layout == weight_layout::rows);
      } else {
        CHECK(l.wq.layout == weight_layout::rows);
      }
      check_same_run(*rows, *tiles);
    }
  }
}

TEST_CASE("CPU row tiles: bf16 weights used in place from the file are copied into tiles") {
  edge::testing::temp_dir dir;
  for (const std::string preset : {"tiny", "tiny-qwen2"}) {
    CAPTURE(preset);
    const auto path = edge::testing::make_synthetic(dir / preset, preset, edge::backend::synthetic_format::safetensors, 3);
    const auto rows = load(path, std::nullopt, false);
    const auto tiles = load(path, std::nullopt, true);
    const auto& l = tiles->weights.layers[1];
    CHECK(l.wo.format == weight_format::bf16);
    if (tiles_here(weight_format::bf16)) {
      for (const weight_matrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
        CHECK(m->layout == weight_layout::cpu_tiles);
      }
      // tiny-qwen2's classifier is tied: it is the embedding table, which lookups read in rows.
      CHECK(tiles->weights.lm_head.layout ==
            (preset == "tiny-qwen2" ? weight_layout::rows : weight_layout::cpu_tiles));
    }
    check_same_run(*rows, *tiles);
  }
}

TEST_CASE("CPU row tiles: latent attention's per-head views of kv_b_proj") {
  edge::testing::temp_dir dir;
  const auto path =
      edge::testing::make_synthetic(dir / "deepseek", "deepseek-v3-tiny", edge::backend::synthetic_format::safetensors, 5);
  for (const weight_format format : {weight_format::int4, weight_format::int8}) {
    CAPTURE(edge::kernels::to_string(format));
    const auto rows = load(path, format, false);
    const auto tiles = load(path, format, true);
    if (tiles_here(format)) {
      // kv_lora_rank 32: kv_b_proj [4 × (16 + 16), 32], viewed per head at multiples of 16 rows.
      CHECK(tiles->weights.layers[0].wkv_b.layout == weight_layout::cpu_tiles);
    }
    check_same_run(*rows, *tiles);
  }
}

TEST_CASE("a model in CPU row tiles is not written as a checkpoint") {
  if (!tiles_here(weight_format::int4)) return;
  edge::testing::temp_dir dir;
  const auto path = edge::testing::make_synthetic(dir / "tiny", "tiny", edge::backend::synthetic_format::safetensors, 3);
  const auto tiles = load(path, weight_format::int4, true);
  const auto written = edge::backend::write_quantized_checkpoint(
      *tiles, {.source = {.path = path}, .out = dir / "out"});
  REQUIRE_FALSE(written.ok());
  CHECK(written.error().code() == edge::status_code::failed_precondition);
}
