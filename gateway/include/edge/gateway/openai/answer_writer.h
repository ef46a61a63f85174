// How each API writes an answer. Every generating route reads the engine's events the same way
// (openai_routes.cpp: parsers, log probabilities, usage, disconnects, heartbeats); what it hands
// the writer is the same whether the answer streams or not, and the writer folds it into the
// stream's events as they come and into the whole answer at the end, so that both say the same.
//
//   chat / completions   OpenAI's chunks (openai_response.h), data-only, ending in [DONE]
//   messages             Anthropic's named events (anthropic_response.h), no [DONE]
//   responses            OpenAI's Responses events (responses_response.h), no [DONE]
//
// One writer per request. Connection strand only.
#pragma once

#include <boost/json/value.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "edge/backend/engine/engine.h"
#include "edge/gateway/http/sse_writer.h"
#include "edge/gateway/openai/openai_response.h"
#include "edge/gateway/openai/output_events.h"
#include "edge/gateway/openai/refusals.h"

namespace edge::gateway {

class answer_writer {
 public:
  virtual ~answer_writer() = default;

  // Each call appends the stream's events it makes to `out` (left unsent when the answer is not
  // streamed). `logprobs` is a choice's log probabilities not yet sent (choice_logprobs::take()),
  // null when none are, and always null for an answer that is not streamed (whole() takes them).

  // The events that open a stream.
  virtual void open(std::vector<named_event>& out) = 0;
  // Completions with echo and logprobs: the echoed prompt in front of choice `index`.
  virtual void echo(std::int32_t index, boost::json::value logprobs, std::vector<named_event>& out) = 0;
  // Chat: a parsed piece of choice `index`'s output.
  virtual void output(std::int32_t index, const output_event& event, boost::json::value logprobs,
                      std::vector<named_event>& out) = 0;
  // Completions: a piece of choice `index`'s text.
  virtual void text(std::int32_t index, std::string_view text, boost::json::value logprobs,
                    std::vector<named_event>& out) = 0;
  // Choice `index` ended, with what its parser held back already given; `stop_string`: the
  // request's stop string that ended it, if one did.
  virtual void choice_end(std::int32_t index, backend::finish_reason reason, std::string_view stop_string,
                          boost::json::value logprobs, std::vector<named_event>& out) = 0;
  // The request completed: the events that close the stream. `reasoning_tokens`: given where the
  // model's reasoning is parsed (every choice's).
  virtual void end(const backend::token_usage& usage, std::optional<std::int64_t> reasoning_tokens,
                   std::vector<named_event>& out) = 0;
  // The request completed, not streamed: the whole answer as JSON text. `logprobs`: each choice's
  // (choice_logprobs::all()), "null" where none were asked for.
  virtual std::string whole(std::vector<std::string> logprobs, const backend::token_usage& usage,
                            std::optional<std::int64_t> reasoning_tokens) = 0;
  // A stream that failed after it began: its error event.
  virtual named_event failure(const refusal& failure) = 0;
  // Whether a stream ends with "data: [DONE]" (OpenAI's chat and completions) or just ends.
  virtual bool ends_with_done() const = 0;
  // The event that keeps an idle stream open, where the API has one (Anthropic's ping); else
  // the stream gets a `: ping` comment.
  virtual std::optional<named_event> heartbeat() const { return std::nullopt; }
  // After end() or whole(): what the API keeps of the answer (a stored response), if anything.
  virtual std::optional<boost::json::object> kept() const { return std::nullopt; }
};

// OpenAI's chat completions and completions (meta.api): r.n choices for each text of `echoed`
// (one per prompt; a completions batch has several), choice i answering prompt i / r.n. Under
// echo, each choice's text starts with its prompt's text.
std::unique_ptr<answer_writer> make_openai_writer(response_meta meta, const openai_request& r,
                                                  std::vector<std::string> echoed);

// Anthropic's Messages (one choice). `usage`: the prompt's, as known when the answer opens.
std::unique_ptr<answer_writer> make_messages_writer(std::string id, std::string model,
                                                    const backend::token_usage& usage);

// OpenAI's Responses (one choice). `echo`: what the response repeats of the request; `store`:
// the response is kept (kept()).
std::unique_ptr<answer_writer> make_responses_writer(std::string id, std::string model, std::int64_t created_at,
                                                     boost::json::object echo, bool store);

}  // namespace edge::gateway
