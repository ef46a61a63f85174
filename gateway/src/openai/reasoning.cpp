#include "edge/gateway/openai/reasoning.h"

#include <algorithm>

#include "families/family.h"
#include "marker_grammar.h"
#include "marker_text.h"

namespace edge::gateway {

std::string_view to_string(reasoning_parser_kind kind) {
  switch (kind) {
    case reasoning_parser_kind::none: return "none";
    case reasoning_parser_kind::think: return "think";
    case reasoning_parser_kind::kimi_k2: return "kimi_k2";
  }
  return "none";
}

backend::grammar::expr reasoning_grammar(reasoning_parser_kind kind, bool starts_inside,
                                         const special_token_test& is_special) {
  namespace g = backend::grammar;
  if (kind == reasoning_parser_kind::none) return {};
  const g::expr rest = g::seq({text_without_closing_tag(), marker_expr(think_close_tag, is_special),
                               g::repeat(g::literal("\n"), 0, 2)});
  if (starts_inside) return rest;
  return g::optional(g::seq({marker_expr(think_open_tag, is_special), rest}));
}

std::optional<reasoning_parser_kind> parse_reasoning_parser_name(std::string_view name) {
  for (const auto kind : {reasoning_parser_kind::none, reasoning_parser_kind::think, reasoning_parser_kind::kimi_k2}) {
    if (to_string(kind) == name) return kind;
  }
  return std::nullopt;
}

bool prompt_opens_reasoning(std::string_view prompt_tail) {
  const std::size_t open = prompt_tail.rfind(think_open_tag);
  if (open == std::string_view::npos) return false;
  const std::string_view after = prompt_tail.substr(open + think_open_tag.size());
  return leading_space_length(after) == after.size();
}

reasoning_splitter::reasoning_splitter(reasoning_parser_kind kind, bool starts_inside)
    : kind_(kind),
      state_(kind == reasoning_parser_kind::none ? state::answer : starts_inside ? state::inside : state::start) {}

void reasoning_splitter::feed(std::string_view text, std::int64_t tokens, std::vector<output_event>& out) {
  if (state_ == state::start) undecided_tokens_ += tokens;
  if (state_ == state::inside) reasoning_tokens_ += tokens;
  pending_ += text;
  run(/*at_end=*/false, out);
}

void reasoning_splitter::finish(std::vector<output_event>& out) { run(/*at_end=*/true, out); }

void reasoning_splitter::run(bool at_end, std::vector<output_event>& out) {
  const auto emit_reasoning = [&](std::string_view text) {
    if (!text.empty()) append_event(out, reasoning_delta{std::string(text)});
  };
  for (;;) {
    switch (state_) {
      case state::start: {
        const std::string_view rest = std::string_view(pending_).substr(leading_space_length(pending_));
        if (rest.starts_with(think_open_tag)) {
          pending_.erase(0, pending_.size() - rest.size() + think_open_tag.size());
          state_ = state::inside;
          reasoning_tokens_ += undecided_tokens_;
          undecided_tokens_ = 0;
          continue;
        }
        if (!at_end && (rest.empty() || is_marker_start(rest, think_open_tag))) return;
        state_ = state::answer;  // no block: everything, leading whitespace too, is answer
        undecided_tokens_ = 0;
        continue;
      }

      case state::inside: {
        if (block_start_) {
          pending_.erase(0, leading_space_length(pending_));
          // A model whose prompt opened the block may open it again: that tag is no text either.
          if (std::string_view(pending_).starts_with(think_open_tag)) {
            pending_.erase(0, think_open_tag.size());
            continue;
          }
          if (!at_end && (pending_.empty() || is_marker_start(pending_, think_open_tag))) return;
          block_start_ = false;
        }
        const std::size_t close = pending_.find(think_close_tag);
        const std::size_t section =
            kind_ == reasoning_parser_kind::kimi_k2 ? pending_.find(families::kimi_k2.section_begin) : std::string::npos;
        if (close != std::string::npos || section != std::string::npos) {
          const std::size_t end = std::min(close, section);
          emit_reasoning(std::string_view(pending_).substr(0, trailing_space_start(pending_, end)));
          if (end == close) {
            pending_.erase(0, end + think_close_tag.size());
            state_ = state::after_block;
          } else {
            pending_.erase(0, end);  // the section marker is the tool-call parser's
            state_ = state::answer;
          }
          continue;
        }
        std::size_t held = 0;
        if (!at_end) {
          held = kind_ == reasoning_parser_kind::kimi_k2
                     ? partial_marker_length(pending_, {think_close_tag, families::kimi_k2.section_begin})
                     : partial_marker_length(pending_, think_close_tag);
        }
        // Whitespace before a possible close is held too: the block's trailing whitespace is dropped.
        const std::size_t ready = trailing_space_start(pending_, pending_.size() - held);
        emit_reasoning(std::string_view(pending_).substr(0, ready));
        pending_.erase(0, at_end ? pending_.size() : ready);
        return;
      }

      case state::after_block:
        pending_.erase(0, leading_space_length(pending_));
        if (pending_.empty()) return;
        state_ = state::answer;
        continue;

      case state::answer:
        if (!pending_.empty()) append_event(out, content_delta{std::move(pending_)});
        pending_.clear();
        return;
    }
  }
}

}  // namespace edge::gateway
