#include "edge/gateway/openai/serving_model.h"

#include "edge/gateway/openai/reasoning.h"
#include "edge/gateway/openai/tool_calls.h"

namespace edge::gateway {

backend::markup_tokens chat_markup_tokens(const backend::tokenizer& tok, const backend::chat_template& chat,
                                          const output_syntax& output) {
  std::vector<std::string_view> texts = chat.markup_sources();
  for (const std::string_view marker : tool_call_markers(output.tool_calls)) texts.push_back(marker);
  if (output.reasoning != reasoning_parser_kind::none) {
    texts.push_back(think_open_tag);
    texts.push_back(think_close_tag);
  }
  return backend::markup_tokens::of(tok, texts);
}

void model_slot::publish(std::shared_ptr<const serving_model> model) {
  std::lock_guard lock(mutex_);
  model_ = std::move(model);
}

std::shared_ptr<const serving_model> model_slot::get() const {
  std::lock_guard lock(mutex_);
  return model_;
}

}  // namespace edge::gateway
