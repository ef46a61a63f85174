// Hermes 2 Pro, Qwen2.5, Qwen3 (also QwQ): <tool_call>\n{"name": NAME, "arguments": {…}}\n</tool_call>,
// one block per call, anywhere in the answer.
#include <array>

#include "edge/common/json_text.h"
#include "family.h"

namespace edge::gateway::families {
namespace {

namespace g = backend::grammar;

constexpr std::string_view call_open = "<tool_call>";
constexpr std::string_view call_close = "</tool_call>";
constexpr std::array<std::string_view, 2> markers{call_open, call_close};

g::expr calls(const call_grammar_context& c) {
  return c.joined(c.any_call([&](const call_grammar_context::allowed_tool& t) {
                    return g::seq({c.marker(call_open), g::literal("\n{\"name\": " + json_string(t.name) + ", \"arguments\": "),
                                   t.arguments, g::literal("}\n"), c.marker(call_close)});
                  }),
                  "\n");
}

}  // namespace

const family_traits hermes{.kind = tool_call_parser_kind::hermes,
                           .name = "hermes",
                           .markers = markers,
                           .call_begin = call_open,
                           .call_end = call_close,
                           .read_header = json_header,
                           .arguments_close = "}",
                           .write_calls = calls};

}  // namespace edge::gateway::families
