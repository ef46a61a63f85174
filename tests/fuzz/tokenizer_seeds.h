// The tokenizer fuzzers' seeds (edge_fuzz_seeds): small vocabularies of both families, written
// as every format the loaders read, and texts that reach what differs between tokenizers.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace edge::fuzz {

// A SentencePiece vocabulary small enough to read: <unk>, <s>, </s>, the 256 <0xXX> byte
// tokens, "▁" and single letters and punctuation, then the pieces the merges make.
struct spm_piece {
  std::string text;  // SentencePiece's spelling ("▁the")
  float score;
  int gguf_type;     // tokenizer.ggml.token_type: 1 normal, 2 unknown, 3 control, 6 byte
};
std::vector<spm_piece> spm_vocabulary();
// The merges that make the vocabulary's longer pieces, in rank order.
std::vector<std::pair<std::string, std::string>> spm_merges();

// A byte-level vocabulary in GPT-2's byte-to-character spelling: the 256 byte characters, the
// merges' results, then special tokens.
struct byte_level_vocabulary {
  std::vector<std::string> tokens;
  std::vector<int> gguf_types;
  std::vector<std::string> merges;  // "a b"
};
byte_level_vocabulary byte_level_vocab();

// The tokenizers edge_fuzz_tokenizer_encode loads.
std::string byte_level_tokenizer_json();  // Llama 3's shape: split regex, then ByteLevel
std::string spm_style_tokenizer_json();   // Llama 2's tokenizer.json: BPE with byte fallback
std::string llama2c_tokenizer_file();     // the SentencePiece vocabulary as llama2.c writes it

// Seeds of edge_fuzz_tokenizer_json: tokenizer.json documents of every shape the parser
// reads, some followed by a NUL and a tokenizer_config.json.
std::vector<std::string> tokenizer_json_seeds();
// Seeds of edge_fuzz_tokenizer_encode: a mode byte, then a text (or ids).
std::vector<std::string> tokenizer_encode_seeds();

}  // namespace edge::fuzz
