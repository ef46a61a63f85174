// Writes the seed corpora of the parser fuzzers: small valid GGUF and safetensors files that
// between them use every metadata value type, nested arrays, every accepted tensor type, a
// non-default alignment and safetensors metadata, and OpenAI request bodies that use every
// field. Mutations of valid inputs reach far deeper into a parser than random bytes do.
//
//   edge_fuzz_seeds DIR     writes DIR/gguf/*, DIR/safetensors/* and DIR/openai_request/*
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "model_test_support.h"

namespace {

namespace fs = std::filesystem;
namespace t = edge::testing;

std::vector<std::vector<std::byte>> gguf_seeds() {
  std::vector<std::vector<std::byte>> seeds;
  // Every value type, a nested array, and tensors of the three accepted types.
  seeds.push_back(t::make_gguf(
      8,
      [](t::byte_writer& w) {
        w.str("general.architecture").put<std::uint32_t>(t::gguf_string).str("llama");
        w.str("llama.block_count").put<std::uint32_t>(t::gguf_u32).put<std::uint32_t>(1);
        w.str("small").put<std::uint32_t>(t::gguf_i8).put<std::int8_t>(-3);
        w.str("flag").put<std::uint32_t>(t::gguf_bool).put<std::uint8_t>(1);
        w.str("eps").put<std::uint32_t>(t::gguf_f32).put<float>(1e-5f);
        w.str("big").put<std::uint32_t>(t::gguf_f64).put<double>(1e300);
        w.str("tokenizer.ggml.tokens").put<std::uint32_t>(t::gguf_array).put<std::uint32_t>(t::gguf_string);
        w.put<std::uint64_t>(3).str("<s>").str("a").str("\xe2\x96\x81the");
        w.str("nested").put<std::uint32_t>(t::gguf_array).put<std::uint32_t>(t::gguf_array).put<std::uint64_t>(1);
        w.put<std::uint32_t>(t::gguf_u16).put<std::uint64_t>(2).put<std::uint16_t>(7).put<std::uint16_t>(9);
      },
      {{"token_embd.weight", {4, 3}, t::ggml_f32, t::f32_bytes({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})},
       {"output_norm.weight", {4}, t::ggml_f16, std::vector<std::byte>(8, std::byte{0x3c})},
       {"blk.0.attn_q.weight", {2, 2, 1, 1}, t::ggml_bf16, std::vector<std::byte>(8, std::byte{0x3f})}}));
  // Version 2, alignment 64, integers of every width.
  seeds.push_back(t::make_gguf(
      7,
      [](t::byte_writer& w) {
        w.str("general.alignment").put<std::uint32_t>(t::gguf_u32).put<std::uint32_t>(64);
        w.str("u8").put<std::uint32_t>(t::gguf_u8).put<std::uint8_t>(255);
        w.str("u16").put<std::uint32_t>(t::gguf_u16).put<std::uint16_t>(65535);
        w.str("i16").put<std::uint32_t>(t::gguf_i16).put<std::int16_t>(-2);
        w.str("i32").put<std::uint32_t>(t::gguf_i32).put<std::int32_t>(-1);
        w.str("u64").put<std::uint32_t>(t::gguf_u64).put<std::uint64_t>(1ull << 40);
        w.str("i64").put<std::uint32_t>(t::gguf_i64).put<std::int64_t>(-(1ll << 40));
      },
      {{"a", {8}, t::ggml_f32, t::f32_bytes({0, 1, 2, 3, 4, 5, 6, 7})}, {"b", {1}, t::ggml_f32, t::f32_bytes({1})}},
      64, 2));
  // No tensors, no metadata.
  seeds.push_back(t::make_gguf(0, [](t::byte_writer&) {}, {}));
  return seeds;
}

std::vector<std::vector<std::byte>> safetensors_seeds() {
  std::vector<std::vector<std::byte>> seeds;
  auto data = t::f32_bytes({1, 2, 3, 4});
  data.resize(26, std::byte{0x3f});
  seeds.push_back(t::make_safetensors(
      R"({"__metadata__": {"format": "pt", "edgeinfer_synthetic": "true"}, )"
      R"("model.embed_tokens.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}, )"
      R"("model.norm.weight": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]}, )"
      R"("lm_head.weight": {"dtype": "F16", "shape": [2, 1], "data_offsets": [22, 26]}}  )",
      data));
  seeds.push_back(t::make_safetensors(R"({"scalar": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}})",
                                      t::f32_bytes({2.5f})));
  seeds.push_back(t::make_safetensors("{}", {}));
  return seeds;
}

std::vector<std::vector<std::byte>> openai_request_seeds() {
  // Each seed in parentheses: adjacent literals are one seed, not several.
  const char* bodies[] = {
      (R"({"model":"stories260K","messages":[{"role":"system","content":"Be brief."},)"
       R"({"role":"user","content":[{"type":"text","text":"Once upon"},{"type":"text","text":" a time"}]},)"
       R"({"role":"assistant","content":null},{"role":"developer","content":"More."}],)"
       R"("max_completion_tokens":8,"temperature":0.7,"top_p":0.9,"top_k":40,"min_p":0.05,"seed":42,)"
       R"("stop":["\n","The end"],"presence_penalty":0.5,"frequency_penalty":-0.5,"n":1,"stream":true,)"
       R"("stream_options":{"include_usage":true},"user":"u","logprobs":false,"tools":[],)"
       R"("response_format":{"type":"text"}})"),
      (R"({"model":"m","prompt":"Once upon a time","max_tokens":16,"stop":"\n","best_of":1,"echo":false,)"
       R"("repetition_penalty":1.1,"ignore_eos":true,"seed":-1,"suffix":null})"),
      R"({"prompt":[1,403,407,261,378],"max_tokens":3.0})",
      R"({"prompt":["text"],"stream":false})",
  };
  std::vector<std::vector<std::byte>> seeds;
  for (const std::string_view body : bodies) {
    const auto* bytes = reinterpret_cast<const std::byte*>(body.data());
    seeds.emplace_back(bytes, bytes + body.size());
  }
  return seeds;
}

bool write_all(const fs::path& folder, const std::vector<std::vector<std::byte>>& seeds) {
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec) {
    std::fprintf(stderr, "cannot create %s: %s\n", folder.c_str(), ec.message().c_str());
    return false;
  }
  for (std::size_t i = 0; i < seeds.size(); ++i) t::write_bytes(folder / ("seed-" + std::to_string(i)), seeds[i]);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const fs::path root = argv[1];
  return write_all(root / "gguf", gguf_seeds()) && write_all(root / "safetensors", safetensors_seeds()) &&
                 write_all(root / "openai_request", openai_request_seeds())
             ? 0
             : 1;
}
