// GGUF K-quant files, as llama.cpp's Q4_K_M lays them out (most matrices Q4_K, the value
// projections and the classifier Q6_K, here one Q5_K too, rows that are not whole super-blocks
// left in F32): written with the project's GGUF writer from blocks built in the test, loaded
// with their matrices used in place at their own bytes per weight, decoded exactly where
// something else is asked (the embedding table, --weight-dtype, quantize's checkpoint), and the
// model runs: its logits are those of its weights decoded to f32, within the activations' int8
// rounding.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>

#include "edge/backend/engine/generator.h"
#include "edge/backend/model/model.h"
#include "edge/backend/model/quantized_checkpoint.h"
#include "edge/backend/model/synthetic.h"
#include "edge/backend/runtime/cpu_executor.h"
#include "edge/common/thread_pool.h"
#include "forward_test_support.h"
#include "kernels/cpu/isa.h"
#include "kquant_gguf.h"
#include "test_support.h"
#include "weight_test_support.h"

namespace {

using namespace edge::backend;
using edge::kernels::weight_format;
using edge::testing::kquant_matrix;
using edge::testing::q4_k_m_mix;

// tiny-hd128 (hidden 256, heads of 128) in F32, seeded.
std::filesystem::path write_f32_model(const std::filesystem::path& dir) {
  synthetic_options options;
  options.preset = "tiny-hd128";
  options.format = synthetic_format::gguf;
  options.dtype = edge::kernels::dtype::f32;
  options.seed = 21;
  options.out = dir / "f32.gguf";
  const auto written = write_synthetic_model(options);
  REQUIRE_MESSAGE(written.ok(), written.error().message());
  return options.out;
}

// `in` rewritten with K-quant matrices (kquant_gguf.h); what each re-encoded tensor holds.
std::map<std::string, kquant_matrix> write_kquant_gguf(const std::filesystem::path& in, const std::filesystem::path& out,
                                                       const edge::testing::kquant_choice& choose,
                                                       const std::vector<std::string>& drop = {}) {
  auto encoded = edge::testing::write_kquant_gguf(in, out, choose, drop);
  REQUIRE_MESSAGE(encoded.ok(), encoded.error().message());
  return std::move(encoded).value();
}

std::unique_ptr<model> load_as(const std::filesystem::path& path, std::optional<weight_format> weights = std::nullopt) {
  auto loaded = load_model({.path = path, .weight_dtype = weights});
  REQUIRE_MESSAGE(loaded.ok(), loaded.error().to_string());
  return std::move(loaded).value();
}

// w holds exactly the values of `source`.
void check_values(const weight_matrix& w, const kquant_matrix& source) {
  CAPTURE(w.name);
  REQUIRE(w.elements() == static_cast<std::int64_t>(source.values.size()));
  for (std::int64_t i = 0; i < w.elements(); ++i) {
    if (edge::testing::element(w, i) != source.values[static_cast<std::size_t>(i)]) {
      CAPTURE(i);
      CHECK(edge::testing::element(w, i) == source.values[static_cast<std::size_t>(i)]);
      return;
    }
  }
}

// t holds the values of `source` rounded once to f16.
void check_f16_values(const tensor_view& t, const kquant_matrix& source) {
  CAPTURE(t.name);
  REQUIRE(t.type == edge::kernels::dtype::f16);
  for (std::int64_t i = 0; i < t.elements(); ++i) {
    const float want = edge::kernels::fp16_to_float(edge::kernels::float_to_fp16(source.values[static_cast<std::size_t>(i)]));
    if (edge::testing::element(t, i) != want) {
      CAPTURE(i);
      CHECK(edge::testing::element(t, i) == want);
      return;
    }
  }
}

std::vector<token_id> some_text(const model& m) {
  return m.tok->encode("Once upon a time there was a little model that ran at its own bytes per weight.", {});
}

// The logits of a K-quant model against those of the same weights decoded to f32: only the
// activations' rounding to int8 per block of 32 (a relative step of 1/127 of each block's
// largest value) separates them. Measured at about 1% of the largest logit here; 3% allowed.
constexpr float activation_rounding_tolerance = 0.03f;

}  // namespace

