#include "edge/gateway/openai/tool_calls.h"

#include <algorithm>
#include <cassert>
#include <array>
#include <random>
#include <unordered_map>
#include <unordered_set>

#include "edge/common/format.h"
#include "edge/common/json_fields.h"
#include "edge/common/json_text.h"
#include "edge/common/utf8.h"
#include "families/family.h"
#include "json_object_scanner.h"
#include "marker_grammar.h"
#include "marker_text.h"

namespace edge::gateway {
namespace {

using families::argument_form;
using families::family_traits;
using families::header;
using families::header_status;

constexpr std::size_t max_header_bytes = 1024;
constexpr std::size_t tool_call_id_length = 24;

// ---- headers ----------------------------------------------------------------------------------

void skip_space(std::string_view text, std::size_t& at) {
  while (at < text.size() && is_space(text[at])) ++at;
}

// A JSON string at `at`: its value, nothing while it is not complete yet, or an error.
enum class string_status { more, bad, ok };
string_status read_json_string(std::string_view text, std::size_t& at, std::string& out) {
  if (at == text.size()) return string_status::more;
  if (text[at] != '"') return string_status::bad;
  bool escaped = false;
  for (std::size_t i = at + 1; i < text.size(); ++i) {
    if (text[i] == '\\') {
      escaped = true;
      ++i;  // the escaped byte
      continue;
    }
    if (text[i] != '"') continue;
    const std::string_view token = text.substr(at, i + 1 - at);
    at = i + 1;
    if (!escaped) {
      out = std::string(token.substr(1, token.size() - 2));
      return string_status::ok;
    }
    simdjson::dom::parser parser;
    const auto parsed = parse_json(parser, token);
    if (!parsed.ok()) return string_status::bad;
    const auto value = json_value(*parsed).as<std::string_view>();
    if (!value.ok()) return string_status::bad;
    out = std::string(*value);
    return string_status::ok;
  }
  return string_status::more;
}

}  // namespace

header families::json_header(std::string_view text) {
  std::size_t at = 0;
  skip_space(text, at);
  if (at == text.size()) return families::more_header();
  if (text[at++] != '{') return families::mismatched_header();
  std::string key;
  const auto read_key = [&](std::initializer_list<std::string_view> allowed) {
    skip_space(text, at);
    const string_status s = read_json_string(text, at, key);
    if (s != string_status::ok) return s;
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) return string_status::bad;
    skip_space(text, at);
    if (at == text.size()) return string_status::more;
    if (text[at++] != ':') return string_status::bad;
    return string_status::ok;
  };
  const auto status_of = [](string_status s) {
    return s == string_status::more ? families::more_header() : families::mismatched_header();
  };
  if (const auto s = read_key({"name"}); s != string_status::ok) return status_of(s);
  header h;
  skip_space(text, at);
  if (const auto s = read_json_string(text, at, h.name); s != string_status::ok) return status_of(s);
  skip_space(text, at);
  if (at == text.size()) return families::more_header();
  if (text[at] == '}') {
    h.no_arguments = true;
  } else {
    if (text[at++] != ',') return families::mismatched_header();
    if (const auto s = read_key({"arguments", "parameters"}); s != string_status::ok) return status_of(s);
  }
  h.status = header_status::match;
  h.length = h.no_arguments ? at + 1 : at;
  return h;
}

namespace {

// ---- key/value pairs' value types ------------------------------------------------------------------------

// Whether the schema makes `type` string-only: "string", or a list of "string" and "null".
bool is_string_type(const json_value& type) {
  if (const auto name = type.as<std::string_view>(); name.ok()) return *name == "string";
  const auto names = type.as<json_array>();
  if (!names.ok()) return false;
  bool has_string = false;
  for (const json_value item : *names) {
    const auto name = item.as<std::string_view>();
    if (!name.ok() || (*name != "string" && *name != "null")) return false;
    has_string |= *name == "string";
  }
  return has_string;
}

// The properties of `parameters` (a JSON schema's text) whose values are raw text.
std::vector<std::string> string_properties(std::string_view parameters) {
  std::vector<std::string> names;
  if (parameters.empty()) return names;
  simdjson::dom::parser parser;
  const auto schema = parse_json_object(parser, parameters, "parameters");
  if (!schema.ok()) return names;
  const auto properties = json_fields(*schema).optional<json_fields>("properties");
  if (!properties.ok() || !*properties) return names;
  for (const auto [key, property] : **properties) {
    const auto fields = property.as<json_fields>();
    if (!fields.ok()) continue;
    const auto type = fields->find("type");
    if (type && is_string_type(*type)) names.emplace_back(key);
  }
  return names;
}

bool is_valid_json(std::string_view text) {
  if (text.empty()) return false;
  simdjson::dom::parser parser;
  return parse_json(parser, text).ok();
}

// `text` escaped as the inside of a JSON string (no quotes).
std::string json_string_body(std::string_view text) {
  std::string quoted = json_string(text);
  return quoted.substr(1, quoted.size() - 2);
}

// ---- the parser -------------------------------------------------------------------------------

class family_parser final : public tool_call_parser {
 public:
  family_parser(const family_traits& family, std::vector<tool_spec> tools, bool parallel, tool_call_id_source make_id)
      : family_(family),
        tools_(std::move(tools)),
        parallel_(parallel),
        make_id_(make_id ? std::move(make_id) : tool_call_id_source([] { return random_id(); })),
        state_(family.bare ? state::llama_start : state::text) {
    if (family_.arguments == argument_form::key_value_pairs) {
      for (const tool_spec& tool : tools_) string_parameters_.push_back(string_properties(tool.parameters));
    }
  }

