// What a sequence's sampled tokens become as text: special tokens are left out unless the request
// asks for their text (a parser of markers that are special tokens, such as Kimi K2's tool calls).
#include <doctest/doctest.h>

#include "edge/backend/runtime/sequence_decoder.h"
#include "test_support.h"

namespace be = edge::backend;

TEST_CASE("special tokens add text only when skip_special_tokens is off") {
  auto tok = be::load_tokenizer(edge::testing::stories260k_dir() / "tok512.bin");
  REQUIRE_MESSAGE(tok.ok(), tok.error().message());
  const be::tokenizer& t = **tok;
  const be::token_id unknown = 0;  // "<unk>": special, and no end of the sequence
  REQUIRE(t.is_special(unknown));
  const be::token_id word = t.encode("cat", {.add_bos = false, .parse_special = false}).front();
  const std::vector<be::token_id> prompt = {*t.bos_id()};
  for (const bool skip : {true, false}) {
    CAPTURE(skip);
    be::sequence_decoder decoder(t, {}, prompt, {.max_tokens = 8, .skip_special_tokens = skip});
    std::string text = decoder.accept(word, 2).text;
    text += decoder.accept(unknown, 3).text;
    text += decoder.accept(word, 4).text;
    std::string first;
    std::string special;
    std::string again;
    t.append_token_bytes(word, /*after_bos=*/true, /*with_special=*/false, first);
    t.append_token_bytes(unknown, /*after_bos=*/false, /*with_special=*/true, special);
    t.append_token_bytes(word, /*after_bos=*/false, /*with_special=*/false, again);
    REQUIRE_FALSE(special.empty());
    CHECK(text == first + (skip ? "" : special) + again);
  }
}
