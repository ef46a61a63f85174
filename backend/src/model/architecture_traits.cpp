#include "architecture_traits.h"

#include <array>

namespace edge::backend {
namespace {

constexpr std::array architectures{
    architecture_traits{architecture::llama, "llama", "LlamaForCausalLM", 2048, false, false, 0, "llama",
                        rope_layout::adjacent_pairs, false, false, false, false},
    architecture_traits{architecture::qwen2, "qwen2", "Qwen2ForCausalLM", 32768, true, false, 0, "qwen2",
                        rope_layout::half_split, true, false, true, true},
    architecture_traits{architecture::mistral, "mistral", "MistralForCausalLM", 4096 * 32, false, false, 0, "",
                        rope_layout::half_split, false, false, false, false},
    architecture_traits{architecture::qwen3, "qwen3", "Qwen3ForCausalLM", 32768, false, true, 128, "qwen3",
                        rope_layout::half_split, false, true, true, true},
    architecture_traits{architecture::qwen3_moe, "qwen3_moe", "Qwen3MoeForCausalLM", 32768, false, true, 0, "qwen3moe",
                        rope_layout::half_split, false, true, true, true},
    architecture_traits{architecture::glm4_moe, "glm4_moe", "Glm4MoeForCausalLM", 131072, false, false, 0, "",
                        rope_layout::half_split, false, false, false, true},
    // deepseek2's own keys say the rest (gguf_model.cpp's deepseek2_from_gguf).
    architecture_traits{architecture::deepseek_v3, "deepseek_v3", "DeepseekV3ForCausalLM", 4096, false, false, 0,
                        "deepseek2", rope_layout::adjacent_pairs, false, false, false, false},
    architecture_traits{architecture::glm_moe_dsa, "glm_moe_dsa", "GlmMoeDsaForCausalLM", 202752, false, false, 0, "",
                        rope_layout::half_split, false, false, false, false},
};

constexpr bool rows_in_order() {
  for (std::size_t i = 0; i < architectures.size(); ++i) {
    if (static_cast<std::size_t>(architectures[i].arch) != i) return false;
  }
  return true;
}
static_assert(rows_in_order(), "the architecture table lists the architectures in the enum's order");

std::string listed(bool gguf) {
  std::string names;
  std::size_t count = 0;
  for (const architecture_traits& t : architectures) count += gguf && t.gguf_name.empty() ? 0 : 1;
  std::size_t i = 0;
  for (const architecture_traits& t : architectures) {
    const std::string_view name = gguf ? t.gguf_name : t.hf_class;
    if (name.empty()) continue;
    if (i > 0) names += i + 1 == count ? " and " : ", ";
    names += name;
    ++i;
  }
  return names;
}

}  // namespace

std::span<const architecture_traits> architecture_table() { return architectures; }

const architecture_traits& traits_of(architecture arch) { return architectures[static_cast<std::size_t>(arch)]; }

const architecture_traits* find_hf_class(std::string_view name) {
  for (const architecture_traits& t : architectures) {
    if (t.hf_class == name) return &t;
  }
  return nullptr;
}

const architecture_traits* find_gguf_architecture(std::string_view name) {
  if (name.empty()) return nullptr;
  for (const architecture_traits& t : architectures) {
    if (t.gguf_name == name) return &t;
  }
  return nullptr;
}

std::string supported_hf_classes() { return listed(false); }
std::string supported_gguf_architectures() { return listed(true); }

std::string_view to_string(architecture arch) { return traits_of(arch).model_type; }

}  // namespace edge::backend