  void feed(std::string_view text, std::vector<output_event>& out) override {
    pending_ += text;
    out_ = &out;
    while (step(/*at_end=*/false)) {
    }
  }

  void finish(std::vector<output_event>& out, bool cut) override {
    out_ = &out;
    cut_ = cut;
    while (step(/*at_end=*/true)) {
    }
  }

 private:
  enum class state {
    text,             // content, watching for the family's opening marker
    section,          // DeepSeek / Kimi: between calls in a section
    header,           // a call's header, held until it names a tool or proves to be none
    arguments,        // JSON arguments, passed on as the scanner accepts them
    raw_arguments,    // arguments that stopped being JSON, passed on up to the call's end
    tail,             // the family's closing syntax after the arguments
    call_as_content,  // a call in a section that is not one: content up to its end marker
    skip_space,       // after a call: whitespace before what follows is dropped
    llama_start,      // bare calls: only whitespace so far
    llama_next,       // bare calls: after a call, a ';' and the next, or text
    plain,            // bare calls: content to the end
    pairs,            // key/value arguments: between pairs
    pair_key,         // key/value arguments: inside a key
    pair_before_value,  // key/value arguments: after a key, before its value
    pair_value,       // key/value arguments: inside a value
  };

  bool is_section_family() const { return !family_.section_begin.empty(); }

  void content(std::string_view text) {
    if (!text.empty()) append_event(*out_, content_delta{std::string(text)});
  }
  void arguments(std::string_view text) {
    if (!text.empty() && !dropped_) append_event(*out_, tool_call_arguments{index_, std::string(text)});
  }

  const tool_spec* find_tool(std::string_view name) const {
    const auto it = std::find_if(tools_.begin(), tools_.end(), [&](const tool_spec& t) { return t.name == name; });
    return it == tools_.end() ? nullptr : &*it;
  }

  void begin_call(const header& h, const tool_spec& tool) {
    dropped_ = !parallel_ && calls_ > 0;
    tool_ = &tool;
    if (dropped_) return;
    index_ = calls_++;
    append_event(*out_, tool_call_begin{index_, h.id.empty() ? make_id_() : h.id, h.name});
  }

  header parse_header() const { return family_.read_header(pending_); }

  // Where the text after a finished call is read.
  state after_call() const {
    if (family_.bare) return state::llama_next;
    return is_section_family() ? state::section : state::skip_space;
  }

  // The closing syntax expected after the arguments, before the call's end marker.
  std::string_view tail_piece() const {
    if (tail_done_) return {};
    return fenced_ ? family_.fence_close : family_.arguments_close;
  }

