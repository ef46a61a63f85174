#include "edge/gateway/tenancy/tenant.h"

#include <sys/random.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <stdexcept>
#include <vector>

#include "edge/common/format.h"

namespace edge::gateway {
namespace {

constexpr std::size_t key_id_bytes = 8;       // 16 hex digits
constexpr std::size_t key_secret_bytes = 32;  // 256 bits
// The last second of year 9999, the latest time a date (YYYY-MM-DD) can name.
constexpr unix_time last_utc_second = 253402300799;
constexpr std::size_t max_tenant_id_length = 64;

// Fills `out` from the kernel's CSPRNG. Failure means the system cannot make secrets at all:
// an impossible state for a server, so it throws.
void random_bytes(std::span<std::uint8_t> out) {
  std::size_t filled = 0;
  while (filled < out.size()) {
    const ssize_t n = ::getrandom(out.data() + filled, out.size() - filled, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("getrandom failed: the system cannot generate API keys or tokens");
    }
    filled += static_cast<std::size_t>(n);
  }
}

std::string hex(std::span<const std::uint8_t> bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const std::uint8_t b : bytes) {
    out += digits[b >> 4];
    out += digits[b & 0xF];
  }
  return out;
}

// RFC 4648 base64url without padding.
std::string base64url(std::span<const std::uint8_t> bytes) {
  static constexpr char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  std::size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const std::uint32_t v = (std::uint32_t{bytes[i]} << 16) | (std::uint32_t{bytes[i + 1]} << 8) | bytes[i + 2];
    out += alphabet[(v >> 18) & 63];
    out += alphabet[(v >> 12) & 63];
    out += alphabet[(v >> 6) & 63];
    out += alphabet[v & 63];
  }
  if (const std::size_t rest = bytes.size() - i; rest > 0) {
    std::uint32_t v = std::uint32_t{bytes[i]} << 16;
    if (rest == 2) v |= std::uint32_t{bytes[i + 1]} << 8;
    out += alphabet[(v >> 18) & 63];
    out += alphabet[(v >> 12) & 63];
    if (rest == 2) out += alphabet[(v >> 6) & 63];
  }
  return out;
}

bool is_alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

bool parse_digits(std::string_view text, int& out) {
  if (text.empty()) return false;
  for (const char c : text) {
    if (c < '0' || c > '9') return false;
  }
  return std::from_chars(text.data(), text.data() + text.size(), out).ec == std::errc{};
}

}  // namespace

std::string_view api_key_record::state(unix_time now) const {
  if (revoked_at) return "revoked";
  if (expires_at && *expires_at <= now) return "expired";
  return "active";
}

bool is_valid_tenant_id(std::string_view id) {
  if (id.empty() || id.size() > max_tenant_id_length || !is_alnum(id.front())) return false;
  for (const char c : id) {
    if (!is_alnum(c) && c != '.' && c != '_' && c != '-') return false;
  }
  return true;
}

std::string generate_secret_text(std::size_t bytes) {
  std::vector<std::uint8_t> secret(bytes);
  random_bytes(secret);
  return base64url(secret);
}

bool is_valid_tenant_weight(double weight) { return weight > 0.0 && weight <= max_tenant_weight; }

std::string tenant_weight_rule() { return format("above 0 and at most {}", max_tenant_weight); }

issued_api_key generate_api_key(std::string_view tenant_id, unix_time now, std::optional<unix_time> expires_at) {
  std::array<std::uint8_t, key_id_bytes> id{};
  random_bytes(id);
  issued_api_key issued;
  issued.record.id = hex(id);
  issued.record.tenant_id = std::string(tenant_id);
  const std::string secret_text = generate_secret_text(key_secret_bytes);
  issued.record.secret_sha256 = sha256(secret_text);
  issued.record.created_at = now;
  issued.record.expires_at = expires_at;
  issued.key = std::string(api_key_prefix) + issued.record.id + "." + secret_text;
  return issued;
}

