// `edgeinfer serve`: the gateway with the engine in the same process (the default topology).
#pragma once

#include "command.h"

namespace edge::cli {

command make_serve_command(CLI::App& app);

}  // namespace edge::cli
