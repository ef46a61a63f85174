// Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) read into the request
// the chat completions route serves: the same template, tool-call syntax, reasoning and grammar.
//
// system (a string or text blocks) and messages whose content is a string or blocks: text,
// tool_use (an assistant's call: its input becomes the call's JSON arguments), tool_result (the
// tool's answer, a "tool" message; is_error marks its text "Error: ..."), thinking (an
// assistant's reasoning; redacted_thinking is dropped: its text is not ours to read); a "system"
// entry among the messages joins the system prompt. tools (name, description, input_schema),
// tool_choice (auto, any, tool, none; disable_parallel_tool_use), stop_sequences, max_tokens
// (required by messages, not by count_tokens), temperature, top_p, top_k, metadata.user_id,
// stream, thinking (enabled or disabled: the template's enable_thinking). Images, documents and
// server tools get a 400; fields this server does not read are ignored.
#pragma once

#include <string_view>
#include <variant>

#include "edge/gateway/openai/openai_request.h"

namespace edge::gateway {

enum class anthropic_route { messages, count_tokens };

std::variant<openai_request, request_error> parse_anthropic_request(anthropic_route route, std::string_view body);

}  // namespace edge::gateway
