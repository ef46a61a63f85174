// libFuzzer harness: the schema compiler, the grammar text form, and compiling to token masks.
// The first byte picks what the rest is, up to a NUL byte (after it: the matcher's choices;
// without one, the text's own bytes are the choices):
//   even   a JSON schema: grammar_builder::json_schema and build, the keyword checks' errors
//          (a message, a path under "schema"), and the text form read back as the same grammar;
//   odd    a grammar's text form (parse_grammar: what a split gateway sends a backend), which must
//          read back the same from its own canonical text.
// Every input runs that far. One input in eight (by a hash of its bytes, so that also one in
// eight of the mutations of an input that compiles does: the runs stay fast however the corpus
// grows; by size, most mutations kept it) also compiles the grammar for a small byte-level
// vocabulary (JSON merges, special tokens; made once) under a small state cap, and walks the
// matcher: each choice byte picks a token among those the mask allows, or any token, which the
// matcher must accept exactly when the mask allows it, changing nothing when it refuses. End
// tokens are allowed whenever the grammar may end (in a schema's grammar only then); the text
// of a schema's grammar that ends must be JSON, and re-parse from the tokenizer's own tokens.
#include <boost/json/parse.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "edge/backend/grammar/compiled_grammar.h"
#include "edge/backend/tokenizer/tokenizer.h"
#include "require.h"
#include "tokenizer_fixtures.h"

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv);
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

namespace be = edge::backend;
namespace g = edge::backend::grammar;
using edge::fuzz::require;

// Set once by LLVMFuzzerInitialize, read-only afterwards (the fuzzer runs one input at a time).
std::unique_ptr<be::tokenizer> tokenizer;
std::shared_ptr<const g::token_vocabulary> vocabulary;

// Compiling costs about 0.1 ms a state under the sanitizers: 4000 states made the fuzzer run
// about 160 inputs a second. 256 still holds objects of a few properties, enums, bounded
// integers and recursive rules; larger grammars take the too-large error path.
constexpr g::compile_limits limits{.max_states = 256};
constexpr std::size_t compile_one_in = 8;
constexpr std::size_t max_steps = 64;

bool bit(const std::vector<std::uint32_t>& mask, std::int64_t id) {
  return ((mask[static_cast<std::size_t>(id) / 32] >> (id % 32)) & 1u) != 0;
}

bool is_end(be::token_id id) {
  for (const be::token_id e : tokenizer->eos_ids()) {
    if (e == id) return true;
  }
  return false;
}

// The output a schema's grammar matched is JSON (RFC 8259, UTF-8 and escapes included; Boost.JSON
// reads numbers of any size, as a model may write them within a schema's bounds).
void require_json(const std::string& text) {
  boost::system::error_code error;
  (void)boost::json::parse(text, error);
  require(!error);
}

// The text re-parses however it is split: the tokenizer's own tokens of it (not those the walk
// picked) are accepted one by one by a fresh matcher, which may then end.
void require_reparses(const std::shared_ptr<const g::compiled_grammar>& grammar, const std::string& text) {
  const std::vector<be::token_id> ids = tokenizer->encode(text, {.add_bos = false, .parse_special = false});
  g::grammar_matcher m(grammar);
  std::string spelled;
  for (const be::token_id id : ids) {
    require(m.accept(id));
    tokenizer->append_token_bytes(id, false, false, spelled);
  }
  require(spelled == text);
  require(m.can_end());
}

