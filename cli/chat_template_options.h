// --chat-template, shared by the commands that render chat prompts (serve, backend, generate,
// render-chat): "auto" (the model's own Jinja template, else the plain built-in one), a built-in
// renderer's name, or a Jinja template file.
#pragma once

#include <string>

#include "edge/backend/model/model.h"
#include "edge/backend/tokenizer/chat_template.h"
#include "edge/common/config.h"

namespace edge::cli {

inline void add_chat_template_option(config::schema& s) {
  s.add_string("chat-template", "auto",
               "Chat template for /v1/chat/completions: auto (the model's own Jinja template from "
               "tokenizer_config.json, chat_template.jinja or the GGUF; plain when it has none), a built-in one "
               "(llama-2, llama-3, chatml, mistral, plain), or the path of a Jinja template file");
}

inline void apply_chat_template_choice(const config::values& settings, backend::load_options& load) {
  const std::string& chat = settings.string("chat-template");
  if (chat == "auto") return;
  if (const auto kind = backend::parse_chat_template_name(chat)) {
    load.chat_template = *kind;
  } else {
    load.chat_template_file = chat;
  }
}

}  // namespace edge::cli
