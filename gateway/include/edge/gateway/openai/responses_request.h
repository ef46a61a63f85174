// OpenAI's Responses API (POST /v1/responses) read into the request the chat completions route
// serves: the same template, tool-call syntax, reasoning and grammar.
//
// input: a string (one user message) or a list of items: messages (role user, system, developer
// or assistant; content a string or input_text / output_text parts; "type": "message" may be
// left out), function_call (an assistant's call: call_id, name, arguments as JSON text),
// function_call_output (the call's result: a "tool" message), reasoning (its summary or
// reasoning_text, the next assistant turn's reasoning). instructions (the system prompt, not
// carried to a later turn by previous_response_id), tools (function tools, flat: name,
// description, parameters, strict), tool_choice (auto, none, required, {"type": "function",
// "name"}), parallel_tool_calls, text.format (text, json_object, json_schema: the grammar the
// answer must match), max_output_tokens, temperature, top_p, reasoning.effort (none switches the
// template's enable_thinking off, any other effort on), store, previous_response_id, metadata,
// user, prompt_cache_key (the session key, as chat completions reads it), stream, truncation. Images, files, hosted tools, background and conversation objects get
// a 400; fields this server does not read are ignored.
#pragma once

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "edge/gateway/openai/openai_request.h"

namespace edge::gateway {

struct responses_fields {
  bool store = true;  // the API's default: kept until it expires or is deleted
  bool system_message = false;  // the request's first chat message is its instructions
  std::optional<std::string> previous_response_id;
  // What the response object repeats of the request: instructions, max_output_tokens,
  // metadata, parallel_tool_calls, prompt_cache_key, reasoning, store, temperature, text,
  // tool_choice, tools, top_p, truncation, user (null or the API's default where the request left them out).
  boost::json::object echo;
  // The conversation's items before the answer (instructions aside): those of the response
  // previous_response_id names (its own conversation and output), then this request's input (a
  // string input is one user message item). Stored with the response, so that a later request
  // naming it continues the conversation.
  boost::json::array conversation;
};

std::variant<openai_request, request_error> parse_responses_request(std::string_view body);

// Items (as `input` holds them, the stored ones of earlier responses included) as the chat
// messages they stand for, appended to `out`. `param`: the items' place in errors.
std::optional<request_error> read_response_items(const boost::json::array& items, std::string_view param,
                                                 std::vector<backend::chat_message>& out);

}  // namespace edge::gateway
