#include "edge/backend/model/model_config.h"

#include <algorithm>
#include <string>

#include "edge/backend/model/formats.h"

namespace edge::backend {

std::string_view to_string(architecture arch) {
  switch (arch) {
    case architecture::llama: return "llama";
    case architecture::qwen2: return "qwen2";
    case architecture::mistral: return "mistral";
    case architecture::qwen3: return "qwen3";
    case architecture::qwen3_moe: return "qwen3_moe";
    case architecture::glm4_moe: return "glm4_moe";
  }
  return "unknown";
}

bool moe_config::sparse(std::int64_t layer) const {
  if (num_experts == 0 || layer < first_dense_layers) return false;
  if (std::find(dense_layers.begin(), dense_layers.end(), layer) != dense_layers.end()) return false;
  return sparse_step > 0 && (layer + 1) % sparse_step == 0;
}

std::string shape_to_string(std::span<const std::int64_t> shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  text += ']';
  return text;
}

}  // namespace edge::backend
