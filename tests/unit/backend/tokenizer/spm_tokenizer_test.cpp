// SentencePiece BPE by score: the stories260K vocabulary from its three sources must encode
// and decode exactly as the fixture's README (llama2.c's reference implementation) says.
#include <doctest/doctest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "edge/backend/io/gguf.h"
#include "edge/backend/tokenizer/tokenizer.h"
#include "tokenizer_fixtures.h"

namespace {

using edge::backend::token_id;
using ids = std::vector<token_id>;

const ids readme_prompt = {1, 403, 407, 261, 378};

// "Ids at positions 1..64" of the README.
ids readme_reference_ids() {
  const std::string text =
      "403 407 261 378 432 383 286 261 376 298 315 421 395 317 426 338 401 396 267 337 410 408 419 292 411 322 265 "
      "282 295 433 426 385 328 432 358 394 261 370 432 352 266 268 388 426 338 391 266 267 337 335 312 432 398 312 "
      "286 267 414 270 333 415 426 13 438 310";
  std::istringstream in(text);
  ids out;
  for (token_id id; in >> id;) out.push_back(id);
  return out;
}

const std::string readme_reference_text =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a "
    "big, red ball. She wanted to play with it, but it was too high.\nLily";

std::unique_ptr<edge::backend::tokenizer> from_tok512() {
  auto tok = edge::backend::load_llama2c_tokenizer(edge::testing::stories260k_dir() / "tok512.bin", 512);
  REQUIRE_MESSAGE(tok.ok(), tok.error().to_string());
  return std::move(tok).value();
}

std::unique_ptr<edge::backend::tokenizer> from_gguf_metadata() {
  auto tok = edge::backend::tokenizer_from_gguf(edge::testing::stories_gguf_vocabulary());
  REQUIRE_MESSAGE(tok.ok(), tok.error().to_string());
  return std::move(tok).value();
}

void check_stories_behaviour(const edge::backend::tokenizer& tok) {
  CHECK(tok.vocab_size() == 512);
  CHECK(tok.bos_id() == 1);
  REQUIRE(tok.eos_ids().size() == 1);
  CHECK(tok.eos_ids()[0] == 2);
  CHECK(tok.encode("Once upon a time", {}) == readme_prompt);
  CHECK(tok.encode("Once upon a time", {.add_bos = false}) == ids(readme_prompt.begin() + 1, readme_prompt.end()));
  CHECK(tok.find_token("\xE2\x96\x81Once") == 403);
  CHECK(tok.token_text(403) == "\xE2\x96\x81Once");

  const ids reference = readme_reference_ids();
  REQUIRE(reference.size() == 64);
  CHECK(tok.decode(reference) == readme_reference_text);
  // With BOS in front, the first piece still loses its dummy-prefix space.
  ids with_bos = {1};
  with_bos.insert(with_bos.end(), reference.begin(), reference.end());
  CHECK(tok.decode(with_bos) == readme_reference_text);
  CHECK(tok.decode(with_bos, true) == "<s>" + readme_reference_text);

  // The reference text encodes back to the reference ids: the greedy continuation is made of
  // the pieces BPE would choose.
  CHECK(tok.encode(readme_reference_text, {.add_bos = false}) == reference);
}

}  // namespace

TEST_CASE("stories260K: llama2.c tok512.bin encodes and decodes as the README says") {
  check_stories_behaviour(*from_tok512());
}

TEST_CASE("stories260K: a GGUF vocabulary built in the test behaves identically") {
  check_stories_behaviour(*from_gguf_metadata());
}

TEST_CASE("stories260K: the real stories260K.gguf") {
  auto file = edge::backend::load_gguf(edge::testing::stories260k_dir() / "stories260K.gguf");
  REQUIRE_MESSAGE(file.ok(), file.error().to_string());
  auto tok = edge::backend::tokenizer_from_gguf(*file);
  REQUIRE_MESSAGE(tok.ok(), tok.error().to_string());
  check_stories_behaviour(**tok);
}

