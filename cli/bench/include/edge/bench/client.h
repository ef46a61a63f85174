// A streaming client for OpenAI-compatible servers on Boost.Beast: keep-alive connections in a
// pool, Server-Sent Events parsed as they arrive, a deadline per request.
//
// Wire format (OpenAI's):
//   /v1/completions       {"model","prompt","max_tokens","stream":true,"stream_options":
//                          {"include_usage":true},...}; deltas in choices[0].text
//   /v1/chat/completions  {"model","messages":[...],...}; deltas in choices[0].delta.content (a
//                          first delta carrying only the role is not a token)
// A request of a session (the agent dataset) carries `x-session-affinity: <session key>`.
// Usage arrives in a last chunk (or any chunk) with a "usage" object, whose
// prompt_tokens_details.cached_tokens (when present) counts the prompt tokens the server's
// prefix cache served; servers that do not send usage are fine (the client's delta count
// stands in). A chunk holding "error" fails the request.
// The stream must end with `data: [DONE]`; a stream cut before that is a failure.
//
// Everything here runs on one io_context thread; the pool is owned by that thread.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/tcp_stream.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "edge/bench/stats.h"
#include "edge/bench/workload.h"
#include "edge/common/status.h"

namespace edge::bench {

namespace asio = boost::asio;
namespace beast = boost::beast;

enum class api_endpoint { completions, chat_completions };

struct server_url {
  std::string host;
  std::string port;
  std::string base_path;  // "" or "/prefix", without a trailing slash and without "/v1"
};

// "http://host:port", "http://host:port/v1", "http://host/prefix". https is refused: the
// benchmark measures servers on hosts it can reach directly.
result<server_url> parse_base_url(std::string_view url);

std::string request_path(const server_url& url, api_endpoint endpoint);

struct client_options {
  server_url url;
  api_endpoint endpoint = api_endpoint::completions;
  std::string api_key;  // empty: no Authorization header
  std::string model;
  double temperature = 0.0;
  bool ignore_eos = true;  // vLLM's extension: outputs run to max_tokens, so lengths are as asked
  bool keep_output_text = false;  // keep each answer's text in its record (an agent resends it)
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
};

// The JSON body of one request.
std::string request_body(const client_options& options, const request_spec& spec);

// The context the server gives `options.model`: `max_model_len` of its entry in GET /v1/models,
// as vLLM and edgeinfer report it; nullopt when the server names none or cannot be asked
// (within a few seconds). Blocks; call it before a run.
std::optional<std::int64_t> served_context(const client_options& options);
// The tokens the server's tokenizer makes of `text` (POST /tokenize, vLLM's and edgeinfer's:
// its "count", or llama.cpp's "tokens"); nullopt when the server has no such route.
std::optional<std::int64_t> served_token_count(const client_options& options, const std::string& text);

// Splits a Server-Sent Events byte stream into the data of its events, across reads.
class sse_parser {
 public:
  // Feeds bytes; calls `on_data` with each complete event's data (its "data:" lines joined by
  // '\n'). Comments (": ping") and other fields are skipped.
  void feed(std::string_view bytes, const std::function<void(std::string_view data)>& on_data);

 private:
  std::string pending_;  // bytes of the event not yet complete
};

// Idle keep-alive connections to one server; io_context thread only.
class connection_pool {
 public:
  connection_pool(asio::any_io_executor executor, server_url url);

  // An idle connection whose peer has not closed it (`reused` set), else, or when `fresh`, a new
  // one (connected before `deadline`); null with `error` set when connecting failed.
  asio::awaitable<std::unique_ptr<beast::tcp_stream>> acquire(std::chrono::steady_clock::time_point deadline,
                                                              beast::error_code& error, bool fresh, bool& reused);
  void release(std::unique_ptr<beast::tcp_stream> stream);

  std::int64_t connections_opened() const { return opened_; }

 private:
  asio::any_io_executor executor_;
  server_url url_;
  asio::ip::tcp::resolver::results_type endpoints_;
  bool resolved_ = false;
  std::vector<std::unique_ptr<beast::tcp_stream>> idle_;
  std::int64_t opened_ = 0;
};

// Sends one request and follows its stream to the end. Times are seconds since `origin`. A
// request whose reused connection turns out closed before any byte of a response (the server
// closed it while it sat idle: the close and the request crossed) is sent once more on a new
// connection, as HTTP clients do; a new connection's failure is the request's.
asio::awaitable<request_record> send_request(connection_pool& pool, const client_options& options,
                                             const request_spec& spec, std::chrono::steady_clock::time_point origin);

}  // namespace edge::bench
