#include "edge/common/status.h"

namespace edge {

std::string_view to_string(status_code code) noexcept {
  switch (code) {
    case status_code::ok: return "ok";
    case status_code::invalid_argument: return "invalid_argument";
    case status_code::not_found: return "not_found";
    case status_code::already_exists: return "already_exists";
    case status_code::out_of_range: return "out_of_range";
    case status_code::resource_exhausted: return "resource_exhausted";
    case status_code::failed_precondition: return "failed_precondition";
    case status_code::unavailable: return "unavailable";
    case status_code::cancelled: return "cancelled";
    case status_code::deadline_exceeded: return "deadline_exceeded";
    case status_code::permission_denied: return "permission_denied";
    case status_code::unauthenticated: return "unauthenticated";
    case status_code::data_loss: return "data_loss";
    case status_code::unimplemented: return "unimplemented";
    case status_code::internal: return "internal";
  }
  return "unknown";
}

status status::with_context(std::string_view context) const {
  if (ok()) return *this;
  std::string message;
  message.reserve(context.size() + 2 + message_.size());
  message.append(context).append(": ").append(message_);
  return {code_, std::move(message)};
}

std::string status::to_string() const {
  if (ok()) return "ok";
  std::string text(edge::to_string(code_));
  text.append(": ").append(message_);
  return text;
}

}  // namespace edge
