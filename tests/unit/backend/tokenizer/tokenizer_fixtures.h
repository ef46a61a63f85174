// Helpers shared by the tokenizer tests: the stories260K vocabulary read independently of the
// code under test, and small tokenizer.json documents written from parts.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "edge/backend/io/gguf.h"
#include "edge/backend/tokenizer/markup.h"
#include "test_support.h"

namespace edge::testing {

// A text with its markup in brackets: "[<|im_start|>user\n]Hi[<|im_end|>]".
inline std::string bracket_markup(const backend::marked_text& t) {
  std::string out;
  std::size_t at = 0;
  for (const backend::byte_range& r : t.markup.ranges()) {
    out += t.text.substr(at, r.begin - at);
    out += '[';
    out += t.text.substr(r.begin, r.end - r.begin);
    out += ']';
    at = r.end;
  }
  out += t.text.substr(at);
  return out;
}

struct llama2c_entry {
  float score;
  std::string piece;
};

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

// tok512.bin, parsed here from its documented layout.
inline std::vector<llama2c_entry> read_tok512() {
  const std::string bytes = read_file(stories260k_dir() / "tok512.bin");
  std::vector<llama2c_entry> entries;
  std::size_t pos = 4;
  while (pos + 8 <= bytes.size()) {
    llama2c_entry e{};
    std::uint32_t length = 0;
    std::memcpy(&e.score, bytes.data() + pos, 4);
    std::memcpy(&length, bytes.data() + pos + 4, 4);
    pos += 8;
    e.piece = bytes.substr(pos, length);
    pos += length;
    entries.push_back(std::move(e));
  }
  return entries;
}

inline backend::gguf_value gguf_string(std::string text) { return {std::move(text)}; }
inline backend::gguf_value gguf_uint(std::uint64_t v) { return {v}; }

// The stories260K vocabulary as llama.cpp's converter writes it into GGUF metadata: pieces
// with "▁", scores, SentencePiece token types.
inline backend::gguf_file stories_gguf_vocabulary() {
  backend::gguf_file file;
  backend::gguf_array tokens;
  backend::gguf_array scores;
  backend::gguf_array types;
  const auto entries = read_tok512();
  for (std::size_t id = 0; id < entries.size(); ++id) {
    std::string piece = entries[id].piece;
    std::int64_t type = 1;
    if (id == 0) {
      piece = "<unk>";
      type = 2;
    } else if (id == 1 || id == 2) {
      piece = id == 1 ? "<s>" : "</s>";
      type = 3;
    } else if (id <= 258) {
      type = 6;
    } else {
      std::string spelled;
      for (char c : piece) spelled += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
      piece = spelled;
    }
    tokens.emplace_back().value = piece;
    scores.emplace_back().value = static_cast<double>(entries[id].score);
    types.emplace_back().value = type;
  }
  file.metadata["tokenizer.ggml.model"] = gguf_string("llama");
  file.metadata["tokenizer.ggml.tokens"] = {tokens};
  file.metadata["tokenizer.ggml.scores"] = {scores};
  file.metadata["tokenizer.ggml.token_type"] = {types};
  file.metadata["tokenizer.ggml.bos_token_id"] = gguf_uint(1);
  file.metadata["tokenizer.ggml.eos_token_id"] = gguf_uint(2);
  file.metadata["tokenizer.ggml.unknown_token_id"] = gguf_uint(0);
  return file;
}

// GPT-2's byte-to-character mapping, written out independently of the implementation.
inline std::string byte_char(unsigned char b) {
  unsigned code = b;
  if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
    unsigned n = 0;
    for (unsigned x = 0; x < b; ++x) {
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) ++n;
    }
    code = 256 + n;
  }
  std::string out;
  if (code < 0x80) {
    out += static_cast<char>(code);
  } else {
    out += static_cast<char>(0xC0 | (code >> 6));
    out += static_cast<char>(0x80 | (code & 0x3F));
  }
  return out;
}