TEST_CASE("GGUF Q4_K_M-like mix: K-quant matrices used in place at their own bytes, exactly the blocks' values") {
  edge::testing::temp_dir dir;
  const auto f32 = write_f32_model(dir.path());
  const auto path = dir / "q4_k_m.gguf";
  const auto encoded = write_kquant_gguf(f32, path, q4_k_m_mix);
  const auto m = load_as(path);
  const model_weights& w = m->weights;
  for (std::size_t i = 0; i < w.layers.size(); ++i) {
    const layer_weights& l = w.layers[i];
    const std::string blk = "blk." + std::to_string(i) + ".";
    CHECK(l.wq.format == weight_format::q4_k);
    CHECK(l.wk.format == (i == 1 ? weight_format::q5_k : weight_format::q4_k));
    CHECK(l.wv.format == weight_format::q6_k);
    CHECK(l.wo.format == weight_format::q4_k);
    CHECK(l.w_gate.format == weight_format::q4_k);
    CHECK(l.w_up.format == weight_format::q4_k);
    CHECK(l.w_down.format == weight_format::f32);  // 688 columns: not whole super-blocks
    // Used in place: nothing was stacked into a buffer of the model's, nothing has scales.
    CHECK_FALSE(l.wqkv.present());
    CHECK_FALSE(l.w_gate_up.present());
    CHECK(l.wq.scales == nullptr);
    CHECK(l.wq.bytes() == static_cast<std::uint64_t>(l.wq.rows() * (l.wq.cols() / 256) * 144));
    CHECK(l.wv.bytes() == static_cast<std::uint64_t>(l.wv.rows() * (l.wv.cols() / 256) * 210));
    check_values(l.wq, encoded.at(blk + "attn_q.weight"));
    check_values(l.wk, encoded.at(blk + "attn_k.weight"));
    check_values(l.wv, encoded.at(blk + "attn_v.weight"));
    check_values(l.w_up, encoded.at(blk + "ffn_up.weight"));
  }
  CHECK(w.lm_head.format == weight_format::q6_k);
  check_values(w.lm_head, encoded.at("output.weight"));
  // The embedding table is read by rows of elements: decoded exactly, rounded once to f16.
  check_f16_values(w.token_embedding, encoded.at("token_embd.weight"));
  CHECK(projection_format(w) == weight_format::q4_k);
}

TEST_CASE("GGUF K-quants run: the logits of the same weights decoded to f32 within the activations' rounding") {
  edge::testing::temp_dir dir;
  const auto f32 = write_f32_model(dir.path());
  const auto path = dir / "q4_k_m.gguf";
  write_kquant_gguf(f32, path, q4_k_m_mix);
  const auto native = load_as(path);
  const auto decoded = load_as(path, weight_format::f32);
  CHECK(decoded->weights.layers[0].wq.format == weight_format::f32);
  CHECK(decoded->weights.lm_head.format == weight_format::f32);
  const auto text = some_text(*native);
  REQUIRE(text.size() >= 8);
  const auto a = edge::testing::force(*native, text);
  const auto b = edge::testing::force(*decoded, text);
  const float difference = edge::testing::logit_difference(a, b);
  CAPTURE(difference);
  CHECK(difference <= activation_rounding_tolerance);
  if (edge::kernels::cpu::quantized_activations()) CHECK(difference > 0.0f);  // the activations really were rounded

  // It generates, greedily and repeatably, through the serving engine's own loop.
  auto cache = kv_cache::create(kv_cache_layout::for_tokens(native->config, edge::kernels::dtype::f32, 16, 1024));
  REQUIRE(cache.ok());
  kv_block_pool blocks((*cache)->layout().num_blocks);
  edge::thread_pool pool(1);
  auto exec = cpu_executor::create(*native, **cache, &pool, {.max_batch_tokens = 256, .max_sequences = 4});
  REQUIRE(exec.ok());
  generate_request request;
  request.prompt = text;
  request.max_tokens = 16;
  request.sampling.temperature = 0.0f;
  request.ignore_eos = true;
  generator gen(*native, **exec, blocks);
  const std::vector<generate_request> twice{request, request};
  const auto out = gen.run(twice);
  REQUIRE_MESSAGE(out.ok(), out.error().message());
  CHECK((*out)[0].tokens.size() == 16);
  CHECK((*out)[0].tokens == (*out)[1].tokens);
}

