// BPE by merge rank from tokenizer.json and GGUF "gpt2" vocabularies, on small vocabularies
// written by the tests so that every expected id can be worked out by hand.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "edge/backend/io/gguf.h"
#include "edge/backend/tokenizer/tokenizer.h"
#include "tokenizer_fixtures.h"

namespace {

using edge::backend::token_id;
using edge::testing::byte_char;
using edge::testing::byte_level_json;
using ids = std::vector<token_id>;

std::unique_ptr<edge::backend::tokenizer> parse(const byte_level_json& json, const std::string& config = {}) {
  auto tok = edge::backend::parse_hf_tokenizer(json.text(), config);
  REQUIRE_MESSAGE(tok.ok(), tok.error().to_string());
  return std::move(tok).value();
}

int byte_id(unsigned char b) { return b; }

std::string split_pre_tokenizer(const std::string& behavior, bool invert = false) {
  return R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"String":"-"},"behavior":")" + behavior +
         R"(","invert":)" + (invert ? "true" : "false") +
         R"(},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]})";
}

}  // namespace

TEST_CASE("byte-level BPE: merges apply by rank, leftmost first on a tie") {
  byte_level_json json;
  json.merges = {"b c", "a b", "a a"};
  const auto tok = parse(json);
  // Rank 0 (b c) wins over rank 1 (a b) although "ab" is further left.
  CHECK(tok->encode("abc", {}) == ids{byte_id('a'), json.id("bc")});
  // Same rank: the leftmost pair merges first.
  CHECK(tok->encode("aaa", {}) == ids{json.id("aa"), byte_id('a')});
  CHECK(tok->encode("aaaa", {}) == ids{json.id("aa"), json.id("aa")});
  CHECK(tok->decode(tok->encode("abc aaa", {})) == "abc aaa");
}

TEST_CASE("byte-level BPE: every byte is representable and decodes back") {
  byte_level_json json;
  const auto tok = parse(json);
  std::string all;
  for (int b = 1; b < 256; ++b) all += static_cast<char>(b);
  const ids encoded = tok->encode(all, {});
  CHECK(encoded.size() == 255);
  // Bytes that are not UTF-8 come back as U+FFFD; valid text comes back exactly.
  const std::string text = "na\xC3\xAFve \xE4\xB8\xAD \xF0\x9F\x98\x80\t\n  x";
  CHECK(tok->decode(tok->encode(text, {})) == text);
  CHECK(tok->decode(ids{0xC3}) == "\xEF\xBF\xBD");
}

TEST_CASE("byte-level BPE: the GPT-2 regex splits before merging") {
  byte_level_json json;
  json.merges = {byte_char(' ') + " w", byte_char(' ') + "w o", "o r", "r l"};
  const auto tok = parse(json);
  // " wo" merges inside the pre-token " world"; "o" and "r" of "hello" and " world" never meet
  // across pre-tokens.
  const ids got = tok->encode("or world", {});
  CHECK(got == ids{json.id("or"), json.id(byte_char(' ') + "wo"), json.id("rl"), byte_id('d')});
}

TEST_CASE("byte-level BPE: ignore_merges takes a whole pre-token from the vocabulary") {
  byte_level_json json;
  json.merges = {"b c"};
  json.extra = {"abc"};
  json.pre_tokenizer =
      R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\p{L}+|\\s+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]})";
  CHECK(parse(json)->encode("abc", {}) == ids{byte_id('a'), json.id("bc")});
  json.ignore_merges = true;
  CHECK(parse(json)->encode("abc", {}) == ids{json.id("abc")});
  CHECK(parse(json)->encode("abcabc", {}) == ids{byte_id('a'), json.id("bc"), byte_id('a'), json.id("bc")});
}

