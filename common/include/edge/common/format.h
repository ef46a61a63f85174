// A small "{}" formatter for log lines and messages.
//
// The standard <format> is not available with every host compiler nvcc supports, and the
// core must build with nothing but the standard library, so edge_common carries this one.
// Supported: "{}" (any streamable value), "{:.Nf}" (fixed precision for numbers), and "{{"/"}}"
// for literal braces. A missing argument leaves its "{}" in the text; extra arguments are
// ignored. Neither is an error: a log call must never throw.
#pragma once

#include <charconv>
#include <concepts>
#include <cstdint>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>

namespace edge {

namespace format_detail {

// One argument, converted lazily by the formatter when its placeholder is reached.
struct arg {
  const void* value;
  void (*append)(std::string& out, const void* value, int precision);  // precision -1: default
};

void append_integer(std::string& out, long long value);
void append_unsigned(std::string& out, unsigned long long value);
void append_double(std::string& out, double value, int precision);

template <class T>
void append_value(std::string& out, const void* p, int precision) {
  const T& value = *static_cast<const T*>(p);
  if constexpr (std::is_same_v<T, bool>) {
    out += value ? "true" : "false";
  } else if constexpr (std::is_same_v<T, char>) {
    out += value;
  } else if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    append_integer(out, static_cast<long long>(value));
  } else if constexpr (std::is_integral_v<T>) {
    append_unsigned(out, static_cast<unsigned long long>(value));
  } else if constexpr (std::is_enum_v<T>) {
    append_integer(out, static_cast<long long>(value));
  } else if constexpr (std::is_floating_point_v<T>) {
    append_double(out, static_cast<double>(value), precision);
  } else if constexpr (std::is_convertible_v<const T&, std::string_view>) {
    out += std::string_view(value);
  } else {
    std::ostringstream stream;
    stream << value;
    out += stream.str();
  }
}

std::string format_args(std::string_view pattern, std::span<const arg> args);

}  // namespace format_detail

template <class... Args>
std::string format(std::string_view pattern, const Args&... args) {
  if constexpr (sizeof...(Args) == 0) {
    return format_detail::format_args(pattern, {});
  } else {
    const format_detail::arg packed[] = {
        {static_cast<const void*>(&args), &format_detail::append_value<std::remove_cvref_t<Args>>}...};
    return format_detail::format_args(pattern, packed);
  }
}

// "1.5 GiB", "512 KiB", "17 B": binary units, for capacity log lines.
std::string format_bytes(std::uint64_t bytes);

}  // namespace edge
