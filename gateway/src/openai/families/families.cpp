// The registry of model families: one line per family (family.h says what a family file holds).
#include <array>

#include "family.h"

namespace edge::gateway::families {
namespace {

// The order a vocabulary is asked for the families' signatures: Kimi's and DeepSeek's markers are
// their own; GLM's <arg_key> sits beside the <tool_call> it shares with Hermes, so GLM is asked
// first.
constexpr std::array<const family_traits*, 5> registry{&kimi_k2, &deepseek_v3, &glm45, &hermes, &llama3_json};

}  // namespace

std::span<const family_traits* const> all() { return registry; }

const family_traits* find(tool_call_parser_kind kind) {
  for (const family_traits* f : registry) {
    if (f->kind == kind) return f;
  }
  return nullptr;
}

}  // namespace edge::gateway::families
