#include "edge/common/format.h"

#include <array>
#include <cmath>

namespace edge {
namespace format_detail {

void append_integer(std::string& out, long long value) {
  std::array<char, 24> buffer{};
  auto [end, ec] = std::to_chars(buffer.data(), buffer.data() + buffer.size(), value);
  out.append(buffer.data(), end);
}

void append_unsigned(std::string& out, unsigned long long value) {
  std::array<char, 24> buffer{};
  auto [end, ec] = std::to_chars(buffer.data(), buffer.data() + buffer.size(), value);
  out.append(buffer.data(), end);
}

void append_double(std::string& out, double value, int precision) {
  std::array<char, 64> buffer{};
  const auto result = precision < 0
      ? std::to_chars(buffer.data(), buffer.data() + buffer.size(), value)
      : std::to_chars(buffer.data(), buffer.data() + buffer.size(), value,
                      std::chars_format::fixed, precision);
  if (result.ec != std::errc{}) {
    out += "<unformattable>";
    return;
  }
  out.append(buffer.data(), result.ptr);
}

namespace {

// Parses the inside of a placeholder: "" or ":.Nf". Returns false when it is neither.
bool parse_spec(std::string_view spec, int& precision) {
  precision = -1;
  if (spec.empty()) return true;
  if (spec.size() < 4 || spec[0] != ':' || spec[1] != '.' || spec.back() != 'f') return false;
  const std::string_view digits = spec.substr(2, spec.size() - 3);
  int value = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec != std::errc{} || end != digits.data() + digits.size() || value > 30) return false;
  precision = value;
  return true;
}

}  // namespace

std::string format_args(std::string_view pattern, std::span<const arg> args) {
  std::string out;
  out.reserve(pattern.size() + 16 * args.size());
  std::size_t next_arg = 0;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '{') {
      if (i + 1 < pattern.size() && pattern[i + 1] == '{') {
        out += '{';
        ++i;
        continue;
      }
      const std::size_t close = pattern.find('}', i + 1);
      int precision = -1;
      if (close != std::string_view::npos &&
          parse_spec(pattern.substr(i + 1, close - i - 1), precision)) {
        if (next_arg < args.size()) {
          args[next_arg].append(out, args[next_arg].value, precision);
        } else {
          out.append(pattern.substr(i, close - i + 1));
        }
        ++next_arg;
        i = close;
        continue;
      }
      out += c;
    } else if (c == '}' && i + 1 < pattern.size() && pattern[i + 1] == '}') {
      out += '}';
      ++i;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace format_detail

std::string format_bytes(std::uint64_t bytes) {
  static constexpr std::array<const char*, 6> units = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < units.size()) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) return format("{} B", bytes);
  // Whole numbers print without decimals ("4 MiB"); others with up to two ("1.37 GiB").
  if (std::fabs(value - std::round(value)) < 0.005) return format("{:.0f} {}", value, units[unit]);
  std::string text = format("{:.2f}", value);
  while (text.back() == '0') text.pop_back();
  if (text.back() == '.') text.pop_back();
  return text + " " + units[unit];
}

}  // namespace edge
