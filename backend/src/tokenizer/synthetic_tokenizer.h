// The byte-level BPE vocabulary make-model gives its synthetic models: GPT-2's 256 byte
// symbols, merges learned from a small built-in English and C++ text, more merges generated
// deterministically until the vocabulary is full, then the special tokens of the model family
// padded with reserved tokens. The same for every seed, like a real model family's tokenizer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace edge::backend {

enum class special_token_style {
  llama3,  // <|begin_of_text|>, <|eot_id|>, <|start_header_id|>, ...; the llama-3 chat format
  chatml,  // <|endoftext|>, <|im_start|>, <|im_end|>; the ChatML format of Qwen
};

struct synthetic_vocab {
  std::vector<std::string> tokens;  // [vocab]: byte-level text ("Ġthe"); the id is the index
  std::vector<std::string> merges;  // "Ġ t", in rank order
  std::int64_t first_special = 0;   // ids from here on are special (added) tokens
  std::optional<std::int64_t> bos_id;
  bool add_bos = false;             // whether encoding prepends BOS
  std::int64_t eos_id = 0;          // ends an assistant turn
  std::int64_t pad_id = 0;
  std::string chat_template;        // Jinja source
  std::int64_t model_max_length = 0;
};

// `vocab_size` tokens in all, the last `special_count` of them special.
synthetic_vocab make_synthetic_vocab(special_token_style style, std::int64_t vocab_size, std::int64_t special_count,
                                     std::int64_t model_max_length);

// Hugging Face tokenizer.json (BPE model, Llama 3 split regex + byte-level pre-tokenizer) and
// tokenizer_config.json (BOS/EOS, chat template, added_tokens_decoder).
std::string tokenizer_json(const synthetic_vocab& vocab);
std::string tokenizer_config_json(const synthetic_vocab& vocab);

}  // namespace edge::backend
