// The JSON bodies of OpenAI's API, as OpenAI writes them (Boost.JSON, never pasted strings):
//
//   chat, whole     {"id":"chatcmpl-…","object":"chat.completion","created","model",
//                    "choices":[{"index","message":{"role":"assistant","content","refusal":null},
//                                "logprobs","finish_reason"}, …],"usage":{…}}
//                    With tool calls a choice's message has "tool_calls":[{"id","type":"function",
//                    "function":{"name","arguments"}}] and its finish_reason is "tool_calls"; with
//                    the model's reasoning parsed, "reasoning_content" (text or null). "content"
//                    is null when the choice's answer is empty but for tool calls or reasoning.
//   chat, stream    "chat.completion.chunk" objects, each about one choice (its "index"): the
//                    role delta first ({"role":"assistant","content":""}), then one delta per
//                    parsed piece: {"content":…}, {"reasoning_content":…}, a tool call's first
//                    delta {"tool_calls":[{"index","id","type":"function","function":{"name",
//                    "arguments":""}}]} and its arguments {"tool_calls":[{"index","function":
//                    {"arguments":…}}]}; then {} with the finish_reason; after every choice,
//                    (include_usage) "choices":[] with usage. A choice's deltas add up to its
//                    message in the whole answer.
//   completions     "text_completion" objects with choices [{"index","text","logprobs",
//                    "finish_reason"}]; the stream has no role delta and ends each choice with
//                    text "" and the finish_reason.
//   usage           {"prompt_tokens","completion_tokens","total_tokens",
//                    "prompt_tokens_details":{"cached_tokens"}}, and where the model's reasoning is
//                    parsed "completion_tokens_details":{"reasoning_tokens"} (every choice's)
// "logprobs" is null unless asked for (logprobs.h writes it).
// With stream_options.include_usage every chunk before the usage chunk carries "usage": null.
#pragma once

#include <boost/json/object.hpp>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "edge/backend/engine/engine.h"
#include "edge/gateway/openai/openai_request.h"
#include "edge/gateway/openai/output_events.h"
#include "edge/gateway/openai/serving_model.h"

namespace edge::gateway {

// What every object of one response shares.
struct response_meta {
  openai_api api = openai_api::completions;
  std::string id;         // "chatcmpl-…" / "cmpl-…"
  std::int64_t created = 0;
  std::string model;
};

// "chatcmpl-" or "cmpl-" and the request id.
std::string response_id(openai_api api, std::string_view request_id);

// `reasoning_tokens`: given where the model's reasoning is parsed.
boost::json::object usage_json(const backend::token_usage& usage,
                               std::optional<std::int64_t> reasoning_tokens = std::nullopt);

// "tool_calls" for a chat choice that ended (stop) with tool calls; the engine's reason otherwise
// (a choice cut short by max_tokens stays "length", as OpenAI's does).
std::string_view chat_finish_reason(backend::finish_reason reason, bool made_tool_calls);

// One choice of an answer that was not streamed.
struct choice_result {
  std::string text;           // completions: the choice's text
  assistant_message message;  // chat: what the choice's output was parsed into
  backend::finish_reason reason = backend::finish_reason::stop;
  std::string logprobs = "null";  // JSON text: null, or the choice's logprobs object (choice_logprobs::all())
};

// The whole answer of a request that was not streamed, its choices in index order, as JSON text.
// Boost.JSON writes every part; each choice's log probabilities, which can be most of a large
// answer, are joined in as the text choice_logprobs wrote, so that no tree of them is built whole.
// `reasoning_tokens` (chat): given where the model's reasoning is parsed, the choices' sum; every
// message then has "reasoning_content".
std::string completion_body(const response_meta& meta, std::span<const choice_result> choices,
                            const backend::token_usage& usage, std::optional<std::int64_t> reasoning_tokens = std::nullopt);

// The chunks of one streamed answer.
class chunk_builder {
 public:
  chunk_builder(response_meta meta, bool include_usage) : meta_(std::move(meta)), include_usage_(include_usage) {}

  // Chat only: {"role":"assistant","content":""}, sent before any of the choice's content.
  boost::json::object role(std::int32_t index = 0) const;
  // A piece of text: chat's {"content":…} delta, completions' text.
  boost::json::object content(std::string_view text, std::int32_t index = 0,
                              boost::json::value logprobs = nullptr) const;
  // Chat only: the delta of one parsed event (content, reasoning_content, tool_calls).
  boost::json::object event(const output_event& event, std::int32_t index = 0,
                            boost::json::value logprobs = nullptr) const;
  // `made_tool_calls` (chat): the choice made tool calls (chat_finish_reason).
  boost::json::object finish(backend::finish_reason reason, std::int32_t index = 0,
                             boost::json::value logprobs = nullptr, bool made_tool_calls = false) const;
  boost::json::object usage(const backend::token_usage& usage,
                            std::optional<std::int64_t> reasoning_tokens = std::nullopt) const;

 private:
  boost::json::object chunk(boost::json::object choice) const;
  // Chat: {"index","delta","logprobs","finish_reason":null}.
  boost::json::object delta(boost::json::object delta, std::int32_t index, boost::json::value logprobs) const;
  response_meta meta_;
  bool include_usage_;
};

// {"id","object":"model","created","owned_by":"edgeinfer","max_model_len"} (max_model_len as vLLM)
boost::json::object model_object(const serving_model& model);
// {"object":"list","data":[model objects]}
boost::json::object model_list(const serving_model& model);

}  // namespace edge::gateway
