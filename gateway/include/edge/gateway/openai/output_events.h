// What the output parsers (reasoning.h, tool_calls.h, output_parser.h) make of a model's
// generated text: pieces of the answer's content, of its reasoning, and tool calls, first named
// and then given their arguments a fragment at a time. A streamed answer sends one chunk per
// event (openai_response.h); a whole answer adds them up (assistant_message), so both say the
// same.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace edge::gateway {

// Whether a marker of a syntax (<tool_call>, <think>, ...) is one special token of the served
// vocabulary: a grammar that makes the model write the marker names that token then.
using special_token_test = std::function<bool(std::string_view)>;

struct content_delta {
  std::string text;
};

struct reasoning_delta {
  std::string text;
};

// A tool call begins: OpenAI's first delta of a call (index, id, type, function.name).
struct tool_call_begin {
  std::size_t index = 0;  // 0, 1, ... in the order the calls were made
  std::string id;         // "call_…", or the id the model's syntax gives (Kimi K2)
  std::string name;
};

// The next piece of a call's arguments (JSON text; the pieces of one call add up to it).
struct tool_call_arguments {
  std::size_t index = 0;
  std::string text;
};

using output_event = std::variant<content_delta, reasoning_delta, tool_call_begin, tool_call_arguments>;

// Appends `event`, joined to the last one when both are text of the same kind (content,
// reasoning, or arguments of the same call): one chunk per kind of change, not per byte.
void append_event(std::vector<output_event>& events, output_event event);

struct assembled_tool_call {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text
  friend bool operator==(const assembled_tool_call&, const assembled_tool_call&) = default;
};

// The whole answer the events add up to.
struct assistant_message {
  std::string content;
  std::string reasoning;
  std::vector<assembled_tool_call> tool_calls;

  void add(const output_event& event);
  friend bool operator==(const assistant_message&, const assistant_message&) = default;
};

}  // namespace edge::gateway
