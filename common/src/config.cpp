#include "edge/common/config.h"

#include <CLI/CLI.hpp>
#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

#include "edge/common/format.h"

namespace edge::config {
namespace {

constexpr std::string_view config_option = "config";

std::string to_lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return text;
}

// Splits "1.5GiB" into the number 1.5 and the rest "GiB".
bool split_number(std::string_view text, double& number, std::string_view& unit) {
  text = trim(text);
  std::size_t end = 0;
  while (end < text.size() && (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.')) ++end;
  if (end == 0) return false;
  const std::string digits(text.substr(0, end));
  char* parsed_end = nullptr;
  number = std::strtod(digits.c_str(), &parsed_end);
  if (parsed_end != digits.c_str() + digits.size()) return false;
  unit = trim(text.substr(end));
  return true;
}

std::optional<std::int64_t> parse_int(std::string_view text) {
  text = trim(text);
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  std::int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::optional<double> parse_double(std::string_view text) {
  text = trim(text);
  if (text.empty()) return std::nullopt;
  const std::string copy(text);
  char* end = nullptr;
  const double value = std::strtod(copy.c_str(), &end);
  if (end != copy.c_str() + copy.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::optional<bool> parse_bool(std::string_view text) {
  const std::string lower = to_lower(trim(text));
  if (lower == "true" || lower == "yes" || lower == "on" || lower == "1") return true;
  if (lower == "false" || lower == "no" || lower == "off" || lower == "0") return false;
  return std::nullopt;
}

std::string bound_text(const option_spec& spec, std::int64_t bound) {
  switch (spec.kind) {
    case value_kind::bytes: return format_bytes(static_cast<std::uint64_t>(bound));
    case value_kind::duration: return format("{}ms", bound);
    default: return format("{}", bound);
  }
}

std::string range_text(const option_spec& spec) {
  const bool has_min = spec.min != std::numeric_limits<std::int64_t>::min() &&
                       !(spec.min == 0 && spec.kind != value_kind::integer);
  const bool has_max = spec.max != std::numeric_limits<std::int64_t>::max();
  if (has_min && has_max) return format(" from {} to {}", bound_text(spec, spec.min), bound_text(spec, spec.max));
  if (has_min) return format(" of at least {}", bound_text(spec, spec.min));
  if (has_max) return format(" of at most {}", bound_text(spec, spec.max));
  return "";
}

// What a valid value looks like, for error messages.
std::string expectation(const option_spec& spec) {
  switch (spec.kind) {
    case value_kind::string: return "a string";
    case value_kind::path: return "a path";
    case value_kind::choice: {
      std::string text = "one of ";
      for (std::size_t i = 0; i < spec.choices.size(); ++i) {
        if (i > 0) text += i + 1 == spec.choices.size() ? " or " : ", ";
        text += spec.choices[i];
      }
      return text;
    }
    case value_kind::integer: return "an integer" + range_text(spec);
    case value_kind::number: {
      const bool has_min = std::isfinite(spec.min_number);
      const bool has_max = std::isfinite(spec.max_number);
      if (has_min && has_max) return format("a number from {} to {}", spec.min_number, spec.max_number);
      if (has_min) return format("a number of at least {}", spec.min_number);
      if (has_max) return format("a number of at most {}", spec.max_number);
      return "a number";
    }
    case value_kind::boolean: return "true or false";
    case value_kind::bytes: return "a size such as 4096, 512KiB or 4MiB" + range_text(spec);
    case value_kind::duration: return "a duration such as 30s, 250ms or 2m" + range_text(spec);
  }
  return "a value";
}

// Parses text for one option; nullopt when it does not fit.
std::optional<values::value> parse_text(const option_spec& spec, std::string_view text) {
  const auto in_range = [&](std::int64_t v) { return v >= spec.min && v <= spec.max; };
  switch (spec.kind) {
    case value_kind::string:
    case value_kind::path:
      return values::value{std::string(text)};
    case value_kind::choice: {
      const std::string lower = to_lower(trim(text));
      for (const auto& choice : spec.choices) {
        if (choice == lower) return values::value{choice};
      }
      return std::nullopt;
    }
    case value_kind::integer: {
      auto v = parse_int(text);
      if (!v || !in_range(*v)) return std::nullopt;
      return values::value{*v};
    }
    case value_kind::number: {
      auto v = parse_double(text);
      if (!v || *v < spec.min_number || *v > spec.max_number) return std::nullopt;
      return values::value{*v};
    }
    case value_kind::boolean: {
      auto v = parse_bool(text);
      if (!v) return std::nullopt;
      return values::value{*v};
    }
    case value_kind::bytes: {
      auto v = parse_bytes(text);
      if (!v.ok() || !in_range(*v)) return std::nullopt;
      return values::value{*v};
    }
    case value_kind::duration: {
      auto v = parse_duration(text);
      if (!v.ok() || !in_range(v->count())) return std::nullopt;
      return values::value{static_cast<std::int64_t>(v->count())};
    }
  }
  return std::nullopt;
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The closest file key to an unknown one, if any is close enough to be a likely typo.
std::optional<std::string> suggest_key(const schema& options, std::string_view unknown) {
  std::vector<std::string> keys;
  for (const auto& spec : options.options()) {
    if (spec.name != config_option) keys.push_back(spec.file_key());
  }
  std::string normalized(unknown);
  std::replace(normalized.begin(), normalized.end(), '-', '_');
  return closest_name(to_lower(normalized), keys);
}

std::string node_type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    case toml::node_type::none: return "nothing";
  }
  return "a value";
}

// A TOML node as the text the same value would have on the command line, when its type can
// stand for the option's kind; nullopt when the type is wrong (a string for an integer).
std::optional<std::string> node_as_text(const option_spec& spec, const toml::node& node) {
  switch (spec.kind) {
    case value_kind::string:
    case value_kind::path:
    case value_kind::choice:
      if (auto s = node.value<std::string>(); s && node.is_string()) return *s;
      return std::nullopt;
    case value_kind::integer:
      if (node.is_integer()) return format("{}", *node.value<std::int64_t>());
      return std::nullopt;
    case value_kind::number:
      if (node.is_integer()) return format("{}", *node.value<std::int64_t>());
      if (node.is_floating_point()) return format("{}", *node.value<double>());
      return std::nullopt;
    case value_kind::boolean:
      if (node.is_boolean()) return *node.value<bool>() ? "true" : "false";
      return std::nullopt;
    case value_kind::bytes:
      if (node.is_integer()) return format("{}", *node.value<std::int64_t>());
      if (node.is_string()) return *node.value<std::string>();
      return std::nullopt;
    case value_kind::duration:
      if (node.is_integer()) return format("{}", *node.value<std::int64_t>());
      if (node.is_floating_point()) return format("{}", *node.value<double>());
      if (node.is_string()) return *node.value<std::string>();
      return std::nullopt;
  }
  return std::nullopt;
}

struct file_value {
  const toml::node* node;
  std::size_t line;
};

}  // namespace

std::string_view to_string(origin value) {
  switch (value) {
    case origin::default_value: return "default";
    case origin::file: return "config file";
    case origin::environment: return "environment";
    case origin::flag: return "flag";
  }
  return "unknown";
}

std::string option_spec::flag() const { return "--" + name; }

std::string option_spec::env_name() const {
  std::string out = "EDGE_";
  for (char c : name) out += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

std::string option_spec::file_key() const {
  std::string out = name;
  std::replace(out.begin(), out.end(), '-', '_');
  return out;
}

schema::schema() {
  add_path(std::string(config_option), std::nullopt,
           "TOML file of settings; keys are option names with '_' for '-' (e.g. max_body = \"8MiB\")");
}

schema& schema::add(option_spec spec) {
  if (find(spec.name) != nullptr) throw std::logic_error("option defined twice: " + spec.name);
  if (spec.default_text && !parse_text(spec, *spec.default_text)) {
    throw std::logic_error("default of option " + spec.name + " does not parse: " + *spec.default_text);
  }
  options_.push_back(std::move(spec));
  return *this;
}

schema& schema::add_string(std::string name, std::optional<std::string> default_text, std::string help) {
  return add({.name = std::move(name), .kind = value_kind::string, .help = std::move(help),
              .default_text = std::move(default_text)});
}

schema& schema::add_path(std::string name, std::optional<std::string> default_text, std::string help) {
  return add({.name = std::move(name), .kind = value_kind::path, .help = std::move(help),
              .default_text = std::move(default_text)});
}

schema& schema::add_choice(std::string name, std::string default_text, std::vector<std::string> choices,
                           std::string help) {
  return add({.name = std::move(name), .kind = value_kind::choice, .help = std::move(help),
              .default_text = std::move(default_text), .choices = std::move(choices)});
}

schema& schema::add_integer(std::string name, std::int64_t default_value, std::int64_t min, std::int64_t max,
                            std::string help) {
  return add({.name = std::move(name), .kind = value_kind::integer, .help = std::move(help),
              .default_text = format("{}", default_value), .min = min, .max = max});
}

schema& schema::add_number(std::string name, double default_value, double min, double max, std::string help) {
  return add({.name = std::move(name), .kind = value_kind::number, .help = std::move(help),
              .default_text = format("{}", default_value), .min_number = min, .max_number = max});
}

schema& schema::add_boolean(std::string name, bool default_value, std::string help) {
  return add({.name = std::move(name), .kind = value_kind::boolean, .help = std::move(help),
              .default_text = default_value ? "true" : "false"});
}

schema& schema::add_bytes(std::string name, std::string default_text, std::int64_t min, std::int64_t max,
                          std::string help) {
  return add({.name = std::move(name), .kind = value_kind::bytes, .help = std::move(help),
              .default_text = std::move(default_text), .min = min, .max = max});
}

schema& schema::add_duration(std::string name, std::string default_text, std::chrono::milliseconds min,
                             std::chrono::milliseconds max, std::string help) {
  return add({.name = std::move(name), .kind = value_kind::duration, .help = std::move(help),
              .default_text = std::move(default_text), .min = min.count(), .max = max.count()});
}

schema& schema::also_short(char c) {
  if (options_.empty()) throw std::logic_error("also_short before any option");
  for (const auto& spec : options_) {
    if (spec.short_flag == c) throw std::logic_error(format("-{} given to two options", c));
  }
  options_.back().short_flag = c;
  return *this;
}

schema& schema::also_repeatable() {
  if (options_.empty()) throw std::logic_error("also_repeatable before any option");
  if (options_.back().kind != value_kind::string) throw std::logic_error("only a string option may be repeatable");
  options_.back().repeatable = true;
  return *this;
}

schema& schema::also_positional() {
  if (options_.empty()) throw std::logic_error("also_positional before any option");
  for (const auto& spec : options_) {
    if (spec.positional) throw std::logic_error("two positional options");
  }
  options_.back().positional = true;
  return *this;
}

const option_spec* schema::find(std::string_view name) const {
  for (const auto& spec : options_) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

bool values::has(std::string_view name) const {
  auto it = entries_.find(name);
  return it != entries_.end() && !std::holds_alternative<std::monostate>(it->second.parsed);
}

origin values::source_of(std::string_view name) const { return at(name).source; }

const values::entry& values::at(std::string_view name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw std::logic_error("no such option: " + std::string(name));
  return it->second;
}

namespace {
template <class T>
const T& get_as(const values::entry& e, std::string_view name) {
  if (const T* v = std::get_if<T>(&e.parsed)) return *v;
  throw std::logic_error("option " + std::string(name) + " is unset or of another type");
}
}  // namespace

const std::string& values::string(std::string_view name) const { return get_as<std::string>(at(name), name); }
std::int64_t values::integer(std::string_view name) const { return get_as<std::int64_t>(at(name), name); }
double values::number(std::string_view name) const { return get_as<double>(at(name), name); }
bool values::boolean(std::string_view name) const { return get_as<bool>(at(name), name); }
std::uint64_t values::bytes(std::string_view name) const {
  return static_cast<std::uint64_t>(get_as<std::int64_t>(at(name), name));
}
std::chrono::milliseconds values::duration(std::string_view name) const {
  return std::chrono::milliseconds(get_as<std::int64_t>(at(name), name));
}
std::optional<std::string> values::optional_string(std::string_view name) const {
  if (!has(name)) return std::nullopt;
  return string(name);
}

std::string values::describe() const {
  std::string out;
  for (const auto& [name, e] : entries_) {
    if (std::holds_alternative<std::monostate>(e.parsed)) continue;
    if (!out.empty()) out += ", ";
    out += name;
    out += '=';
    // Credentials never reach a log line.
    if (name.find("token") != std::string::npos || name.find("secret") != std::string::npos ||
        name.find("password") != std::string::npos || name.find("api-key") != std::string::npos) {
      out += format("<redacted> ({})", to_string(e.source));
      continue;
    }
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, std::string>) out += v;
          else if constexpr (!std::is_same_v<T, std::monostate>) out += format("{}", v);
        },
        e.parsed);
    out += format(" ({})", to_string(e.source));
  }
  return out;
}

void values::set(std::string name, entry settled) { entries_[std::move(name)] = std::move(settled); }

std::optional<std::string> closest_name(std::string_view unknown, const std::vector<std::string>& names) {
  std::optional<std::string> best;
  std::size_t best_distance = std::max<std::size_t>(2, unknown.size() / 3) + 1;
  for (const std::string& name : names) {
    const std::size_t distance = edit_distance(unknown, name);
    if (distance < best_distance) {
      best_distance = distance;
      best = name;
    }
  }
  return best;
}

result<std::int64_t> parse_bytes(std::string_view text) {
  double number = 0;
  std::string_view unit;
  if (!split_number(text, number, unit)) return invalid_argument(format("not a size: \"{}\"", text));
  const std::string u = to_lower(unit);
  double scale = 0;
  if (u.empty() || u == "b") scale = 1;
  else if (u == "k" || u == "kb") scale = 1e3;
  else if (u == "ki" || u == "kib") scale = 1024.0;
  else if (u == "m" || u == "mb") scale = 1e6;
  else if (u == "mi" || u == "mib") scale = 1024.0 * 1024;
  else if (u == "g" || u == "gb") scale = 1e9;
  else if (u == "gi" || u == "gib") scale = 1024.0 * 1024 * 1024;
  else if (u == "t" || u == "tb") scale = 1e12;
  else if (u == "ti" || u == "tib") scale = 1024.0 * 1024 * 1024 * 1024;
  else return invalid_argument(format("unknown size unit \"{}\" in \"{}\"", unit, text));
  const double bytes = std::round(number * scale);
  if (bytes > 9.0e18) return out_of_range(format("size too large: \"{}\"", text));
  return static_cast<std::int64_t>(bytes);
}

result<std::chrono::milliseconds> parse_duration(std::string_view text) {
  double number = 0;
  std::string_view unit;
  if (!split_number(text, number, unit)) return invalid_argument(format("not a duration: \"{}\"", text));
  const std::string u = to_lower(unit);
  double ms_per_unit = 0;
  if (u == "ms") ms_per_unit = 1;
  else if (u.empty() || u == "s") ms_per_unit = 1000;
  else if (u == "m" || u == "min") ms_per_unit = 60'000;
  else if (u == "h") ms_per_unit = 3'600'000;
  else if (u == "d") ms_per_unit = 86'400'000;
  else return invalid_argument(format("unknown duration unit \"{}\" in \"{}\"", unit, text));
  const double ms = std::round(number * ms_per_unit);
  if (ms > 9.0e15) return out_of_range(format("duration too long: \"{}\"", text));
  return std::chrono::milliseconds(static_cast<std::int64_t>(ms));
}

result<values> resolve(const schema& options, const sources& from) {
  const auto getenv = [&](const std::string& name) -> std::optional<std::string> {
    std::optional<std::string> v;
    if (from.getenv) {
      v = from.getenv(name);
    } else if (const char* raw = std::getenv(name.c_str())) {
      v = std::string(raw);
    }
    // An empty variable counts as unset, as `EDGE_PORT= edgeinfer serve` intends.
    if (v && v->empty()) return std::nullopt;
    return v;
  };

  std::vector<std::string> errors;
  for (const auto& [name, text] : from.flags) {
    if (options.find(name) == nullptr) errors.push_back(format("unknown option --{}", name));
  }

  // The file named by --config or EDGE_CONFIG.
  const option_spec& config_spec = *options.find(config_option);
  std::optional<std::string> file_path;
  std::string file_label;
  if (auto it = from.flags.find(std::string(config_option)); it != from.flags.end()) {
    file_path = it->second;
  } else {
    file_path = getenv(config_spec.env_name());
  }
  toml::table table;
  std::map<std::string, file_value> file_values;
  if (file_path) {
    file_label = *file_path;
    try {
      table = toml::parse_file(*file_path);
    } catch (const toml::parse_error& e) {
      const auto& where = e.source().begin;
      if (where.line == 0) {
        return invalid_argument(format("cannot read config file {}: {}", *file_path, e.description()));
      }
      return invalid_argument(format("config file {} line {}, column {}: {}", *file_path, where.line,
                                     where.column, e.description()));
    }
    for (auto&& [key, node] : table) {
      const std::string key_text(key.str());
      const option_spec* match = nullptr;
      for (const auto& spec : options.options()) {
        if (spec.name != config_option && spec.file_key() == key_text) match = &spec;
      }
      const std::size_t line = key.source().begin.line;
      if (match == nullptr) {
        std::string message = format("unknown key \"{}\" in {} (line {})", key_text, file_label, line);
        if (auto suggestion = suggest_key(options, key_text)) {
          message += format("; did you mean \"{}\"?", *suggestion);
        }
        errors.push_back(std::move(message));
        continue;
      }
      file_values[match->name] = {&node, line};
    }
  }

  values out;
  for (const auto& spec : options.options()) {
    values::entry e;
    std::optional<std::string> text;
    std::string where;
    if (auto it = from.flags.find(spec.name); it != from.flags.end()) {
      text = it->second;
      e.source = origin::flag;
      where = "flag " + spec.flag();
    } else if (auto env = getenv(spec.env_name())) {
      text = *env;
      e.source = origin::environment;
      where = "environment variable " + spec.env_name();
    } else if (auto fv = file_values.find(spec.name); fv != file_values.end()) {
      e.source = origin::file;
      where = format("{} line {}", file_label, fv->second.line);
      text = node_as_text(spec, *fv->second.node);
      if (!text) {
        errors.push_back(format("invalid value for {} ({}): expected {}, found {}", spec.name, where,
                                expectation(spec), node_type_name(*fv->second.node)));
        continue;
      }
    } else if (spec.default_text) {
      text = *spec.default_text;
      e.source = origin::default_value;
    }

    if (text) {
      auto parsed = parse_text(spec, *text);
      if (!parsed) {
        errors.push_back(format("invalid value \"{}\" for {} ({}): expected {}", *text, spec.name, where,
                                expectation(spec)));
        continue;
      }
      e.parsed = std::move(*parsed);
    }
    out.set(spec.name, std::move(e));
  }

  if (!errors.empty()) {
    std::string message = errors.size() == 1 ? errors.front() : "configuration errors:";
    if (errors.size() > 1) {
      for (const auto& error : errors) message += "\n  " + error;
    }
    return invalid_argument(std::move(message));
  }
  return out;
}

cli_binding::cli_binding(CLI::App& app, const schema& options) {
  for (const auto& spec : options.options()) {
    std::string help = spec.help;
    if (spec.default_text && !spec.default_text->empty()) help += format(" [default: {}]", *spec.default_text);
    help += format(" [env: {}]", spec.env_name());
    const std::string name = spec.name;
    if (spec.kind == value_kind::boolean) {
      app.add_flag_callback(spec.flag(), [this, name] { given_[name] = "true"; }, help);
      app.add_flag_callback("--no-" + spec.name, [this, name] { given_[name] = "false"; },
                            "Turn off " + spec.flag());
      continue;
    }
    std::string names = spec.flag();
    if (spec.short_flag != 0) names = format("-{},{}", spec.short_flag, names);
    if (spec.positional) names = format("{},{}", spec.name, names);
    CLI::Option* option = nullptr;
    if (spec.repeatable) {
      option = app.add_option_function<std::vector<std::string>>(
          names,
          [this, name](const std::vector<std::string>& values) {
            std::string joined;
            for (const auto& value : values) joined += (joined.empty() ? "" : ",") + value;
            given_[name] = joined;
          },
          help);
      option->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)->expected(1)->allow_extra_args(false);
    } else {
      option = app.add_option_function<std::string>(
          names, [this, name](const std::string& value) { given_[name] = value; }, help);
    }
    switch (spec.kind) {
      case value_kind::integer: option->type_name("INT"); break;
      case value_kind::number: option->type_name("NUMBER"); break;
      case value_kind::bytes: option->type_name("BYTES"); break;
      case value_kind::duration: option->type_name("DURATION"); break;
      case value_kind::path: option->type_name("PATH"); break;
      case value_kind::choice: {
        std::string choices;
        for (const auto& c : spec.choices) choices += (choices.empty() ? "" : "|") + c;
        option->type_name(choices);
        break;
      }
      default: option->type_name("TEXT"); break;
    }
  }
}

}  // namespace edge::config
