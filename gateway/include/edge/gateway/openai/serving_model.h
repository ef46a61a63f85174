// The model the OpenAI routes serve, published once it is loaded and its engine runs (serve), or
// once a backend has confirmed that it serves it (gateway).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "edge/backend/tokenizer/chat_template.h"
#include "edge/backend/tokenizer/tokenizer.h"
#include "edge/gateway/openai/engine_client.h"
#include "edge/gateway/openai/output_parser.h"

namespace edge::gateway {

class grammar_compiler;

struct serving_model {
  std::string id;                // the served model name
  std::int64_t created = 0;      // Unix seconds when it was loaded (the models API's "created")
  std::int64_t context_length = 0;  // prompt + completion tokens at most
  backend::chat_template chat_template;  // the model's, parsed once
  const backend::tokenizer* tokenizer = nullptr;
  engine_client* engine = nullptr;  // where requests are generated
  // Compiles requests' grammars for `tokenizer` (serve); null where the engine compiles them
  // itself (a split gateway's backends).
  grammar_compiler* grammars = nullptr;
  output_syntax output;  // how its chat answers write tool calls and reasoning
  // Client text is text (the default): a chat format's markup tokens (chat_markup_tokens) match
  // only where the chat template wrote them, never in what a request brought, in any API. True
  // (--client-special-tokens parse): special-token text anywhere in a chat prompt is parsed, and a
  // completions prompt's as before (added tokens, not special ones).
  bool parse_client_special_tokens = false;
  backend::markup_tokens markup_tokens;
};

// The markup tokens of a served model: the vocabulary's special tokens, and its added tokens that
// its chat template or its answers' tool-call and reasoning syntax write (markup_tokens::of).
backend::markup_tokens chat_markup_tokens(const backend::tokenizer& tok, const backend::chat_template& chat,
                                          const output_syntax& output);

// Empty until the model is loaded; then holds it for the server's life. Thread-safe.
class model_slot {
 public:
  void publish(std::shared_ptr<const serving_model> model);
  std::shared_ptr<const serving_model> get() const;

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<const serving_model> model_;  // guarded by mutex_
};

}  // namespace edge::gateway
