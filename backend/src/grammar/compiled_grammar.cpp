#include "edge/backend/grammar/compiled_grammar.h"

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "edge/common/format.h"
#include "grammar_data.h"

namespace edge::backend::grammar {

// ---- tries and vocabularies ----------------------------------------------------------------------

byte_trie byte_trie::of(std::vector<std::pair<std::string, token_id>> entries) {
  std::sort(entries.begin(), entries.end());
  byte_trie t;
  t.byte.push_back(0);
  t.depth.push_back(0);
  t.end.push_back(0);
  t.first.push_back(0);
  std::vector<std::int32_t> path = {0};  // the nodes of the current prefix, root first
  std::string prefix;
  const auto close_to = [&](std::size_t keep) {
    while (path.size() > keep + 1) {
      t.end[static_cast<std::size_t>(path.back())] = t.size();
      path.pop_back();
    }
    prefix.resize(keep);
  };
  for (const auto& [bytes, id] : entries) {
    std::size_t common = 0;
    while (common < prefix.size() && common < bytes.size() && prefix[common] == bytes[common]) ++common;
    close_to(common);
    for (std::size_t i = common; i < bytes.size(); ++i) {
      t.first.push_back(static_cast<std::int32_t>(t.tokens.size()));
      t.byte.push_back(static_cast<std::uint8_t>(bytes[i]));
      t.depth.push_back(static_cast<std::int32_t>(i + 1));
      t.end.push_back(0);
      path.push_back(t.size() - 1);
      prefix += bytes[i];
    }
    t.tokens.push_back(id);
  }
  close_to(0);
  t.end[0] = t.size();
  // Each node's tokens were pushed right after it was made: first[n + 1] ends them.
  t.first.push_back(static_cast<std::int32_t>(t.tokens.size()));
  // A node's subtree follows it: its deepest node is known once the nodes after it are.
  t.deepest = t.depth;
  for (std::int32_t n = t.size() - 1; n > 0; --n) {
    const std::int32_t end = t.end[static_cast<std::size_t>(n)];
    if (end > n + 1) {
      // The children's subtrees tile [n + 1, end): the first child's `deepest` covers its own,
      // and each next child starts where the previous one's subtree ends.
      std::int32_t deepest = t.depth[static_cast<std::size_t>(n)];
      for (std::int32_t c = n + 1; c < end; c = t.end[static_cast<std::size_t>(c)]) {
        deepest = std::max(deepest, t.deepest[static_cast<std::size_t>(c)]);
      }
      t.deepest[static_cast<std::size_t>(n)] = deepest;
    }
  }
  for (std::int32_t c = 1; c < t.size(); c = t.end[static_cast<std::size_t>(c)]) {
    t.deepest[0] = std::max(t.deepest[0], t.deepest[static_cast<std::size_t>(c)]);
  }
  return t;
}

token_vocabulary::token_vocabulary(const tokenizer& tok, std::unique_ptr<vocabulary_data> data)
    : tok_(tok), data_(std::move(data)) {}
token_vocabulary::~token_vocabulary() = default;

std::shared_ptr<const token_vocabulary> token_vocabulary::create(const tokenizer& tok) {
  auto d = std::make_unique<vocabulary_data>();
  d->size = tok.vocab_size();
  d->special.assign(static_cast<std::size_t>(d->size), 0);
  d->byte_offset.push_back(0);
  std::vector<std::pair<std::string, token_id>> entries;
  std::string bytes;
  for (token_id id = 0; id < d->size; ++id) {
    bytes.clear();
    if (tok.is_special(id)) {
      d->special[static_cast<std::size_t>(id)] = 1;
    } else {
      tok.append_token_bytes(id, false, false, bytes);
    }
    d->bytes += bytes;
    d->byte_offset.push_back(static_cast<std::uint32_t>(d->bytes.size()));
    if (!bytes.empty()) {
      d->max_token_bytes = std::max<std::int64_t>(d->max_token_bytes, static_cast<std::int64_t>(bytes.size()));
      entries.emplace_back(bytes, id);
    }
  }
  d->eos.assign(tok.eos_ids().begin(), tok.eos_ids().end());
  d->length_begin.assign(static_cast<std::size_t>(d->max_token_bytes) + 2, 0);
  for (const auto& entry : entries) ++d->length_begin[entry.first.size() + 1];
  for (std::size_t n = 1; n < d->length_begin.size(); ++n) d->length_begin[n] += d->length_begin[n - 1];
  d->by_length.resize(entries.size());
  {
    std::vector<std::int32_t> at(d->length_begin.begin(), d->length_begin.end() - 1);
    for (const auto& [spelled, id] : entries) d->by_length[static_cast<std::size_t>(at[spelled.size()]++)] = id;
  }
  d->trie = byte_trie::of(std::move(entries));
  return std::shared_ptr<const token_vocabulary>(new token_vocabulary(tok, std::move(d)));
}

std::int64_t token_vocabulary::size() const { return data_->size; }
std::int64_t token_vocabulary::max_token_bytes() const { return data_->max_token_bytes; }
std::int64_t token_vocabulary::trie_nodes() const { return data_->trie.size(); }

// ---- the pushdown automaton ----------------------------------------------------------------------

chain_store::chain_store() : frames_(1, {-1, -1}), slots_(16, 0u) {}

void chain_store::clear() {
  // Slot by slot while few are used: a walk of the compiler clears it once per token table.
  if (frames_.size() * 8 < slots_.size()) {
    truncate(1);
  } else {
    frames_.assign(1, {-1, -1});
    std::fill(slots_.begin(), slots_.end(), 0u);
  }
}

void chain_store::grow() {
  slots_.assign(slots_.size() * 2, 0u);
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = 1; i < frames_.size(); ++i) {
    std::size_t at = slot_of(frames_[i]);
    while (slots_[at] != 0) at = (at + 1) & mask;
    slots_[at] = static_cast<std::uint32_t>(i);
  }
}

std::int32_t chain_store::push(std::int32_t return_state, std::int32_t below) {
  const std::pair<std::int32_t, std::int32_t> frame{return_state, below};
  if (2 * (frames_.size() + 1) > slots_.size()) grow();
  const std::size_t mask = slots_.size() - 1;
  std::size_t at = slot_of(frame);
  for (; slots_[at] != 0; at = (at + 1) & mask) {
    if (frames_[slots_[at]] == frame) return static_cast<std::int32_t>(slots_[at]);
  }
  slots_[at] = static_cast<std::uint32_t>(frames_.size());
  frames_.push_back(frame);
  return static_cast<std::int32_t>(frames_.size() - 1);
}

void chain_store::erase_last() {
  const auto last = static_cast<std::uint32_t>(frames_.size() - 1);
  const std::size_t mask = slots_.size() - 1;
  std::size_t hole = slot_of(frames_.back());
  while (slots_[hole] != last) hole = (hole + 1) & mask;
  // Backward shift: a later entry of the probe run moves into the hole unless its home slot lies
  // cyclically in (hole, entry].
  for (std::size_t at = (hole + 1) & mask; slots_[at] != 0; at = (at + 1) & mask) {
    const std::size_t home = slot_of(frames_[slots_[at]]);
    const bool stays = hole <= at ? (hole < home && home <= at) : (hole < home || home <= at);
    if (stays) continue;
    slots_[hole] = slots_[at];
    hole = at;
  }
  slots_[hole] = 0;
  frames_.pop_back();
}

void chain_store::truncate(std::size_t n) {
  while (frames_.size() > std::max<std::size_t>(n, 1)) erase_last();
}

void parse_sets::rehash(const std::vector<parse>& out) {
  const std::size_t n = out.size() - begin_;
  std::size_t size = 64;
  while (size < 2 * n + 2) size *= 2;
  slots_.assign(size, 0);
  for (std::size_t i = begin_; i < out.size(); ++i) {
    std::size_t at = slot_of(out[i], size - 1);
    while (slots_[at] != 0) at = (at + 1) & (size - 1);
    slots_[at] = static_cast<std::uint32_t>(i - begin_ + 1);
  }
  indexed_ = true;
}

bool parse_sets::room(std::size_t n) {
  if (static_cast<std::int64_t>(n) >= max_parses_ || work_left_ == 0) {
    exceeded_ = true;
    return false;
  }
  if (work_left_ > 0) --work_left_;
  return true;
}

bool parse_sets::spend(std::int64_t n) {
  if (exceeded_) return false;
  if (work_left_ < 0) return true;
  if (work_left_ < n) {
    work_left_ = 0;
    exceeded_ = true;
    return false;
  }
  work_left_ -= n;
  return true;
}

bool parse_sets::add(std::vector<parse>& out, parse p) {
  if (exceeded_) return false;
  constexpr std::size_t searched_in_place = 16;
  const std::size_t n = out.size() - begin_;
  if (!indexed_ && n < searched_in_place) {
    for (std::size_t i = begin_; i < out.size(); ++i) {
      if (out[i] == p) return true;
    }
  } else {
    if (!indexed_ || 2 * n + 2 > slots_.size()) rehash(out);
    const std::size_t mask = slots_.size() - 1;
    std::size_t at = slot_of(p, mask);
    for (; slots_[at] != 0; at = (at + 1) & mask) {
      if (out[begin_ + slots_[at] - 1] == p) return true;
    }
    if (!room(n)) return false;
    slots_[at] = static_cast<std::uint32_t>(n + 1);
    out.push_back(p);
    return true;
  }
  if (!room(n)) return false;
  out.push_back(p);
  return true;
}

bool close_parses(const compiled_data& g, chain_store& chains, parse_sets& sets, std::span<const parse> kernel,
                  std::vector<parse>& out, bool& ends) {
  const std::size_t begin = out.size();
  sets.begin(begin);
  for (const parse& p : kernel) {
    if (!sets.add(out, p)) return false;
  }
  for (std::size_t k = begin; k < out.size(); ++k) {
    const parse p = out[k];
    for (const call_edge& c : g.calls_of(p.state)) {
      const std::int32_t chain = g.pure_return[static_cast<std::size_t>(c.next)] ? p.chain : chains.push(c.next, p.chain);
      if (!sets.add(out, {g.rules[static_cast<std::size_t>(c.rule)].start, chain})) return false;
    }
    if (g.accepting[static_cast<std::size_t>(p.state)]) {
      if (p.chain == 0) {
        ends = true;
      } else if (!sets.add(out, {chains.return_state(p.chain), chains.below(p.chain)})) {
        return false;
      }
    }
  }
  return true;
}

bool step_parses(const compiled_data& g, parse_sets& sets, std::span<const parse> closed, std::uint8_t byte,
                 std::vector<parse>& out) {
  sets.begin(out.size());
  for (const parse& p : closed) {
    const std::int32_t to = g.step(p.state, byte);
    if (to >= 0 && !sets.add(out, {to, p.chain})) return false;
  }
  return true;
}

// ---- compiled grammars ---------------------------------------------------------------------------

void compiled_data::add_accepted(const token_table& t, std::span<std::uint32_t> mask, bool alone,
                                 std::vector<std::uint32_t>& scratch) const {
  const std::size_t n = std::min(mask.size(), static_cast<std::size_t>(words));
  const auto set = [](std::span<std::uint32_t> m, token_id id) {
    if (static_cast<std::size_t>(id) / 32 < m.size()) m[static_cast<std::size_t>(id) / 32] |= 1u << (id % 32);
  };
  const auto clear = [](std::span<std::uint32_t> m, token_id id) {
    if (static_cast<std::size_t>(id) / 32 < m.size()) m[static_cast<std::size_t>(id) / 32] &= ~(1u << (id % 32));
  };
  if (t.removed.size > 0 && !alone) {
    // Cleared bits of the base must not clear what other tables set: the set is built aside.
    scratch.assign(static_cast<std::size_t>(words), 0u);
    add_accepted(t, scratch, true, scratch);
    for (std::size_t w = 0; w < n; ++w) mask[w] |= scratch[w];
    return;
  }
  if (t.base >= 0) {
    const auto base = bitset(t.base);
    for (std::size_t w = 0; w < n; ++w) mask[w] |= base[w];
  }
  for (const token_id id : tokens(t.removed)) clear(mask, id);
  for (const token_id id : tokens(t.listed)) set(mask, id);
}

