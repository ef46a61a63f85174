#include "edge/backend/grammar/compiled_grammar.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <tuple>

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
  d->trie = byte_trie::of(std::move(entries));
  return std::shared_ptr<const token_vocabulary>(new token_vocabulary(tok, std::move(d)));
}

std::int64_t token_vocabulary::size() const { return data_->size; }
std::int64_t token_vocabulary::max_token_bytes() const { return data_->max_token_bytes; }
std::int64_t token_vocabulary::trie_nodes() const { return data_->trie.size(); }

// ---- the pushdown automaton ----------------------------------------------------------------------

chain_store::chain_store() { clear(); }

void chain_store::clear() {
  frames_.assign(1, {-1, -1});
  index_.clear();
}

std::int32_t chain_store::push(std::int32_t return_state, std::int32_t below) {
  const auto [it, added] = index_.try_emplace(key(return_state, below), static_cast<std::int32_t>(frames_.size()));
  if (added) frames_.emplace_back(return_state, below);
  return it->second;
}

void chain_store::truncate(std::size_t n) {
  for (std::size_t i = n; i < frames_.size(); ++i) index_.erase(key(frames_[i].first, frames_[i].second));
  frames_.resize(n);
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
  };
  std::vector<std::vector<edge>> out;

  std::int32_t add() {
    out.emplace_back();
    return static_cast<std::int32_t>(out.size() - 1);
  }
  void link(std::int32_t from, edge e) { out[static_cast<std::size_t>(from)].push_back(e); }
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

class compiler {
 public:
  compiler(const grammar& g, const vocabulary_data& v, const tokenizer& tok, const compile_limits& limits)
      : g_(g), v_(v), tok_(tok), limits_(limits) {}

  result<std::unique_ptr<compiled_data>, grammar_error> run(compile_stats& stats);

 private:
  status too_large() const {
    return invalid_argument(format("the grammar is too large: more than {} automaton states", limits_.max_states));
  }
  status build(const expr& e, std::int32_t from, std::int32_t to);
  status build_class(const std::vector<codepoint_range>& ranges, bool json, std::int32_t from, std::int32_t to);
  void build_bytes(std::span<const std::pair<std::uint8_t, std::uint8_t>> ranges, std::int32_t from, std::int32_t to);
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
  std::int32_t at = from;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const std::int32_t next = i + 1 == ranges.size() ? to : n_.add();
    n_.link(at, {nfa::bytes, ranges[i].first, ranges[i].second, 0, next});
    at = next;
  }
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
    if (n_.out.size() > static_cast<std::size_t>(limits_.max_states) * 4) return too_large();
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
  if (n_.out.size() > static_cast<std::size_t>(limits_.max_states) * 4) return too_large();
  return {};
}

