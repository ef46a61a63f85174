// A subcommand of edgeinfer: its CLI11 app, its configuration schema and what it runs.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "edge/common/config.h"

namespace edge::cli {

class command {
 public:
  using body = std::function<int(const config::values&)>;

  // Registers the subcommand `name` on `parent`. `options` gets the options every command has
  // (log-level, log-format) added before it is bound to the command line.
  command(CLI::App& parent, std::string name, std::string description, config::schema options, body run);

  bool chosen() const { return app_->parsed(); }
  // The command's CLI11 app: for commands with subcommands of their own (`admin tenants list`)
  // and for adjusting how an option is read (e.g. several values).
  CLI::App& app() const { return *app_; }

  // Settles the configuration (flag > env > file > default), applies the logging options and
  // runs the body. Returns the process exit code: 2 for a configuration error.
  int execute() const;

 private:
  CLI::App* app_;
  config::schema options_;
  std::unique_ptr<config::cli_binding> binding_;
  body run_;
};

// The items of an option that takes a list: separated by commas or whitespace (or by the
// characters of `separators`), empty items dropped ("a, b,,c" gives a, b, c).
std::vector<std::string> split_list(std::string_view text, std::string_view separators = ", \n\t");

}  // namespace edge::cli