std::int64_t compiled_data::memory_bytes() const {
  const auto bytes = [](const auto& v) {
    return static_cast<std::int64_t>(v.capacity() * sizeof(typename std::decay_t<decltype(v)>::value_type));
  };
  std::int64_t total = static_cast<std::int64_t>(sizeof(compiled_data)) + bytes(rules) + bytes(rule_of) + bytes(accepting) +
                       bytes(row) + bytes(next) + bytes(call_begin) + bytes(calls) + bytes(special_begin) +
                       bytes(specials) + bytes(pure_return) + bytes(table_of) + bytes(tables) + bytes(bitsets) +
                       bytes(table_tokens) + bytes(table_exits);
  for (const compiled_rule& r : rules) {
    // A name longer than the string's own buffer lives on the heap.
    if (r.name.capacity() > std::string().capacity()) total += static_cast<std::int64_t>(r.name.capacity()) + 1;
  }
  return total;
}

// ---- compiling -----------------------------------------------------------------------------------

namespace {

// An NFA over bytes, calls and special tokens, all rules together.
struct nfa {
  enum kind : std::uint8_t { eps, bytes, call, special };
  struct edge {
    kind k = eps;
    std::uint8_t lo = 0;
    std::uint8_t hi = 0;
    std::int32_t label = 0;  // call: the rule; special: the token
    std::int32_t to = 0;
    std::int32_t next = -1;  // the state's next edge (link() sets it)
  };
  // Edges in one array, each state's chained from its last one: a vector per state cost five
  // times the memory of the edges themselves.
  std::vector<std::int32_t> first;  // [states] the state's last edge, -1 none
  std::vector<edge> edges;

  struct edge_range {
    const nfa* n;
    std::int32_t head;
    struct iterator {
      const nfa* n;
      std::int32_t at;
      const edge& operator*() const { return n->edges[static_cast<std::size_t>(at)]; }
      iterator& operator++() {
        at = n->edges[static_cast<std::size_t>(at)].next;
        return *this;
      }
      bool operator!=(const iterator& other) const { return at != other.at; }
    };
    iterator begin() const { return {n, head}; }
    iterator end() const { return {n, -1}; }
  };

  std::size_t size() const { return first.size(); }
  std::int32_t add() {
    first.push_back(-1);
    return static_cast<std::int32_t>(first.size() - 1);
  }
  void link(std::int32_t from, edge e) {
    e.next = first[static_cast<std::size_t>(from)];
    first[static_cast<std::size_t>(from)] = static_cast<std::int32_t>(edges.size());
    edges.push_back(e);
  }
  edge_range out(std::int32_t s) const { return {this, first[static_cast<std::size_t>(s)]}; }
  std::int64_t memory() const {
    return static_cast<std::int64_t>(first.capacity() * sizeof(std::int32_t) + edges.capacity() * sizeof(edge));
  }
};

// One code point range of equal UTF-8 length as byte ranges per position.
template <class Emit>
void utf8_split(char32_t lo, char32_t hi, const Emit& emit) {
  const auto length = [](char32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; };
  const int n = length(lo);
  for (int i = 1; i < n; ++i) {
    const char32_t m = (char32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_split(lo, lo | m, emit);
        utf8_split((lo | m) + 1, hi, emit);
        return;
      }
      if ((hi & m) != m) {
        utf8_split(lo, (hi & ~m) - 1, emit);
        utf8_split(hi & ~m, hi, emit);
        return;
      }
    }
  }
  const auto encode = [n](char32_t c, std::uint8_t* b) {
    if (n == 1) {
      b[0] = static_cast<std::uint8_t>(c);
    } else if (n == 2) {
      b[0] = static_cast<std::uint8_t>(0xC0 | (c >> 6));
      b[1] = static_cast<std::uint8_t>(0x80 | (c & 0x3F));
    } else if (n == 3) {
      b[0] = static_cast<std::uint8_t>(0xE0 | (c >> 12));
      b[1] = static_cast<std::uint8_t>(0x80 | ((c >> 6) & 0x3F));
      b[2] = static_cast<std::uint8_t>(0x80 | (c & 0x3F));
    } else {
      b[0] = static_cast<std::uint8_t>(0xF0 | (c >> 18));
      b[1] = static_cast<std::uint8_t>(0x80 | ((c >> 12) & 0x3F));
      b[2] = static_cast<std::uint8_t>(0x80 | ((c >> 6) & 0x3F));
      b[3] = static_cast<std::uint8_t>(0x80 | (c & 0x3F));
    }
  };
  std::uint8_t a[4];
  std::uint8_t b[4];
  encode(lo, a);
  encode(hi, b);
  std::vector<std::pair<std::uint8_t, std::uint8_t>> ranges;
  for (int i = 0; i < n; ++i) ranges.emplace_back(a[i], b[i]);
  emit(ranges);
}

template <class Emit>
void utf8_ranges(char32_t lo, char32_t hi, const Emit& emit) {
  for (const char32_t band_end : {char32_t{0x7F}, char32_t{0x7FF}, char32_t{0xFFFF}, char32_t{0x10FFFF}}) {
    const char32_t band_begin = band_end == 0x7F ? 0 : band_end == 0x7FF ? 0x80 : band_end == 0xFFFF ? 0x800 : 0x10000;
    const char32_t a = std::max(lo, band_begin);
    const char32_t b = std::min(hi, band_end);
    if (a <= b) utf8_split(a, b, emit);
  }
}

// A bound of the magnitude machine: the integer part's digits ("" below 1) and the fraction's.
struct bound_digits {
  std::string whole;
  std::string fraction;
  static bound_digits of(const decimal& d) {
    bound_digits b;
    const auto n = static_cast<std::int64_t>(d.digits.size());
    if (d.digits == "0") return b;
    if (d.exponent >= 0) {
      b.whole = d.digits + std::string(static_cast<std::size_t>(d.exponent), '0');
    } else {
      const std::int64_t point = n + d.exponent;
      if (point > 0) {
        b.whole = d.digits.substr(0, static_cast<std::size_t>(point));
        b.fraction = d.digits.substr(static_cast<std::size_t>(point));
      } else {
        b.fraction = std::string(static_cast<std::size_t>(-point), '0') + d.digits;
      }
    }
    return b;
  }
  int fraction_digit(std::size_t j) const { return j < fraction.size() ? fraction[j] - '0' : 0; }
  bool fraction_rest_zero(std::size_t j) const { return j >= fraction.size(); }
};

// ---- token tables shared by states that behave alike -------------------------------------------
//
// A state's token table depends only on what its rule does with the next max_token_bytes bytes:
// which byte strings of that length it can read (calling other rules on the way), and after
// which it may end. An unrolled repeat (a string of at most 4096 characters) has thousands of
// states that differ only in how far the end is, and all but the last few are alike for that
// many bytes. The states are split into classes of states that are alike for n bytes, n = 0, 1,
// ... (Moore's refinement, bounded): alike for 0 bytes when they accept alike, name the same
// special tokens and call the same rules returning to states alike for 0 bytes; alike for n
// bytes when, besides, every byte leads them to states alike for n - 1 bytes and every call
// returns to states alike for n bytes (a call may read no byte at all). That is a bisimulation
// of the parses (a state and its stack of return states) up to n bytes, so states of a class
// have equal tables. A class that splits from its parent at n bytes is alike its parent for
// fewer: it takes the parent's tokens shorter than n bytes, and walks only the deeper part of
// the vocabulary's trie.

// FNV-1a over 32-bit items: how compiling finds equal NFA sets, signatures, bitsets and lists.
template <class T>
std::uint64_t hash_items(std::span<const T> items) {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (const T x : items) h = (h ^ static_cast<std::uint32_t>(x)) * 0x100000001B3ull;
  return h;
}

struct state_classes {
  std::vector<std::int32_t> of;      // [states] each state's class
  std::vector<std::int32_t> born;    // [classes] the length that split it from its parent (0: one of the first)
  std::vector<std::int32_t> parent;  // [classes] -1 for the first ones
};

class refiner {
 public:
  refiner(const compiled_data& g, parse_sets& work, state_classes& out) : g_(g), work_(work), out_(out) {
    const auto states = static_cast<std::size_t>(g.states());
    mark_.assign(states, 0);
    // Who leads to each state by a byte, and whose call returns to it.
    std::vector<std::pair<std::int32_t, std::int32_t>> byte_edges;
    std::vector<std::pair<std::int32_t, std::int32_t>> call_edges;
    std::vector<std::int32_t> targets;
    for (std::int32_t s = 0; s < g.states(); ++s) {
      const std::int32_t classes = g.rules[static_cast<std::size_t>(g.rule_of[static_cast<std::size_t>(s)])].classes;
      targets.clear();
      for (std::int32_t c = 0; c < classes; ++c) {
        const std::int32_t t = g.next[static_cast<std::size_t>(g.row[static_cast<std::size_t>(s)] + c)];
        if (t >= 0) targets.push_back(t);
      }
      std::sort(targets.begin(), targets.end());
      targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
      for (const std::int32_t t : targets) byte_edges.emplace_back(t, s);
      for (const call_edge& e : g.calls_of(s)) call_edges.emplace_back(e.next, s);
    }
    index(byte_edges, byte_from_begin_, byte_from_);
    index(call_edges, call_from_begin_, call_from_);
    for (const compiled_rule& r : g.rules) {
      std::vector<std::int32_t>& start = class_start_.emplace_back(static_cast<std::size_t>(r.classes), 0);
      for (int b = 255; b >= 0; --b) start[r.class_of[static_cast<std::size_t>(b)]] = b;
    }
  }

  // Refines to `depth` bytes (or until nothing splits); false past the work limit.
  bool run(std::int32_t depth) {
    const std::int32_t states = g_.states();
    // Alike for 0 bytes: the rule, whether it accepts, its special tokens, then its calls.
    std::vector<std::int32_t> all(static_cast<std::size_t>(states));
    for (std::int32_t s = 0; s < states; ++s) all[static_cast<std::size_t>(s)] = s;
    out_.of.assign(static_cast<std::size_t>(states), 0);
    out_.born.assign(1, 0);
    out_.parent.assign(1, -1);
    size_.assign(1, states);
    std::vector<std::int32_t> moved;
    // No rule in it: states of different rules that behave alike share a table too (every
    // bounded string's last characters, whatever its length).
    if (!split(all, 0, [&](std::int32_t s, std::vector<std::int32_t>& sig) {
          sig.push_back(g_.accepting[static_cast<std::size_t>(s)]);
          for (const special_edge& e : g_.specials_of(s)) sig.push_back(e.token);
        }, moved)) {
      return false;
    }
    if (!split_calls(all, 0, moved)) return false;
    for (std::int32_t n = 1; n <= depth; ++n) {
      // Only states leading by a byte to one that moved can split.
      std::vector<std::int32_t> dirty = n == 1 ? all : sources(moved, byte_from_begin_, byte_from_);
      moved.clear();
      if (!split(dirty, n, [&](std::int32_t s, std::vector<std::int32_t>& sig) {
            // By byte ranges, not the rule's own classes, so that rules compare: each run of
            // bytes leading to one class as its first byte and that class.
            const auto r = static_cast<std::size_t>(g_.rule_of[static_cast<std::size_t>(s)]);
            for (std::int32_t c = 0; c < g_.rules[r].classes; ++c) {
              const std::int32_t t = g_.next[static_cast<std::size_t>(g_.row[static_cast<std::size_t>(s)] + c)];
              const std::int32_t to = t < 0 ? -1 : out_.of[static_cast<std::size_t>(t)];
              if (c > 0 && sig.back() == to) continue;
              sig.push_back(class_start_[r][static_cast<std::size_t>(c)]);
              sig.push_back(to);
            }
          }, moved)) {
        return false;
      }
      if (!split_calls(sources(moved, call_from_begin_, call_from_), n, moved)) return false;
      if (moved.empty()) break;  // nothing splits at any greater length either
    }
    return true;
  }