TEST_CASE("Split pre-tokenizer: each delimiter behaviour") {
  byte_level_json json;
  json.merges = {"a -", "- b", "b -", "- -", "- c"};
  const auto a = byte_id('a');
  const auto b = byte_id('b');
  const auto c = byte_id('c');
  const auto dash = byte_id('-');
  const std::string text = "a-b--c";

  json.pre_tokenizer = split_pre_tokenizer("Isolated");
  CHECK(parse(json)->encode(text, {}) == ids{a, dash, b, dash, dash, c});
  json.pre_tokenizer = split_pre_tokenizer("Removed");
  CHECK(parse(json)->encode(text, {}) == ids{a, b, c});
  json.pre_tokenizer = split_pre_tokenizer("MergedWithPrevious");
  CHECK(parse(json)->encode(text, {}) == ids{json.id("a-"), json.id("b-"), dash, c});
  json.pre_tokenizer = split_pre_tokenizer("MergedWithNext");
  CHECK(parse(json)->encode(text, {}) == ids{a, json.id("-b"), dash, json.id("-c")});
  json.pre_tokenizer = split_pre_tokenizer("Contiguous");
  CHECK(parse(json)->encode(text, {}) == ids{a, dash, b, json.id("--"), c});
  json.pre_tokenizer = split_pre_tokenizer("Removed", true);
  CHECK(parse(json)->encode(text, {}) == ids{dash, dash, dash});
}

TEST_CASE("Llama-3's pre-tokenizer regex: contractions, digits in threes, whitespace runs") {
  byte_level_json json;
  const std::string sp = byte_char(' ');
  const std::string nl = byte_char('\n');
  json.merges = {"' L", "'L L", "1 2", "12 3", sp + " " + sp, nl + " " + nl, "4 5"};
  json.pre_tokenizer =
      R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]})";
  const auto tok = parse(json);
  // (?i:'ll) matches "'LL" case-insensitively, so the contraction is one pre-token.
  CHECK(tok->encode("'LL", {}) == ids{json.id("'LL")});
  // Digits go in groups of at most three: "12345" is "123" and "45".
  CHECK(tok->encode("12345", {}) == ids{json.id("123"), json.id("45")});
  // "\s+(?!\S)" leaves the last space of a run for the next word.
  CHECK(tok->encode("a   b", {}) == ids{byte_id('a'), json.id(sp + sp), byte_id(' '), byte_id('b')});
  CHECK(tok->encode("\n\n", {}) == ids{json.id(nl + nl)});
}

TEST_CASE("added tokens: longest match first; special ones only with parse_special") {
  byte_level_json json;
  json.extra = {"<|im_start|>", "<|im_start|>x", "<think>"};
  const int start = json.id("<|im_start|>");
  const int start_x = json.id("<|im_start|>x");
  const int think = json.id("<think>");
  json.added_tokens = "[" +
      std::string(R"({"id":)") + std::to_string(start) +
      R"(,"content":"<|im_start|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},)" +
      R"({"id":)" + std::to_string(start_x) +
      R"(,"content":"<|im_start|>x","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},)" +
      R"({"id":)" + std::to_string(think) +
      R"(,"content":"<think>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":false}])";
  const auto tok = parse(json);
  CHECK(tok->encode("a<|im_start|>b", {}) == ids{byte_id('a'), start, byte_id('b')});
  CHECK(tok->encode("<|im_start|>x", {}) == ids{start_x});
  const ids literal = tok->encode("<|im_start|>", {.parse_special = false});
  CHECK(literal.size() == std::string("<|im_start|>").size());
  // A non-special added token is matched whatever parse_special says.
  CHECK(tok->encode("<think>", {.parse_special = false}) == ids{think});
  CHECK(tok->is_special(start));
  CHECK_FALSE(tok->is_special(think));
  CHECK(tok->decode(ids{start, byte_id('a'), think}) == "a<think>");
  CHECK(tok->decode(ids{start, byte_id('a'), think}, true) == "<|im_start|>a<think>");
  CHECK(tok->find_token("<|im_start|>") == start);
}

