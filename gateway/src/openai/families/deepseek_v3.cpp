// DeepSeek-V3 / R1, and V3.1's shorter call, in a section:
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{…}\n```<｜tool▁call▁end｜>
//   …more calls…<｜tool▁calls▁end｜>
//   V3.1: <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}<｜tool▁call▁end｜>
// Which of the two a call is, its first byte after <｜tool▁sep｜> says: '{' is V3.1.
#include <array>

#include "../marker_text.h"
#include "family.h"

namespace edge::gateway::families {
namespace {

namespace g = backend::grammar;

constexpr std::string_view calls_begin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view call_begin = "<｜tool▁call▁begin｜>";
constexpr std::string_view sep = "<｜tool▁sep｜>";
constexpr std::string_view call_end = "<｜tool▁call▁end｜>";
constexpr std::string_view calls_end = "<｜tool▁calls▁end｜>";
constexpr std::string_view fence_open = "```json";
constexpr std::string_view fence_close = "```";
constexpr std::array<std::string_view, 5> markers{calls_begin, call_begin, sep, call_end, calls_end};

// V3: "function<｜tool▁sep｜>NAME\n```json"; V3.1: "NAME<｜tool▁sep｜>" with '{' next.
header read_header(std::string_view text) {
  const std::size_t found = text.find(sep);
  if (found == std::string_view::npos) return more_header();
  const std::string_view first = trim_space(text.substr(0, found));
  std::size_t at = found + sep.size();
  const std::size_t next = at + leading_space_length(text.substr(at));
  if (next == text.size()) return more_header();
  header h;
  if (text[next] == '{') {
    h.name = std::string(first);
    h.length = at;
  } else {
    if (first != "function") return mismatched_header();
    const std::size_t end = text.find_first_of("\n`", at);
    if (end == std::string_view::npos) return more_header();
    h.name = std::string(trim_space(text.substr(at, end - at)));
    at = end + leading_space_length(text.substr(end));
    const std::string_view rest = text.substr(at);
    if (is_marker_start(rest, fence_open)) return more_header();
    if (!rest.starts_with(fence_open)) return mismatched_header();
    h.length = at + fence_open.size();
    h.fenced = true;
  }
  h.status = header_status::match;
  return h;
}

g::expr calls(const call_grammar_context& c) {
  const g::expr call = c.any_call([&](const call_grammar_context::allowed_tool& t) {
    const g::expr v3 = g::seq({g::literal("function"), c.marker(sep), g::literal(t.name + "\n"),
                               g::literal(std::string(fence_open) + "\n"), t.arguments,
                               g::literal("\n" + std::string(fence_close))});
    const g::expr v31 = g::seq({g::literal(t.name), c.marker(sep), t.arguments});
    return g::seq({c.marker(call_begin), g::alt({v3, v31}), c.marker(call_end)});
  });
  return g::seq({c.marker(calls_begin), c.joined(call, "\n"), c.marker(calls_end)});
}

}  // namespace

const family_traits deepseek_v3{.kind = tool_call_parser_kind::deepseek_v3,
                                .name = "deepseek_v3",
                                .markers = markers,
                                .section_begin = calls_begin,
                                .section_end = calls_end,
                                .call_begin = call_begin,
                                .call_end = call_end,
                                .read_header = read_header,
                                .fence_close = fence_close,
                                .write_calls = calls};

}  // namespace edge::gateway::families
