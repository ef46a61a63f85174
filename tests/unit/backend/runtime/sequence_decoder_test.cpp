// What a sequence's sampled tokens become as text: special tokens are left out unless the request
// asks for their text (a parser of markers that are special tokens, such as Kimi K2's tool calls);
// a grammar too ambiguous to follow ends the sequence with content_filter and says why.
#include <doctest/doctest.h>

#include <string>

#include "edge/backend/grammar/compiled_grammar.h"
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

TEST_CASE("a grammar too ambiguous to follow ends the sequence with content_filter and a message that says why") {
  namespace g = be::grammar;
  auto tok = be::load_tokenizer(edge::testing::stories260k_dir() / "tok512.bin");
  REQUIRE_MESSAGE(tok.ok(), tok.error().message());
  const be::tokenizer& t = **tok;
  // Two rules that both match every nesting of brackets: the stacks double with every '['.
  g::grammar_builder b;
  const g::rule_id one = b.declare("one");
  const g::rule_id other = b.declare("other");
  for (const g::rule_id r : {one, other}) {
    REQUIRE(b.define(r, g::alt({g::literal("x"), g::seq({g::literal("["), b.ref(one), g::literal("]")}),
                                g::seq({g::literal("["), b.ref(other), g::literal("]")})}))
                .ok());
  }
  auto grammar = b.build(b.ref(one));
  REQUIRE(grammar.ok());
  auto compiled = g::compile(*grammar, g::token_vocabulary::create(t));
  REQUIRE_MESSAGE(compiled.ok(), compiled.error().message());
  be::token_id bracket = -1;  // the token spelled "["
  for (be::token_id id = 0; id < t.vocab_size() && bracket < 0; ++id) {
    std::string bytes;
    if (!t.is_special(id)) t.append_token_bytes(id, false, false, bytes);
    if (bytes == "[") bracket = id;
  }
  REQUIRE(bracket >= 0);

  const std::vector<be::token_id> prompt = {*t.bos_id()};
  be::sequence_decoder decoder(t, {}, prompt, {.max_tokens = 64, .grammar = *compiled});
  be::sequence_decoder::step last;
  std::int64_t length = 1;
  while (!decoder.finished()) last = decoder.accept(bracket, ++length);
  // The request's own grammar is at fault, not the engine: its output ends, nothing fails.
  REQUIRE(last.finish == be::finish_reason::content_filter);
  CHECK(last.error.find("too ambiguous") != std::string::npos);
  CHECK(decoder.generated() < 20);
}
