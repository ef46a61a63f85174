#include "edge/backend/grammar/output_reach.h"

#include <algorithm>
#include <bit>
#include <deque>
#include <vector>

namespace edge::backend::grammar {

output_reach find_output(const std::shared_ptr<const compiled_grammar>& g, std::span<const token_id> banned,
                         std::span<const token_id> end_tokens, const output_reach_limits& limits) {
  const tokenizer& tok = g->vocabulary().source();
  std::vector<token_id> ends(tok.eos_ids().begin(), tok.eos_ids().end());
  ends.insert(ends.end(), end_tokens.begin(), end_tokens.end());
  const auto is_end = [&](token_id t) { return std::find(ends.begin(), ends.end(), t) != ends.end(); };

  std::vector<std::uint32_t> mask(static_cast<std::size_t>(mask_words(g->vocabulary().size())));
  // Paths of tokens from the start, breadth first: the shortest ways are tried first.
  std::deque<std::vector<token_id>> waiting;
  waiting.emplace_back();
  std::int64_t expanded = 0;
  while (!waiting.empty()) {
    if (expanded++ >= limits.max_states) return output_reach::unknown;
    const std::vector<token_id> path = std::move(waiting.front());
    waiting.pop_front();
    grammar_matcher m(g, end_tokens);
    for (const token_id t : path) {
      if (!m.accept(t)) return output_reach::unknown;  // past the matcher's limits: not ours to judge
    }
    m.fill_mask(mask);
    if (m.failed()) return output_reach::unknown;
    for (const token_id t : banned) {
      if (t >= 0 && static_cast<std::size_t>(t) / 32 < mask.size()) mask[static_cast<std::size_t>(t) / 32] &= ~(1u << (t % 32));
    }
    std::vector<token_id> next;
    for (std::size_t w = 0; w < mask.size(); ++w) {
      for (std::uint32_t word = mask[w]; word != 0; word &= word - 1) {
        const auto t = static_cast<token_id>(w * 32 + static_cast<std::size_t>(std::countr_zero(word)));
        if (is_end(t)) return output_reach::possible;
        next.push_back(t);
        if (static_cast<std::int64_t>(next.size()) > limits.max_branching) return output_reach::unknown;
      }
    }
    for (const token_id t : next) {
      std::vector<token_id> longer = path;
      longer.push_back(t);
      waiting.push_back(std::move(longer));
    }
  }
  return output_reach::impossible;
}

}  // namespace edge::backend::grammar
