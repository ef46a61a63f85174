// Percent-decoding of a request path's segments ("org%2Fname" -> "org/name": model ids with a
// slash arrive encoded in the path). '+' is a plain character here, as in any path.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace edge::gateway {

// nullopt when a '%' is not followed by two hex digits.
std::optional<std::string> percent_decode(std::string_view text);

}  // namespace edge::gateway
