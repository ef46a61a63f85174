#include "edge/common/log.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <mutex>

#include "edge/common/json_text.h"

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
      if (f.number) {
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
    line += message;
    for (const field& f : fields) {
      line += ' ';
      line += f.key;
      line += '=';
      line += f.value;
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
