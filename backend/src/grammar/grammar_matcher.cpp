#include <algorithm>
#include <cstring>

#include "edge/backend/grammar/compiled_grammar.h"
#include "edge/common/format.h"
#include "grammar_data.h"

namespace edge::backend::grammar {

namespace {

// The chain store is rebuilt from the live parses when it has grown past this many frames and
// most of them are garbage (parses of earlier steps).
constexpr std::size_t compact_threshold = 1 << 14;

void set_bit(std::span<std::uint32_t> mask, token_id id) {
  const auto word = static_cast<std::size_t>(id) / 32;
  if (id >= 0 && word < mask.size()) mask[word] |= 1u << (static_cast<std::uint32_t>(id) % 32);
}

}  // namespace

struct grammar_matcher::state {
  explicit state(std::shared_ptr<const compiled_grammar> grammar)
      : g(std::move(grammar)),
        data(&g->data()),
        vocab(&g->vocabulary().data()),
        sets(data->max_parses, data->max_parse_work) {}

  std::shared_ptr<const compiled_grammar> g;
  const compiled_data* data = nullptr;
  const vocabulary_data* vocab = nullptr;
  std::vector<token_id> end_tokens;
  chain_store chains;
  parse_sets sets;  // their limits; work counts per fill_mask or accept call
  std::vector<parse> kernel;  // the parses between tokens
  bool can_end = false;
  bool must_end = false;
  // Scratch, kept to avoid allocations.
  std::vector<parse> sources;
  std::vector<std::vector<parse>> levels_kernel;
  std::vector<std::vector<parse>> levels_closed;
  std::vector<parse> closed;
  std::vector<parse> next;
  std::vector<parse> context;  // walk_exits: the caller's parses
  std::vector<std::uint32_t> scratch;  // a token table's set, built aside

  std::string too_ambiguous() const {
    return format("the output's grammar is too ambiguous to follow: more than {} parses at once, or {} for one token "
                  "(rules or alternatives that match the same text, nested)",
                  data->max_parses, data->max_parse_work);
  }

  // can_end and must_end from the kernel; false past a limit.
  bool refresh() {
    closed.clear();
    bool ends = false;
    const std::size_t mark = chains.size();
    if (!close_parses(*data, chains, sets, kernel, closed, ends)) {
      chains.truncate(mark);
      return false;
    }
    can_end = ends;
    bool more = false;
    for (const parse& p : closed) {
      const std::int32_t t = data->table_of[static_cast<std::size_t>(p.state)];
      if (t >= 0 && data->tables[static_cast<std::size_t>(t)].leads_anywhere) more = true;
      if (!data->specials_of(p.state).empty()) more = true;
    }
    must_end = can_end && !more;
    chains.truncate(mark);
    return true;
  }

  bool is_end_token(token_id id) const {
    return std::find(end_tokens.begin(), end_tokens.end(), id) != end_tokens.end();
  }

  // The parses whose token tables make the mask, in `sources`: the kernel's, and where a rule may
  // end at once, the parses it returns to. False past a limit.
  bool find_sources() {
    sources.clear();
    sets.begin(0);
    for (const parse& first : kernel) {
      for (parse p = first;;) {
        const std::size_t before = sources.size();
        if (!sets.add(sources, p)) return false;
        if (sources.size() == before) break;  // there already, and so are those it returns to
        const std::int32_t t = data->table_of[static_cast<std::size_t>(p.state)];
        if (t < 0 || !data->tables[static_cast<std::size_t>(t)].exits_at_once || p.chain == 0) break;
        p = {chains.return_state(p.chain), chains.below(p.chain)};
      }
    }
    return true;
  }

  // The tokens below vocabulary trie node `exit` whose bytes past it the parses after returning
  // from `chain` accept, set in `mask`; false past a limit.
  bool walk_exits(std::span<const std::int32_t> exits, std::int32_t chain, std::span<std::uint32_t> mask) {
    const std::size_t depth_needed = static_cast<std::size_t>(vocab->max_token_bytes) + 2;
    if (levels_kernel.size() < depth_needed) {
      levels_kernel.resize(depth_needed);
      levels_closed.resize(depth_needed);
    }
    // The parses of the caller once the rule has returned: the same for every exit.
    const parse returned{chains.return_state(chain), chains.below(chain)};
    context.clear();
    bool ends = false;
    if (!close_parses(*data, chains, sets, std::span(&returned, 1), context, ends)) return false;
    for (const std::int32_t exit : exits) {
      if (!walk_exit(exit, mask)) return false;
    }
    return true;
  }

  bool walk_exit(std::int32_t exit, std::span<std::uint32_t> mask) {
    const byte_trie& trie = vocab->trie;
    const std::int32_t base = trie.depth[static_cast<std::size_t>(exit)];
    levels_closed[0] = context;
    bool ends = false;
    const std::int32_t end = trie.end[static_cast<std::size_t>(exit)];
    for (std::int32_t i = exit + 1; i < end;) {
      const auto d = static_cast<std::size_t>(trie.depth[static_cast<std::size_t>(i)] - base);
      levels_kernel[d].clear();
      if (!step_parses(*data, sets, levels_closed[d - 1], trie.byte[static_cast<std::size_t>(i)], levels_kernel[d])) {
        return false;
      }
      if (levels_kernel[d].empty()) {
        i = trie.end[static_cast<std::size_t>(i)];
        continue;
      }
      for (const token_id t : trie.tokens_at(i)) set_bit(mask, t);
      if (trie.end[static_cast<std::size_t>(i)] > i + 1) {
        levels_closed[d].clear();
        if (!close_parses(*data, chains, sets, levels_kernel[d], levels_closed[d], ends)) return false;
      }
      ++i;
    }
    return true;
  }

