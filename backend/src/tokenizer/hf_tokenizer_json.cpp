// Hugging Face tokenizer.json (model type BPE) and tokenizer_config.json, parsed with simdjson's
// DOM into bpe_settings. Components outside what Llama/Mistral/Qwen-family files use are
// refused by name (unimplemented), never silently approximated.
#include <simdjson.h>


#include "builders.h"
#include "edge/common/format.h"
#include "file_io.h"

namespace edge::backend {
namespace {

using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::object;

status json_error(std::string_view what, simdjson::error_code error) {
  return invalid_argument(format("{}: {}", what, simdjson::error_message(error)));
}

std::optional<element> member(const element& e, std::string_view key) {
  element value;
  if (e.type() != simdjson::dom::element_type::OBJECT) return std::nullopt;
  if (e[key].get(value) != simdjson::SUCCESS || value.is_null()) return std::nullopt;
  return value;
}

std::optional<std::string_view> member_string(const element& e, std::string_view key) {
  const auto value = member(e, key);
  if (!value) return std::nullopt;
  std::string_view text;
  if (value->get_string().get(text) != simdjson::SUCCESS) return std::nullopt;
  return text;
}

bool member_bool(const element& e, std::string_view key, bool fallback) {
  const auto value = member(e, key);
  bool flag = fallback;
  if (value && value->get_bool().get(flag) != simdjson::SUCCESS) return fallback;
  return flag;
}

std::optional<std::int64_t> member_int(const element& e, std::string_view key) {
  const auto value = member(e, key);
  std::int64_t number = 0;
  if (!value || value->get_int64().get(number) != simdjson::SUCCESS) return std::nullopt;
  return number;
}

struct config_fields {
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<bool> add_bos_token;
};

// A tokenizer_config.json token: "<s>", {"content": "<s>", ...} or null.
std::optional<std::string> config_token(simdjson::ondemand::value value) {
  simdjson::ondemand::json_type type;
  if (value.type().get(type) != simdjson::SUCCESS) return std::nullopt;
  std::string_view text;
  if (type == simdjson::ondemand::json_type::string) {
    if (value.get_string().get(text) != simdjson::SUCCESS) return std::nullopt;
    return std::string(text);
  }
  if (type == simdjson::ondemand::json_type::object) {
    if (value.find_field_unordered("content").get_string().get(text) != simdjson::SUCCESS) return std::nullopt;
    return std::string(text);
  }
  return std::nullopt;
}

// tokenizer_config.json through simdjson's on-demand API, which leaves the fields it is not
// asked for unparsed: some files hold numbers no 64-bit type can (Llama 3's model_max_length
// is 1e30 written out in digits).
result<config_fields> parse_config(std::string_view json) {
  simdjson::ondemand::parser parser;
  const simdjson::padded_string padded(json);
  simdjson::ondemand::document document;
  if (auto error = parser.iterate(padded).get(document)) return json_error("tokenizer_config.json", error);
  simdjson::ondemand::object object;
  if (auto error = document.get_object().get(object)) return json_error("tokenizer_config.json", error);
  config_fields fields;
  for (auto entry : object) {
    simdjson::ondemand::field field;
    if (auto error = std::move(entry).get(field)) return json_error("tokenizer_config.json", error);
    std::string_view key;
    if (auto error = field.unescaped_key().get(key)) return json_error("tokenizer_config.json", error);
    if (key == "bos_token") {
      fields.bos_token = config_token(field.value());
    } else if (key == "eos_token") {
      fields.eos_token = config_token(field.value());
    } else if (key == "add_bos_token") {
      bool flag = false;
      if (field.value().get_bool().get(flag) == simdjson::SUCCESS) fields.add_bos_token = flag;
    }
  }
  return fields;
}

// A "pattern" member: {"String": "..."} or {"Regex": "..."}.
struct pattern_spec {
  std::string text;
  bool is_regex = false;
};

result<pattern_spec> parse_pattern(const element& e, std::string_view owner) {
  const auto pattern = member(e, "pattern");
  if (!pattern) return invalid_argument(format("{} has no pattern", owner));
  if (const auto text = member_string(*pattern, "String")) return pattern_spec{std::string(*text), false};
  if (const auto regex = member_string(*pattern, "Regex")) return pattern_spec{std::string(*regex), true};
  return invalid_argument(format("{} pattern is neither String nor Regex", owner));
}

status parse_normalizer(const element& e, std::vector<detail::normalizer_step>& out) {
  using detail::normalizer_step;
  const auto type = member_string(e, "type");
  if (!type) return invalid_argument("normalizer without a type");
  const auto unicode = [&](detail::normalization_form form) {
    out.push_back({.kind = normalizer_step::type::unicode, .form = form});
    return status{};
  };
  if (*type == "NFC") return unicode(detail::normalization_form::nfc);
  if (*type == "NFD") return unicode(detail::normalization_form::nfd);
  if (*type == "NFKC") return unicode(detail::normalization_form::nfkc);
  if (*type == "NFKD") return unicode(detail::normalization_form::nfkd);
  if (*type == "Sequence") {
    array steps;
    const auto list = member(e, "normalizers");
    if (!list || list->get_array().get(steps) != simdjson::SUCCESS) {
      return invalid_argument("normalizer Sequence without a normalizers array");
    }
    for (element step : steps) EDGE_RETURN_IF_ERROR(parse_normalizer(step, out));
    return {};
  }
  if (*type == "Prepend") {
    const auto prefix = member_string(e, "prepend");
    if (!prefix) return invalid_argument("normalizer Prepend without a prepend string");
    out.push_back({.kind = normalizer_step::type::prepend, .text = std::string(*prefix)});
    return {};
  }
  if (*type == "Replace") {
    EDGE_ASSIGN_OR_RETURN(auto pattern, parse_pattern(e, "normalizer Replace"));
    const auto content = member_string(e, "content");
    if (!content) return invalid_argument("normalizer Replace without content");
    normalizer_step step{.kind = normalizer_step::type::replace, .content = std::string(*content)};
    if (pattern.is_regex) {
      EDGE_ASSIGN_OR_RETURN(auto regex, detail::pcre_regex::compile(pattern.text));
      step.regex = std::move(regex);
    } else {
      step.text = std::move(pattern.text);
    }
    out.push_back(std::move(step));
    return {};
  }
  return status(status_code::unimplemented, format("normalizer type \"{}\" is not supported", *type));
}

result<detail::split_behavior> parse_behavior(std::string_view name) {
  using detail::split_behavior;
  if (name == "Removed") return split_behavior::removed;
  if (name == "Isolated") return split_behavior::isolated;
  if (name == "MergedWithPrevious") return split_behavior::merged_with_previous;
  if (name == "MergedWithNext") return split_behavior::merged_with_next;
  if (name == "Contiguous") return split_behavior::contiguous;
  return invalid_argument(format("unknown Split behavior \"{}\"", name));
}

result<detail::prepend_scheme> parse_prepend_scheme(const element& e) {
  if (const auto scheme = member_string(e, "prepend_scheme")) {
    if (*scheme == "always") return detail::prepend_scheme::always;
    if (*scheme == "first") return detail::prepend_scheme::first;
    if (*scheme == "never") return detail::prepend_scheme::never;
    return invalid_argument(format("unknown Metaspace prepend_scheme \"{}\"", *scheme));
  }
  // Files written before prepend_scheme existed say add_prefix_space.
  return member_bool(e, "add_prefix_space", true) ? detail::prepend_scheme::always : detail::prepend_scheme::never;
}

status parse_pre_tokenizer(const element& e, detail::bpe_settings& settings, bool& saw_byte_level) {
  using detail::pre_tokenizer_step;
  const auto type = member_string(e, "type");
  if (!type) return invalid_argument("pre_tokenizer without a type");
  if (saw_byte_level && *type != "Sequence") {
    return status(status_code::unimplemented, format("pre_tokenizer \"{}\" after ByteLevel is not supported", *type));
  }
  if (*type == "Sequence") {
    array steps;
    const auto list = member(e, "pretokenizers");
    if (!list || list->get_array().get(steps) != simdjson::SUCCESS) {
      return invalid_argument("pre_tokenizer Sequence without a pretokenizers array");
    }
    for (element step : steps) EDGE_RETURN_IF_ERROR(parse_pre_tokenizer(step, settings, saw_byte_level));
    return {};
  }
  if (*type == "Split") {
    EDGE_ASSIGN_OR_RETURN(auto pattern, parse_pattern(e, "pre_tokenizer Split"));
    const auto behavior_name = member_string(e, "behavior");
    EDGE_ASSIGN_OR_RETURN(auto behavior, parse_behavior(behavior_name.value_or("Isolated")));
    pre_tokenizer_step step{.kind = pre_tokenizer_step::type::split, .behavior = behavior,
                            .invert = member_bool(e, "invert", false)};
    if (pattern.is_regex) {
      EDGE_ASSIGN_OR_RETURN(auto regex, detail::pcre_regex::compile(pattern.text));
      step.regex = std::move(regex);
    } else {
      step.literal = std::move(pattern.text);
    }
    settings.pre_tokenizers.push_back(std::move(step));
    return {};
  }
  if (*type == "ByteLevel") {
    pre_tokenizer_step step{.kind = pre_tokenizer_step::type::byte_level,
                            .add_prefix_space = member_bool(e, "add_prefix_space", true)};
    if (member_bool(e, "use_regex", true)) {
      EDGE_ASSIGN_OR_RETURN(auto regex, detail::pcre_regex::compile(detail::gpt2_pattern));
      step.regex = std::move(regex);
    }
    settings.pre_tokenizers.push_back(std::move(step));
    settings.byte_level = true;
    saw_byte_level = true;
    return {};
  }
  if (*type == "Digits") {
    const bool individual = member_bool(e, "individual_digits", false);
    EDGE_ASSIGN_OR_RETURN(auto regex, detail::pcre_regex::compile(individual ? R"(\p{N})" : R"(\p{N}+)"));
    settings.pre_tokenizers.push_back(
        {.kind = pre_tokenizer_step::type::split, .regex = std::move(regex), .behavior = detail::split_behavior::isolated});
    return {};
  }
  if (*type == "Metaspace") {
    EDGE_ASSIGN_OR_RETURN(auto scheme, parse_prepend_scheme(e));
    pre_tokenizer_step step{.kind = pre_tokenizer_step::type::metaspace, .prepend = scheme,
                            .split_on_replacement = member_bool(e, "split", true)};
    if (const auto replacement = member_string(e, "replacement")) step.replacement = std::string(*replacement);
    settings.pre_tokenizers.push_back(std::move(step));
    return {};
  }
  return status(status_code::unimplemented, format("pre_tokenizer type \"{}\" is not supported", *type));
}

status parse_decoder(const element& e, detail::bpe_settings& settings) {
  const auto type = member_string(e, "type");
  if (!type) return invalid_argument("decoder without a type");
  if (*type == "Sequence") {
    array steps;
    const auto list = member(e, "decoders");
    if (!list || list->get_array().get(steps) != simdjson::SUCCESS) {
      return invalid_argument("decoder Sequence without a decoders array");
    }
    for (element step : steps) EDGE_RETURN_IF_ERROR(parse_decoder(step, settings));
    return {};
  }
  if (*type == "ByteLevel") {
    settings.decode_byte_level = true;
    return {};
  }
  if (*type == "ByteFallback") {
    settings.decode_byte_fallback = true;
    return {};
  }
  if (*type == "Fuse") return {};  // decoding joins token texts anyway
  if (*type == "Replace") {
    EDGE_ASSIGN_OR_RETURN(auto pattern, parse_pattern(e, "decoder Replace"));
    const auto content = member_string(e, "content");
    if (pattern.is_regex || !content || *content != " ") {
      return status(status_code::unimplemented, "decoder Replace is supported only from a string to a space");
    }
    settings.decode_replace_from = std::move(pattern.text);
    return {};
  }
  if (*type == "Strip") {
    const auto content = member_string(e, "content");
    const auto start = member_int(e, "start").value_or(0);
    const auto stop = member_int(e, "stop").value_or(0);
    if (!content || *content != " " || start > 1 || stop != 0) {
      return status(status_code::unimplemented, "decoder Strip is supported only for one leading space");
    }
    settings.strip_space_after_bos = start == 1;
    return {};
  }
  if (*type == "Metaspace") {
    EDGE_ASSIGN_OR_RETURN(auto scheme, parse_prepend_scheme(e));
    settings.decode_replace_from = std::string(member_string(e, "replacement").value_or(detail::spm_space));
    settings.strip_space_after_bos = scheme != detail::prepend_scheme::never;
    return {};
  }
  return status(status_code::unimplemented, format("decoder type \"{}\" is not supported", *type));
}

// TemplateProcessing's "single" template: whether it starts with a special token, and its id.
struct template_bos {
  bool found = false;  // a TemplateProcessing post-processor exists
  std::optional<token_id> bos;
};

template_bos parse_post_processor(const element& e) {
  const auto type = member_string(e, "type");
  if (!type) return {};
  if (*type == "Sequence") {
    array steps;
    const auto list = member(e, "processors");
    if (!list || list->get_array().get(steps) != simdjson::SUCCESS) return {};
    for (element step : steps) {
      template_bos found = parse_post_processor(step);
      if (found.found) return found;
    }
    return {};
  }
  if (*type != "TemplateProcessing") return {};
  template_bos result{.found = true};
  array single;
  const auto items = member(e, "single");
  if (!items || items->get_array().get(single) != simdjson::SUCCESS) return result;
  for (element first : single) {
    const auto special = member(first, "SpecialToken");
    if (!special) return result;
    const auto name = member_string(*special, "id");
    const auto tokens = member(e, "special_tokens");
    if (!name || !tokens) return result;
    const auto entry = member(*tokens, *name);
    if (!entry) return result;
    array ids;
    const auto id_list = member(*entry, "ids");
    if (!id_list || id_list->get_array().get(ids) != simdjson::SUCCESS) return result;
    for (element id : ids) {
      std::int64_t value = 0;
      if (id.get_int64().get(value) == simdjson::SUCCESS) result.bos = static_cast<token_id>(value);
      break;
    }
    return result;
  }
  return result;
}

status parse_model(const element& model, detail::bpe_settings& settings, std::optional<std::string>& unknown) {
  const auto type = member_string(model, "type");
  if (type && *type != "BPE") {
    return status(status_code::unimplemented, format("tokenizer model type \"{}\" is not supported (only BPE)", *type));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const auto affix = member_string(model, key); affix && !affix->empty()) {
      return status(status_code::unimplemented, format("BPE {} is not supported", key));
    }
  }
  settings.byte_fallback = member_bool(model, "byte_fallback", false);
  settings.ignore_merges = member_bool(model, "ignore_merges", false);
  settings.fuse_unk = member_bool(model, "fuse_unk", false);
  if (const auto unk = member_string(model, "unk_token")) unknown = std::string(*unk);

