// libFuzzer harness: the text of request targets on arbitrary bytes: the admin API's query
// strings (parse_query, parse_usage_query, parse_audit_query), the times they take (parse_utc,
// and format_utc back) and percent-decoding of path segments. Each returns a value or an error
// and never crashes or reads past its input; what they accept is inside the documented ranges,
// a time read is one format_utc writes and reads back as the same time, and percent-encoding
// any bytes decodes to them.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "edge/gateway/tenancy/admin_request.h"
#include "edge/gateway/http/percent_encoding.h"
#include "require.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

namespace gw = edge::gateway;

using edge::fuzz::require;

// 2026-05-01T13:20:00Z: "now" for the usage window.
constexpr gw::unix_time now = 1777641600;
// The times parse_utc reads: years 0000 to 9999, which format_utc writes back in four digits.
constexpr gw::unix_time first_readable = -62167219200;  // 0000-01-01T00:00:00Z
constexpr gw::unix_time last_readable = 253402300799;   // 9999-12-31T23:59:59Z

void check_query(std::string_view query) {
  const auto params = gw::parse_query(query, {"from", "to"});
  if (const auto* list = std::get_if<std::vector<gw::query_param>>(&params)) {
    for (const auto& p : *list) require(p.name == "from" || p.name == "to");
  }
  const auto window = gw::parse_usage_query(query, now);
  if (const auto* w = std::get_if<gw::usage_window>(&window)) {
    require(w->from < w->to);
    // The answer names its hours: the window's ends are written out whatever they are.
    require(!gw::format_utc(gw::hour_start_of(w->from)).empty() && !gw::format_utc(w->to).empty());
  }
  const auto page = gw::parse_audit_query(query);
  if (const auto* p = std::get_if<gw::audit_page>(&page)) {
    require(p->limit >= 1 && p->limit <= gw::max_audit_limit);
    require(!p->before || *p->before >= 1);
  }
}

void check_time(std::string_view text) {
  const auto t = gw::parse_utc(text);
  if (!t.ok()) return;
  require(*t >= first_readable && *t <= last_readable);
  const auto again = gw::parse_utc(gw::format_utc(*t));
  require(again.ok() && *again == *t);
}

void check_percent(std::string_view text) {
  const auto decoded = gw::percent_decode(text);
  if (decoded && text.find('%') == std::string_view::npos) require(*decoded == text);
  static constexpr char hex[] = "0123456789ABCDEF";
  std::string encoded;
  for (const char c : text) {
    const auto b = static_cast<unsigned char>(c);
    encoded += '%';
    encoded += hex[b >> 4];
    encoded += hex[b & 15];
  }
  const auto back = gw::percent_decode(encoded);
  require(back && *back == text);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  check_query(text);
  check_time(text);
  check_percent(text);
  return 0;
}
