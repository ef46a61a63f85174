// edgeinfer: one binary, one subcommand per front end (DESIGN.md, "Layout").
#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdio>
#include <exception>
#include <vector>

#include "commands.h"
#include "edge/common/format.h"
#include "edge/common/version.h"

int main(int argc, char** argv) {
  // Writes to a closed socket must fail with EPIPE, not kill the process.
  std::signal(SIGPIPE, SIG_IGN);

  CLI::App app{"edgeinfer: an LLM serving stack for one GPU host", "edgeinfer"};
  app.set_version_flag("--version",
                       edge::format("edgeinfer {} (commit {}, CUDA {})", edge::version_string(), edge::git_commit(),
                                    edge::cuda_compiled() ? "built" : "not built"));
  app.require_subcommand(1, 1);
  app.footer("Every option can also be set by an EDGE_* environment variable or a TOML file named by --config;\n"
             "a flag wins over the environment, which wins over the file. `edgeinfer COMMAND --help` lists them.");

  std::vector<edge::cli::command> commands;
  commands.push_back(edge::cli::make_serve_command(app));
  commands.push_back(edge::cli::make_backend_command(app));
  commands.push_back(edge::cli::make_gateway_command(app));
  commands.push_back(edge::cli::make_make_model_command(app));
  commands.push_back(edge::cli::make_tokenize_command(app));
  commands.push_back(edge::cli::make_render_chat_command(app));
  commands.push_back(edge::cli::make_generate_command(app));
  commands.push_back(edge::cli::make_eval_command(app));
  commands.push_back(edge::cli::make_quantize_command(app));
  commands.push_back(edge::cli::make_admin_command(app));
  commands.push_back(edge::cli::make_bench_command(app));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    for (const auto& command : commands) {
      if (command.chosen()) return command.execute();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "edgeinfer: fatal: %s\n", e.what());
    return 1;
  }
  return 2;
}
