// Chat templates: the built-in renderers for the prompt formats Llama-family models are
// trained on. A model's template is recognised from its Jinja source (tokenizer_config.json
// "chat_template", GGUF "tokenizer.chat_template") by fingerprint, or named with
// --chat-template.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace edge::backend {

enum class chat_template_kind { plain, llama2, llama3, chatml, mistral };

std::string_view to_string(chat_template_kind kind);
// "llama-2", "llama-3", "chatml", "mistral", "plain" (and "llama2", "llama3").
std::optional<chat_template_kind> parse_chat_template_name(std::string_view name);
// The renderer matching a Jinja chat template; nullopt when none is recognised.
std::optional<chat_template_kind> detect_chat_template(std::string_view jinja_source);

struct chat_message {
  std::string role;  // system, user, assistant
  std::string content;
};

struct chat_render_options {
  std::string bos_text;  // e.g. "<s>" or "<|begin_of_text|>"; written where the template has BOS
  std::string eos_text;  // e.g. "</s>"; closes assistant turns in llama-2/mistral
  bool add_generation_prompt = true;  // end with the assistant header, ready for a reply
};

// The prompt text; encode it with parse_special = true and add_bos = false (BOS is in the text).
std::string render_chat(chat_template_kind kind, std::span<const chat_message> messages,
                        const chat_render_options& options);

}  // namespace edge::backend
