// A grammar compiled for one tokenizer, and the per-sequence matcher that turns it into token
// masks, step by step.
//
// Compiling: every rule becomes a byte automaton (a DFA whose edges are byte classes, calls of
// other rules and special tokens); the grammar runs as a pushdown automaton over them (a stack
// of return states per parse, several parses at once where the grammar is ambiguous). Then,
// from every automaton state, the vocabulary's trie is walked with the rule's own stack only:
// each token is accepted there (its bytes stay inside the rule), rejected, or depends on what
// follows the rule (it leaves the rule part way: the trie nodes where that can happen are kept,
// and the tokens below them are the ones to check). That is the position's token table,
// computed off the engine thread and shared by every request of the grammar, and by every state
// that behaves alike within the longest token's bytes (compiled_grammar.cpp says how), so that
// what compiling costs follows what the grammar does within a token's reach, not its states.
//
// Matching, per step: the mask is the union, over the parses' current states, of their tables'
// accepted tokens, plus the tokens below their exit nodes whose rest the parse's real stack
// accepts (usually a few dozen trie nodes: what can follow a closing quote or brace), plus the
// special tokens the grammar names there, plus the end tokens once the grammar may end. Accepting a token runs its bytes
// through the pushdown automaton.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "edge/backend/grammar/grammar.h"
#include "edge/backend/tokenizer/tokenizer.h"

namespace edge::backend::grammar {

struct vocabulary_data;
struct compiled_data;

// What compiling and matching need of a tokenizer: each token's bytes and the trie over them
// (special tokens and tokens of no bytes left out), the special tokens by text, the end
// tokens. Made once per tokenizer; immutable, shared.
class token_vocabulary {
 public:
  static std::shared_ptr<const token_vocabulary> create(const tokenizer& tok);
  ~token_vocabulary();

  const tokenizer& source() const { return tok_; }
  std::int64_t size() const;             // token ids the tokenizer has
  std::int64_t max_token_bytes() const;  // the longest plain token
  std::int64_t trie_nodes() const;
  const vocabulary_data& data() const { return *data_; }

 private:
  token_vocabulary(const tokenizer& tok, std::unique_ptr<vocabulary_data> data);
  const tokenizer& tok_;
  std::unique_ptr<vocabulary_data> data_;
};

// Limits that keep a hostile grammar from taking the compiler's memory and time.
struct compile_limits {
  std::int64_t max_states = 250'000;  // automaton states, all rules together
  // Parses (a position in a rule and the stack of rules that called it) followed at once. An
  // ambiguous grammar can double them with every byte; past these limits compiling fails, and a
  // matcher fails (failed()) instead of stalling its engine thread.
  std::int64_t max_parses = 4096;             // in one set: after one byte, or one closure
  std::int64_t max_parse_work = 2'000'000;    // made by one fill_mask or accept call
  // What one compile may spend and keep, whatever the vocabulary: past these it fails at once
  // instead of holding a compile thread for seconds or the cache's memory. Work counts the steps
  // of determinizing the rules (an NFA edge looked at), of sorting the states into classes that
  // share a token table (a signature entry) and of the tables' walks over the vocabulary's trie
  // (a byte followed from one parse); docs/performance.md says what a step costs. Memory bounds
  // compile_stats::memory_bytes, and each stage on the way (the NFA, the rules' DFAs): a compile
  // holds at most two stages at once.
  std::int64_t max_compile_work = 16'000'000;
  std::int64_t max_memory_bytes = std::int64_t{32} << 20;
};

struct compile_stats {
  std::int64_t rules = 0;
  std::int64_t states = 0;
  std::int64_t tables = 0;  // token tables kept (states that share one count once)
  std::int64_t work = 0;    // compile_limits::max_compile_work's steps spent
  // Every byte the compiled grammar holds (its automaton, tables and pools, by their vectors'
  // capacities), not the vocabulary it shares with the tokenizer's other grammars: what a cache
  // of compiled grammars bounded in bytes counts.
  std::int64_t memory_bytes = 0;
  double seconds = 0.0;
};

class compiled_grammar {
 public:
  ~compiled_grammar();
  const token_vocabulary& vocabulary() const { return *vocabulary_; }
  const compile_stats& stats() const { return stats_; }
  const compiled_data& data() const { return *data_; }

 private:
  friend result<std::shared_ptr<const compiled_grammar>, grammar_error> compile(
      const grammar& g, std::shared_ptr<const token_vocabulary> vocabulary, const compile_limits& limits);
  compiled_grammar(std::shared_ptr<const token_vocabulary> vocabulary, std::unique_ptr<compiled_data> data,
                   compile_stats stats);
  std::shared_ptr<const token_vocabulary> vocabulary_;
  std::unique_ptr<compiled_data> data_;
  compile_stats stats_;
};

// Errors: invalid_argument (a special token the vocabulary lacks, a left-recursive rule, a
// grammar that matches no finite output, one larger than `limits`).
result<std::shared_ptr<const compiled_grammar>, grammar_error> compile(const grammar& g,
                                                                      std::shared_ptr<const token_vocabulary> vocabulary,
                                                                      const compile_limits& limits = {});

// Words of a token mask over `vocab` ids: bit (id % 32) of word id / 32.
constexpr std::int64_t mask_words(std::int64_t vocab) { return (vocab + 31) / 32; }

// One sequence's position in a compiled grammar. Owned by whoever drives the sequence (the
// engine thread); the grammar is shared.
class grammar_matcher {
 public:
  // `end_tokens`: besides the tokenizer's EOS tokens, what ends the output (stop token ids).
  grammar_matcher(std::shared_ptr<const compiled_grammar> g, std::span<const token_id> end_tokens = {});
  ~grammar_matcher();
  grammar_matcher(grammar_matcher&&) noexcept;
  grammar_matcher& operator=(grammar_matcher&&) noexcept;

  // Sets, in `allowed` ([mask_words(vocab)]; cleared first; ids past it ignored), the bit of
  // every token that may come next: the grammar's continuations, and the end tokens once the
  // grammar may end (only they, once it cannot go on). False when no token at all is allowed
  // (the vocabulary cannot spell any continuation, or failed()).
  bool fill_mask(std::span<std::uint32_t> allowed);
  // Advances over `id`; false (nothing changes) when the grammar does not allow it, or when
  // following it passed a limit (then failed()).
  bool accept(token_id id);

  bool can_end() const;   // the output so far is a whole match
  bool must_end() const;  // and nothing may follow it
  bool ended() const { return ended_; }  // an end token was accepted
  // The grammar is too ambiguous to follow from here (compile_limits' parses): fill_mask allows
  // nothing and accept takes nothing from now on. The message says why.
  bool failed() const { return !error_.empty(); }
  const std::string& error() const { return error_; }

 private:
  struct state;
  std::unique_ptr<state> state_;
  bool ended_ = false;
  std::string error_;
};

}  // namespace edge::backend::grammar
