#include "edge/backend/tokenizer/chat_template.h"

#include <algorithm>
#include <cassert>
#include <utility>

#include "chat_formats.h"
#include "edge/backend/tokenizer/jinja.h"
#include "edge/common/format.h"

namespace edge::backend {

std::string_view to_string(chat_template_kind kind) { return chat_format_of(kind).name; }

std::optional<chat_template_kind> parse_chat_template_name(std::string_view name) {
  for (const chat_format& f : chat_formats()) {
    if (f.name == name || std::find(f.also.begin(), f.also.end(), name) != f.also.end()) return f.kind;
  }
  return std::nullopt;
}

namespace {

// The conversation the probes render: a question and an assistant turn holding only a tool call.
constexpr std::string_view probe_arguments = R"({"probe_argument": "probe value"})";
constexpr std::string_view probe_tool =
    R"({"type": "function", "function": {"name": "probe_tool", "description": "A probe.", "parameters": {"type": "object", "properties": {"probe_argument": {"type": "string"}}, "required": ["probe_argument"]}}})";

// How the template wants what clients send in forms templates disagree on.
struct adaptations {
  bool string_content = false;    // a null content is given as ""
  bool object_arguments = false;  // tool call arguments are given as the objects their JSON holds
};

jinja::value message_value(const chat_message& m, const adaptations& a) {
  using jinja::value;
  auto message = value::dict();
  auto& fields = message.as_dict().items;
  // The role is one of the five the API has (the request parser checks): markup, as the
  // template writes it into its turn markers.
  fields.emplace_back("role", value::markup(m.role));
  fields.emplace_back("content", m.content ? value(*m.content) : a.string_content ? value("") : value::none());
  if (!m.reasoning_content.empty()) fields.emplace_back("reasoning_content", value(m.reasoning_content));
  if (!m.tool_calls.empty()) {
    std::vector<value> calls;
    for (const chat_tool_call& call : m.tool_calls) {
      value arguments(call.arguments);
      if (a.object_arguments) {
        // Arguments that are not a JSON object stay as the client wrote them.
        if (auto parsed = value::from_json(call.arguments); parsed.ok() && parsed->type() == value::kind::dict) {
          arguments = std::move(parsed).value();
        }
      }
      auto function = value::dict({{"name", value(call.name)}, {"arguments", std::move(arguments)}});
      auto entry = value::dict();
      if (!call.id.empty()) entry.as_dict().items.emplace_back("id", value(call.id));
      entry.as_dict().items.emplace_back("type", value::markup("function"));
      entry.as_dict().items.emplace_back("function", std::move(function));
      calls.push_back(std::move(entry));
    }
    fields.emplace_back("tool_calls", value::list(std::move(calls)));
  }
  if (!m.tool_call_id.empty()) fields.emplace_back("tool_call_id", value(m.tool_call_id));
  if (!m.name.empty()) fields.emplace_back("name", value(m.name));
  return message;
}

// The BOS and EOS text a template is given: a model's template, its own (each only when the model
// has one); a built-in format, the vocabulary's (always defined, "" when it has none).
struct bos_eos {
  std::string_view bos;
  std::string_view eos;
  bool always = false;
};

bos_eos model_bos_eos(const chat_template_spec& spec) { return {spec.bos_token, spec.eos_token}; }

// What the template sees: messages, tools (None without), add_generation_prompt, bos_token and
// eos_token, then every key of chat_template_kwargs.
result<jinja::value> template_globals(const chat_request_inputs& in, const bos_eos& special, const adaptations& a) {
  using jinja::value;
  std::vector<value> messages;
  messages.reserve(in.messages.size());
  for (const chat_message& m : in.messages) messages.push_back(message_value(m, a));
  auto globals = value::dict();
  auto& fields = globals.as_dict().items;
  fields.emplace_back("messages", value::list(std::move(messages)));
  if (in.tools.empty()) {
    fields.emplace_back("tools", value::none());
  } else {
    std::vector<value> tools;
    for (const std::string& tool : in.tools) {
      EDGE_ASSIGN_OR_RETURN(value parsed, value::from_json(tool));
      tools.push_back(std::move(parsed));
    }
    fields.emplace_back("tools", value::list(std::move(tools)));
  }
  fields.emplace_back("add_generation_prompt", value(in.add_generation_prompt));
  if (special.always || !special.bos.empty()) fields.emplace_back("bos_token", value::markup(std::string(special.bos)));
  if (special.always || !special.eos.empty()) fields.emplace_back("eos_token", value::markup(std::string(special.eos)));
  if (!in.chat_template_kwargs.empty()) {
    EDGE_ASSIGN_OR_RETURN(const value kwargs, value::from_json(in.chat_template_kwargs));
    if (kwargs.type() != value::kind::dict) return invalid_argument("chat_template_kwargs must be a JSON object");
    for (const auto& [key, v] : kwargs.as_dict().items) globals.as_dict().set(key, v);
  }
  return globals;
}

result<std::string> render_probe(const jinja::program& program, const chat_template_spec& spec, const adaptations& a,
                                 bool object_arguments_in_request) {
  std::vector<chat_message> probe(2);
  probe[0].role = "user";
  probe[0].content = "probe question";
  probe[1].role = "assistant";
  probe[1].tool_calls.push_back({"call_probe", "probe_tool", std::string(probe_arguments)});
  adaptations as_sent = a;
  as_sent.object_arguments = object_arguments_in_request;
  const std::string tools[] = {std::string(probe_tool)};
  EDGE_ASSIGN_OR_RETURN(const jinja::value globals,
                        template_globals({.messages = probe, .tools = tools, .add_generation_prompt = false},
                                         model_bos_eos(spec), as_sent));
  EDGE_ASSIGN_OR_RETURN(marked_text rendered, jinja::render(program, globals));
  return std::move(rendered.text);
}

// What the template does with the forms clients send: it may fail on a null content, or print it
// as "None" (then it is given ""), and it may write tool call arguments with tojson (then it is given objects, which
// is what transformers documents; a template that writes a string as it is gets the string).
adaptations probe_template(const jinja::program& program, const chat_template_spec& spec) {
  adaptations a;
  const auto with_null = render_probe(program, spec, a, false);
  a.string_content = true;
  const auto with_empty = render_probe(program, spec, a, false);
  // "" where null fails, or where it would print Python's "None" (Llama 3's `content | trim`).
  a.string_content = !with_null.ok() || (with_empty.ok() && with_null->find("None") != std::string::npos &&
                                         with_empty->find("None") == std::string::npos);
  if (!render_probe(program, spec, a, false).ok()) return {};  // no tool calls in this template
  const auto as_strings = render_probe(program, spec, a, false);
  if (as_strings->find(probe_arguments) == std::string::npos) {
    const auto as_objects = render_probe(program, spec, a, true);
    a.object_arguments = as_objects.ok() && as_objects->find("probe_argument") != std::string::npos;
  }
  return a;
}

}  // namespace

struct chat_template::compiled {
  jinja::program main;
  jinja::program tool_use;  // empty when the model has no tool_use variant
  adaptations adapt;
};

chat_template chat_template::builtin(chat_template_kind kind, std::string origin) {
  auto parsed = std::make_shared<compiled>();
  auto program = jinja::parse_template(chat_format_of(kind).jinja);
  assert(program.ok());  // the formats' own texts (a unit test parses each)
  parsed->main = std::move(program).value();
  // The formats write a null content as "" (they were written for it, so are not probed).
  parsed->adapt.string_content = true;
  chat_template t;
  t.spec_.builtin = kind;
  t.spec_.origin = std::move(origin);
  t.compiled_ = std::move(parsed);
  return t;
}

result<chat_template> chat_template::compile(chat_template_spec spec) {
  if (spec.builtin) return builtin(*spec.builtin, std::move(spec.origin));
  auto parsed = std::make_shared<compiled>();
  auto main = jinja::parse_template(spec.jinja);
  if (!main.ok()) return invalid_argument(format("the chat template of {}: {}", spec.origin, main.error().message()));
  parsed->main = std::move(main).value();
  if (!spec.jinja_tool_use.empty()) {
    auto tool_use = jinja::parse_template(spec.jinja_tool_use);
    if (!tool_use.ok()) {
      return invalid_argument(format("the tool_use chat template of {}: {}", spec.origin, tool_use.error().message()));
    }
    parsed->tool_use = std::move(tool_use).value();
  }
  parsed->adapt = probe_template(parsed->tool_use ? parsed->tool_use : parsed->main, spec);
  chat_template t;
  t.spec_ = std::move(spec);
  t.compiled_ = std::move(parsed);
  return t;
}

std::vector<std::string_view> chat_template::markup_sources() const {
  std::vector<std::string_view> sources;
  if (!spec_.jinja.empty()) sources.emplace_back(spec_.jinja);
  if (!spec_.jinja_tool_use.empty()) sources.emplace_back(spec_.jinja_tool_use);
  return sources;
}

std::string chat_template::describe() const {
  if (spec_.builtin) return format("built-in {} ({})", to_string(*spec_.builtin), spec_.origin);
  std::string text = format("Jinja template from {}", spec_.origin);
  if (!spec_.jinja_tool_use.empty()) text += " (and its tool_use variant for requests with tools)";
  if (compiled_->adapt.string_content) text += "; null contents are given to it as \"\"";
  if (compiled_->adapt.object_arguments) text += "; it is given tool call arguments as objects";
  return text;
}

result<marked_text> chat_template::render(const chat_request_inputs& inputs, const chat_render_options& builtin) const {
  if (!compiled_) {
    // Default-constructed (built-in plain): the format is parsed once per process, not per render.
    static const chat_template plain = chat_template::builtin(chat_template_kind::plain, "default");
    return plain.render(inputs, builtin);
  }
  const bos_eos special = spec_.builtin ? bos_eos{builtin.bos_text, builtin.eos_text, true} : model_bos_eos(spec_);
  EDGE_ASSIGN_OR_RETURN(const jinja::value globals, template_globals(inputs, special, compiled_->adapt));
  const jinja::program& program = !inputs.tools.empty() && compiled_->tool_use ? compiled_->tool_use : compiled_->main;
  auto text = jinja::render(program, globals);
  if (!text.ok()) {
    return status(text.error().code(), format("the chat template cannot render these messages: {}", text.error().message()));
  }
  return text;
}

}  // namespace edge::backend
