// libFuzzer harness: the Jinja chat template renderer on arbitrary templates and contexts. The
// input is a template, optionally followed by a NUL byte and the JSON context it is rendered
// with (else an agent conversation with tools, tool calls and tool results). Parsing answers a
// program or an error naming a line and column; rendering, under small limits, answers the text
// or an error naming a line; neither may crash, hang, leak or run past its limits (checked below:
// a violation aborts, which libFuzzer reports as a crash). The whole chat path is fuzzed too (for
// an eighth of the inputs, of templates that render a conversation within bounded work): the
// template compiled as a model's, probes included, then rendered for a request.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "edge/backend/tokenizer/chat_template.h"
#include "edge/backend/tokenizer/jinja.h"
#include "require.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

namespace be = edge::backend;
namespace jinja = edge::backend::jinja;

using edge::fuzz::require;

constexpr std::string_view default_context =
    R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},)"
    R"( {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function":)"
    R"( {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},)"
    R"( {"role": "tool", "tool_call_id": "c1", "content": "21 C"}, {"role": "assistant", "content": "<think>x</think>21 C."}],)"
    R"( "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",)"
    R"( "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],)"
    R"( "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "enable_thinking": false})";

constexpr std::size_t max_output = std::size_t{1} << 16;

jinja::render_options small_limits(std::int64_t max_steps = 4000) {
  jinja::render_options options;
  options.limits.max_output_bytes = max_output;
  options.limits.max_steps = max_steps;
  options.limits.max_depth = 200;
  options.now = [] { return std::chrono::system_clock::time_point{}; };
  return options;
}

// Markup is ranges of the text: sorted, apart, none empty, none past its end.
void check_markup(const be::marked_text& text) {
  std::size_t last_end = 0;
  bool first = true;
  for (const be::byte_range& r : text.markup.ranges()) {
    require(r.begin < r.end && r.end <= text.text.size());
    require(first || r.begin > last_end);
    first = false;
    last_end = r.end;
  }
}

void check_render(const jinja::program& program, const jinja::value& context) {
  const auto text = jinja::render(program, context, small_limits());
  if (text.ok()) {
    require(text->text.size() <= max_output);
    check_markup(*text);
  } else {
    require(text.error().message().starts_with("line "));
  }
}

// The chat path renders under the production limits (20 million steps, 32 MiB), six times (the
// probes, then the request). A template of nested loops over long strings spends seconds of
// that under the sanitizers: bounded work, which the fuzzer's timeout would report as a hang. So
// the chat path runs only for templates whose rendering of a conversation like the probes' does
// not depend on the limits: it renders within `steps` (real templates take a few thousand), or
// fails the same way with twice the room (the template's own error, such as a null content it
// refuses, which the chat path's adaptations are there for).
bool bounded_work(const jinja::program& program, const jinja::value& conversation) {
  constexpr std::int64_t steps = 100'000;
  const auto first = jinja::render(program, conversation, small_limits(steps));
  if (first.ok()) return true;
  jinja::render_options twice = small_limits(2 * steps);
  twice.limits.max_output_bytes = 2 * max_output;
  const auto second = jinja::render(program, conversation, twice);
  return !second.ok() && second.error().message() == first.error().message();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t split = input.find('\0');
  const std::string_view source = input.substr(0, split);
  const std::string_view context_json = split == std::string_view::npos ? default_context : input.substr(split + 1);

  const auto program = jinja::parse_template(source);
  if (!program.ok()) {
    require(program.error().message().starts_with("line "));
    return 0;
  }
  // A context that is not JSON is one without variables.
  const auto context = jinja::value::from_json(context_json);
  check_render(*program, context.ok() ? *context : jinja::value::dict());

  // As a model's template: compiled (with its probes) and rendered for a request. The probes
  // render four times, so this runs for one input in eight (by size), to keep the runs fast.
  if (size % 8 != 0) return 0;
  static const jinja::value conversation = jinja::value::from_json(default_context).value();
  if (!bounded_work(*program, conversation)) return 0;
  be::chat_template_spec spec;
  spec.jinja = std::string(source);
  spec.bos_token = "<s>";
  spec.origin = "the fuzzer";
  const auto chat = be::chat_template::compile(spec);
  require(chat.ok());
  std::vector<be::chat_message> messages(2);
  messages[0].role = "user";
  messages[0].content = "Hi";
  messages[1].role = "assistant";
  messages[1].tool_calls.push_back({"c1", "f", R"({"a": [1, 2]})"});
  const std::string tools[] = {R"({"type": "function", "function": {"name": "f"}})"};
  const auto prompt =
      chat->render({.messages = messages, .tools = tools, .chat_template_kwargs = R"({"enable_thinking": true})"}, {});
  if (prompt.ok()) check_markup(*prompt);
  return 0;
}
