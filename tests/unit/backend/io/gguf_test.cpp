#include <doctest/doctest.h>

#include <limits>
#include <map>
#include <set>

#include "backend/model/model_test_support.h"
#include "edge/backend/io/gguf.h"
#include "test_support.h"

using namespace edge::backend;
using edge::status_code;
namespace t = edge::testing;

namespace {

constexpr std::uint64_t stories_data_offset = 14176;

std::vector<std::byte> stories_gguf() { return t::read_bytes(t::stories260k_dir() / "stories260K.gguf"); }

// One F32 tensor [2, 3] (ggml ne = {3, 2}) and a metadata entry of every type.
std::vector<std::byte> every_type_gguf() {
  return t::make_gguf(
      14,
      [](t::byte_writer& w) {
        w.str("u8").put<std::uint32_t>(t::gguf_u8).put<std::uint8_t>(200);
        w.str("i8").put<std::uint32_t>(t::gguf_i8).put<std::int8_t>(-100);
        w.str("u16").put<std::uint32_t>(t::gguf_u16).put<std::uint16_t>(60000);
        w.str("i16").put<std::uint32_t>(t::gguf_i16).put<std::int16_t>(-30000);
        w.str("u32").put<std::uint32_t>(t::gguf_u32).put<std::uint32_t>(4000000000u);
        w.str("i32").put<std::uint32_t>(t::gguf_i32).put<std::int32_t>(-2000000000);
        w.str("f32").put<std::uint32_t>(t::gguf_f32).put<float>(0.5f);
        w.str("bool").put<std::uint32_t>(t::gguf_bool).put<std::uint8_t>(1);
        w.str("string").put<std::uint32_t>(t::gguf_string).str("héllo");
        w.str("u64").put<std::uint32_t>(t::gguf_u64).put<std::uint64_t>(std::numeric_limits<std::uint64_t>::max());
        w.str("i64").put<std::uint32_t>(t::gguf_i64).put<std::int64_t>(std::numeric_limits<std::int64_t>::min());
        w.str("f64").put<std::uint32_t>(t::gguf_f64).put<double>(-2.25);
        w.str("strings").put<std::uint32_t>(t::gguf_array).put<std::uint32_t>(t::gguf_string).put<std::uint64_t>(2);
        w.str("a").str("bc");
        // [[1, 2], []]: an array of arrays of int32.
        w.str("nested").put<std::uint32_t>(t::gguf_array).put<std::uint32_t>(t::gguf_array).put<std::uint64_t>(2);
        w.put<std::uint32_t>(t::gguf_i32).put<std::uint64_t>(2).put<std::int32_t>(1).put<std::int32_t>(2);
        w.put<std::uint32_t>(t::gguf_i32).put<std::uint64_t>(0);
      },
      {{"matrix", {3, 2}, t::ggml_f32, t::f32_bytes({1, 2, 3, 4, 5, 6})}});
}

// A GGUF with no metadata and the given tensors.
std::vector<std::byte> tensors_gguf(const std::vector<t::test_tensor>& tensors) {
  return t::make_gguf(0, [](t::byte_writer&) {}, tensors);
}

}  // namespace

