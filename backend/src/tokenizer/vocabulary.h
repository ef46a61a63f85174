// What both tokenizer families share: the vocabulary (text, kind and decoded bytes of every
// id), special/added-token matching in the text, BOS/EOS, and decoding. A family derives from
// vocab_tokenizer and supplies encode_run() for text between special tokens.
//
// Thread safety: a vocab_tokenizer is immutable once built; encode() and decode() are const and
// may run concurrently on any number of threads.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "edge/backend/tokenizer/tokenizer.h"

namespace edge::backend::detail {

// SentencePiece's piece types, which GGUF's tokenizer.ggml.token_type numbers 1..6.
enum class token_kind : std::uint8_t { normal, unknown, control, user_defined, unused, byte };

struct string_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view text) const noexcept { return std::hash<std::string_view>{}(text); }
};

using token_map = std::unordered_map<std::string, token_id, string_hash, std::equal_to<>>;

// Finds special and added tokens in text: leftmost match first, the longest at one position.
class special_token_matcher {
 public:
  struct options {
    bool always = false;  // matched even when the caller does not parse special tokens
    bool lstrip = false;  // swallows the whitespace before it
    bool rstrip = false;  // swallows the whitespace after it
  };

  void add(std::string text, token_id id, options how);
  // Orders each bucket longest first; call once after the last add().
  void finish();
  bool empty() const { return entries_.empty(); }

  struct piece {
    std::size_t begin = 0;
    std::size_t end = 0;
    std::optional<token_id> token;  // nullopt: plain text [begin, end)
  };
  // The text as alternating runs of plain text and matched tokens, in order. Empty runs are left
  // out. The tokens of how.client_text_guard match only wholly inside how.markup.
  void split(std::string_view text, const encode_options& how, std::vector<piece>& out) const;

 private:
  struct entry {
    std::string text;
    token_id id;
    options how;
  };
  std::vector<entry> entries_;
  std::array<std::vector<std::uint32_t>, 256> by_first_byte_;  // indexes into entries_, longest first
};

class vocab_tokenizer : public tokenizer {
 public:
  std::vector<token_id> encode(std::string_view text, const encode_options& options) const final;
  void append_token_bytes(token_id id, bool after_bos, bool with_special, std::string& out) const final;

  std::int64_t vocab_size() const final { return static_cast<std::int64_t>(texts_.size()); }
  std::optional<token_id> bos_id() const final { return bos_; }
  std::span<const token_id> eos_ids() const final { return eos_; }
  bool is_special(token_id id) const final;
  bool is_added(token_id id) const final;
  std::optional<token_id> find_token(std::string_view text) const final;
  std::string token_text(token_id id) const final;

 protected:
  // Appends the ids of a run of text that holds no special token. `at_start`: the run begins
  // the text passed to encode() (no token precedes it).
  virtual void encode_run(std::string_view run, bool at_start, std::vector<token_id>& out) const = 0;

  // The id of an exact vocabulary text whose kind is normal or user-defined: what BPE merges
  // may produce.
  std::optional<token_id> find_piece(std::string_view text) const;
  bool valid(token_id id) const { return id >= 0 && static_cast<std::size_t>(id) < texts_.size(); }

  // Filled by the loaders, never changed afterwards.
  std::vector<std::string> texts_;     // [vocab_size] vocabulary text
  std::vector<std::string> decoded_;   // [vocab_size] the bytes each token stands for
  std::vector<token_kind> kinds_;      // [vocab_size]
  token_map ids_;                      // text -> id (the first id when a text repeats)
  special_token_matcher specials_;
  std::optional<token_id> bos_;
  bool add_bos_ = false;               // whether encode() prepends BOS when asked to
  std::vector<token_id> eos_;
  bool strip_space_after_bos_ = false;  // SentencePiece's dummy prefix, undone when decoding

  // Fills ids_ from texts_ (the lowest id wins a repeated text).
  void index_texts();
  // eos_ from a configured id plus the end-of-turn tokens present in the vocabulary.
  void set_eos(std::optional<token_id> configured);
  // Registers every control/unknown token (matched when parsing special tokens) and every
  // user-defined token (always matched) with the matcher.
  void register_special_tokens();
};

// The text SentencePiece writes for a space.
inline constexpr std::string_view spm_space = "\xE2\x96\x81";  // U+2581 "▁"

// "<0x41>" -> 0x41; nullopt for anything else.
std::optional<std::uint8_t> parse_byte_token(std::string_view text);

}  // namespace edge::backend::detail