TEST_CASE("client text guard: a chat format's markup tokens match only inside the markup") {
  using edge::backend::byte_ranges;
  using edge::backend::markup_tokens;
  byte_level_json json;
  json.extra = {"<|im_start|>", "<tool_call>", "<b>", "\n\n"};
  const int start = json.id("<|im_start|>");
  const int call = json.id("<tool_call>");
  const int bold = json.id("<b>");
  const int blank = json.id("\n\n");
  const auto added = edge::testing::added_token_json;
  json.added_tokens = "[" + added(start, "<|im_start|>", true) + "," + added(call, "<tool_call>", false) + "," +
                      added(bold, "<b>", false) + "," + added(blank, "\n\n", false) + "]";
  const auto tok = parse(json);
  CHECK(tok->is_added(call));
  CHECK_FALSE(tok->is_added(start));
  CHECK_FALSE(tok->is_added(byte_id('a')));

  // The format writes <|im_start|> (special anyway), <tool_call> and a blank line; <b> is only text
  // to it, and a token of whitespace never is markup.
  const std::string_view format[] = {"{{ '<|im_start|>' + role }}\n\n{% if tools %}<tool_call>{% endif %}"};
  const markup_tokens markup = markup_tokens::of(*tok, format);
  CHECK(markup.contains(start));
  CHECK(markup.contains(call));
  CHECK_FALSE(markup.contains(bold));
  CHECK_FALSE(markup.contains(blank));
  CHECK(markup.size() == 2);

  const auto bytes_of = [](std::string_view text) {
    ids out;
    for (const char c : text) out.push_back(byte_id(static_cast<unsigned char>(c)));
    return out;
  };
  const auto concat = [](std::initializer_list<ids> parts) {
    ids out;
    for (const ids& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
  };
  // The template wrote the first 12 bytes; the rest is a client's.
  const std::string text = "<|im_start|>x<|im_start|><tool_call><b>\n\n";
  const byte_ranges template_bytes{{0, 12}};
  CHECK(tok->encode(text, {.parse_special = true, .client_text_guard = &markup, .markup = &template_bytes}) ==
        concat({{start}, bytes_of("x<|im_start|><tool_call>"), {bold, blank}}));
  // A markup token's text must lie wholly inside the markup: one that begins in it and ends in a
  // client's text is text.
  const byte_ranges partly{{0, 5}};
  CHECK(tok->encode("<|im_start|>", {.parse_special = true, .client_text_guard = &markup, .markup = &partly}) ==
        bytes_of("<|im_start|>"));
  // A completions prompt is all the client's.
  CHECK(tok->encode("<tool_call><b>", {.parse_special = false, .client_text_guard = &markup}) ==
        concat({bytes_of("<tool_call>"), {bold}}));
  // Without the guard, as before: every special and added token matches.
  CHECK(tok->encode(text, {.parse_special = true}) == ids{start, byte_id('x'), start, call, bold, blank});
}

TEST_CASE("added tokens with lstrip/rstrip swallow the whitespace beside them") {
  byte_level_json json;
  json.extra = {"<mask>"};
  const int mask = json.id("<mask>");
  json.added_tokens = R"([{"id":)" + std::to_string(mask) +
                      R"(,"content":"<mask>","single_word":false,"lstrip":true,"rstrip":true,"normalized":false,"special":true}])";
  const auto tok = parse(json);
  CHECK(tok->encode("a  <mask> b", {}) == ids{byte_id('a'), mask, byte_id('b')});
}

TEST_CASE("NFC normalization composes decomposed characters before byte-level BPE") {
  byte_level_json json;
  const std::string e_acute_chars = byte_char(0xC3) + byte_char(0xA9);
  json.merges = {byte_char(0xC3) + " " + byte_char(0xA9)};
  const std::string decomposed = "e\xCC\x81";  // e + COMBINING ACUTE ACCENT
  CHECK(parse(json)->encode(decomposed, {}).size() == 3);
  json.normalizer = R"({"type":"NFC"})";
  const auto tok = parse(json);
  CHECK(tok->encode(decomposed, {}) == ids{json.id(e_acute_chars)});
  CHECK(tok->encode("\xC3\xA9", {}) == ids{json.id(e_acute_chars)});
  CHECK(tok->decode(tok->encode(decomposed, {})) == "\xC3\xA9");
  // Hangul jamo compose into one syllable; ASCII is untouched.
  CHECK(tok->decode(tok->encode("\xE1\x84\x80\xE1\x85\xA1 ok", {})) == "\xEA\xB0\x80 ok");
}

TEST_CASE("tokenizer_config.json and the post-processor decide BOS and EOS") {
  byte_level_json json;
  json.extra = {"<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"};
  const int bot = json.id("<|begin_of_text|>");
  const int eot_text = json.id("<|end_of_text|>");
  const int eot = json.id("<|eot_id|>");
  std::string added = "[";
  for (const int id : {bot, eot_text, eot}) {
    if (added.size() > 1) added += ",";
    added += R"({"id":)" + std::to_string(id) + R"(,"content":)" +
             edge::testing::json_quote(json.vocabulary()[static_cast<std::size_t>(id)]) +
             R"(,"single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true})";
  }
  json.added_tokens = added + "]";

  // No TemplateProcessing: no BOS added, though the config names one.
  auto plain = parse(json, R"({"bos_token":"<|begin_of_text|>","eos_token":"<|end_of_text|>"})");
  CHECK(plain->bos_id() == bot);
  CHECK(plain->encode("a", {}) == ids{byte_id('a')});
  const auto eos = plain->eos_ids();
  CHECK(std::vector<token_id>(eos.begin(), eos.end()) == ids{eot_text, eot});

  json.post_processor =
      R"({"type":"Sequence","processors":[{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":false,"use_regex":true},)"
      R"({"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<|begin_of_text|>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],)"
      R"("pair":[],"special_tokens":{"<|begin_of_text|>":{"id":"<|begin_of_text|>","ids":[)" +
      std::to_string(bot) + R"(],"tokens":["<|begin_of_text|>"]}}}]})";
  auto templated = parse(json);
  CHECK(templated->encode("a", {}) == ids{bot, byte_id('a')});
  CHECK(templated->encode("a", {.add_bos = false}) == ids{byte_id('a')});
  // add_bos_token in the config overrides the template.
  auto overridden = parse(json, R"({"add_bos_token":false,"bos_token":{"content":"<|begin_of_text|>"}})");
  CHECK(overridden->encode("a", {}) == ids{byte_id('a')});

  // A template's id past 32 bits is refused, not cut to another token's id.
  std::string text = json.text();
  const std::string bot_ids = "\"ids\":[" + std::to_string(bot) + "]";
  REQUIRE(text.find(bot_ids) != std::string::npos);
  text.replace(text.find(bot_ids), bot_ids.size(), "\"ids\":[" + std::to_string((std::int64_t{1} << 32) + bot) + "]");
  CHECK_FALSE(edge::backend::parse_hf_tokenizer(text, "").ok());
}

