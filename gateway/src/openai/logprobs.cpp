#include "edge/gateway/openai/logprobs.h"

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>

#include <algorithm>

#include "edge/common/utf8.h"

namespace edge::gateway {
namespace {

namespace json = boost::json;

// The floor of a written log probability (vLLM's): JSON has no -inf.
constexpr double lowest_logprob = -9999.0;

std::int64_t code_points(std::string_view text) { return static_cast<std::int64_t>(utf8::code_points(text)); }

json::array bytes_json(std::string_view bytes) {
  json::array out;
  out.reserve(bytes.size());
  for (const char c : bytes) out.emplace_back(static_cast<std::int64_t>(static_cast<unsigned char>(c)));
  return out;
}

bool is_bos(const backend::tokenizer& tok, backend::token_id id) {
  const auto bos = tok.bos_id();
  return bos && id == *bos;
}

}  // namespace

double api_logprob(float logprob) { return std::max(static_cast<double>(logprob), lowest_logprob); }

choice_logprobs::choice_logprobs(openai_api api, const backend::tokenizer& tok,
                                 std::span<const backend::token_id> prompt)
    : api_(api), tok_(tok), after_bos_(!prompt.empty() && is_bos(tok, prompt.back())) {}

choice_logprobs::entry choice_logprobs::make_entry(backend::token_id id, bool after_bos) const {
  entry e;
  e.id = id;
  e.after_bos = after_bos;
  tok_.append_token_bytes(id, after_bos, /*with_special=*/true, e.bytes);
  utf8::append_sanitized(e.token, e.bytes);
  e.text_offset = offset_;
  return e;
}

void choice_logprobs::add_prompt(std::span<const backend::token_id> prompt,
                                 std::span<const backend::sampled_logprobs> scores, std::string_view echoed) {
  const std::int64_t start = offset_;
  // The offsets within the echoed text: each token's bytes as decoding lays them out (special
  // tokens, which decoding leaves out, take no room).
  std::string text;
  bool at_start = true;
  for (std::size_t i = 0; i < prompt.size(); ++i) {
    const backend::token_id id = prompt[i];
    const bool bos = is_bos(tok_, id);
    entry e = make_entry(id, at_start && !bos);
    e.text_offset = start + code_points(text);
    std::string piece;
    tok_.append_token_bytes(id, at_start && !bos, /*with_special=*/false, piece);
    text += piece;
    at_start = bos;
    if (i > 0 && i - 1 < scores.size()) {
      const backend::sampled_logprobs& s = scores[i - 1];
      e.logprob = s.chosen.logprob;
      for (const backend::token_logprob& alternative : s.top) e.top.emplace_back(alternative.id, alternative.logprob);
    }
    entries_.push_back(std::move(e));
  }
  offset_ = start + code_points(echoed);
}

void choice_logprobs::add(const backend::delta_event& delta) {
  for (std::size_t i = 0; i < delta.tokens.size(); ++i) {
    const backend::token_id id = delta.tokens[i];
    entry e = make_entry(id, after_bos_ && !is_bos(tok_, id));
    after_bos_ = is_bos(tok_, id);
    if (i < delta.logprobs.size()) {
      const backend::sampled_logprobs& s = delta.logprobs[i];
      e.logprob = s.chosen.logprob;
      for (const backend::token_logprob& alternative : s.top) e.top.emplace_back(alternative.id, alternative.logprob);
    }
    entries_.push_back(std::move(e));
  }
  offset_ += code_points(delta.text);
}

json::value choice_logprobs::take() {
  const std::span<const entry> fresh = std::span<const entry>(entries_).subspan(taken_);
  taken_ = entries_.size();
  if (fresh.empty()) return nullptr;
  return object_of(fresh);
}

json::object choice_logprobs::chat_entry(const entry& e) const {
  json::array top;
  for (const auto& [id, logprob] : e.top) {
    // An alternative stands where the chosen token does: the same spacing after BOS.
    std::string bytes;
    tok_.append_token_bytes(id, e.after_bos, /*with_special=*/true, bytes);
    std::string token;
    utf8::append_sanitized(token, bytes);
    top.push_back(json::object{{"token", token}, {"logprob", api_logprob(logprob)}, {"bytes", bytes_json(bytes)}});
  }
  return json::object{{"token", e.token},
                      {"logprob", api_logprob(e.logprob.value_or(0.0f))},
                      {"bytes", bytes_json(e.bytes)},
                      {"top_logprobs", std::move(top)}};
}

json::value choice_logprobs::completion_alternatives(const entry& e) const {
  if (!e.logprob) return nullptr;
  json::object top;
  for (const auto& [id, logprob] : e.top) {
    std::string bytes;
    tok_.append_token_bytes(id, e.after_bos, /*with_special=*/true, bytes);
    std::string token;
    utf8::append_sanitized(token, bytes);
    top[token] = api_logprob(logprob);
  }
  // The chosen token is always there, as in OpenAI's answers (up to logprobs + 1 entries).
  if (!top.contains(e.token)) top[e.token] = api_logprob(*e.logprob);
  return top;
}

json::value choice_logprobs::object_of(std::span<const entry> entries) const {
  if (api_ == openai_api::chat_completions) {
    json::array content;
    for (const entry& e : entries) content.push_back(chat_entry(e));
    return json::object{{"content", std::move(content)}, {"refusal", nullptr}};
  }
  json::array tokens;
  json::array token_logprobs;
  json::array top_logprobs;
  json::array text_offset;
  for (const entry& e : entries) {
    tokens.emplace_back(e.token);
    text_offset.emplace_back(e.text_offset);
    token_logprobs.emplace_back(e.logprob ? json::value(api_logprob(*e.logprob)) : json::value(nullptr));
    top_logprobs.push_back(completion_alternatives(e));
  }
  return json::object{{"tokens", std::move(tokens)},
                      {"token_logprobs", std::move(token_logprobs)},
                      {"top_logprobs", std::move(top_logprobs)},
                      {"text_offset", std::move(text_offset)}};
}

std::string choice_logprobs::all() const {
  // A JSON array of `write(entry)` for every entry, each one's text written by Boost.JSON.
  const auto array_of = [&](const auto& write) {
    std::string out = "[";
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      if (i > 0) out += ',';
      out += json::serialize(write(entries_[i]));
    }
    out += ']';
    return out;
  };
  if (api_ == openai_api::chat_completions) {
    return R"({"content":)" + array_of([&](const entry& e) { return json::value(chat_entry(e)); }) + R"(,"refusal":null})";
  }
  return R"({"tokens":)" + array_of([](const entry& e) { return json::value(e.token); }) +
         R"(,"token_logprobs":)" +
         array_of([](const entry& e) { return e.logprob ? json::value(api_logprob(*e.logprob)) : json::value(nullptr); }) +
         R"(,"top_logprobs":)" + array_of([&](const entry& e) { return completion_alternatives(e); }) +
         R"(,"text_offset":)" + array_of([](const entry& e) { return json::value(e.text_offset); }) + "}";
}

}  // namespace edge::gateway
