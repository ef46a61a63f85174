// libFuzzer harness: parse_openai_request on arbitrary bytes, as both APIs, and
// parse_anthropic_request, as both of its routes, return a request or an error naming a field;
// they never crash, and what they accept holds the validators' promises (checked below: a
// violation aborts, which libFuzzer reports as a crash).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "edge/backend/engine/engine.h"
#include "edge/gateway/openai/anthropic_request.h"
#include "edge/gateway/openai/openai_request.h"
#include "require.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

namespace gw = edge::gateway;

using edge::fuzz::require;

void check(gw::openai_api api, const std::variant<gw::openai_request, gw::request_error>& parsed) {
  if (std::holds_alternative<gw::request_error>(parsed)) {
    require(!std::get<gw::request_error>(parsed).message.empty());
    return;
  }
  const gw::openai_request& r = std::get<gw::openai_request>(parsed);
  require(r.api == api);
  if (api == gw::openai_api::chat_completions) {
    require(!r.messages.empty());
    for (const auto& m : r.messages) {
      require(m.role == "system" || m.role == "user" || m.role == "assistant" || m.role == "tool");
      require(m.content.has_value() || m.role == "assistant");
      require(m.tool_calls.empty() || m.role == "assistant");
    }
    for (const auto& tool : r.tools) require(!tool.name.empty() && tool.name.size() <= gw::max_function_name_length);
    if (r.choice.mode == gw::tool_choice_mode::named) {
      bool known = false;
      for (const auto& tool : r.tools) known |= tool.name == r.choice.name;
      require(known);
    }
    require(r.choice.mode == gw::tool_choice_mode::none || !r.tools.empty());
  } else {
    require(!r.prompts.empty() && r.prompts.size() * static_cast<std::size_t>(r.n) <= edge::backend::max_choices);
    for (const auto& prompt : r.prompts) {
      if (const auto* ids = std::get_if<std::vector<std::int64_t>>(&prompt)) {
        require(!ids->empty());
        for (const std::int64_t id : *ids) require(id >= 0);
      }
    }
  }
  require(!r.max_tokens || *r.max_tokens >= 1);
  require(r.sampling.temperature >= 0.0f && r.sampling.temperature <= gw::max_temperature);
  require(r.sampling.top_p > 0.0f && r.sampling.top_p <= 1.0f);
  require(r.sampling.top_k >= 0);
  require(r.sampling.min_p >= 0.0f && r.sampling.min_p <= 1.0f);
  require(r.sampling.repetition_penalty > 0.0f);
  require(r.stop.size() <= gw::max_stop_strings);
  for (const auto& stop : r.stop) require(!stop.empty());
  require(r.stream || !r.include_usage);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  check(gw::openai_api::chat_completions, gw::parse_openai_request(gw::openai_api::chat_completions, body));
  check(gw::openai_api::completions, gw::parse_openai_request(gw::openai_api::completions, body));
  // A Messages request is a chat request; the messages route also needs max_tokens.
  const auto messages = gw::parse_anthropic_request(gw::anthropic_route::messages, body);
  check(gw::openai_api::chat_completions, messages);
  if (const auto* r = std::get_if<gw::openai_request>(&messages)) require(r->max_tokens.has_value());
  check(gw::openai_api::chat_completions, gw::parse_anthropic_request(gw::anthropic_route::count_tokens, body));
  return 0;
}