TEST_CASE("tokenizer.json errors are reported, unsupported parts by name") {
  CHECK_FALSE(edge::backend::parse_hf_tokenizer("{not json", "").ok());
  CHECK_FALSE(edge::backend::parse_hf_tokenizer(R"({"model":{"type":"BPE","vocab":[],"merges":[]}})", "").ok());
  const auto unigram = edge::backend::parse_hf_tokenizer(R"({"model":{"type":"Unigram","vocab":[]}})", "");
  REQUIRE_FALSE(unigram.ok());
  CHECK(unigram.error().code() == edge::status_code::unimplemented);
  CHECK(unigram.error().message().find("Unigram") != std::string::npos);
  byte_level_json json;
  json.normalizer = R"({"type":"BertNormalizer"})";
  const auto bert = edge::backend::parse_hf_tokenizer(json.text(), "");
  REQUIRE_FALSE(bert.ok());
  CHECK(bert.error().message().find("BertNormalizer") != std::string::npos);
  json.normalizer = "null";
  json.merges = {"a b"};
  std::string text = json.text();
  const std::string good = R"("merges":["a b"])";
  text.replace(text.find(good), good.size(), R"("merges":["a q"])");
  CHECK_FALSE(edge::backend::parse_hf_tokenizer(text, "").ok());
  json.pre_tokenizer = R"({"type":"Split","pattern":{"Regex":"(unclosed"},"behavior":"Isolated","invert":false})";
  CHECK_FALSE(edge::backend::parse_hf_tokenizer(json.text(), "").ok());
}

TEST_CASE("tokenizer.json ids past the tokens the file lists are refused, not sized for") {
  byte_level_json json;
  // 256 byte tokens and one added token: ids 0 to 256 are the most a file of 257 tokens names.
  json.added_tokens = R"([{"id":256,"content":"<|end|>","special":true}])";
  CHECK(edge::backend::parse_hf_tokenizer(json.text(), "").ok());
  json.added_tokens = R"([{"id":2000000000,"content":"<|end|>","special":true}])";
  const auto far_added = edge::backend::parse_hf_tokenizer(json.text(), "");
  REQUIRE_FALSE(far_added.ok());
  CHECK(far_added.error().code() == edge::status_code::invalid_argument);
  CHECK(far_added.error().message().find("2000000000") != std::string::npos);

  json.added_tokens = "[]";
  std::string text = json.text();
  const std::string last = "\":255}";
  REQUIRE(text.find(last) != std::string::npos);
  text.replace(text.find(last), last.size(), "\":1322222226}");
  const auto far_vocab = edge::backend::parse_hf_tokenizer(text, "");
  REQUIRE_FALSE(far_vocab.ok());
  CHECK(far_vocab.error().message().find("1322222226") != std::string::npos);
}

namespace {

// A Llama-2 tokenizer.json in miniature: SentencePiece pieces as a BPE model with byte
// fallback, the dummy prefix and spaces done by normalizers, decoded by Replace/ByteFallback/
// Fuse/Strip.
std::string spm_style_json(const std::string& normalizer, const std::string& pre_tokenizer, const std::string& decoder) {
  std::string vocab = R"({"<unk>":0,"<s>":1,"</s>":2)";
  const char* hex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    vocab += ",\"<0x";
    vocab += hex[b >> 4];
    vocab += hex[b & 15];
    vocab += ">\":" + std::to_string(3 + b);
  }
  vocab += ",\"\xE2\x96\x81\":259,\"h\":260,\"i\":261,\"\xE2\x96\x81h\":262,\"\xE2\x96\x81hi\":263,\"hi\":264}";
  return R"({"version":"1.0","added_tokens":[{"id":0,"content":"<unk>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},)"
         R"({"id":1,"content":"<s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},)"
         R"({"id":2,"content":"</s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],)"
         R"("normalizer":)" + normalizer + R"(,"pre_tokenizer":)" + pre_tokenizer +
         R"(,"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},{"Sequence":{"id":"A","type_id":0}}],"pair":[],"special_tokens":{"<s>":{"id":"<s>","ids":[1],"tokens":["<s>"]}}},)"
         R"("decoder":)" + decoder +
         R"(,"model":{"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":true,"byte_fallback":true,"vocab":)" +
         vocab + R"(,"merges":["▁ h","▁h i","h i"]}})";
}

