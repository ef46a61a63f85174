#include "tokenizer_seeds.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "tokenizer_fixtures.h"

namespace edge::fuzz {
namespace {

using testing::byte_char;
using testing::json_quote;

constexpr std::string_view space = "\xE2\x96\x81";  // U+2581, SentencePiece's space

std::string with_spaces(std::string_view piece) {
  std::string out;
  for (std::size_t pos = 0; pos < piece.size();) {
    if (piece.substr(pos, space.size()) == space) {
      out += ' ';
      pos += space.size();
    } else {
      out += piece[pos++];
    }
  }
  return out;
}

std::string hex_byte_token(unsigned b) {
  static constexpr char digits[] = "0123456789ABCDEF";
  return std::string("<0x") + digits[b >> 4] + digits[b & 15] + ">";
}

std::string added_token(int id, std::string_view content, bool special, bool lstrip = false, bool rstrip = false) {
  return "{\"id\":" + std::to_string(id) + ",\"content\":" + json_quote(std::string(content)) +
         ",\"single_word\":false,\"lstrip\":" + (lstrip ? "true" : "false") + ",\"rstrip\":" +
         (rstrip ? "true" : "false") + ",\"normalized\":false,\"special\":" + (special ? "true" : "false") + "}";
}

// The BOS-adding post-processor of Llama-family files.
std::string template_with_bos(std::string_view bos, int id) {
  const std::string name = json_quote(std::string(bos));
  return R"({"type":"TemplateProcessing","single":[{"SpecialToken":{"id":)" + name +
         R"(,"type_id":0}},{"Sequence":{"id":"A","type_id":0}}],"pair":[],"special_tokens":{)" + name +
         R"(:{"id":)" + name + R"(,"ids":[)" + std::to_string(id) + R"(],"tokens":[)" + name + "]}}}";
}

std::string split_then_byte_level(std::string_view pattern) {
  return R"({"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":)" +
         json_quote(std::string(pattern)) +
         R"(},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,)"
         R"("trim_offsets":true,"use_regex":false}]})";
}

constexpr std::string_view llama3_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view qwen2_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

testing::byte_level_json byte_level_base() {
  const std::string sp = byte_char(' ');
  testing::byte_level_json json;
  json.merges = {sp + " t", "h e", sp + "t he", "i n", sp + " a", "o n", "e r", sp + " w", "a s",
                 "i s", sp + " is", "1 2", "12 3", byte_char(0xC3) + " " + byte_char(0xA9)};
  return json;
}

// The SentencePiece vocabulary as a BPE tokenizer.json model: {"vocab": ..., "merges": ...}
// with byte fallback.
std::string spm_model_json(bool merges_as_pairs, bool ignore_merges) {
  std::string vocab = "{";
  const auto pieces = spm_vocabulary();
  for (std::size_t id = 0; id < pieces.size(); ++id) {
    if (id) vocab += ",";
    vocab += json_quote(pieces[id].text) + ":" + std::to_string(id);
  }
  vocab += "}";
  std::string merges = "[";
  bool first = true;
  for (const auto& [a, b] : spm_merges()) {
    if (!first) merges += ",";
    first = false;
    merges += merges_as_pairs ? "[" + json_quote(a) + "," + json_quote(b) + "]" : json_quote(a + " " + b);
  }
  merges += "]";
  return R"({"type":"BPE","dropout":null,"unk_token":"<unk>","continuing_subword_prefix":null,)"
         R"("end_of_word_suffix":null,"fuse_unk":true,"byte_fallback":true,"ignore_merges":)" +
         std::string(ignore_merges ? "true" : "false") + R"(,"vocab":)" + vocab + R"(,"merges":)" + merges + "}";
}

std::string spm_added_tokens() {
  return "[" + added_token(0, "<unk>", true) + "," + added_token(1, "<s>", true) + "," + added_token(2, "</s>", true) +
         "]";
}

std::string spm_json(std::string_view normalizer, std::string_view pre_tokenizer, std::string_view decoder,
                     bool merges_as_pairs = false, bool ignore_merges = false) {
  return R"({"version":"1.0","truncation":null,"padding":null,"added_tokens":)" + spm_added_tokens() +
         R"(,"normalizer":)" + std::string(normalizer) + R"(,"pre_tokenizer":)" + std::string(pre_tokenizer) +
         R"(,"post_processor":)" + template_with_bos("<s>", 1) + R"(,"decoder":)" + std::string(decoder) +
         R"(,"model":)" + spm_model_json(merges_as_pairs, ignore_merges) + "}";
}

constexpr std::string_view llama2_normalizer =
    R"({"type":"Sequence","normalizers":[{"type":"Prepend","prepend":"▁"},{"type":"Replace","pattern":{"String":" "},"content":"▁"}]})";
constexpr std::string_view llama2_decoder =
    R"({"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},{"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]})";

std::string mode_byte(unsigned tokenizer, bool add_bos, bool parse_special, bool with_special, bool ids) {
  return std::string(1, static_cast<char>(tokenizer | (add_bos ? 8u : 0u) | (parse_special ? 16u : 0u) |
                                          (with_special ? 32u : 0u) | (ids ? 64u : 0u)));
}

}  // namespace

std::vector<spm_piece> spm_vocabulary() {
  std::vector<spm_piece> pieces = {{"<unk>", 0, 2}, {"<s>", 0, 3}, {"</s>", 0, 3}};
  for (unsigned b = 0; b < 256; ++b) pieces.push_back({hex_byte_token(b), 0, 6});
  std::vector<std::string> singles = {std::string(space), "O", "T", ",", ".", "!", "'"};
  for (char c = 'a'; c <= 'z'; ++c) singles.emplace_back(1, c);
  for (std::size_t i = 0; i < singles.size(); ++i) pieces.push_back({singles[i], -1000.0f - static_cast<float>(i), 1});
  const auto merges = spm_merges();
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    pieces.push_back({merges[rank].first + merges[rank].second, -static_cast<float>(rank), 1});
  }
  return pieces;
}

