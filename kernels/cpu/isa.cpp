#include "kernels/cpu/isa.h"

#include <algorithm>
#include <cstdlib>

namespace edge::kernels::cpu {
namespace {

// What the CPU reports, read once.
struct cpu_features {
  bool avx2 = false;    // with FMA and F16C
  bool avx512 = false;  // F, BW, DQ and VL
  bool vnni = false;    // AVX-512 VNNI
  bool vbmi = false;    // AVX-512 VBMI
};

const cpu_features& features() {
  static const cpu_features found = [] {
    cpu_features f;
#if defined(__x86_64__)
    __builtin_cpu_init();
    f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    f.avx512 = f.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    f.vnni = f.avx512 && __builtin_cpu_supports("avx512vnni");
    f.vbmi = f.avx512 && __builtin_cpu_supports("avx512vbmi");
#endif
    return f;
  }();
  return found;
}

}  // namespace

isa supported_isa() {
  const cpu_features& f = features();
  if (f.vnni) return isa::avx512_vnni;
  if (f.avx512) return isa::avx512;
  if (f.avx2) return isa::avx2;
  return isa::generic;
}

isa active_isa() {
  static const isa chosen = [] {
    const char* forced = std::getenv("EDGE_CPU_ISA");
    const std::optional<isa> cap = forced != nullptr ? parse_isa(forced) : std::nullopt;
    return cap ? std::min(*cap, supported_isa()) : supported_isa();
  }();
  return chosen;
}

bool has_byte_permutes() { return has(isa::avx512) && features().vbmi; }

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
