// edgeinfer: one binary, one subcommand per front end (DESIGN.md, "Layout").
#include <CLI/CLI.hpp>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "commands.h"
#include "edge/common/config.h"
#include "edge/common/format.h"
#include "edge/common/version.h"

namespace {

// "edgeinfer admin keys": the command line's words that name `app`.
std::string command_path(const CLI::App& app) {
  std::string path = app.get_name();
  for (const CLI::App* parent = app.get_parent(); parent != nullptr; parent = parent->get_parent()) {
    path = parent->get_name() + " " + path;
  }
  return path;
}

std::vector<std::string> subcommand_names(CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) names.push_back(sub->get_name());
  return names;
}

// "; did you mean "x"?" when one of `names` is close to `word`.
std::string did_you_mean(std::string_view word, const std::vector<std::string>& names) {
  const auto nearest = edge::config::closest_name(word, names);
  return nearest ? edge::format("; did you mean \"{}\"?", *nearest) : std::string();
}

// A command-line mistake as a configuration mistake is told: what is wrong, the likely intent,
// where to look; exit code 2. Help and --version pass through CLI11 (exit 0).
int report_parse_error(CLI::App& app, const CLI::ParseError& e) {
  const std::string kind = e.get_name();
  if (kind == "CallForHelp" || kind == "CallForAllHelp" || kind == "CallForVersion") return app.exit(e);
  CLI::App* at = &app;  // the deepest command the words reached
  for (auto subs = at->get_subcommands(); !subs.empty(); subs = at->get_subcommands()) at = subs.front();
  const std::string where = command_path(*at);
  const std::vector<std::string> commands = subcommand_names(*at);
  // What no command took; a command that falls through (admin's) leaves it to its parent.
  std::vector<std::string> extra;
  for (const CLI::App* a = at; a != nullptr && extra.empty(); a = a->get_parent()) extra = a->remaining();
  std::string message;
  if (const auto option = std::find_if(extra.begin(), extra.end(), [](const std::string& w) { return w.starts_with('-'); });
      option != extra.end()) {
    const std::string flag = option->substr(0, option->find('='));
    std::vector<std::string> flags{"--help"};
    for (CLI::App* a = at; a != nullptr; a = a->get_parent()) {
      for (const CLI::Option* o : a->get_options()) {
        for (const std::string& name : o->get_lnames()) flags.push_back("--" + name);
        for (const std::string& name : o->get_snames()) flags.push_back("-" + name);
      }
    }
    message = edge::format("unknown option \"{}\"{}", flag, did_you_mean(flag, flags));
  } else if (!extra.empty() && !commands.empty()) {
    message = edge::format("unknown command \"{}\"{}", extra.front(), did_you_mean(extra.front(), commands));
  } else if (!extra.empty()) {
    message = edge::format("unexpected argument \"{}\"", extra.front());
  } else if (!commands.empty() && kind == "RequiredError" && at->get_subcommands().empty()) {
    std::string list;
    for (const std::string& c : commands) list += (list.empty() ? "" : ", ") + c;
    message = edge::format("a command is required: {}", list);
  } else {
    message = e.what();
  }
  std::fprintf(stderr, "%s: %s\nRun \"%s --help\" for %s.\n", where.c_str(), message.c_str(), where.c_str(),
               commands.empty() ? "its options" : "its commands and options");
  return 2;
}

// `edgeinfer help [COMMAND...]`: the help of that command, as `COMMAND --help` prints it.
int print_help(CLI::App& app, int argc, char** argv) {
  CLI::App* at = &app;
  for (int i = 2; i < argc; ++i) {
    const std::string word = argv[i];
    CLI::App* next = nullptr;
    for (CLI::App* sub : at->get_subcommands([](CLI::App*) { return true; })) {
      if (sub->get_name() == word) next = sub;
    }
    if (next == nullptr) {
      std::fprintf(stderr, "%s: unknown command \"%s\"%s\nRun \"%s --help\" for its commands.\n",
                   command_path(*at).c_str(), word.c_str(), did_you_mean(word, subcommand_names(*at)).c_str(),
                   command_path(*at).c_str());
      return 2;
    }
    at = next;
  }
  std::fputs(at->help(at->get_parent() != nullptr ? command_path(*at->get_parent()) : "").c_str(), stdout);
  return 0;
}

}  // namespace

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

  if (argc >= 2 && std::string_view(argv[1]) == "help") return print_help(app, argc, argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return report_parse_error(app, e);
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
