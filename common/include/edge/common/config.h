// Layered configuration with one precedence for every setting:
//
//   command-line flag  >  EDGE_* environment variable  >  TOML config file  >  default
//
// An option named "max-body" is the flag --max-body, the variable EDGE_MAX_BODY and the file
// key max_body. The file is named by --config or EDGE_CONFIG. Unknown file keys and bad values
// are errors that name the option, the source and what was expected, e.g.
//
//   invalid value "80x" for port (environment variable EDGE_PORT): expected an integer from 0 to 65535
//   unknown key "prot" in edge.toml (line 3); did you mean "port"?
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "edge/common/status.h"

namespace CLI {
class App;
}

namespace edge::config {

enum class value_kind {
  string,    // any text
  path,      // a filesystem path (text; existence is the user's concern)
  choice,    // one of option_spec::choices
  integer,   // a whole number within [min, max]
  number,    // a real number within [min_number, max_number]
  boolean,   // true/false, yes/no, on/off, 1/0; flags --name and --no-name
  bytes,     // 4194304, 4MiB, 1.5GiB, 512KB (KB = 1000, KiB = 1024), within [min, max]
  duration,  // 30s, 250ms, 2m, 1h; a bare number is seconds; stored in ms within [min, max]
};

enum class origin { default_value, file, environment, flag };
std::string_view to_string(origin value);

struct option_spec {
  std::string name;  // kebab-case
  value_kind kind = value_kind::string;
  std::string help;
  std::optional<std::string> default_text;  // none: the option is unset unless given
  std::int64_t min = std::numeric_limits<std::int64_t>::min();
  std::int64_t max = std::numeric_limits<std::int64_t>::max();
  double min_number = -std::numeric_limits<double>::infinity();
  double max_number = std::numeric_limits<double>::infinity();
  std::vector<std::string> choices;
  // Other spellings on the command line: a one-letter flag (`-m`, as llama.cpp's server has it)
  // and the command's positional argument (`serve MODEL`, as `vllm serve MODEL`).
  char short_flag = 0;
  bool positional = false;
  // The flag may be given several times (`--api-key A --api-key B`); the values settle as one
  // comma-separated list, as the environment variable and the file key spell it ("A,B").
  bool repeatable = false;

  std::string flag() const;      // --max-body
  std::string env_name() const;  // EDGE_MAX_BODY
  std::string file_key() const;  // max_body
};

// The options one command accepts. The option "config" (the file to read) is always present.
class schema {
 public:
  schema();

  schema& add(option_spec spec);
  schema& add_string(std::string name, std::optional<std::string> default_text, std::string help);
  schema& add_path(std::string name, std::optional<std::string> default_text, std::string help);
  schema& add_choice(std::string name, std::string default_text, std::vector<std::string> choices,
                     std::string help);
  schema& add_integer(std::string name, std::int64_t default_value, std::int64_t min,
                      std::int64_t max, std::string help);
  schema& add_number(std::string name, double default_value, double min, double max,
                     std::string help);
  schema& add_boolean(std::string name, bool default_value, std::string help);
  schema& add_bytes(std::string name, std::string default_text, std::int64_t min, std::int64_t max,
                    std::string help);
  schema& add_duration(std::string name, std::string default_text, std::chrono::milliseconds min,
                       std::chrono::milliseconds max, std::string help);

  // The option added last also answers to `-c` / is the command's positional argument.
  schema& also_short(char c);
  schema& also_positional();
  // The option added last may be given several times on the command line (option_spec::repeatable).
  schema& also_repeatable();

  const option_spec* find(std::string_view name) const;
  const std::vector<option_spec>& options() const { return options_; }

 private:
  std::vector<option_spec> options_;
};

// The settled configuration: each option's typed value and where it came from.
class values {
 public:
  using value = std::variant<std::monostate, std::string, std::int64_t, double, bool>;

  struct entry {
    value parsed;   // bytes and durations (ms) are int64
    origin source = origin::default_value;
  };

  bool has(std::string_view name) const;  // false only for an unset option without a default
  origin source_of(std::string_view name) const;

  // Typed access. Asking for an option the schema does not define, or with the wrong type,
  // is a programming error and throws std::logic_error.
  const std::string& string(std::string_view name) const;
  std::int64_t integer(std::string_view name) const;
  double number(std::string_view name) const;
  bool boolean(std::string_view name) const;
  std::uint64_t bytes(std::string_view name) const;
  std::chrono::milliseconds duration(std::string_view name) const;
  std::optional<std::string> optional_string(std::string_view name) const;

  // "host=127.0.0.1 (default), port=8080 (flag), ..." for a start-up log line. Values of options
  // whose names hold "token", "secret", "password" or "api-key" are shown as <redacted>.
  std::string describe() const;

  void set(std::string name, entry settled);

 private:
  const entry& at(std::string_view name) const;
  std::map<std::string, entry, std::less<>> entries_;
};

// Where values come from. Tests supply all three; the program fills them from argv, the
// process environment and the file that --config / EDGE_CONFIG names.
struct sources {
  std::map<std::string, std::string> flags;  // option name -> text given on the command line
  std::function<std::optional<std::string>(const std::string& name)> getenv;  // empty: ::getenv
};

// Resolves every option of the schema. All problems are reported together, one per line.
result<values> resolve(const schema& options, const sources& from);

// The name among `names` closest to a mistyped one, if one is close enough to be the likely
// intent (an edit distance of at most a third of its length, and at least 2): the "did you
// mean" of an unknown file key, flag or command.
std::optional<std::string> closest_name(std::string_view unknown, const std::vector<std::string>& names);

// Parses a byte size ("4MiB", "1.5GiB", "512KB", "4096"). Exposed for reuse and tests.
result<std::int64_t> parse_bytes(std::string_view text);
// Parses a duration ("30s", "250ms", "2m", "1h", "1.5"): milliseconds.
result<std::chrono::milliseconds> parse_duration(std::string_view text);

// Registers one CLI11 option per schema entry on `app` (booleans as --name/--no-name) and
// records which were given. The help text of each shows its default and variable name.
class cli_binding {
 public:
  cli_binding(CLI::App& app, const schema& options);
  cli_binding(const cli_binding&) = delete;
  cli_binding& operator=(const cli_binding&) = delete;

  // The flags given on the command line, after app.parse().
  const std::map<std::string, std::string>& given() const { return given_; }

 private:
  std::map<std::string, std::string> given_;
};

}  // namespace edge::config