TEST_CASE("SentencePiece: characters outside the vocabulary fall back to byte tokens") {
  const auto tok = from_tok512();
  // "ü" (C3 BC) has no piece, so it is two byte tokens (<0xXX> is id 3 + XX); "é" has one.
  CHECK(tok->encode("\xC3\xBC", {.add_bos = false}) == ids{410, 3 + 0xC3, 3 + 0xBC});
  CHECK(tok->encode("\xC3\xA9", {.add_bos = false}) == ids{410, 485});
  for (const std::string text : {"caf\xC3\xA9 \xF0\x9F\x98\x80 na\xC3\xAFve", "\xE4\xB8\xAD\xE6\x96\x87", "tab\there\nnew"}) {
    CHECK(tok->decode(tok->encode(text, {})) == text);
  }
  // A newline has no piece of its own in tok512: it is <0x0A> (id 13, as in the README).
  const ids newline = tok->encode("\n", {.add_bos = false});
  CHECK(newline.back() == 13);
}

TEST_CASE("SentencePiece: the dummy prefix, empty text and repeated spaces") {
  const auto tok = from_tok512();
  CHECK(tok->encode("", {}) == ids{1});
  CHECK(tok->encode("", {.add_bos = false}).empty());
  // " a" and "a" differ: the dummy prefix makes the first one two spaces.
  CHECK(tok->encode("a", {.add_bos = false}) == ids{261});
  CHECK(tok->encode(" a", {.add_bos = false}) != ids{261});
  for (const std::string text : {"  two  spaces  ", " leading", "trailing "}) {
    CHECK(tok->decode(tok->encode(text, {})) == text);
  }
}

TEST_CASE("SentencePiece: control tokens in the text only with parse_special") {
  const auto tok = from_tok512();
  const ids parsed = tok->encode("Once</s>", {.add_bos = false});
  REQUIRE(!parsed.empty());
  CHECK(parsed.back() == 2);
  const ids literal = tok->encode("Once</s>", {.add_bos = false, .parse_special = false});
  CHECK(std::find(literal.begin(), literal.end(), 2) == literal.end());
  CHECK(tok->decode(literal) == "Once</s>");
  CHECK(tok->is_special(1));
  CHECK(tok->is_special(2));
  CHECK_FALSE(tok->is_special(403));
  // The text after a special token gets its own dummy prefix, as in SentencePiece per segment.
  CHECK(tok->encode("<s>Once", {.add_bos = false}) == ids{1, 403});
}

TEST_CASE("llama2.c tokenizer files: truncation and bad sizes are data_loss") {
  const std::string bytes = edge::testing::read_file(edge::testing::stories260k_dir() / "tok512.bin");
  edge::testing::temp_dir dir;
  for (const std::size_t cut : {std::size_t{2}, std::size_t{100}, bytes.size() - 1}) {
    edge::testing::write_file(dir / "cut.bin", bytes.substr(0, cut));
    const auto tok = edge::backend::load_llama2c_tokenizer(dir / "cut.bin", 512);
    REQUIRE_FALSE(tok.ok());
    CHECK(tok.error().code() == edge::status_code::data_loss);
    CHECK(tok.error().message().find("cut.bin") != std::string::npos);
    CHECK(tok.error().message().find("truncated") != std::string::npos);
  }
  // Asking for more tokens than the file has is truncation too.
  edge::testing::write_file(dir / "whole.bin", bytes);
  const auto too_many = edge::backend::load_llama2c_tokenizer(dir / "whole.bin", 600);
  REQUIRE_FALSE(too_many.ok());
  CHECK(too_many.error().code() == edge::status_code::data_loss);
  // A piece longer than the header's max_token_length is corruption.
  std::string corrupt = bytes;
  corrupt[0] = 1;
  edge::testing::write_file(dir / "corrupt.bin", corrupt);
  const auto bad = edge::backend::load_llama2c_tokenizer(dir / "corrupt.bin", 512);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().code() == edge::status_code::data_loss);
  const auto missing = edge::backend::load_llama2c_tokenizer(dir / "nothing.bin", 512);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().code() == edge::status_code::not_found);
}

