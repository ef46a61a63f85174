#include "edge/backend/model/model_config.h"

#include <string>

#include "edge/backend/model/formats.h"

namespace edge::backend {

std::string_view to_string(architecture arch) {
  switch (arch) {
    case architecture::llama: return "llama";
    case architecture::qwen2: return "qwen2";
    case architecture::mistral: return "mistral";
    case architecture::qwen3: return "qwen3";
  }
  return "unknown";
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
