// Which CPU code path the kernels take. The AVX-512 paths are chosen at run time when the CPU
// has AVX-512 F/BW/DQ/VL; the portable paths compute the same functions (within rounding, not bit
// for bit: their summation order differs) and serve other CPUs.
//
// EDGE_CPU_ISA=generic forces the portable paths (tests compare the two this way).
#pragma once

namespace edge::kernels::cpu {

enum class isa { generic, avx512 };

// Decided once per process, from the CPU and EDGE_CPU_ISA.
isa active_isa();
const char* to_string(isa value);

}  // namespace edge::kernels::cpu
