// JSON text written by hand, where a JSON library is one dependency too many: the log's JSON
// lines (edge_common needs only the standard library) and the files make-model and quantize
// write (the backend's JSON library, simdjson, only parses).
#pragma once

#include <string>
#include <string_view>

namespace edge {

// How control characters are written: `standard` escapes them and DEL as \n, \r, \t or \u00XX;
// `python` as Python's json.dumps(ensure_ascii=False) does (also \b and \f; DEL as it is), which
// chat templates' tojson must reproduce byte for byte.
enum class json_escaping { standard, python };

// Appends `text` as a JSON string literal, quotes included (RFC 8259). Quotes, backslashes and
// control characters are escaped and valid UTF-8 is passed through; a byte that is not part of
// valid UTF-8 becomes U+FFFD, so that the output is always valid JSON.
void append_json_string(std::string& out, std::string_view text, json_escaping style = json_escaping::standard);

// `text` as a JSON string literal, as append_json_string writes it.
std::string json_string(std::string_view text);

// The shortest text that reads back as exactly `value` (finite values only: JSON has no
// infinities or NaN).
std::string json_number(double value);

// Whether `text` is a JSON number as RFC 8259 spells one ("-1", "0.5", "2e-3"; not "01", "1.",
// ".5", "+1", "NaN").
bool is_json_number(std::string_view text);

}  // namespace edge