 private:
  static void index(std::vector<std::pair<std::int32_t, std::int32_t>>& edges, std::vector<std::int32_t>& begin,
                    std::vector<std::int32_t>& from) {
    std::sort(edges.begin(), edges.end());
    edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
    begin.assign(edges.empty() ? 1 : static_cast<std::size_t>(edges.back().first) + 2, 0);
    for (const auto& [to, s] : edges) ++begin[static_cast<std::size_t>(to) + 1];
    for (std::size_t i = 1; i < begin.size(); ++i) begin[i] += begin[i - 1];
    from.clear();
    for (const auto& [to, s] : edges) from.push_back(s);
  }

  // The states with an edge (as `begin`/`from` index them) to one of `moved`, each once.
  std::vector<std::int32_t> sources(std::span<const std::int32_t> moved, const std::vector<std::int32_t>& begin,
                                    const std::vector<std::int32_t>& from) {
    ++stamp_;
    std::vector<std::int32_t> out;
    for (const std::int32_t t : moved) {
      if (static_cast<std::size_t>(t) + 1 >= begin.size()) continue;
      for (std::int32_t k = begin[static_cast<std::size_t>(t)]; k < begin[static_cast<std::size_t>(t) + 1]; ++k) {
        const std::int32_t s = from[static_cast<std::size_t>(k)];
        if (mark_[static_cast<std::size_t>(s)] != stamp_) {
          mark_[static_cast<std::size_t>(s)] = stamp_;
          out.push_back(s);
        }
      }
    }
    return out;
  }

  // Splits by calls (the rule, and the class returned to) until no class splits: a call may read
  // nothing, so the class returned to counts at the same length.
  bool split_calls(std::vector<std::int32_t> dirty, std::int32_t n, std::vector<std::int32_t>& moved) {
    while (!dirty.empty()) {
      std::vector<std::int32_t> now;
      if (!split(dirty, n, [&](std::int32_t s, std::vector<std::int32_t>& sig) {
            for (const call_edge& e : g_.calls_of(s)) {
              sig.push_back(e.rule);
              sig.push_back(out_.of[static_cast<std::size_t>(e.next)]);
            }
          }, now)) {
        return false;
      }
      moved.insert(moved.end(), now.begin(), now.end());
      dirty = sources(now, call_from_begin_, call_from_);
    }
    return true;
  }

  // Splits the classes of `dirty` by `signature` (all computed before any state moves): states
  // of a class with equal signatures stay together; when every state of a class is dirty, its
  // largest group keeps the class, otherwise each group is a new class (a dirty state differs
  // from the others: what it leads to moved). Moved states are appended to `moved`.
  template <class Signature>
  bool split(std::span<const std::int32_t> dirty, std::int32_t n, const Signature& signature,
             std::vector<std::int32_t>& moved) {
    // Signatures are computed when needed, not kept: the first split of every state would hold
    // a copy of every transition.
    const auto signature_of = [&](std::size_t i, std::vector<std::int32_t>& sig) {
      const std::int32_t s = dirty[i];
      sig.clear();
      sig.push_back(out_.of[static_cast<std::size_t>(s)]);
      signature(s, sig);
      return std::span<const std::int32_t>(sig);
    };
    // Sorted by class and a hash of the signature; equal hashes are checked for equal signatures.
    struct keyed {
      std::int32_t cls;
      std::uint64_t hash;
      std::size_t index;
    };
    std::vector<keyed> order(dirty.size());
    std::int64_t steps = 0;
    for (std::size_t i = 0; i < order.size(); ++i) {
      const auto sig = signature_of(i, sig_);
      order[i] = {sig[0], hash_items(sig), i};
      steps += static_cast<std::int64_t>(sig.size());
    }
    if (!work_.spend(steps)) return false;
    std::sort(order.begin(), order.end(), [](const keyed& a, const keyed& b) {
      return std::tie(a.cls, a.hash, a.index) < std::tie(b.cls, b.hash, b.index);
    });
    std::vector<std::pair<std::size_t, std::size_t>> groups;  // [begin, end) of order
    for (std::size_t i = 0; i < order.size();) {
      const std::int32_t c = order[i].cls;
      std::size_t j = i;
      groups.clear();
      while (j < order.size() && order[j].cls == c) {
        std::size_t k = j + 1;
        while (k < order.size() && order[k].cls == c && order[k].hash == order[j].hash) ++k;
        const auto first = signature_of(order[j].index, sig_);
        bool all_same = true;
        for (std::size_t m = j + 1; m < k && all_same; ++m) all_same = std::ranges::equal(signature_of(order[m].index, other_sig_), first);
        if (all_same) {
          groups.emplace_back(j, k);
        } else {
          // A collision of hashes: the run's signatures in lexicographic order, grouped by equality.
          std::vector<std::vector<std::int32_t>> sigs;
          for (std::size_t m = j; m < k; ++m) {
            const auto sig = signature_of(order[m].index, other_sig_);
            sigs.emplace_back(sig.begin(), sig.end());
          }
          std::vector<std::size_t> by_sig(k - j);
          for (std::size_t m = 0; m < by_sig.size(); ++m) by_sig[m] = m;
          std::sort(by_sig.begin(), by_sig.end(), [&](std::size_t x, std::size_t y) { return sigs[x] < sigs[y]; });
          std::vector<keyed> run;
          for (const std::size_t m : by_sig) run.push_back(order[j + m]);
          std::copy(run.begin(), run.end(), order.begin() + static_cast<std::ptrdiff_t>(j));
          for (std::size_t m = 0; m < by_sig.size();) {
            std::size_t e = m + 1;
            while (e < by_sig.size() && sigs[by_sig[e]] == sigs[by_sig[m]]) ++e;
            groups.emplace_back(j + m, j + e);
            m = e;
          }
        }
        j = k;
      }
      std::size_t keep = groups.size();
      if (static_cast<std::int64_t>(j - i) == size_[static_cast<std::size_t>(c)]) {
        keep = 0;
        for (std::size_t k = 1; k < groups.size(); ++k) {
          if (groups[k].second - groups[k].first > groups[keep].second - groups[keep].first) keep = k;
        }
      }
      for (std::size_t k = 0; k < groups.size(); ++k) {
        if (k == keep) continue;
        const auto id = static_cast<std::int32_t>(out_.born.size());
        out_.born.push_back(n);
        out_.parent.push_back(c);
        size_.push_back(0);
        for (std::size_t m = groups[k].first; m < groups[k].second; ++m) {
          const std::int32_t s = dirty[order[m].index];
          out_.of[static_cast<std::size_t>(s)] = id;
          --size_[static_cast<std::size_t>(c)];
          ++size_.back();
          moved.push_back(s);
        }
      }
      i = j;
    }
    return true;
  }

  const compiled_data& g_;
  parse_sets& work_;
  state_classes& out_;
  std::vector<std::int64_t> size_;  // [classes] states in each
  std::vector<std::int32_t> byte_from_begin_, byte_from_;  // CSR: the states leading to each by a byte
  std::vector<std::int32_t> call_from_begin_, call_from_;  // CSR: the states whose calls return to each
  std::vector<std::int32_t> mark_;  // [states] == stamp_: listed already
  std::int32_t stamp_ = 0;
  std::vector<std::int32_t> sig_, other_sig_;  // scratch: signatures being compared
  std::vector<std::vector<std::int32_t>> class_start_;  // [rules][classes] the first byte of each
};

bool refine(const compiled_data& g, std::int32_t depth, parse_sets& work, state_classes& out) {
  refiner r(g, work, out);
  return r.run(depth);
}

// std::popcount is a library call on the baseline x86-64 target: the tables' bitsets are counted
// often enough for that to show.
constexpr int bit_count(std::uint32_t x) {
  x = x - ((x >> 1) & 0x55555555u);
  x = (x & 0x33333333u) + ((x >> 2) & 0x33333333u);
  return static_cast<int>((((x + (x >> 4)) & 0x0F0F0F0Fu) * 0x01010101u) >> 24);
}

// A table's accepted tokens while it is made: a list while that is shorter than a bitset (most
// tables accept a few tokens: what spells the next bytes of a literal), a bitset past it.
class token_set {
 public:
  explicit token_set(std::int32_t words) : words_(words) {}

  void clear() {
    list_.clear();
    dense_ = false;
  }
  void add(token_id t) {
    if (dense_) {
      bits_[static_cast<std::size_t>(t) / 32] |= 1u << (t % 32);
      return;
    }
    list_.push_back(t);
    if (static_cast<std::int64_t>(list_.size()) > words_) densify();
  }
  // Turns it into a bitset (cleared when `clear`).
  std::vector<std::uint32_t>& bits(bool clear) {
    if (!dense_) densify();
    if (clear) std::fill(bits_.begin(), bits_.end(), 0u);
    return bits_;
  }
  bool dense() const { return dense_; }
  const std::vector<std::uint32_t>& bits() const { return bits_; }
  std::vector<token_id>& list() { return list_; }  // when not dense

 private:
  void densify() {
    bits_.assign(static_cast<std::size_t>(words_), 0u);
    for (const token_id t : list_) bits_[static_cast<std::size_t>(t) / 32] |= 1u << (t % 32);
    list_.clear();
    dense_ = true;
  }
  std::int64_t words_;
  bool dense_ = false;
  std::vector<token_id> list_;
  std::vector<std::uint32_t> bits_;  // [words] when dense
};

// Walks the vocabulary's trie from one state with only its rule on the stack.
class table_walk {
 public:
  table_walk(const compiled_data& g, const vocabulary_data& v, parse_sets& sets)
      : g_(g), v_(v), sets_(sets),
        single_(static_cast<std::size_t>(v.max_token_bytes) + 2, -1),
        kernels_(static_cast<std::size_t>(v.max_token_bytes) + 2),
        closed_(static_cast<std::size_t>(v.max_token_bytes) + 2),
        plain_(static_cast<std::size_t>(g.states())),
        bytes_(static_cast<std::size_t>(v.max_token_bytes) + 2) {
    for (std::int32_t s = 0; s < g.states(); ++s) plain_[static_cast<std::size_t>(s)] = g.calls_of(s).empty() ? 1 : 0;
  }

