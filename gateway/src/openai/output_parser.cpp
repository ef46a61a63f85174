#include "edge/gateway/openai/output_parser.h"

#include <algorithm>

#include "edge/common/format.h"
#include "edge/common/utf8.h"
#include "families/family.h"

namespace edge::gateway {
namespace {

template <class T>
bool join_text(output_event& last, output_event& next) {
  auto* a = std::get_if<T>(&last);
  auto* b = std::get_if<T>(&next);
  if (a == nullptr || b == nullptr) return false;
  if constexpr (std::is_same_v<T, tool_call_arguments>) {
    if (a->index != b->index) return false;
  }
  a->text += b->text;
  return true;
}

}  // namespace

bool is_special_token(const backend::tokenizer& tok, std::string_view text) {
  const auto id = tok.find_token(text);
  return id && tok.is_special(*id);
}

result<backend::grammar::grammar, backend::grammar::grammar_error> tool_call_answer_grammar(
    const output_syntax& syntax, const backend::tokenizer& tok, tool_call_grammar_options calls,
    bool starts_in_reasoning) {
  calls.kind = syntax.tool_calls;
  calls.is_special = [&tok](std::string_view text) { return is_special_token(tok, text); };
  backend::grammar::grammar_builder b;
  auto body = tool_call_grammar(b, calls);
  if (!body.ok()) return body.error();
  const backend::grammar::expr reasoning = reasoning_grammar(syntax.reasoning, starts_in_reasoning, calls.is_special);
  auto built = b.build(backend::grammar::seq({reasoning, *body}));
  if (!built.ok()) return backend::grammar::grammar_error(built.error());
  return std::move(built).value();
}

void append_event(std::vector<output_event>& events, output_event event) {
  if (!events.empty()) {
    output_event& last = events.back();
    if (join_text<content_delta>(last, event) || join_text<reasoning_delta>(last, event) ||
        join_text<tool_call_arguments>(last, event)) {
      return;
    }
  }
  events.push_back(std::move(event));
}

void assistant_message::add(const output_event& event) {
  if (const auto* c = std::get_if<content_delta>(&event)) {
    content += c->text;
  } else if (const auto* r = std::get_if<reasoning_delta>(&event)) {
    reasoning += r->text;
  } else if (const auto* begin = std::get_if<tool_call_begin>(&event)) {
    tool_calls.push_back({begin->id, begin->name, ""});
  } else if (const auto* a = std::get_if<tool_call_arguments>(&event)) {
    if (a->index < tool_calls.size()) tool_calls[a->index].arguments += a->text;
  }
}

detected_output_syntax detect_output_syntax(const backend::tokenizer& tok) {
  detected_output_syntax found;
  const families::family_traits* family = nullptr;
  for (const families::family_traits* f : families::all()) {
    const std::string_view signature = f->markers.front();
    if (!tok.find_token(signature)) continue;
    family = f;
    found.syntax.tool_calls = f->kind;
    found.tool_calls_reason = format("the vocabulary has {}", signature);
    break;
  }
  if (family == nullptr) found.tool_calls_reason = "no tool-call syntax in the vocabulary";
  if (tok.find_token(think_open_tag) && tok.find_token(think_close_tag)) {
    found.syntax.reasoning = family != nullptr ? family->reasoning : reasoning_parser_kind::think;
    found.reasoning_reason = format("the vocabulary has {} and {}", think_open_tag, think_close_tag);
  } else {
    found.reasoning_reason = format("no {} and {} in the vocabulary", think_open_tag, think_close_tag);
  }
  found.syntax = with_special_markers(found.syntax, tok);
  return found;
}

output_syntax with_special_markers(output_syntax syntax, const backend::tokenizer& tok) {
  const auto markers = tool_call_markers(syntax.tool_calls);
  syntax.tool_markers_special =
      std::any_of(markers.begin(), markers.end(), [&](std::string_view m) { return is_special_token(tok, m); });
  syntax.reasoning_tags_special = syntax.reasoning != reasoning_parser_kind::none &&
                                  (is_special_token(tok, think_open_tag) || is_special_token(tok, think_close_tag));
  return syntax;
}

output_parser::output_parser(output_parser_options options)
    : reasoning_on_(options.reasoning != reasoning_parser_kind::none),
      reasoning_(options.reasoning, options.starts_in_reasoning),
      tool_calls_(options.tool_calls == tool_call_parser_kind::none
                      ? nullptr
                      : make_tool_call_parser(options.tool_calls, std::move(options.tools),
                                              options.parallel_tool_calls, std::move(options.make_id))) {}

std::vector<output_event> output_parser::feed(std::string_view text, std::int64_t tokens) {
  // The parsers split text at markers and whitespace; whole characters keep every piece they
  // pass on valid UTF-8 (the engine's deltas are whole characters already).
  std::string whole = std::move(partial_character_);
  partial_character_.clear();
  whole += text;
  const std::size_t cut = utf8::incomplete_tail(whole);
  partial_character_ = whole.substr(whole.size() - cut);
  whole.resize(whole.size() - cut);

  std::vector<output_event> split;
  reasoning_.feed(whole, tokens, split);
  std::vector<output_event> out;
  route(split, out);
  return out;
}

std::vector<output_event> output_parser::finish(bool cut) {
  std::vector<output_event> split;
  if (!partial_character_.empty()) {
    std::string repaired;
    utf8::append_sanitized(repaired, partial_character_);
    partial_character_.clear();
    reasoning_.feed(repaired, 0, split);
  }
  reasoning_.finish(split);
  std::vector<output_event> out;
  route(split, out);
  if (tool_calls_) tool_calls_->finish(out, cut);
  return out;
}

void output_parser::route(std::vector<output_event>& split, std::vector<output_event>& out) {
  for (output_event& event : split) {
    auto* content = std::get_if<content_delta>(&event);
    if (content != nullptr && tool_calls_) {
      tool_calls_->feed(content->text, out);
    } else {
      append_event(out, std::move(event));
    }
  }
}

}  // namespace edge::gateway