  object vocab;
  const auto vocab_element = member(model, "vocab");
  if (!vocab_element || vocab_element->get_object().get(vocab) != simdjson::SUCCESS) {
    return invalid_argument("model.vocab is not an object");
  }
  for (auto field : vocab) {
    std::int64_t id = 0;
    if (field.value.get_int64().get(id) != simdjson::SUCCESS || id < 0 || id >= INT32_MAX) {
      return invalid_argument(format("model.vocab entry \"{}\" has no valid id", std::string_view(field.key)));
    }
    const auto index = static_cast<std::size_t>(id);
    if (index >= settings.texts.size()) {
      settings.texts.resize(index + 1);
      settings.kinds.resize(index + 1, detail::token_kind::unused);
    }
    settings.texts[index] = std::string(field.key);
    settings.kinds[index] = detail::token_kind::normal;
    if (settings.byte_fallback && detail::parse_byte_token(field.key)) settings.kinds[index] = detail::token_kind::byte;
  }

  array merges;
  const auto merges_element = member(model, "merges");
  if (merges_element && merges_element->get_array().get(merges) != simdjson::SUCCESS) {
    return invalid_argument("model.merges is not an array");
  }
  if (merges_element) {
    settings.merges.reserve(merges.size());
    for (element merge : merges) {
      std::string_view line;
      array pair;
      if (merge.get_string().get(line) == simdjson::SUCCESS) {
        const std::size_t space = line.find(' ');
        if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos) {
          return invalid_argument(format("model.merges entry \"{}\" is not two tokens", line));
        }
        settings.merges.emplace_back(std::string(line.substr(0, space)), std::string(line.substr(space + 1)));
      } else if (merge.get_array().get(pair) == simdjson::SUCCESS && pair.size() == 2) {
        std::string_view a;
        std::string_view b;
        if (pair.at(0).get_string().get(a) != simdjson::SUCCESS || pair.at(1).get_string().get(b) != simdjson::SUCCESS) {
          return invalid_argument("model.merges entry is not a pair of strings");
        }
        settings.merges.emplace_back(std::string(a), std::string(b));
      } else {
        return invalid_argument("model.merges entry is neither \"a b\" nor [a, b]");
      }
    }
  }
  return {};
}

}  // namespace