void walk(const std::shared_ptr<const g::compiled_grammar>& grammar, std::string_view choices, bool json) {
  const std::int64_t vocab = vocabulary->size();
  g::grammar_matcher m(grammar);
  std::vector<std::uint32_t> mask(static_cast<std::size_t>(g::mask_words(vocab)));
  std::vector<std::uint32_t> again(mask.size());
  std::vector<be::token_id> allowed;
  std::string text;
  for (std::size_t i = 0; i < choices.size() && i < max_steps; ++i) {
    const bool any = m.fill_mask(mask);
    if (m.failed()) {
      // Too ambiguous to follow (compile_limits' parses): nothing is allowed or taken any more.
      require(!any && !m.accept(tokenizer->eos_ids().front()));
      return;
    }
    allowed.clear();
    bool end_allowed = false;
    bool only_ends = true;
    for (std::int64_t t = 0; t < vocab; ++t) {
      if (!bit(mask, t)) continue;
      const auto id = static_cast<be::token_id>(t);
      allowed.push_back(id);
      if (is_end(id)) {
        end_allowed = true;
      } else {
        only_ends = false;
      }
    }
    require(any == !allowed.empty());
    const bool could_end = m.can_end();
    if (could_end) {
      for (const be::token_id e : tokenizer->eos_ids()) require(bit(mask, e));
    }
    // A grammar text may name an end token as its own special token; a schema's never does.
    if (json) require(end_allowed == could_end);
    if (m.must_end()) require(only_ends);
    const auto choice = static_cast<std::uint8_t>(choices[i]);
    be::token_id id = 0;
    if (choice % 4 == 3) {
      // Any token (a second byte widens the pick past 256 ids).
      const std::uint8_t next = i + 1 < choices.size() ? static_cast<std::uint8_t>(choices[i + 1]) : 0;
      id = static_cast<be::token_id>((choice / 4 * 256 + next) % vocab);
      const bool accepted = m.accept(id);
      if (m.failed()) return;
      require(accepted == bit(mask, id));
      if (!accepted) {
        m.fill_mask(again);
        require(again == mask);
        continue;
      }
    } else {
      if (allowed.empty()) return;
      // Ending when a choice of 0 mod 4 meets a grammar that may end, so that walks finish.
      if (could_end && choice % 4 == 0) {
        id = tokenizer->eos_ids().front();
      } else {
        id = allowed[choice / 4 % allowed.size()];
      }
      require(m.accept(id) || m.failed());
      if (m.failed()) return;
    }
    if (m.ended()) {
      require(is_end(id) && could_end);
      if (json) {
        require_json(text);
        require_reparses(grammar, text);
      }
      return;
    }
    // An end token the grammar names continues it (the grammar's special token comes first).
    require(!json || !is_end(id));
    tokenizer->append_token_bytes(id, false, false, text);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // JSON pieces that cross rule boundaries (a token's bytes leave a rule part way: the masks'
  // hardest part), and a two-byte character.
  std::vector<std::string> merges = edge::testing::json_merges();
  merges.push_back(edge::testing::byte_char(0xC3) + " " + edge::testing::byte_char(0xA9));
  auto made =
      be::parse_hf_tokenizer(edge::testing::byte_tokenizer_json(std::move(merges)), R"({"eos_token":"<|end|>"})");
  require(made.ok());
  tokenizer = std::move(made).value();
  vocabulary = g::token_vocabulary::create(*tokenizer);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::size_t split = input.find('\0');
  const std::string_view text = input.substr(0, split);
  const std::string_view choices = split == std::string_view::npos ? text : input.substr(split + 1);
  const bool json = data[0] % 2 == 0;
  g::grammar_builder b;
  std::optional<g::grammar> grammar;
  if (json) {
    auto root = b.json_schema(text);
    if (!root.ok()) {
      require(!root.error().message().empty());
      require(root.error().path().starts_with("schema"));
      return 0;
    }
    auto built = b.build(*root);
    require(built.ok());
    grammar = std::move(built).value();
  } else {
    auto parsed = g::parse_grammar(text);
    if (!parsed.ok()) {
      require(!parsed.error().message().empty());
      return 0;
    }
    grammar = std::move(parsed).value();
  }
  // The text form reads back as the same grammar.
  auto again = g::parse_grammar(grammar->text());
  require(again.ok() && again->text() == grammar->text());

  const std::string_view whole(reinterpret_cast<const char*>(data), size);
  if (std::hash<std::string_view>{}(whole) % compile_one_in != 0) return 0;
  auto compiled = g::compile(*grammar, vocabulary, limits);
  if (!compiled.ok()) {
    require(!compiled.error().message().empty());
    return 0;
  }
  walk(*compiled, choices, json);
  return 0;
}