  bool step(bool at_end) {
    std::string_view text = pending_;
    switch (state_) {
      case state::text: {
        const std::string_view opener = is_section_family() ? family_.section_begin : family_.call_begin;
        const std::size_t found = text.find(opener);
        if (found != std::string_view::npos) {
          // Whitespace before the marker is no content if a call follows; kept with the marker.
          const std::size_t content_end = trailing_space_start(text, found);
          content(text.substr(0, content_end));
          opened_with_ = std::string(text.substr(content_end, found + opener.size() - content_end));
          pending_.erase(0, found + opener.size());
          section_opened_with_ = opened_with_;
          in_new_section_ = is_section_family();
          state_ = is_section_family() ? state::section : state::header;
          return true;
        }
        const std::size_t held = at_end && !cut_ ? 0 : partial_marker_length(text, opener);
        const std::size_t ready = at_end && !cut_ ? text.size() : trailing_space_start(text, text.size() - held);
        content(text.substr(0, ready));
        pending_.erase(0, at_end ? text.size() : ready);
        return false;
      }

      case state::section: {
        if (!in_new_section_) {
          pending_.erase(0, leading_space_length(pending_));  // whitespace between calls
          text = pending_;
        }
        const std::size_t space = leading_space_length(text);
        const std::string_view rest = text.substr(space);
        if (rest.starts_with(family_.call_begin)) {
          opened_with_ = std::string(text.substr(0, space + family_.call_begin.size()));
          pending_.erase(0, opened_with_.size());
          state_ = state::header;
          return true;
        }
        if (rest.starts_with(family_.section_end) && !in_new_section_) {
          pending_.erase(0, family_.section_end.size());
          state_ = state::skip_space;
          return true;
        }
        if (!at_end && (rest.empty() || is_marker_start(rest, family_.call_begin) ||
                        is_marker_start(rest, family_.section_end))) {
          return false;
        }
        if (rest.empty() && !in_new_section_) return false;
        if (at_end && cut_ && (rest.empty() || is_marker_start(rest, family_.call_begin))) {
          pending_.clear();  // a section (or its next call's marker) begun when the output was cut
          return false;
        }
        // Other text: the section is over. One that made no call was never a section: its
        // marker is content, and so is what follows it.
        if (in_new_section_) content(section_opened_with_);
        in_new_section_ = false;
        state_ = state::text;
        return true;
      }

      case state::header: {
        header h = parse_header();
        if (h.status == header_status::more && !at_end && text.size() <= max_header_bytes) return false;
        if (h.status == header_status::more && at_end && cut_) {
          pending_.clear();  // a call whose header the cut left unfinished: no call, and no content
          return false;
        }
        const tool_spec* tool = h.status == header_status::match ? find_tool(h.name) : nullptr;
        if (tool == nullptr) return not_a_call();
        begin_call(h, *tool);
        in_new_section_ = false;
        pending_.erase(0, h.length);
        fenced_ = h.fenced;
        tail_done_ = false;
        if (family_.arguments == argument_form::key_value_pairs) {
          arguments("{");
          first_pair_ = true;
          state_ = state::pairs;
        } else if (h.no_arguments) {
          arguments("{}");
          tail_done_ = true;  // the header took the object's '}'
          state_ = state::tail;
        } else {
          scanner_ = json_object_scanner{};
          arguments_started_ = false;
          state_ = state::arguments;
        }
        return true;
      }

      case state::arguments: {
        if (!arguments_started_) {
          pending_.erase(0, leading_space_length(pending_));
          if (pending_.empty()) return false;
          arguments_started_ = true;
          text = pending_;
        }
        for (std::size_t i = 0; i < text.size(); ++i) {
          const auto verdict = scanner_.push(text[i]);
          if (verdict == json_object_scanner::verdict::more) continue;
          const std::size_t taken = verdict == json_object_scanner::verdict::complete ? i + 1 : i;
          arguments(text.substr(0, taken));
          pending_.erase(0, taken);
          state_ = verdict == json_object_scanner::verdict::complete ? state::tail : state::raw_arguments;
          return true;
        }
        arguments(text);
        pending_.clear();
        return false;
      }

      case state::raw_arguments: {
        const std::string_view end = family_.call_end;
        if (!end.empty()) {
          const std::size_t found = text.find(end);
          if (found != std::string_view::npos) {
            arguments(text.substr(0, trailing_space_start(text, found)));
            pending_.erase(0, found + end.size());
            state_ = after_call();
            return true;
          }
        }
        const std::size_t held = at_end || end.empty() ? 0 : partial_marker_length(text, end);
        const std::size_t ready = trailing_space_start(text, text.size() - held);
        arguments(text.substr(0, ready));
        pending_.erase(0, at_end ? text.size() : ready);
        return false;
      }

      case state::tail: {
        const std::size_t space = leading_space_length(text);
        const std::string_view rest = text.substr(space);
        const std::string_view piece = tail_piece();
        const std::string_view expected = piece.empty() ? family_.call_end : piece;
        if (expected.empty()) {  // a bare call: the object's '}' ended it
          state_ = after_call();
          return true;
        }
        if (rest.starts_with(expected)) {
          pending_.erase(0, space + expected.size());
          if (!piece.empty()) {
            tail_done_ = true;
          } else {
            state_ = after_call();
          }
          return true;
        }
        if (!at_end && (rest.empty() || is_marker_start(rest, expected))) return false;
        // Not the closing syntax: the call is over, and this is what follows it.
        pending_.erase(0, space);
        state_ = family_.bare ? state::llama_next : is_section_family() ? state::section : state::text;
        return true;
      }

      case state::call_as_content: {
        const std::size_t found = text.find(family_.call_end);
        if (found != std::string_view::npos) {
          content(text.substr(0, found + family_.call_end.size()));
          pending_.erase(0, found + family_.call_end.size());
          state_ = state::section;
          return true;
        }
        const std::size_t ready = text.size() - (at_end ? 0 : partial_marker_length(text, family_.call_end));
        content(text.substr(0, ready));
        pending_.erase(0, ready);
        return false;
      }

      case state::skip_space:
        pending_.erase(0, leading_space_length(text));
        if (pending_.empty()) return false;
        state_ = state::text;
        return true;

      case state::llama_start: {
        const std::size_t space = leading_space_length(text);
        const std::string_view rest = text.substr(space);
        if (rest.starts_with(family_.bare_marker) || rest.starts_with("{")) {
          const std::size_t opener = rest.starts_with(family_.bare_marker) ? space + family_.bare_marker.size() : space;
          opened_with_ = std::string(text.substr(0, opener));
          pending_.erase(0, opener);
          state_ = state::header;
          return true;
        }
        if (!at_end && (rest.empty() || is_marker_start(rest, family_.bare_marker))) return false;
        state_ = state::plain;
        return true;
      }

      case state::llama_next: {
        const std::size_t space = leading_space_length(text);
        const std::string_view rest = text.substr(space);
        if (rest.empty() && !at_end) return false;
        if (rest.starts_with(";")) {
          opened_with_ = std::string(text.substr(0, space + 1));
          pending_.erase(0, space + 1);
          state_ = state::header;
          return true;
        }
        pending_.erase(0, space);
        state_ = state::plain;
        return true;
      }

      case state::plain:
        content(text);
        pending_.clear();
        return false;

      case state::pairs: {
        const std::size_t space = leading_space_length(text);
        const std::string_view rest = text.substr(space);
        if (rest.starts_with(family_.key_open)) {
          pending_.erase(0, space + family_.key_open.size());
          state_ = state::pair_key;
          return true;
        }
        if (rest.starts_with(family_.call_end)) {
          arguments("}");
          pending_.erase(0, space + family_.call_end.size());
          state_ = state::skip_space;
          return true;
        }
        if (rest.empty() || (!at_end && (is_marker_start(rest, family_.key_open) || is_marker_start(rest, family_.call_end)))) {
          return false;  // at the end: a call cut short keeps what it has
        }
        // Text that is no pair: the call ends here, complete; the text is what follows it.
        arguments("}");
        pending_.erase(0, space);
        state_ = state::text;
        return true;
      }

      case state::pair_key: {
        const std::size_t found = find_marker(text, family_.key_close, scanned_);
        if (found == std::string_view::npos) return false;
        scanned_ = 0;
        const std::string_view key = trim_space(text.substr(0, found));
        string_value_ = is_string_parameter(key);
        std::string written = first_pair_ ? "" : ", ";
        written += json_string(key);
        written += ": ";
        arguments(written);
        first_pair_ = false;
        pending_.erase(0, found + family_.key_close.size());
        state_ = state::pair_before_value;
        return true;
      }

      case state::pair_before_value: {
        const std::size_t space = leading_space_length(text);
        const std::string_view rest = text.substr(space);
        if (rest.starts_with(family_.value_open)) {
          pending_.erase(0, space + family_.value_open.size());
          if (string_value_) arguments("\"");
          value_started_ = false;
          json_scan_ = {};
          state_ = state::pair_value;
          return true;
        }
        if (rest.empty() || (!at_end && is_marker_start(rest, family_.value_open))) return false;
        arguments("null");  // a key without a value
        state_ = state::pairs;
        return true;
      }

      case state::pair_value: {
        if (string_value_ && !value_started_) {
          pending_.erase(0, leading_space_length(pending_));
          if (pending_.empty()) return false;
          value_started_ = true;
          text = pending_;
        }
        // A JSON value ends at the first closing tag outside its strings (a string may hold one);
        // where a quote never closes, at the first closing tag after all.
        std::size_t found = string_value_ ? find_marker(text, family_.value_close, scanned_)
                                          : find_marker_outside_strings(text, family_.value_close, json_scan_);
        if (found == std::string_view::npos && !string_value_ && at_end) found = text.find(family_.value_close);
        if (found != std::string_view::npos) {
          scanned_ = 0;
          const std::string_view value = text.substr(0, trailing_space_start(text, found));
          arguments(string_value_ ? json_string_body(value) + "\"" : json_value_text(trim_space(value)));
          pending_.erase(0, found + family_.value_close.size());
          state_ = state::pairs;
          return true;
        }
        if (!string_value_) {
          if (at_end) {
            arguments(json_value_text(trim_space(text)));
            pending_.clear();
          }
          return false;
        }
        const std::size_t held = at_end ? 0 : partial_marker_length(text, family_.value_close);
        const std::size_t ready = trailing_space_start(text, text.size() - held);
        arguments(json_string_body(text.substr(0, ready)));
        pending_.erase(0, at_end ? text.size() : ready);
        scanned_ = 0;  // what is left is searched again from its start
        return false;
      }
    }
    return false;
  }

