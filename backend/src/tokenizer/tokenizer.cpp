// Decoding shared by every tokenizer, the incremental detokenizer, and choosing a loader by
// file content.
#include "edge/backend/tokenizer/tokenizer.h"

#include <algorithm>
#include <cstring>

#include "edge/backend/io/gguf.h"
#include "edge/common/format.h"
#include "edge/common/sha256.h"
#include "edge/common/utf8.h"
#include "file_io.h"
#include "jinja/python_text.h"

namespace edge::backend {
namespace fs = std::filesystem;

std::string tokenizer::decode(std::span<const token_id> ids, bool with_special) const {
  std::string bytes;
  const auto bos = bos_id();
  // SentencePiece drops the dummy-prefix space of the first piece of a text, whether or not
  // BOS precedes it.
  bool at_start = true;
  for (const token_id id : ids) {
    if (bos && id == *bos) {
      append_token_bytes(id, false, with_special, bytes);
      at_start = true;
      continue;
    }
    append_token_bytes(id, at_start, with_special, bytes);
    at_start = false;
  }
  std::string text;
  text.reserve(bytes.size());
  utf8::append_sanitized(text, bytes);
  return text;
}

std::string tokenizer_fingerprint(const tokenizer& tok) {
  // Text that exercises what differs between tokenizers of one vocabulary: pre-tokenizer
  // splits, digits, normalization, byte fallback and special-token parsing.
  static constexpr std::string_view probe =
      "Hello, world! It's 2024: caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001F600 <s> <|im_start|>x\n\t  end";
  sha256_hasher hash;
  const auto add_int = [&hash](std::int64_t value) { hash.update(format("{};", value)); };
  add_int(tok.vocab_size());
  add_int(tok.bos_id().value_or(-1));
  for (const token_id eos : tok.eos_ids()) add_int(eos);
  hash.update("|");
  std::string bytes;
  for (token_id id = 0; id < tok.vocab_size(); ++id) {
    bytes.clear();
    tok.append_token_bytes(id, /*after_bos=*/false, /*with_special=*/true, bytes);
    const std::string text = tok.token_text(id);
    add_int(static_cast<std::int64_t>(text.size()));
    hash.update(text);
    add_int(static_cast<std::int64_t>(bytes.size()));
    hash.update(bytes);
    add_int(tok.is_special(id) ? 1 : 0);
  }
  hash.update("|");
  for (const token_id id : tok.encode(probe, {.add_bos = true, .parse_special = true})) add_int(id);
  return to_hex(hash.finish());
}

markup_tokens markup_tokens::of(const tokenizer& tok, std::span<const std::string_view> format_texts) {
  const auto whitespace_only = [](std::string_view text) {
    const auto points = jinja::python::code_points(text);
    return std::all_of(points.begin(), points.end(), jinja::python::is_space);
  };
  const auto written = [&](std::string_view text) {
    return std::any_of(format_texts.begin(), format_texts.end(),
                       [&](std::string_view source) { return source.find(text) != std::string_view::npos; });
  };
  markup_tokens set;
  for (token_id id = 0; id < tok.vocab_size(); ++id) {
    if (tok.is_special(id)) {
      set.ids_.push_back(id);
    } else if (tok.is_added(id)) {
      const std::string text = tok.token_text(id);
      if (!text.empty() && !whitespace_only(text) && written(text)) set.ids_.push_back(id);
    }
  }
  return set;
}

bool markup_tokens::contains(token_id id) const { return std::binary_search(ids_.begin(), ids_.end(), id); }

incremental_detokenizer::incremental_detokenizer(const tokenizer& tok, bool prompt_ends_with_bos, bool with_special)
    : tok_(tok), after_bos_(prompt_ends_with_bos), with_special_(with_special) {}

std::string incremental_detokenizer::push(token_id id) {
  std::string bytes = std::move(pending_);
  pending_.clear();
  const auto bos = tok_.bos_id();
  if (bos && id == *bos) {
    tok_.append_token_bytes(id, false, with_special_, bytes);
    after_bos_ = true;
  } else {
    tok_.append_token_bytes(id, after_bos_, with_special_, bytes);
    after_bos_ = false;
  }
  const std::size_t held = utf8::incomplete_tail(bytes);
  pending_.assign(bytes, bytes.size() - held, held);
  bytes.resize(bytes.size() - held);
  std::string text;
  text.reserve(bytes.size());
  utf8::append_sanitized(text, bytes);
  return text;
}

std::string incremental_detokenizer::finish() {
  std::string text;
  utf8::append_sanitized(text, pending_);
  pending_.clear();
  return text;
}

namespace {

enum class file_kind { gguf, json, other };

result<file_kind> sniff(const fs::path& path) {
  auto head = detail::read_file_prefix(path, 64);
  if (!head.ok()) return head.error();
  std::string_view text = *head;
  if (text.size() >= 4 && text.substr(0, 4) == "GGUF") return file_kind::gguf;
  if (text.starts_with("\xEF\xBB\xBF")) text.remove_prefix(3);
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && text[first] == '{') return file_kind::json;
  return file_kind::other;
}

result<std::unique_ptr<tokenizer>> load_gguf_vocabulary(const fs::path& path) {
  EDGE_ASSIGN_OR_RETURN(auto file, load_gguf(path));
  auto tok = tokenizer_from_gguf(file);
  if (!tok.ok()) return tok.error().with_context(path.string());
  return tok;
}

// The vocabulary size in a llama2.c checkpoint's header (seven int32: dim, hidden_dim,
// n_layers, n_heads, n_kv_heads, vocab_size, seq_len; a negative vocab_size marks an unshared
// classifier).
result<std::int64_t> llama2c_vocab_size(const fs::path& checkpoint) {
  EDGE_ASSIGN_OR_RETURN(auto header, detail::read_file_prefix(checkpoint, 7 * sizeof(std::int32_t)));
  if (header.size() < 7 * sizeof(std::int32_t)) {
    return invalid_argument(format("{} is too short to be a llama2.c checkpoint", checkpoint.string()));
  }
  std::int32_t vocab = 0;
  std::memcpy(&vocab, header.data() + 5 * sizeof(std::int32_t), sizeof vocab);
  const std::int64_t size = vocab < 0 ? -static_cast<std::int64_t>(vocab) : vocab;
  if (size <= 0 || size > (1 << 24)) {
    return invalid_argument(format("{} is not a llama2.c checkpoint (vocab_size {})", checkpoint.string(), vocab));
  }
  return size;
}

result<std::unique_ptr<tokenizer>> tokenizer_beside_llama2c(const fs::path& checkpoint) {
  EDGE_ASSIGN_OR_RETURN(const std::int64_t vocab, llama2c_vocab_size(checkpoint));
  const fs::path folder = checkpoint.parent_path();
  const fs::path candidates[] = {folder / format("tok{}.bin", vocab), folder / "tokenizer.bin"};
  std::error_code ec;
  for (const fs::path& candidate : candidates) {
    if (fs::is_regular_file(candidate, ec)) return load_llama2c_tokenizer(candidate, vocab);
  }
  return not_found(format("no tokenizer beside the llama2.c checkpoint {}: looked for {} and {}", checkpoint.string(),
                          candidates[0].string(), candidates[1].string()));
}

std::vector<fs::path> files_with_extension(const fs::path& folder, std::string_view extension) {
  std::vector<fs::path> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    if (entry.is_regular_file(ec) && entry.path().extension() == extension) found.push_back(entry.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace

result<std::unique_ptr<tokenizer>> load_tokenizer(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path json = path / "tokenizer.json";
    if (!fs::is_regular_file(json, ec)) return not_found(format("no tokenizer.json in the folder {}", path.string()));
    return load_hf_tokenizer(json);
  }
  EDGE_ASSIGN_OR_RETURN(const file_kind kind, sniff(path));
  switch (kind) {
    case file_kind::gguf: return load_gguf_vocabulary(path);
    case file_kind::json: return load_hf_tokenizer(path);
    case file_kind::other: break;
  }
  return load_llama2c_tokenizer(path, 0);
}

result<std::unique_ptr<tokenizer>> load_model_tokenizer(const fs::path& model) {
  std::error_code ec;
  if (!fs::exists(model, ec)) return not_found(format("model path {} does not exist", model.string()));
  if (fs::is_directory(model, ec)) {
    if (fs::is_regular_file(model / "tokenizer.json", ec)) return load_hf_tokenizer(model / "tokenizer.json");
    if (const auto ggufs = files_with_extension(model, ".gguf"); !ggufs.empty()) return load_gguf_vocabulary(ggufs[0]);
    for (const fs::path& bin : files_with_extension(model, ".bin")) {
      const std::string name = bin.filename().string();
      if (name.starts_with("tok")) continue;
      if (llama2c_vocab_size(bin).ok()) return tokenizer_beside_llama2c(bin);
    }
    return not_found(format("no tokenizer in the model folder {} (looked for tokenizer.json, a .gguf and a llama2.c "
                            "checkpoint with its tokenizer)",
                            model.string()));
  }
  if (model.extension() == ".safetensors") return load_hf_tokenizer(model.parent_path() / "tokenizer.json");
  EDGE_ASSIGN_OR_RETURN(const file_kind kind, sniff(model));
  switch (kind) {
    case file_kind::gguf: return load_gguf_vocabulary(model);
    case file_kind::json: return load_hf_tokenizer(model);
    case file_kind::other: break;
  }
  return tokenizer_beside_llama2c(model);
}

}  // namespace edge::backend
