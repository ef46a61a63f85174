// Text <-> token ids for the two tokenizer families Llama-type models use:
//
// * SentencePiece-style BPE by score with byte fallback (Llama 2, Mistral, stories260K):
//   merges the adjacent pair whose merged piece has the highest score; characters missing from
//   the vocabulary become <0xXX> byte tokens.
// * Byte-level BPE by merge rank (GPT-2, Llama 3, Qwen2): the text is split by the model's
//   pre-tokenizer regex, each piece's bytes are mapped to printable characters, then merged in
//   rank order.
//
// Both recognise added/special tokens ("<|eot_id|>") in the text when asked to.
//
// Thread safety: a loaded tokenizer is immutable. encode(), decode() and every other const
// member may be called concurrently from any number of threads on one shared instance.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "edge/backend/tokenizer/markup.h"
#include "edge/common/status.h"

namespace edge::backend {

using token_id = std::int32_t;

struct gguf_file;

class markup_tokens;

struct encode_options {
  bool add_bos = true;        // prepend BOS when the model's tokenizer does
  bool parse_special = true;  // "<|im_start|>" in the text becomes its special id, not plain text
  // Client text stays text: when set, these tokens match only where their text lies wholly
  // inside `markup` (the bytes a chat template wrote; nullptr: none, as in a completions prompt,
  // which is all the client's); elsewhere their text is encoded as ordinary text would be.
  const markup_tokens* client_text_guard = nullptr;
  const byte_ranges* markup = nullptr;
};

class tokenizer {
 public:
  virtual ~tokenizer() = default;

  // EOS is never appended. SentencePiece vocabularies prefix each run of text between special
  // tokens with the dummy space, as SentencePiece does for each separately encoded text.
  virtual std::vector<token_id> encode(std::string_view text, const encode_options& options) const = 0;

  // The bytes a token stands for, in context: `after_bos` is true for the first token after
  // BOS (SentencePiece drops that token's leading space). Special tokens give their text when
  // `with_special`, nothing otherwise. Bytes may be part of a UTF-8 character.
  virtual void append_token_bytes(token_id id, bool after_bos, bool with_special, std::string& out) const = 0;

  // Whole-sequence decoding (skips BOS/EOS and other special tokens unless `with_special`).
  // The first token, and each one after BOS, counts as `after_bos`. Invalid UTF-8 becomes U+FFFD.
  std::string decode(std::span<const token_id> ids, bool with_special = false) const;

  virtual std::int64_t vocab_size() const = 0;
  // The BOS token, when the vocabulary names one (encode() prepends it only where the model's
  // tokenizer adds BOS).
  virtual std::optional<token_id> bos_id() const = 0;
  // Tokens that end generation (EOS, and e.g. <|eot_id|> / <|im_end|> for chat models).
  virtual std::span<const token_id> eos_ids() const = 0;
  virtual bool is_special(token_id id) const = 0;
  // An added token that is not special: matched whole wherever its text occurs, whatever
  // parse_special says (Hugging Face's non-special added tokens, SentencePiece's user-defined ones).
  virtual bool is_added(token_id id) const = 0;
  // The id of a token's exact vocabulary text ("<|im_start|>", "▁the"), if any.
  virtual std::optional<token_id> find_token(std::string_view text) const = 0;
  // The vocabulary text of a token, for diagnostics.
  virtual std::string token_text(token_id id) const = 0;
};

// The tokens of a vocabulary that are a chat format's markup, which a client's text never holds
// (encode_options::client_text_guard): every special token, and the added tokens whose text the
// format writes (its template's source, its tool-call and reasoning markers): vocabularies leave
// many of those unmarked (Qwen's <tool_call> and <think>, DeepSeek-V3's <｜User｜>). An added token
// made of whitespace only is never one: vocabularies such as Gemma's spell ordinary line breaks
// and indentation with them. Immutable; any thread.
class markup_tokens {
 public:
  markup_tokens() = default;  // none
  static markup_tokens of(const tokenizer& tok, std::span<const std::string_view> format_texts);

  bool contains(token_id id) const;
  std::size_t size() const noexcept { return ids_.size(); }

 private:
  std::vector<token_id> ids_;  // sorted
};

// Turns a stream of token ids into text pieces that never end inside a UTF-8 character:
// bytes of an incomplete character are held back until the character completes. Invalid
// bytes are emitted as U+FFFD. Owned by one request.
class incremental_detokenizer {
 public:
  // `prompt_ends_with_bos`: whether the first generated token directly follows BOS.
  incremental_detokenizer(const tokenizer& tok, bool prompt_ends_with_bos = false, bool with_special = false);

  // The text completed by this token (possibly empty).
  std::string push(token_id id);
  // Whatever is still held back, as U+FFFD (an unfinished character at the end of the output).
  std::string finish();

 private:
  const tokenizer& tok_;
  bool after_bos_;
  bool with_special_;
  std::string pending_;  // bytes of an unfinished UTF-8 character
};

// The tokenizer's identity: SHA-256 (64 hex digits) of its vocabulary (each token's text, bytes
// and whether it is special), its BOS and EOS ids, and the ids it gives a fixed probe text. Two
// processes that load the same tokenizer, with or without the model's weights, get the same
// value; a split gateway compares it with its backends' before it tokenizes for them.
std::string tokenizer_fingerprint(const tokenizer& tok);

// tokenizer.json (Hugging Face `tokenizers` format; model type BPE, with or without byte
// fallback) plus, when present beside it, tokenizer_config.json (BOS handling, EOS token).
result<std::unique_ptr<tokenizer>> load_hf_tokenizer(const std::filesystem::path& tokenizer_json);
// The same from the JSON texts (tokenizer_config may be empty).
result<std::unique_ptr<tokenizer>> parse_hf_tokenizer(std::string_view tokenizer_json, std::string_view tokenizer_config);

// The vocabulary in a GGUF's metadata (tokenizer.ggml.model "llama" or "gpt2").
result<std::unique_ptr<tokenizer>> tokenizer_from_gguf(const gguf_file& file);

// A llama2.c tokenizer file (tokenizer.bin / tok512.bin) for a model of `vocab_size` tokens;
// `vocab_size` <= 0 reads every token in the file. A file shorter than it claims is data_loss.
result<std::unique_ptr<tokenizer>> load_llama2c_tokenizer(const std::filesystem::path& path, std::int64_t vocab_size);
// The same from the file's bytes (errors do not name a file).
result<std::unique_ptr<tokenizer>> parse_llama2c_tokenizer(std::string_view bytes, std::int64_t vocab_size);

// Any of the above by content: a tokenizer.json, a GGUF, a llama2.c tokenizer, or a folder
// holding a tokenizer.json.
result<std::unique_ptr<tokenizer>> load_tokenizer(const std::filesystem::path& path);

// The tokenizer of a model, without loading its weights: a GGUF's vocabulary; a folder's
// tokenizer.json, else its .gguf, else its llama2.c checkpoint's tokenizer; a .safetensors
// file's tokenizer.json beside it; a llama2.c checkpoint's tok<vocab_size>.bin or tokenizer.bin
// beside it.
result<std::unique_ptr<tokenizer>> load_model_tokenizer(const std::filesystem::path& model);

}  // namespace edge::backend
