#include "kernels/cpu/isa.h"

#include <algorithm>
#include <cstdlib>

namespace edge::kernels::cpu {
namespace {

isa detect() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  if (avx512 && __builtin_cpu_supports("avx512vnni")) return isa::avx512_vnni;
  if (avx512) return isa::avx512;
  if (avx2) return isa::avx2;
#endif
  return isa::generic;
}

}  // namespace

isa supported_isa() {
  static const isa supported = detect();
  return supported;
}

isa active_isa() {
  static const isa chosen = [] {
    const char* forced = std::getenv("EDGE_CPU_ISA");
    const std::optional<isa> cap = forced != nullptr ? parse_isa(forced) : std::nullopt;
    return cap ? std::min(*cap, supported_isa()) : supported_isa();
  }();
  return chosen;
}

bool has_byte_permutes() {
  static const bool permutes = [] {
#if defined(__x86_64__)
    __builtin_cpu_init();
    return has(isa::avx512) && __builtin_cpu_supports("avx512vbmi");
#else
    return false;
#endif
  }();
  return permutes;
}

bool quantized_activations() {
  static const bool quantized = [] {
    const char* asked = std::getenv("EDGE_CPU_ACTIVATIONS");
    return asked == nullptr || std::string_view(asked) != "exact";
  }();
  return quantized;
}

const char* to_string(isa value) {
  switch (value) {
    case isa::generic: return "generic";
    case isa::avx2: return "avx2";
    case isa::avx512: return "avx512";
    case isa::avx512_vnni: return "avx512_vnni";
  }
  return "generic";
}

std::optional<isa> parse_isa(std::string_view name) {
  for (const isa level : {isa::generic, isa::avx2, isa::avx512, isa::avx512_vnni}) {
    if (name == to_string(level)) return level;
  }
  return std::nullopt;
}

}  // namespace edge::kernels::cpu
