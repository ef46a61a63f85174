// GGUF Q4_0 and Q8_0 tensors: stories260K re-encoded the way llama.cpp's quantizer does
// (reference rounding, f16 block scales) loads with Q4_0 repacked into INT4 groups of 32 that
// dequantize to exactly d × (q - 8), Q8_0 repacked into INT8 groups of 32 (exactly d × q), rows that
// are not whole blocks left as they were, and the result runs and predicts like the f32 model.
// A qwen3moe GGUF's stacked experts re-encoded the same way split into one matrix per expert.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <type_traits>
#include <variant>

#include "edge/backend/io/gguf.h"
#include "edge/backend/model/model.h"
#include "edge/backend/model/synthetic.h"
#include "edge/backend/runtime/cpu_executor.h"
#include "edge/backend/runtime/kv_cache.h"
#include "edge/kernels/numerics.h"
#include "model_test_support.h"
#include "test_support.h"
#include "weight_test_support.h"

namespace {

using namespace edge::backend;
using edge::kernels::weight_format;
using edge::testing::byte_writer;

constexpr std::uint32_t ggml_q8_0 = 8;
constexpr std::int64_t block = 32;

// llama.cpp's quantize_row_q4_0_reference: d = (the signed value of largest magnitude) / -8,
// q = min(15, trunc(x / d + 8.5)).
std::vector<std::byte> q4_0_blocks(const float* x, std::int64_t n) {
  std::vector<std::byte> out;
  for (std::int64_t b = 0; b < n / block; ++b) {
    const float* v = x + b * block;
    float amax = 0.0f, max = 0.0f;
    for (std::int64_t j = 0; j < block; ++j) {
      if (std::fabs(v[j]) > amax) {
        amax = std::fabs(v[j]);
        max = v[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const std::uint16_t d16 = edge::kernels::float_to_fp16(d);
    out.push_back(std::byte(d16 & 0xFF));
    out.push_back(std::byte(d16 >> 8));
    for (std::int64_t j = 0; j < block / 2; ++j) {
      const int lo = std::min(15, static_cast<int>(v[j] * id + 8.5f));
      const int hi = std::min(15, static_cast<int>(v[j + block / 2] * id + 8.5f));
      out.push_back(std::byte(static_cast<std::uint8_t>(lo | (hi << 4))));
    }
  }
  return out;
}

// llama.cpp's quantize_row_q8_0_reference: d = amax / 127, q = round(x / d).
std::vector<std::byte> q8_0_blocks(const float* x, std::int64_t n) {
  std::vector<std::byte> out;
  for (std::int64_t b = 0; b < n / block; ++b) {
    const float* v = x + b * block;
    float amax = 0.0f;
    for (std::int64_t j = 0; j < block; ++j) amax = std::max(amax, std::fabs(v[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const std::uint16_t d16 = edge::kernels::float_to_fp16(d);
    out.push_back(std::byte(d16 & 0xFF));
    out.push_back(std::byte(d16 >> 8));
    for (std::int64_t j = 0; j < block; ++j) {
      out.push_back(std::byte(static_cast<std::uint8_t>(static_cast<std::int8_t>(std::lround(v[j] * id)))));
    }
  }
  return out;
}

// Element i of a block tensor as llama.cpp's dequantize_row_* computes it.
float block_value(const std::vector<std::byte>& blocks, std::uint32_t type, std::int64_t i) {
  const std::int64_t size = type == edge::testing::ggml_q4_0 ? 18 : 34;
  const std::byte* b = blocks.data() + (i / block) * size;
  const float d = edge::kernels::fp16_to_float(static_cast<std::uint16_t>(std::to_integer<unsigned>(b[0]) |
                                                                         (std::to_integer<unsigned>(b[1]) << 8)));
  const std::int64_t j = i % block;
  if (type == ggml_q8_0) return static_cast<float>(static_cast<std::int8_t>(std::to_integer<unsigned>(b[2 + j]))) * d;
  const unsigned byte = std::to_integer<unsigned>(b[2 + j % (block / 2)]);
  const int q = static_cast<int>(j < block / 2 ? byte & 0xF : byte >> 4) - 8;
  return static_cast<float>(q) * d;
}

void put_value(byte_writer& out, const gguf_value& v);

std::uint32_t type_of(const gguf_value& v) {
  switch (v.value.index()) {
    case 0: return edge::testing::gguf_u64;
    case 1: return edge::testing::gguf_i64;
    case 2: return edge::testing::gguf_f64;
    case 3: return edge::testing::gguf_bool;
    case 4: return edge::testing::gguf_string;
    default: return edge::testing::gguf_array;
  }
}

void put_value(byte_writer& out, const gguf_value& v) {
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>) {
          out.put<std::uint8_t>(x ? 1 : 0);
        } else if constexpr (std::is_same_v<T, std::string>) {
          out.str(x);
        } else if constexpr (std::is_same_v<T, gguf_array>) {
          out.put<std::uint32_t>(x.empty() ? edge::testing::gguf_i64 : type_of(x.front()));
          out.put<std::uint64_t>(x.size());
          for (const auto& item : x) put_value(out, item);
        } else {
          out.put(x);
        }
      },
      v.value);
}

struct encoded_tensor {
  std::uint32_t type;
  std::vector<std::byte> blocks;  // for Q4_0 / Q8_0
};

// An F32 GGUF with every matrix (or stack of matrices) whose rows are whole blocks in `type`;
// returns what each re-encoded tensor holds.
std::map<std::string, encoded_tensor> write_quantized(const std::filesystem::path& in, const std::filesystem::path& out,
                                                      std::uint32_t type) {
  auto file = load_gguf(in);
  REQUIRE(file.ok());
  std::map<std::string, encoded_tensor> encoded;
  std::vector<edge::testing::test_tensor> tensors;
  for (const auto& t : file->tensors) {
    edge::testing::test_tensor written{.name = t.name, .ne = {}, .type = edge::testing::ggml_f32, .data = {}};
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) written.ne.push_back(static_cast<std::uint64_t>(*it));
    const auto* values = reinterpret_cast<const float*>(t.data);
    if (t.shape.size() >= 2 && t.cols() % block == 0) {
      written.type = type;
      written.data = type == edge::testing::ggml_q4_0 ? q4_0_blocks(values, t.elements()) : q8_0_blocks(values, t.elements());
      encoded[t.name] = {type, written.data};
    } else {
      written.data.assign(t.data, t.data + t.bytes());
    }
    tensors.push_back(std::move(written));
  }
  const auto bytes = edge::testing::make_gguf(
      file->metadata.size(),
      [&](byte_writer& w) {
        for (const auto& [key, value] : file->metadata) {
          w.str(key).put<std::uint32_t>(type_of(value));
          put_value(w, value);
        }
      },
      tensors);
  edge::testing::write_bytes(out, bytes);
  return encoded;
}

// stories260K.gguf with every matrix but ffn_down (whose rows are not whole blocks) in `type`.
std::map<std::string, encoded_tensor> write_quantized_stories(const std::filesystem::path& out, std::uint32_t type) {
  return write_quantized(edge::testing::stories260k_dir() / "stories260K.gguf", out, type);
}

// Whether w holds the values of `source` from element `first` on (a stack's matrix: its offset).
void check_values(const weight_matrix& w, const encoded_tensor& source, std::int64_t first = 0) {
  CAPTURE(w.name);
  for (std::int64_t i = 0; i < w.elements(); ++i) {
    const float expected = block_value(source.blocks, source.type, first + i);
    if (edge::testing::element(w, i) != expected) {
      CHECK(edge::testing::element(w, i) == expected);
      return;
    }
  }
}

// Greedy next tokens along a text, with an f32 KV cache.
std::vector<token_id> model_argmax(const model& m, const std::vector<token_id>& text);

}  // namespace

TEST_CASE("GGUF Q4_0: repacked into INT4 groups of 32 that hold exactly d × (q - 8)") {
  edge::testing::temp_dir dir;
  const auto path = dir / "stories-q4_0.gguf";
  const auto encoded = write_quantized_stories(path, edge::testing::ggml_q4_0);
  auto m = load_model({.path = path});
  REQUIRE_MESSAGE(m.ok(), m.error().message());
  const model_weights& w = (*m)->weights;
  const layer_weights& l = w.layers[2];
  for (const auto* matrix : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up}) {
    CHECK(matrix->format == weight_format::int4);
    CHECK(matrix->group_size == 32);
  }
  check_values(l.wq, encoded.at("blk.2.attn_q.weight"));
  check_values(l.wk, encoded.at("blk.2.attn_k.weight"));
  check_values(l.w_up, encoded.at("blk.2.ffn_up.weight"));
  CHECK(l.w_down.format == weight_format::f32);  // 172 columns: not whole blocks, left in f32
  // The classifier keeps its Q4_0 numbers (as INT4); the embedding table becomes f16.
  CHECK(w.lm_head.format == weight_format::int4);
  check_values(w.lm_head, encoded.at("output.weight"));
  CHECK(w.token_embedding.type == edge::kernels::dtype::f16);
  CHECK(projection_format(w) == weight_format::int4);

  // Asked for fp8 instead: decoded exactly, then quantized per row.
  auto fp8 = load_model({.path = path, .weight_dtype = weight_format::fp8_e4m3});
  REQUIRE(fp8.ok());
  CHECK((*fp8)->weights.layers[2].wq.format == weight_format::fp8_e4m3);
  CHECK((*fp8)->weights.layers[2].w_down.format == weight_format::fp8_e4m3);
}

TEST_CASE("GGUF Q8_0: repacked into INT8 groups of 32 that hold exactly d × q; the model still predicts the f32 model's tokens") {
  edge::testing::temp_dir dir;
  const auto path = dir / "stories-q8_0.gguf";
  const auto encoded = write_quantized_stories(path, ggml_q8_0);
  auto m = load_model({.path = path});
  REQUIRE_MESSAGE(m.ok(), m.error().message());
  const layer_weights& l = (*m)->weights.layers[0];
  for (const auto* matrix : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up}) {
    CHECK(matrix->format == weight_format::int8);
    CHECK(matrix->group_size == 32);
  }
  check_values(l.wq, encoded.at("blk.0.attn_q.weight"));
  check_values(l.w_gate, encoded.at("blk.0.ffn_gate.weight"));
  CHECK((*m)->weights.token_embedding.type == edge::kernels::dtype::f16);