const std::string llama2_normalizer =
    R"({"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"▁"},{"type":"Replace","pattern":{"String":" "},"content":"▁"}]})";
const std::string llama2_decoder =
    R"({"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},{"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]})";

}  // namespace

TEST_CASE("SentencePiece-style tokenizer.json (Llama 2): Prepend/Replace, byte fallback, Strip") {
  auto parsed = edge::backend::parse_hf_tokenizer(spm_style_json(llama2_normalizer, "null", llama2_decoder),
                                                  R"({"add_bos_token":true,"bos_token":"<s>","eos_token":"</s>"})");
  REQUIRE_MESSAGE(parsed.ok(), parsed.error().to_string());
  const auto& tok = **parsed;
  // "hi é" -> "▁hi▁é": ▁hi, ▁, then é (C3 A9) by byte fallback.
  CHECK(tok.encode("hi \xC3\xA9", {}) == ids{1, 263, 259, 3 + 0xC3, 3 + 0xA9});
  CHECK(tok.decode(tok.encode("hi \xC3\xA9", {})) == "hi \xC3\xA9");
  // Each run after a special token gets its own "▁", as the legacy Llama tokenizer does.
  CHECK(tok.encode("hi</s>hi", {.add_bos = false}) == ids{263, 2, 263});
  CHECK(tok.eos_ids().size() == 1);
}

