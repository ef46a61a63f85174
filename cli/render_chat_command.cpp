// `edgeinfer render-chat`: the prompt a chat completion request becomes, as `serve` would render
// it for the model, without loading its weights. The request body (what POST
// /v1/chat/completions takes) is read from standard input and checked by the API's own parser;
// the prompt text is written to standard output as it is. With --jsonl every input line is a
// request and every output line {"prompt": "...", "markup": [[begin, end], ...]} (the byte
// ranges of the prompt the template wrote: only there may the model's markup tokens match; the
// rest is the request's text) or {"error": {"message", "param"}}, so that many conversations
// cost one process start (the template parity test renders hundreds).
#include <cstdio>
#include <iostream>
#include <iterator>

#include "chat_template_options.h"
#include "commands.h"
#include "edge/backend/model/model.h"
#include "edge/common/format.h"
#include "edge/common/json_text.h"
#include "edge/common/log.h"
#include "edge/gateway/openai/openai_request.h"

namespace edge::cli {
namespace {

config::schema render_chat_options() {
  config::schema s;
  s.add_path("model", std::nullopt,
             "The model whose chat template renders the prompt: a GGUF, or a folder with tokenizer_config.json or "
             "chat_template.jinja (weights are not read)");
  add_chat_template_option(s);
  s.add_boolean("jsonl", false,
                "Read one request per line, write one line per request: {\"prompt\": ...} or {\"error\": ...}");
  return s;
}

// The prompt of one request body, or its error (the message and the field, as the API's 400).
result<backend::marked_text, json_error> render_request(const backend::chat_template& chat, std::string_view body) {
  auto parsed = gateway::parse_openai_request(gateway::openai_api::chat_completions, body);
  if (auto* error = std::get_if<gateway::request_error>(&parsed)) return json_error(error->message, error->param);
  const gateway::openai_request& r = std::get<gateway::openai_request>(parsed);
  std::vector<std::string> tools;
  for (const gateway::tool_definition& tool : r.tools) tools.push_back(tool.json);
  // Built-in templates get no BOS or EOS text here: they come from the tokenizer, not read.
  auto text = chat.render({.messages = r.messages,
                           .tools = tools,
                           .add_generation_prompt = r.add_generation_prompt,
                           .chat_template_kwargs = r.chat_template_kwargs},
                          {});
  if (!text.ok()) return json_error(text.error().message(), "messages");
  return std::move(text).value();
}

void write_out(std::string_view text) { std::fwrite(text.data(), 1, text.size(), stdout); }

int run_render_chat(const config::values& settings) {
  const logger log{"render-chat"};
  const auto model = settings.optional_string("model");
  if (!model && settings.string("chat-template") == "auto") {
    std::fprintf(stderr, "edgeinfer render-chat: give --model, or a template with --chat-template\n");
    return 2;
  }
  backend::load_options load;
  apply_chat_template_choice(settings, load);
  result<backend::chat_template> chat = backend::chat_template();
  if (model) {
    load.path = *model;
    chat = backend::load_chat_template(load);
  } else if (load.chat_template) {
    chat = backend::chat_template::builtin(*load.chat_template, "--chat-template");
  } else {
    // A template file alone: any path names no model, so the choice is only the file's.
    load.path = *load.chat_template_file;
    chat = backend::load_chat_template(load);
  }
  if (!chat.ok()) {
    log.error("{}", chat.error().message());
    return 1;
  }
  log.debug("chat template: {}", chat->describe());

  if (!settings.boolean("jsonl")) {
    const std::string body(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>{});
    auto prompt = render_request(*chat, body);
    if (!prompt.ok()) {
      std::fprintf(stderr, "edgeinfer render-chat: %s\n", prompt.error().message().c_str());
      return 1;
    }
    write_out(prompt->text);
    std::fflush(stdout);
    return 0;
  }
  std::string line;
  std::string out;
  while (std::getline(std::cin, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    out.clear();
    auto prompt = render_request(*chat, line);
    if (prompt.ok()) {
      out += "{\"prompt\":";
      append_json_string(out, prompt->text);
      out += ",\"markup\":[";
      for (const backend::byte_range& r : prompt->markup.ranges()) {
        if (out.back() != '[') out += ',';
        out += format("[{},{}]", r.begin, r.end);
      }
      out += "]}\n";
    } else {
      out += "{\"error\":{\"message\":";
      append_json_string(out, prompt.error().message());
      out += ",\"param\":";
      append_json_string(out, prompt.error().path());
      out += "}}\n";
    }
    write_out(out);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

command make_render_chat_command(CLI::App& app) {
  return command(app, "render-chat",
                 "Print the prompt a chat completion request (on standard input) becomes with a model's chat template",
                 render_chat_options(), run_render_chat);
}

}  // namespace edge::cli