  // Rebuilds the chain store with only the frames the kernel uses.
  void compact() {
    chain_store fresh;
    std::vector<std::pair<std::int32_t, std::int32_t>> frames;
    for (parse& p : kernel) {
      frames.clear();
      for (std::int32_t c = p.chain; c != 0; c = chains.below(c)) frames.emplace_back(chains.return_state(c), 0);
      std::int32_t rebuilt = 0;
      for (auto it = frames.rbegin(); it != frames.rend(); ++it) rebuilt = fresh.push(it->first, rebuilt);
      p.chain = rebuilt;
    }
    chains = std::move(fresh);
  }
};

grammar_matcher::grammar_matcher(std::shared_ptr<const compiled_grammar> g, std::span<const token_id> end_tokens)
    : state_(std::make_unique<state>(std::move(g))) {
  state& s = *state_;
  s.end_tokens = s.vocab->eos;
  for (const token_id t : end_tokens) {
    if (!s.is_end_token(t)) s.end_tokens.push_back(t);
  }
  s.kernel.push_back({s.data->rules[static_cast<std::size_t>(s.data->root_rule)].start, 0});
  if (!s.refresh()) error_ = s.too_ambiguous();
}

grammar_matcher::~grammar_matcher() = default;
grammar_matcher::grammar_matcher(grammar_matcher&&) noexcept = default;
grammar_matcher& grammar_matcher::operator=(grammar_matcher&&) noexcept = default;

bool grammar_matcher::can_end() const { return state_->can_end; }
bool grammar_matcher::must_end() const { return state_->must_end; }

bool grammar_matcher::fill_mask(std::span<std::uint32_t> allowed) {
  state& s = *state_;
  std::fill(allowed.begin(), allowed.end(), 0u);
  if (failed()) return false;
  if (!ended_ && !s.must_end) {
    const std::size_t mark = s.chains.size();
    const auto fail = [&] {
      s.chains.truncate(mark);
      std::fill(allowed.begin(), allowed.end(), 0u);
      error_ = s.too_ambiguous();
      return false;
    };
    s.sets.reset_work();
    if (!s.find_sources()) return fail();
    for (std::size_t k = 0; k < s.sources.size(); ++k) {
      const parse p = s.sources[k];
      const std::int32_t t = s.data->table_of[static_cast<std::size_t>(p.state)];
      if (t < 0) continue;
      const token_table& table = s.data->tables[static_cast<std::size_t>(t)];
      // The first source's table is alone in the mask so far (it was cleared above).
      s.data->add_accepted(table, allowed, k == 0, s.scratch);
      for (const token_id id : s.data->tokens(table.specials)) set_bit(allowed, id);
      // A token that leaves the rule part way goes on in the rule that called it.
      if (p.chain != 0 && table.exits.size > 0 && !s.walk_exits(s.data->exits(table.exits), p.chain, allowed)) {
        return fail();
      }
    }
    s.chains.truncate(mark);
  }
  if (s.can_end || ended_) {
    for (const token_id id : s.end_tokens) set_bit(allowed, id);
  }
  return std::any_of(allowed.begin(), allowed.end(), [](std::uint32_t w) { return w != 0; });
}

bool grammar_matcher::accept(token_id id) {
  state& s = *state_;
  if (ended_ || failed() || id < 0 || id >= s.vocab->size) return false;
  const std::size_t mark = s.chains.size();
  s.sets.reset_work();
  const auto fail = [&] {
    s.chains.truncate(mark);
    error_ = s.too_ambiguous();
    return false;
  };
  // A special token the grammar names here.
  s.closed.clear();
  bool ends = false;
  if (!close_parses(*s.data, s.chains, s.sets, s.kernel, s.closed, ends)) return fail();
  s.next.clear();
  s.sets.begin(0);
  for (const parse& p : s.closed) {
    for (const special_edge& e : s.data->specials_of(p.state)) {
      if (e.token == id && !s.sets.add(s.next, {e.next, p.chain})) return fail();
    }
  }
  if (s.next.empty() && s.can_end && s.is_end_token(id)) {
    s.chains.truncate(mark);
    ended_ = true;
    return true;
  }
  if (s.next.empty()) {
    const std::string_view bytes = s.vocab->bytes_of(id);
    if (s.vocab->special[static_cast<std::size_t>(id)] || bytes.empty()) {
      s.chains.truncate(mark);
      return false;
    }
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      if (i > 0) {
        s.closed.clear();
        if (!close_parses(*s.data, s.chains, s.sets, s.next, s.closed, ends)) return fail();
        s.next.clear();
      }
      if (!step_parses(*s.data, s.sets, s.closed, static_cast<std::uint8_t>(bytes[i]), s.next)) return fail();
      if (s.next.empty()) {
        s.chains.truncate(mark);
        return false;
      }
    }
  }
  s.kernel.swap(s.next);
  if (s.chains.size() > compact_threshold) s.compact();
  if (!s.refresh()) {
    // The token was taken, but what may follow it cannot be followed.
    error_ = s.too_ambiguous();
    return false;
  }
  return true;
}

}  // namespace edge::backend::grammar