result<std::unique_ptr<tokenizer>> parse_hf_tokenizer(std::string_view tokenizer_json, std::string_view tokenizer_config) {
  simdjson::dom::parser parser;
  const simdjson::padded_string padded(tokenizer_json);
  element root;
  if (auto error = parser.parse(padded).get(root)) return json_error("tokenizer.json is not valid JSON", error);

  detail::bpe_settings settings;
  settings.byte_level = false;
  settings.decode_byte_level = false;

  const auto model = member(root, "model");
  if (!model) return invalid_argument("tokenizer.json has no model");
  std::optional<std::string> unknown_text;
  EDGE_RETURN_IF_ERROR(parse_model(*model, settings, unknown_text));

  if (const auto normalizer = member(root, "normalizer")) {
    EDGE_RETURN_IF_ERROR(parse_normalizer(*normalizer, settings.normalizers));
  }
  if (const auto pre = member(root, "pre_tokenizer")) {
    bool saw_byte_level = false;
    EDGE_RETURN_IF_ERROR(parse_pre_tokenizer(*pre, settings, saw_byte_level));
  }
  if (const auto decoder = member(root, "decoder")) EDGE_RETURN_IF_ERROR(parse_decoder(*decoder, settings));

  array added;
  if (const auto list = member(root, "added_tokens"); list && list->get_array().get(added) == simdjson::SUCCESS) {
    for (element token : added) {
      const auto id = member_int(token, "id");
      const auto content = member_string(token, "content");
      if (!id || !content || *id < 0 || *id >= INT32_MAX) return invalid_argument("added_tokens entry without id/content");
      settings.added.push_back({.content = std::string(*content),
                                .id = static_cast<token_id>(*id),
                                .special = member_bool(token, "special", false),
                                .lstrip = member_bool(token, "lstrip", false),
                                .rstrip = member_bool(token, "rstrip", false)});
    }
  }

  // Ids by text, from the model vocabulary and then the added tokens (which win).
  const auto lookup = [&](std::string_view text) -> std::optional<token_id> {
    for (auto it = settings.added.rbegin(); it != settings.added.rend(); ++it) {
      if (it->content == text) return it->id;
    }
    for (std::size_t id = 0; id < settings.texts.size(); ++id) {
      if (settings.texts[id] == text) return static_cast<token_id>(id);
    }
    return std::nullopt;
  };
  if (unknown_text) {
    settings.unknown = lookup(*unknown_text);
    if (settings.unknown && static_cast<std::size_t>(*settings.unknown) < settings.kinds.size()) {
      settings.kinds[static_cast<std::size_t>(*settings.unknown)] = detail::token_kind::unknown;
    }
  }

  template_bos from_template;
  if (const auto post = member(root, "post_processor")) from_template = parse_post_processor(*post);
  settings.add_bos = from_template.bos.has_value();
  settings.bos = from_template.bos;

  if (!tokenizer_config.empty()) {
    EDGE_ASSIGN_OR_RETURN(const config_fields config, parse_config(tokenizer_config));
    if (config.bos_token && !settings.bos) settings.bos = lookup(*config.bos_token);
    if (config.eos_token) settings.eos = lookup(*config.eos_token);
    // The slow/fast Llama tokenizers rebuild their post-processor from add_bos_token, so when it
    // is given it decides.
    if (config.add_bos_token) settings.add_bos = *config.add_bos_token;
  }
  if (!settings.bos) settings.add_bos = false;
  return detail::make_bpe_tokenizer(std::move(settings));
}

result<std::unique_ptr<tokenizer>> load_hf_tokenizer(const std::filesystem::path& tokenizer_json) {
  EDGE_ASSIGN_OR_RETURN(auto json, detail::read_whole_file(tokenizer_json));
  std::string config;
  const auto config_path = tokenizer_json.parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::is_regular_file(config_path, ec)) {
    EDGE_ASSIGN_OR_RETURN(config, detail::read_whole_file(config_path));
  }
  auto parsed = parse_hf_tokenizer(json, config);
  if (!parsed.ok()) return parsed.error().with_context(tokenizer_json.string());
  return parsed;
}

}  // namespace edge::backend
