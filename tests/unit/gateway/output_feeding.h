// Feeding generated text to the output parsers in pieces, the way the engine's deltas bring it:
// the tests parse each text whole, a byte at a time, and cut in two at every byte, and require
// the same events every time (markers split anywhere must not change the answer).
#pragma once

#include <doctest/doctest.h>

#include <functional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "edge/gateway/openai/output_parser.h"

namespace edge::testing {

// The events of one parse, joined as append_event joins them (one event per run of a kind), the
// message they add up to, and the reasoning tokens counted.
struct parse_result {
  std::vector<gateway::output_event> events;
  gateway::assistant_message message;
  std::int64_t reasoning_tokens = 0;
};

inline std::string describe(const gateway::output_event& event) {
  if (const auto* c = std::get_if<gateway::content_delta>(&event)) return "content[" + c->text + "]";
  if (const auto* r = std::get_if<gateway::reasoning_delta>(&event)) return "reasoning[" + r->text + "]";
  if (const auto* b = std::get_if<gateway::tool_call_begin>(&event)) {
    return "call#" + std::to_string(b->index) + "(" + b->id + "," + b->name + ")";
  }
  const auto& a = std::get<gateway::tool_call_arguments>(event);
  return "args#" + std::to_string(a.index) + "[" + a.text + "]";
}

inline std::string describe(const std::vector<gateway::output_event>& events) {
  std::string out;
  for (const auto& e : events) out += describe(e) + " ";
  return out;
}

// Options for one parse; ids are "call_1", "call_2", ... per parse.
using options_factory = std::function<gateway::output_parser_options()>;

inline gateway::tool_call_id_source counting_ids() {
  auto next = std::make_shared<int>(0);
  return [next] { return "call_" + std::to_string(++*next); };
}

// Feeds `pieces` in order, one token each; `cut`: the output ends cut short (length).
inline parse_result parse_pieces(const options_factory& options, const std::vector<std::string>& pieces,
                                 bool cut = false) {
  gateway::output_parser parser(options());
  parse_result result;
  const auto take = [&](std::vector<gateway::output_event> events) {
    for (auto& e : events) {
      result.message.add(e);
      gateway::append_event(result.events, std::move(e));
    }
  };
  for (const std::string& piece : pieces) take(parser.feed(piece, 1));
  take(parser.finish(cut));
  result.reasoning_tokens = parser.reasoning_tokens();
  return result;
}

inline std::vector<std::string> bytes_of(std::string_view text) {
  std::vector<std::string> pieces;
  for (const char c : text) pieces.emplace_back(1, c);
  return pieces;
}

// The parse of `text` whole; checks that byte by byte and every cut in two give the same events.
inline parse_result parse_every_way(const options_factory& options, std::string_view text, bool cut = false) {
  const parse_result whole = parse_pieces(options, {std::string(text)}, cut);
  const parse_result bytes = parse_pieces(options, bytes_of(text), cut);
  CHECK_MESSAGE(describe(bytes.events) == describe(whole.events), "byte by byte: ", describe(bytes.events));
  for (std::size_t at = 1; at < text.size(); ++at) {
    const parse_result halves =
        parse_pieces(options, {std::string(text.substr(0, at)), std::string(text.substr(at))}, cut);
    if (describe(halves.events) != describe(whole.events)) {
      FAIL_CHECK("cut at ", at, ": ", describe(halves.events), " instead of ", describe(whole.events));
      break;
    }
  }
  return whole;
}

}  // namespace edge::testing
