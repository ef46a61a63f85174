// The JSON bodies of OpenAI's API, as OpenAI writes them (Boost.JSON, never pasted strings):
//
//   chat, whole     {"id":"chatcmpl-…","object":"chat.completion","created","model",
//                    "choices":[{"index","message":{"role":"assistant","content","refusal":null},
//                                "logprobs","finish_reason"}, …],"usage":{…}}
//   chat, stream    "chat.completion.chunk" objects, each about one choice (its "index"): the
//                    role delta first ({"role":"assistant","content":""}), one {"content":…}
//                    delta per piece, then {} with the finish_reason, then (include_usage)
//                    "choices":[] with usage.
//   completions     "text_completion" objects with choices [{"index","text","logprobs",
//                    "finish_reason"}]; the stream has no role delta and ends each choice with
//                    text "" and the finish_reason.
// "logprobs" is null unless asked for (logprobs.h writes it).
//   usage           {"prompt_tokens","completion_tokens","total_tokens",
//                    "prompt_tokens_details":{"cached_tokens"}}
// With stream_options.include_usage every chunk before the usage chunk carries "usage": null.
#pragma once

#include <boost/json/object.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "edge/backend/engine.h"
#include "edge/gateway/openai/openai_request.h"
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

boost::json::object usage_json(const backend::token_usage& usage);

// One choice of an answer that was not streamed.
struct choice_result {
  std::string text;
  backend::finish_reason reason = backend::finish_reason::stop;
  boost::json::value logprobs;  // null, or the choice's logprobs object
};

// The whole answer of a request that was not streamed, its choices in index order.
boost::json::object completion_response(const response_meta& meta, std::span<const choice_result> choices,
                                        const backend::token_usage& usage);

// The chunks of one streamed answer.
class chunk_builder {
 public:
  chunk_builder(response_meta meta, bool include_usage) : meta_(std::move(meta)), include_usage_(include_usage) {}

  // Chat only: {"role":"assistant","content":""}, sent before any of the choice's content.
  boost::json::object role(std::int32_t index = 0) const;
  boost::json::object content(std::string_view text, std::int32_t index = 0,
                              boost::json::value logprobs = nullptr) const;
  boost::json::object finish(backend::finish_reason reason, std::int32_t index = 0,
                             boost::json::value logprobs = nullptr) const;
  boost::json::object usage(const backend::token_usage& usage) const;

 private:
  boost::json::object chunk(boost::json::object choice) const;
  response_meta meta_;
  bool include_usage_;
};

// {"id","object":"model","created","owned_by":"edgeinfer","max_model_len"} (max_model_len as vLLM)
boost::json::object model_object(const serving_model& model);
// {"object":"list","data":[model objects]}
boost::json::object model_list(const serving_model& model);

}  // namespace edge::gateway