  // Adds to `accepted` the tokens of `from` bytes or more that `state` accepts, and appends to `exits`
  // the trie nodes of depth `from` or more after which its rule may end with bytes left; at
  // `from` 0 also whether it may end at once and the special tokens it may take. False past a
  // limit of the sets.
  bool run(std::int32_t state, std::int32_t from, token_set& accepted, std::vector<std::int32_t>& exits, bool& at_once,
           std::vector<token_id>& specials) {
    chains_.clear();
    const byte_trie& trie = v_.trie;
    // A closed set that is one parse of a state without calls, on the empty stack, is followed
    // as a DFA: one step a byte, no sets (single_); the rest goes through the sets.
    bool ends = false;
    if (plain_[static_cast<std::size_t>(state)]) {
      single_[0] = state;
      ends = g_.accepting[static_cast<std::size_t>(state)] != 0;
      if (from == 0) {
        for (const special_edge& e : g_.specials_of(state)) specials.push_back(e.token);
      }
    } else {
      single_[0] = -1;
      const parse start{state, 0};
      closed_[0].clear();
      if (!close_parses(g_, chains_, sets_, std::span(&start, 1), closed_[0], ends)) return false;
      gather_bytes(0);
      if (from == 0) {
        for (const parse& p : closed_[0]) {
          for (const special_edge& e : g_.specials_of(p.state)) specials.push_back(e.token);
        }
      }
    }
    if (from == 0) {
      at_once = ends;
      std::sort(specials.begin(), specials.end());
      specials.erase(std::unique(specials.begin(), specials.end()), specials.end());
    }
    std::int64_t steps = 0;
    for (std::int32_t i = 1; i < trie.size();) {
      const auto at = static_cast<std::size_t>(i);
      const std::int32_t end = trie.end[at];
      if (trie.deepest[at] < from) {
        i = end;
        continue;
      }
      const auto d = static_cast<std::size_t>(trie.depth[at]);
      const bool leaf = end == i + 1;
      ends = false;
      if (const std::int32_t s = single_[d - 1]; s >= 0) {
        ++steps;
        const std::int32_t to = g_.step(s, trie.byte[at]);
        if (to < 0) {
          i = end;
          continue;
        }
        single_[d] = -1;
        if (plain_[static_cast<std::size_t>(to)]) {
          single_[d] = to;
          ends = g_.accepting[static_cast<std::size_t>(to)] != 0;
        } else if (!leaf) {
          const parse p{to, 0};
          closed_[d].clear();
          if (!close_parses(g_, chains_, sets_, std::span(&p, 1), closed_[d], ends)) return false;
          gather_bytes(d);
        }
      } else {
        const std::uint8_t byte = trie.byte[at];
        if (((bytes_[d - 1][byte / 32] >> (byte % 32)) & 1u) == 0) {
          i = end;
          continue;
        }
        kernels_[d].clear();
        if (!step_parses(g_, sets_, closed_[d - 1], byte, kernels_[d])) return false;
        if (kernels_[d].empty()) {
          i = end;
          continue;
        }
        single_[d] = -1;
        if (!leaf) {
          closed_[d].clear();
          if (!close_parses(g_, chains_, sets_, kernels_[d], closed_[d], ends)) return false;
          if (closed_[d].size() == 1 && closed_[d][0].chain == 0 && plain_[static_cast<std::size_t>(closed_[d][0].state)]) {
            single_[d] = closed_[d][0].state;
          } else {
            gather_bytes(d);
          }
        }
      }
      if (static_cast<std::int32_t>(d) >= from) {
        for (const token_id t : trie.tokens_at(i)) accepted.add(t);
        if (ends && !leaf) exits.push_back(i);
      }
      ++i;
    }
    return sets_.spend(steps);
  }

 private:
  using byte_set = std::array<std::uint32_t, 8>;

  // The bytes some parse of closed_[d] can read, in bytes_[d]: a child of the trie by another
  // byte is skipped without stepping every parse (sets of a hundred parses are common where a
  // rule may end into many callers, and the trie's root has a child for nearly every byte).
  void gather_bytes(std::size_t d) {
    byte_set& out = bytes_[d];
    out.fill(0u);
    if (bytes_at_.empty()) {
      bytes_at_.assign(static_cast<std::size_t>(g_.states()), -1);
      gathered_.assign(static_cast<std::size_t>(g_.states()), 0);
    }
    // Many parses of a set are one state on different stacks (a rule called from many places).
    ++gathering_;
    for (const parse& p : closed_[d]) {
      if (std::exchange(gathered_[static_cast<std::size_t>(p.state)], gathering_) == gathering_) continue;
      const byte_set& b = bytes_of(p.state);
      for (std::size_t w = 0; w < out.size(); ++w) out[w] |= b[w];
    }
  }
  const byte_set& bytes_of(std::int32_t state) {
    std::int32_t& at = bytes_at_[static_cast<std::size_t>(state)];
    if (at < 0) {
      byte_set bytes{};
      for (int b = 0; b < 256; ++b) {
        if (g_.step(state, static_cast<std::uint8_t>(b)) >= 0) bytes[static_cast<std::size_t>(b) / 32] |= 1u << (b % 32);
      }
      at = static_cast<std::int32_t>(state_bytes_.size());
      state_bytes_.push_back(bytes);
    }
    return state_bytes_[static_cast<std::size_t>(at)];
  }

  const compiled_data& g_;
  const vocabulary_data& v_;
  parse_sets& sets_;
  chain_store chains_;
  std::vector<std::int32_t> single_;               // [depth] the one plain state there, or -1: closed_
  std::vector<std::vector<parse>> kernels_;        // [depth]
  std::vector<std::vector<parse>> closed_;         // [depth]
  std::vector<std::uint8_t> plain_;                // [states] no call leaves it
  std::vector<byte_set> bytes_;                    // [depth] see gather_bytes
  std::vector<std::int32_t> bytes_at_;  // [states] where state_bytes_ has the bytes each can read, -1 not asked yet
  std::vector<byte_set> state_bytes_;
  std::vector<std::uint32_t> gathered_;  // [states] == gathering_: its bytes are in the set being gathered
  std::uint32_t gathering_ = 0;
};

// Keeps the tables in the compiled grammar's pools: a table's accepted tokens as a list, as a
// bitset, or as the differences from the bitset its parent used, whichever is smallest; equal
// bitsets and equal runs of the pools stored once.
class table_store {
 public:
  explicit table_store(compiled_data& g) : g_(g) {}

  std::int32_t add(token_set& accepted, std::int32_t parent_base, std::vector<std::int32_t>& exits,
                   const std::vector<token_id>& specials, bool at_once) {
    token_table t;
    bool any = false;
    if (!accepted.dense()) {
      std::vector<token_id>& list = accepted.list();
      std::sort(list.begin(), list.end());
      t.listed = intern(g_.table_tokens, token_index_, list);
      any = !list.empty();
    } else {
      any = add_dense(accepted.bits(), parent_base, t) > 0;
    }
    std::sort(exits.begin(), exits.end());
    t.exits = intern(g_.table_exits, exit_index_, exits);
    t.specials = intern(g_.table_tokens, token_index_, specials);
    t.exits_at_once = at_once;
    t.leads_anywhere = any || !specials.empty() || !exits.empty();
    g_.tables.push_back(t);
    return static_cast<std::int32_t>(g_.tables.size() - 1);
  }

  // What the pools hold so far.
  std::int64_t bytes() const {
    return static_cast<std::int64_t>(g_.bitsets.size() * sizeof(std::uint32_t) + g_.table_tokens.size() * sizeof(token_id) +
                                     g_.table_exits.size() * sizeof(std::int32_t) + g_.tables.size() * sizeof(token_table));
  }

  void finish() {
    g_.tables.shrink_to_fit();
    g_.bitsets.shrink_to_fit();
    g_.table_tokens.shrink_to_fit();
    g_.table_exits.shrink_to_fit();
  }

 private:
  // A set of many tokens: an equal bitset kept already, the tokens themselves when few, the
  // differences from the parent's bitset when fewer than a bitset's words, or a bitset of its own.
  // Returns how many tokens it accepts.
  std::int64_t add_dense(const std::vector<std::uint32_t>& bits, std::int32_t parent_base, token_table& t) {
    std::int64_t count = 0;
    for (const std::uint32_t w : bits) count += bit_count(w);
    const std::uint64_t hash = hash_items(std::span<const std::uint32_t>(bits));
    for (auto [it, last] = bitset_index_.equal_range(hash); it != last; ++it) {
      if (std::ranges::equal(g_.bitset(it->second), bits)) {
        t.base = it->second;
        return count;
      }
    }
    std::int64_t differences = 0;
    if (parent_base >= 0) {
      const auto base = g_.bitset(parent_base);
      for (std::size_t w = 0; w < bits.size(); ++w) differences += bit_count(base[w] ^ bits[w]);
    }
    const std::int64_t words = g_.words;
    // The tokens in `bits` but not `base` (or the reverse: `in_base`), ascending.
    const auto listed_from = [&](std::int32_t base, bool in_base) {
      std::vector<token_id> out;
      for (std::size_t w = 0; w < bits.size(); ++w) {
        const std::uint32_t b = base >= 0 ? g_.bitset(base)[w] : 0u;
        for (std::uint32_t word = in_base ? b & ~bits[w] : bits[w] & ~b; word != 0; word &= word - 1) {
          out.push_back(static_cast<token_id>(w * 32 + static_cast<std::size_t>(std::countr_zero(word))));
        }
      }
      return out;
    };
    if (count <= words && (parent_base < 0 || count <= differences)) {
      t.listed = intern(g_.table_tokens, token_index_, listed_from(-1, false));
    } else if (parent_base >= 0 && differences <= words) {
      t.base = parent_base;
      t.listed = intern(g_.table_tokens, token_index_, listed_from(parent_base, false));
      t.removed = intern(g_.table_tokens, token_index_, listed_from(parent_base, true));
    } else {
      t.base = static_cast<std::int32_t>(g_.bitsets.size() / static_cast<std::size_t>(words));
      g_.bitsets.insert(g_.bitsets.end(), bits.begin(), bits.end());
      bitset_index_.emplace(hash, t.base);
    }
    return count;
  }

  template <class T>
  static pool_span intern(std::vector<T>& pool, std::unordered_multimap<std::uint64_t, pool_span>& index,
                          std::span<const T> items) {
    if (items.empty()) return {};
    const std::uint64_t hash = hash_items(items);
    for (auto [it, last] = index.equal_range(hash); it != last; ++it) {
      if (std::ranges::equal(std::span<const T>(pool.data() + it->second.begin, static_cast<std::size_t>(it->second.size)), items)) {
        return it->second;
      }
    }
    const pool_span span{static_cast<std::int32_t>(pool.size()), static_cast<std::int32_t>(items.size())};
    pool.insert(pool.end(), items.begin(), items.end());
    index.emplace(hash, span);
    return span;
  }
  template <class T>
  static pool_span intern(std::vector<T>& pool, std::unordered_multimap<std::uint64_t, pool_span>& index,
                          const std::vector<T>& items) {
    return intern(pool, index, std::span<const T>(items));
  }

  compiled_data& g_;
  std::unordered_multimap<std::uint64_t, std::int32_t> bitset_index_;
  std::unordered_multimap<std::uint64_t, pool_span> token_index_;
  std::unordered_multimap<std::uint64_t, pool_span> exit_index_;
};

class compiler {
 public:
  compiler(const grammar& g, const vocabulary_data& v, const tokenizer& tok, const compile_limits& limits)
      : g_(g), v_(v), tok_(tok), limits_(limits) {}

  result<std::unique_ptr<compiled_data>, grammar_error> run(compile_stats& stats);

 private:
  status too_large() const {
    return invalid_argument(format("the grammar is too large: more than {} automaton states", limits_.max_states));
  }
  grammar_error too_much_work() const {
    return grammar_error(format("the grammar is too large: compiling its token tables takes more than {} steps (long "
                                "bounded strings or arrays, large enums or many properties)",
                                limits_.max_compile_work),
                         "");
  }
  grammar_error too_much_memory() const {
    const std::int64_t mib = std::int64_t{1} << 20;
    const std::string limit = limits_.max_memory_bytes % mib == 0 ? format("{} MiB", limits_.max_memory_bytes / mib)
                                                                   : format("{} bytes", limits_.max_memory_bytes);
    return grammar_error(format("the grammar is too large: its automaton and token tables take more than {}", limit), "");
  }
  grammar_error too_ambiguous() const {
    return grammar_error(format("the grammar is too ambiguous: more than {} parses at once (rules or alternatives that "
                                "match the same text, nested)",
                                limits_.max_parses),
                         "");
  }
  // The token tables of the states in `needed`, shared by states that behave alike.
  // `parses`: the compile's sets, whose work limit counts every step of compiling.
  status make_tables(compiled_data& data, const std::vector<std::uint8_t>& needed, parse_sets& parses,
                     compile_stats& stats) const;
  status build(const expr& e, std::int32_t from, std::int32_t to);
  status build_class(const std::vector<codepoint_range>& ranges, bool json, std::int32_t from, std::int32_t to);
  void build_bytes(std::span<const std::pair<std::uint8_t, std::uint8_t>> ranges, std::int32_t from, std::int32_t to);
  std::int32_t suffix_state(std::span<const std::pair<std::uint8_t, std::uint8_t>> ranges, std::int32_t to);
  std::int64_t nfa_bytes() const;
  // The NFA within the limits of states and memory.
  status check_nfa() const;
  void build_literal(std::string_view bytes, std::int32_t from, std::int32_t to);
  status build_number(const number_range& range, std::int32_t from, std::int32_t to);
  void build_magnitude(const std::optional<decimal>& low, bool low_exclusive, const std::optional<decimal>& high,
                       bool high_exclusive, bool integer, std::int32_t from, std::int32_t to);

