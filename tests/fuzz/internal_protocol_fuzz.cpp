// libFuzzer harness: every reader of the internal protocol (internal_protocol.h) on arbitrary
// bytes: the generate request a backend reads, the event lines and the info and load bodies a
// gateway reads. Each returns a value or an error and never crashes; what one accepts, written
// back by the protocol's own writer, reads back to a value that writes the same text again
// (what one side sends, the other reads as sent).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "edge/gateway/split/internal_protocol.h"
#include "require.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

namespace gw = edge::gateway;

using edge::fuzz::require;

void check_generate_request(std::string_view body) {
  const auto parsed = gw::parse_generate_request(body);
  if (const auto* error = std::get_if<gw::internal_request_error>(&parsed)) {
    require(!error->message.empty());
    return;
  }
  const auto& [request, grammar] = std::get<gw::parsed_generate_request>(parsed);
  require(request.max_tokens >= 1);
  const std::string written = gw::encode_generate_request(request, grammar.get());
  const auto again = gw::parse_generate_request(written);
  require(std::holds_alternative<gw::parsed_generate_request>(again));
  const auto& back = std::get<gw::parsed_generate_request>(again);
  require(gw::encode_generate_request(back.request, back.grammar.get()) == written);
}

void check_event(std::string_view line) {
  const auto parsed = gw::parse_event(line);
  if (!parsed.ok()) {
    require(parsed.error().code() == edge::status_code::invalid_argument);
    return;
  }
  if (!parsed->has_value()) return;  // a heartbeat
  std::string written = gw::encode_event(**parsed);
  require(written.ends_with('\n'));
  written.pop_back();
  const auto again = gw::parse_event(written);
  require(again.ok() && again->has_value());
  require(gw::encode_event(**again) == written + '\n');
}

void check_info(std::string_view body) {
  const auto parsed = gw::parse_info(body);
  if (!parsed.ok()) return;
  require(parsed->context_length >= 1 && parsed->vocab_size >= 1 && parsed->block_size >= 1);
  const auto again = gw::parse_info(gw::encode_info(*parsed));
  require(again.ok() && gw::info_mismatch(*parsed, *again).empty() && again->version == parsed->version);
}

void check_load(std::string_view body) {
  const auto parsed = gw::parse_load(body);
  if (!parsed.ok()) return;
  const std::string written = gw::encode_load(*parsed);
  const auto again = gw::parse_load(written);
  require(again.ok() && gw::encode_load(*again) == written);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  check_generate_request(body);
  check_event(body);
  check_info(body);
  check_load(body);
  return 0;
}