TEST_CASE("stories260K.gguf parses with the metadata and tensors of its README") {
  const auto bytes = stories_gguf();
  auto parsed = parse_gguf(bytes);
  REQUIRE_MESSAGE(parsed.ok(), parsed.error().to_string());
  const gguf_file& file = *parsed;

  CHECK(file.version == 3);
  CHECK(file.alignment == 32);
  CHECK(file.data_offset == stories_data_offset);
  CHECK(file.metadata.size() == 19);
  CHECK(*file.find("general.architecture")->as_string() == "llama");
  CHECK(*file.find("tokenizer.ggml.model")->as_string() == "llama");
  const std::map<std::string, std::int64_t> ints = {
      {"llama.embedding_length", 64},      {"llama.feed_forward_length", 172}, {"llama.block_count", 5},
      {"llama.attention.head_count", 8},   {"llama.attention.head_count_kv", 4},
      {"llama.rope.dimension_count", 8},   {"llama.context_length", 2048},
      {"tokenizer.ggml.unknown_token_id", 0}, {"tokenizer.ggml.bos_token_id", 1}, {"tokenizer.ggml.eos_token_id", 2},
  };
  for (const auto& [key, value] : ints) {
    CAPTURE(key);
    REQUIRE(file.find(key) != nullptr);
    CHECK(file.find(key)->as_int() == value);
  }
  CHECK(file.find("llama.attention.layer_norm_rms_epsilon")->as_number().value() == doctest::Approx(1e-5));
  CHECK(file.find("llama.rope.freq_base") == nullptr);

  const auto* tokens = file.find("tokenizer.ggml.tokens")->as_array();
  REQUIRE(tokens != nullptr);
  REQUIRE(tokens->size() == 512);
  CHECK(*(*tokens)[0].as_string() == "<unk>");
  CHECK(*(*tokens)[1].as_string() == "<s>");
  CHECK(*(*tokens)[3].as_string() == "<0x00>");
  CHECK(file.find("tokenizer.ggml.scores")->as_array()->size() == 512);
  CHECK(file.find("tokenizer.ggml.token_type")->as_array()->size() == 512);
  CHECK(file.find("tokenizer.ggml.scores")->as_array()->at(511).as_number().value() == doctest::Approx(-252.0));

  REQUIRE(file.tensors.size() == 48);
  std::map<std::string, std::vector<std::int64_t>> expected = {
      {"token_embd.weight", {512, 64}}, {"output_norm.weight", {64}}, {"output.weight", {512, 64}}};
  for (int i = 0; i < 5; ++i) {
    const auto blk = "blk." + std::to_string(i) + ".";
    expected[blk + "attn_q.weight"] = {64, 64};
    expected[blk + "attn_k.weight"] = {32, 64};
    expected[blk + "attn_v.weight"] = {32, 64};
    expected[blk + "attn_output.weight"] = {64, 64};
    expected[blk + "attn_norm.weight"] = {64};
    expected[blk + "ffn_gate.weight"] = {172, 64};
    expected[blk + "ffn_down.weight"] = {64, 172};
    expected[blk + "ffn_up.weight"] = {172, 64};
    expected[blk + "ffn_norm.weight"] = {64};
  }
  for (const auto& tensor : file.tensors) {
    CAPTURE(tensor.name);
    REQUIRE(expected.contains(tensor.name));
    CHECK(tensor.shape == expected[tensor.name]);
    CHECK(tensor.type == edge::kernels::dtype::f32);
  }
  CHECK(file.tensors.front().name == "token_embd.weight");
  CHECK(file.tensors.front().data == bytes.data() + stories_data_offset);
  // The last tensor ends exactly at the end of the file.
  const auto& last = file.tensors.back();
  CHECK(last.data + last.bytes() == bytes.data() + bytes.size());
  CHECK(file.find_tensor("blk.4.ffn_norm.weight") == &last);
  CHECK(file.find_tensor("blk.5.ffn_norm.weight") == nullptr);
}

TEST_CASE("load_gguf maps the file and names it in errors") {
  auto loaded = load_gguf(t::stories260k_dir() / "stories260K.gguf");
  REQUIRE(loaded.ok());
  REQUIRE(loaded->file != nullptr);
  CHECK(loaded->tensors.front().data == loaded->file->bytes().data() + stories_data_offset);

  auto missing = load_gguf("/nonexistent/model.gguf");
  CHECK(missing.error().code() == status_code::not_found);
  CHECK(missing.error().message().find("/nonexistent/model.gguf") != std::string::npos);

  t::temp_dir dir;
  t::write_text(dir / "bad.gguf", "GGUF\x03");
  auto bad = load_gguf(dir / "bad.gguf");
  CHECK(bad.error().code() == status_code::data_loss);
  CHECK(bad.error().message().find("bad.gguf") != std::string::npos);
}

TEST_CASE("every metadata value type reads back") {
  const auto bytes = every_type_gguf();
  auto parsed = parse_gguf(bytes);
  REQUIRE_MESSAGE(parsed.ok(), parsed.error().to_string());
  const auto& file = *parsed;
  CHECK(file.find("u8")->as_int() == 200);
  CHECK(file.find("i8")->as_int() == -100);
  CHECK(file.find("u16")->as_int() == 60000);
  CHECK(file.find("i16")->as_int() == -30000);
  CHECK(file.find("u32")->as_int() == 4000000000);
  CHECK(file.find("i32")->as_int() == -2000000000);
  CHECK(file.find("f32")->as_number() == 0.5);
  CHECK(file.find("f32")->as_int() == std::nullopt);
  CHECK(file.find("bool")->as_bool() == true);
  CHECK(file.find("bool")->as_int() == std::nullopt);
  CHECK(*file.find("string")->as_string() == "héllo");
  CHECK(file.find("u64")->as_int() == std::nullopt);  // does not fit an int64
  CHECK(file.find("u64")->as_number() == doctest::Approx(1.8446744073709552e19));
  CHECK(file.find("i64")->as_int() == std::numeric_limits<std::int64_t>::min());
  CHECK(file.find("f64")->as_number() == -2.25);
  const auto* strings = file.find("strings")->as_array();
  REQUIRE(strings->size() == 2);
  CHECK(*(*strings)[1].as_string() == "bc");
  const auto* nested = file.find("nested")->as_array();
  REQUIRE(nested->size() == 2);
  REQUIRE((*nested)[0].as_array()->size() == 2);
  CHECK((*nested)[0].as_array()->at(1).as_int() == 2);
  CHECK((*nested)[1].as_array()->empty());

  REQUIRE(file.tensors.size() == 1);
  CHECK(file.tensors[0].shape == std::vector<std::int64_t>{2, 3});
  CHECK(t::element(file.tensors[0], 5) == 6.0f);
}

