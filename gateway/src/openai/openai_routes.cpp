#include "edge/gateway/openai/openai_routes.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <chrono>
#include <mutex>

#include "edge/common/format.h"
#include "edge/common/log.h"
#include "edge/common/memory.h"
#include "edge/gateway/http/event_relay.h"
#include "edge/gateway/http/json_response.h"
#include "edge/gateway/tenancy/quota_response.h"
#include "edge/gateway/openai/anthropic_request.h"
#include "edge/gateway/openai/answer_writer.h"
#include "edge/gateway/openai/anthropic_response.h"
#include "edge/gateway/openai/grammar_compiler.h"
#include "edge/gateway/openai/logprobs.h"
#include "edge/gateway/openai/openai_request.h"
#include "edge/gateway/openai/openai_response.h"
#include "edge/gateway/openai/output_parser.h"
#include "edge/gateway/openai/refusals.h"
#include "edge/gateway/openai/responses_request.h"
#include "edge/gateway/tenancy/engine_limits.h"
#include "edge/gateway/tenancy/tenant_store.h"
#include "edge/gateway/http/percent_encoding.h"
#include "edge/gateway/http/sse_writer.h"
#include "edge/monitoring/gateway_metrics.h"

namespace edge::gateway {
namespace {

using namespace boost::asio::experimental::awaitable_operators;
using clock = std::chrono::steady_clock;

const logger responses_log{"responses"};

// The most a stored conversation that previous_response_id continues may hold: far past what any
// context's prompt is as text (128k tokens are about 0.5 MB), it bounds what one request reads
// from the store and renders (each stored response holds its whole conversation).
constexpr std::int64_t max_continued_conversation_bytes = std::int64_t{16} << 20;

std::int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// ---- responses --------------------------------------------------------------------------------

// The response with the session's headers (x-ratelimit-*), which every answer to an admitted
// request carries.
response with_headers(response res, const request_session& session) {
  session.add_headers(res);
  return res;
}

// The request's own fault (a 400), naming the parameter at fault.
response invalid_request(std::string_view message, std::string_view param,
                         refusal_kind kind = refusal_kind::invalid_request) {
  return refusal_response({.kind = kind, .message = std::string(message), .param = std::string(param)});
}

response model_not_found(std::string_view requested, std::string_view served) {
  return error_response(http::status::not_found,
                        format("The model '{}' does not exist; this server serves '{}'", requested, served),
                        "invalid_request_error", "model", "model_not_found");
}

// ---- the APIs ---------------------------------------------------------------------------------

// What differs between the APIs that generate; the rest of the path is theirs alike. Every
// one reads its body into the chat completions or completions request (request.api says which
// engine path: the chat template, or the prompt as it is).
struct api_frontend {
  std::string_view name;  // the API, as the metrics' api label names it
  std::variant<openai_request, request_error> (*parse)(std::string_view body);
  error_shape error;  // an error response written in the API's shape (its routes name it to the server)
  // The writer of an answer to `r` (request_id: the exchange's; echoed: completions' echo, each
  // prompt's).
  std::unique_ptr<answer_writer> (*writer)(const openai_request& r, std::string_view request_id, std::string model,
                                           std::vector<std::string> echoed, const backend::token_usage& prompt);
  std::string_view tool_call_id_prefix;  // ids of the calls the answer makes, where the syntax has none
  // What the API calls the prompt and the output format, for the errors that name them.
  std::string_view prompt_param;
  std::string_view format_param;
};

response openai_error(response res) { return res; }

template <openai_api api>
std::unique_ptr<answer_writer> openai_answer(const openai_request& r, std::string_view request_id, std::string model,
                                             std::vector<std::string> echoed, const backend::token_usage&) {
  return make_openai_writer({api, response_id(api, request_id), unix_seconds(), std::move(model)}, r, std::move(echoed));
}

const api_frontend chat_completions_api{
    .name = "chat_completions",
    .parse = [](std::string_view body) { return parse_openai_request(openai_api::chat_completions, body); },
    .error = openai_error,
    .writer = openai_answer<openai_api::chat_completions>,
    .tool_call_id_prefix = "call_",
    .prompt_param = "messages",
    .format_param = "response_format"};

const api_frontend completions_api{
    .name = "completions",
    .parse = [](std::string_view body) { return parse_openai_request(openai_api::completions, body); },
    .error = openai_error,
    .writer = openai_answer<openai_api::completions>,
    .tool_call_id_prefix = "call_",
    .prompt_param = "prompt",
    .format_param = "response_format"};

const api_frontend messages_api{
    .name = "messages",
    .parse = [](std::string_view body) { return parse_anthropic_request(anthropic_route::messages, body); },
    .error = anthropic_error,
    .writer = [](const openai_request&, std::string_view request_id, std::string model, std::vector<std::string>,
                 const backend::token_usage& prompt) {
      return make_messages_writer("msg_" + std::string(request_id), std::move(model), prompt);
    },
    .tool_call_id_prefix = "toolu_",
    .prompt_param = "messages",
    .format_param = "messages"};

const api_frontend responses_api{
    .name = "responses",
    .parse = parse_responses_request,
    .error = openai_error,
    .writer = [](const openai_request& r, std::string_view, std::string model, std::vector<std::string>,
                 const backend::token_usage&) {
      // Its own random id, not the request's (a client may reuse its x-request-id): a stored
      // response is named by it.
      return make_responses_writer(random_id("resp_"), std::move(model), unix_seconds(),
                                   r.responses->echo, r.responses->store);
    },
    .tool_call_id_prefix = "call_",
    .prompt_param = "input",
    .format_param = "text.format"};

// count_tokens answers no generation: its writer is never asked for.
const api_frontend count_tokens_api{
    .name = "count_tokens",
    .parse = [](std::string_view body) { return parse_anthropic_request(anthropic_route::count_tokens, body); },
    .error = anthropic_error,
    .writer = nullptr,
    .tool_call_id_prefix = "toolu_",
    .prompt_param = "messages",
    .format_param = "messages"};

// vLLM's POST /tokenize (and llama.cpp's): the fields beside the prompt, as given.
struct tokenize_fields {
  bool add_special_tokens = true;  // false: without the leading BOS
  bool return_token_strs = false;  // each token's text in the vocabulary, beside its id
  std::optional<std::string> content;  // llama.cpp's name for the prompt
  bool chat = false;                   // messages given: the chat template renders them
};

std::variant<tokenize_fields, request_error> read_tokenize_fields(std::string_view body) {
  boost::system::error_code failed;
  const boost::json::value parsed = boost::json::parse(body, failed);
  if (failed) return request_error{format("The body is not valid JSON: {}", failed.message()), ""};
  if (!parsed.is_object()) return request_error{"The body must be a JSON object", ""};
  const boost::json::object& fields = parsed.as_object();
  tokenize_fields out;
  out.chat = fields.contains("messages");
  for (const auto& [name, flag] : {std::pair{"add_special_tokens", &out.add_special_tokens},
                                   std::pair{"return_token_strs", &out.return_token_strs}}) {
    const boost::json::value* v = fields.if_contains(name);
    if (v == nullptr || v->is_null()) continue;
    if (!v->is_bool()) return request_error{format("'{}' must be a boolean", name), name};
    *flag = v->as_bool();
  }
  if (const boost::json::value* v = fields.if_contains("content"); v != nullptr && !v->is_null()) {
    if (!v->is_string()) return request_error{"'content' must be a string", "content"};
    if (fields.contains("prompt") || fields.contains("messages")) {
      return request_error{"give 'prompt', 'messages' or 'content', one of them", "content"};
    }
    out.content = std::string(v->as_string());
  }
  return out;
}

// The body read as /v1/chat/completions reads it when it has messages, else as /v1/completions
// (llama.cpp's content as the prompt).
std::variant<openai_request, request_error> parse_tokenize_request(std::string_view body) {
  auto fields = read_tokenize_fields(body);
  if (auto* error = std::get_if<request_error>(&fields)) return std::move(*error);
  if (const auto& content = std::get<tokenize_fields>(fields).content) {
    return parse_openai_request(openai_api::completions,
                                boost::json::serialize(boost::json::object{{"prompt", *content}}));
  }
  const openai_api api = std::get<tokenize_fields>(fields).chat ? openai_api::chat_completions : openai_api::completions;
  return parse_openai_request(api, body);
}

// /tokenize answers no generation: its writer is never asked for.
const api_frontend tokenize_api{.name = "tokenize",
                                .parse = parse_tokenize_request,
                                .error = openai_error,
                                .writer = nullptr,
                                .tool_call_id_prefix = "call_",
                                .prompt_param = "prompt",
                                .format_param = "response_format"};

// The request parameter behind a field of the engine's request (engine::submit's submit_error).
std::string_view api_param(std::string_view field, const api_frontend& api, openai_api path,
                           std::string_view constraint_param) {
  if (field == "grammar") return constraint_param;
  if (field == "logprobs") return path == openai_api::chat_completions ? "top_logprobs" : "logprobs";
  if (field == "prompt_logprobs") return "echo";
  if (field == "n" || field == "logit_bias") return field;
  return api.prompt_param;
}

// What the engine refusing a request (engine_client::submit) means to the client: the refusal
// table's answer, naming the API's parameter.
response submit_failure(const backend::submit_error& failure, const api_frontend& api, openai_api path,
                        std::string_view constraint_param) {
  refusal r = refusal_of(failure);
  if (r.kind == refusal_kind::invalid_request || r.kind == refusal_kind::context_length) {
    r.param = api_param(failure.field(), api, path, constraint_param);
  }
  if (r.kind == refusal_kind::context_length) r.message = format("The request does not fit: {}", r.message);
  return refusal_response(r);
}

// ---- the prompt -------------------------------------------------------------------------------

// The prompt's token ids (completions: each prompt's), or the 400 to answer. Runs on the
// connection's thread: the engine thread never tokenizes.
std::variant<std::vector<std::vector<backend::token_id>>, response> prompt_tokens(const openai_request& r,
                                                                                  const serving_model& model) {
  const backend::tokenizer& tok = *model.tokenizer;
  const bool guarded = !model.parse_client_special_tokens;
  std::vector<std::vector<backend::token_id>> out;
  if (r.api == openai_api::chat_completions) {
    backend::chat_render_options options;
    if (auto bos = tok.bos_id()) options.bos_text = tok.token_text(*bos);
    if (!tok.eos_ids().empty()) options.eos_text = tok.token_text(tok.eos_ids().front());
    std::vector<std::string> tools;
    tools.reserve(r.tools.size());
    for (const tool_definition& tool : r.tools) tools.push_back(tool.json);
    auto text = model.chat_template.render({.messages = r.messages,
                                            .tools = tools,
                                            .add_generation_prompt = r.add_generation_prompt,
                                            .chat_template_kwargs = r.chat_template_kwargs},
                                           options);
    if (!text.ok()) return invalid_request(text.error().message(), "messages");
    // A Jinja template writes BOS where the model wants it (transformers adds none); of the
    // built-in ones, those that write BOS themselves (llama-2/3, mistral) must not get a second
    // one, and the others (plain, chatml) get BOS where the model's tokenizer adds it.
    const bool bos_in_text =
        model.chat_template.writes_own_bos() || (!options.bos_text.empty() && text->text.starts_with(options.bos_text));
    // The model's markup comes from the template only: what the request brought is text.
    out.push_back(tok.encode(text->text, {.add_bos = !bos_in_text,
                                          .parse_special = true,
                                          .client_text_guard = guarded ? &model.markup_tokens : nullptr,
                                          .markup = &text->markup}));
    return out;
  }
  out.reserve(r.prompts.size());
  for (std::size_t p = 0; p < r.prompts.size(); ++p) {
    if (const auto* text = std::get_if<std::string>(&r.prompts[p])) {
      // Prompt text is the client's: "<|im_start|>" in it stays text, and so does an added token
      // that is the model's markup ("<tool_call>").
      out.push_back(tok.encode(*text, {.add_bos = true,
                                       .parse_special = false,
                                       .client_text_guard = guarded ? &model.markup_tokens : nullptr}));
      continue;
    }
    const auto& ids = std::get<std::vector<std::int64_t>>(r.prompts[p]);
    const std::string what = r.prompts.size() == 1 ? std::string("prompt") : format("prompt[{}]", p);
    if (auto outside = backend::find_token_outside_vocabulary(std::span(ids), tok.vocab_size(), what)) {
      return invalid_request(outside->message, outside->param);
    }
    out.emplace_back(ids.begin(), ids.end());
  }
  return out;
}

// The completion's token limit after defaults, or the 400 when prompt and completion cannot
// fit in the context (OpenAI's and vLLM's rule: prompt + max_tokens <= context).
// `what`: the API's name of the prompt.
// `prompt_length`: the longest prompt; `choices`: every prompt's choices together.
std::variant<std::int64_t, response> resolve_max_tokens(const openai_request& r, std::string_view what,
                                                        std::int64_t prompt_length, std::int64_t context,
                                                        std::int32_t choices, const request_session& session) {
  const bool chat = r.api == openai_api::chat_completions;
  if (auto e = backend::prompt_does_not_fit(prompt_length, context, what)) {
    return invalid_request(e->message, e->param, refusal_kind::context_length);
  }
  const std::int64_t room = context - prompt_length;
  if (!r.max_tokens) {
    return session.default_max_tokens(prompt_length, chat ? room : std::min(default_completion_max_tokens, room),
                                      choices);
  }
  if (auto e = backend::completion_does_not_fit(prompt_length, *r.max_tokens, context, what)) {
    return invalid_request(e->message, e->param, refusal_kind::context_length);
  }
  return *r.max_tokens;
}

// The most log probabilities one answer that is not streamed may hold, alternatives included:
// about 50 MB of JSON. Built whole before it is sent, such an answer is held in memory at once,
// several times its size while it is built; a stream sends them as they come.
constexpr std::int64_t max_unstreamed_logprobs = std::int64_t{1} << 19;
// An answer of more log probabilities than this (several MB of JSON, more while built) gives
// its memory back to the system once sent.
constexpr std::int64_t large_unstreamed_logprobs = std::int64_t{1} << 16;

// The log probabilities an answer that is not streamed may hold, alternatives included (0 for a
// stream, or without logprobs). Each factor is bounded (choices by 128, tokens by the context,
// alternatives by 20): no overflow. `prompt_length`: the longest prompt.
std::int64_t unstreamed_logprobs(const openai_request& r, std::int64_t max_tokens, std::int64_t prompt_length,
                                 std::int32_t choices) {
  if (r.stream || !r.logprobs) return 0;
  const std::int64_t tokens = max_tokens + (r.echo ? prompt_length : 0);
  return std::int64_t{choices} * tokens * (1 + *r.logprobs);
}

// The 400 for a request whose answer, not streamed, would hold more log probabilities than that.
std::optional<response> too_many_logprobs(const openai_request& r, std::int64_t max_tokens, std::int64_t prompt_length,
                                          std::int32_t choices) {
  const std::int64_t entries = unstreamed_logprobs(r, max_tokens, prompt_length, choices);
  if (entries <= max_unstreamed_logprobs) return std::nullopt;
  const std::int64_t tokens = max_tokens + (r.echo ? prompt_length : 0);
  return invalid_request(format("An answer that is not streamed holds at most {} log probabilities, and this one could "
                                "hold {} ({} choices x {} tokens x {} each, the token and its alternatives): lower n, "
                                "max_tokens or the alternatives, or stream the answer",
                                max_unstreamed_logprobs, entries, choices, tokens, 1 + *r.logprobs),
                         choices > 1 ? "n" : "max_tokens");
}

// What a completions answer with echo shows in front of each prompt's choices' text: the prompt
// as the client wrote it, or as its token ids decode; one (empty) text where there is no echo.
std::vector<std::string> echoed_prompts(const openai_request& r, const backend::tokenizer& tok) {
  std::vector<std::string> out(std::max<std::size_t>(r.prompts.size(), 1));
  if (!r.echo) return out;
  for (std::size_t p = 0; p < r.prompts.size(); ++p) {
    if (const auto* text = std::get_if<std::string>(&r.prompts[p])) {
      out[p] = *text;
    } else {
      const auto& ids = std::get<std::vector<std::int64_t>>(r.prompts[p]);
      out[p] = tok.decode(std::vector<backend::token_id>(ids.begin(), ids.end()));
    }
  }
  return out;
}

// The text the prompt ends with, special tokens written out: enough tokens for any vocabulary
// to spell "<think>\n".
std::string prompt_tail(const backend::tokenizer& tok, std::span<const backend::token_id> prompt) {
  constexpr std::size_t tail_tokens = 8;
  return tok.decode(prompt.last(std::min(prompt.size(), tail_tokens)), /*with_special=*/true);
}

// Whether the answer starts inside a reasoning block the prompt opened. An answer a
// response_format constrains is the grammar's from its first token, so it never does, whatever
// the prompt opened; one that must call tools closes the block first (tool_call_answer_grammar).
bool starts_in_reasoning(const serving_model& model, const openai_request& r,
                         std::span<const backend::token_id> prompt) {
  return r.api == openai_api::chat_completions && model.output.reasoning != reasoning_parser_kind::none &&
         r.grammar == nullptr && prompt_opens_reasoning(prompt_tail(*model.tokenizer, prompt));
}

bool forces_calls(const openai_request& r) {
  return r.choice.mode == tool_choice_mode::required || r.choice.mode == tool_choice_mode::named;
}

// The syntax a request's tool calls are written and read in: the model's own; or, for a model
// without one whose request forces calls, llama3_json's plain JSON objects, which need no
// special token (the answer is constrained to them, and returned as tool_calls, as vLLM does).
output_syntax answer_syntax(const serving_model& model, const openai_request& r) {
  output_syntax syntax = model.output;
  if (syntax.tool_calls == tool_call_parser_kind::none && forces_calls(r)) {
    syntax.tool_calls = tool_call_parser_kind::llama3_json;
    syntax.tool_markers_special = false;
  }
  return syntax;
}

// At most one call: a named function is one call to it (OpenAI's rule), and
// parallel_tool_calls false allows one.
bool parallel_calls(const openai_request& r) {
  return r.parallel_tool_calls && r.choice.mode != tool_choice_mode::named;
}

// How a chat request's output is parsed: reasoning whenever the model writes it, tool calls when
// the request offers tools and tool_choice is not "none".
output_parser_options parsing_options(const serving_model& model, const openai_request& r,
                                      std::span<const backend::token_id> prompt) {
  output_parser_options o;
  o.reasoning = model.output.reasoning;
  o.starts_in_reasoning = starts_in_reasoning(model, r, prompt);
  if (!r.tools.empty() && r.choice.mode != tool_choice_mode::none) o.tool_calls = answer_syntax(model, r).tool_calls;
  o.tools.reserve(r.tools.size());
  for (const tool_definition& tool : r.tools) o.tools.push_back({.name = tool.name, .parameters = tool.parameters});
  o.parallel_tool_calls = parallel_calls(r);
  return o;
}

// tool_choice "required" or a named function: the grammar of the calls the answer must be, in
// the answer's syntax (null for other requests), or the 400 to answer.
std::variant<std::shared_ptr<const backend::grammar::grammar>, response> required_tool_calls(
    const serving_model& model, const openai_request& r, std::span<const backend::token_id> prompt) {
  if (!forces_calls(r)) return std::shared_ptr<const backend::grammar::grammar>();
  std::vector<tool_spec> tools;
  tools.reserve(r.tools.size());
  for (const tool_definition& tool : r.tools) tools.push_back({.name = tool.name, .parameters = tool.parameters});
  std::size_t earlier_calls = 0;
  for (const backend::chat_message& message : r.messages) earlier_calls += message.tool_calls.size();
  auto built = tool_call_answer_grammar(answer_syntax(model, r), *model.tokenizer,
                                        {.tools = tools,
                                         .only = r.choice.mode == tool_choice_mode::named ? r.choice.name : "",
                                         .parallel = parallel_calls(r),
                                         .earlier_calls = earlier_calls},
                                        starts_in_reasoning(model, r, prompt));
  if (!built.ok()) {
    return invalid_request(built.error().message(), built.error().path().empty() ? "tools" : built.error().path());
  }
  return std::make_shared<const backend::grammar::grammar>(std::move(built).value());
}

// Whether an output ended before the model ended it: what it began is unfinished.
bool cut_short(backend::finish_reason reason) {
  return reason == backend::finish_reason::length || reason == backend::finish_reason::content_filter;
}

// Whether the engine must write special tokens out for the parsers to see their markers.
bool needs_special_tokens(const output_syntax& syntax, const output_parser_options& o) {
  return (o.tool_calls != tool_call_parser_kind::none && syntax.tool_markers_special) ||
         (o.reasoning != reasoning_parser_kind::none && syntax.reasoning_tags_special);
}

// The sinks of a completions batch's engine requests (one per prompt, `per_prompt` choices
// each) that make their events those of one request in `joined`: prompt p's choices numbered
// from p x per_prompt, and one finished event once every prompt's request has finished, with
// their usage summed, or at once when one fails or is aborted; nothing after that. Any thread
// (a remote backend streams each request on its own): the sinks share a lock, which `joined`
// is called under (it never blocks).
std::vector<backend::event_sink> batch_sinks(std::size_t prompts, std::int32_t per_prompt, backend::event_sink joined) {
  struct batch {
    std::mutex mutex;
    backend::event_sink joined;
    std::size_t running;
    backend::token_usage usage;
    bool ended = false;
  };
  auto shared = std::make_shared<batch>();
  shared->joined = std::move(joined);
  shared->running = prompts;
  std::vector<backend::event_sink> sinks;
  sinks.reserve(prompts);
  for (std::size_t p = 0; p < prompts; ++p) {
    const auto first = static_cast<std::int32_t>(p) * per_prompt;
    sinks.push_back([shared, first, per_prompt](backend::engine_event event) {
      std::lock_guard lock(shared->mutex);
      if (shared->ended) return;
      if (auto* delta = std::get_if<backend::delta_event>(&event)) {
        // The engine numbers a request's choices from 0 to n - 1; any other index stays outside
        // the answer's choices, which the relay drops.
        if (delta->index >= 0 && delta->index < per_prompt) delta->index += first;
        else delta->index = -1;
      } else if (auto* prompt = std::get_if<backend::prompt_logprobs_event>(&event)) {
        prompt->first_index = first;
      } else if (auto* finished = std::get_if<backend::finished_event>(&event)) {
        shared->usage.prompt_tokens += finished->usage.prompt_tokens;
        shared->usage.completion_tokens += finished->usage.completion_tokens;
        shared->usage.cached_tokens += finished->usage.cached_tokens;
        const bool failed =
            finished->reason == backend::finish_reason::abort || finished->reason == backend::finish_reason::error;
        if (!failed && --shared->running > 0) return;
        shared->ended = true;
        finished->usage = shared->usage;
      }
      shared->joined(std::move(event));
    });
  }
  return sinks;
}

// What the relay of one request needs beyond the request itself.
struct relay_context {
  const openai_request& r;
  const api_frontend& api;
  const backend::tokenizer& tok;
  // Each prompt's tokens, kept when log probabilities are asked for. Choice i answers prompt
  // i / r.n (a completions batch; other requests have one prompt).
  std::vector<std::vector<backend::token_id>> prompts;
  std::vector<std::string> echoed;  // completions with echo: each prompt's text
  std::int32_t choices = 1;         // of every prompt together
  // Chat: how each choice's output is parsed into content, reasoning and tool calls
  // (output_parser.h); every choice has its own parser.
  std::optional<output_parser_options> parsing;
  std::unique_ptr<answer_writer> writer;
};

// One choice of an answer as it grows. Connection strand only.
struct choice_state {
  std::optional<output_parser> parser;   // chat: what reads the choice's output
  std::optional<choice_logprobs> logprobs;
  std::optional<backend::finish_reason> reason;  // once the choice's last delta came
};

// One answer's writer and its stream, when it streams. Connection strand only.
class answer_output {
 public:
  answer_output(answer_writer& writer, std::optional<sse_writer>& sse) : writer_(writer), sse_(sse) {}

