// The compiled forms of a vocabulary and a grammar, and the pushdown automaton that runs over
// them: what compiled_grammar.cpp writes and grammar_matcher.cpp reads.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "edge/backend/grammar/compiled_grammar.h"

namespace edge::backend::grammar {

// A byte trie in depth-first order: node 0 is the root (no byte); a node's subtree is the
// nodes from it up to (not including) its `end`.
struct byte_trie {
  std::vector<std::uint8_t> byte;    // [nodes]
  std::vector<std::int32_t> depth;   // [nodes]
  std::vector<std::int32_t> end;     // [nodes]
  std::vector<std::int32_t> deepest; // [nodes] the greatest depth in the node's subtree
  std::vector<std::int32_t> first;   // [nodes + 1] where the node's tokens start in `tokens`
  std::vector<token_id> tokens;      // the tokens whose bytes end at each node, node by node

  std::int32_t size() const { return static_cast<std::int32_t>(byte.size()); }
  std::span<const token_id> tokens_at(std::int32_t node) const {
    return {tokens.data() + first[static_cast<std::size_t>(node)],
            static_cast<std::size_t>(first[static_cast<std::size_t>(node) + 1] - first[static_cast<std::size_t>(node)])};
  }
  // Builds the trie of `entries` (bytes, token), sorted by bytes first.
  static byte_trie of(std::vector<std::pair<std::string, token_id>> entries);
};

struct vocabulary_data {
  std::int64_t size = 0;
  std::vector<std::uint32_t> byte_offset;  // [size + 1] each token's bytes in `bytes` (specials: none)
  std::string bytes;
  std::vector<std::uint8_t> special;       // [size]
  std::vector<token_id> eos;
  std::int64_t max_token_bytes = 0;
  byte_trie trie;                          // of the plain tokens
  // The plain tokens, shortest first: those of n bytes or more are by_length[length_begin[n]...].
  std::vector<token_id> by_length;
  std::vector<std::int32_t> length_begin;  // [max_token_bytes + 2]

  std::string_view bytes_of(token_id id) const {
    const auto i = static_cast<std::size_t>(id);
    return std::string_view(bytes).substr(byte_offset[i], byte_offset[i + 1] - byte_offset[i]);
  }
};

struct call_edge {
  std::int32_t rule = 0;
  std::int32_t next = 0;  // the state returned to
};

struct special_edge {
  token_id token = 0;
  std::int32_t next = 0;
};

struct compiled_rule {
  std::int32_t start = 0;                  // a global state
  std::int32_t classes = 0;                // byte classes of its automaton
  std::array<std::uint8_t, 256> class_of{};  // byte -> class
  std::string name;
};

// A run of a compiled grammar's pool (compiled_data::table_tokens or table_exits).
struct pool_span {
  std::int32_t begin = 0;
  std::int32_t size = 0;
};

// What a token does from one automaton state with only that state's rule on the stack: its
// token table (compiled_grammar.h). States that behave alike for max_token_bytes bytes share one.
struct token_table {
  // Tokens accepted: those of a bitset of compiled_data::bitsets (-1: none) but `removed`, and
  // `listed`.
  std::int32_t base = -1;
  pool_span listed;    // in table_tokens, ascending
  pool_span removed;   // in table_tokens, ascending
  pool_span specials;  // in table_tokens: special tokens the state's rule may take next
  // In table_exits: nodes of the vocabulary's trie after which the rule may end with bytes left:
  // the tokens below each go on in the rule that called (their subtree is the trie of those
  // suffixes).
  pool_span exits;
  bool exits_at_once = false;   // the rule may end here (what follows it may come next)
  bool leads_anywhere = false;  // some token or special may follow
};

struct compiled_data {
  std::vector<compiled_rule> rules;
  std::int32_t root_rule = 0;
  // Per global state.
  std::vector<std::int32_t> rule_of;
  std::vector<std::uint8_t> accepting;
  std::vector<std::int32_t> row;            // where its transitions start in `next`
  std::vector<std::int32_t> next;           // [row + class] -> state, -1 none
  std::vector<std::int32_t> call_begin;     // [states + 1] into `calls`
  std::vector<call_edge> calls;
  std::vector<std::int32_t> special_begin;  // [states + 1] into `specials`
  std::vector<special_edge> specials;
  std::vector<std::uint8_t> pure_return;    // accepting, and no edge leaves it
  std::vector<std::int32_t> table_of;       // [states] its token table, -1 none needed
  std::vector<token_table> tables;
  std::int32_t words = 0;                   // mask_words(vocabulary)
  std::vector<std::uint32_t> bitsets;       // [bitsets][words] the tables' bases
  std::vector<token_id> table_tokens;       // the tables' token lists, one after another
  std::vector<std::int32_t> table_exits;    // the tables' exit nodes, one after another
  std::int64_t max_parses = 0;  // compile_limits', for the matchers
  std::int64_t max_parse_work = 0;