  const grammar& g_;
  const vocabulary_data& v_;
  const tokenizer& tok_;
  compile_limits limits_;
  nfa n_;
  std::vector<std::int32_t> rule_start_;   // NFA states
  std::vector<std::int32_t> rule_accept_;
  // The UTF-8 byte sequences of character classes share their tails (every three-byte character
  // ends with the same two continuation bytes), so that the DFA has one state for "two
  // continuation bytes left", not one per lead byte: the state reading a byte range (bits 32-47)
  // to a state (bits 0-31).
  std::unordered_map<std::uint64_t, std::int32_t> suffixes_;
};

void compiler::build_literal(std::string_view bytes, std::int32_t from, std::int32_t to) {
  std::int32_t at = from;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const std::int32_t next = i + 1 == bytes.size() ? to : n_.add();
    const auto b = static_cast<std::uint8_t>(bytes[i]);
    n_.link(at, {nfa::bytes, b, b, 0, next});
    at = next;
  }
  if (bytes.empty()) n_.link(from, {nfa::eps, 0, 0, 0, to});
}

void compiler::build_bytes(std::span<const std::pair<std::uint8_t, std::uint8_t>> ranges, std::int32_t from,
                           std::int32_t to) {
  n_.link(from, {nfa::bytes, ranges[0].first, ranges[0].second, 0, suffix_state(ranges.subspan(1), to)});
}

std::int32_t compiler::suffix_state(std::span<const std::pair<std::uint8_t, std::uint8_t>> ranges, std::int32_t to) {
  if (ranges.empty()) return to;
  const std::int32_t after = suffix_state(ranges.subspan(1), to);
  const std::uint64_t key = (static_cast<std::uint64_t>(ranges[0].first) << 40) |
                            (static_cast<std::uint64_t>(ranges[0].second) << 32) | static_cast<std::uint32_t>(after);
  const auto [it, added] = suffixes_.try_emplace(key, 0);
  if (added) {
    it->second = n_.add();
    n_.link(it->second, {nfa::bytes, ranges[0].first, ranges[0].second, 0, after});
  }
  return it->second;
}

std::int64_t compiler::nfa_bytes() const {
  // A node of the map is its key, value and link, and a bucket a pointer.
  constexpr std::int64_t node_bytes = 32;
  return n_.memory() + static_cast<std::int64_t>(suffixes_.size()) * node_bytes +
         static_cast<std::int64_t>(suffixes_.bucket_count() * sizeof(void*));
}

status compiler::check_nfa() const {
  if (n_.size() > static_cast<std::size_t>(limits_.max_states) * 4) return too_large();
  if (nfa_bytes() > limits_.max_memory_bytes) return too_much_memory();
  return {};
}

status compiler::build_class(const std::vector<codepoint_range>& ranges, bool json, std::int32_t from, std::int32_t to) {
  for (const codepoint_range& r : ranges) {
    char32_t lo = r.first;
    const char32_t hi = r.last;
    if (json) {
      // Characters JSON must escape, one by one, then the rest as they are.
      while (lo <= hi && (lo < 0x20 || lo == '"' || lo == '\\')) {
        std::string escaped;
        switch (lo) {
          case '"': escaped = "\\\""; break;
          case '\\': escaped = "\\\\"; break;
          case '\b': escaped = "\\b"; break;
          case '\f': escaped = "\\f"; break;
          case '\n': escaped = "\\n"; break;
          case '\r': escaped = "\\r"; break;
          case '\t': escaped = "\\t"; break;
          default: escaped = format("\\u{:04x}", static_cast<std::uint32_t>(lo));
        }
        build_literal(escaped, from, to);
        ++lo;
      }
      if (lo > hi) continue;
      // '"' and '\\' inside the range split it.
      for (const char32_t cut : {char32_t{'"'}, char32_t{'\\'}}) {
        if (lo < cut && cut <= hi) {
          EDGE_RETURN_IF_ERROR(build_class({{lo, cut - 1}}, true, from, to));
          EDGE_RETURN_IF_ERROR(build_class({{cut, hi}}, true, from, to));
          lo = hi + 1;
          break;
        }
      }
      if (lo > hi) continue;
    }
    utf8_ranges(lo, hi, [&](std::span<const std::pair<std::uint8_t, std::uint8_t>> bytes) { build_bytes(bytes, from, to); });
    EDGE_RETURN_IF_ERROR(check_nfa());
  }
  return {};
}

// A non-negative decimal in [low, high] (absent: 0 and unbounded), written as number_range says.
void compiler::build_magnitude(const std::optional<decimal>& low, bool low_exclusive, const std::optional<decimal>& high,
                               bool high_exclusive, bool integer, std::int32_t from, std::int32_t to) {
  const bound_digits lo = low ? bound_digits::of(*low) : bound_digits{};
  const bound_digits hi = high ? bound_digits::of(*high) : bound_digits{};
  const std::size_t lo_len = lo.whole.size();
  const std::size_t hi_len = hi.whole.size();
  constexpr int max_sig = number_range::max_significant_digits;
  const std::size_t max_whole = high ? std::max<std::size_t>(hi_len, 1) : std::max<std::size_t>(16, lo_len + 1);
  const std::size_t max_fraction =
      integer ? 0 : std::min<std::size_t>(std::max(lo.fraction.size(), hi.fraction.size()) + max_sig + 1, 64);

  // cmp: -1 less, 0 equal so far, 1 greater (a prefix compared digit by digit with the bound's).
  using whole_key = std::tuple<std::size_t, int, int, int>;      // digits, significant count, vs low, vs high
  using fraction_key = std::tuple<std::size_t, int, int, int>;   // digits, significant count, low equal?, high equal?
  std::map<whole_key, std::int32_t> wholes;
  std::map<fraction_key, std::int32_t> fractions;
  std::vector<std::pair<whole_key, std::int32_t>> whole_work;
  std::vector<std::pair<fraction_key, std::int32_t>> fraction_work;
  // The state of key `k` in `states`, added (and queued in `work`) the first time it is asked for.
  const auto state_of = [&](auto& states, auto& work, const auto& k) {
    auto [it, added] = states.try_emplace(k, 0);
    if (added) {
      it->second = n_.add();
      work.emplace_back(k, it->second);
    }
    return it->second;
  };
  const auto whole_state = [&](whole_key k) { return state_of(wholes, whole_work, k); };
  const auto fraction_state = [&](fraction_key k) { return state_of(fractions, fraction_work, k); };
  // The number may end with whole digits of `len`, compared as `vs_low` / `vs_high`, and
  // fraction digits up to `j` equal to the bounds' where still equal.
  const auto ends_ok = [&](bool low_equal, bool high_equal, std::size_t j) {
    if (low && low_equal) {
      if (!lo.fraction_rest_zero(j)) return false;  // below low
      if (low_exclusive) return false;              // equal to low
    }
    if (high && high_equal && hi.fraction_rest_zero(j) && high_exclusive) return false;
    return true;
  };
  // Whole part ended with `len` digits: how it stands against each bound.
  const auto whole_vs = [&](std::size_t len, std::size_t bound_len, int prefix_cmp) {
    return len < bound_len ? -1 : len > bound_len ? 1 : prefix_cmp;
  };
  const auto after_whole = [&](std::size_t len, int sig, int vs_low, int vs_high, std::int32_t state) {
    const int low_cmp = low ? whole_vs(len, lo_len, vs_low) : 1;
    const int high_cmp = high ? whole_vs(len, hi_len, vs_high) : -1;
    if (low_cmp < 0 || high_cmp > 0) return;
    if (ends_ok(low_cmp == 0, high_cmp == 0, 0)) n_.link(state, {nfa::eps, 0, 0, 0, to});
    if (max_fraction > 0) {
      const std::int32_t dot = fraction_state({0, sig, low_cmp == 0 ? 1 : 0, high_cmp == 0 ? 1 : 0});
      // fraction_state() made the state after '.': link it.
      n_.link(state, {nfa::bytes, '.', '.', 0, dot});
    }
  };
  // "0" as the whole part.
  {
    const std::int32_t zero = n_.add();
    n_.link(from, {nfa::bytes, '0', '0', 0, zero});
    after_whole(0, 0, 0, 0, zero);
  }
  for (int d = 1; d <= 9; ++d) {
    const int vs_low = lo_len >= 1 ? (d < lo.whole[0] - '0' ? -1 : d > lo.whole[0] - '0' ? 1 : 0) : 1;
    const int vs_high = hi_len >= 1 ? (d < hi.whole[0] - '0' ? -1 : d > hi.whole[0] - '0' ? 1 : 0) : 1;
    const auto c = static_cast<std::uint8_t>('0' + d);
    n_.link(from, {nfa::bytes, c, c, 0, whole_state({1, 1, vs_low, vs_high})});
  }
  while (!whole_work.empty() || !fraction_work.empty()) {
    if (!whole_work.empty()) {
      const auto [key, state] = whole_work.back();
      whole_work.pop_back();
      // Named copies, not structured bindings: lambdas below capture them.
      const std::size_t len = std::get<0>(key);
      const int sig = std::get<1>(key);
      const int vs_low = std::get<2>(key);
      const int vs_high = std::get<3>(key);
      after_whole(len, sig, vs_low, vs_high, state);
      if (len >= max_whole) continue;
      for (int d = 0; d <= 9; ++d) {
        if (d != 0 && sig + 1 > max_sig) continue;
        const auto next_cmp = [&](int cmp, const std::string& whole) {
          if (cmp != 0 || len >= whole.size()) return cmp;
          const int b = whole[len] - '0';
          return d < b ? -1 : d > b ? 1 : 0;
        };
        const int next_sig = std::min(sig + 1, max_sig);
        const auto c = static_cast<std::uint8_t>('0' + d);
        n_.link(state, {nfa::bytes, c, c, 0,
                        whole_state({len + 1, next_sig, next_cmp(vs_low, lo.whole), next_cmp(vs_high, hi.whole)})});
      }
      continue;
    }
    const auto [key, state] = fraction_work.back();
    fraction_work.pop_back();
    const auto [j, sig, low_equal, high_equal] = key;
    if (j > 0 && ends_ok(low_equal != 0, high_equal != 0, j)) n_.link(state, {nfa::eps, 0, 0, 0, to});
    if (j >= max_fraction) continue;
    for (int d = 0; d <= 9; ++d) {
      if (d != 0 && sig + 1 > max_sig) continue;
      int next_low = low_equal;
      if (low && low_equal) {
        const int b = lo.fraction_digit(j);
        if (d < b) continue;
        next_low = d == b ? 1 : 0;
      }
      int next_high = high_equal;
      if (high && high_equal) {
        const int b = hi.fraction_digit(j);
        if (d > b) continue;
        next_high = d == b ? 1 : 0;
      }
      const int next_sig = sig == 0 && d == 0 ? 0 : std::min(sig + 1, max_sig);
      const auto c = static_cast<std::uint8_t>('0' + d);
      n_.link(state, {nfa::bytes, c, c, 0, fraction_state({j + 1, next_sig, next_low, next_high})});
    }
  }
}

