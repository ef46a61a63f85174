#include "vocabulary.h"

#include <algorithm>

namespace edge::backend::detail {
namespace {

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// Tokens after which a chat model has finished its turn; generation must stop at any of them.
constexpr std::string_view end_of_turn_texts[] = {"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end_of_text|>",
                                                  "<|endoftext|>"};

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

std::optional<std::uint8_t> parse_byte_token(std::string_view text) {
  if (text.size() != 6 || !text.starts_with("<0x") || text[5] != '>') return std::nullopt;
  const int high = hex_digit(text[3]);
  const int low = hex_digit(text[4]);
  if (high < 0 || low < 0) return std::nullopt;
  return static_cast<std::uint8_t>(high * 16 + low);
}

void special_token_matcher::add(std::string text, token_id id, options how) {
  if (text.empty()) return;
  const auto first = static_cast<unsigned char>(text[0]);
  by_first_byte_[first].push_back(static_cast<std::uint32_t>(entries_.size()));
  entries_.push_back({std::move(text), id, how});
}

void special_token_matcher::finish() {
  for (auto& bucket : by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(), [&](std::uint32_t a, std::uint32_t b) {
      return entries_[a].text.size() > entries_[b].text.size();
    });
  }
}

void special_token_matcher::split(std::string_view text, const encode_options& how, std::vector<piece>& out) const {
  static const byte_ranges no_markup;
  const markup_tokens* guarded = how.client_text_guard;
  const byte_ranges& markup = how.markup ? *how.markup : no_markup;
  std::size_t run_start = 0;
  std::size_t i = 0;
  while (i < text.size()) {
    const auto& bucket = by_first_byte_[static_cast<unsigned char>(text[i])];
    const entry* hit = nullptr;
    for (std::uint32_t index : bucket) {
      const entry& candidate = entries_[index];
      if (!how.parse_special && !candidate.how.always) continue;
      if (text.substr(i, candidate.text.size()) != candidate.text) continue;
      // A markup token in client text is that text: a shorter token, or none, matches here.
      if (guarded && guarded->contains(candidate.id) && !markup.covers(i, i + candidate.text.size())) continue;
      hit = &candidate;
      break;
    }
    if (!hit) {
      ++i;
      continue;
    }
    std::size_t begin = i;
    std::size_t end = i + hit->text.size();
    if (hit->how.lstrip) {
      while (begin > run_start && is_ascii_space(text[begin - 1])) --begin;
    }
    if (hit->how.rstrip) {
      while (end < text.size() && is_ascii_space(text[end])) ++end;
    }
    if (begin > run_start) out.push_back({run_start, begin, std::nullopt});
    out.push_back({begin, end, hit->id});
    i = end;
    run_start = end;
  }
  if (run_start < text.size()) out.push_back({run_start, text.size(), std::nullopt});
}

std::vector<token_id> vocab_tokenizer::encode(std::string_view text, const encode_options& options) const {
  std::vector<token_id> ids;
  ids.reserve(text.size() / 3 + 2);
  if (options.add_bos && add_bos_ && bos_) ids.push_back(*bos_);
  if (specials_.empty()) {
    if (!text.empty()) encode_run(text, true, ids);
    return ids;
  }
  std::vector<special_token_matcher::piece> pieces;
  specials_.split(text, options, pieces);
  for (const auto& p : pieces) {
    if (p.token) {
      ids.push_back(*p.token);
    } else {
      encode_run(text.substr(p.begin, p.end - p.begin), p.begin == 0, ids);
    }
  }
  return ids;
}

void vocab_tokenizer::append_token_bytes(token_id id, bool after_bos, bool with_special, std::string& out) const {
  if (!valid(id)) return;
  const auto index = static_cast<std::size_t>(id);
  const token_kind kind = kinds_[index];
  const bool special = kind == token_kind::control || kind == token_kind::unknown;
  if (special && !with_special) return;
  std::string_view bytes = decoded_[index];
  if (after_bos && strip_space_after_bos_ && !special && kind != token_kind::byte && bytes.starts_with(' ')) {
    bytes.remove_prefix(1);
  }
  out.append(bytes);
}

bool vocab_tokenizer::is_special(token_id id) const {
  if (!valid(id)) return false;
  const token_kind kind = kinds_[static_cast<std::size_t>(id)];
  return kind == token_kind::control || kind == token_kind::unknown;
}

bool vocab_tokenizer::is_added(token_id id) const {
  return valid(id) && kinds_[static_cast<std::size_t>(id)] == token_kind::user_defined;
}

std::optional<token_id> vocab_tokenizer::find_token(std::string_view text) const {
  const auto it = ids_.find(text);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

std::optional<token_id> vocab_tokenizer::find_piece(std::string_view text) const {
  const auto it = ids_.find(text);
  if (it == ids_.end()) return std::nullopt;
  const token_kind kind = kinds_[static_cast<std::size_t>(it->second)];
  if (kind != token_kind::normal && kind != token_kind::user_defined) return std::nullopt;
  return it->second;
}

std::string vocab_tokenizer::token_text(token_id id) const {
  if (!valid(id)) return {};
  return texts_[static_cast<std::size_t>(id)];
}

void vocab_tokenizer::index_texts() {
  ids_.clear();
  ids_.reserve(texts_.size());
  for (std::size_t id = 0; id < texts_.size(); ++id) {
    if (texts_[id].empty()) continue;
    ids_.try_emplace(texts_[id], static_cast<token_id>(id));
  }
}

void vocab_tokenizer::set_eos(std::optional<token_id> configured) {
  eos_.clear();
  if (configured && valid(*configured)) eos_.push_back(*configured);
  for (std::string_view text : end_of_turn_texts) {
    const auto id = find_token(text);
    if (id && std::find(eos_.begin(), eos_.end(), *id) == eos_.end()) eos_.push_back(*id);
  }
}

void vocab_tokenizer::register_special_tokens() {
  for (std::size_t id = 0; id < texts_.size(); ++id) {
    const token_kind kind = kinds_[id];
    if (kind == token_kind::control || kind == token_kind::unknown) {
      specials_.add(texts_[id], static_cast<token_id>(id), {});
    } else if (kind == token_kind::user_defined) {
      specials_.add(texts_[id], static_cast<token_id>(id), {.always = true});
    }
  }
  specials_.finish();
}

}  // namespace edge::backend::detail
