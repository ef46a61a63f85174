// Chat templates: how a conversation becomes a prompt. A model is served with its own Jinja
// template (tokenizer_config.json "chat_template", chat_template.jinja, GGUF
// "tokenizer.chat_template"; jinja.h renders it), or with one of the built-in formats the
// Llama-family, ChatML and Mistral models are trained on (chat_formats.cpp: each the Jinja text
// its family ships, rendered by the same interpreter): for a model without a template, or when
// --chat-template names one. --chat-template FILE serves a Jinja template from a file instead.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "edge/backend/tokenizer/markup.h"
#include "edge/common/status.h"

namespace edge::backend {

enum class chat_template_kind { plain, llama2, llama3, chatml, mistral };

std::string_view to_string(chat_template_kind kind);
// "llama-2", "llama-3", "chatml", "mistral", "plain" (and "llama2", "llama3").
std::optional<chat_template_kind> parse_chat_template_name(std::string_view name);

struct chat_tool_call {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text, as the client sent it
};

struct chat_message {
  std::string role;                        // system, developer, user, assistant, tool
  std::optional<std::string> content;      // null for an assistant turn holding only tool calls
  std::string reasoning_content;           // assistant's earlier thinking, when the client sends it
  std::vector<chat_tool_call> tool_calls;  // assistant
  std::string tool_call_id;                // tool
  std::string name;                        // optional participant / tool name
};

// The vocabulary's BOS and EOS text, which a built-in format writes (a model's own template has
// its own, chat_template_spec).
struct chat_render_options {
  std::string bos_text;  // e.g. "<s>" or "<|begin_of_text|>"
  std::string eos_text;  // e.g. "</s>"; closes assistant turns in llama-2/mistral
};

// ---- the model's chat template -------------------------------------------------------------------

// Which template a model is served with, as found at load: what is compared between a split
// gateway and its backends and travels between them (internal_protocol.h).
struct chat_template_spec {
  std::optional<chat_template_kind> builtin;  // a built-in format; else the Jinja below
  std::string jinja;                          // the template
  std::string jinja_tool_use;                 // its "tool_use" variant, for requests with tools ("" when none)
  std::string bos_token;                      // the template's bos_token and eos_token ("" when the model has none)
  std::string eos_token;
  std::string origin;  // where it came from: "tokenizer_config.json", "--chat-template FILE", ...

  friend bool operator==(const chat_template_spec&, const chat_template_spec&) = default;
};

// What a request gives the template besides its messages.
struct chat_request_inputs {
  std::span<const chat_message> messages;
  std::span<const std::string> tools;      // each tool object as JSON text, as the client sent it
  bool add_generation_prompt = true;
  std::string_view chat_template_kwargs;  // a JSON object text ("" when none): each key a template variable
};

// The names a request's chat_template_kwargs may not set: the template's own inputs. (Inline: the
// request parser uses it without the renderer.)
constexpr bool is_reserved_template_variable(std::string_view name) {
  return name == "messages" || name == "tools" || name == "add_generation_prompt" || name == "bos_token" ||
         name == "eos_token";
}

// A model's chat template, parsed once: rendered from any thread. Copies share the parse.
class chat_template {
 public:
  // Built-in plain (parsed when first rendered). Inline: a `model` holds one, and
  // edge_backend_core (the GPU-only build) makes models without linking the interpreter.
  chat_template() { spec_.builtin = chat_template_kind::plain; }
  static chat_template builtin(chat_template_kind kind, std::string origin);
  // Parses the Jinja template(s): an error names the line and column.
  static result<chat_template> compile(chat_template_spec spec);

  const chat_template_spec& spec() const noexcept { return spec_; }
  // The model's own template (or a file's), not a built-in format.
  bool is_models_own() const noexcept { return !spec_.builtin.has_value(); }
  // For the logs: "Jinja template from tokenizer_config.json (and its tool_use variant)",
  // "built-in llama-3 (--chat-template)".
  std::string describe() const;
  // Whether the template writes BOS itself where the model wants it (the model's own does; a
  // built-in format writes the vocabulary's where its family's does): its text is tokenized
  // without adding one (as transformers does).
  bool writes_own_bos() const noexcept { return is_models_own(); }

  // The prompt text and its markup (markup.h). The template sees each message as the client sent
  // it, with two adaptations found when it was parsed: a null content becomes "" for a template
  // that fails on null (Qwen 3's) or would print it as "None" (Llama 3's), and tool call arguments
  // become objects for a template that writes them with tojson (Llama 3.1's). `builtin` gives a
  // built-in format its BOS and EOS text. The markup is what the template writes itself, BOS
  // and EOS, and the roles (checked against the five the API has); everything else the request
  // holds (contents, tool calls, tool results, names, ids, tools, chat_template_kwargs) is
  // ordinary text wherever the template puts it. Errors (the template raised, or failed) are
  // invalid_argument naming the template's line.
  result<marked_text> render(const chat_request_inputs& inputs, const chat_render_options& builtin) const;
  // The texts the model's template writes its markup with (its Jinja sources; none for a built-in
  // format, whose markup is the vocabulary's special tokens): what markup_tokens::of reads.
  std::vector<std::string_view> markup_sources() const;

  struct compiled;  // the parsed Jinja and what the probes found (chat_template.cpp)

 private:
  chat_template_spec spec_;
  std::shared_ptr<const compiled> compiled_;
};

}  // namespace edge::backend
