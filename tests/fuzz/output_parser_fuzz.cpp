// libFuzzer harness: the chat answer parsers (output_parser.h) on arbitrary model output. The
// first byte chooses the tool-call syntax, the reasoning syntax, whether the prompt opened a
// reasoning block and parallel_tool_calls; the second how to cut the rest into deltas. The
// promises: the same events whether the text comes whole, a byte at a time or cut any other
// way; valid UTF-8 in every event when the text is; calls named only after offered tools, with
// indices 0, 1, ... and arguments only for a call already named; and without any parser, the
// content is the text itself.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "edge/common/utf8.h"
#include "edge/gateway/openai/output_parser.h"
#include "require.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

namespace gw = edge::gateway;

using edge::fuzz::require;

constexpr gw::tool_call_parser_kind tool_kinds[] = {
    gw::tool_call_parser_kind::none,        gw::tool_call_parser_kind::llama3_json, gw::tool_call_parser_kind::hermes,
    gw::tool_call_parser_kind::deepseek_v3, gw::tool_call_parser_kind::kimi_k2,     gw::tool_call_parser_kind::glm45};
constexpr gw::reasoning_parser_kind reasoning_kinds[] = {gw::reasoning_parser_kind::none, gw::reasoning_parser_kind::think,
                                                         gw::reasoning_parser_kind::kimi_k2};

gw::output_parser_options options_of(std::uint8_t choice) {
  gw::output_parser_options o;
  o.tool_calls = tool_kinds[choice % 6];
  o.reasoning = reasoning_kinds[(choice / 6) % 3];
  o.starts_in_reasoning = (choice / 18) % 2 == 1;
  o.parallel_tool_calls = (choice / 36) % 2 == 0;
  o.tools = {{"get_weather", R"({"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}}})"},
             {"get_time", ""}};
  int next = 0;
  o.make_id = [next]() mutable { return "call_" + std::to_string(++next); };
  return o;
}

// The events of one parse, written out one after another (their kind, index and text).
std::string parse(std::uint8_t choice, const std::vector<std::string_view>& pieces, bool text_is_utf8) {
  gw::output_parser parser(options_of(choice));
  std::string written;
  std::vector<gw::output_event> all;
  const auto take = [&](std::vector<gw::output_event> events) {
    for (auto& e : events) gw::append_event(all, std::move(e));
  };
  for (const std::string_view piece : pieces) take(parser.feed(piece, 1));
  take(parser.finish(false));
  std::size_t calls = 0;
  for (const auto& event : all) {
    if (const auto* c = std::get_if<gw::content_delta>(&event)) {
      require(!text_is_utf8 || edge::utf8::is_valid(c->text));
      written += "C" + std::to_string(c->text.size()) + ":" + c->text;
    } else if (const auto* r = std::get_if<gw::reasoning_delta>(&event)) {
      require(!text_is_utf8 || edge::utf8::is_valid(r->text));
      written += "R" + std::to_string(r->text.size()) + ":" + r->text;
    } else if (const auto* b = std::get_if<gw::tool_call_begin>(&event)) {
      require(b->index == calls++);
      require(b->name == "get_weather" || b->name == "get_time");
      require(!b->id.empty());
      written += "B" + std::to_string(b->index) + ":" + b->id + ":" + b->name;
    } else {
      const auto& a = std::get<gw::tool_call_arguments>(event);
      require(a.index < calls);
      require(!text_is_utf8 || edge::utf8::is_valid(a.text));
      written += "A" + std::to_string(a.index) + ":" + std::to_string(a.text.size()) + ":" + a.text;
    }
  }
  if (!options_of(choice).parallel_tool_calls) require(calls <= 1);
  return written;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::uint8_t choice = data[0];
  const std::size_t stride = data[1] % 13 + 1;
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);
  const bool utf8 = edge::utf8::is_valid(text);

  const std::string whole = parse(choice, {text}, utf8);
  std::vector<std::string_view> bytes;
  std::vector<std::string_view> strided;
  for (std::size_t i = 0; i < text.size(); ++i) bytes.push_back(text.substr(i, 1));
  for (std::size_t i = 0; i < text.size(); i += stride) strided.push_back(text.substr(i, stride));
  require(parse(choice, bytes, utf8) == whole);
  require(parse(choice, strided, utf8) == whole);

  // No parser: the content is the text, as it was (repaired only where it is not UTF-8).
  if (utf8 && tool_kinds[choice % 6] == gw::tool_call_parser_kind::none &&
      reasoning_kinds[(choice / 6) % 3] == gw::reasoning_parser_kind::none) {
    require(whole == (text.empty() ? std::string() : "C" + std::to_string(text.size()) + ":" + std::string(text)));
  }
  return 0;
}