  // The header is no call of a known tool: its text so far becomes content.
  bool not_a_call() {
    if (family_.bare) {
      content(opened_with_);
      state_ = state::plain;
    } else if (!is_section_family()) {
      content(opened_with_);
      state_ = state::text;  // what follows the marker is read again as text
    } else if (in_new_section_) {
      content(section_opened_with_);
      content(opened_with_);
      in_new_section_ = false;
      state_ = state::text;
    } else {
      content(opened_with_);
      state_ = state::call_as_content;
    }
    return true;
  }

  // A GLM value is JSON unless the tool's schema says the parameter is a string.
  bool is_string_parameter(std::string_view key) const {
    const auto index = static_cast<std::size_t>(tool_ - tools_.data());
    const auto& names = string_parameters_[index];
    return std::find(names.begin(), names.end(), key) != names.end();
  }

  static std::string json_value_text(std::string_view value) {
    return is_valid_json(value) ? std::string(value) : json_string(value);
  }

  const family_traits& family_;
  const std::vector<tool_spec> tools_;
  const bool parallel_;
  const tool_call_id_source make_id_;
  std::vector<std::vector<std::string>> string_parameters_;  // GLM: per tool, its string-typed properties

  std::vector<output_event>* out_ = nullptr;  // where the current feed/finish appends
  bool cut_ = false;                          // finish(): the output was cut short
  state state_;
  std::string pending_;          // text not consumed yet
  std::string opened_with_;      // the text that opened the current header: content if it is no call
  std::string section_opened_with_;  // the same for the current section, while it has made no call
  bool in_new_section_ = false;  // in a section that has made no call yet
  std::size_t calls_ = 0;        // calls returned so far
  std::size_t index_ = 0;        // the current call's index
  bool dropped_ = false;         // the current call is past the one parallel_tool_calls=false allows
  const tool_spec* tool_ = nullptr;  // the current call's tool
  json_object_scanner scanner_;
  bool arguments_started_ = false;
  bool fenced_ = false;
  bool tail_done_ = false;       // the closing piece before the end marker has been seen
  bool first_pair_ = true;
  bool string_value_ = false;
  bool value_started_ = false;
  std::size_t scanned_ = 0;      // GLM: how much of a key or value held back was searched for its end
  json_string_scan json_scan_;   // GLM: how far a JSON value was read for its end
};

// ---- the families' syntax as grammars ----------------------------------------------------------

namespace g = backend::grammar;

// GLM keywords a string-typed property may have: its raw value honours them.
bool is_raw_string_keyword(std::string_view key) {
  return key == "type" || key == "enum" || key == "const" || key == "minLength" || key == "maxLength" ||
         key == "title" || key == "description" || key == "default" || key == "examples" || key == "$comment";
}

// GLM keywords the parameters schema itself may have.
bool is_glm_parameters_keyword(std::string_view key) {
  return key == "type" || key == "properties" || key == "required" || key == "additionalProperties" ||
         key == "title" || key == "description" || key == "$defs" || key == "definitions" || key == "$schema" ||
         key == "$id" || key == "$comment" || key == "strict";
}

// A JSON pointer's step for `key`.
std::string pointer_step(std::string_view key) {
  std::string step;
  for (const char c : key) {
    if (c == '~') {
      step += "~0";
    } else if (c == '/') {
      step += "~1";
    } else {
      step += c;
    }
  }
  return step;
}

class call_grammar_writer {
 public:
  call_grammar_writer(g::grammar_builder& b, const tool_call_grammar_options& o) : b_(b), o_(o) {}