TEST_CASE("GGUF v2, F16/BF16 tensors and a larger general.alignment") {
  const auto bytes = t::make_gguf(
      1, [](t::byte_writer& w) { w.str("general.alignment").put<std::uint32_t>(t::gguf_u32).put<std::uint32_t>(64); },
      {{"half", {4}, t::ggml_f16, std::vector<std::byte>(8)}, {"brain", {2, 2}, t::ggml_bf16, std::vector<std::byte>(8)}},
      64, 2);
  auto parsed = parse_gguf(bytes);
  REQUIRE_MESSAGE(parsed.ok(), parsed.error().to_string());
  CHECK(parsed->version == 2);
  CHECK(parsed->alignment == 64);
  CHECK(parsed->data_offset % 64 == 0);
  CHECK(parsed->tensors[0].type == edge::kernels::dtype::f16);
  CHECK(parsed->tensors[1].type == edge::kernels::dtype::bf16);
  CHECK(parsed->tensors[1].data == parsed->tensors[0].data + 64);
}

TEST_CASE("every truncation of stories260K.gguf is an error, never a crash") {
  const auto bytes = stories_gguf();
  // Every prefix up to the end of the header region, then a sample through the tensor data.
  std::set<std::size_t> lengths;
  for (std::size_t n = 0; n <= stories_data_offset; ++n) lengths.insert(n);
  for (std::size_t n = stories_data_offset; n < bytes.size(); n += 4099) lengths.insert(n);
  lengths.insert(bytes.size() - 1);
  for (const auto n : lengths) {
    auto parsed = parse_gguf(std::span(bytes).first(n));
    if (parsed.ok()) FAIL("a prefix of " << n << " bytes parsed");
    if (n >= 8) {
      const auto code = parsed.error().code();
      if (code != status_code::data_loss) FAIL("prefix " << n << ": " << parsed.error().to_string());
    }
  }
  CHECK(parse_gguf(bytes).ok());
}

TEST_CASE("corrupt GGUF headers are errors") {
  const auto good = stories_gguf();
  const auto patched = [&](std::size_t offset, auto value) {
    auto copy = good;
    std::memcpy(copy.data() + offset, &value, sizeof(value));
    return parse_gguf(copy);
  };
  const auto message = [](const auto& parsed) { return parsed.error().message(); };

  SUBCASE("bad magic") {
    auto parsed = patched(0, std::uint32_t{0x46554748});
    CHECK(parsed.error().code() == status_code::invalid_argument);
    CHECK(message(parsed).find("magic") != std::string::npos);
  }
  SUBCASE("unsupported versions") {
    CHECK(patched(4, std::uint32_t{1}).error().code() == status_code::invalid_argument);
    CHECK(patched(4, std::uint32_t{4}).error().code() == status_code::invalid_argument);
    CHECK(message(patched(4, std::uint32_t{0x03000000})).find("big-endian") != std::string::npos);
  }
  SUBCASE("absurd tensor and metadata counts are refused before allocating") {
    for (const std::uint64_t count : {std::uint64_t{1} << 40, ~std::uint64_t{0}, std::uint64_t{1000000}}) {
      CHECK(patched(8, count).error().code() == status_code::data_loss);
      CHECK(patched(16, count).error().code() == status_code::data_loss);
    }
  }
  SUBCASE("a string length past the end") {
    // The first key's length field follows the 24-byte header.
    auto parsed = patched(24, std::uint64_t{1} << 50);
    CHECK(parsed.error().code() == status_code::data_loss);
    CHECK(message(parsed).find("runs past the end") != std::string::npos);
  }
  SUBCASE("an array count past the end") {
    // tokenizer.ggml.tokens: key (8 + 21 bytes), type, element type, then the count.
    const std::size_t count_offset = 24 + 8 + 21 + 4 + 4;
    auto parsed = patched(count_offset, std::uint64_t{1} << 61);
    CHECK(parsed.error().code() == status_code::data_loss);
    CHECK(message(parsed).find("tokenizer.ggml.tokens") != std::string::npos);
  }
  SUBCASE("an unknown value type") {
    CHECK(patched(24 + 8 + 21, std::uint32_t{13}).error().code() == status_code::invalid_argument);
  }
}

