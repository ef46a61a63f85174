// Expected failures as values: a status (code + message) and result<T> (a value or a status).
//
// Exceptions are for start-up, model loading and impossible states; everything a caller is
// expected to handle (bad input, missing file, full queue) travels as a status.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace edge {

enum class status_code {
  ok = 0,
  invalid_argument,    // the caller's input is malformed or out of range
  not_found,           // a named thing (file, route, tenant, model) does not exist
  already_exists,
  out_of_range,        // a value is valid in form but past a limit (context length, file end)
  resource_exhausted,  // a budget or queue is full; retrying later can succeed
  failed_precondition, // the system is not in a state that allows this (draining, not ready)
  unavailable,         // a dependency is down; retrying can succeed
  cancelled,
  deadline_exceeded,
  permission_denied,
  unauthenticated,
  data_loss,           // stored data is corrupt or truncated
  unimplemented,
  internal,            // a bug: an invariant did not hold
};

// Stable lower-case name of a code ("invalid_argument"), for logs and error bodies.
std::string_view to_string(status_code code) noexcept;

class [[nodiscard]] status {
 public:
  status() noexcept = default;
  status(status_code code, std::string message) : code_(code), message_(std::move(message)) {
    assert(code != status_code::ok || message_.empty());
  }

  static status ok_status() noexcept { return {}; }

  bool ok() const noexcept { return code_ == status_code::ok; }
  status_code code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }

  // "context: message", for adding where a failure happened as it travels up.
  status with_context(std::string_view context) const;

  // "invalid_argument: message" (or "ok").
  std::string to_string() const;

  friend bool operator==(const status& a, const status& b) = default;

 private:
  status_code code_ = status_code::ok;
  std::string message_;
};

inline status invalid_argument(std::string message) { return {status_code::invalid_argument, std::move(message)}; }
inline status not_found(std::string message) { return {status_code::not_found, std::move(message)}; }
inline status out_of_range(std::string message) { return {status_code::out_of_range, std::move(message)}; }
inline status resource_exhausted(std::string message) { return {status_code::resource_exhausted, std::move(message)}; }
inline status failed_precondition(std::string message) { return {status_code::failed_precondition, std::move(message)}; }
inline status unavailable(std::string message) { return {status_code::unavailable, std::move(message)}; }
inline status data_loss(std::string message) { return {status_code::data_loss, std::move(message)}; }
inline status internal_error(std::string message) { return {status_code::internal, std::move(message)}; }

// A value of type T, or the status that explains why there is none. The error type E is status
// or a type derived from it that says more (json_error: the field at fault); returned from a
// function whose result has a plain status, it becomes that status.
template <class T, class E = status>
class [[nodiscard]] result {
  static_assert(!std::is_base_of_v<status, std::remove_cvref_t<T>>, "result<status> is meaningless");
  static_assert(std::is_base_of_v<status, E>, "the error of a result is a status");

 public:
  result(T value) : state_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit by design
  result(E failure) : state_(std::in_place_index<1>, std::move(failure)) {  // NOLINT
    assert(!std::get<1>(state_).ok() && "a result cannot hold an ok status without a value");
  }

  bool ok() const noexcept { return state_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }

  // The error: an ok one when a value is held.
  const E& error() const {
    static const E ok_status;
    return ok() ? ok_status : std::get<1>(state_);
  }

  T& value() & { assert(ok()); return std::get<0>(state_); }
  const T& value() const& { assert(ok()); return std::get<0>(state_); }
  T&& value() && { assert(ok()); return std::get<0>(std::move(state_)); }

  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  template <class U>
  T value_or(U&& fallback) const& {
    return ok() ? std::get<0>(state_) : static_cast<T>(std::forward<U>(fallback));
  }

 private:
  std::variant<T, E> state_;
};

}  // namespace edge

// Returns the status from the enclosing function when `expr` (a status) is not ok.
#define EDGE_RETURN_IF_ERROR(expr)                 \
  do {                                             \
    ::edge::status edge_status_tmp_ = (expr);      \
    if (!edge_status_tmp_.ok()) return edge_status_tmp_; \
  } while (0)

#define EDGE_CONCAT_INNER_(a, b) a##b
#define EDGE_CONCAT_(a, b) EDGE_CONCAT_INNER_(a, b)

// `EDGE_ASSIGN_OR_RETURN(auto file, open(path));` declares `file` from a result's value, or
// returns the result's status from the enclosing function.
#define EDGE_ASSIGN_OR_RETURN(lhs, expr) \
  EDGE_ASSIGN_OR_RETURN_IMPL_(EDGE_CONCAT_(edge_result_tmp_, __LINE__), lhs, expr)
#define EDGE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.error();                \
  lhs = std::move(tmp).value()