status compiler::build_number(const number_range& r, std::int32_t from, std::int32_t to) {
  const bool bounded = r.low || r.high;
  // Before an exponent, when one may follow.
  std::int32_t mantissa_end = to;
  if (!r.integer && !bounded) {
    mantissa_end = n_.add();
    n_.link(mantissa_end, {nfa::eps, 0, 0, 0, to});
    const std::int32_t e = n_.add();
    n_.link(mantissa_end, {nfa::bytes, 'e', 'e', 0, e});
    n_.link(mantissa_end, {nfa::bytes, 'E', 'E', 0, e});
    const std::int32_t sign = n_.add();
    n_.link(e, {nfa::eps, 0, 0, 0, sign});
    n_.link(e, {nfa::bytes, '+', '+', 0, sign});
    n_.link(e, {nfa::bytes, '-', '-', 0, sign});
    const std::int32_t one = n_.add();
    n_.link(sign, {nfa::bytes, '0', '9', 0, one});
    n_.link(one, {nfa::eps, 0, 0, 0, to});
    n_.link(one, {nfa::bytes, '0', '9', 0, to});
  }
  const decimal zero{};
  // Non-negative values: [max(low, 0), high].
  const bool low_negative = r.low && r.low->negative;
  const bool high_negative = r.high && r.high->negative;
  if (!high_negative && !(r.high && compare(*r.high, zero) == 0 && r.high_exclusive)) {
    const std::optional<decimal> low = r.low && !low_negative ? r.low : std::optional<decimal>();
    build_magnitude(low, low ? r.low_exclusive : false, r.high, r.high_exclusive, r.integer, from, mantissa_end);
  }
  // Negative values: -y with y in (max(-high, 0), -low].
  if (!r.low || low_negative) {
    const std::int32_t minus = n_.add();
    n_.link(from, {nfa::bytes, '-', '-', 0, minus});
    std::optional<decimal> y_low;
    bool y_low_exclusive = true;  // y > 0: no "-0"
    if (r.high && r.high->negative) {
      y_low = r.high;
      y_low->negative = false;
      y_low_exclusive = r.high_exclusive;
    }
    std::optional<decimal> y_high;
    if (r.low) {
      y_high = r.low;
      y_high->negative = false;
    }
    if (!y_low) y_low = zero;
    build_magnitude(y_low, y_low_exclusive, y_high, r.low_exclusive, r.integer, minus, mantissa_end);
  }
  EDGE_RETURN_IF_ERROR(check_nfa());
  return {};
}

status compiler::build(const expr& e, std::int32_t from, std::int32_t to) {
  EDGE_RETURN_IF_ERROR(check_nfa());
  const expr_node& n = e.node();
  switch (n.kind) {
    case expr_kind::empty: n_.link(from, {nfa::eps, 0, 0, 0, to}); return {};
    case expr_kind::literal: build_literal(n.text, from, to); return {};
    case expr_kind::special_token: {
      const auto id = tok_.find_token(n.text);
      if (!id) return invalid_argument(format("the vocabulary has no token '{}'", n.text));
      n_.link(from, {nfa::special, 0, 0, *id, to});
      return {};
    }
    case expr_kind::char_class: return build_class(n.ranges, false, from, to);
    case expr_kind::json_char_class: return build_class(n.ranges, true, from, to);
    case expr_kind::any_json_char: {
      // Raw: every scalar value from U+0020 but '"' and '\\' (surrogates are none); escaped: the
      // short escapes, and \uXXXX of any code point but a surrogate half.
      EDGE_RETURN_IF_ERROR(
          build_class({{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0xD7FF}, {0xE000, 0x10FFFF}}, false, from, to));
      const std::int32_t backslash = n_.add();
      n_.link(from, {nfa::bytes, '\\', '\\', 0, backslash});
      for (const char c : std::string_view("\"\\/bfnrt")) {
        const auto b = static_cast<std::uint8_t>(c);
        n_.link(backslash, {nfa::bytes, b, b, 0, to});
      }
      const std::int32_t u = n_.add();
      n_.link(backslash, {nfa::bytes, 'u', 'u', 0, u});
      const auto hex_then = [&](std::int32_t at, std::int32_t next) {
        n_.link(at, {nfa::bytes, '0', '9', 0, next});
        n_.link(at, {nfa::bytes, 'a', 'f', 0, next});
        n_.link(at, {nfa::bytes, 'A', 'F', 0, next});
      };
      const std::int32_t h1 = n_.add();  // after a first digit that is not D
      const std::int32_t h1d = n_.add(); // after D: no 8-F next (surrogates)
      const std::int32_t h2 = n_.add();
      const std::int32_t h3 = n_.add();
      for (const auto& [lo, hi] : {std::pair<std::uint8_t, std::uint8_t>{'0', '9'}, {'a', 'c'}, {'A', 'C'}, {'e', 'f'}, {'E', 'F'}}) {
        n_.link(u, {nfa::bytes, lo, hi, 0, h1});
      }
      n_.link(u, {nfa::bytes, 'd', 'd', 0, h1d});
      n_.link(u, {nfa::bytes, 'D', 'D', 0, h1d});
      hex_then(h1, h2);
      n_.link(h1d, {nfa::bytes, '0', '7', 0, h2});
      hex_then(h2, h3);
      hex_then(h3, to);
      return {};
    }
    case expr_kind::sequence: {
      std::int32_t at = from;
      for (std::size_t i = 0; i < n.items.size(); ++i) {
        const std::int32_t next = i + 1 == n.items.size() ? to : n_.add();
        EDGE_RETURN_IF_ERROR(build(n.items[i], at, next));
        at = next;
      }
      return {};
    }
    case expr_kind::alternation:
      for (const expr& item : n.items) {
        // Each alternative between states of its own, so that no loop of one leaks into another.
        const std::int32_t a = n_.add();
        const std::int32_t b = n_.add();
        n_.link(from, {nfa::eps, 0, 0, 0, a});
        EDGE_RETURN_IF_ERROR(build(item, a, b));
        n_.link(b, {nfa::eps, 0, 0, 0, to});
      }
      return {};
    case expr_kind::repeat: {
      const expr& item = n.items.front();
      std::int32_t at = from;
      for (std::int64_t i = 0; i < n.min; ++i) {
        const std::int32_t next = n_.add();
        EDGE_RETURN_IF_ERROR(build(item, at, next));
        at = next;
      }
      if (n.max < 0) {
        const std::int32_t loop = n_.add();
        const std::int32_t back = n_.add();
        n_.link(at, {nfa::eps, 0, 0, 0, loop});
        EDGE_RETURN_IF_ERROR(build(item, loop, back));
        n_.link(back, {nfa::eps, 0, 0, 0, loop});
        n_.link(loop, {nfa::eps, 0, 0, 0, to});
        return {};
      }
      for (std::int64_t i = n.min; i < n.max; ++i) {
        n_.link(at, {nfa::eps, 0, 0, 0, to});
        const std::int32_t next = i + 1 == n.max ? to : n_.add();
        EDGE_RETURN_IF_ERROR(build(item, at, next));
        at = next;
      }
      if (n.min == n.max) n_.link(at, {nfa::eps, 0, 0, 0, to});
      return {};
    }
    case expr_kind::rule_ref: n_.link(from, {nfa::call, 0, 0, n.rule, to}); return {};
    case expr_kind::number: return build_number(n.number, from, to);
  }
  return {};
}

// One rule's DFA before the rules are put together.
struct rule_dfa {
  std::vector<std::int32_t> next;                                // [states][classes] -> state, -1 none
  std::vector<std::pair<std::int32_t, std::int32_t>> calls;       // (rule, state), by rule
  std::vector<std::pair<token_id, std::int32_t>> specials;        // (token, state), by token
  std::vector<std::int32_t> call_end;                            // [states] where each one's calls end
  std::vector<std::int32_t> special_end;                         // [states]
  std::vector<std::uint8_t> accepting;
  std::array<std::uint8_t, 256> class_of{};
  std::int32_t classes = 0;
  std::int32_t size() const { return static_cast<std::int32_t>(accepting.size()); }
  std::span<const std::int32_t> next_of(std::int32_t s) const {
    return {next.data() + static_cast<std::size_t>(s) * static_cast<std::size_t>(classes), static_cast<std::size_t>(classes)};
  }
  std::span<const std::pair<std::int32_t, std::int32_t>> calls_of(std::int32_t s) const {
    const std::int32_t begin = s == 0 ? 0 : call_end[static_cast<std::size_t>(s) - 1];
    return {calls.data() + begin, static_cast<std::size_t>(call_end[static_cast<std::size_t>(s)] - begin)};
  }
  std::span<const std::pair<token_id, std::int32_t>> specials_of(std::int32_t s) const {
    const std::int32_t begin = s == 0 ? 0 : special_end[static_cast<std::size_t>(s) - 1];
    return {specials.data() + begin, static_cast<std::size_t>(special_end[static_cast<std::size_t>(s)] - begin)};
  }
};

