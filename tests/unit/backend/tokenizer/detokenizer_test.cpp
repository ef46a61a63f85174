// Decoding never emits half a UTF-8 character, and invalid bytes become U+FFFD.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "edge/backend/tokenizer/tokenizer.h"
#include "tokenizer_fixtures.h"

namespace {

using edge::backend::token_id;
using ids = std::vector<token_id>;

constexpr std::string_view replacement = "\xEF\xBF\xBD";

std::unique_ptr<edge::backend::tokenizer> stories() {
  auto tok = edge::backend::load_llama2c_tokenizer(edge::testing::stories260k_dir() / "tok512.bin", 512);
  REQUIRE_MESSAGE(tok.ok(), tok.error().to_string());
  return std::move(tok).value();
}

token_id byte_token(unsigned char b) { return 3 + b; }  // stories260K's <0xXX> ids

bool is_complete_utf8(const std::string& text) {
  std::size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    const std::size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
    if (n == 0 || i + n > text.size()) return false;
    for (std::size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

}  // namespace

TEST_CASE("incremental detokenizer: pieces end on character boundaries and add up to decode()") {
  const auto tok = stories();
  const std::string text = "Once upon a time \xF0\x9F\x98\x80 caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87.\nLily";
  const ids encoded = tok->encode(text, {});
  edge::backend::incremental_detokenizer detok(*tok, false);
  std::string streamed;
  std::size_t empty_pieces = 0;
  for (const token_id id : encoded) {
    const std::string piece = detok.push(id);
    CHECK(is_complete_utf8(piece));
    if (piece.empty()) ++empty_pieces;
    streamed += piece;
  }
  streamed += detok.finish();
  CHECK(streamed == text);
  CHECK(streamed == tok->decode(encoded));
  // The emoji's first three byte tokens and BOS produce nothing on their own.
  CHECK(empty_pieces >= 4);
}

TEST_CASE("incremental detokenizer: the first generated token after BOS loses its space") {
  const auto tok = stories();
  edge::backend::incremental_detokenizer after_bos(*tok, true);
  CHECK(after_bos.push(403) == "Once");
  CHECK(after_bos.push(407) == " upon");
  edge::backend::incremental_detokenizer mid_text(*tok, false);
  CHECK(mid_text.push(403) == " Once");
}

TEST_CASE("incremental detokenizer: invalid and unfinished bytes become U+FFFD") {
  const auto tok = stories();
  edge::backend::incremental_detokenizer detok(*tok);
  CHECK(detok.push(byte_token(0xFF)) == replacement);
  CHECK(detok.push(byte_token(0xE2)).empty());
  CHECK(detok.push(byte_token(0x82)).empty());
  // 'A' cannot continue the character: the two held bytes are one U+FFFD, then the letter.
  CHECK(detok.push(byte_token('A')) == std::string(replacement) + "A");
  CHECK(detok.push(byte_token(0xF0)).empty());
  CHECK(detok.finish() == replacement);
  CHECK(detok.finish().empty());
}

TEST_CASE("decode: invalid sequences become U+FFFD, one per maximal ill-formed part") {
  const auto tok = stories();
  CHECK(tok->decode(ids{byte_token(0xC3)}) == replacement);
  CHECK(tok->decode(ids{byte_token(0xE2), byte_token(0x82), byte_token('x')}) == std::string(replacement) + "x");
  // An overlong encoding of '/' and a surrogate are each rejected byte by byte.
  CHECK(tok->decode(ids{byte_token(0xC0), byte_token(0xAF)}) == std::string(replacement) + std::string(replacement));
  CHECK(tok->decode(ids{byte_token(0xED), byte_token(0xA0), byte_token(0x80)}) ==
        std::string(replacement) + std::string(replacement) + std::string(replacement));
  CHECK(tok->decode(ids{byte_token(0xF0), byte_token(0x9F), byte_token(0x98), byte_token(0x80)}) == "\xF0\x9F\x98\x80");
  // Ids outside the vocabulary decode to nothing rather than failing.
  CHECK(tok->decode(ids{403, 100000, -1, 407}) == "Once upon");
}
