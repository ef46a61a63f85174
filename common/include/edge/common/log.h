// Process-wide logging: human-readable lines by default, JSON lines with --log-format json.
//
//   edge::logger log{"gateway"};
//   log.info("listening on http://{}:{}", host, port);
//
// Text:  2026-11-30T00:20:26.123Z info  gateway: listening on http://127.0.0.1:8080
// JSON:  {"ts":"2026-11-30T00:20:26.123Z","level":"info","component":"gateway","msg":"..."}
//
// Each line is written whole with one write(2), so lines from several threads never mix, and
// holds one entry whatever its message and fields contain: text lines write control
// characters (newline, CR, the other C0 controls, DEL, C1), bytes that are not valid UTF-8 and
// the backslash as escapes (\n, \x1b, \u0085, \\), JSON lines escape them as JSON does.
// configure() is meant for start-up; the level check on the hot path is one relaxed load.
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "edge/common/format.h"

namespace edge::log {

enum class level { trace = 0, debug, info, warn, error, off };
enum class format { text, json };

std::optional<level> parse_level(std::string_view name);
std::optional<format> parse_format(std::string_view name);
std::string_view to_string(level value);

void set_level(level value);
void set_format(format value);
// Replaces stderr as the destination (tests capture lines with it). Each call receives one
// complete line, newline included. Pass an empty function to restore stderr.
void set_sink(std::function<void(std::string_view line)> sink);

bool enabled(level value) noexcept;
void emit(level value, std::string_view component, std::string_view message);

// A named value carried beside a line's message: appended as ` key=value` to text lines (the
// value in quotes when it is empty or holds a space, an '=' or a leading quote), and as a
// top-level member of JSON lines (a number when `number` and `value` is a JSON number, else a
// string), so that access logs can be filtered by field.
struct field {
  std::string_view key;
  std::string value;
  bool number = false;  // `value` is a JSON number (written unquoted)
};
void emit(level value, std::string_view component, std::string_view message, std::span<const field> fields);

}  // namespace edge::log

namespace edge {

// A named source of log lines; cheap to copy, safe to share between threads.
class logger {
 public:
  explicit logger(std::string component) : component_(std::move(component)) {}

  template <class... Args>
  void log(log::level value, std::string_view pattern, const Args&... args) const {
    if (log::enabled(value)) log::emit(value, component_, edge::format(pattern, args...));
  }
  template <class... Args>
  void trace(std::string_view pattern, const Args&... args) const { log(log::level::trace, pattern, args...); }
  template <class... Args>
  void debug(std::string_view pattern, const Args&... args) const { log(log::level::debug, pattern, args...); }
  template <class... Args>
  void info(std::string_view pattern, const Args&... args) const { log(log::level::info, pattern, args...); }
  template <class... Args>
  void warn(std::string_view pattern, const Args&... args) const { log(log::level::warn, pattern, args...); }
  template <class... Args>
  void error(std::string_view pattern, const Args&... args) const { log(log::level::error, pattern, args...); }

  const std::string& component() const { return component_; }

 private:
  std::string component_;
};

}  // namespace edge
