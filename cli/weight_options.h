// Options shared by every command that loads a model and may quantize it on load.
#pragma once

#include <cstdint>
#include <string>

#include "edge/backend/model/model.h"
#include "edge/common/config.h"

namespace edge::cli {

// --int4-group-size: inputs per scale when --weight-dtype int4 quantizes on load (32 as Kimi
// K2's INT4 release ships, 128 by default).
inline void add_int4_group_size_option(config::schema& s) {
  s.add_choice("int4-group-size", "128", {"32", "64", "128"},
               "int4 weights quantized on load: inputs per scale in each row (rows it does not divide take the "
               "largest power of two that does)");
}

inline void apply_int4_group_size(const config::values& settings, backend::load_options& load) {
  load.int4_group_size = std::stoll(settings.string("int4-group-size"));
}

}  // namespace edge::cli