TEST_CASE("GGUF K-quants with a tied Q6_K embedding: the classifier reads the file's blocks, the table is f16") {
  edge::testing::temp_dir dir;
  const auto f32 = write_f32_model(dir.path());
  const auto path = dir / "tied.gguf";
  // As llama.cpp quantizes a tied model: the embedding takes the classifier's type.
  const auto encoded = write_kquant_gguf(
      f32, path,
      [](const std::string& name) -> std::optional<weight_format> {
        return name == "token_embd.weight" ? weight_format::q6_k : q4_k_m_mix(name);
      },
      {"output.weight"});
  const auto m = load_as(path);
  REQUIRE(m->config.tie_embeddings);
  CHECK(m->weights.lm_head.format == weight_format::q6_k);
  check_values(m->weights.lm_head, encoded.at("token_embd.weight"));
  check_f16_values(m->weights.token_embedding, encoded.at("token_embd.weight"));

  const auto decoded = load_as(path, weight_format::f32);
  const auto text = some_text(*m);
  CHECK(edge::testing::logit_difference(edge::testing::force(*m, text), edge::testing::force(*decoded, text)) <=
        activation_rounding_tolerance);
  // Asked for bf16, the classifier and the table are one buffer again.
  const auto bf16 = load_as(path, weight_format::bf16);
  CHECK(bf16->weights.lm_head.format == weight_format::bf16);
  CHECK(static_cast<const void*>(bf16->weights.lm_head.data) == static_cast<const void*>(bf16->weights.token_embedding.data));
}

TEST_CASE("GGUF K-quants asked for int4: the projections quantized from the exact values, the classifier kept; quantize") {
  edge::testing::temp_dir dir;
  const auto f32 = write_f32_model(dir.path());
  const auto path = dir / "q4_k_m.gguf";
  const auto encoded = write_kquant_gguf(f32, path, q4_k_m_mix);
  const auto m = load_as(path, weight_format::int4);
  const layer_weights& l = m->weights.layers[0];
  CHECK(l.wq.format == weight_format::int4);
  CHECK(l.wv.format == weight_format::int4);
  CHECK(m->weights.lm_head.format == weight_format::q6_k);
  // Exactly what quantizing the decoded values gives.
  const kquant_matrix& source = encoded.at("blk.0.attn_v.weight");
  std::vector<std::uint8_t> values(static_cast<std::size_t>(edge::kernels::weight_values_bytes(weight_format::int4, source.n, source.k)));
  std::vector<float> scales(static_cast<std::size_t>(source.n * (source.k / l.wv.group_size)));
  REQUIRE(edge::kernels::run_quantize({.x = source.values.data(), .rows = source.n, .k = source.k, .x_stride = source.k,
                                       .format = weight_format::int4, .group_size = l.wv.group_size,
                                       .values = values.data(), .scales = scales.data()},
                                      {})
              .ok());
  CHECK(std::memcmp(values.data(), l.wv.data, values.size()) == 0);
  CHECK(std::memcmp(scales.data(), l.wv.scales, scales.size() * sizeof(float)) == 0);

  // quantize writes the checkpoint with the K-quant classifier exactly, as f32, which loads back
  // with the same values (and the INT4 projections' bytes).
  const auto written = write_quantized_checkpoint(*m, {.source = {.path = path}, .out = dir / "int4"});
  REQUIRE_MESSAGE(written.ok(), written.error().message());
  const auto reloaded = load_as(dir / "int4");
  CHECK(reloaded->weights.lm_head.format == weight_format::f32);
  check_values(reloaded->weights.lm_head, encoded.at("output.weight"));
  CHECK(edge::testing::same_bytes(reloaded->weights.layers[0].wv, l.wv));
  // Projections kept as K-quants are not what quantize writes.
  const auto native = load_as(path);
  CHECK(write_quantized_checkpoint(*native, {.source = {.path = path}, .out = dir / "native"}).error().code() ==
        edge::status_code::invalid_argument);
}
