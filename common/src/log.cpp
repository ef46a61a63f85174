#include "edge/common/log.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <mutex>

#include "edge/common/json_text.h"
#include "edge/common/utf8.h"

namespace edge::log {
namespace {

std::atomic<int> g_level{static_cast<int>(level::info)};
std::atomic<int> g_format{static_cast<int>(format::text)};

// Guards the sink and keeps whole lines together for custom sinks.
std::mutex& sink_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::function<void(std::string_view)>& sink() {
  static std::function<void(std::string_view)> instance;
  return instance;
}

void write_stderr(std::string_view line) {
  const char* data = line.data();
  std::size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, data, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // nowhere left to report a failing stderr
    }
    data += n;
    left -= static_cast<std::size_t>(n);
  }
}

// 2026-11-30T00:20:26.123Z
void append_timestamp(std::string& out) {
  const auto now = std::chrono::system_clock::now();
  const auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  const std::time_t seconds = static_cast<std::time_t>(millis / 1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  std::array<char, 32> buffer{};
  const std::size_t n = std::strftime(buffer.data(), buffer.size(), "%Y-%m-%dT%H:%M:%S", &utc);
  out.append(buffer.data(), n);
  const int ms = static_cast<int>(millis % 1000);
  out += '.';
  out += static_cast<char>('0' + ms / 100);
  out += static_cast<char>('0' + ms / 10 % 10);
  out += static_cast<char>('0' + ms % 10);
  out += 'Z';
}

constexpr char hex_digits[] = "0123456789abcdef";

void append_hex_escape(std::string& out, std::string_view prefix, unsigned value, int digits) {
  out += prefix;
  for (int shift = 4 * (digits - 1); shift >= 0; shift -= 4) out += hex_digits[(value >> shift) & 0xF];
}

// Text lines hold one entry each, whatever a message or a field value holds (a tenant name, a
// path, a header a client chose): control characters (C0, DEL and C1, which terminals act on),
// and bytes that are not valid UTF-8, are written as escapes, and a backslash always starts
// one, so that what is read back is unambiguous. `quote` is escaped as well, for quoted values.
void append_escaped(std::string& out, std::string_view text, char quote = '\0') {
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x80) {
      const std::size_t length = utf8::valid_length(text, i);
      if (length == 0) {
        append_hex_escape(out, "\\x", c, 2);
        ++i;
        continue;
      }
      const char32_t code_point = utf8::decode(text.substr(i), length);
      if (code_point <= 0x9F) {
        append_hex_escape(out, "\\u", static_cast<unsigned>(code_point), 4);
      } else {
        out.append(text.substr(i, length));
      }
      i += length;
      continue;
    }
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\\': out += "\\\\"; break;
      default:
        if (c < 0x20 || c == 0x7F) {
          append_hex_escape(out, "\\x", c, 2);
        } else {
          if (quote != '\0' && c == static_cast<unsigned char>(quote)) out += '\\';
          out += static_cast<char>(c);
        }
    }
    ++i;
  }
}

// A value that could be read as more than one field (it holds a space or '=', or looks quoted)
// or as none (empty) is quoted.
void append_field_value(std::string& out, std::string_view value) {
  const bool quoted = value.empty() || value.front() == '"' || value.find_first_of(" =") != std::string_view::npos;
  if (!quoted) {
    append_escaped(out, value);
    return;
  }
  out += '"';
  append_escaped(out, value, '"');
  out += '"';
}

}  // namespace

std::optional<level> parse_level(std::string_view name) {
  if (name == "trace") return level::trace;
  if (name == "debug") return level::debug;
  if (name == "info") return level::info;
  if (name == "warn" || name == "warning") return level::warn;
  if (name == "error") return level::error;
  if (name == "off") return level::off;
  return std::nullopt;
}

std::optional<format> parse_format(std::string_view name) {
  if (name == "text") return format::text;
  if (name == "json") return format::json;
  return std::nullopt;
}

std::string_view to_string(level value) {
  switch (value) {
    case level::trace: return "trace";
    case level::debug: return "debug";
    case level::info: return "info";
    case level::warn: return "warn";
    case level::error: return "error";
    case level::off: return "off";
  }
  return "unknown";
}

void set_level(level value) { g_level.store(static_cast<int>(value), std::memory_order_relaxed); }
void set_format(format value) { g_format.store(static_cast<int>(value), std::memory_order_relaxed); }

void set_sink(std::function<void(std::string_view)> new_sink) {
  std::lock_guard lock(sink_mutex());
  sink() = std::move(new_sink);
}

bool enabled(level value) noexcept {
  return value != level::off &&
         static_cast<int>(value) >= g_level.load(std::memory_order_relaxed);
}

void emit(level value, std::string_view component, std::string_view message) { emit(value, component, message, {}); }

void emit(level value, std::string_view component, std::string_view message, std::span<const field> fields) {
  std::string line;
  line.reserve(64 + component.size() + message.size() + 24 * fields.size());
  if (static_cast<format>(g_format.load(std::memory_order_relaxed)) == format::json) {
    line += "{\"ts\":\"";
    append_timestamp(line);
    line += "\",\"level\":\"";
    line += to_string(value);
    line += "\",\"component\":";
    append_json_string(line, component);
    line += ",\"msg\":";
    append_json_string(line, message);
    for (const field& f : fields) {
      line += ',';
      append_json_string(line, f.key);
      line += ':';
      // A number field's text comes from the caller: written bare only when it is one.
      if (f.number && is_json_number(f.value)) {
        line += f.value;
      } else {
        append_json_string(line, f.value);
      }
    }
    line += "}\n";
  } else {
    append_timestamp(line);
    line += ' ';
    const std::string_view name = to_string(value);
    line += name;
    line.append(6 - name.size(), ' ');
    line += component;
    line += ": ";
    append_escaped(line, message);
    for (const field& f : fields) {
      line += ' ';
      line += f.key;
      line += '=';
      append_field_value(line, f.value);
    }
    line += '\n';
  }
  std::lock_guard lock(sink_mutex());
  if (sink()) {
    sink()(line);
  } else {
    write_stderr(line);
  }
}

}  // namespace edge::log