std::vector<std::pair<std::string, std::string>> spm_merges() {
  const std::string s(space);
  return {{s, "t"},     {"h", "e"},       {s + "t", "he"}, {s, "O"},       {"n", "c"},     {"nc", "e"},
          {s + "O", "nce"}, {s, "a"},     {s, "u"},        {"p", "o"},     {"po", "n"},    {s + "u", "pon"},
          {s + "t", "i"},   {"m", "e"},   {s + "ti", "me"}, {s, "l"},      {"i", "t"},     {s + "l", "it"},
          {"t", "l"},       {"tl", "e"},  {s + "lit", "tle"}, {"e", "r"},  {s, "w"},       {s + "w", "a"},
          {s + "wa", "s"},  {s, s}};
}

byte_level_vocabulary byte_level_vocab() {
  const testing::byte_level_json json = byte_level_base();
  byte_level_vocabulary out;
  out.tokens = json.vocabulary();
  out.gguf_types.assign(out.tokens.size(), 1);
  for (const std::string_view special : {"<|begin_of_text|>", "<|eot_id|>"}) {
    out.tokens.emplace_back(special);
    out.gguf_types.push_back(3);
  }
  out.tokens.emplace_back("<|user|>");
  out.gguf_types.push_back(4);
  out.merges = json.merges;
  return out;
}

std::string byte_level_tokenizer_json() {
  testing::byte_level_json json = byte_level_base();
  const int first_added = static_cast<int>(json.vocabulary().size());
  json.pre_tokenizer = split_then_byte_level(llama3_pattern);
  json.added_tokens = "[" + added_token(first_added, "<|begin_of_text|>", true) + "," +
                      added_token(first_added + 1, "<|eot_id|>", true) + "," +
                      added_token(first_added + 2, "<|user|>", false) + "]";
  json.post_processor = template_with_bos("<|begin_of_text|>", first_added);
  return json.text();
}

std::string spm_style_tokenizer_json() { return spm_json(llama2_normalizer, "null", llama2_decoder); }

std::string llama2c_tokenizer_file() {
  const auto pieces = spm_vocabulary();
  std::string out(4, '\0');
  std::uint32_t max_length = 0;
  const auto put = [&out](const auto& value) {
    char bytes[sizeof value];
    std::memcpy(bytes, &value, sizeof value);
    out.append(bytes, sizeof value);
  };
  for (std::size_t id = 0; id < pieces.size(); ++id) {
    // llama2.c's exporter writes BOS and EOS between newlines and a space for "▁".
    const std::string piece = id == 1 ? "\n<s>\n" : id == 2 ? "\n</s>\n" : with_spaces(pieces[id].text);
    max_length = std::max<std::uint32_t>(max_length, static_cast<std::uint32_t>(piece.size()));
    put(pieces[id].score);
    put(static_cast<std::uint32_t>(piece.size()));
    out += piece;
  }
  std::memcpy(out.data(), &max_length, sizeof max_length);
  return out;
}