TEST_CASE("llama2.c tokenizer bytes parse as the file loads; errors name no file") {
  const std::string bytes = edge::testing::read_file(edge::testing::stories260k_dir() / "tok512.bin");
  const auto tok = edge::backend::parse_llama2c_tokenizer(bytes, 0);
  REQUIRE(tok.ok());
  CHECK((*tok)->vocab_size() == 512);
  CHECK((*tok)->encode(readme_reference_text, {}) == from_tok512()->encode(readme_reference_text, {}));
  const auto cut = edge::backend::parse_llama2c_tokenizer(bytes.substr(0, 100), 512);
  REQUIRE_FALSE(cut.ok());
  CHECK(cut.error().code() == edge::status_code::data_loss);
  CHECK(cut.error().message().starts_with("truncated"));
}

TEST_CASE("GGUF SentencePiece vocabulary: flags and validation") {
  auto file = edge::testing::stories_gguf_vocabulary();
  file.metadata["tokenizer.ggml.add_bos_token"] = {false};
  auto no_bos = edge::backend::tokenizer_from_gguf(file);
  REQUIRE(no_bos.ok());
  CHECK((*no_bos)->encode("Once upon a time", {}) == ids{403, 407, 261, 378});

  file.metadata["tokenizer.ggml.add_space_prefix"] = {false};
  auto no_prefix = edge::backend::tokenizer_from_gguf(file);
  REQUIRE(no_prefix.ok());
  CHECK((*no_prefix)->encode("Once", {}).front() != 403);

  auto broken = edge::testing::stories_gguf_vocabulary();
  std::get<edge::backend::gguf_array>(broken.metadata["tokenizer.ggml.scores"].value).pop_back();
  CHECK_FALSE(edge::backend::tokenizer_from_gguf(broken).ok());

  auto unknown_model = edge::testing::stories_gguf_vocabulary();
  unknown_model.metadata["tokenizer.ggml.model"] = edge::testing::gguf_string("bert");
  const auto refused = edge::backend::tokenizer_from_gguf(unknown_model);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().code() == edge::status_code::unimplemented);
  CHECK_FALSE(edge::backend::tokenizer_from_gguf(edge::backend::gguf_file{}).ok());
}

namespace {

// A SentencePiece vocabulary in GGUF form from (piece, score) pairs after <unk>, <s>, </s>.
std::unique_ptr<edge::backend::tokenizer> small_spm(const std::vector<std::pair<std::string, double>>& pieces,
                                                    bool space_prefix) {
  edge::backend::gguf_file file;
  edge::backend::gguf_array tokens;
  edge::backend::gguf_array scores;
  edge::backend::gguf_array types;
  const auto add = [&](const std::string& text, double score, std::int64_t type) {
    tokens.emplace_back().value = text;
    scores.emplace_back().value = score;
    types.emplace_back().value = type;
  };
  add("<unk>", 0, 2);
  add("<s>", 0, 3);
  add("</s>", 0, 3);
  for (const auto& [text, score] : pieces) add(text, score, 1);
  file.metadata["tokenizer.ggml.model"].value = std::string("llama");
  file.metadata["tokenizer.ggml.tokens"].value = tokens;
  file.metadata["tokenizer.ggml.scores"].value = scores;
  file.metadata["tokenizer.ggml.token_type"].value = types;
  file.metadata["tokenizer.ggml.add_space_prefix"].value = space_prefix;
  auto tok = edge::backend::tokenizer_from_gguf(file);
  REQUIRE_MESSAGE(tok.ok(), tok.error().to_string());
  return std::move(tok).value();
}

}  // namespace

TEST_CASE("SentencePiece BPE: the highest-scoring pair merges first, the leftmost on a tie") {
  // ids: a 3, b 4, c 5, ab 6, bc 7, aa 8
  const auto tok = small_spm({{"a", -10}, {"b", -10}, {"c", -10}, {"ab", -2}, {"bc", -1}, {"aa", -3}}, false);
  CHECK(tok->encode("abc", {.add_bos = false}) == ids{3, 7});
  CHECK(tok->encode("aaa", {.add_bos = false}) == ids{8, 3});
  CHECK(tok->encode("aaaaa", {.add_bos = false}) == ids{8, 8, 3});
  // Without a byte fallback or the character in the vocabulary, <unk>.
  CHECK(tok->encode("axa", {.add_bos = false}) == ids{3, 0, 3});
}