status compiler::build(const expr& e, std::int32_t from, std::int32_t to) {
  if (n_.out.size() > static_cast<std::size_t>(limits_.max_states) * 4) return too_large();
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
  std::vector<std::vector<std::int32_t>> next;                 // [state][class]
  std::vector<std::vector<std::pair<std::int32_t, std::int32_t>>> calls;     // (rule, state)
  std::vector<std::vector<std::pair<token_id, std::int32_t>>> specials;     // (token, state)
  std::vector<std::uint8_t> accepting;
  std::array<std::uint8_t, 256> class_of{};
  std::int32_t classes = 0;
  std::int32_t size() const { return static_cast<std::int32_t>(accepting.size()); }
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

  // Subset construction, rule by rule.
  std::vector<rule_dfa> dfas(static_cast<std::size_t>(rules));
  std::int64_t total_states = 0;
  for (std::int32_t r = 0; r < rules; ++r) {
    rule_dfa& d = dfas[static_cast<std::size_t>(r)];
    // Byte classes: the boundaries of every byte range in the rule's part of the NFA.
    std::vector<std::uint8_t> reached(n_.out.size(), 0);
    std::vector<std::int32_t> work = {rule_start_[static_cast<std::size_t>(r)]};
    std::array<bool, 257> cut{};
    reached[static_cast<std::size_t>(work.front())] = 1;
    while (!work.empty()) {
      const std::int32_t s = work.back();
      work.pop_back();
      for (const nfa::edge& e : n_.out[static_cast<std::size_t>(s)]) {
        if (e.k == nfa::bytes) {
          cut[e.lo] = true;
          cut[static_cast<std::size_t>(e.hi) + 1] = true;
        }
        if (!reached[static_cast<std::size_t>(e.to)]) {
          reached[static_cast<std::size_t>(e.to)] = 1;
          work.push_back(e.to);
        }
      }
    }
    std::int32_t cls = -1;
    std::vector<std::uint8_t> class_first;  // a byte of each class
    for (int b = 0; b < 256; ++b) {
      if (b == 0 || cut[static_cast<std::size_t>(b)]) {
        ++cls;
        class_first.push_back(static_cast<std::uint8_t>(b));
      }
      d.class_of[static_cast<std::size_t>(b)] = static_cast<std::uint8_t>(cls);
    }
    d.classes = cls + 1;

    const auto closure = [&](std::vector<std::int32_t> set) {
      std::vector<std::int32_t> stack = set;
      std::set<std::int32_t> seen(set.begin(), set.end());
      while (!stack.empty()) {
        const std::int32_t s = stack.back();
        stack.pop_back();
        for (const nfa::edge& e : n_.out[static_cast<std::size_t>(s)]) {
          if (e.k == nfa::eps && seen.insert(e.to).second) stack.push_back(e.to);
        }
      }
      return std::vector<std::int32_t>(seen.begin(), seen.end());
    };
    std::map<std::vector<std::int32_t>, std::int32_t> ids;
    std::vector<std::vector<std::int32_t>> sets;
    const auto id_of = [&](std::vector<std::int32_t> set) -> std::int32_t {
      auto [it, added] = ids.try_emplace(std::move(set), static_cast<std::int32_t>(sets.size()));
      if (added) sets.push_back(it->first);
      return it->second;
    };
    id_of(closure({rule_start_[static_cast<std::size_t>(r)]}));
    const std::int32_t accept = rule_accept_[static_cast<std::size_t>(r)];
    for (std::size_t k = 0; k < sets.size(); ++k) {
      if (total_states + static_cast<std::int64_t>(sets.size()) > limits_.max_states) return grammar_error(too_large());
      const std::vector<std::int32_t> set = sets[k];
      d.accepting.push_back(std::binary_search(set.begin(), set.end(), accept) ? 1 : 0);
      std::vector<std::int32_t> row(static_cast<std::size_t>(d.classes), -1);
      for (std::int32_t c = 0; c < d.classes; ++c) {
        const std::uint8_t b = class_first[static_cast<std::size_t>(c)];
        std::vector<std::int32_t> targets;
        for (const std::int32_t s : set) {
          for (const nfa::edge& e : n_.out[static_cast<std::size_t>(s)]) {
            if (e.k == nfa::bytes && e.lo <= b && b <= e.hi) targets.push_back(e.to);
          }
        }
        if (targets.empty()) continue;
        std::sort(targets.begin(), targets.end());
        targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
        row[static_cast<std::size_t>(c)] = id_of(closure(std::move(targets)));
      }
      std::map<std::int32_t, std::vector<std::int32_t>> by_rule;
      std::map<token_id, std::vector<std::int32_t>> by_token;
      for (const std::int32_t s : set) {
        for (const nfa::edge& e : n_.out[static_cast<std::size_t>(s)]) {
          if (e.k == nfa::call) by_rule[e.label].push_back(e.to);
          if (e.k == nfa::special) by_token[e.label].push_back(e.to);
        }
      }
      std::vector<std::pair<std::int32_t, std::int32_t>> calls;
      for (auto& [callee, targets] : by_rule) calls.emplace_back(callee, id_of(closure(std::move(targets))));
      std::vector<std::pair<token_id, std::int32_t>> specials;
      for (auto& [token, targets] : by_token) specials.emplace_back(token, id_of(closure(std::move(targets))));
      d.next.push_back(std::move(row));
      d.calls.push_back(std::move(calls));
      d.specials.push_back(std::move(specials));
    }
    total_states += d.size();
  }

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
        for (const std::int32_t t : d.next[static_cast<std::size_t>(s)]) visit(t);
        for (const auto& [token, t] : d.specials[static_cast<std::size_t>(s)]) visit(t);
      }
      for (const auto& [callee, t] : d.calls[static_cast<std::size_t>(s)]) {
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
      for (const auto& [callee, t] : d.calls[static_cast<std::size_t>(s)]) {
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
  for (std::int32_t r = 0; r < rules; ++r) {
    const rule_dfa& d = dfas[static_cast<std::size_t>(r)];
    global[static_cast<std::size_t>(r)].assign(static_cast<std::size_t>(d.size()), -1);
    if (!productive[static_cast<std::size_t>(r)]) continue;
    std::vector<std::uint8_t> forward(static_cast<std::size_t>(d.size()), 0);
    std::vector<std::vector<std::int32_t>> back(static_cast<std::size_t>(d.size()));
    std::vector<std::int32_t> work = {0};
    forward[0] = 1;
    while (!work.empty()) {
      const std::int32_t s = work.back();
      work.pop_back();
      const auto visit = [&](std::int32_t t) {
        if (t < 0) return;
        back[static_cast<std::size_t>(t)].push_back(s);
        if (!forward[static_cast<std::size_t>(t)]) {
          forward[static_cast<std::size_t>(t)] = 1;
          work.push_back(t);
        }
      };
      for (const std::int32_t t : d.next[static_cast<std::size_t>(s)]) visit(t);
      for (const auto& [token, t] : d.specials[static_cast<std::size_t>(s)]) visit(t);
      for (const auto& [callee, t] : d.calls[static_cast<std::size_t>(s)]) {
        if (productive[static_cast<std::size_t>(callee)]) visit(t);
      }
    }
    std::vector<std::uint8_t> live(static_cast<std::size_t>(d.size()), 0);
    for (std::int32_t s = 0; s < d.size(); ++s) {
      if (forward[static_cast<std::size_t>(s)] && d.accepting[static_cast<std::size_t>(s)]) {
        live[static_cast<std::size_t>(s)] = 1;
        work.push_back(s);
      }
    }
    while (!work.empty()) {
      const std::int32_t s = work.back();
      work.pop_back();
      for (const std::int32_t p : back[static_cast<std::size_t>(s)]) {
        if (!live[static_cast<std::size_t>(p)]) {
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
  std::vector<std::vector<call_edge>> calls(static_cast<std::size_t>(count));
  std::vector<std::vector<special_edge>> specials(static_cast<std::size_t>(count));
  for (std::int32_t r = 0; r < rules; ++r) {
    const rule_dfa& d = dfas[static_cast<std::size_t>(r)];
    compiled_rule& out = data->rules[static_cast<std::size_t>(r)];
    out.name = r == root ? "root" : g_.rules()[static_cast<std::size_t>(r)].name;
    out.class_of = d.class_of;
    out.classes = d.classes;
    out.start = global[static_cast<std::size_t>(r)][0];
    for (std::int32_t s = 0; s < d.size(); ++s) {
      const std::int32_t gs = global[static_cast<std::size_t>(r)][static_cast<std::size_t>(s)];
      if (gs < 0) continue;
      const auto at = static_cast<std::size_t>(gs);
      data->rule_of[at] = r;
      data->accepting[at] = d.accepting[static_cast<std::size_t>(s)];
      data->row[at] = static_cast<std::int32_t>(data->next.size());
      for (const std::int32_t t : d.next[static_cast<std::size_t>(s)]) {
        data->next.push_back(t < 0 ? -1 : global[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)]);
      }
      for (const auto& [callee, t] : d.calls[static_cast<std::size_t>(s)]) {
        const std::int32_t gt = global[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)];
        if (productive[static_cast<std::size_t>(callee)] && gt >= 0) calls[at].push_back({callee, gt});
      }
      for (const auto& [token, t] : d.specials[static_cast<std::size_t>(s)]) {
        const std::int32_t gt = global[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)];
        if (gt >= 0) specials[at].push_back({token, gt});
      }
    }
  }
  for (std::int32_t s = 0; s < count; ++s) {
    data->call_begin[static_cast<std::size_t>(s) + 1] =
        data->call_begin[static_cast<std::size_t>(s)] + static_cast<std::int32_t>(calls[static_cast<std::size_t>(s)].size());
    data->calls.insert(data->calls.end(), calls[static_cast<std::size_t>(s)].begin(), calls[static_cast<std::size_t>(s)].end());
    data->special_begin[static_cast<std::size_t>(s) + 1] = data->special_begin[static_cast<std::size_t>(s)] +
                                                          static_cast<std::int32_t>(specials[static_cast<std::size_t>(s)].size());
    data->specials.insert(data->specials.end(), specials[static_cast<std::size_t>(s)].begin(),
                          specials[static_cast<std::size_t>(s)].end());
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

  const std::int32_t words = static_cast<std::int32_t>(mask_words(v_.size));
  data->max_parses = limits_.max_parses;
  data->max_parse_work = limits_.max_parse_work;
  chain_store chains;
  parse_sets parses(limits_.max_parses, -1);
  const auto too_ambiguous = [&] {
    return grammar_error(format("the grammar is too ambiguous: more than {} parses at once (rules or alternatives that "
                                "match the same text, nested)",
                                limits_.max_parses),
                         "");
  };
  std::vector<std::vector<parse>> kernels(static_cast<std::size_t>(v_.max_token_bytes) + 2);
  std::vector<std::vector<parse>> closed(kernels.size());
  std::vector<std::uint32_t> bits(static_cast<std::size_t>(words));
  const byte_trie& trie = v_.trie;
  for (std::int32_t s = 0; s < count; ++s) {
    if (!needed[static_cast<std::size_t>(s)]) continue;
    token_table table;
    chains.clear();
    std::fill(bits.begin(), bits.end(), 0u);
    std::int64_t accepted = 0;
    kernels[0].assign(1, parse{s, 0});
    closed[0].clear();
    bool at_once = false;
    if (!close_parses(*data, chains, parses, kernels[0], closed[0], at_once)) return too_ambiguous();
    table.exits_at_once = at_once;
    for (const parse& p : closed[0]) {
      for (const special_edge& e : data->specials_of(p.state)) table.specials.push_back(e.token);
    }
    std::sort(table.specials.begin(), table.specials.end());
    table.specials.erase(std::unique(table.specials.begin(), table.specials.end()), table.specials.end());
    for (std::int32_t i = 1; i < trie.size();) {
      const auto d = static_cast<std::size_t>(trie.depth[static_cast<std::size_t>(i)]);
      kernels[d].clear();
      if (!step_parses(*data, parses, closed[d - 1], trie.byte[static_cast<std::size_t>(i)], kernels[d])) {
        return too_ambiguous();
      }
      if (kernels[d].empty()) {
        i = trie.end[static_cast<std::size_t>(i)];
        continue;
      }
      closed[d].clear();
      bool ends = false;
      if (!close_parses(*data, chains, parses, kernels[d], closed[d], ends)) return too_ambiguous();
      for (const token_id t : trie.tokens_at(i)) {
        bits[static_cast<std::size_t>(t) / 32] |= 1u << (t % 32);
        ++accepted;
      }
      if (ends && trie.end[static_cast<std::size_t>(i)] > i + 1) table.exit_nodes.push_back(i);
      ++i;
    }
    if (accepted > words) {
      table.accepted_bits = bits;
    } else {
      for (std::int32_t w = 0; w < words; ++w) {
        for (std::uint32_t word = bits[static_cast<std::size_t>(w)]; word != 0; word &= word - 1) {
          table.accepted.push_back(w * 32 + std::countr_zero(word));
        }
      }
    }
    table.leads_anywhere = accepted > 0 || !table.specials.empty() || !table.exit_nodes.empty();
    data->table_of[static_cast<std::size_t>(s)] = static_cast<std::int32_t>(data->tables.size());
    stats.memory_bytes += static_cast<std::int64_t>(table.accepted.size() * sizeof(token_id) +
                                                    table.accepted_bits.size() * sizeof(std::uint32_t) +
                                                    table.exit_nodes.size() * sizeof(std::int32_t));
    data->tables.push_back(std::move(table));
  }
  stats.rules = rules;
  stats.states = count;
  stats.tables = static_cast<std::int64_t>(data->tables.size());
  stats.memory_bytes += static_cast<std::int64_t>(data->next.size() * sizeof(std::int32_t)) + std::int64_t{count} * 32;
  return data;
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
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return std::shared_ptr<const compiled_grammar>(new compiled_grammar(std::move(vocabulary), std::move(data), stats));
}

}  // namespace edge::backend::grammar