  result<g::expr, g::grammar_error> calls() {
    const family_traits* family = families::find(o_.kind);
    const argument_form form = family != nullptr ? family->arguments : argument_form::json;
    // Each allowed tool's arguments, read once.
    std::vector<families::call_grammar_context::allowed_tool> allowed;
    for (std::size_t i = 0; i < o_.tools.size(); ++i) {
      const tool_spec& tool = o_.tools[i];
      if (!o_.only.empty() && tool.name != o_.only) continue;
      auto arguments = form == argument_form::key_value_pairs ? key_value_pairs(*family, tool, i) : json_arguments(tool, i);
      if (!arguments.ok()) {
        return g::grammar_error(format("tool '{}': {}", tool.name, arguments.error().message()), arguments.error().path());
      }
      // A rule per tool's arguments: every call position refers to the same one.
      allowed.push_back({tool.name, b_.ref(b_.add_rule(format("{} arguments", tool.name), *arguments))});
    }
    if (allowed.empty()) return g::grammar_error(format("no tool is named '{}'", o_.only), "tool_choice");
    if (family == nullptr) return g::grammar_error("the model has no tool-call syntax", "tool_choice");
    return family->write_calls(families::call_grammar_context(b_, o_, std::move(allowed)));
  }

 private:
  g::expr marker(std::string_view text) const { return marker_expr(text, o_.is_special); }

  static std::string parameters_path(std::size_t index) { return format("tools[{}].function.parameters", index); }

  // A JSON family's arguments: a value of the parameters schema, which must describe objects
  // only (the parsers read arguments as one object, and so do OpenAI's clients). A schema of
  // annotations alone allows any object.
  result<g::expr, g::grammar_error> json_arguments(const tool_spec& tool, std::size_t index) {
    const std::string path = parameters_path(index);
    if (tool.parameters.empty()) return g::literal("{}");
    simdjson::dom::parser parser;
    const auto schema = parse_json_object(parser, tool.parameters, path);
    if (!schema.ok()) return g::grammar_error(schema.error().message(), path);
    if (only_annotations(*schema)) return b_.json_schema(R"({"type":"object"})", {.path = path});
    simdjson::dom::element root;
    if (schema->at_pointer("").get(root) != simdjson::SUCCESS) return g::grammar_error("unreadable schema", path);
    if (auto error = objects_only_check{*schema}.check(root, path, 0)) return *error;
    return b_.json_schema(tool.parameters, {.path = path});
  }

