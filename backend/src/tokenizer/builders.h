// How the loaders (tokenizer.json, GGUF metadata, llama2.c files) describe a tokenizer to the
// two implementations: plain settings structs, validated by the make_* functions.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "edge/backend/tokenizer/tokenizer.h"
#include "edge/common/status.h"
#include "pcre_regex.h"
#include "unicode_normalize.h"
#include "vocabulary.h"

namespace edge::backend::detail {

// ---- SentencePiece BPE by score ------------------------------------------------------------

struct spm_settings {
  std::vector<std::string> texts;  // [vocab] pieces, "▁" for a space
  std::vector<float> scores;       // [vocab]
  std::vector<token_kind> kinds;   // [vocab]
  bool add_space_prefix = true;    // SentencePiece's add_dummy_prefix
  bool add_bos = true;
  std::optional<token_id> bos;
  std::optional<token_id> eos;
  std::optional<token_id> unknown;
};

result<std::unique_ptr<tokenizer>> make_spm_tokenizer(spm_settings settings);

// ---- BPE by merge rank (byte-level, or over characters with byte fallback) ------------------

struct normalizer_step {
  enum class type { unicode, prepend, replace };
  type kind = type::unicode;
  normalization_form form = normalization_form::nfc;  // unicode
  std::string text;                                   // prepend: the prefix; replace: the literal
  std::optional<pcre_regex> regex;                    // replace: a regex pattern instead of `text`
  std::string content;                                // replace: the replacement
};

// Hugging Face's SplitDelimiterBehavior.
enum class split_behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

enum class prepend_scheme { always, first, never };

struct pre_tokenizer_step {
  enum class type { split, byte_level, metaspace };
  type kind = type::split;
  // split (also the regex of byte_level with use_regex, and Digits as \p{N} or \p{N}+)
  std::optional<pcre_regex> regex;
  std::string literal;  // split on this text when there is no regex
  split_behavior behavior = split_behavior::isolated;
  bool invert = false;
  // byte_level
  bool add_prefix_space = false;
  // metaspace
  std::string replacement = std::string(spm_space);
  prepend_scheme prepend = prepend_scheme::always;
  bool split_on_replacement = true;
};

struct added_token {
  std::string content;
  token_id id = 0;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
};

struct bpe_settings {
  std::vector<std::string> texts;  // [vocab] model vocabulary; empty for unused ids
  std::vector<token_kind> kinds;   // [vocab]
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  std::vector<added_token> added;  // matched in the text before normalization
  bool byte_level = true;          // symbols are GPT-2's byte-to-character mapping of the bytes
  bool byte_fallback = false;      // unknown characters become <0xXX> tokens
  bool ignore_merges = false;      // a pre-token that is itself in the vocabulary is used whole
  bool fuse_unk = false;
  std::optional<token_id> unknown;
  std::vector<normalizer_step> normalizers;
  std::vector<pre_tokenizer_step> pre_tokenizers;
  // Decoding, applied to each token's text in this order.
  bool decode_byte_level = true;
  std::string decode_replace_from;  // e.g. "▁" (to a space); empty: none
  bool decode_byte_fallback = false;
  bool strip_space_after_bos = false;
  bool add_bos = false;
  std::optional<token_id> bos;
  std::optional<token_id> eos;
};

result<std::unique_ptr<tokenizer>> make_bpe_tokenizer(bpe_settings settings);

// GPT-2's reversible byte-to-character mapping (byte-level BPE): printable Latin-1 bytes stand
// for themselves, the others for U+0100 onwards, in byte order.
std::array<char32_t, 256> byte_to_char_table();

// The pre-tokenizer regexes models name (GPT-2's is also ByteLevel's use_regex).
inline constexpr std::string_view gpt2_pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view llama3_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view qwen2_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace edge::backend::detail