  std::int32_t states() const { return static_cast<std::int32_t>(rule_of.size()); }
  std::int32_t step(std::int32_t state, std::uint8_t byte) const {
    const compiled_rule& r = rules[static_cast<std::size_t>(rule_of[static_cast<std::size_t>(state)])];
    return next[static_cast<std::size_t>(row[static_cast<std::size_t>(state)] + r.class_of[byte])];
  }
  std::span<const call_edge> calls_of(std::int32_t s) const {
    return {calls.data() + call_begin[static_cast<std::size_t>(s)],
            static_cast<std::size_t>(call_begin[static_cast<std::size_t>(s) + 1] - call_begin[static_cast<std::size_t>(s)])};
  }
  std::span<const token_id> tokens(pool_span p) const {
    return {table_tokens.data() + p.begin, static_cast<std::size_t>(p.size)};
  }
  std::span<const std::int32_t> exits(pool_span p) const {
    return {table_exits.data() + p.begin, static_cast<std::size_t>(p.size)};
  }
  std::span<const std::uint32_t> bitset(std::int32_t base) const {
    return {bitsets.data() + static_cast<std::size_t>(base) * static_cast<std::size_t>(words), static_cast<std::size_t>(words)};
  }
  // Sets the bits of the tokens `t` accepts in `mask` ([words] or shorter: ids past it are left
  // out). `alone`: no bit of `mask` is set yet, so the base's removed tokens can be cleared in
  // place; otherwise `scratch` ([words]) holds the table's set on the way.
  void add_accepted(const token_table& t, std::span<std::uint32_t> mask, bool alone,
                    std::vector<std::uint32_t>& scratch) const;
  // Bytes of every vector this holds (their capacities) and of itself.
  std::int64_t memory_bytes() const;
  std::span<const special_edge> specials_of(std::int32_t s) const {
    return {specials.data() + special_begin[static_cast<std::size_t>(s)],
            static_cast<std::size_t>(special_begin[static_cast<std::size_t>(s) + 1] -
                                     special_begin[static_cast<std::size_t>(s)])};
  }
};

// ---- the pushdown automaton ----------------------------------------------------------------------
//
// A parse is (state, stack): the stack is a chain of frames (the state to return to, and the
// frame below), interned so that equal stacks are one id. Chain 0 is the empty stack: popping
// it ends the grammar (or, in a token table's walk, leaves the rule).

struct parse {
  std::int32_t state = 0;
  std::int32_t chain = 0;
  friend bool operator==(const parse&, const parse&) = default;
};

class chain_store {
 public:
  chain_store();
  std::int32_t push(std::int32_t return_state, std::int32_t below);
  std::int32_t return_state(std::int32_t chain) const { return frames_[static_cast<std::size_t>(chain)].first; }
  std::int32_t below(std::int32_t chain) const { return frames_[static_cast<std::size_t>(chain)].second; }
  std::size_t size() const { return frames_.size(); }
  // Forgets the frames pushed since size() was `n`.
  void truncate(std::size_t n);
  void clear();

