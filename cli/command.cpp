#include "command.h"

#include <cstdio>

#include "edge/common/log.h"

namespace edge::cli {

command::command(CLI::App& parent, std::string name, std::string description, config::schema options, body run)
    : app_(parent.add_subcommand(std::move(name), std::move(description))),
      options_(std::move(options)),
      run_(std::move(run)) {
  options_.add_choice("log-level", "info", {"trace", "debug", "info", "warn", "error", "off"},
                      "Least severe log level written");
  options_.add_choice("log-format", "text", {"text", "json"},
                      "Log lines as readable text or as JSON objects, one per line");
  binding_ = std::make_unique<config::cli_binding>(*app_, options_);
}

int command::execute() const {
  auto settled = config::resolve(options_, {.flags = binding_->given(), .getenv = {}});
  if (!settled.ok()) {
    std::fprintf(stderr, "edgeinfer %s: %s\n", app_->get_name().c_str(), settled.error().message().c_str());
    return 2;
  }
  log::set_level(*log::parse_level(settled->string("log-level")));
  log::set_format(*log::parse_format(settled->string("log-format")));
  return run_(*settled);
}

std::vector<std::string> split_list(std::string_view text, std::string_view separators) {
  std::vector<std::string> out;
  std::string item;
  for (const char c : text) {
    if (separators.find(c) != std::string_view::npos) {
      if (!item.empty()) out.push_back(std::move(item));
      item.clear();
    } else {
      item += c;
    }
  }
  if (!item.empty()) out.push_back(std::move(item));
  return out;
}

}  // namespace edge::cli