TEST_CASE("tensor infos are validated against the data section") {
  const auto data16 = t::f32_bytes({1, 2, 3, 4});
  SUBCASE("data past the end") {
    auto bytes = tensors_gguf({{"w", {4}, t::ggml_f32, data16}});
    bytes.erase(bytes.end() - 20, bytes.end());  // the tensor's padding (16) and 4 of its bytes
    auto parsed = parse_gguf(bytes);
    CHECK(parsed.error().code() == status_code::data_loss);
    CHECK(parsed.error().message().find("\"w\"") != std::string::npos);
  }
  SUBCASE("a shape larger than the data") {
    // 9 floats: more than the tensor's 16 bytes and the 16 of padding after them.
    auto parsed = parse_gguf(tensors_gguf({{"w", {9}, t::ggml_f32, data16}}));
    CHECK(parsed.error().code() == status_code::data_loss);
  }
  SUBCASE("element counts that overflow") {
    auto parsed = parse_gguf(tensors_gguf({{"w", {std::uint64_t{1} << 40, std::uint64_t{1} << 40}, t::ggml_f32, data16}}));
    CHECK(parsed.error().code() == status_code::invalid_argument);
    CHECK(parse_gguf(tensors_gguf({{"w", {~std::uint64_t{0}}, t::ggml_f32, data16}})).error().code() ==
          status_code::invalid_argument);
    CHECK(parse_gguf(tensors_gguf({{"w", {std::uint64_t{1} << 62}, t::ggml_f32, data16}})).error().code() ==
          status_code::data_loss);
    // An empty tensor whose other dimensions multiply past int64 (found by the fuzzer).
    CHECK(parse_gguf(tensors_gguf({{"w", {0, std::uint64_t{1} << 33, std::uint64_t{1} << 40}, t::ggml_f32, data16}}))
              .error()
              .code() == status_code::invalid_argument);
    auto empty = parse_gguf(tensors_gguf({{"w", {0, std::uint64_t{1} << 33}, t::ggml_f32, data16}}));
    REQUIRE(empty.ok());
    CHECK(empty->tensors[0].elements() == 0);
  }
  SUBCASE("too many dimensions") {
    auto parsed = parse_gguf(tensors_gguf({{"w", {1, 1, 1, 1, 4}, t::ggml_f32, data16}}));
    CHECK(parsed.error().code() == status_code::invalid_argument);
    CHECK(parse_gguf(tensors_gguf({{"w", {}, t::ggml_f32, data16}})).error().code() == status_code::invalid_argument);
  }
  SUBCASE("duplicate names") {
    auto parsed = parse_gguf(tensors_gguf({{"w", {4}, t::ggml_f32, data16}, {"w", {4}, t::ggml_f32, data16}}));
    CHECK(parsed.error().code() == status_code::invalid_argument);
    CHECK(parsed.error().message().find("duplicate tensor name \"w\"") != std::string::npos);
  }
  SUBCASE("quantized and unknown types are named") {
    constexpr std::uint32_t ggml_q4_1 = 3;
    auto quantized = parse_gguf(tensors_gguf({{"blk.0.attn_q.weight", {32}, ggml_q4_1, std::vector<std::byte>(20)}}));
    CHECK(quantized.error().code() == status_code::invalid_argument);
    CHECK(quantized.error().message() == "unsupported tensor type Q4_1 (3) for tensor \"blk.0.attn_q.weight\"");
    auto unknown = parse_gguf(tensors_gguf({{"x", {4}, 77, data16}}));
    CHECK(unknown.error().code() == status_code::invalid_argument);
    CHECK(unknown.error().message().find("unknown tensor type 77 for tensor \"x\"") != std::string::npos);
  }
  SUBCASE("K-quant rows must be whole super-blocks of 256") {
    constexpr std::uint32_t ggml_q6_k = 14;
    auto whole = parse_gguf(tensors_gguf({{"w", {256, 2}, ggml_q6_k, std::vector<std::byte>(2 * 210)}}));
    REQUIRE_MESSAGE(whole.ok(), whole.error().message());
    CHECK(whole->tensors[0].encoding == tensor_encoding::ggml_q6_k);
    CHECK(whole->tensors[0].bytes() == 2 * 210);
    auto partial = parse_gguf(tensors_gguf({{"w", {128, 2}, ggml_q6_k, std::vector<std::byte>(210)}}));
    CHECK(partial.error().code() == status_code::invalid_argument);
    CHECK(partial.error().message().find("Q6_K rows of 128 elements are not whole blocks of 256") != std::string::npos);
  }
  SUBCASE("misaligned offsets") {
    auto bytes = tensors_gguf({{"a", {4}, t::ggml_f32, data16}, {"b", {4}, t::ggml_f32, data16}});
    // Move b's offset (the last 8 bytes of the tensor infos) from 32 to 16.
    const std::size_t b_offset_at = 24 + (8 + 1 + 4 + 8 + 4 + 8) + (8 + 1 + 4 + 8 + 4);
    const std::uint64_t misaligned = 16;
    std::memcpy(bytes.data() + b_offset_at, &misaligned, sizeof(misaligned));
    auto parsed = parse_gguf(bytes);
    CHECK(parsed.error().code() == status_code::invalid_argument);
    CHECK(parsed.error().message().find("not a multiple of the alignment") != std::string::npos);
  }
  SUBCASE("a bad general.alignment") {
    for (const std::uint32_t alignment : {0u, 3u, 48u}) {
      auto bytes = t::make_gguf(
          1,
          [&](t::byte_writer& w) {
            w.str("general.alignment").put<std::uint32_t>(t::gguf_u32).put<std::uint32_t>(alignment);
          },
          {});
      CHECK(parse_gguf(bytes).error().code() == status_code::invalid_argument);
    }
  }
  SUBCASE("duplicate metadata keys and nesting too deep") {
    auto duplicate = t::make_gguf(2,
                                  [](t::byte_writer& w) {
                                    w.str("k").put<std::uint32_t>(t::gguf_u8).put<std::uint8_t>(1);
                                    w.str("k").put<std::uint32_t>(t::gguf_u8).put<std::uint8_t>(2);
                                  },
                                  {});
    CHECK(parse_gguf(duplicate).error().code() == status_code::invalid_argument);
    auto deep = t::make_gguf(1,
                             [](t::byte_writer& w) {
                               w.str("deep").put<std::uint32_t>(t::gguf_array);
                               for (int i = 0; i < 100; ++i) w.put<std::uint32_t>(t::gguf_array).put<std::uint64_t>(1);
                               w.put<std::uint32_t>(t::gguf_u8).put<std::uint64_t>(0);
                             },
                             {});
    CHECK(parse_gguf(deep).error().code() == status_code::invalid_argument);
    // More array elements than any real vocabulary needs, refused before they are allocated.
    const std::uint64_t too_many = (std::uint64_t{1} << 24) + 1;
    auto huge = t::make_gguf(1,
                             [&](t::byte_writer& w) {
                               w.str("huge").put<std::uint32_t>(t::gguf_array).put<std::uint32_t>(t::gguf_u8);
                               w.put<std::uint64_t>(too_many).raw(std::vector<std::byte>(too_many));
                             },
                             {});
    auto refused = parse_gguf(huge);
    CHECK(refused.error().code() == status_code::invalid_argument);
    CHECK(refused.error().message().find("\"huge\"") != std::string::npos);
    auto bad_bool = t::make_gguf(
        1, [](t::byte_writer& w) { w.str("b").put<std::uint32_t>(t::gguf_bool).put<std::uint8_t>(2); }, {});
    CHECK(parse_gguf(bad_bool).error().code() == status_code::invalid_argument);
  }
}

TEST_CASE("every single-byte corruption of a small GGUF is handled") {
  const auto good = every_type_gguf();
  for (std::size_t i = 0; i < good.size(); ++i) {
    for (const std::uint8_t value : {std::uint8_t{0x00}, std::uint8_t{0xFF}, std::uint8_t{0x7F}}) {
      auto copy = good;
      copy[i] = std::byte{value};
      // Either outcome is fine; reading out of bounds or crashing is not (the sanitizer build).
      auto parsed = parse_gguf(copy);
      if (parsed.ok()) {
        for (const auto& tensor : parsed->tensors) {
          CHECK(tensor.data + tensor.bytes() <= copy.data() + copy.size());
        }
      }
    }
  }
}
