// The subcommands of edgeinfer, one factory each (cli/<name>_command.cpp).
#pragma once

#include "command.h"

namespace edge::cli {

command make_serve_command(CLI::App& app);
command make_make_model_command(CLI::App& app);
command make_tokenize_command(CLI::App& app);
command make_render_chat_command(CLI::App& app);
command make_generate_command(CLI::App& app);
command make_eval_command(CLI::App& app);
command make_quantize_command(CLI::App& app);
command make_admin_command(CLI::App& app);
command make_bench_command(CLI::App& app);
command make_backend_command(CLI::App& app);
command make_gateway_command(CLI::App& app);

}  // namespace edge::cli
