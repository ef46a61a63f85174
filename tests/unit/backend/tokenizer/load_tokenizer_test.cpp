// Choosing the loader by content, finding a model's tokenizer, and sharing one tokenizer
// between threads.
#include <doctest/doctest.h>

#include <thread>
#include <vector>

#include "edge/backend/tokenizer/tokenizer.h"
#include "tokenizer_fixtures.h"

namespace {

using edge::backend::token_id;
using ids = std::vector<token_id>;
namespace fs = std::filesystem;

const ids once_upon = {1, 403, 407, 261, 378};

ids encode_with(const edge::result<std::unique_ptr<edge::backend::tokenizer>>& tok, std::string_view text) {
  REQUIRE_MESSAGE(tok.ok(), tok.error().to_string());
  return (*tok)->encode(text, {});
}

}  // namespace

TEST_CASE("load_tokenizer recognises GGUF, tokenizer.json, llama2.c files and folders by content") {
  const fs::path dir = edge::testing::stories260k_dir();
  CHECK(encode_with(edge::backend::load_tokenizer(dir / "stories260K.gguf"), "Once upon a time") == once_upon);
  CHECK(encode_with(edge::backend::load_tokenizer(dir / "tok512.bin"), "Once upon a time") == once_upon);

  edge::testing::temp_dir tmp;
  // The names say nothing: a GGUF called .json and a tokenizer.json called .bin.
  fs::copy_file(dir / "stories260K.gguf", tmp / "vocab.json");
  CHECK(encode_with(edge::backend::load_tokenizer(tmp / "vocab.json"), "Once upon a time") == once_upon);
  edge::testing::byte_level_json json;
  json.merges = {"a b"};
  edge::testing::write_file(tmp / "tok.bin", "\n  " + json.text());
  CHECK(encode_with(edge::backend::load_tokenizer(tmp / "tok.bin"), "ab") == ids{256});

  fs::create_directories(tmp / "hf");
  edge::testing::write_file(tmp / "hf" / "tokenizer.json", json.text());
  edge::testing::write_file(tmp / "hf" / "tokenizer_config.json", R"({"eos_token":"b"})");
  const auto folder = edge::backend::load_tokenizer(tmp / "hf");
  CHECK(encode_with(folder, "ab") == ids{256});
  REQUIRE((*folder)->eos_ids().size() == 1);
  CHECK((*folder)->eos_ids()[0] == 'b');

  const auto empty_folder = edge::backend::load_tokenizer(tmp.path());
  REQUIRE_FALSE(empty_folder.ok());
  CHECK(empty_folder.error().code() == edge::status_code::not_found);
  CHECK(edge::backend::load_tokenizer(tmp / "missing").error().code() == edge::status_code::not_found);
}

TEST_CASE("load_model_tokenizer finds a model's tokenizer without its weights") {
  const fs::path dir = edge::testing::stories260k_dir();
  CHECK(encode_with(edge::backend::load_model_tokenizer(dir / "stories260K.gguf"), "Once upon a time") == once_upon);
  CHECK(encode_with(edge::backend::load_model_tokenizer(dir / "stories260K.bin"), "Once upon a time") == once_upon);
  CHECK(encode_with(edge::backend::load_model_tokenizer(dir), "Once upon a time") == once_upon);

  edge::testing::temp_dir tmp;
  // A llama2.c checkpoint alone in a folder with tokenizer.bin: found by its header.
  fs::copy_file(dir / "stories260K.bin", tmp / "model.bin");
  CHECK(edge::backend::load_model_tokenizer(tmp / "model.bin").error().code() == edge::status_code::not_found);
  fs::copy_file(dir / "tok512.bin", tmp / "tokenizer.bin");
  CHECK(encode_with(edge::backend::load_model_tokenizer(tmp / "model.bin"), "Once upon a time") == once_upon);
  CHECK(encode_with(edge::backend::load_model_tokenizer(tmp.path()), "Once upon a time") == once_upon);

  fs::create_directories(tmp / "hf");
  edge::testing::byte_level_json json;
  edge::testing::write_file(tmp / "hf" / "tokenizer.json", json.text());
  edge::testing::write_file(tmp / "hf" / "model.safetensors", "not read");
  CHECK(encode_with(edge::backend::load_model_tokenizer(tmp / "hf" / "model.safetensors"), "a") == ids{'a'});
  CHECK(edge::backend::load_model_tokenizer(tmp / "nothing").error().code() == edge::status_code::not_found);
}

TEST_CASE("one tokenizer shared by threads encodes as it does alone") {
  const auto loaded = edge::backend::load_tokenizer(edge::testing::stories260k_dir() / "tok512.bin");
  REQUIRE(loaded.ok());
  edge::testing::byte_level_json json;
  json.merges = {"a b", "ab c", "h e", "l l", "he ll"};
  json.normalizer = R"({"type":"NFC"})";
  const auto byte_level = edge::backend::parse_hf_tokenizer(json.text(), "");
  REQUIRE(byte_level.ok());

  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) {
    texts.push_back("Once upon a time " + std::to_string(i * 7919) + " hello abc e\xCC\x81 \xF0\x9F\x98\x80 " +
                    std::string(static_cast<std::size_t>(i), 'a') + "<s>");
  }
  for (const auto* tok : {loaded->get(), byte_level->get()}) {
    std::vector<ids> expected;
    for (const auto& text : texts) expected.push_back(tok->encode(text, {}));
    std::vector<int> mismatches(4, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (int round = 0; round < 20; ++round) {
          for (std::size_t i = 0; i < texts.size(); ++i) {
            const std::size_t k = (i + static_cast<std::size_t>(t) * 13) % texts.size();
            if (tok->encode(texts[k], {}) != expected[k]) ++mismatches[static_cast<std::size_t>(t)];
            if (tok->decode(expected[k]) != tok->decode(expected[k])) ++mismatches[static_cast<std::size_t>(t)];
          }
        }
      });
    }
    for (auto& thread : threads) thread.join();
    CHECK(mismatches == std::vector<int>(4, 0));
  }
}