  static bool only_annotations(simdjson::dom::object schema) {
    constexpr std::array<std::string_view, 9> annotations = {"description", "title",    "$schema",  "$id",        "$comment",
                                                             "default",     "examples", "$defs", "definitions"};
    for (const auto field : schema) {
      if (std::find(annotations.begin(), annotations.end(), field.key) == annotations.end()) return false;
    }
    return true;
  }

  // Whether every value a schema allows is an object: its "type" says so, or every alternative of
  // anyOf / oneOf, every value of const / enum, one part of allOf, or what its $ref names does.
  // The first place that allows another value is the error; a schema the converter refuses for
  // another reason is left to it to name. Each $ref target is checked once: a schema whose
  // alternatives name the same definitions, level after level, costs its size, not the number of
  // its paths (two alternatives over 64 levels would be 2^64 of them); a reference back to a
  // schema being checked, which no object came between, is an error.
  class objects_only_check {
   public:
    explicit objects_only_check(simdjson::dom::object document) : document_(document) {}

    std::optional<g::grammar_error> check(simdjson::dom::element schema, const std::string& path, int depth) {
      bool always = false;
      if (schema.get(always) == simdjson::SUCCESS) return always ? std::optional(allows_more(path)) : std::nullopt;
      simdjson::dom::object o;
      if (schema.get(o) != simdjson::SUCCESS) return std::nullopt;
      if (depth > max_reference_depth) {
        return g::grammar_error(format("'{}': its references go deeper than {}", path, max_reference_depth), path);
      }
      if (json_fields(o).find("type")) return check_object_type(json_fields(o), path);
      simdjson::dom::element value;
      if (o.at_key("const").get(value) == simdjson::SUCCESS) {
        return value.is_object() ? std::nullopt : std::optional(allows_more(path + ".const"));
      }
      simdjson::dom::array items;
      if (o.at_key("enum").get(items) == simdjson::SUCCESS) {
        for (const simdjson::dom::element item : items) {
          if (!item.is_object()) return allows_more(path + ".enum");
        }
        return std::nullopt;
      }
      for (const std::string_view keyword : {"anyOf", "oneOf"}) {
        if (o.at_key(keyword).get(items) != simdjson::SUCCESS) continue;
        std::size_t i = 0;
        for (const simdjson::dom::element alternative : items) {
          const std::string where = format("{}.{}[{}]", path, keyword, i++);
          if (auto error = check(alternative, where, depth)) return error;
        }
        return std::nullopt;
      }
      if (o.at_key("allOf").get(items) == simdjson::SUCCESS) {
        for (const simdjson::dom::element part : items) {
          if (!check(part, path, depth)) return std::nullopt;
        }
        return allows_more(path + ".allOf");
      }
      std::string_view reference;
      if (o.at_key("$ref").get(reference) == simdjson::SUCCESS && reference.starts_with("#")) {
        const std::string where = depth == 0 ? path + ".$ref" : path;
        if (const auto known = checked_.find(reference); known != checked_.end()) return known->second;
        if (!in_progress_.insert(reference).second) {
          return g::grammar_error(format("'{}' refers back to itself before it describes an object", where), where);
        }
        simdjson::dom::element target;
        std::optional<g::grammar_error> error;
        if (document_.at_pointer(reference.substr(1)).get(target) == simdjson::SUCCESS) {
          // Named where the first reference is: a chain of them is one step for the client.
          error = check(target, where, depth + 1);
        }
        in_progress_.erase(reference);
        checked_.emplace(reference, error);
        return error;
      }
      return allows_more(path);
    }

   private:
    // $refs followed from one schema to the next before the check gives up (a chain of
    // references that long describes no arguments).
    static constexpr int max_reference_depth = 64;

    static g::grammar_error allows_more(const std::string& where) {
      return g::grammar_error(
          format("'{}' allows values that are not JSON objects: a tool's arguments are a JSON object (give the schema "
                 "\"type\": \"object\")",
                 where),
          where);
    }

    simdjson::dom::object document_;
    // Views into the parsed document: the references being checked, and those checked.
    std::unordered_set<std::string_view> in_progress_;
    std::unordered_map<std::string_view, std::optional<g::grammar_error>> checked_;
  };

  static std::optional<g::grammar_error> check_object_type(const json_fields& schema, const std::string& path) {
    const auto type = schema.find("type");
    if (!type) return std::nullopt;
    bool object = false;
    if (const auto name = type->as<std::string_view>(); name.ok()) object = *name == "object";
    if (const auto names = type->as<json_array>(); names.ok()) {
      object = names->size() == 1 && names->front().as<std::string_view>().ok() &&
               *names->front().as<std::string_view>() == "object";
    }
    if (object) return std::nullopt;
    return g::grammar_error(format("'{}.type' must be \"object\": a tool's arguments are a JSON object", path),
                            path + ".type");
  }