  answer_writer& writer() { return writer_; }
  bool streams() const { return sse_.has_value(); }
  // A choice's log probabilities not yet sent, for the next of its events: null when not streaming
  // (the whole answer takes them all at the end).
  boost::json::value fresh_logprobs(choice_state& c) const {
    return sse_ && c.logprobs ? c.logprobs->take() : boost::json::value(nullptr);
  }
  // The events the writer made since the last send, sent when streaming. False once the client
  // is gone.
  std::vector<named_event>& pending() { return pending_; }
  asio::awaitable<bool> send() {
    std::vector<named_event> events = std::exchange(pending_, {});
    if (!sse_) co_return true;
    for (const named_event& event : events) {
      if (!co_await sse_->event(event)) co_return false;
    }
    co_return true;
  }
  // The end of a stream: [DONE] where the API has it.
  asio::awaitable<bool> close() {
    bool ok = co_await send();
    if (!ok) co_return false;
    if (writer_.ends_with_done()) {
      ok = co_await sse_->done();
    } else {
      ok = co_await sse_->end();
    }
    co_return ok;
  }

 private:
  answer_writer& writer_;
  std::optional<sse_writer>& sse_;
  std::vector<named_event> pending_;
};

// Hands a chat choice's parsed events to the writer and sends what it made. The first event
// carries the log probabilities of every token not yet sent: a token whose text the parser held
// back (a possible marker) goes with the next event the choice sends. False once the client is
// gone.
asio::awaitable<bool> deliver(answer_output& out, std::int32_t index, choice_state& c,
                              std::vector<output_event> parsed) {
  for (const output_event& event : parsed) {
    out.writer().output(index, event, out.fresh_logprobs(c), out.pending());
  }
  const bool ok = co_await out.send();
  co_return ok;
}

// Ends a request that failed: its error response, or for a stream begun already its error
// event and end, with the stream recorded under the error's status.
asio::awaitable<void> end_failed(exchange& ex, answer_output& out, const api_frontend& api, request_session& session,
                                 const refusal& failure) {
  session.set_outcome(request_outcome::failed);
  if (!out.streams()) {
    co_await ex.respond(api.error(with_headers(refusal_response(failure), session)));
    co_return;
  }
  ex.record_stream_failure(refusal_info(failure.kind).status);
  out.pending().push_back(out.writer().failure(failure));
  co_await out.close();
}

// ---- the handlers -----------------------------------------------------------------------------

class openai_service {
 public:
  openai_service(const model_slot& models, tenancy& tenants, monitoring::gateway_metrics* metrics,
                 openai_route_options options)
      : models_(models), tenants_(tenants), metrics_(metrics), options_(options) {}