std::optional<api_key_parts> split_api_key(std::string_view key) {
  if (!key.starts_with(api_key_prefix)) return std::nullopt;
  key.remove_prefix(api_key_prefix.size());
  const std::size_t dot = key.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot + 1 == key.size()) return std::nullopt;
  return api_key_parts{key.substr(0, dot), key.substr(dot + 1)};
}

bool secret_matches(std::string_view secret, const sha256_digest& expected) {
  const sha256_digest presented = sha256(secret);
  return constant_time_equal(presented, expected);
}

unix_time to_unix_seconds(std::chrono::system_clock::time_point t) {
  return std::chrono::floor<std::chrono::seconds>(t).time_since_epoch().count();
}

std::string format_utc(unix_time t) {
  using namespace std::chrono;
  const sys_seconds at{seconds(t)};
  const sys_days day = floor<days>(at);
  const year_month_day ymd{day};
  const hh_mm_ss<seconds> time{at - day};
  const auto padded = [](long v, std::size_t width) {
    std::string digits = std::to_string(v);
    if (v >= 0 && digits.size() < width) digits.insert(0, width - digits.size(), '0');
    return digits;
  };
  // Years of four digits, as ISO 8601 writes them and parse_utc reads them ("0026-02-01").
  return format("{}-{}-{}T{}:{}:{}Z", padded(static_cast<int>(ymd.year()), 4),
                padded(static_cast<unsigned>(ymd.month()), 2), padded(static_cast<unsigned>(ymd.day()), 2),
                padded(time.hours().count(), 2), padded(time.minutes().count(), 2),
                padded(static_cast<long>(time.seconds().count()), 2));
}

result<unix_time> parse_utc(std::string_view text) {
  const auto bad = [&] {
    return invalid_argument(format("\"{}\" is not a time: use unix seconds, 2026-05-01 or 2026-05-01T13:00:00Z", text));
  };
  if (!text.empty() && text.find_first_not_of("0123456789") == std::string_view::npos) {
    unix_time value = 0;
    if (std::from_chars(text.data(), text.data() + text.size(), value).ec != std::errc{}) return bad();
    // Past year 9999 no time can be written back as a date (nor, past 32767, even computed).
    if (value > last_utc_second) return bad();
    return value;
  }
  // YYYY-MM-DD
  if (text.size() < 10 || text[4] != '-' || text[7] != '-') return bad();
  int y = 0, mo = 0, d = 0;
  if (!parse_digits(text.substr(0, 4), y) || !parse_digits(text.substr(5, 2), mo) || !parse_digits(text.substr(8, 2), d)) {
    return bad();
  }
  using namespace std::chrono;
  const year_month_day ymd{year(y), month(static_cast<unsigned>(mo)), day(static_cast<unsigned>(d))};
  if (!ymd.ok()) return bad();
  std::string_view rest = text.substr(10);
  int h = 0, mi = 0, s = 0;
  if (!rest.empty()) {
    if (rest.front() != 'T' && rest.front() != 't' && rest.front() != ' ') return bad();
    rest.remove_prefix(1);
    if (rest.ends_with("Z") || rest.ends_with("z")) rest.remove_suffix(1);
    else if (rest.ends_with("+00:00")) rest.remove_suffix(6);
    if (rest.size() != 5 && rest.size() != 8) return bad();
    if (rest[2] != ':' || !parse_digits(rest.substr(0, 2), h) || !parse_digits(rest.substr(3, 2), mi)) return bad();
    if (rest.size() == 8 && (rest[5] != ':' || !parse_digits(rest.substr(6, 2), s))) return bad();
    if (h > 23 || mi > 59 || s > 59) return bad();
  }
  return static_cast<unix_time>(sys_days(ymd).time_since_epoch() / seconds(1)) + h * 3600 + mi * 60 + s;
}

}  // namespace edge::gateway