  // The first keyword of `schema` that `supported` refuses, as the error naming it and its path.
  static std::optional<g::grammar_error> refuse_keywords(const json_fields& schema, const std::string& path,
                                                         bool (*supported)(std::string_view), std::string_view where) {
    for (const auto [key, value] : schema) {
      if (!supported(key)) {
        return g::grammar_error(format("'{}.{}': the keyword '{}' is not supported {}", path, key, key, where),
                                format("{}.{}", path, key));
      }
    }
    return std::nullopt;
  }

  // Key/value pairs (GLM): one per property of the parameters, in order.
  result<g::expr, g::grammar_error> key_value_pairs(const family_traits& family, const tool_spec& tool,
                                                    std::size_t index) {
    const std::string path = parameters_path(index);
    if (tool.parameters.empty()) return g::expr();
    simdjson::dom::parser parser;
    const auto parsed = parse_json_object(parser, tool.parameters, path);
    if (!parsed.ok()) return g::grammar_error(parsed.error().message(), path);
    const json_fields schema(*parsed);
    if (auto error = check_object_type(schema, path)) return *error;
    if (auto error = refuse_keywords(schema, path, is_glm_parameters_keyword,
                                     "with GLM-4.5's key/value tool calls (the parameters must be an object of "
                                     "properties)")) {
      return *error;
    }
    std::vector<std::string> required;
    if (const auto listed = schema.find("required")) {
      const auto names = listed->as<json_array>();
      if (!names.ok()) return g::grammar_error(format("'{}.required' must be an array of names", path), path + ".required");
      for (const json_value name : *names) {
        const auto text = name.as<std::string_view>();
        if (!text.ok()) return g::grammar_error(format("'{}.required' must be an array of names", path), path + ".required");
        required.emplace_back(*text);
      }
    }
    const auto properties_value = schema.find("properties");
    std::vector<g::expr> pairs;
    std::vector<std::string> described;
    if (properties_value) {
      const auto properties = properties_value->as<json_fields>();
      if (!properties.ok()) {
        return g::grammar_error(format("'{}.properties' must be an object of schemas", path), path + ".properties");
      }
      for (const auto [key, property] : *properties) {
        const std::string where = format("{}.properties.{}", path, key);
        if (key.empty() || key.find('<') != std::string_view::npos || trim_space(key) != key) {
          return g::grammar_error(format("'{}': a GLM-4.5 argument name must be non-empty, without '<' and without "
                                         "spaces at its ends",
                                         where),
                                  where);
        }
        std::optional<g::expr> value;
        const auto fields = property.as<json_fields>();
        if (fields.ok()) {
          if (const auto type = fields->find("type"); type && is_string_type(*type)) {
            auto raw = raw_string(*fields, where);
            if (!raw.ok()) return raw.error();
            value = std::move(raw).value();
          }
        }
        if (!value) {
          auto json = b_.json_schema(tool.parameters, {.path = path, .pointer = "/properties/" + pointer_step(key)});
          if (!json.ok()) return json.error();
          value = std::move(json).value();
        }
        const g::expr pair = g::seq({marker(family.key_open), g::literal(key), marker(family.key_close),
                                     g::literal("\n"), marker(family.value_open), *value, marker(family.value_close),
                                     g::literal("\n")});
        const bool must = std::find(required.begin(), required.end(), key) != required.end();
        pairs.push_back(must ? pair : g::optional(pair));
        described.emplace_back(key);
      }
    }
    for (const std::string& name : required) {
      if (std::find(described.begin(), described.end(), name) == described.end()) {
        return g::grammar_error(format("'{}.required' names '{}', which 'properties' does not describe", path, name),
                                path + ".required");
      }
    }
    return g::seq(std::move(pairs));
  }

