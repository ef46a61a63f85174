// Log probabilities as the two APIs write them, on stories260K's real tokenizer: chat entries
// with their bytes, what a stream's chunks carry when the UTF-8-safe detokenizer holds a token's
// text back, and completions' echoed prompt with its null first entry and text offsets.
#include <doctest/doctest.h>

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "edge/gateway/openai/logprobs.h"
#include "test_support.h"

namespace gw = edge::gateway;
namespace backend = edge::backend;
namespace json = boost::json;

namespace {

const backend::tokenizer& stories_tokenizer() {
  static const auto tok = [] {
    auto loaded = backend::load_model_tokenizer(edge::testing::stories260k_dir() / "stories260K.gguf");
    REQUIRE_MESSAGE(loaded.ok(), loaded.error().message());
    return std::move(loaded).value();
  }();
  return *tok;
}

// The deltas the engine sends for `ids` (one token each, the text its detokenizer releases), each
// token with made-up log probabilities: -(i + 1) / 4 for the i-th, and two alternatives.
std::vector<backend::delta_event> deltas_for(const backend::tokenizer& tok, std::span<const backend::token_id> prompt,
                                             std::span<const backend::token_id> ids) {
  backend::incremental_detokenizer detok(tok, !prompt.empty() && prompt.back() == tok.bos_id());
  std::vector<backend::delta_event> out;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    backend::delta_event d;
    d.tokens = {ids[i]};
    d.text = detok.push(ids[i]);
    const float lp = -static_cast<float>(i + 1) / 4.0f;
    d.logprobs.push_back({.chosen = {ids[i], lp}, .top = {{ids[i], lp}, {3, lp - 1.0f}}});
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace

TEST_CASE("chat: one entry per token with its bytes; a stream's chunks add up to the whole answer") {
  const backend::tokenizer& tok = stories_tokenizer();
  const std::vector<backend::token_id> prompt = tok.encode("Hi", {.add_bos = true, .parse_special = false});
  // "é" and "日" are byte-fallback tokens in a 512-token vocabulary: their first bytes release no text.
  const std::vector<backend::token_id> ids = tok.encode(" café 日", {.add_bos = false, .parse_special = false});
  const auto deltas = deltas_for(tok, prompt, ids);
  std::size_t held = 0;
  for (const auto& d : deltas) held += d.text.empty() ? 1 : 0;
  REQUIRE(held >= 2);

  gw::choice_logprobs whole(gw::openai_api::chat_completions, tok, prompt);
  gw::choice_logprobs streamed(gw::openai_api::chat_completions, tok, prompt);
  json::array chunks_content;
  std::string all_bytes;
  std::string text;
  for (const auto& d : deltas) {
    text += d.text;
    whole.add(d);
    streamed.add(d);
    if (d.text.empty()) continue;  // no chunk for this delta: its entry waits for the next one
    const json::value chunk = streamed.take();
    REQUIRE(chunk.is_object());
    for (const auto& entry : chunk.at("content").as_array()) chunks_content.push_back(entry);
  }
  // Nothing held back at the end: the finish chunk carries nothing.
  CHECK(streamed.take().is_null());

  const json::value all = json::parse(whole.all());
  CHECK(all.at("refusal").is_null());
  const json::array& content = all.at("content").as_array();
  REQUIRE(content.size() == ids.size());
  CHECK(json::serialize(chunks_content) == json::serialize(content));
  for (std::size_t i = 0; i < content.size(); ++i) {
    CAPTURE(i);
    const json::object& e = content[i].as_object();
    CHECK(e.at("logprob").as_double() == doctest::Approx(-static_cast<double>(i + 1) / 4.0));
    for (const auto& b : e.at("bytes").as_array()) all_bytes += static_cast<char>(b.as_int64());
    const json::array& top = e.at("top_logprobs").as_array();
    REQUIRE(top.size() == 2);
    CHECK(top[0].at("token") == e.at("token"));
    CHECK(top[1].at("logprob").as_double() == doctest::Approx(e.at("logprob").as_double() - 1.0));
  }
  // The bytes of the entries are the answer's text, pieces of characters included.
  CHECK(all_bytes == text);
  CHECK(text.find("café 日") != std::string::npos);
}

TEST_CASE("chat: a token held back until the end travels with the finish chunk; -inf is written as -9999") {
  const backend::tokenizer& tok = stories_tokenizer();
  // 日 is E6 97 A5: its first byte's token.
  const auto first_byte = tok.find_token("<0xE6>");
  REQUIRE(first_byte);
  gw::choice_logprobs streamed(gw::openai_api::chat_completions, tok, {});
  backend::delta_event d;
  d.tokens = {*first_byte};
  d.logprobs.push_back({.chosen = {*first_byte, -std::numeric_limits<float>::infinity()}, .top = {}});
  streamed.add(d);  // its text is held back: no chunk yet
  const json::value last = streamed.take();
  const json::array& content = last.at("content").as_array();
  REQUIRE(content.size() == 1);
  CHECK(content[0].at("logprob").as_double() == -9999.0);
  CHECK(content[0].at("top_logprobs").as_array().empty());
  CHECK(content[0].at("token").as_string() == "\xEF\xBF\xBD");  // a lone lead byte: U+FFFD as text, the byte in bytes
  CHECK(content[0].at("bytes").as_array().size() == 1);
}

TEST_CASE("completions with echo: the prompt's tokens first, the first without a log probability, offsets into the text") {
  const backend::tokenizer& tok = stories_tokenizer();
  const std::vector<backend::token_id> prompt = tok.encode("Once upon a time", {.add_bos = true, .parse_special = false});
  REQUIRE(prompt.front() == tok.bos_id());
  std::vector<backend::sampled_logprobs> scores;
  for (std::size_t i = 1; i < prompt.size(); ++i) {
    // The chosen token among the alternatives too: its text must read the same in both (after BOS
    // SentencePiece drops a token's leading space), or the dict would hold it twice.
    scores.push_back({.chosen = {prompt[i], -1.0f}, .top = {{7, -0.5f}, {prompt[i], -1.0f}}});
  }
  // (SentencePiece puts its dummy space in front: " there was".)
  const std::vector<backend::token_id> ids = tok.encode("there was", {.add_bos = false, .parse_special = false});
  gw::choice_logprobs lp(gw::openai_api::completions, tok, prompt);
  lp.add_prompt(prompt, scores, "Once upon a time");
  for (const auto& d : deltas_for(tok, prompt, ids)) lp.add(d);
  const json::value all = json::parse(lp.all());
  const json::array& tokens = all.at("tokens").as_array();
  const json::array& token_logprobs = all.at("token_logprobs").as_array();
  const json::array& top = all.at("top_logprobs").as_array();
  const json::array& offsets = all.at("text_offset").as_array();
  REQUIRE(tokens.size() == prompt.size() + ids.size());
  REQUIRE(token_logprobs.size() == tokens.size());
  REQUIRE(top.size() == tokens.size());
  REQUIRE(offsets.size() == tokens.size());
  CHECK(tokens[0].as_string() == "<s>");
  CHECK(token_logprobs[0].is_null());
  CHECK(top[0].is_null());
  // Every token's text starts where the text before it ends: the echoed prompt, then the completion.
  std::string text;
  for (std::size_t i = 1; i < tokens.size(); ++i) {
    CAPTURE(i);
    CHECK(offsets[i].as_int64() == static_cast<std::int64_t>(text.size()));
    text += std::string(tokens[i].as_string());
    if (i < prompt.size()) {
      CHECK(token_logprobs[i].as_double() == -1.0);
      // The chosen token and the alternative, as OpenAI's dicts hold them.
      CHECK(top[i].as_object().size() == 2);
      CHECK(top[i].as_object().contains(tokens[i].as_string()));
    }
  }
  CHECK(text == "Once upon a time there was");
}

TEST_CASE("completions offsets count code points, and a held-back token starts where the released text stands") {
  const backend::tokenizer& tok = stories_tokenizer();
  const std::vector<backend::token_id> ids = tok.encode("日!", {.add_bos = false, .parse_special = false});
  const auto lead = tok.find_token("<0xE6>");  // 日 is E6 97 A5, three byte tokens here
  REQUIRE(lead);
  const auto at = static_cast<std::size_t>(std::find(ids.begin(), ids.end(), *lead) - ids.begin());
  REQUIRE(at + 3 < ids.size());
  gw::choice_logprobs lp(gw::openai_api::completions, tok, {});
  for (const auto& d : deltas_for(tok, {}, ids)) lp.add(d);
  const json::value all = json::parse(lp.all());
  const json::array& offsets = all.at("text_offset").as_array();
  REQUIRE(offsets.size() == ids.size());
  // The three bytes of 日 start at the same place (the first two release nothing); "!" one code
  // point on, though 日 is three bytes.
  CHECK(offsets[at + 1].as_int64() == offsets[at].as_int64());
  CHECK(offsets[at + 2].as_int64() == offsets[at].as_int64());
  CHECK(offsets[at + 3].as_int64() == offsets[at].as_int64() + 1);
}