std::vector<std::string> tokenizer_json_seeds() {
  std::vector<std::string> seeds;
  // The encode fuzzer's two, and the byte-level one with a tokenizer_config.json.
  seeds.push_back(byte_level_tokenizer_json());
  seeds.push_back(spm_style_tokenizer_json());
  seeds.push_back(byte_level_tokenizer_json() + '\0' +
                  R"({"add_bos_token":true,"bos_token":{"content":"<|begin_of_text|>","lstrip":false},)"
                  R"("eos_token":"<|eot_id|>","model_max_length":1000000000000000019884624838656})");
  // GPT-2: ByteLevel with its own regex and a prefix space; <|endoftext|> ends the text.
  {
    testing::byte_level_json json = byte_level_base();
    json.extra = {"<|endoftext|>"};
    json.pre_tokenizer = R"({"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true})";
    json.added_tokens = "[" + added_token(static_cast<int>(json.vocabulary().size()) - 1, "<|endoftext|>", true) + "]";
    seeds.push_back(json.text() + '\0' + R"({"bos_token":null,"eos_token":"<|endoftext|>","add_bos_token":false})");
  }
  // Qwen2: NFC, its regex, chat tokens that strip the whitespace around them.
  {
    testing::byte_level_json json = byte_level_base();
    const int first_added = static_cast<int>(json.vocabulary().size());
    json.normalizer = R"({"type":"NFC"})";
    json.pre_tokenizer = split_then_byte_level(qwen2_pattern);
    json.added_tokens = "[" + added_token(first_added, "<|im_start|>", true, true, false) + "," +
                        added_token(first_added + 1, "<|im_end|>", true, false, true) + "," +
                        added_token(first_added + 2, "<tool_call>", false, true, true) + "]";
    json.post_processor = R"({"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":false})";
    json.ignore_merges = true;
    seeds.push_back(json.text());
  }
  // Mistral's newer files: Metaspace instead of the normalizer, merges written as pairs.
  seeds.push_back(spm_json("null",
                           R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"first","split":false})",
                           R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"first","split":false})", true));
  // Every other component the parser knows, in one file.
  seeds.push_back(spm_json(
      R"({"type":"Sequence","normalizers":[{"type":"NFKD"},{"type":"Replace","pattern":{"Regex":"\\s+"},"content":" "},)"
      R"({"type":"NFKC"},{"type":"NFD"},{"type":"Prepend","prepend":"▁"}]})",
      R"({"type":"Sequence","pretokenizers":[{"type":"Digits","individual_digits":true},)"
      R"({"type":"Split","pattern":{"String":"-"},"behavior":"MergedWithNext","invert":false},)"
      R"({"type":"Split","pattern":{"String":"x"},"behavior":"MergedWithPrevious","invert":true},)"
      R"({"type":"Split","pattern":{"Regex":"[,.]"},"behavior":"Contiguous","invert":false},)"
      R"({"type":"Split","pattern":{"String":"!"},"behavior":"Removed","invert":false},)"
      R"({"type":"Metaspace","replacement":"▁","add_prefix_space":true,"split":true}]})",
      R"({"type":"Sequence","decoders":[{"type":"Metaspace","replacement":"▁","add_prefix_space":true},)"
      R"({"type":"ByteFallback"},{"type":"Fuse"}]})",
      false, true));
  return seeds;
}

std::vector<std::string> tokenizer_encode_seeds() {
  const std::string texts[] = {
      "Once upon a time, there was a little girl named Lily. She was 3 years old!",
      " leading space,  two spaces,\ttab\nnew line\r\n\n  trailing  ",
      "na\xC3\xAFve caf\xC3\xA9 cafe\xCC\x81 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x98\x80 \xEF\xAC\x81",
      "12345 3.14159 -42 1,000,000",
      "<s>Once</s> <|begin_of_text|>hi<|eot_id|><|user|>x <unk>",
      "\xC3\x28 \xE2\x82 \xFF\xFE \xF0\x9F\x98 \xED\xA0\x80 \xC0\xAF",
      "\xE2\x96\x81the \xE2\x96\x81\xE2\x96\x81 upon",
      "it's we'll THEY'RE I'd",
  };
  std::vector<std::string> seeds;
  for (unsigned tokenizer = 0; tokenizer < 5; ++tokenizer) {
    for (const std::string& text : texts) {
      seeds.push_back(mode_byte(tokenizer, tokenizer % 2 == 0, false, false, false) + text);
    }
    seeds.push_back(mode_byte(tokenizer, true, true, true, false) + texts[4]);
    // Ids: BOS, some pieces, a byte token cut from a character, ids past the vocabulary.
    seeds.push_back(mode_byte(tokenizer, false, false, tokenizer % 2 == 1, true) +
                    std::string("\x05\x00\x01\x00\x90\x01\xE6\x00\x97\x00\xFF\xFF\x10\x27", 14));
  }
  return seeds;
}

}  // namespace edge::fuzz
