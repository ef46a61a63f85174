// libFuzzer harness: the schema compiler and the matcher. The first byte picks what the rest is:
//   even   a JSON schema: grammar_builder::json_schema, then compile for a small byte-level
//          vocabulary (with merges and special tokens) under tight limits;
//   odd    a grammar's text form (parse_grammar: what a split gateway sends a backend), compiled
//          the same way.
// A compiled grammar is then fed the input's bytes again as tokens: each step the mask is
// filled and the token accepted; whatever the bytes, the matcher must accept exactly the tokens
// its mask allows (an end token: once the grammar may end), and never crash. Errors must come
// with a message (and, from the schema reader, a path under "schema").
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "edge/backend/grammar/compiled_grammar.h"
#include "edge/backend/tokenizer/tokenizer.h"
#include "require.h"
#include "tokenizer_seeds.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

namespace g = edge::backend::grammar;
using edge::fuzz::require;

const std::shared_ptr<const g::token_vocabulary>& vocabulary() {
  static const std::unique_ptr<edge::backend::tokenizer> tok = [] {
    auto made = edge::backend::parse_hf_tokenizer(edge::fuzz::byte_level_tokenizer_json(), R"({"eos_token":"<|eot_id|>"})");
    require(made.ok());
    return std::move(made).value();
  }();
  static const std::shared_ptr<const g::token_vocabulary> v = g::token_vocabulary::create(*tok);
  return v;
}

bool bit(const std::vector<std::uint32_t>& mask, std::int64_t id) {
  return ((mask[static_cast<std::size_t>(id) / 32] >> (id % 32)) & 1u) != 0;
}

void drive(const std::shared_ptr<const g::compiled_grammar>& grammar, std::string_view tokens) {
  const std::int64_t vocab = vocabulary()->size();
  g::grammar_matcher m(grammar);
  std::vector<std::uint32_t> mask(static_cast<std::size_t>(g::mask_words(vocab)));
  for (std::size_t i = 0; i < tokens.size() && i < 64; ++i) {
    m.fill_mask(mask);
    // Two bytes a token: the vocabulary is larger than 256.
    const auto id = static_cast<edge::backend::token_id>(
        (static_cast<std::uint8_t>(tokens[i]) * 7 + (i + 1 < tokens.size() ? static_cast<std::uint8_t>(tokens[i + 1]) : 0)) %
        vocab);
    const bool allowed = bit(mask, id);
    const bool accepted = m.accept(id);
    require(allowed == accepted);
    if (m.ended()) return;
  }
}

constexpr g::compile_limits limits{.max_states = 4000};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  g::grammar_builder b;
  std::optional<g::grammar> grammar;
  if (data[0] % 2 == 0) {
    auto root = b.json_schema(input);
    if (!root.ok()) {
      require(!root.error().message().empty());
      require(root.error().path().starts_with("schema"));
      return 0;
    }
    auto built = b.build(*root);
    require(built.ok());
    grammar = std::move(built).value();
    // The text form reads back as the same grammar.
    auto again = g::parse_grammar(grammar->text());
    require(again.ok() && again->text() == grammar->text());
  } else {
    auto parsed = g::parse_grammar(input);
    if (!parsed.ok()) {
      require(!parsed.error().message().empty());
      return 0;
    }
    grammar = std::move(parsed).value();
  }
  auto compiled = g::compile(*grammar, vocabulary(), limits);
  if (!compiled.ok()) {
    require(!compiled.error().message().empty());
    return 0;
  }
  drive(*compiled, input);
  return 0;
}
