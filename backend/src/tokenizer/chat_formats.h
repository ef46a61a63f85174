// The built-in chat formats: the prompt formats Llama-family, ChatML and Mistral models are
// trained on, each written once, as the Jinja text the model family ships in its
// tokenizer_config.json "chat_template" (without any model-specific default system prompt), and
// rendered by the same interpreter as a model's own template. They serve a model that ships no
// template, a --chat-template NAME, and the vocabularies `make-model` writes.
#pragma once

#include <optional>
#include <span>
#include <string_view>

#include "edge/backend/tokenizer/chat_template.h"

namespace edge::backend {

struct chat_format {
  chat_template_kind kind;
  std::string_view name;                   // what --chat-template takes and the logs print
  std::span<const std::string_view> also;  // other spellings --chat-template takes
  std::string_view jinja;                  // the template; it reads bos_token and eos_token
};

// Every format, in the order chat_template_kind declares them.
std::span<const chat_format> chat_formats();
const chat_format& chat_format_of(chat_template_kind kind);

}  // namespace edge::backend