  asio::awaitable<void> list_models(exchange& ex);
  asio::awaitable<void> get_model(exchange& ex);
  asio::awaitable<void> generate(exchange& ex, const api_frontend& api);
  asio::awaitable<void> count_tokens(exchange& ex);
  asio::awaitable<void> tokenize(exchange& ex);
  asio::awaitable<void> detokenize(exchange& ex);
  asio::awaitable<void> stored_response_route(exchange& ex, bool remove);

 private:
  // A generating request read and checked as far as its prompt.
  struct opened_request {
    request_session session;
    std::shared_ptr<const serving_model> model;
    openai_request r;
    // The prompt's tokens: one prompt, or a completions batch's (each non-empty).
    std::vector<std::vector<backend::token_id>> prompts;
  };

  // The caller's session, or nothing when a refusal was answered.
  asio::awaitable<std::optional<request_session>> authenticate(exchange& ex, const api_frontend& api);
  // The loaded model, or nothing when a 503 was answered.
  asio::awaitable<std::shared_ptr<const serving_model>> loaded_model(exchange& ex, const api_frontend& api);
  // Authenticated, admitted, read, and its prompt rendered; or nothing when a refusal was answered.
  asio::awaitable<std::optional<opened_request>> open_request(exchange& ex, const api_frontend& api);
  asio::awaitable<void> relay(exchange& ex, event_relay& events, relay_context& context, request_session& session);
  // Responses' previous_response_id: the conversation and output of the stored response it names
  // go in front of this request's input; or the error to answer.
  asio::awaitable<std::optional<response>> continue_conversation(const request_session& session, openai_request& r);
  // A completed response that asked to be stored, stored for the tenant before its last event is
  // sent (a client may name it in its next request at once).
  asio::awaitable<void> keep(const request_session& session, const openai_request& r, const boost::json::object& kept);

