#include "edge/gateway/openai/openai_routes.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>

#include "edge/common/format.h"
#include "edge/common/memory.h"
#include "edge/gateway/http/event_relay.h"
#include "edge/gateway/http/json_response.h"
#include "edge/gateway/tenancy/quota_response.h"
#include "edge/gateway/openai/anthropic_request.h"
#include "edge/gateway/openai/anthropic_response.h"
#include "edge/gateway/openai/grammar_compiler.h"
#include "edge/gateway/openai/logprobs.h"
#include "edge/gateway/openai/openai_request.h"
#include "edge/gateway/openai/openai_response.h"
#include "edge/gateway/openai/output_parser.h"
#include "edge/gateway/openai/refusals.h"
#include "edge/gateway/http/percent_encoding.h"
#include "edge/gateway/http/sse_writer.h"
#include "edge/monitoring/gateway_metrics.h"

namespace edge::gateway {
namespace {

using namespace boost::asio::experimental::awaitable_operators;
using clock = std::chrono::steady_clock;

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

// Ends a request that failed: its error response, or for a stream begun already its error
// event and [DONE], with the stream recorded under the error's status.
asio::awaitable<void> end_failed(exchange& ex, std::optional<sse_writer>& sse, request_session& session,
                                 const refusal& failure) {
  session.set_outcome(request_outcome::failed);
  if (!sse) {
    co_await ex.respond(with_headers(refusal_response(failure), session));
    co_return;
  }
  ex.record_stream_failure(refusal_info(failure.kind).status);
  const boost::json::value body = refusal_body(failure);
  if (!co_await sse->event(body)) co_return;
  co_await sse->done();
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

// The request parameter behind a field of the engine's request (engine::submit's submit_error).
std::string_view api_param(std::string_view field, openai_api api, std::string_view constraint_param) {
  const bool chat = api == openai_api::chat_completions;
  if (field == "grammar") return constraint_param;
  if (field == "logprobs") return chat ? "top_logprobs" : "logprobs";
  if (field == "prompt_logprobs") return "echo";
  if (field == "n" || field == "logit_bias") return field;
  return chat ? "messages" : "prompt";
}

// What the engine refusing a request (engine_client::submit) means to the client: the refusal
// table's answer, naming the API's parameter.
response submit_failure(const backend::submit_error& failure, openai_api api, std::string_view constraint_param) {
  refusal r = refusal_of(failure);
  if (r.kind == refusal_kind::invalid_request || r.kind == refusal_kind::context_length) {
    r.param = api_param(failure.field(), api, constraint_param);
  }
  if (r.kind == refusal_kind::context_length) r.message = format("The request does not fit: {}", r.message);
  return refusal_response(r);
}

// ---- the prompt -------------------------------------------------------------------------------

// The prompt's token ids, or the 400 to answer. Runs on the connection's thread: the engine
// thread never tokenizes.
std::variant<std::vector<backend::token_id>, response> prompt_tokens(const openai_request& r, const serving_model& model) {
  const backend::tokenizer& tok = *model.tokenizer;
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
    const bool guarded = !model.parse_client_special_tokens;
    return tok.encode(text->text, {.add_bos = !bos_in_text,
                                   .parse_special = true,
                                   .client_text_guard = guarded ? &model.markup_tokens : nullptr,
                                   .markup = &text->markup});
  }
  if (const auto* text = std::get_if<std::string>(&r.prompt)) {
    // Prompt text is the client's: "<|im_start|>" in it stays text, and so does an added token
    // that is the model's markup ("<tool_call>").
    const bool guarded = !model.parse_client_special_tokens;
    return tok.encode(*text, {.add_bos = true,
                              .parse_special = false,
                              .client_text_guard = guarded ? &model.markup_tokens : nullptr});
  }
  const auto& ids = std::get<std::vector<std::int64_t>>(r.prompt);
  if (auto outside = backend::find_token_outside_vocabulary(std::span(ids), tok.vocab_size(), "prompt")) {
    return invalid_request(outside->message, outside->param);
  }
  return std::vector<backend::token_id>(ids.begin(), ids.end());
}

// The completion's token limit after defaults, or the 400 when prompt and completion cannot
// fit in the context (OpenAI's and vLLM's rule: prompt + max_tokens <= context).
std::variant<std::int64_t, response> resolve_max_tokens(const openai_request& r, std::int64_t prompt_length,
                                                        std::int64_t context, const request_session& session) {
  const bool chat = r.api == openai_api::chat_completions;
  const std::string_view what = chat ? "messages" : "prompt";
  if (auto e = backend::prompt_does_not_fit(prompt_length, context, what)) {
    return invalid_request(e->message, e->param, refusal_kind::context_length);
  }
  const std::int64_t room = context - prompt_length;
  if (!r.max_tokens) {
    return session.default_max_tokens(prompt_length, chat ? room : std::min(default_completion_max_tokens, room), r.n);
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
// stream, or without logprobs). Each factor is bounded (n by 128, tokens by the context,
// alternatives by 20): no overflow.
std::int64_t unstreamed_logprobs(const openai_request& r, std::int64_t max_tokens, std::int64_t prompt_length) {
  if (r.stream || !r.logprobs) return 0;
  const std::int64_t tokens = max_tokens + (r.echo ? prompt_length : 0);
  return std::int64_t{r.n} * tokens * (1 + *r.logprobs);
}

// The 400 for a request whose answer, not streamed, would hold more log probabilities than that.
std::optional<response> too_many_logprobs(const openai_request& r, std::int64_t max_tokens, std::int64_t prompt_length) {
  const std::int64_t entries = unstreamed_logprobs(r, max_tokens, prompt_length);
  if (entries <= max_unstreamed_logprobs) return std::nullopt;
  const std::int64_t tokens = max_tokens + (r.echo ? prompt_length : 0);
  return invalid_request(format("An answer that is not streamed holds at most {} log probabilities, and this one could "
                                "hold {} (n {} x {} tokens x {} each, the token and its alternatives): lower n, "
                                "max_tokens or the alternatives, or stream the answer",
                                max_unstreamed_logprobs, entries, r.n, tokens, 1 + *r.logprobs),
                         r.n > 1 ? "n" : "max_tokens");
}

// What a completions answer with echo shows in front of each choice's text: the prompt as the
// client wrote it, or as its token ids decode.
std::string echoed_prompt(const openai_request& r, const backend::tokenizer& tok) {
  if (!r.echo) return {};
  if (const auto* text = std::get_if<std::string>(&r.prompt)) return *text;
  const auto& ids = std::get<std::vector<std::int64_t>>(r.prompt);
  return tok.decode(std::vector<backend::token_id>(ids.begin(), ids.end()));
}

// ---- the answer's syntax ----------------------------------------------------------------------

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

// What the relay of one request needs beyond the request itself.
struct relay_context {
  const openai_request& r;
  response_meta meta;
  const backend::tokenizer& tok;
  std::vector<backend::token_id> prompt;  // kept when log probabilities are asked for
  std::string echoed;                     // completions with echo
  // Chat: how each choice's output is parsed into content, reasoning and tool calls
  // (output_parser.h); every choice has its own parser.
  std::optional<output_parser_options> parsing;
};

// One choice of an answer as it grows. Connection strand only.
struct choice_state {
  std::string text;                      // completions, not streaming: the choice's text
  std::optional<output_parser> parser;   // chat: what reads the choice's output
  assistant_message message;             // chat, not streaming: what the parser made of it
  bool made_tool_calls = false;          // chat: some tool call has begun
  std::optional<choice_logprobs> logprobs;
  std::optional<backend::finish_reason> reason;  // once the choice's last delta came

  // A chunk's logprobs: null unless asked for and some token is waiting for a chunk.
  boost::json::value fresh_logprobs() { return logprobs ? logprobs->take() : boost::json::value(nullptr); }
};

// Sends a chat choice's parsed events as chunks (streaming) or adds them to its message. The
// first chunk carries the log probabilities of every token not yet sent: a token whose text the
// parser held back (a possible marker) goes with the next chunk the choice sends. False once the
// client is gone.
asio::awaitable<bool> deliver(std::optional<sse_writer>& sse, const chunk_builder& chunks, std::int32_t index,
                              choice_state& c, std::vector<output_event> parsed) {
  for (const output_event& event : parsed) {
    c.made_tool_calls |= std::holds_alternative<tool_call_begin>(event);
    if (!sse) {
      c.message.add(event);
      continue;
    }
    const boost::json::value chunk = chunks.event(event, index, c.fresh_logprobs());
    if (!co_await sse->event(chunk)) co_return false;
  }
  co_return true;
}

// ---- the handlers -----------------------------------------------------------------------------

class openai_service {
 public:
  openai_service(const model_slot& models, tenancy& tenants, monitoring::gateway_metrics* metrics,
                 openai_route_options options)
      : models_(models), tenants_(tenants), metrics_(metrics), options_(options) {}

  asio::awaitable<void> list_models(exchange& ex);
  asio::awaitable<void> get_model(exchange& ex);
  asio::awaitable<void> generate(exchange& ex, openai_api api);
  asio::awaitable<void> count_tokens(exchange& ex);

 private:
  // The caller's session, or nothing when a refusal was answered.
  asio::awaitable<std::optional<request_session>> authenticate(exchange& ex);
  // The loaded model, or nothing when a 503 was answered.
  asio::awaitable<std::shared_ptr<const serving_model>> loaded_model(exchange& ex);
  asio::awaitable<void> relay(exchange& ex, event_relay& events, const relay_context& context,
                              request_session& session);

  const model_slot& models_;
  tenancy& tenants_;
  monitoring::gateway_metrics* metrics_;
  openai_route_options options_;
};

asio::awaitable<std::optional<request_session>> openai_service::authenticate(exchange& ex) {
  auto session = tenants_.authenticate(ex.req());
  if (!session.ok()) {
    co_await ex.respond(unauthorized_response(session.error()));
    co_return std::nullopt;
  }
  ex.access().tenant = session->tenant().id;
  co_return std::move(session).value();
}

asio::awaitable<std::shared_ptr<const serving_model>> openai_service::loaded_model(exchange& ex) {
  std::shared_ptr<const serving_model> model = models_.get();
  if (model == nullptr) {
    co_await ex.respond(refusal_response({.kind = refusal_kind::model_not_ready, .message = "The model is still loading"}));
  }
  co_return model;
}

asio::awaitable<void> openai_service::list_models(exchange& ex) {
  if (!co_await authenticate(ex)) co_return;
  const auto model = co_await loaded_model(ex);
  if (model == nullptr) co_return;
  co_await ex.respond(json_response(http::status::ok, model_list(*model)));
}

asio::awaitable<void> openai_service::get_model(exchange& ex) {
  if (!co_await authenticate(ex)) co_return;
  const auto model = co_await loaded_model(ex);
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

// Anthropic's POST /v1/messages/count_tokens: the prompt /v1/messages would run, counted.
// Admitted like a request (it costs a render and a tokenization); every error in Anthropic's
// shape.
asio::awaitable<void> openai_service::count_tokens(exchange& ex) {
  auto who = tenants_.authenticate(ex.req());
  if (!who.ok()) {
    co_await ex.respond(anthropic_error(unauthorized_response(who.error())));
    co_return;
  }
  request_session session = std::move(who).value();
  ex.access().tenant = session.tenant().id;
  const std::shared_ptr<const serving_model> model = models_.get();
  if (model == nullptr) {
    response loading = refusal_response({.kind = refusal_kind::model_not_ready, .message = "The model is still loading"});
    co_await ex.respond(anthropic_error(std::move(loading)));
    co_return;
  }
  if (auto refused = co_await session.admit()) {
    co_await ex.respond(anthropic_error(quota_refusal_response(*refused)));
    co_return;
  }
  const auto answer = [&](response res) { return ex.respond(with_headers(std::move(res), session)); };
  auto parsed = parse_anthropic_request(anthropic_route::count_tokens, ex.req().body());
  if (auto* error = std::get_if<request_error>(&parsed)) {
    co_await answer(anthropic_error(invalid_request(error->message, error->param)));
    co_return;
  }
  const openai_request& r = std::get<openai_request>(parsed);
  if (r.model && *r.model != model->id) {
    co_await answer(anthropic_error(model_not_found(*r.model, model->id)));
    co_return;
  }
  auto tokens = prompt_tokens(r, *model);
  if (auto* refused = std::get_if<response>(&tokens)) {
    co_await answer(anthropic_error(std::move(*refused)));
    co_return;
  }
  session.set_outcome(request_outcome::completed);
  const auto counted = static_cast<std::int64_t>(std::get<std::vector<backend::token_id>>(tokens).size());
  co_await answer(count_tokens_response(counted));
}

asio::awaitable<void> openai_service::generate(exchange& ex, openai_api api) {
  std::optional<request_session> session = co_await authenticate(ex);
  if (!session) co_return;
  const auto model = co_await loaded_model(ex);
  if (model == nullptr) co_return;
  if (auto refused = co_await session->admit()) {
    co_await ex.respond(quota_refusal_response(*refused));
    co_return;
  }
  // From here on every answer carries the x-ratelimit-* headers.
  const auto answer = [&](response res) { return ex.respond(with_headers(std::move(res), *session)); };

  auto parsed = parse_openai_request(api, ex.req().body());
  if (auto* error = std::get_if<request_error>(&parsed)) {
    co_await answer(invalid_request(error->message, error->param));
    co_return;
  }
  const openai_request& r = std::get<openai_request>(parsed);
  if (r.model && *r.model != model->id) {
    co_await answer(model_not_found(*r.model, model->id));
    co_return;
  }

  auto tokens = prompt_tokens(r, *model);
  if (auto* refused = std::get_if<response>(&tokens)) {
    co_await answer(std::move(*refused));
    co_return;
  }
  std::vector<backend::token_id>& prompt = std::get<std::vector<backend::token_id>>(tokens);
  const auto prompt_length = static_cast<std::int64_t>(prompt.size());
  const std::string_view prompt_param = api == openai_api::chat_completions ? "messages" : "prompt";
  if (prompt_length == 0) {
    co_await answer(invalid_request("The prompt is empty: it encodes to no tokens", prompt_param));
    co_return;
  }
  auto limit = resolve_max_tokens(r, prompt_length, model->context_length, *session);
  if (auto* refused = std::get_if<response>(&limit)) {
    co_await answer(std::move(*refused));
    co_return;
  }
  const std::int64_t max_tokens = std::get<std::int64_t>(limit);
  if (auto refused = too_many_logprobs(r, max_tokens, prompt_length)) {
    co_await answer(std::move(*refused));
    co_return;
  }
  if (auto outside = backend::find_logit_bias_error(r.sampling.logit_bias, model->tokenizer->vocab_size())) {
    co_await answer(invalid_request(outside->message, outside->param));
    co_return;
  }
  // What the output must match: the response format's value, or the tool calls tool_choice asks for.
  auto forced = required_tool_calls(*model, r, prompt);
  if (auto* refused = std::get_if<response>(&forced)) {
    co_await answer(std::move(*refused));
    co_return;
  }
  std::shared_ptr<const backend::grammar::grammar> constraint =
      std::get<std::shared_ptr<const backend::grammar::grammar>>(std::move(forced));
  const std::string_view constraint_param = constraint != nullptr ? "tools" : "response_format";
  if (constraint == nullptr) constraint = r.grammar;
  if (auto refused = co_await session->reserve(prompt_length, max_tokens, r.n)) {
    response res = quota_refusal_response(*refused);
    session->add_headers(res);  // phase 1's requests figures too
    co_await ex.respond(std::move(res));
    co_return;
  }

  relay_context context{.r = r,
                        .meta = {api, response_id(api, ex.request_id()), unix_seconds(), model->id},
                        .tok = *model->tokenizer,
                        .prompt = r.logprobs ? prompt : std::vector<backend::token_id>{},
                        .echoed = echoed_prompt(r, *model->tokenizer),
                        .parsing = std::nullopt};
  // Special tokens' text reaches the parsers when their markers are special tokens.
  bool special_tokens = false;
  if (api == openai_api::chat_completions) {
    context.parsing = parsing_options(*model, r, prompt);
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
  request.tenant = session->tenant().id;
  request.weight = session->tenant().weight;
  request.prompt = std::move(prompt);
  request.sampling = r.sampling;
  request.max_tokens = max_tokens;
  request.stop = r.stop;
  request.ignore_eos = r.ignore_eos;
  request.logprobs = r.logprobs;
  request.n = r.n;
  // With echo, the prompt's own log probabilities come in front of the completion's.
  if (r.echo) request.prompt_logprobs = r.logprobs;
  request.skip_special_tokens = !special_tokens;

  const asio::any_io_executor strand = co_await asio::this_coro::executor;
  auto events = std::make_shared<event_relay>(strand);
  auto submitted =
      co_await model->engine->submit(std::move(request), session->metered(relay_sink(events, strand)), constraint);
  ex.access().prompt_tokens = prompt_length;
  ex.access().completion_tokens = 0;
  if (!submitted.ok()) {
    session->set_outcome(request_outcome::failed);
    response refused = submit_failure(submitted.error(), api, constraint_param);
    co_await answer(std::move(refused));
    co_return;
  }
  // Destroying the handle (leaving this coroutine in any way) cancels the request.
  const backend::request_handle handle = std::move(submitted).value();

  co_await relay(ex, *events, context, *session);
  if (unstreamed_logprobs(r, max_tokens, prompt_length) > large_unstreamed_logprobs) release_free_memory();
  const usage_counts used = session->usage().counts();
  ex.access().completion_tokens = used.completion_tokens;
  ex.access().cached_tokens = used.cached_tokens;
}

// Answers from the engine's events until the request finishes or the client leaves.
asio::awaitable<void> openai_service::relay(exchange& ex, event_relay& events, const relay_context& context,
                                            request_session& session) {
  const openai_request& r = context.r;
  const response_meta& meta = context.meta;
  const chunk_builder chunks(meta, r.include_usage);
  std::vector<choice_state> choices(static_cast<std::size_t>(r.n));
  for (choice_state& c : choices) {
    if (r.logprobs) c.logprobs.emplace(meta.api, context.tok, context.prompt);
    if (r.echo) c.text = context.echoed;
    if (context.parsing) c.parser.emplace(*context.parsing);
  }

  std::optional<sse_writer> sse;
  if (r.stream) {
    sse.emplace(ex, metrics_ != nullptr ? &metrics_->active_streams : nullptr);
    http::response_header<> head;
    session.add_headers(head);
    if (!co_await sse->open(std::move(head))) co_return;
    for (std::int32_t i = 0; i < r.n; ++i) {
      // (No co_await inside && or ||: GCC 12 mishandles the temporaries of such operands.)
      if (meta.api == openai_api::chat_completions) {
        const boost::json::value role = chunks.role(i);
        if (!co_await sse->event(role)) co_return;
      } else if (r.echo && !r.logprobs && !context.echoed.empty()) {
        const boost::json::value echoed = chunks.content(context.echoed, i);
        if (!co_await sse->event(echoed)) co_return;
      }
    }
  }

  for (;;) {
    while (!events.events.empty()) {
      backend::engine_event event = std::move(events.events.front());
      events.events.pop_front();
      if (auto* prompt = std::get_if<backend::prompt_logprobs_event>(&event)) {
        // Completions with echo and logprobs: the prompt's tokens open every choice.
        for (std::int32_t i = 0; i < r.n; ++i) {
          choice_state& c = choices[static_cast<std::size_t>(i)];
          if (!c.logprobs) continue;
          c.logprobs->add_prompt(context.prompt, prompt->logprobs, context.echoed);
          if (!sse) continue;
          const boost::json::value echoed = chunks.content(context.echoed, i, c.fresh_logprobs());
          if (!co_await sse->event(echoed)) co_return;
        }
        continue;
      }
      if (auto* delta = std::get_if<backend::delta_event>(&event)) {
        if (!delta->tokens.empty() && !ex.access().ttft_seconds) {
          ex.access().ttft_seconds = std::chrono::duration<double>(clock::now() - ex.received()).count();
        }
        // The engine numbers choices from 0 to n - 1 (a backend's stream is checked for it).
        if (delta->index < 0 || delta->index >= r.n) continue;
        choice_state& c = choices[static_cast<std::size_t>(delta->index)];
        if (c.logprobs) c.logprobs->add(*delta);
        if (delta->finish) c.reason = *delta->finish;
        if (c.parser) {
          // Also a delta without text: its tokens count toward reasoning_tokens.
          std::vector<output_event> parsed =
              c.parser->feed(delta->text, static_cast<std::int64_t>(delta->tokens.size()));
          if (!co_await deliver(sse, chunks, delta->index, c, std::move(parsed))) co_return;
          if (!delta->finish) continue;
          // The choice's output has ended: what the parser held back.
          std::vector<output_event> rest = c.parser->finish(cut_short(*delta->finish));
          if (!co_await deliver(sse, chunks, delta->index, c, std::move(rest))) co_return;
          if (!sse) continue;
          const boost::json::value end =
              chunks.finish(*delta->finish, delta->index, c.fresh_logprobs(), c.made_tool_calls);
          if (!co_await sse->event(end)) co_return;
          continue;
        }
        if (!sse) {
          c.text += delta->text;
          continue;
        }
        if (!delta->text.empty()) {
          const boost::json::value piece = chunks.content(delta->text, delta->index, c.fresh_logprobs());
          if (!co_await sse->event(piece)) co_return;
        }
        if (delta->finish) {
          // With what is left of its log probabilities: tokens whose text was held back.
          const boost::json::value end = chunks.finish(*delta->finish, delta->index, c.fresh_logprobs());
          if (!co_await sse->event(end)) co_return;
        }
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
        co_await end_failed(ex, sse, session, failure);
        co_return;
      }
      session.set_outcome(request_outcome::completed);
      // The usage as the session charges it (the engine's figures, within what the gateway knows).
      const usage_counts charged = session.usage().counts();
      const backend::token_usage used{charged.prompt_tokens, charged.completion_tokens, charged.cached_tokens};
      // Every choice ends with its own delta; one that did not (a backend that left it out)
      // ends with the request, after what its parser held back.
      for (std::int32_t i = 0; i < r.n; ++i) {
        choice_state& c = choices[static_cast<std::size_t>(i)];
        if (c.reason) continue;
        if (c.parser) {
          std::vector<output_event> rest = c.parser->finish(cut_short(finished->reason));
          if (!co_await deliver(sse, chunks, i, c, std::move(rest))) co_return;
        }
        if (!sse) continue;
        const boost::json::value end = chunks.finish(finished->reason, i, c.fresh_logprobs(), c.made_tool_calls);
        if (!co_await sse->event(end)) co_return;
      }
      // Where the model's reasoning is parsed, the tokens it took in every choice.
      std::optional<std::int64_t> reasoning_tokens;
      for (const choice_state& c : choices) {
        if (!c.parser || !c.parser->reasoning_on()) continue;
        reasoning_tokens = reasoning_tokens.value_or(0) + c.parser->reasoning_tokens();
      }
      if (!sse) {
        std::vector<choice_result> results;
        results.reserve(choices.size());
        for (choice_state& c : choices) {
          results.push_back({.text = std::move(c.text),
                             .message = std::move(c.message),
                             .reason = c.reason.value_or(finished->reason),
                             .logprobs = c.logprobs ? c.logprobs->all() : std::string("null")});
        }
        co_await ex.respond(with_headers(
            json_text_response(http::status::ok, completion_body(meta, results, used, reasoning_tokens)), session));
        co_return;
      }
      if (r.include_usage) {
        const boost::json::value usage = chunks.usage(used, reasoning_tokens);
        if (!co_await sse->event(usage)) co_return;
      }
      co_await sse->done();
      co_return;
    }

    if (ex.was_cut()) {
      const refusal failure{.kind = refusal_kind::shutting_down,
                            .message = "The server is shutting down: the request was cut short at its shutdown deadline"};
      co_await end_failed(ex, sse, session, failure);
      co_return;
    }

    // Sleep until an event arrives, the heartbeat is due, or the client leaves.
    const clock::time_point heartbeat_due = sse ? sse->last_write() + options_.sse_heartbeat : clock::time_point::max();
    events.wake.expires_at(heartbeat_due);
    const auto woken = co_await (events.wake.async_wait(asio::as_tuple(asio::use_awaitable)) || ex.watch_disconnect());
    if (woken.index() == 1 && !ex.was_cut()) co_return;  // the client is gone: the handle cancels the request
    if (sse && events.events.empty() && clock::now() >= sse->last_write() + options_.sse_heartbeat) {
      if (!co_await sse->ping()) co_return;
    }
  }
}

#pragma GCC diagnostic pop

}  // namespace

void add_openai_routes(router& routes, const model_slot& models, tenancy& tenants,
                       monitoring::gateway_metrics* metrics, openai_route_options options) {
  auto service = std::make_shared<openai_service>(models, tenants, metrics, options);
  routes.add(http::verb::post, "/v1/chat/completions", [service](exchange& ex) -> asio::awaitable<void> {
    co_await service->generate(ex, openai_api::chat_completions);
  });
  routes.add(http::verb::post, "/v1/completions", [service](exchange& ex) -> asio::awaitable<void> {
    co_await service->generate(ex, openai_api::completions);
  });
  routes.add(http::verb::post, "/v1/messages/count_tokens", [service](exchange& ex) -> asio::awaitable<void> {
    co_await service->count_tokens(ex);
  });
  routes.add(http::verb::get, "/v1/models", [service](exchange& ex) -> asio::awaitable<void> {
    co_await service->list_models(ex);
  });
  routes.add(http::verb::get, "/v1/models/{id}", [service](exchange& ex) -> asio::awaitable<void> {
    co_await service->get_model(ex);
  });
}

}  // namespace edge::gateway
