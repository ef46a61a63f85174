// The Responses API's answers: the response object and its stream's events.
//
//   response      {"id": "resp_…", "object": "response", "created_at", "status": "completed" |
//                  "incomplete" | "failed", "error", "incomplete_details", "model", "output": [items],
//                  "usage": {"input_tokens", "input_tokens_details": {"cached_tokens"}, "output_tokens",
//                  "output_tokens_details": {"reasoning_tokens"}, "total_tokens"}, and what it
//                  repeats of the request (responses_fields::echo)}
//   items         reasoning {"id": "rs_…", "summary": [], "content": [{"type": "reasoning_text", "text"}]},
//                 message {"id": "msg_…", "role": "assistant", "content": [{"type": "output_text",
//                  "text", "annotations": [], "logprobs": []}]}, function_call {"id": "fc_…",
//                  "call_id", "name", "arguments"}; each with its "status"
//   stream        response.created, response.in_progress; per item output_item.added, its content
//                 part (content_part.added / .done around output_text.delta / .done or
//                 reasoning_text.delta / .done) or its function_call_arguments.delta / .done,
//                 output_item.done; then response.completed or response.incomplete (the whole
//                 response), or response.failed. Every event has its sequence_number, from 0.
#pragma once

#include <boost/json/object.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "edge/backend/engine/engine.h"
#include "edge/gateway/http/sse_writer.h"
#include "edge/gateway/openai/output_events.h"

namespace edge::gateway {

// One response as it grows, folded from the output parser's events (output_events.h): an item
// is opened each time the kind of output changes (reasoning, text, a tool call) and closed when
// the next begins or the answer ends. A stream sends the events as they come; the whole response
// (response()) is the same fold. Connection strand only.
class responses_answer {
 public:
  // `echo`: what the response repeats of the request (responses_fields::echo).
  responses_answer(std::string id, std::string model, std::int64_t created_at, boost::json::object echo);

  // response.created and response.in_progress: the response with no output yet.
  void start(std::vector<named_event>& out);
  void add(const output_event& event, std::vector<named_event>& out);
  // The open item's closing events, then response.completed (a stop) or response.incomplete
  // (length: max_output_tokens; content_filter) with the whole response.
  void finish(backend::finish_reason reason, const backend::token_usage& usage,
              std::optional<std::int64_t> reasoning_tokens, std::vector<named_event>& out);
  // response.failed: the response so far, with the error.
  named_event failure(std::string_view code, std::string_view message);
  // The whole response: status in_progress before finish().
  boost::json::object response() const;

 private:
  struct item {
    std::string type;  // "reasoning", "message" or "function_call"
    std::string id;
    std::string text;     // the reasoning, the text, or the call's arguments
    std::string call_id;  // function_call
    std::string name;     // function_call
    std::string status = "in_progress";
  };
  named_event event(std::string_view type, boost::json::object data);
  boost::json::object item_json(const item& i) const;
  void close(std::vector<named_event>& out);

  std::string id_;
  std::string model_;
  std::int64_t created_at_;
  boost::json::object echo_;
  std::vector<item> items_;
  bool open_ = false;  // the last item is still receiving deltas
  std::int64_t sequence_ = 0;
  std::string status_ = "in_progress";
  boost::json::value incomplete_details_ = nullptr;
  boost::json::value error_ = nullptr;
  boost::json::value usage_ = nullptr;
};

}  // namespace edge::gateway
