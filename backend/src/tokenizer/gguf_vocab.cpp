// tokenizer_from_gguf: the vocabulary llama.cpp's converters write into GGUF metadata
// (tokenizer.ggml.*), as a SentencePiece ("llama") or byte-level BPE ("gpt2") tokenizer.
#include "builders.h"
#include "edge/backend/io/gguf.h"
#include "edge/common/format.h"

namespace edge::backend {
namespace {

// Reads metadata through the variant directly, so this file needs nothing from the parser.
const gguf_value* find_key(const gguf_file& file, std::string_view key) {
  const auto it = file.metadata.find(key);
  return it == file.metadata.end() ? nullptr : &it->second;
}

std::optional<std::int64_t> integer(const gguf_value& value) {
  if (const auto* u = std::get_if<std::uint64_t>(&value.value)) {
    if (*u > static_cast<std::uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<std::int64_t>(*u);
  }
  if (const auto* i = std::get_if<std::int64_t>(&value.value)) return *i;
  return std::nullopt;
}

std::optional<std::int64_t> integer_key(const gguf_file& file, std::string_view key) {
  const gguf_value* value = find_key(file, key);
  return value ? integer(*value) : std::nullopt;
}

std::optional<bool> bool_key(const gguf_file& file, std::string_view key) {
  const gguf_value* value = find_key(file, key);
  if (!value) return std::nullopt;
  if (const auto* b = std::get_if<bool>(&value->value)) return *b;
  if (const auto i = integer(*value)) return *i != 0;
  return std::nullopt;
}

std::optional<token_id> id_key(const gguf_file& file, std::string_view key) {
  const auto value = integer_key(file, key);
  if (!value || *value < 0 || *value > INT32_MAX) return std::nullopt;
  return static_cast<token_id>(*value);
}

const gguf_array* array_key(const gguf_file& file, std::string_view key) {
  const gguf_value* value = find_key(file, key);
  return value ? std::get_if<gguf_array>(&value->value) : nullptr;
}

result<std::vector<std::string>> string_array(const gguf_file& file, std::string_view key) {
  const gguf_array* array = array_key(file, key);
  if (!array) return invalid_argument(format("the GGUF has no {} array", key));
  std::vector<std::string> out;
  out.reserve(array->size());
  for (const gguf_value& element : *array) {
    const auto* text = std::get_if<std::string>(&element.value);
    if (!text) return invalid_argument(format("{} holds a value that is not a string", key));
    out.push_back(*text);
  }
  return out;
}

// token_type, with SentencePiece's numbering (1 normal .. 6 byte); a missing array makes every
// token normal except the <0xXX> ones.
result<std::vector<detail::token_kind>> token_kinds(const gguf_file& file, const std::vector<std::string>& tokens) {
  std::vector<detail::token_kind> kinds(tokens.size(), detail::token_kind::normal);
  const gguf_array* types = array_key(file, "tokenizer.ggml.token_type");
  if (!types) {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      if (detail::parse_byte_token(tokens[i])) kinds[i] = detail::token_kind::byte;
    }
    return kinds;
  }
  if (types->size() != tokens.size()) {
    return invalid_argument(format("tokenizer.ggml.token_type has {} entries for {} tokens", types->size(), tokens.size()));
  }
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const auto type = integer((*types)[i]);
    if (!type) return invalid_argument("tokenizer.ggml.token_type holds a value that is not an integer");
    switch (*type) {
      case 2: kinds[i] = detail::token_kind::unknown; break;
      case 3: kinds[i] = detail::token_kind::control; break;
      case 4: kinds[i] = detail::token_kind::user_defined; break;
      case 5: kinds[i] = detail::token_kind::unused; break;
      case 6: kinds[i] = detail::token_kind::byte; break;
      default: kinds[i] = detail::token_kind::normal; break;
    }
  }
  return kinds;
}

result<std::unique_ptr<tokenizer>> spm_from_gguf(const gguf_file& file) {
  detail::spm_settings s;
  EDGE_ASSIGN_OR_RETURN(s.texts, string_array(file, "tokenizer.ggml.tokens"));
  EDGE_ASSIGN_OR_RETURN(s.kinds, token_kinds(file, s.texts));
  s.scores.assign(s.texts.size(), 0.0f);
  if (const gguf_array* scores = array_key(file, "tokenizer.ggml.scores")) {
    if (scores->size() != s.texts.size()) {
      return invalid_argument(format("tokenizer.ggml.scores has {} entries for {} tokens", scores->size(), s.texts.size()));
    }
    for (std::size_t i = 0; i < scores->size(); ++i) {
      const gguf_value& v = (*scores)[i];
      if (const auto* d = std::get_if<double>(&v.value)) {
        s.scores[i] = static_cast<float>(*d);
      } else if (const auto n = integer(v)) {
        s.scores[i] = static_cast<float>(*n);
      } else {
        return invalid_argument("tokenizer.ggml.scores holds a value that is not a number");
      }
    }
  }
  // llama.cpp's defaults for a SentencePiece vocabulary when the keys are absent.
  s.bos = id_key(file, "tokenizer.ggml.bos_token_id").value_or(1);
  s.eos = id_key(file, "tokenizer.ggml.eos_token_id").value_or(2);
  s.unknown = id_key(file, "tokenizer.ggml.unknown_token_id").value_or(0);
  s.add_bos = bool_key(file, "tokenizer.ggml.add_bos_token").value_or(true);
  s.add_space_prefix = bool_key(file, "tokenizer.ggml.add_space_prefix").value_or(true);
  const auto n = static_cast<token_id>(s.texts.size());
  for (auto* id : {&s.bos, &s.eos, &s.unknown}) {
    if (*id && **id >= n) id->reset();
  }
  if (!s.bos) s.add_bos = false;
  return detail::make_spm_tokenizer(std::move(s));
}

// tokenizer.ggml.pre names the pre-tokenizer regex of llama.cpp's table.
result<std::pair<std::string_view, bool>> pre_tokenizer_pattern(const gguf_file& file) {
  const gguf_value* value = find_key(file, "tokenizer.ggml.pre");
  const auto* name = value ? value->as_string() : nullptr;
  if (!name || *name == "default" || *name == "gpt-2" || *name == "gpt2") {
    return std::pair{detail::gpt2_pattern, false};
  }
  if (*name == "llama-bpe" || *name == "llama3" || *name == "llama-v3" || *name == "smaug-bpe") {
    return std::pair{detail::llama3_pattern, true};
  }
  if (*name == "qwen2" || *name == "deepseek-r1-qwen") return std::pair{detail::qwen2_pattern, false};
  return status(status_code::unimplemented, format("GGUF pre-tokenizer \"{}\" is not supported", *name));
}

result<std::unique_ptr<tokenizer>> bpe_from_gguf(const gguf_file& file) {
  detail::bpe_settings s;
  EDGE_ASSIGN_OR_RETURN(s.texts, string_array(file, "tokenizer.ggml.tokens"));
  EDGE_ASSIGN_OR_RETURN(s.kinds, token_kinds(file, s.texts));
  EDGE_ASSIGN_OR_RETURN(auto merges, string_array(file, "tokenizer.ggml.merges"));
  s.merges.reserve(merges.size());
  for (const std::string& merge : merges) {
    const std::size_t space = merge.find(' ');
    if (space == std::string::npos) return invalid_argument(format("tokenizer.ggml.merges entry \"{}\" is not two tokens", merge));
    s.merges.emplace_back(merge.substr(0, space), merge.substr(space + 1));
  }
  for (std::size_t id = 0; id < s.texts.size(); ++id) {
    const detail::token_kind kind = s.kinds[id];
    if (kind == detail::token_kind::control || kind == detail::token_kind::user_defined) {
      s.added.push_back({.content = s.texts[id], .id = static_cast<token_id>(id),
                         .special = kind == detail::token_kind::control});
    }
  }
  EDGE_ASSIGN_OR_RETURN(auto pre, pre_tokenizer_pattern(file));
  EDGE_ASSIGN_OR_RETURN(auto regex, detail::pcre_regex::compile(pre.first));
  s.pre_tokenizers.push_back({.kind = detail::pre_tokenizer_step::type::byte_level, .regex = std::move(regex)});
  s.ignore_merges = pre.second;
  s.byte_level = true;
  s.decode_byte_level = true;
  s.bos = id_key(file, "tokenizer.ggml.bos_token_id");
  s.eos = id_key(file, "tokenizer.ggml.eos_token_id");
  s.unknown = id_key(file, "tokenizer.ggml.unknown_token_id");
  s.add_bos = bool_key(file, "tokenizer.ggml.add_bos_token").value_or(false);
  const auto n = static_cast<token_id>(s.texts.size());
  for (auto* id : {&s.bos, &s.eos, &s.unknown}) {
    if (*id && **id >= n) id->reset();
  }
  if (!s.bos) s.add_bos = false;
  return detail::make_bpe_tokenizer(std::move(s));
}

}  // namespace

result<std::unique_ptr<tokenizer>> tokenizer_from_gguf(const gguf_file& file) {
  const gguf_value* model = find_key(file, "tokenizer.ggml.model");
  const auto* name = model ? model->as_string() : nullptr;
  if (!name) return invalid_argument("the GGUF has no tokenizer.ggml.model");
  if (*name == "llama") return spm_from_gguf(file);
  if (*name == "gpt2") return bpe_from_gguf(file);
  return status(status_code::unimplemented, format("GGUF tokenizer model \"{}\" is not supported (llama or gpt2)", *name));
}

}  // namespace edge::backend