result<std::unique_ptr<compiled_data>, grammar_error> compiler::run(compile_stats& stats) {
  // The NFA: a start and an accept state per rule; the root is one more rule.
  const auto rules = static_cast<std::int32_t>(g_.rules().size()) + 1;
  for (std::int32_t r = 0; r < rules; ++r) {
    rule_start_.push_back(n_.add());
    rule_accept_.push_back(n_.add());
  }
  for (std::int32_t r = 0; r < rules; ++r) {
    const expr& body = r + 1 == rules ? g_.root() : g_.rules()[static_cast<std::size_t>(r)].body;
    if (status built = build(body, rule_start_[static_cast<std::size_t>(r)], rule_accept_[static_cast<std::size_t>(r)]);
        !built.ok()) {
      return grammar_error(built);
    }
  }

  // The sets of parses every walk of compiling uses, and the work limit of the whole compile.
  parse_sets budget(limits_.max_parses, limits_.max_compile_work);
  // Subset construction, rule by rule.
  std::vector<rule_dfa> dfas(static_cast<std::size_t>(rules));
  std::int64_t total_states = 0;
  // Scratch shared by every rule: NFA states marked with the current set_stamp are in the set built.
  std::vector<std::int32_t> in_set(n_.size(), 0);
  std::int32_t set_stamp = 0;
  std::vector<std::int32_t> pending;
  // The epsilon closure of `set`, sorted.
  const auto close = [&](std::vector<std::int32_t>& set) {
    ++set_stamp;
    for (const std::int32_t s : set) in_set[static_cast<std::size_t>(s)] = set_stamp;
    pending.assign(set.begin(), set.end());
    while (!pending.empty()) {
      const std::int32_t s = pending.back();
      pending.pop_back();
      for (const nfa::edge& e : n_.out(s)) {
        if (e.k == nfa::eps && in_set[static_cast<std::size_t>(e.to)] != set_stamp) {
          in_set[static_cast<std::size_t>(e.to)] = set_stamp;
          set.push_back(e.to);
          pending.push_back(e.to);
        }
      }
    }
    std::sort(set.begin(), set.end());
  };
  std::int64_t dfa_bytes = 0;  // the rows of the rules done and being done
  std::vector<std::vector<std::int32_t>> by_class;          // [class] the NFA states a byte of it leads to
  std::vector<std::pair<std::int32_t, std::int32_t>> other;  // (rule or token, NFA state) of calls, then specials
  std::vector<std::int32_t> targets;
  for (std::int32_t r = 0; r < rules; ++r) {
    rule_dfa& d = dfas[static_cast<std::size_t>(r)];
    // Byte classes: the boundaries of every byte range in the rule's part of the NFA.
    std::array<bool, 257> cut{};
    ++set_stamp;
    pending.assign(1, rule_start_[static_cast<std::size_t>(r)]);
    in_set[static_cast<std::size_t>(pending.front())] = set_stamp;
    while (!pending.empty()) {
      const std::int32_t s = pending.back();
      pending.pop_back();
      for (const nfa::edge& e : n_.out(s)) {
        if (e.k == nfa::bytes) {
          cut[e.lo] = true;
          cut[static_cast<std::size_t>(e.hi) + 1] = true;
        }
        if (in_set[static_cast<std::size_t>(e.to)] != set_stamp) {
          in_set[static_cast<std::size_t>(e.to)] = set_stamp;
          pending.push_back(e.to);
        }
      }
    }
    std::int32_t cls = -1;
    for (int b = 0; b < 256; ++b) {
      if (b == 0 || cut[static_cast<std::size_t>(b)]) ++cls;
      d.class_of[static_cast<std::size_t>(b)] = static_cast<std::uint8_t>(cls);
    }
    d.classes = cls + 1;
    by_class.resize(static_cast<std::size_t>(d.classes));

    // DFA states by their NFA sets, the sets one after another in `members`.
    std::vector<std::int32_t> members;
    std::vector<std::int32_t> member_begin(1, 0);  // [sets + 1]
    std::unordered_multimap<std::uint64_t, std::int32_t> ids;  // a hash of a set -> its state
    const auto set_of = [&](std::size_t k) {
      return std::span<const std::int32_t>(members.data() + member_begin[k],
                                           static_cast<std::size_t>(member_begin[k + 1] - member_begin[k]));
    };
    const auto id_of = [&](std::vector<std::int32_t>& set) -> std::int32_t {
      close(set);
      const std::uint64_t hash = hash_items(std::span<const std::int32_t>(set));
      for (auto [it, last] = ids.equal_range(hash); it != last; ++it) {
        if (std::ranges::equal(set_of(static_cast<std::size_t>(it->second)), set)) return it->second;
      }
      const auto id = static_cast<std::int32_t>(member_begin.size() - 1);
      members.insert(members.end(), set.begin(), set.end());
      member_begin.push_back(static_cast<std::int32_t>(members.size()));
      ids.emplace(hash, id);
      return id;
    };
    targets.assign(1, rule_start_[static_cast<std::size_t>(r)]);
    id_of(targets);
    const std::int32_t accept = rule_accept_[static_cast<std::size_t>(r)];
    for (std::size_t k = 0; k + 1 < member_begin.size(); ++k) {
      if (total_states + static_cast<std::int64_t>(member_begin.size() - 1) > limits_.max_states) {
        return grammar_error(too_large());
      }
      // The rows are what the compiled grammar's transitions will take; with the sets and their
      // index, what the DFAs hold.
      dfa_bytes += static_cast<std::int64_t>(d.classes) * static_cast<std::int64_t>(sizeof(std::int32_t));
      if (dfa_bytes + static_cast<std::int64_t>(members.capacity() * sizeof(std::int32_t) + ids.size() * 32) >
          limits_.max_memory_bytes) {
        return too_much_memory();
      }
      d.accepting.push_back(std::ranges::binary_search(set_of(k), accept) ? 1 : 0);
      for (auto& b : by_class) b.clear();
      other.clear();
      std::size_t calls = 0;
      std::int64_t steps = d.classes;
      for (const std::int32_t s : set_of(k)) {
        for (const nfa::edge& e : n_.out(s)) {
          ++steps;
          if (e.k == nfa::bytes) {
            for (std::int32_t c = d.class_of[e.lo]; c <= d.class_of[e.hi]; ++c) by_class[static_cast<std::size_t>(c)].push_back(e.to);
          } else if (e.k == nfa::call) {
            other.insert(other.begin() + static_cast<std::ptrdiff_t>(calls++), {e.label, e.to});
          } else if (e.k == nfa::special) {
            other.emplace_back(e.label, e.to);
          }
        }
      }
      if (!budget.spend(steps)) return too_much_work();
      const std::size_t row = d.next.size();
      d.next.resize(row + static_cast<std::size_t>(d.classes), -1);
      for (std::int32_t c = 0; c < d.classes; ++c) {
        if (by_class[static_cast<std::size_t>(c)].empty()) continue;
        std::vector<std::int32_t>& to = by_class[static_cast<std::size_t>(c)];
        std::sort(to.begin(), to.end());
        to.erase(std::unique(to.begin(), to.end()), to.end());
        d.next[row + static_cast<std::size_t>(c)] = id_of(to);
      }
      // Calls then special tokens, each by rule or token with the states it leads to together.
      std::sort(other.begin(), other.begin() + static_cast<std::ptrdiff_t>(calls));
      std::sort(other.begin() + static_cast<std::ptrdiff_t>(calls), other.end());
      for (std::size_t i = 0; i < other.size();) {
        std::size_t j = i;
        targets.clear();
        for (; j < other.size() && other[j].first == other[i].first && (j < calls) == (i < calls); ++j) {
          targets.push_back(other[j].second);
        }
        const std::pair<std::int32_t, std::int32_t> edge{other[i].first, id_of(targets)};
        (i < calls ? d.calls : d.specials).push_back(edge);
        i = j;
      }
      d.call_end.push_back(static_cast<std::int32_t>(d.calls.size()));
      d.special_end.push_back(static_cast<std::int32_t>(d.specials.size()));
    }
    total_states += d.size();
  }
  n_ = nfa{};
  suffixes_.clear();

  // Productive rules (those with a finite match), then nullable ones.
  std::vector<std::uint8_t> productive(static_cast<std::size_t>(rules), 0);
  std::vector<std::uint8_t> nullable(static_cast<std::size_t>(rules), 0);
  // Whether rule r reaches an accepting state from its start over edges `usable` allows.
  const auto reaches_accept = [&](std::int32_t r, bool bytes_allowed, const std::vector<std::uint8_t>& callable) {
    const rule_dfa& d = dfas[static_cast<std::size_t>(r)];
    std::vector<std::uint8_t> seen(static_cast<std::size_t>(d.size()), 0);
    std::vector<std::int32_t> work = {0};
    seen[0] = 1;
    while (!work.empty()) {
      const std::int32_t s = work.back();
      work.pop_back();
      if (d.accepting[static_cast<std::size_t>(s)]) return true;
      const auto visit = [&](std::int32_t t) {
        if (t >= 0 && !seen[static_cast<std::size_t>(t)]) {
          seen[static_cast<std::size_t>(t)] = 1;
          work.push_back(t);
        }
      };
      if (bytes_allowed) {
        for (const std::int32_t t : d.next_of(s)) visit(t);
        for (const auto& [token, t] : d.specials_of(s)) visit(t);
      }
      for (const auto& [callee, t] : d.calls_of(s)) {
        if (callable[static_cast<std::size_t>(callee)]) visit(t);
      }
    }
    return false;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (std::int32_t r = 0; r < rules; ++r) {
      if (!productive[static_cast<std::size_t>(r)] && reaches_accept(r, true, productive)) {
        productive[static_cast<std::size_t>(r)] = 1;
        changed = true;
      }
      if (!nullable[static_cast<std::size_t>(r)] && reaches_accept(r, false, nullable)) {
        nullable[static_cast<std::size_t>(r)] = 1;
        changed = true;
      }
    }
  }
  const std::int32_t root = rules - 1;
  if (!productive[static_cast<std::size_t>(root)]) {
    return grammar_error("the grammar matches no finite output (every way through it recurses forever)", "");
  }
  const auto rule_name = [&](std::int32_t r) {
    return r == root ? std::string("the root") : format("rule '{}'", g_.rules()[static_cast<std::size_t>(r)].name);
  };
  // Left recursion: the rules each rule may call before it consumes a byte.
  std::vector<std::vector<std::int32_t>> calls_first(static_cast<std::size_t>(rules));
  for (std::int32_t r = 0; r < rules; ++r) {
    const rule_dfa& d = dfas[static_cast<std::size_t>(r)];
    std::vector<std::uint8_t> seen(static_cast<std::size_t>(d.size()), 0);
    std::vector<std::int32_t> work = {0};
    seen[0] = 1;
    while (!work.empty()) {
      const std::int32_t s = work.back();
      work.pop_back();
      for (const auto& [callee, t] : d.calls_of(s)) {
        if (!productive[static_cast<std::size_t>(callee)]) continue;
        calls_first[static_cast<std::size_t>(r)].push_back(callee);
        if (nullable[static_cast<std::size_t>(callee)] && !seen[static_cast<std::size_t>(t)]) {
          seen[static_cast<std::size_t>(t)] = 1;
          work.push_back(t);
        }
      }
    }
  }
  {
    std::vector<std::uint8_t> mark(static_cast<std::size_t>(rules), 0);  // 1 on the path, 2 done
    std::function<std::optional<std::int32_t>(std::int32_t)> visit = [&](std::int32_t r) -> std::optional<std::int32_t> {
      mark[static_cast<std::size_t>(r)] = 1;
      for (const std::int32_t callee : calls_first[static_cast<std::size_t>(r)]) {
        if (mark[static_cast<std::size_t>(callee)] == 1) return callee;
        if (mark[static_cast<std::size_t>(callee)] == 0) {
          if (auto found = visit(callee)) return found;
        }
      }
      mark[static_cast<std::size_t>(r)] = 2;
      return std::nullopt;
    };
    for (std::int32_t r = 0; r < rules; ++r) {
      if (mark[static_cast<std::size_t>(r)] != 0 || !productive[static_cast<std::size_t>(r)]) continue;
      if (auto cycle = visit(r)) {
        return grammar_error(format("{} is left-recursive: it can reach itself before it matches a byte", rule_name(*cycle)), "");
      }
    }
  }

  // Keep, in each productive rule, the states on some way from its start to an accepting one.
  auto data = std::make_unique<compiled_data>();
  std::vector<std::vector<std::int32_t>> global(static_cast<std::size_t>(rules));  // local -> global, -1 dropped
  std::int32_t count = 0;
  std::vector<std::int32_t> work;
  std::vector<std::int32_t> pred_begin;  // CSR: the states with an edge to each state, once each
  std::vector<std::int32_t> preds;
  std::vector<std::int32_t> last_from;
  for (std::int32_t r = 0; r < rules; ++r) {
    const rule_dfa& d = dfas[static_cast<std::size_t>(r)];
    const auto n = static_cast<std::size_t>(d.size());
    global[static_cast<std::size_t>(r)].assign(n, -1);
    if (!productive[static_cast<std::size_t>(r)]) continue;
    // Calls of unproductive rules lead nowhere.
    const auto edges = [&](std::int32_t s, const auto& visit) {
      for (const std::int32_t t : d.next_of(s)) {
        if (t >= 0) visit(t);
      }
      for (const auto& [token, t] : d.specials_of(s)) visit(t);
      for (const auto& [callee, t] : d.calls_of(s)) {
        if (productive[static_cast<std::size_t>(callee)]) visit(t);
      }
    };
    pred_begin.assign(n + 1, 0);
    last_from.assign(n, -1);
    for (std::int32_t s = 0; s < d.size(); ++s) {
      edges(s, [&](std::int32_t t) {
        if (last_from[static_cast<std::size_t>(t)] == s) return;
        last_from[static_cast<std::size_t>(t)] = s;
        ++pred_begin[static_cast<std::size_t>(t) + 1];
      });
    }
    for (std::size_t i = 1; i <= n; ++i) pred_begin[i] += pred_begin[i - 1];
    preds.resize(static_cast<std::size_t>(pred_begin[n]));
    last_from.assign(n, -1);
    {
      std::vector<std::int32_t> at(pred_begin.begin(), pred_begin.end() - 1);
      for (std::int32_t s = 0; s < d.size(); ++s) {
        edges(s, [&](std::int32_t t) {
          if (last_from[static_cast<std::size_t>(t)] == s) return;
          last_from[static_cast<std::size_t>(t)] = s;
          preds[static_cast<std::size_t>(at[static_cast<std::size_t>(t)]++)] = s;
        });
      }
    }
    std::vector<std::uint8_t> forward(n, 0);
    work.assign(1, 0);
    forward[0] = 1;
    while (!work.empty()) {
      const std::int32_t s = work.back();
      work.pop_back();
      edges(s, [&](std::int32_t t) {
        if (!forward[static_cast<std::size_t>(t)]) {
          forward[static_cast<std::size_t>(t)] = 1;
          work.push_back(t);
        }
      });
    }
    std::vector<std::uint8_t> live(n, 0);
    for (std::int32_t s = 0; s < d.size(); ++s) {
      if (forward[static_cast<std::size_t>(s)] && d.accepting[static_cast<std::size_t>(s)]) {
        live[static_cast<std::size_t>(s)] = 1;
        work.push_back(s);
      }
    }
    while (!work.empty()) {
      const std::int32_t s = work.back();
      work.pop_back();
      for (std::int32_t k = pred_begin[static_cast<std::size_t>(s)]; k < pred_begin[static_cast<std::size_t>(s) + 1]; ++k) {
        const std::int32_t p = preds[static_cast<std::size_t>(k)];
        if (forward[static_cast<std::size_t>(p)] && !live[static_cast<std::size_t>(p)]) {
          live[static_cast<std::size_t>(p)] = 1;
          work.push_back(p);
        }
      }
    }
    for (std::int32_t s = 0; s < d.size(); ++s) {
      if (live[static_cast<std::size_t>(s)]) global[static_cast<std::size_t>(r)][static_cast<std::size_t>(s)] = count++;
    }
  }
  data->rules.resize(static_cast<std::size_t>(rules));
  data->root_rule = root;
  data->rule_of.assign(static_cast<std::size_t>(count), 0);
  data->accepting.assign(static_cast<std::size_t>(count), 0);
  data->row.assign(static_cast<std::size_t>(count), 0);
  data->call_begin.assign(static_cast<std::size_t>(count) + 1, 0);
  data->special_begin.assign(static_cast<std::size_t>(count) + 1, 0);
  {
    std::size_t cells = 0;
    for (std::int32_t r = 0; r < rules; ++r) {
      for (const std::int32_t gs : global[static_cast<std::size_t>(r)]) {
        if (gs >= 0) cells += static_cast<std::size_t>(dfas[static_cast<std::size_t>(r)].classes);
      }
    }
    data->next.reserve(cells);
  }
  // Global states are numbered rule by rule in local order: each one's edges are appended in turn.
  for (std::int32_t r = 0; r < rules; ++r) {
    const rule_dfa& d = dfas[static_cast<std::size_t>(r)];
    const std::vector<std::int32_t>& to_global = global[static_cast<std::size_t>(r)];
    compiled_rule& out = data->rules[static_cast<std::size_t>(r)];
    out.name = r == root ? "root" : g_.rules()[static_cast<std::size_t>(r)].name;
    out.class_of = d.class_of;
    out.classes = d.classes;
    out.start = to_global[0];
    for (std::int32_t s = 0; s < d.size(); ++s) {
      const std::int32_t gs = to_global[static_cast<std::size_t>(s)];
      if (gs < 0) continue;
      const auto at = static_cast<std::size_t>(gs);
      data->rule_of[at] = r;
      data->accepting[at] = d.accepting[static_cast<std::size_t>(s)];
      data->row[at] = static_cast<std::int32_t>(data->next.size());
      for (const std::int32_t t : d.next_of(s)) data->next.push_back(t < 0 ? -1 : to_global[static_cast<std::size_t>(t)]);
      for (const auto& [callee, t] : d.calls_of(s)) {
        const std::int32_t gt = to_global[static_cast<std::size_t>(t)];
        if (productive[static_cast<std::size_t>(callee)] && gt >= 0) data->calls.push_back({callee, gt});
      }
      for (const auto& [token, t] : d.specials_of(s)) {
        const std::int32_t gt = to_global[static_cast<std::size_t>(t)];
        if (gt >= 0) data->specials.push_back({token, gt});
      }
      data->call_begin[at + 1] = static_cast<std::int32_t>(data->calls.size());
      data->special_begin[at + 1] = static_cast<std::int32_t>(data->specials.size());
    }
    // Done with: the compiled grammar grows as the DFAs shrink.
    dfas[static_cast<std::size_t>(r)] = rule_dfa{};
  }
  data->pure_return.assign(static_cast<std::size_t>(count), 0);
  for (std::int32_t s = 0; s < count; ++s) {
    bool leaves = data->call_begin[static_cast<std::size_t>(s)] != data->call_begin[static_cast<std::size_t>(s) + 1] ||
                  data->special_begin[static_cast<std::size_t>(s)] != data->special_begin[static_cast<std::size_t>(s) + 1];
    const compiled_rule& r = data->rules[static_cast<std::size_t>(data->rule_of[static_cast<std::size_t>(s)])];
    for (std::int32_t c = 0; c < r.classes && !leaves; ++c) {
      leaves = data->next[static_cast<std::size_t>(data->row[static_cast<std::size_t>(s)] + c)] >= 0;
    }
    data->pure_return[static_cast<std::size_t>(s)] = data->accepting[static_cast<std::size_t>(s)] && !leaves ? 1 : 0;
  }

  // Token tables for the states a parse can stand at between tokens: the root's start, and
  // where a byte, a special token or a return leads.
  std::vector<std::uint8_t> needed(static_cast<std::size_t>(count), 0);
  needed[static_cast<std::size_t>(data->rules[static_cast<std::size_t>(root)].start)] = 1;
  for (const std::int32_t t : data->next) {
    if (t >= 0) needed[static_cast<std::size_t>(t)] = 1;
  }
  for (const call_edge& c : data->calls) needed[static_cast<std::size_t>(c.next)] = 1;
  for (const special_edge& e : data->specials) needed[static_cast<std::size_t>(e.next)] = 1;
  data->table_of.assign(static_cast<std::size_t>(count), -1);
  data->words = static_cast<std::int32_t>(mask_words(v_.size));
  data->max_parses = limits_.max_parses;
  data->max_parse_work = limits_.max_parse_work;
  data->next.shrink_to_fit();
  data->calls.shrink_to_fit();
  data->specials.shrink_to_fit();
  if (data->memory_bytes() > limits_.max_memory_bytes) return too_much_memory();

  if (status made = make_tables(*data, needed, budget, stats); !made.ok()) return grammar_error(made);
  stats.rules = rules;
  stats.states = count;
  return data;
}