  // A string-typed GLM property's raw value (the parser makes it a JSON string).
  static result<g::expr, g::grammar_error> raw_string(const json_fields& property, const std::string& path) {
    if (auto error = refuse_keywords(property, path, is_raw_string_keyword,
                                     "for a string argument of GLM-4.5's tool calls (written as raw text)")) {
      return *error;
    }
    // A raw value must survive the parser: no '<' (a closing tag), no control character, and no
    // space at its ends (the parser trims them).
    const auto writable = [](std::string_view text) {
      return text.find('<') == std::string_view::npos && trim_space(text) == text &&
             std::none_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20; });
    };
    std::vector<std::string> values;
    bool listed = false;
    for (const std::string_view keyword : {"enum", "const"}) {
      const auto given = property.find(keyword);
      if (!given) continue;
      listed = true;
      std::vector<json_value> items;
      if (const auto array = given->as<json_array>(); keyword == "enum" && array.ok()) {
        for (const json_value item : *array) items.push_back(item);
      } else {
        items.push_back(*given);
      }
      std::vector<std::string> these;
      for (const json_value& item : items) {
        const auto text = item.as<std::string_view>();
        if (!text.ok()) continue;  // null (a ["string", "null"] type): raw text cannot write it
        if (!writable(*text)) {
          return g::grammar_error(format("'{}.{}': the value '{}' cannot be written as a raw GLM-4.5 argument", path,
                                         keyword, *text),
                                  format("{}.{}", path, keyword));
        }
        if (keyword == "enum" || values.empty() ||
            std::find(values.begin(), values.end(), *text) != values.end()) {
          these.emplace_back(*text);
        }
      }
      values = std::move(these);
      if (values.empty()) {
        return g::grammar_error(format("'{}.{}' allows no string", path, keyword), format("{}.{}", path, keyword));
      }
    }
    std::int64_t min_length = 0;
    std::int64_t max_length = -1;
    for (const std::string_view keyword : {"minLength", "maxLength"}) {
      const auto given = property.find(keyword);
      if (!given) continue;
      const auto n = given->as<std::int64_t>();
      if (!n.ok() || *n < 0) {
        return g::grammar_error(format("'{}.{}' must be a non-negative integer", path, keyword),
                                format("{}.{}", path, keyword));
      }
      (keyword == "minLength" ? min_length : max_length) = *n;
    }
    if (listed) {
      std::vector<g::expr> options;
      for (const std::string& v : values) {
        const auto length = static_cast<std::int64_t>(utf8::code_points(v));
        if (length >= min_length && (max_length < 0 || length <= max_length)) options.push_back(g::literal(v));
      }
      if (options.empty()) return g::grammar_error(format("'{}' allows no string", path), path);
      return g::alt(std::move(options));
    }
    if (max_length >= 0 && max_length < min_length) {
      return g::grammar_error(format("'{}.maxLength' is below minLength: no string is valid", path), path + ".maxLength");
    }
    // Inside: any character but '<' and the controls; at the ends, not a space either.
    const g::expr inner = g::char_class({{0x00, 0x1F}, {'<', '<'}}, /*negated=*/true);
    const g::expr edge = g::char_class({{0x00, 0x20}, {'<', '<'}}, /*negated=*/true);
    std::vector<g::expr> options;
    if (min_length == 0) options.push_back(g::expr());
    if (min_length <= 1 && max_length != 0) options.push_back(edge);
    if (max_length < 0 || max_length >= 2) {
      const std::int64_t middle_min = std::max<std::int64_t>(min_length - 2, 0);
      const std::int64_t middle_max = max_length < 0 ? -1 : max_length - 2;
      options.push_back(g::seq({edge, g::repeat(inner, middle_min, middle_max), edge}));
    }
    return g::alt(std::move(options));
  }

  g::grammar_builder& b_;
  const tool_call_grammar_options& o_;
};

}  // namespace

std::string_view to_string(tool_call_parser_kind kind) {
  const family_traits* family = families::find(kind);
  return family != nullptr ? family->name : "none";
}

std::optional<tool_call_parser_kind> parse_tool_call_parser_name(std::string_view name) {
  if (name == "none") return tool_call_parser_kind::none;
  for (const family_traits* f : families::all()) {
    if (f->name == name) return f->kind;
  }
  return std::nullopt;
}

std::span<const std::string_view> tool_call_markers(tool_call_parser_kind kind) {
  const family_traits* family = families::find(kind);
  return family != nullptr ? family->markers : std::span<const std::string_view>();
}

std::string random_id(std::string_view prefix) {
  static constexpr std::string_view alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 generator{std::random_device{}()};
  std::uniform_int_distribution<std::size_t> pick(0, alphabet.size() - 1);
  std::string id(prefix);
  for (std::size_t i = 0; i < tool_call_id_length; ++i) id += alphabet[pick(generator)];
  return id;
}

std::unique_ptr<tool_call_parser> make_tool_call_parser(tool_call_parser_kind kind, std::vector<tool_spec> tools,
                                                        bool parallel_tool_calls, tool_call_id_source make_id) {
  const family_traits* family = families::find(kind);
  assert(family != nullptr);
  return std::make_unique<family_parser>(*family, std::move(tools), parallel_tool_calls, std::move(make_id));
}

result<backend::grammar::expr, backend::grammar::grammar_error> tool_call_grammar(
    backend::grammar::grammar_builder& b, const tool_call_grammar_options& options) {
  return call_grammar_writer(b, options).calls();
}

g::expr families::call_grammar_context::marker(std::string_view text) const { return marker_expr(text, o_.is_special); }

g::expr families::call_grammar_context::any_call(const std::function<g::expr(const allowed_tool&)>& call) const {
  std::vector<g::expr> options;
  options.reserve(allowed_.size());
  for (const allowed_tool& t : allowed_) options.push_back(call(t));
  return g::alt(std::move(options));
}

g::expr families::call_grammar_context::joined(const g::expr& call, std::string_view separator) const {
  if (!o_.parallel) return call;
  return g::seq({call, g::star(g::seq({g::literal(separator), call}))});
}

}  // namespace edge::gateway
