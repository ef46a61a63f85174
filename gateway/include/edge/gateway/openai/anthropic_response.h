// Anthropic's Messages API answers: the message and its stream's events, errors in its shape,
// and count_tokens' body.
#pragma once

#include <boost/json/object.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "edge/backend/engine/engine.h"
#include "edge/gateway/http/http.h"
#include "edge/gateway/http/sse_writer.h"
#include "edge/gateway/openai/output_events.h"

namespace edge::gateway {

// One Messages answer as it grows, folded from the output parser's events (output_events.h):
// a content block is opened each time the kind of output changes (thinking, text, a tool call)
// and closed when the next begins or the answer ends. A stream sends the events as they come;
// the whole answer (message()) is the same fold, so both say the same. Connection strand only.
class messages_answer {
 public:
  // `usage` as far as known when the answer starts (the prompt's tokens, cached ones included).
  messages_answer(std::string id, std::string model, const backend::token_usage& usage);

  // message_start: the message with no content yet.
  named_event start() const;
  // The events `event` makes: a content_block_stop and content_block_start where a block ends
  // and the next begins, and its content_block_delta.
  void add(const output_event& event, std::vector<named_event>& out);
  // The open block's content_block_stop, message_delta (stop_reason and stop_sequence, the final
  // usage) and message_stop. `stop_string`: the stop sequence that ended the answer, if one did.
  void finish(backend::finish_reason reason, std::string_view stop_string, const backend::token_usage& usage,
              std::vector<named_event>& out);
  // The whole message: content blocks, stop_reason (null before finish) and usage.
  boost::json::object message() const;

 private:
  struct block {
    std::string type;  // "text", "thinking" or "tool_use"
    std::string text;  // the text, the thinking, or the call's arguments (JSON text)
    std::string id;    // tool_use
    std::string name;  // tool_use
  };
  void close(std::vector<named_event>& out);
  boost::json::object usage_json() const;

  std::string id_;
  std::string model_;
  backend::token_usage usage_;
  std::vector<block> blocks_;
  bool open_ = false;  // the last block is still receiving deltas
  std::optional<std::string> stop_reason_;
  std::optional<std::string> stop_sequence_;
};

// Anthropic's stop_reason for how a choice ended: tool_use when it made tool calls, stop_sequence
// when a stop string (`stop_string`) ended it, end_turn for another stop, max_tokens for the
// length, refusal for a content filter.
std::string_view anthropic_stop_reason(backend::finish_reason reason, bool made_tool_calls,
                                       std::string_view stop_string = {});

// Anthropic's error type for an HTTP status (400 invalid_request_error, 401
// authentication_error, 403 permission_error, 404 not_found_error, 413 request_too_large, 429
// rate_limit_error, 503 overloaded_error, other 5xx api_error).
std::string_view anthropic_error_type(http::status status);

// {"type": "error", "error": {"type": anthropic_error_type(status), "message"}}: an error
// response's body, and a stream's error event.
boost::json::object anthropic_error_body(http::status status, std::string_view message);

// The error `res` answers, written as this server writes every error (OpenAI's shape,
// {"error": {"message", ...}}), rewritten in Anthropic's: {"type": "error", "error": {"type",
// "message"}}. The status and headers stay (retry-after, x-ratelimit-*); a body that is not
// such an error keeps its text as the message.
response anthropic_error(response res);

// {"input_tokens": N}
response count_tokens_response(std::int64_t input_tokens);

}  // namespace edge::gateway
