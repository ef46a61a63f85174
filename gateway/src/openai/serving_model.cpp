#include "edge/gateway/openai/serving_model.h"

namespace edge::gateway {

void model_slot::publish(std::shared_ptr<const serving_model> model) {
  std::lock_guard lock(mutex_);
  model_ = std::move(model);
}

std::shared_ptr<const serving_model> model_slot::get() const {
  std::lock_guard lock(mutex_);
  return model_;
}

}  // namespace edge::gateway