status compiler::make_tables(compiled_data& data, const std::vector<std::uint8_t>& needed, parse_sets& parses,
                             compile_stats& stats) const {
  const std::int32_t count = data.states();
  const auto past_a_limit = [&] { return parses.out_of_work() ? too_much_work() : too_ambiguous(); };
  state_classes classes;
  if (!refine(data, static_cast<std::int32_t>(v_.max_token_bytes), parses, classes)) return past_a_limit();
  const auto class_count = static_cast<std::int32_t>(classes.born.size());
  // A class's table starts from its parent's: the parent's table is made too.
  std::vector<std::uint8_t> required(static_cast<std::size_t>(class_count), 0);
  std::vector<std::int32_t> representative(static_cast<std::size_t>(class_count), -1);
  for (std::int32_t s = 0; s < count; ++s) {
    const auto c = static_cast<std::size_t>(classes.of[static_cast<std::size_t>(s)]);
    if (representative[c] < 0) representative[c] = s;
    if (needed[static_cast<std::size_t>(s)]) required[c] = 1;
  }
  for (std::int32_t c = class_count - 1; c >= 0; --c) {
    if (required[static_cast<std::size_t>(c)] && classes.born[static_cast<std::size_t>(c)] > 0) {
      required[static_cast<std::size_t>(classes.parent[static_cast<std::size_t>(c)])] = 1;
    }
  }
  table_store store(data);
  table_walk walk(data, v_, parses);
  std::vector<std::int32_t> table_of_class(static_cast<std::size_t>(class_count), -1);
  token_set accepted(data.words);
  std::vector<std::uint32_t> parent_bits;
  std::vector<std::int32_t> exits;
  std::vector<token_id> table_specials;
  const std::int64_t automaton_bytes = data.memory_bytes();
  const auto token_bytes = [&](token_id t) {
    return static_cast<std::int32_t>(v_.byte_offset[static_cast<std::size_t>(t) + 1] - v_.byte_offset[static_cast<std::size_t>(t)]);
  };
  for (std::int32_t c = 0; c < class_count; ++c) {
    if (!required[static_cast<std::size_t>(c)]) continue;
    // Born at n: alike its parent for every string of fewer than n bytes, so the parent's tokens
    // of fewer bytes and exits at fewer bytes are this class's too; only the deeper rest is walked.
    const std::int32_t from = std::max(classes.born[static_cast<std::size_t>(c)], 0);
    accepted.clear();
    exits.clear();
    table_specials.clear();
    bool at_once = false;
    std::int32_t base = -1;
    if (from > 0) {
      const auto parent = static_cast<std::size_t>(table_of_class[static_cast<std::size_t>(classes.parent[static_cast<std::size_t>(c)])]);
      const token_table& p = data.tables[parent];
      if (p.base < 0) {
        for (const token_id t : data.tokens(p.listed)) {
          if (token_bytes(t) < from) accepted.add(t);
        }
      } else {
        // The parent's bitset less its tokens of `from` bytes or more, or its shorter tokens
        // alone, whichever touches fewer.
        parent_bits.assign(static_cast<std::size_t>(data.words), 0u);
        data.add_accepted(p, parent_bits, true, parent_bits);
        const auto split = static_cast<std::size_t>(v_.length_begin[static_cast<std::size_t>(std::min<std::int64_t>(from, v_.max_token_bytes + 1))]);
        const auto& by_length = v_.by_length;
        if (split < by_length.size() - split) {
          std::vector<std::uint32_t>& bits = accepted.bits(true);
          for (std::size_t k = 0; k < split; ++k) {
            const auto w = static_cast<std::size_t>(by_length[k]) / 32;
            bits[w] |= parent_bits[w] & (1u << (by_length[k] % 32));
          }
        } else {
          std::vector<std::uint32_t>& bits = accepted.bits(false);
          bits.swap(parent_bits);
          for (std::size_t k = split; k < by_length.size(); ++k) {
            bits[static_cast<std::size_t>(by_length[k]) / 32] &= ~(1u << (by_length[k] % 32));
          }
        }
        base = p.base;
      }
      for (const std::int32_t node : data.exits(p.exits)) {
        if (v_.trie.depth[static_cast<std::size_t>(node)] < from) exits.push_back(node);
      }
      const auto listed = data.tokens(p.specials);
      table_specials.assign(listed.begin(), listed.end());
      at_once = p.exits_at_once;
    }
    if (!walk.run(representative[static_cast<std::size_t>(c)], from, accepted, exits, at_once, table_specials)) {
      return past_a_limit();
    }
    table_of_class[static_cast<std::size_t>(c)] = store.add(accepted, base, exits, table_specials, at_once);
    if (automaton_bytes + store.bytes() > limits_.max_memory_bytes) return too_much_memory();
  }
  store.finish();
  for (std::int32_t s = 0; s < count; ++s) {
    if (needed[static_cast<std::size_t>(s)]) {
      data.table_of[static_cast<std::size_t>(s)] = table_of_class[static_cast<std::size_t>(classes.of[static_cast<std::size_t>(s)])];
    }
  }
  stats.tables = static_cast<std::int64_t>(data.tables.size());
  stats.work = parses.work_done();
  stats.memory_bytes = data.memory_bytes();
  if (stats.memory_bytes > limits_.max_memory_bytes) return too_much_memory();
  return {};
}

}  // namespace

compiled_grammar::compiled_grammar(std::shared_ptr<const token_vocabulary> vocabulary, std::unique_ptr<compiled_data> data,
                                   compile_stats stats)
    : vocabulary_(std::move(vocabulary)), data_(std::move(data)), stats_(stats) {}
compiled_grammar::~compiled_grammar() = default;

result<std::shared_ptr<const compiled_grammar>, grammar_error> compile(const grammar& g,
                                                                      std::shared_ptr<const token_vocabulary> vocabulary,
                                                                      const compile_limits& limits) {
  const auto started = std::chrono::steady_clock::now();
  compile_stats stats;
  compiler c(g, vocabulary->data(), vocabulary->source(), limits);
  EDGE_ASSIGN_OR_RETURN(auto data, c.run(stats));
  stats.memory_bytes += static_cast<std::int64_t>(sizeof(compiled_grammar));
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return std::shared_ptr<const compiled_grammar>(new compiled_grammar(std::move(vocabulary), std::move(data), stats));
}

}  // namespace edge::backend::grammar
