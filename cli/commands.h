// The subcommands of edgeinfer, one factory each (cli/<name>_command.cpp).
#pragma once

#include "command.h"

namespace edge::cli {

command make_serve_command(CLI::App& app);

}  // namespace edge::cli
