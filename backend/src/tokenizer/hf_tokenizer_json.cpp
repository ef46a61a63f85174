// Hugging Face tokenizer.json (model type BPE) and tokenizer_config.json, parsed with simdjson's
// DOM into bpe_settings. Components outside what Llama/Mistral/Qwen-family files use are
// refused by name (unimplemented), never silently approximated.
#include "builders.h"
#include "edge/common/format.h"
#include "edge/common/json_fields.h"
#include "file_io.h"

namespace edge::backend {
namespace {

struct config_fields {
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<bool> add_bos_token;
};

// A tokenizer_config.json token: "<s>", {"content": "<s>", ...} or null.
json_result<std::optional<std::string>> config_token(const json_fields& config, std::string_view key) {
  const auto value = config.find(key);
  if (!value) return std::optional<std::string>{};
  if (value->type() == simdjson::dom::element_type::OBJECT) {
    EDGE_ASSIGN_OR_RETURN(const json_fields token, value->as<json_fields>());
    EDGE_ASSIGN_OR_RETURN(const std::string_view content, token.required<std::string_view>("content"));
    return std::optional<std::string>(content);
  }
  EDGE_ASSIGN_OR_RETURN(const std::string_view text, value->as<std::string_view>("a string or {\"content\": ...}"));
  return std::optional<std::string>(text);
}

// tokenizer_config.json's fields that shape tokenization. Only they are read: some files hold
// numbers no 64-bit type can (Llama 3's model_max_length is 1e30 written out in digits).
result<config_fields> parse_config(std::string_view json) {
  simdjson::dom::parser parser;
  EDGE_ASSIGN_OR_RETURN(const auto object,
                        parse_json_members(parser, json, "the file", {"bos_token", "eos_token", "add_bos_token"}));
  const json_fields config(object);
  config_fields fields;
  EDGE_ASSIGN_OR_RETURN(fields.bos_token, config_token(config, "bos_token"));
  EDGE_ASSIGN_OR_RETURN(fields.eos_token, config_token(config, "eos_token"));
  EDGE_ASSIGN_OR_RETURN(fields.add_bos_token, config.optional<bool>("add_bos_token"));
  return fields;
}

// A vocabulary of n ids lists n tokens: an id past them is a corrupt file, which taken as it
// is would size the tables by the id (2e9 entries for "a": 2000000000).
status id_past_listed(std::string_view what, std::int64_t id, std::size_t listed) {
  return invalid_argument(format("{} has id {}, but the file lists only {} tokens", what, id, listed));
}

// A "pattern" member: {"String": "..."} or {"Regex": "..."}.
struct pattern_spec {
  std::string text;
  bool is_regex = false;
};

result<pattern_spec> parse_pattern(const json_fields& e) {
  EDGE_ASSIGN_OR_RETURN(const json_value value, e.required("pattern"));
  EDGE_ASSIGN_OR_RETURN(const json_fields pattern, value.as<json_fields>());
  EDGE_ASSIGN_OR_RETURN(const auto text, pattern.optional<std::string_view>("String"));
  if (text) return pattern_spec{std::string(*text), false};
  EDGE_ASSIGN_OR_RETURN(const auto regex, pattern.optional<std::string_view>("Regex"));
  if (regex) return pattern_spec{std::string(*regex), true};
  return value.must_be("{\"String\": ...} or {\"Regex\": ...}");
}

status parse_normalizer(const json_value& value, std::vector<detail::normalizer_step>& out) {
  using detail::normalizer_step;
  EDGE_ASSIGN_OR_RETURN(const json_fields e, value.as<json_fields>());
  EDGE_ASSIGN_OR_RETURN(const std::string_view type, e.required<std::string_view>("type"));
  const auto unicode = [&](detail::normalization_form form) {
    out.push_back({.kind = normalizer_step::type::unicode, .form = form});
    return status{};
  };
  if (type == "NFC") return unicode(detail::normalization_form::nfc);
  if (type == "NFD") return unicode(detail::normalization_form::nfd);
  if (type == "NFKC") return unicode(detail::normalization_form::nfkc);
  if (type == "NFKD") return unicode(detail::normalization_form::nfkd);
  if (type == "Sequence") {
    EDGE_ASSIGN_OR_RETURN(const json_array steps, e.required<json_array>("normalizers"));
    for (const json_value step : steps) EDGE_RETURN_IF_ERROR(parse_normalizer(step, out));
    return {};
  }
  if (type == "Prepend") {
    EDGE_ASSIGN_OR_RETURN(const std::string_view prefix, e.required<std::string_view>("prepend"));
    out.push_back({.kind = normalizer_step::type::prepend, .text = std::string(prefix)});
    return {};
  }
  if (type == "Replace") {
    EDGE_ASSIGN_OR_RETURN(auto pattern, parse_pattern(e));
    EDGE_ASSIGN_OR_RETURN(const std::string_view content, e.required<std::string_view>("content"));
    normalizer_step step{.kind = normalizer_step::type::replace, .content = std::string(content)};
    if (pattern.is_regex) {
      EDGE_ASSIGN_OR_RETURN(auto regex, detail::pcre_regex::compile(pattern.text));
      step.regex = std::move(regex);
    } else {
      step.text = std::move(pattern.text);
    }
    out.push_back(std::move(step));
    return {};
  }
  return status(status_code::unimplemented, format("normalizer type \"{}\" is not supported", type));
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

result<detail::prepend_scheme> parse_prepend_scheme(const json_fields& e) {
  EDGE_ASSIGN_OR_RETURN(const auto scheme, e.optional<std::string_view>("prepend_scheme"));
  if (scheme) {
    if (*scheme == "always") return detail::prepend_scheme::always;
    if (*scheme == "first") return detail::prepend_scheme::first;
    if (*scheme == "never") return detail::prepend_scheme::never;
    return invalid_argument(format("unknown Metaspace prepend_scheme \"{}\"", *scheme));
  }
  // Files written before prepend_scheme existed say add_prefix_space.
  EDGE_ASSIGN_OR_RETURN(const bool add_prefix_space, e.value_or("add_prefix_space", true));
  return add_prefix_space ? detail::prepend_scheme::always : detail::prepend_scheme::never;
}

status parse_pre_tokenizer(const json_value& value, detail::bpe_settings& settings, bool& saw_byte_level) {
  using detail::pre_tokenizer_step;
  EDGE_ASSIGN_OR_RETURN(const json_fields e, value.as<json_fields>());
  EDGE_ASSIGN_OR_RETURN(const std::string_view type, e.required<std::string_view>("type"));
  if (saw_byte_level && type != "Sequence") {
    return status(status_code::unimplemented, format("pre_tokenizer \"{}\" after ByteLevel is not supported", type));
  }
  if (type == "Sequence") {
    EDGE_ASSIGN_OR_RETURN(const json_array steps, e.required<json_array>("pretokenizers"));
    for (const json_value step : steps) EDGE_RETURN_IF_ERROR(parse_pre_tokenizer(step, settings, saw_byte_level));
    return {};
  }
  if (type == "Split") {
    EDGE_ASSIGN_OR_RETURN(auto pattern, parse_pattern(e));
    EDGE_ASSIGN_OR_RETURN(const auto behavior_name, e.value_or<std::string_view>("behavior", "Isolated"));
    EDGE_ASSIGN_OR_RETURN(auto behavior, parse_behavior(behavior_name));
    EDGE_ASSIGN_OR_RETURN(const bool invert, e.value_or("invert", false));
    pre_tokenizer_step step{.kind = pre_tokenizer_step::type::split, .behavior = behavior, .invert = invert};
    if (pattern.is_regex) {
      EDGE_ASSIGN_OR_RETURN(auto regex, detail::pcre_regex::compile(pattern.text));
      step.regex = std::move(regex);
    } else {
      step.literal = std::move(pattern.text);
    }
    settings.pre_tokenizers.push_back(std::move(step));
    return {};
  }
  if (type == "ByteLevel") {
    EDGE_ASSIGN_OR_RETURN(const bool add_prefix_space, e.value_or("add_prefix_space", true));
    EDGE_ASSIGN_OR_RETURN(const bool use_regex, e.value_or("use_regex", true));
    pre_tokenizer_step step{.kind = pre_tokenizer_step::type::byte_level, .add_prefix_space = add_prefix_space};
    if (use_regex) {
      EDGE_ASSIGN_OR_RETURN(auto regex, detail::pcre_regex::compile(detail::gpt2_pattern));
      step.regex = std::move(regex);
    }
    settings.pre_tokenizers.push_back(std::move(step));
    settings.byte_level = true;
    saw_byte_level = true;
    return {};
  }
  if (type == "Digits") {
    EDGE_ASSIGN_OR_RETURN(const bool individual, e.value_or("individual_digits", false));
    EDGE_ASSIGN_OR_RETURN(auto regex, detail::pcre_regex::compile(individual ? R"(\p{N})" : R"(\p{N}+)"));
    settings.pre_tokenizers.push_back(
        {.kind = pre_tokenizer_step::type::split, .regex = std::move(regex), .behavior = detail::split_behavior::isolated});
    return {};
  }
  if (type == "Metaspace") {
    EDGE_ASSIGN_OR_RETURN(auto scheme, parse_prepend_scheme(e));
    EDGE_ASSIGN_OR_RETURN(const bool split, e.value_or("split", true));
    EDGE_ASSIGN_OR_RETURN(const auto replacement, e.optional<std::string_view>("replacement"));
    pre_tokenizer_step step{.kind = pre_tokenizer_step::type::metaspace, .prepend = scheme,
                            .split_on_replacement = split};
    if (replacement) step.replacement = std::string(*replacement);
    settings.pre_tokenizers.push_back(std::move(step));
    return {};
  }
  return status(status_code::unimplemented, format("pre_tokenizer type \"{}\" is not supported", type));
}

status parse_decoder(const json_value& value, detail::bpe_settings& settings) {
  EDGE_ASSIGN_OR_RETURN(const json_fields e, value.as<json_fields>());
  EDGE_ASSIGN_OR_RETURN(const std::string_view type, e.required<std::string_view>("type"));
  if (type == "Sequence") {
    EDGE_ASSIGN_OR_RETURN(const json_array steps, e.required<json_array>("decoders"));
    for (const json_value step : steps) EDGE_RETURN_IF_ERROR(parse_decoder(step, settings));
    return {};
  }
  if (type == "ByteLevel") {
    settings.decode_byte_level = true;
    return {};
  }
  if (type == "ByteFallback") {
    settings.decode_byte_fallback = true;
    return {};
  }
  if (type == "Fuse") return {};  // decoding joins token texts anyway
  if (type == "Replace") {
    EDGE_ASSIGN_OR_RETURN(auto pattern, parse_pattern(e));
    EDGE_ASSIGN_OR_RETURN(const auto content, e.optional<std::string_view>("content"));
    if (pattern.is_regex || content != " ") {
      return status(status_code::unimplemented, "decoder Replace is supported only from a string to a space");
    }
    settings.decode_replace_from = std::move(pattern.text);
    return {};
  }
  if (type == "Strip") {
    EDGE_ASSIGN_OR_RETURN(const auto content, e.optional<std::string_view>("content"));
    EDGE_ASSIGN_OR_RETURN(const std::int64_t start, e.value_or<std::int64_t>("start", 0));
    EDGE_ASSIGN_OR_RETURN(const std::int64_t stop, e.value_or<std::int64_t>("stop", 0));
    if (content != " " || start > 1 || stop != 0) {
      return status(status_code::unimplemented, "decoder Strip is supported only for one leading space");
    }
    settings.strip_space_after_bos = start == 1;
    return {};
  }
  if (type == "Metaspace") {
    EDGE_ASSIGN_OR_RETURN(auto scheme, parse_prepend_scheme(e));
    EDGE_ASSIGN_OR_RETURN(const auto replacement, e.value_or<std::string_view>("replacement", detail::spm_space));
    settings.decode_replace_from = std::string(replacement);
    settings.strip_space_after_bos = scheme != detail::prepend_scheme::never;
    return {};
  }
  return status(status_code::unimplemented, format("decoder type \"{}\" is not supported", type));
}

// TemplateProcessing's "single" template: whether it starts with a special token, and its id.
struct template_bos {
  bool found = false;  // a TemplateProcessing post-processor exists
  std::optional<token_id> bos;
};

result<template_bos> parse_post_processor(const json_value& value) {
  EDGE_ASSIGN_OR_RETURN(const json_fields e, value.as<json_fields>());
  EDGE_ASSIGN_OR_RETURN(const auto type, e.optional<std::string_view>("type"));
  if (type == "Sequence") {
    EDGE_ASSIGN_OR_RETURN(const auto steps, e.optional<json_array>("processors"));
    if (!steps) return template_bos{};
    for (const json_value step : *steps) {
      EDGE_ASSIGN_OR_RETURN(const template_bos found, parse_post_processor(step));
      if (found.found) return found;
    }
    return template_bos{};
  }
  if (type != "TemplateProcessing") return template_bos{};
  template_bos found{.found = true};
  EDGE_ASSIGN_OR_RETURN(const auto single, e.optional<json_array>("single"));
  if (!single || single->empty()) return found;
  EDGE_ASSIGN_OR_RETURN(const json_fields first, single->front().as<json_fields>());
  EDGE_ASSIGN_OR_RETURN(const auto special, first.optional<json_fields>("SpecialToken"));
  if (!special) return found;
  EDGE_ASSIGN_OR_RETURN(const std::string_view name, special->required<std::string_view>("id"));
  EDGE_ASSIGN_OR_RETURN(const json_fields tokens, e.required<json_fields>("special_tokens"));
  EDGE_ASSIGN_OR_RETURN(const json_fields entry, tokens.required<json_fields>(name));
  EDGE_ASSIGN_OR_RETURN(const json_array ids, entry.required<json_array>("ids"));
  if (!ids.empty()) {
    EDGE_ASSIGN_OR_RETURN(const std::int64_t id, ids.front().as<std::int64_t>());
    // Checked before the narrowing: 4294967297 must not become BOS 1.
    if (id < 0 || id > INT32_MAX) return ids.front().must_be("a token id");
    found.bos = static_cast<token_id>(id);
  }
  return found;
}

// `listed_ids`: how many tokens the file lists (model.vocab and added_tokens together), which
// every id must be below.
status parse_model(const json_fields& model, std::size_t listed_ids, detail::bpe_settings& settings,
                   std::optional<std::string>& unknown) {
  EDGE_ASSIGN_OR_RETURN(const auto type, model.optional<std::string_view>("type"));
  if (type && *type != "BPE") {
    return status(status_code::unimplemented, format("tokenizer model type \"{}\" is not supported (only BPE)", *type));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    EDGE_ASSIGN_OR_RETURN(const auto affix, model.optional<std::string_view>(key));
    if (affix && !affix->empty()) return status(status_code::unimplemented, format("BPE {} is not supported", key));
  }
  EDGE_ASSIGN_OR_RETURN(settings.byte_fallback, model.value_or("byte_fallback", false));
  EDGE_ASSIGN_OR_RETURN(settings.ignore_merges, model.value_or("ignore_merges", false));
  EDGE_ASSIGN_OR_RETURN(settings.fuse_unk, model.value_or("fuse_unk", false));
  EDGE_ASSIGN_OR_RETURN(const auto unk, model.optional<std::string_view>("unk_token"));
  if (unk) unknown = std::string(*unk);

  EDGE_ASSIGN_OR_RETURN(const json_fields vocab, model.required<json_fields>("vocab"));
  for (const auto [text, value] : vocab) {
    const auto id = value.as<std::int64_t>();
    if (!id.ok() || *id < 0) return invalid_argument(format("model.vocab entry \"{}\" has no valid id", text));
    if (static_cast<std::uint64_t>(*id) >= listed_ids) {
      return id_past_listed(format("model.vocab entry \"{}\"", text), *id, listed_ids);
    }
    const auto index = static_cast<std::size_t>(*id);
    if (index >= settings.texts.size()) {
      settings.texts.resize(index + 1);
      settings.kinds.resize(index + 1, detail::token_kind::unused);
    }
    settings.texts[index] = std::string(text);
    settings.kinds[index] = detail::token_kind::normal;
    if (settings.byte_fallback && detail::parse_byte_token(text)) settings.kinds[index] = detail::token_kind::byte;
  }

  EDGE_ASSIGN_OR_RETURN(const auto merges, model.optional<json_array>("merges"));
  if (!merges) return {};
  settings.merges.reserve(merges->size());
  for (const json_value merge : *merges) {
    if (merge.type() == simdjson::dom::element_type::STRING) {
      const std::string_view line = *merge.as<std::string_view>();
      const std::size_t space = line.find(' ');
      if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos) {
        return invalid_argument(format("model.merges entry \"{}\" is not two tokens", line));
      }
      settings.merges.emplace_back(std::string(line.substr(0, space)), std::string(line.substr(space + 1)));
      continue;
    }
    constexpr std::string_view expected = "\"a b\" or [a, b]";
    EDGE_ASSIGN_OR_RETURN(const json_array pair, merge.as<json_array>(expected));
    if (pair.size() != 2) return merge.must_be(expected);
    std::string_view halves[2];
    std::size_t next = 0;
    for (const json_value half : pair) {
      EDGE_ASSIGN_OR_RETURN(halves[next], half.as<std::string_view>());
      ++next;
    }
    settings.merges.emplace_back(std::string(halves[0]), std::string(halves[1]));
  }
  return {};
}

}  // namespace

result<std::unique_ptr<tokenizer>> parse_hf_tokenizer(std::string_view tokenizer_json, std::string_view tokenizer_config) {
  simdjson::dom::parser parser;
  EDGE_ASSIGN_OR_RETURN(const auto document, parse_json_object(parser, tokenizer_json, "tokenizer.json"));
  const json_fields root(document);

  detail::bpe_settings settings;
  settings.byte_level = false;
  settings.decode_byte_level = false;

  EDGE_ASSIGN_OR_RETURN(const json_fields model, root.required<json_fields>("model"));
  EDGE_ASSIGN_OR_RETURN(const auto added, root.optional<json_array>("added_tokens"));
  std::size_t listed_ids = added ? added->size() : 0;
  if (const auto vocab = model.find("vocab"); vocab && vocab->type() == simdjson::dom::element_type::OBJECT) {
    listed_ids += vocab->as<json_fields>()->size();
  }
  std::optional<std::string> unknown_text;
  EDGE_RETURN_IF_ERROR(parse_model(model, listed_ids, settings, unknown_text));

  if (const auto normalizer = root.find("normalizer")) {
    EDGE_RETURN_IF_ERROR(parse_normalizer(*normalizer, settings.normalizers));
  }
  if (const auto pre = root.find("pre_tokenizer")) {
    bool saw_byte_level = false;
    EDGE_RETURN_IF_ERROR(parse_pre_tokenizer(*pre, settings, saw_byte_level));
  }
  if (const auto decoder = root.find("decoder")) EDGE_RETURN_IF_ERROR(parse_decoder(*decoder, settings));

  if (added) {
    for (const json_value entry : *added) {
      EDGE_ASSIGN_OR_RETURN(const json_fields token, entry.as<json_fields>());
      EDGE_ASSIGN_OR_RETURN(const std::int64_t id, token.required<std::int64_t>("id"));
      EDGE_ASSIGN_OR_RETURN(const std::string_view content, token.required<std::string_view>("content"));
      if (id < 0) return entry.error(format("has id {}, which is not a token id", id));
      if (static_cast<std::uint64_t>(id) >= listed_ids) {
        return id_past_listed(format("added token \"{}\"", content), id, listed_ids);
      }
      EDGE_ASSIGN_OR_RETURN(const bool special, token.value_or("special", false));
      EDGE_ASSIGN_OR_RETURN(const bool lstrip, token.value_or("lstrip", false));
      EDGE_ASSIGN_OR_RETURN(const bool rstrip, token.value_or("rstrip", false));
      settings.added.push_back({.content = std::string(content),
                                .id = static_cast<token_id>(id),
                                .special = special,
                                .lstrip = lstrip,
                                .rstrip = rstrip});
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
  if (const auto post = root.find("post_processor")) {
    EDGE_ASSIGN_OR_RETURN(from_template, parse_post_processor(*post));
  }
  settings.add_bos = from_template.bos.has_value();
  settings.bos = from_template.bos;

  if (!tokenizer_config.empty()) {
    auto parsed_config = parse_config(tokenizer_config);
    if (!parsed_config.ok()) return parsed_config.error().with_context("tokenizer_config.json");
    const config_fields& config = *parsed_config;
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