TEST_CASE("SentencePiece-style tokenizer.json with a Metaspace pre-tokenizer and decoder") {
  const std::string metaspace =
      R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"first","split":false})";
  auto parsed = edge::backend::parse_hf_tokenizer(spm_style_json("null", metaspace, metaspace), "");
  REQUIRE_MESSAGE(parsed.ok(), parsed.error().to_string());
  const auto& tok = **parsed;
  CHECK(tok.encode("hi hi", {}) == ids{1, 263, 263});
  // prepend_scheme "first": only the run at the start of the text gets the prefix.
  CHECK(tok.encode("hi</s>hi", {.add_bos = false}) == ids{263, 2, 264});
  CHECK(tok.decode(ids{1, 263, 263}) == "hi hi");
}

TEST_CASE("GGUF gpt2 vocabulary: byte-level BPE with the named pre-tokenizer") {
  using edge::backend::gguf_array;
  using edge::backend::gguf_value;
  gguf_array tokens;
  gguf_array types;
  for (unsigned b = 0; b < 256; ++b) {
    tokens.push_back({byte_char(static_cast<unsigned char>(b))});
    types.push_back({std::int64_t{1}});
  }
  const std::string sp = byte_char(' ');
  const std::vector<std::string> merged = {"12", "123", sp + "w", "He"};
  for (const auto& m : merged) {
    tokens.push_back({m});
    types.push_back({std::int64_t{1}});
  }
  for (const std::string special : {"<|begin_of_text|>", "<|eot_id|>"}) {
    tokens.push_back({special});
    types.push_back({std::int64_t{3}});
  }
  gguf_array merges = {{std::string("1 2")}, {std::string("12 3")}, {sp + " w"}, {std::string("H e")}};
  edge::backend::gguf_file file;
  file.metadata["tokenizer.ggml.model"] = {std::string("gpt2")};
  file.metadata["tokenizer.ggml.pre"] = {std::string("llama-bpe")};
  file.metadata["tokenizer.ggml.tokens"] = {tokens};
  file.metadata["tokenizer.ggml.token_type"] = {types};
  file.metadata["tokenizer.ggml.merges"] = {merges};
  file.metadata["tokenizer.ggml.bos_token_id"] = {std::uint64_t{260}};
  file.metadata["tokenizer.ggml.eos_token_id"] = {std::uint64_t{261}};
  file.metadata["tokenizer.ggml.add_bos_token"] = {true};
  auto parsed = edge::backend::tokenizer_from_gguf(file);
  REQUIRE_MESSAGE(parsed.ok(), parsed.error().to_string());
  const auto& tok = **parsed;
  // Llama-3's regex: digits in threes, so "1234" is "123" + "4".
  CHECK(tok.encode("He w1234", {}) == ids{260, 259, 258, 256 + 1, '4'});
  CHECK(tok.encode("<|eot_id|>", {.add_bos = false}) == ids{261});
  CHECK(tok.decode(tok.encode("He w1234<|eot_id|>", {})) == "He w1234");
  CHECK(tok.eos_ids().size() == 1);
  CHECK(tok.eos_ids()[0] == 261);

  file.metadata["tokenizer.ggml.pre"] = {std::string("default")};
  auto gpt2 = edge::backend::tokenizer_from_gguf(file);
  REQUIRE(gpt2.ok());
  // GPT-2's regex keeps a digit run whole: "1234" is "123" + "4" by merges alone, same ids.
  CHECK((*gpt2)->encode("1234", {.add_bos = false}) == ids{257, '4'});
  file.metadata["tokenizer.ggml.pre"] = {std::string("tekken")};
  const auto unknown = edge::backend::tokenizer_from_gguf(file);
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.error().message().find("tekken") != std::string::npos);
}
