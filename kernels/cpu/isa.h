// Which CPU code path the kernels take, from the least to the most capable. Each level includes
// the ones below it:
//   generic      portable C++ (any CPU): the reference every other path is checked against
//   avx2         AVX2 + FMA + F16C: the integer dot products (vpmaddubsw) of INT4 / INT8 weights
//   avx512       AVX-512 F/BW/DQ/VL: the float tiles, attention, and the integer products as avx2
//   avx512_vnni  AVX-512 VNNI as well: the integer products with vpdpbusd
// The paths compute the same functions within rounding, not bit for bit (their summation orders
// differ), and each kernel takes the most capable path it has at or below the active level.
//
// EDGE_CPU_ISA=generic|avx2|avx512|avx512_vnni caps the level (tests compare the paths this
// way); a level the CPU lacks is never chosen.
#pragma once

#include <optional>
#include <string_view>

namespace edge::kernels::cpu {

enum class isa { generic, avx2, avx512, avx512_vnni };

// The most capable level this CPU supports, ignoring EDGE_CPU_ISA.
isa supported_isa();
// Decided once per process: supported_isa() capped by EDGE_CPU_ISA.
isa active_isa();
// Whether the active level includes `level`.
inline bool has(isa level) { return active_isa() >= level; }

// Whether the active level is AVX-512 or more and the CPU has AVX-512 VBMI's byte permutes
// (vpermt2b), which the FP8 tiles' kernel decodes its codes with (Ice Lake and Zen 4 on; not
// Skylake-X or Cascade Lake). Without them FP8 matrices keep the row layout.
bool has_byte_permutes();

// Whether INT4 and INT8 weights multiply activations quantized to int8 (integer_dot.h), as they
// do unless EDGE_CPU_ACTIVATIONS=exact asks for the float kernels, the exact reference (to
// measure what the quantization costs, e.g. with `edgeinfer eval`).
bool quantized_activations();

const char* to_string(isa value);
std::optional<isa> parse_isa(std::string_view name);

}  // namespace edge::kernels::cpu
