// Options shared by every command that loads a model and may quantize it on load.
#pragma once

#include <cstdint>
#include <string>

#include "edge/backend/model/model.h"
#include "edge/common/config.h"

namespace edge::cli {

// How --weight-dtype quantizes on load: --int4-group-size, inputs per scale for int4 (32 as Kimi
// K2's INT4 release ships, 128 by default), and --quantize-layers, which projections take it
// (all, the routed experts only, as Kimi K2's INT4 release has them, or all and the classifier,
// as llama.cpp's quantized files have them).
inline void add_quantize_on_load_options(config::schema& s) {
  s.add_choice("int4-group-size", "128", {"32", "64", "128"},
               "int4 weights quantized on load: inputs per scale in each row (rows it does not divide take the "
               "largest power of two that does)");
  s.add_choice("quantize-layers", "all", {"all", "experts", "all-and-classifier"},
               "Which matrices --weight-dtype applies to: all projections, only a Mixture-of-Experts model's routed "
               "experts (attention, dense MLPs and shared experts stay as stored, as Kimi K2's INT4 release ships), "
               "or all projections and the classifier (as llama.cpp's quantized GGUF files have it; a token "
               "embedding tied to it stays as stored)");
}

inline void apply_quantize_on_load(const config::values& settings, backend::load_options& load) {
  load.int4_group_size = std::stoll(settings.string("int4-group-size"));
  load.quantize_experts_only = settings.string("quantize-layers") == "experts";
  load.quantize_classifier = settings.string("quantize-layers") == "all-and-classifier";
}

}  // namespace edge::cli
