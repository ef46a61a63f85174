// What the grammar tests share: small tokenizers, a matcher driven by random choices, and the
// brute-force check of a mask (each token tried on a fresh matcher that replays the output).
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "edge/backend/grammar/compiled_grammar.h"
#include "edge/backend/grammar/grammar.h"
#include "edge/backend/tokenizer/tokenizer.h"
#include "backend/tokenizer/tokenizer_fixtures.h"

namespace edge::testing {

namespace g = backend::grammar;

// A byte-level tokenizer: the 256 bytes, `merges` over them (as byte_level_json spells them),
// and <|end|> (EOS) and <|call|> as special tokens after them.
inline std::unique_ptr<backend::tokenizer> byte_tokenizer(std::vector<std::string> merges = {}) {
  auto tok = backend::parse_hf_tokenizer(byte_tokenizer_json(std::move(merges)), R"({"eos_token":"<|end|>"})");
  REQUIRE_MESSAGE(tok.ok(), tok.error().message());
  return std::move(tok).value();
}

inline std::shared_ptr<const g::compiled_grammar> compile_or_fail(const g::grammar& grammar,
                                                                 const backend::tokenizer& tok) {
  auto compiled = g::compile(grammar, g::token_vocabulary::create(tok));
  REQUIRE_MESSAGE(compiled.ok(), compiled.error().message());
  return std::move(compiled).value();
}

inline std::shared_ptr<const g::compiled_grammar> compile_schema(std::string_view schema, const backend::tokenizer& tok) {
  g::grammar_builder b;
  auto root = b.json_schema(schema);
  REQUIRE_MESSAGE(root.ok(), root.error().message());
  auto grammar = b.build(*root);
  REQUIRE_MESSAGE(grammar.ok(), grammar.error().message());
  return compile_or_fail(*grammar, tok);
}

inline bool bit(const std::vector<std::uint32_t>& mask, std::int64_t id) {
  return ((mask[static_cast<std::size_t>(id) / 32] >> (id % 32)) & 1u) != 0;
}

// The mask a fresh matcher gives each token after replaying `history`: allowed when it accepts
// the token (an end token: when the history may end).
inline std::vector<std::uint32_t> brute_force_mask(const std::shared_ptr<const g::compiled_grammar>& grammar,
                                                   const std::vector<backend::token_id>& history, std::int64_t vocab) {
  std::vector<std::uint32_t> mask(static_cast<std::size_t>(g::mask_words(vocab)), 0);
  for (backend::token_id t = 0; t < vocab; ++t) {
    g::grammar_matcher m(grammar);
    for (const backend::token_id h : history) REQUIRE(m.accept(h));
    if (m.accept(t)) mask[static_cast<std::size_t>(t) / 32] |= 1u << (t % 32);
  }
  return mask;
}

struct walk_result {
  std::vector<backend::token_id> tokens;
  std::string text;
  bool ended = false;
};

// Picks allowed tokens at random until an end token is picked (or `max_steps`), checking every
// mask against the brute force when `check` is set. End tokens are picked with probability
// `end_bias` whenever allowed, so that walks finish.
inline walk_result random_walk(const std::shared_ptr<const g::compiled_grammar>& grammar, const backend::tokenizer& tok,
                               std::uint64_t seed, int max_steps, bool check, double end_bias = 0.3) {
  std::mt19937_64 rng(seed);
  g::grammar_matcher m(grammar);
  const std::int64_t vocab = tok.vocab_size();
  std::vector<std::uint32_t> mask(static_cast<std::size_t>(g::mask_words(vocab)));
  walk_result out;
  for (int step = 0; step < max_steps; ++step) {
    const bool any = m.fill_mask(mask);
    if (check) {
      const auto expected = brute_force_mask(grammar, out.tokens, vocab);
      for (std::int64_t t = 0; t < vocab; ++t) {
        if (bit(mask, t) != bit(expected, t)) {
          FAIL_CHECK("step " << step << " after '" << out.text << "': token " << t << " ('" << tok.token_text(static_cast<backend::token_id>(t))
                             << "') is " << (bit(mask, t) ? "allowed" : "refused") << " by the mask but "
                             << (bit(expected, t) ? "accepted" : "refused") << " by the matcher");
          return out;
        }
      }
    }
    REQUIRE(any);
    std::vector<backend::token_id> allowed;
    std::vector<backend::token_id> ends;
    for (std::int64_t t = 0; t < vocab; ++t) {
      if (!bit(mask, t)) continue;
      const auto id = static_cast<backend::token_id>(t);
      const auto eos = tok.eos_ids();
      (std::find(eos.begin(), eos.end(), id) != eos.end() ? ends : allowed).push_back(id);
    }
    std::uniform_real_distribution<double> coin(0.0, 1.0);
    if (!ends.empty() && (allowed.empty() || coin(rng) < end_bias)) {
      REQUIRE(m.accept(ends.front()));
      out.ended = true;
      return out;
    }
    const backend::token_id pick = allowed[std::uniform_int_distribution<std::size_t>(0, allowed.size() - 1)(rng)];
    REQUIRE(m.accept(pick));
    out.tokens.push_back(pick);
    tok.append_token_bytes(pick, false, true, out.text);
  }
  return out;
}

}  // namespace edge::testing