  auto reference = load_model({.path = edge::testing::stories260k_dir() / "stories260K.gguf"});
  REQUIRE(reference.ok());
  const auto text = (*reference)->tok->encode("Once upon a time, there was a little girl named Lily. She loved to play.", {});
  const auto expected = model_argmax(**reference, text);
  const auto got = model_argmax(**m, text);
  REQUIRE(expected.size() == got.size());
  std::size_t same = 0;
  for (std::size_t i = 0; i < got.size(); ++i) same += got[i] == expected[i] ? 1 : 0;
  CHECK(static_cast<double>(same) >= 0.9 * static_cast<double>(got.size()));
}

TEST_CASE("GGUF Q4_0 / Q8_0 stacked experts: each expert is its own slice of the stack's blocks") {
  edge::testing::temp_dir dir;
  synthetic_options options;
  options.preset = "tiny-qwen3-moe-sparse";
  options.format = synthetic_format::gguf;
  options.dtype = edge::kernels::dtype::f32;
  options.seed = 8;
  options.out = dir / "moe-f32.gguf";
  REQUIRE(write_synthetic_model(options).ok());
  for (const std::uint32_t type : {edge::testing::ggml_q4_0, ggml_q8_0}) {
    CAPTURE(type);
    const auto path = dir / "moe-quantized.gguf";
    const auto encoded = write_quantized(options.out, path, type);
    auto m = load_model({.path = path});
    REQUIRE_MESSAGE(m.ok(), m.error().message());
    const weight_format expected_format = type == ggml_q8_0 ? weight_format::int8 : weight_format::int4;
    for (std::size_t l = 0; l < (*m)->weights.layers.size(); ++l) {
      const layer_weights& layer = (*m)->weights.layers[l];
      const std::string blk = "blk." + std::to_string(l) + ".";
      check_values(layer.router, encoded.at(blk + "ffn_gate_inp.weight"));
      for (std::size_t e = 0; e < layer.experts.size(); ++e) {
        const expert_weights& expert = layer.experts[e];
        const auto first = static_cast<std::int64_t>(e) * expert.w_gate.elements();
        CHECK(expert.w_gate.format == expected_format);
        CHECK(expert.w_down.format == expected_format);
        check_values(expert.w_gate, encoded.at(blk + "ffn_gate_exps.weight"), first);
        check_values(expert.w_up, encoded.at(blk + "ffn_up_exps.weight"), first);
        check_values(expert.w_down, encoded.at(blk + "ffn_down_exps.weight"), first);
        // Converted into buffers of the model's own, gate and up are stacked.
        CHECK(expert.w_gate_up.present());
      }
    }
  }
}

