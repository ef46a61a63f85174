// GLM-4.5 / 4.6 (and 4.7, which leaves out the newlines):
//   <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n…</tool_call>
// Its arguments are key/value pairs (argument_form::key_value_pairs: V is raw text for a
// string-typed parameter, JSON otherwise).
#include <array>

#include "../marker_text.h"
#include "family.h"

namespace edge::gateway::families {
namespace {

namespace g = backend::grammar;

constexpr std::string_view call_open = "<tool_call>";
constexpr std::string_view call_close = "</tool_call>";
constexpr std::string_view key_open = "<arg_key>";
constexpr std::string_view key_close = "</arg_key>";
constexpr std::string_view value_open = "<arg_value>";
constexpr std::string_view value_close = "</arg_value>";
// <arg_key> first: it tells GLM's vocabulary from Hermes', which has <tool_call> too.
constexpr std::array<std::string_view, 6> markers{key_open,  call_open,  call_close,
                                                  key_close, value_open, value_close};

// "NAME" up to a newline or the first marker.
header read_header(std::string_view text) {
  const std::size_t at = leading_space_length(text);
  const std::size_t end = text.find_first_of("\n<", at);
  if (end == std::string_view::npos) return more_header();
  return {.status = header_status::match, .name = std::string(trim_space(text.substr(at, end - at))), .length = end};
}

g::expr calls(const call_grammar_context& c) {
  return c.joined(c.any_call([&](const call_grammar_context::allowed_tool& t) {
                    return g::seq({c.marker(call_open), g::literal(t.name + "\n"), t.arguments, c.marker(call_close)});
                  }),
                  "\n");
}

}  // namespace

const family_traits glm45{.kind = tool_call_parser_kind::glm45,
                          .name = "glm45",
                          .markers = markers,
                          .call_begin = call_open,
                          .call_end = call_close,
                          .read_header = read_header,
                          .arguments = argument_form::key_value_pairs,
                          .key_open = key_open,
                          .key_close = key_close,
                          .value_open = value_open,
                          .value_close = value_close,
                          .write_calls = calls};

}  // namespace edge::gateway::families