inline std::string json_quote(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buffer[8];
      std::snprintf(buffer, sizeof buffer, "\\u%04x", c);
      out += buffer;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// A byte-level tokenizer.json: ids 0..255 are the byte characters in byte order, then one id
// per merge result in merge order, then `extra` pieces. Merges are given as "a b" over the
// byte-character spelling.
// One entry of tokenizer.json's "added_tokens".
inline std::string added_token_json(int id, const std::string& content, bool special) {
  return "{\"id\":" + std::to_string(id) + ",\"content\":" + json_quote(content) +
         ",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":" +
         (special ? "true" : "false") + "}";
}

struct byte_level_json {
  std::vector<std::string> merges;
  std::vector<std::string> extra;
  std::string pre_tokenizer;  // a JSON object; empty: ByteLevel with the GPT-2 regex
  std::string normalizer = "null";
  std::string added_tokens = "[]";
  std::string post_processor = "null";
  bool ignore_merges = false;

  std::vector<std::string> vocabulary() const {
    std::vector<std::string> vocab;
    for (unsigned b = 0; b < 256; ++b) vocab.push_back(byte_char(static_cast<unsigned char>(b)));
    for (const std::string& m : merges) {
      const auto space = m.find(' ');
      vocab.push_back(m.substr(0, space) + m.substr(space + 1));
    }
    for (const std::string& e : extra) vocab.push_back(e);
    return vocab;
  }

  // The id of a vocabulary entry.
  int id(const std::string& piece) const {
    const auto vocab = vocabulary();
    for (std::size_t i = 0; i < vocab.size(); ++i) {
      if (vocab[i] == piece) return static_cast<int>(i);
    }
    throw std::runtime_error("no piece " + piece);
  }

  std::string text() const {
    std::string vocab_json = "{";
    const auto vocab = vocabulary();
    for (std::size_t i = 0; i < vocab.size(); ++i) {
      if (i) vocab_json += ",";
      vocab_json += json_quote(vocab[i]) + ":" + std::to_string(i);
    }
    vocab_json += "}";
    std::string merges_json = "[";
    for (std::size_t i = 0; i < merges.size(); ++i) {
      if (i) merges_json += ",";
      merges_json += json_quote(merges[i]);
    }
    merges_json += "]";
    const std::string pre = pre_tokenizer.empty()
                                ? R"({"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true})"
                                : pre_tokenizer;
    return R"({"version":"1.0","added_tokens":)" + added_tokens + R"(,"normalizer":)" + normalizer +
           R"(,"pre_tokenizer":)" + pre + R"(,"post_processor":)" + post_processor +
           R"(,"decoder":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true},)" +
           R"("model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,)" +
           R"("end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":)" +
           (ignore_merges ? "true" : "false") + R"(,"vocab":)" + vocab_json + R"(,"merges":)" + merges_json + "}}";
  }
};

// Merges that make JSON-ish tokens of several bytes, so that tokens cross a grammar's rule
// boundaries (the grammar tests' and the grammar fuzzer's vocabulary).
inline std::vector<std::string> json_merges() {
  const std::string space = byte_char(' ');
  const std::string newline = byte_char('\n');
  return {"\" ,",   "\" }",   "{ \"",    "\" :",   "\": " + space, ", " + space, space + " \"", "a b", "ab c",
          "1 2",    "12 3",   "} ]",     "] }",    "t r",  "tr u",   "tru e",  "n u",   "nu l", "nul l", "- 1",
          "0 .",    "0. 5",   newline + " " + space, "\"} ]"};
}

// A byte-level tokenizer.json of the 256 bytes, `merges` over them (as byte_level_json spells
// them), and <|end|> and <|call|> as special tokens after them; read it with the config
// {"eos_token":"<|end|>"} to make <|end|> its EOS.
inline std::string byte_tokenizer_json(std::vector<std::string> merges) {
  byte_level_json json;
  json.merges = std::move(merges);
  const auto base = static_cast<int>(256 + json.merges.size());
  json.added_tokens = "[" + added_token_json(base, "<|end|>", true) + "," + added_token_json(base + 1, "<|call|>", true) + "]";
  json.extra = {"<|end|>", "<|call|>"};
  return json.text();
}

}  // namespace edge::testing