  const model_slot& models_;
  tenancy& tenants_;
  monitoring::gateway_metrics* metrics_;
  openai_route_options options_;
};

asio::awaitable<std::optional<request_session>> openai_service::authenticate(exchange& ex, const api_frontend& api) {
  auto session = tenants_.authenticate(ex.req());
  if (!session.ok()) {
    co_await ex.respond(api.error(unauthorized_response(session.error())));
    co_return std::nullopt;
  }
  ex.access().tenant = session->tenant().id;
  co_return std::move(session).value();
}

asio::awaitable<std::shared_ptr<const serving_model>> openai_service::loaded_model(exchange& ex,
                                                                                    const api_frontend& api) {
  std::shared_ptr<const serving_model> model = models_.get();
  if (model == nullptr) {
    response loading = refusal_response({.kind = refusal_kind::model_not_ready, .message = "The model is still loading"});
    co_await ex.respond(api.error(std::move(loading)));
  }
  co_return model;
}

asio::awaitable<void> openai_service::list_models(exchange& ex) {
  if (!co_await authenticate(ex, chat_completions_api)) co_return;
  const auto model = co_await loaded_model(ex, chat_completions_api);
  if (model == nullptr) co_return;
  co_await ex.respond(json_response(http::status::ok, model_list(*model)));
}

asio::awaitable<void> openai_service::get_model(exchange& ex) {
  if (!co_await authenticate(ex, chat_completions_api)) co_return;
  const auto model = co_await loaded_model(ex, chat_completions_api);
  if (model == nullptr) co_return;
  const auto id = percent_decode(ex.path_param("id"));
  if (!id) {
    co_await ex.respond(invalid_request("The model id in the path is not valid percent-encoding", "model"));
    co_return;
  }
  if (*id != model->id) {
    co_await ex.respond(model_not_found(*id, model->id));
    co_return;
  }
  co_await ex.respond(json_response(http::status::ok, model_object(*model)));
}

// GCC 12 reports a mismatched operator delete inside the coroutine frames that Asio's awaitable
// operators create: Asio allocates and frees those frames with its own matching pair, which
// the warning's inlining-based analysis does not see through (a known false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

asio::awaitable<std::optional<openai_service::opened_request>> openai_service::open_request(exchange& ex,
                                                                                          const api_frontend& api) {
  std::optional<request_session> session = co_await authenticate(ex, api);
  if (!session) co_return std::nullopt;
  auto model = co_await loaded_model(ex, api);
  if (model == nullptr) co_return std::nullopt;
  if (auto refused = co_await session->admit(api.name)) {
    co_await ex.respond(api.error(quota_refusal_response(*refused)));
    co_return std::nullopt;
  }
  // From here on every answer carries the x-ratelimit-* headers.
  const auto answer = [&](response res) { return ex.respond(api.error(with_headers(std::move(res), *session))); };

  // The session: the header wins over the body's prompt_cache_key (a proxy or an SDK that sets
  // the header for a whole conversation knows better than one request's body).
  const auto session_header = ex.req().find(session_affinity_header);
  const bool has_session_header = session_header != ex.req().end();
  if (has_session_header && !is_valid_session_key(session_header->value())) {
    co_await answer(invalid_request(format("The {} header must be {}", session_affinity_header, session_key_rule),
                                    session_affinity_header));
    co_return std::nullopt;
  }
  auto parsed = api.parse(ex.req().body());
  if (auto* error = std::get_if<request_error>(&parsed)) {
    co_await answer(invalid_request(error->message, error->param));
    co_return std::nullopt;
  }
  openai_request& r = std::get<openai_request>(parsed);
  if (has_session_header) r.session = std::string(session_header->value());
  if (r.model && *r.model != model->id) {
    co_await answer(model_not_found(*r.model, model->id));
    co_return std::nullopt;
  }
  if (auto refused = co_await continue_conversation(*session, r)) {
    co_await answer(std::move(*refused));
    co_return std::nullopt;
  }
  auto tokens = prompt_tokens(r, *model);
  if (auto* refused = std::get_if<response>(&tokens)) {
    co_await answer(std::move(*refused));
    co_return std::nullopt;
  }
  auto& prompts = std::get<std::vector<std::vector<backend::token_id>>>(tokens);
  for (std::size_t p = 0; p < prompts.size(); ++p) {
    if (!prompts[p].empty()) continue;
    const std::string param = prompts.size() == 1 ? std::string(api.prompt_param) : format("{}[{}]", api.prompt_param, p);
    co_await answer(invalid_request("The prompt is empty: it encodes to no tokens", param));
    co_return std::nullopt;
  }
  co_return opened_request{.session = std::move(*session),
                           .model = std::move(model),
                           .r = std::move(r),
                           .prompts = std::move(prompts)};
}

asio::awaitable<std::optional<response>> openai_service::continue_conversation(const request_session& session,
                                                                              openai_request& r) {
  if (r.responses == nullptr || !r.responses->previous_response_id) co_return std::nullopt;
  const std::string& id = *r.responses->previous_response_id;
  const std::string tenant = session.tenant().id;
  tenant_store& store = tenants_.store();
  result<std::optional<stored_response>> found = std::optional<stored_response>();
  std::function<void()> call = [&] { found = store.get_response(tenant, id); };
  const bool ran = co_await tenants_.store_call(std::move(call));
  if (!ran) {
    co_return refusal_response({.kind = refusal_kind::overloaded,
                                .message = "The response store is busy: try again shortly"});
  }
  if (!found.ok()) {
    co_return error_response(http::status::internal_server_error,
                             format("The stored response could not be read: {}", found.error().message()),
                             "server_error", "previous_response_id", "store_error");
  }
  if (!found->has_value()) {
    co_return error_response(http::status::bad_request, format("Previous response with id '{}' not found.", id),
                             "invalid_request_error", "previous_response_id", "previous_response_not_found");
  }
  if ((*found)->bytes() > max_continued_conversation_bytes) {
    co_return invalid_request(format("The conversation of response '{}' holds {} bytes, more than the {} a request may "
                                     "continue: send the conversation as input",
                                     id, (*found)->bytes(), max_continued_conversation_bytes),
                              "previous_response_id", refusal_kind::context_length);
  }
  // What it stored was read from requests and answers this server checked: it reads back.
  boost::system::error_code failed;
  const boost::json::parse_options deep{.max_depth = max_json_depth + 1};
  boost::json::value conversation = boost::json::parse((*found)->conversation, failed, {}, deep);
  boost::json::value previous = boost::json::parse((*found)->response, failed, {}, deep);
  if (failed || !conversation.is_array() || !previous.is_object() || !previous.as_object().contains("output") ||
      !previous.at("output").is_array()) {
    co_return error_response(http::status::internal_server_error, "The stored response could not be read",
                             "server_error", "previous_response_id", "store_error");
  }
  boost::json::array history = std::move(conversation.as_array());
  for (boost::json::value& item : previous.at("output").as_array()) history.push_back(std::move(item));
  std::vector<backend::chat_message> earlier;
  if (auto error = read_response_items(history, "previous_response_id", earlier)) {
    co_return error_response(http::status::internal_server_error,
                             format("The stored response could not be read: {}", error->message), "server_error",
                             "previous_response_id", "store_error");
  }
  // After this request's instructions (the earlier ones are not carried), before its input.
  const std::size_t after = std::min<std::size_t>(r.responses->system_message ? 1 : 0, r.messages.size());
  r.messages.insert(r.messages.begin() + static_cast<std::ptrdiff_t>(after), std::make_move_iterator(earlier.begin()),
                    std::make_move_iterator(earlier.end()));
  auto fields = std::make_shared<responses_fields>(*r.responses);
  for (boost::json::value& item : fields->conversation) history.push_back(std::move(item));
  fields->conversation = std::move(history);
  r.responses = std::move(fields);
  co_return std::nullopt;
}

asio::awaitable<void> openai_service::keep(const request_session& session, const openai_request& r,
                                           const boost::json::object& kept) {
  stored_response stored{.id = std::string(kept.at("id").as_string()),
                         .response = boost::json::serialize(kept),
                         .conversation = boost::json::serialize(r.responses->conversation)};
  const std::int64_t ttl = options_.stored_response_ttl.count();
  const std::string tenant = session.tenant().id;
  tenant_store& store = tenants_.store();
  const std::int64_t bound = options_.stored_response_bytes;
  result<bool> put = false;
  std::function<void()> call = [&] { put = store.put_response(tenant, stored, ttl, bound); };
  const bool ran = co_await tenants_.store_call(std::move(call));
  if (!ran) {
    responses_log.warn("response {} of tenant {} not stored: the store is busy", stored.id, tenant);
    co_return;
  }
  if (!put.ok()) {
    responses_log.warn("response {} of tenant {} not stored: {}", stored.id, tenant, put.error().message());
  } else if (!*put) {
    responses_log.warn("response {} of tenant {} not stored: its {} bytes exceed the tenant's bound of {}", stored.id,
                       tenant, stored.bytes(), bound);
  }
}

// GET and DELETE /v1/responses/{id}: a stored response of the caller's tenant, read or removed
// (another tenant's is a 404). Each is a request of the tenant: its requests per minute and its
// concurrency limit count it, as they count a count of tokens.
asio::awaitable<void> openai_service::stored_response_route(exchange& ex, bool remove) {
  std::optional<request_session> session = co_await authenticate(ex, responses_api);
  if (!session) co_return;
  if (auto refused = co_await session->admit(responses_api.name)) {
    co_await ex.respond(quota_refusal_response(*refused));
    co_return;
  }
  const auto answer = [&](response res) { return ex.respond(with_headers(std::move(res), *session)); };
  const auto id = percent_decode(ex.path_param("id"));
  if (!id) {
    co_await answer(invalid_request("The response id in the path is not valid percent-encoding", "response_id"));
    co_return;
  }
  const std::string tenant = session->tenant().id;
  tenant_store& store = tenants_.store();
  // Whether there was such a response (read: its text in `body`), or the store's failure.
  result<bool> found = false;
  std::string body;
  std::function<void()> call = [&] {
    if (remove) {
      found = store.delete_response(tenant, *id);
      return;
    }
    auto read = store.get_response(tenant, *id);
    if (!read.ok()) {
      found = read.error();
    } else if (read->has_value()) {
      body = std::move((*read)->response);
      found = true;
    }
  };
  const bool ran = co_await tenants_.store_call(std::move(call));
  if (!ran) {
    co_await answer(refusal_response({.kind = refusal_kind::overloaded, .message = "The response store is busy"}));
    co_return;
  }
  if (!found.ok()) {
    co_await answer(error_response(http::status::internal_server_error,
                                   format("The response store failed: {}", found.error().message()), "server_error"));
    co_return;
  }
  if (!*found) {
    co_await answer(error_response(http::status::not_found, format("No response with id '{}' found.", *id),
                                   "invalid_request_error", "response_id", "not_found"));
    co_return;
  }
  session->set_outcome(request_outcome::completed);
  if (remove) {
    boost::json::object deleted;
    deleted["id"] = *id;
    deleted["object"] = "response.deleted";
    deleted["deleted"] = true;
    body = boost::json::serialize(deleted);
  }
  co_await answer(json_text_response(http::status::ok, std::move(body)));
}

// Anthropic's POST /v1/messages/count_tokens: the prompt /v1/messages would run, counted.
// Admitted like a request (it costs a render and a tokenization).
asio::awaitable<void> openai_service::count_tokens(exchange& ex) {
  std::optional<opened_request> opened = co_await open_request(ex, count_tokens_api);
  if (!opened) co_return;
  opened->session.set_outcome(request_outcome::completed);
  response counted = count_tokens_response(static_cast<std::int64_t>(opened->prompts.front().size()));
  co_await ex.respond(with_headers(std::move(counted), opened->session));
}

// vLLM's POST /tokenize: the token ids of the prompt the generating route would run
// (/v1/completions' prompt, /v1/chat/completions' messages rendered by the chat template).
// Admitted like a request; the key is required, as the answer shows how the model reads text.
asio::awaitable<void> openai_service::tokenize(exchange& ex) {
  std::optional<opened_request> opened = co_await open_request(ex, tokenize_api);
  if (!opened) co_return;
  // The body passed parse_tokenize_request, which read these fields first.
  const tokenize_fields fields = std::get<tokenize_fields>(read_tokenize_fields(ex.req().body()));
  if (opened->prompts.size() != 1) {
    response refused = with_headers(invalid_request("Tokenize one prompt at a time", "prompt"), opened->session);
    co_await ex.respond(std::move(refused));
    co_return;
  }
  const backend::tokenizer& tok = *opened->model->tokenizer;
  std::span<const backend::token_id> ids(opened->prompts.front());
  if (!fields.add_special_tokens && !ids.empty() && tok.bos_id() == ids.front()) ids = ids.subspan(1);
  boost::json::array tokens;
  boost::json::array texts;
  for (const backend::token_id id : ids) {
    tokens.push_back(id);
    if (fields.return_token_strs) texts.push_back(boost::json::string(tok.token_text(id)));
  }
  boost::json::object body;
  body["count"] = tokens.size();
  body["max_model_len"] = opened->model->context_length;
  body["tokens"] = std::move(tokens);
  if (fields.return_token_strs) {
    body["token_strs"] = std::move(texts);
  } else {
    body["token_strs"] = nullptr;
  }
  opened->session.set_outcome(request_outcome::completed);
  response answer = with_headers(json_response(http::status::ok, body), opened->session);
  co_await ex.respond(std::move(answer));
}

// vLLM's POST /detokenize: {"tokens": [ids]} -> {"prompt": text} (llama.cpp's clients read
// "content": the same text), special tokens written out. Admitted like a request.
asio::awaitable<void> openai_service::detokenize(exchange& ex) {
  std::optional<request_session> session = co_await authenticate(ex, completions_api);
  if (!session) co_return;
  auto model = co_await loaded_model(ex, completions_api);
  if (model == nullptr) co_return;
  if (auto refused = co_await session->admit("detokenize")) {
    co_await ex.respond(quota_refusal_response(*refused));
    co_return;
  }
  const auto answer = [&](response res) { return ex.respond(with_headers(std::move(res), *session)); };
  boost::system::error_code failed;
  const boost::json::value parsed = boost::json::parse(ex.req().body(), failed);
  const boost::json::object* fields = !failed && parsed.is_object() ? &parsed.as_object() : nullptr;
  if (fields == nullptr) {
    co_await answer(invalid_request("The body must be a JSON object such as {\"tokens\": [1, 2, 3]}", ""));
    co_return;
  }
  if (const boost::json::value* name = fields->if_contains("model"); name != nullptr && !name->is_null()) {
    if (!name->is_string() || name->as_string() != model->id) {
      const std::string requested = name->is_string() ? std::string(name->as_string()) : boost::json::serialize(*name);
      co_await answer(model_not_found(requested, model->id));
      co_return;
    }
  }
  const boost::json::value* list = fields->if_contains("tokens");
  if (list == nullptr || !list->is_array()) {
    co_await answer(invalid_request("'tokens' must be an array of token ids", "tokens"));
    co_return;
  }
  std::vector<std::int64_t> ids;
  ids.reserve(list->as_array().size());
  for (const boost::json::value& item : list->as_array()) {
    if (!item.is_int64() && !item.is_uint64()) {
      co_await answer(invalid_request("'tokens' must be an array of token ids (integers)", "tokens"));
      co_return;
    }
    ids.push_back(item.is_int64() ? item.as_int64() : static_cast<std::int64_t>(std::min<std::uint64_t>(
                                                          item.as_uint64(), std::numeric_limits<std::int64_t>::max())));
  }
  const backend::tokenizer& tok = *model->tokenizer;
  if (auto outside = backend::find_token_outside_vocabulary(std::span<const std::int64_t>(ids), tok.vocab_size(), "tokens")) {
    co_await answer(invalid_request(outside->message, outside->param));
    co_return;
  }
  const std::vector<backend::token_id> tokens(ids.begin(), ids.end());
  const std::string text = tok.decode(tokens, /*with_special=*/true);
  session->set_outcome(request_outcome::completed);
  boost::json::object body;
  body["prompt"] = text;
  body["content"] = text;
  co_await answer(json_response(http::status::ok, body));
}

asio::awaitable<void> openai_service::generate(exchange& ex, const api_frontend& api) {
  std::optional<opened_request> opened = co_await open_request(ex, api);
  if (!opened) co_return;
  request_session* session = &opened->session;
  const std::shared_ptr<const serving_model>& model = opened->model;
  const openai_request& r = opened->r;
  std::vector<std::vector<backend::token_id>>& prompts = opened->prompts;
  const auto answer = [&](response res) { return ex.respond(api.error(with_headers(std::move(res), *session))); };

  // A batch's prompts each get r.n choices and must each fit the context: the longest decides.
  std::int64_t longest = 0;
  std::int64_t prompt_length = 0;  // every prompt's tokens
  for (const auto& prompt : prompts) {
    longest = std::max(longest, static_cast<std::int64_t>(prompt.size()));
    prompt_length += static_cast<std::int64_t>(prompt.size());
  }
  const auto choices = static_cast<std::int32_t>(prompts.size()) * r.n;
  auto limit = resolve_max_tokens(r, api.prompt_param, longest, model->context_length, choices, *session);
  if (auto* refused = std::get_if<response>(&limit)) {
    co_await answer(std::move(*refused));
    co_return;
  }
  const std::int64_t max_tokens = std::get<std::int64_t>(limit);
  if (auto refused = too_many_logprobs(r, max_tokens, longest, choices)) {
    co_await answer(std::move(*refused));
    co_return;
  }
  if (auto outside = backend::find_logit_bias_error(r.sampling.logit_bias, model->tokenizer->vocab_size())) {
    co_await answer(invalid_request(outside->message, outside->param));
    co_return;
  }
  // What the output must match: the response format's value, or the tool calls tool_choice asks for.
  auto forced = required_tool_calls(*model, r, prompts.front());
  if (auto* refused = std::get_if<response>(&forced)) {
    co_await answer(std::move(*refused));
    co_return;
  }
  std::shared_ptr<const backend::grammar::grammar> constraint =
      std::get<std::shared_ptr<const backend::grammar::grammar>>(std::move(forced));
  const std::string_view constraint_param =
      constraint != nullptr ? "tools" : (r.grammar_param.empty() ? api.format_param : std::string_view(r.grammar_param));
  if (constraint == nullptr) constraint = r.grammar;
  if (auto refused = co_await session->reserve(prompt_length, max_tokens, choices, model->id)) {
    response res = quota_refusal_response(*refused);
    session->add_headers(res);  // phase 1's requests figures too
    co_await ex.respond(api.error(std::move(res)));
    co_return;
  }

  relay_context context{.r = r,
                        .api = api,
                        .tok = *model->tokenizer,
                        .prompts = r.logprobs ? prompts : std::vector<std::vector<backend::token_id>>{},
                        .echoed = echoed_prompts(r, *model->tokenizer),
                        .choices = choices,
                        .parsing = std::nullopt,
                        .writer = nullptr};
  // Special tokens' text reaches the parsers when their markers are special tokens.
  bool special_tokens = false;
  if (r.api == openai_api::chat_completions) {
    context.parsing = parsing_options(*model, r, prompts.front());
    const std::string id_prefix(api.tool_call_id_prefix);
    context.parsing->make_id = [id_prefix] { return random_id(id_prefix); };
    special_tokens = needs_special_tokens(model->output, *context.parsing);
  }

  backend::generate_request request;
  if (constraint != nullptr && model->grammars != nullptr) {
    // Compiled off this thread in the tenant's turn (or found in its cache); a client that leaves
    // first costs no compile. A remote engine compiles it itself.
    auto compiled = co_await model->grammars->compile_unless(session->tenant().id, constraint, ex.watch_disconnect());
    if (!compiled) co_return;  // the client is gone
    if (!compiled->ok()) {
      session->set_outcome(request_outcome::failed);
      response refused = refusal_response(refusal_of(compiled->error(), constraint_param));
      co_await answer(std::move(refused));
      co_return;
    }
    request.grammar = std::move(*compiled).value();
  }
  request.id = ex.request_id();
  set_tenant_fields(request, session->tenant());
  request.sampling = r.sampling;
  request.max_tokens = max_tokens;
  request.stop = r.stop;
  request.ignore_eos = r.ignore_eos;
  request.logprobs = r.logprobs;
  request.n = r.n;
  // With echo, the prompt's own log probabilities come in front of the completion's.
  if (r.echo) request.prompt_logprobs = r.logprobs;
  request.skip_special_tokens = !special_tokens;
  request.session = r.session;

  // One engine request per prompt: a batch's are submitted together (the engine batches them),
  // their events joined into the one answer's.
  const asio::any_io_executor strand = co_await asio::this_coro::executor;
  auto events = std::make_shared<event_relay>(strand);
  backend::event_sink joined = session->metered(relay_sink(events, strand));
  std::vector<backend::event_sink> sinks;
  if (prompts.size() == 1) {
    sinks.push_back(std::move(joined));
  } else {
    sinks = batch_sinks(prompts.size(), r.n, std::move(joined));
  }
  ex.access().prompt_tokens = prompt_length;
  ex.access().completion_tokens = 0;
  // Destroying the handles (leaving this coroutine in any way) cancels the requests.
  std::vector<backend::request_handle> handles;
  handles.reserve(prompts.size());
  for (std::size_t p = 0; p < prompts.size(); ++p) {
    backend::generate_request one = p + 1 == prompts.size() ? std::move(request) : request;
    if (prompts.size() > 1) one.id = format("{}-{}", ex.request_id(), p);
    one.prompt = std::move(prompts[p]);
    auto submitted = co_await model->engine->submit(std::move(one), std::move(sinks[p]), constraint);
    if (!submitted.ok()) {
      session->set_outcome(request_outcome::failed);
      response refused = submit_failure(submitted.error(), api, r.api, constraint_param);
      co_await answer(std::move(refused));
      co_return;
    }
    handles.push_back(std::move(submitted).value());
  }

  const backend::token_usage opening{.prompt_tokens = prompt_length, .completion_tokens = 0, .cached_tokens = 0};
  context.writer = api.writer(r, ex.request_id(), model->id, context.echoed, opening);
  co_await relay(ex, *events, context, *session);
  if (unstreamed_logprobs(r, max_tokens, longest, choices) > large_unstreamed_logprobs) release_free_memory();
  const usage_counts used = session->usage().counts();
  ex.access().completion_tokens = used.completion_tokens;
  ex.access().cached_tokens = used.cached_tokens;
}

// Answers from the engine's events until the request finishes or the client leaves.
asio::awaitable<void> openai_service::relay(exchange& ex, event_relay& events, relay_context& context,
                                            request_session& session) {
  const openai_request& r = context.r;
  answer_writer& writer = *context.writer;
  std::vector<choice_state> choices(static_cast<std::size_t>(context.choices));
  for (std::size_t i = 0; i < choices.size(); ++i) {
    choice_state& c = choices[i];
    if (r.logprobs) c.logprobs.emplace(r.api, context.tok, context.prompts[i / static_cast<std::size_t>(r.n)]);
    if (context.parsing) c.parser.emplace(*context.parsing);
  }

  std::optional<sse_writer> sse;
  answer_output out(writer, sse);
  if (r.stream) {
    sse.emplace(ex, metrics_ != nullptr ? &metrics_->active_streams : nullptr);
    http::response_header<> head;
    session.add_headers(head);
    if (!co_await sse->open(std::move(head))) co_return;
    writer.open(out.pending());
    if (!co_await out.send()) co_return;
  }

  for (;;) {
    while (!events.events.empty()) {
      backend::engine_event event = std::move(events.events.front());
      events.events.pop_front();
      if (auto* prompt = std::get_if<backend::prompt_logprobs_event>(&event)) {
        // Completions with echo and logprobs: the prompt's tokens open each of its choices.
        if (prompt->first_index < 0 || prompt->first_index + r.n > context.choices) continue;
        const auto which = static_cast<std::size_t>(prompt->first_index / r.n);
        for (std::int32_t i = prompt->first_index; i < prompt->first_index + r.n; ++i) {
          choice_state& c = choices[static_cast<std::size_t>(i)];
          if (!c.logprobs) continue;
          c.logprobs->add_prompt(context.prompts[which], prompt->logprobs, context.echoed[which]);
          writer.echo(i, out.fresh_logprobs(c), out.pending());
        }
        if (!co_await out.send()) co_return;
        continue;
      }
      if (auto* delta = std::get_if<backend::delta_event>(&event)) {
        if (!delta->tokens.empty() && !ex.access().ttft_seconds) {
          ex.access().ttft_seconds = std::chrono::duration<double>(clock::now() - ex.received()).count();
        }
        // The engine numbers choices from 0 to n - 1 (a backend's stream is checked for it), a
        // batch's from 0 to its choices - 1.
        if (delta->index < 0 || delta->index >= context.choices) continue;
        choice_state& c = choices[static_cast<std::size_t>(delta->index)];
        if (c.logprobs) c.logprobs->add(*delta);
        if (delta->finish) c.reason = *delta->finish;
        if (c.parser) {
          // Also a delta without text: its tokens count toward reasoning_tokens.
          std::vector<output_event> parsed =
              c.parser->feed(delta->text, static_cast<std::int64_t>(delta->tokens.size()));
          if (!co_await deliver(out, delta->index, c, std::move(parsed))) co_return;
          if (!delta->finish) continue;
          // The choice's output has ended: what the parser held back.
          std::vector<output_event> rest = c.parser->finish(cut_short(*delta->finish));
          if (!co_await deliver(out, delta->index, c, std::move(rest))) co_return;
        } else if (!delta->text.empty()) {
          writer.text(delta->index, delta->text, out.fresh_logprobs(c), out.pending());
        }
        // With what is left of its log probabilities: tokens whose text was held back.
        if (delta->finish) {
          writer.choice_end(delta->index, *delta->finish, delta->stop_string, out.fresh_logprobs(c), out.pending());
        }
        if (!co_await out.send()) co_return;
        continue;
      }
      const auto* finished = std::get_if<backend::finished_event>(&event);
      if (finished == nullptr) continue;  // admitted

      if (finished->reason == backend::finish_reason::abort || finished->reason == backend::finish_reason::error) {
        // (A named local, not a temporary in the co_await: GCC 12 mishandles such temporaries.)
        const refusal failure =
            finished->reason == backend::finish_reason::abort
                ? refusal{.kind = refusal_kind::shutting_down,
                          .message = "The request was aborted: the server is shutting down"}
                : refusal{.kind = refusal_kind::engine_failed, .message = format("The engine failed: {}", finished->error)};
        co_await end_failed(ex, out, context.api, session, failure);
        co_return;
      }
      session.set_outcome(request_outcome::completed);
      // The usage as the session charges it (the engine's figures, within what the gateway knows).
      const usage_counts charged = session.usage().counts();
      const backend::token_usage used{charged.prompt_tokens, charged.completion_tokens, charged.cached_tokens};
      // Every choice ends with its own delta; one that did not (a backend that left it out)
      // ends with the request, after what its parser held back.
      for (std::int32_t i = 0; i < context.choices; ++i) {
        choice_state& c = choices[static_cast<std::size_t>(i)];
        if (c.reason) continue;
        if (c.parser) {
          std::vector<output_event> rest = c.parser->finish(cut_short(finished->reason));
          if (!co_await deliver(out, i, c, std::move(rest))) co_return;
        }
        writer.choice_end(i, finished->reason, {}, out.fresh_logprobs(c), out.pending());
        if (!co_await out.send()) co_return;
      }
      // Where the model's reasoning is parsed, the tokens it took in every choice.
      std::optional<std::int64_t> reasoning_tokens;
      for (const choice_state& c : choices) {
        if (!c.parser || !c.parser->reasoning_on()) continue;
        reasoning_tokens = reasoning_tokens.value_or(0) + c.parser->reasoning_tokens();
      }
      if (!out.streams()) {
        std::vector<std::string> logprobs;
        logprobs.reserve(choices.size());
        for (const choice_state& c : choices) logprobs.push_back(c.logprobs ? c.logprobs->all() : std::string("null"));
        std::string body = writer.whole(std::move(logprobs), used, reasoning_tokens);
        const std::optional<boost::json::object> kept = writer.kept();
        if (kept) co_await keep(session, r, *kept);
        co_await ex.respond(with_headers(json_text_response(http::status::ok, std::move(body)), session));
        co_return;
      }
      writer.end(used, reasoning_tokens, out.pending());
      const std::optional<boost::json::object> kept = writer.kept();
      if (kept) co_await keep(session, r, *kept);
      co_await out.close();
      co_return;
    }

    if (ex.was_cut()) {
      const refusal failure{.kind = refusal_kind::shutting_down,
                            .message = "The server is shutting down: the request was cut short at its shutdown deadline"};
      co_await end_failed(ex, out, context.api, session, failure);
      co_return;
    }

    // Sleep until an event arrives, the heartbeat is due, or the client leaves.
    const clock::time_point heartbeat_due = sse ? sse->last_write() + options_.sse_heartbeat : clock::time_point::max();
    events.wake.expires_at(heartbeat_due);
    const auto woken = co_await (events.wake.async_wait(asio::as_tuple(asio::use_awaitable)) || ex.watch_disconnect());
    if (woken.index() == 1 && !ex.was_cut()) co_return;  // the client is gone: the handle cancels the request
    if (sse && events.events.empty() && clock::now() >= sse->last_write() + options_.sse_heartbeat) {
      // The API's own heartbeat event where it has one (Anthropic's ping), else a comment.
      std::optional<named_event> beat = writer.heartbeat();
      bool alive = false;
      if (beat) {
        alive = co_await sse->event(*beat);
      } else {
        alive = co_await sse->ping();
      }
      if (!alive) co_return;
    }
  }
}

#pragma GCC diagnostic pop

}  // namespace

void add_openai_routes(router& routes, const model_slot& models, tenancy& tenants,
                       monitoring::gateway_metrics* metrics, openai_route_options options) {
  auto service = std::make_shared<openai_service>(models, tenants, metrics, options);
  routes.add(http::verb::post, "/v1/chat/completions", [service](exchange& ex) -> asio::awaitable<void> {
    co_await service->generate(ex, chat_completions_api);
  });
  routes.add(http::verb::post, "/v1/completions", [service](exchange& ex) -> asio::awaitable<void> {
    co_await service->generate(ex, completions_api);
  });
  routes.add(
      http::verb::post, "/v1/messages",
      [service](exchange& ex) -> asio::awaitable<void> { co_await service->generate(ex, messages_api); },
      messages_api.error);
  routes.add(http::verb::post, "/v1/responses", [service](exchange& ex) -> asio::awaitable<void> {
    co_await service->generate(ex, responses_api);
  });
  routes.add(http::verb::get, "/v1/responses/{id}", [service](exchange& ex) -> asio::awaitable<void> {
    co_await service->stored_response_route(ex, /*remove=*/false);
  });
  routes.add(http::verb::delete_, "/v1/responses/{id}", [service](exchange& ex) -> asio::awaitable<void> {
    co_await service->stored_response_route(ex, /*remove=*/true);
  });
  routes.add(
      http::verb::post, "/v1/messages/count_tokens",
      [service](exchange& ex) -> asio::awaitable<void> { co_await service->count_tokens(ex); }, count_tokens_api.error);
  routes.add(http::verb::post, "/tokenize", [service](exchange& ex) -> asio::awaitable<void> {
    co_await service->tokenize(ex);
  });
  routes.add(http::verb::post, "/detokenize", [service](exchange& ex) -> asio::awaitable<void> {
    co_await service->detokenize(ex);
  });
  routes.add(http::verb::get, "/v1/models", [service](exchange& ex) -> asio::awaitable<void> {
    co_await service->list_models(ex);
  });
  routes.add(http::verb::get, "/v1/models/{id}", [service](exchange& ex) -> asio::awaitable<void> {
    co_await service->get_model(ex);
  });
}

}  // namespace edge::gateway
