#include "kernels/cpu/isa.h"

#include <cstdlib>
#include <cstring>

namespace edge::kernels::cpu {
namespace {

isa detect() {
  if (const char* forced = std::getenv("EDGE_CPU_ISA"); forced && std::strcmp(forced, "generic") == 0) {
    return isa::generic;
  }
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    return isa::avx512;
  }
#endif
  return isa::generic;
}

}  // namespace

isa active_isa() {
  static const isa chosen = detect();
  return chosen;
}

const char* to_string(isa value) { return value == isa::avx512 ? "avx512" : "generic"; }

}  // namespace edge::kernels::cpu
