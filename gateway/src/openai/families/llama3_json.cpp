// Llama 3.1 / 3.2 / 3.3: the answer starts (after whitespace) with a JSON object, optionally after
// <|python_tag|>, {"name": NAME, "parameters": {…}} ("arguments" is taken too); several are
// separated by ';'. Only the start of the answer can be a call.
#include <array>

#include "edge/common/json_text.h"
#include "family.h"

namespace edge::gateway::families {
namespace {

namespace g = backend::grammar;

constexpr std::string_view python_tag = "<|python_tag|>";
constexpr std::array<std::string_view, 1> markers{python_tag};

g::expr calls(const call_grammar_context& c) {
  return c.joined(c.any_call([](const call_grammar_context::allowed_tool& t) {
                    return g::seq({g::literal("{\"name\": " + json_string(t.name) + ", \"parameters\": "), t.arguments,
                                   g::literal("}")});
                  }),
                  "; ");
}

}  // namespace

const family_traits llama3_json{.kind = tool_call_parser_kind::llama3_json,
                                .name = "llama3_json",
                                .markers = markers,
                                .read_header = json_header,
                                .bare = true,
                                .bare_marker = python_tag,
                                .arguments_close = "}",
                                .write_calls = calls};

}  // namespace edge::gateway::families