namespace {

std::vector<token_id> model_argmax(const model& m, const std::vector<token_id>& text) {
  auto cache = kv_cache::create(kv_cache_layout::for_tokens(m.config, edge::kernels::dtype::f32, 16, 256));
  REQUIRE(cache.ok());
  auto exec = cpu_executor::create(m, **cache, nullptr, {.max_batch_tokens = 256, .max_sequences = 256});
  REQUIRE(exec.ok());
  std::vector<std::int32_t> table(16);
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<std::int32_t>(i);
  batch_plan plan;
  for (std::size_t p = 0; p < text.size(); ++p) {
    plan.entries.push_back({.tokens = {&text[p], 1}, .start_position = static_cast<std::int64_t>(p),
                            .block_table = table, .compute_logits = true});
  }
  const std::int64_t vocab = m.config.vocab_size;
  std::vector<float> logits(text.size() * static_cast<std::size_t>(vocab));
  REQUIRE((*exec)->forward(plan, logits).ok());
  std::vector<token_id> top;
  for (std::size_t p = 0; p < text.size(); ++p) {
    const float* row = logits.data() + p * static_cast<std::size_t>(vocab);
    top.push_back(static_cast<token_id>(std::max_element(row, row + vocab) - row));
  }
  return top;
}

}  // namespace
