// What every loaded tokenizer promises, whatever its vocabulary, checked by the tokenizer
// fuzzers: encode() gives ids inside the vocabulary; decode() gives valid UTF-8; the
// incremental detokenizer never emits part of a character and, piece by piece, gives exactly
// what decode() gives for the whole sequence. A broken promise aborts, which libFuzzer reports
// as a crash.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "edge/backend/tokenizer/tokenizer.h"
#include "require.h"

namespace edge::fuzz {

// Well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF), written out
// from the Unicode standard's table 3-7 rather than taken from the code under test.
inline bool is_utf8(std::string_view text) {
  std::size_t i = 0;
  const auto byte = [&](std::size_t at) { return static_cast<unsigned char>(text[at]); };
  const auto in = [](unsigned char b, unsigned char low, unsigned char high) { return b >= low && b <= high; };
  while (i < text.size()) {
    const unsigned char b0 = byte(i);
    std::size_t length = 0;
    unsigned char low = 0x80;
    unsigned char high = 0xBF;  // the second byte's range
    if (b0 < 0x80) {
      length = 1;
    } else if (in(b0, 0xC2, 0xDF)) {
      length = 2;
    } else if (in(b0, 0xE0, 0xEF)) {
      length = 3;
      if (b0 == 0xE0) low = 0xA0;
      if (b0 == 0xED) high = 0x9F;
    } else if (in(b0, 0xF0, 0xF4)) {
      length = 4;
      if (b0 == 0xF0) low = 0x90;
      if (b0 == 0xF4) high = 0x8F;
    } else {
      return false;
    }
    if (text.size() - i < length) return false;
    if (length > 1 && !in(byte(i + 1), low, high)) return false;
    for (std::size_t k = 2; k < length; ++k) {
      if (!in(byte(i + k), 0x80, 0xBF)) return false;
    }
    i += length;
  }
  return true;
}

inline void check_decoding(const backend::tokenizer& tok, std::span<const backend::token_id> ids, bool with_special) {
  const std::string whole = tok.decode(ids, with_special);
  require(is_utf8(whole));
  // As the engine streams a completion: the first generated token directly follows BOS, which
  // is how decode() treats the first id.
  backend::incremental_detokenizer pieces(tok, /*prompt_ends_with_bos=*/true, with_special);
  std::string joined;
  for (const backend::token_id id : ids) {
    const std::string piece = pieces.push(id);
    require(is_utf8(piece));
    joined += piece;
  }
  const std::string rest = pieces.finish();
  require(is_utf8(rest));
  joined += rest;
  require(joined == whole);
}

inline std::vector<backend::token_id> check_encoding(const backend::tokenizer& tok, std::string_view text,
                                                     const backend::encode_options& options) {
  const std::vector<backend::token_id> ids = tok.encode(text, options);
  for (const backend::token_id id : ids) require(id >= 0 && id < tok.vocab_size());
  check_decoding(tok, ids, false);
  check_decoding(tok, ids, true);
  return ids;
}

}  // namespace edge::fuzz
