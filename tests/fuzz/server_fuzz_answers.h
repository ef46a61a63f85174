// The whole-server fuzzer's judge (server_fuzz.cpp): whether the server's answer to one request
// is exactly one well-formed response of the API, as the API documents it.
//
// * A status the API documents: 200, 400, 404, 413, 429, 503 (the last two with retry-after).
//   Never a 500, nor a connection that ends without a whole answer once the request was sent
//   whole.
// * An error is {"error":{"message","type","param","code"}}; on /v1/messages, Anthropic's
//   {"type":"error","error":{"type","message"}}.
// * An answer has the request's n choices, each once, each with a finish_reason of stop,
//   length, tool_calls or content_filter, and log probabilities of the API's shape where asked
//   for; its usage adds up, within n x max_tokens.
// * A stream is well-formed `data:` events (comments allowed) ending with one `data: [DONE]`;
//   an error event may end it early (then only [DONE]); else every choice finishes exactly once
//   and says nothing after it has. A Messages stream is named events from message_start to
//   message_stop (or an error event), its blocks opened, filled and closed in order; a Responses
//   stream is named events numbered from 0, from response.created to one terminal event whose
//   response holds what the deltas said. Whole answers are a message, or a response object.
// * What the request asked of the output: JSON where a response_format asks for it (when the
//   output ended by itself), at most one call when tool_choice names a function or
//   parallel_tool_calls is false, calls only to the named function, and no tool-call markup
//   left in the content of an answer that had to call tools.
#pragma once

#include <optional>
#include <string>

#include "server_fuzz_requests.h"

namespace edge::fuzz {

// What the client got.
struct http_answer {
  bool sent = false;      // the request was written whole
  bool headers = false;   // the answer's headers were read
  bool complete = false;  // the whole answer was read
  std::string failure;    // why the exchange ended early, when it did
  unsigned status = 0;
  std::string content_type;
  std::string retry_after;  // the header, on a refusal that asks the client to wait
  std::string body;
};

// What is wrong with `a` as the answer to `r`; nothing when it is right.
std::optional<std::string> check_answer(const fuzz_request& r, const http_answer& a);

// Whether `status` is one the API documents for these routes.
bool documented_status(unsigned status);

}  // namespace edge::fuzz