 private:
  std::size_t slot_of(std::pair<std::int32_t, std::int32_t> frame) const {
    std::uint64_t k = (static_cast<std::uint64_t>(static_cast<std::uint32_t>(frame.first)) << 32) |
                      static_cast<std::uint32_t>(frame.second);
    k ^= k >> 33;
    k *= 0xFF51AFD7ED558CCDull;
    k ^= k >> 33;
    return static_cast<std::size_t>(k) & (slots_.size() - 1);
  }
  void grow();
  void erase_last();  // the last frame, and its slot
  std::vector<std::pair<std::int32_t, std::int32_t>> frames_;  // [0] is the empty stack
  // Open addressing over frames_ from 1 on (index, 0: empty), at most half full: a push is one
  // probe or two, and no allocation once it has grown (a map node per frame cost more than the
  // closures that push them).
  std::vector<std::uint32_t> slots_;
};

// The sets of parses being built, and how large they may grow. An ambiguous grammar (two rules
// that match the same text, nested) can double its parses with every byte, each a different
// stack: the limits turn that into an error instead of a stall. One set is built at a time; the
// index finds a parse already in it at once, however large the set.
class parse_sets {
 public:
  // `max_parses`: in one set; `work`: parses added to sets between two reset_work() calls (-1: no
  // such limit).
  parse_sets(std::int64_t max_parses, std::int64_t work) : max_parses_(max_parses), work_(work), work_left_(work) {}
  void reset_work() {
    work_left_ = work_;
    exceeded_ = false;
  }
  // Starts a set: the parses from `out[begin]` on, none yet.
  void begin(std::size_t begin) {
    begin_ = begin;
    indexed_ = false;
  }
  // Appends `p` to the set unless it holds it; false once a limit is passed (and until
  // reset_work(): the set being built is left part done).
  bool add(std::vector<parse>& out, parse p);
  // Counts `n` steps of work made outside the sets (a compile's walk of one parse); false once
  // the work limit is passed.
  bool spend(std::int64_t n);
  // Whether the last failure was the work limit (otherwise a set grew past max_parses).
  bool out_of_work() const { return work_left_ == 0; }
  std::int64_t work_done() const { return work_ < 0 ? 0 : work_ - work_left_; }

 private:
  static std::size_t slot_of(parse p, std::size_t mask) {
    std::uint64_t k =
        (static_cast<std::uint64_t>(static_cast<std::uint32_t>(p.state)) << 32) | static_cast<std::uint32_t>(p.chain);
    k ^= k >> 33;
    k *= 0xFF51AFD7ED558CCDull;
    k ^= k >> 33;
    return static_cast<std::size_t>(k) & mask;
  }
  void rehash(const std::vector<parse>& out);
  bool room(std::size_t n);  // for one more parse in a set of n: false (exceeded) past a limit
  std::int64_t max_parses_;
  std::int64_t work_;
  std::int64_t work_left_ = -1;
  bool exceeded_ = false;
  std::size_t begin_ = 0;
  // Open addressing over the set's parses, by index into `out` + 1 (0: empty); small sets are
  // searched in place.
  std::vector<std::uint32_t> slots_;
  bool indexed_ = false;
};

// The parses reachable from `kernel` without consuming a byte (calling rules, returning from
// finished ones), appended to `out`; `ends` is set when one pops the empty stack. False when a
// limit of `sets` was passed.
bool close_parses(const compiled_data& g, chain_store& chains, parse_sets& sets, std::span<const parse> kernel,
                  std::vector<parse>& out, bool& ends);
// The parses after `byte` from closed parses, appended to `out` (without duplicates). False when
// a limit of `sets` was passed.
bool step_parses(const compiled_data& g, parse_sets& sets, std::span<const parse> closed, std::uint8_t byte,
                 std::vector<parse>& out);

}  // namespace edge::backend::grammar
