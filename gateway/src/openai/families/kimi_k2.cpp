// Kimi K2, in a section:
//   <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{…}<|tool_call_end|>
//   …more calls…<|tool_calls_section_end|>
// "functions.NAME:IDX" is kept as the call's id (the template writes it back). Kimi K2 Thinking
// may begin the section without closing its thinking: the section's marker closes it too
// (reasoning_parser_kind::kimi_k2).
#include <algorithm>
#include <array>

#include "../marker_text.h"
#include "edge/common/format.h"
#include "family.h"

namespace edge::gateway::families {
namespace {

namespace g = backend::grammar;

constexpr std::string_view section_begin = "<|tool_calls_section_begin|>";
constexpr std::string_view call_begin = "<|tool_call_begin|>";
constexpr std::string_view argument_begin = "<|tool_call_argument_begin|>";
constexpr std::string_view call_end = "<|tool_call_end|>";
constexpr std::string_view section_end = "<|tool_calls_section_end|>";
constexpr std::string_view function_prefix = "functions.";
constexpr std::array<std::string_view, 5> markers{section_begin, call_begin, argument_begin, call_end, section_end};

// "functions.NAME:IDX<|tool_call_argument_begin|>"; the whole "functions.NAME:IDX" is the id.
header read_header(std::string_view text) {
  const std::size_t begin = text.find(argument_begin);
  if (begin == std::string_view::npos) return more_header();
  const std::string_view id = trim_space(text.substr(0, begin));
  const std::size_t colon = id.rfind(':');
  if (colon == std::string_view::npos || colon + 1 == id.size()) return mismatched_header();
  const std::string_view number = id.substr(colon + 1);
  if (!std::all_of(number.begin(), number.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return mismatched_header();
  }
  std::string_view name = id.substr(0, colon);
  if (name.starts_with(function_prefix)) name.remove_prefix(function_prefix.size());
  return {.status = header_status::match,
          .name = std::string(name),
          .id = std::string(id),
          .length = begin + argument_begin.size()};
}

// Kimi's calls carry their number in the conversation, so each position is its own: the k-th
// call is "functions.NAME:(earlier_calls + k)", at most max_kimi_calls of them.
g::expr calls(const call_grammar_context& c) {
  const tool_call_grammar_options& o = c.options();
  const std::size_t positions = o.parallel ? max_kimi_calls : 1;
  g::expr rest;  // the calls after position k, if any
  for (std::size_t k = positions; k-- > 0;) {
    const std::string number = std::to_string(o.earlier_calls + k);
    const g::expr call = c.any_call([&](const call_grammar_context::allowed_tool& t) {
      return g::seq({c.marker(call_begin), g::literal(std::string(function_prefix) + t.name + ":" + number),
                     c.marker(argument_begin), t.arguments, c.marker(call_end)});
    });
    g::expr here = k + 1 == positions ? call : g::seq({call, g::optional(rest)});
    rest = c.builder().ref(c.builder().add_rule(format("kimi call {}", k), std::move(here)));
  }
  return g::seq({c.marker(section_begin), rest, c.marker(section_end)});
}

}  // namespace

const family_traits kimi_k2{.kind = tool_call_parser_kind::kimi_k2,
                            .name = "kimi_k2",
                            .markers = markers,
                            .section_begin = section_begin,
                            .section_end = section_end,
                            .call_begin = call_begin,
                            .call_end = call_end,
                            .read_header = read_header,
                            .write_calls = calls,
                            .reasoning = reasoning_parser_kind::kimi_k2};

}  // namespace edge::gateway::families
