// Which bytes of a chat prompt are markup: what the chat template wrote (its own text and
// literals, BOS and EOS, the roles), as opposed to what a client sent (message contents, tool
// results, tool-call arguments and names, tool definitions), which is ordinary text. The
// renderers record it as they write the prompt (jinja.h, chat_template.h); the tokenizer lets a
// chat format's markup tokens match only inside it (encode_options), so that "<|im_start|>" in
// a user's message or a tool's result stays text and can never open a turn.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace edge::backend {

struct byte_range {
  std::size_t begin = 0;
  std::size_t end = 0;  // past the last byte

  friend bool operator==(const byte_range&, const byte_range&) = default;
};

// A set of bytes of one text, kept as sorted, disjoint, non-adjacent, non-empty ranges.
class byte_ranges {
 public:
  byte_ranges() = default;
  byte_ranges(std::initializer_list<byte_range> ranges);

  // Adds [begin, end) (nothing when empty). Cheapest at or after the last range, where
  // renderers add.
  void add(std::size_t begin, std::size_t end);
  // Adds the bytes of `other` that lie in [from, to), moved so that `from` lands on `at`.
  void add_part(const byte_ranges& other, std::size_t from, std::size_t to, std::size_t at);
  // Whether every byte of [begin, end) is in the set (an empty range always is).
  bool covers(std::size_t begin, std::size_t end) const;
  bool empty() const noexcept { return ranges_.empty(); }
  std::span<const byte_range> ranges() const noexcept { return ranges_; }

  friend bool operator==(const byte_ranges&, const byte_ranges&) = default;

 private:
  std::vector<byte_range> ranges_;
};

// Text written piece by piece, each piece markup or ordinary text.
struct marked_text {
  std::string text;
  byte_ranges markup;  // of `text`

  void append_markup(std::string_view piece);
  void append_text(std::string_view piece);
  // Bytes [from, to) of `piece`, markup where `piece_markup` (ranges of `piece`) says.
  void append_part(std::string_view piece, const byte_ranges& piece_markup, std::size_t from, std::size_t to);
  void append(const marked_text& other) { append_part(other.text, other.markup, 0, other.text.size()); }
};

}  // namespace edge::backend
