#include "synthetic_tokenizer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <string_view>
#include <unordered_set>

#include "edge/common/format.h"
#include "edge/common/json_text.h"
#include "edge/common/splitmix64.h"
#include "edge/common/utf8.h"
#include "builders.h"
#include "chat_formats.h"

namespace edge::backend {
namespace {

constexpr std::int64_t byte_symbols = 256;
// Pairs seen fewer times than this in the training text are not worth a merge; the rest of the
// vocabulary is generated.
constexpr std::int64_t min_pair_count = 2;
// Generated tokens stay word-sized, like the long tail of a real vocabulary.
constexpr std::size_t max_generated_token_bytes = 24;
// Fixed, so that every seed's model shares one tokenizer.
constexpr std::uint64_t vocabulary_seed = 0x5eed'70c3'b9e1'7a11ull;

// Original text written for this purpose: everyday English and a little C++, enough for a few
// hundred merges that look like a real tokenizer's first ones.
constexpr std::string_view training_text = R"(Once the morning train had left the station, the town was quiet again.
The baker opened her shop at seven, and the smell of fresh bread filled the street.
Children walked to school in small groups, talking about the weather and the weekend.
It was going to rain later, so most of them carried an umbrella or a coat.
At the library, the new books had arrived: stories about the sea, a history of the city,
and a guide to the mountains in the north. People asked questions, and the answers
were written on cards that hung by the door. "Where is the museum?" one visitor asked.
"Two streets from here, next to the park," said the man at the desk. "You can't miss it."
In the afternoon the sun came out for an hour. The river was high after the storms of
the last week, and the water moved fast under the old stone bridge. Workers were
repairing the road near the market, and the traffic was slower than usual.
In the evening, families cooked dinner and talked about their day. Some of them read,
some of them played games, and some went for a walk before it was dark.
Numbers matter too: 12 apples, 365 days, 2024 and 1999, 3.14 and 42, 100% of the time.

// Returns the sum of the values in the list, or zero when it is empty.
int sum_values(const std::vector<int>& values) {
  int total = 0;
  for (int value : values) {
    total += value;
  }
  return total;
}

struct request {
  std::string name;
  int count = 0;
  bool is_valid() const { return !name.empty() && count > 0; }
};

for (std::size_t i = 0; i < items.size(); ++i) {
  if (items[i].is_valid()) {
    result.push_back(items[i].name);
  } else {
    return error("invalid item at index " + std::to_string(i));
  }
}
The function returns the result of the request, and the value of the count is checked.
When the value is not valid, the error message says which item was wrong and where.
)";

// GPT-2's byte symbols (detail::byte_to_char_table) as a vocabulary's first 256 tokens: ids in
// the order of their characters, so the printable bytes first. Index = token id of the symbol.
struct byte_symbol_table {
  std::array<std::uint8_t, byte_symbols> byte_of_id{};
  std::array<std::string, byte_symbols> text_of_byte;  // UTF-8
};

const byte_symbol_table& byte_symbols_table() {
  static const byte_symbol_table table = [] {
    byte_symbol_table t;
    const auto chars = detail::byte_to_char_table();
    std::array<std::uint8_t, byte_symbols> bytes{};
    for (int b = 0; b < byte_symbols; ++b) {
      bytes[static_cast<std::size_t>(b)] = static_cast<std::uint8_t>(b);
      utf8::append_code_point(t.text_of_byte[static_cast<std::size_t>(b)], chars[static_cast<std::size_t>(b)]);
    }
    std::stable_sort(bytes.begin(), bytes.end(), [&](std::uint8_t x, std::uint8_t y) { return chars[x] < chars[y]; });
    t.byte_of_id = bytes;
    return t;
  }();
  return table;
}

bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_newline(char c) { return c == '\n' || c == '\r'; }

// An ASCII approximation of the Llama 3 split regex, good enough to learn merges from: words
// with their leading space or symbol, digits in threes, punctuation runs, whitespace.
std::vector<std::string_view> pre_tokenize(std::string_view text) {
  constexpr std::size_t max_digits = 3;
  std::vector<std::string_view> pieces;
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t start = i;
    const char c = text[i];
    if (is_letter(c) || (!is_digit(c) && !is_newline(c) && i + 1 < text.size() && is_letter(text[i + 1]))) {
      ++i;
      while (i < text.size() && is_letter(text[i])) ++i;
    } else if (is_digit(c)) {
      while (i < text.size() && is_digit(text[i]) && i - start < max_digits) ++i;
    } else if (!is_space(c) || (c == ' ' && i + 1 < text.size() && !is_space(text[i + 1]))) {
      if (c == ' ') ++i;
      while (i < text.size() && !is_space(text[i]) && !is_letter(text[i]) && !is_digit(text[i])) ++i;
      while (i < text.size() && is_newline(text[i])) ++i;
    } else {
      while (i < text.size() && is_space(text[i])) ++i;
      // A run of spaces before a word leaves its last space to the word.
      if (i < text.size() && i - start > 1 && text[i - 1] == ' ') --i;
    }
    pieces.push_back(text.substr(start, i - start));
  }
  return pieces;
}

class vocabulary_builder {
 public:
  vocabulary_builder() {
    const auto& table = byte_symbols_table();
    for (std::size_t id = 0; id < byte_symbols; ++id) add_token(table.text_of_byte[table.byte_of_id[id]]);
  }

  std::int64_t size() const { return static_cast<std::int64_t>(tokens_.size()); }

  // Byte-pair merges learned from the training text, most frequent pair first.
  void learn(std::int64_t target) {
    const auto& table = byte_symbols_table();
    std::map<std::string_view, std::int64_t> word_counts;
    for (const auto piece : pre_tokenize(training_text)) ++word_counts[piece];

    std::vector<std::int64_t> byte_id(byte_symbols);
    for (std::size_t id = 0; id < byte_symbols; ++id) byte_id[table.byte_of_id[id]] = static_cast<std::int64_t>(id);
    struct word {
      std::vector<std::int64_t> symbols;
      std::int64_t count;
    };
    std::vector<word> words;
    for (const auto& [text, count] : word_counts) {
      word w{{}, count};
      for (const char c : text) w.symbols.push_back(byte_id[static_cast<std::uint8_t>(c)]);
      words.push_back(std::move(w));
    }

    while (size() < target) {
      std::map<std::pair<std::int64_t, std::int64_t>, std::int64_t> pair_counts;
      for (const auto& w : words) {
        for (std::size_t i = 0; i + 1 < w.symbols.size(); ++i) pair_counts[{w.symbols[i], w.symbols[i + 1]}] += w.count;
      }
      // The most frequent pair; among equals the first in id order, so the result is stable.
      auto best = pair_counts.end();
      for (auto it = pair_counts.begin(); it != pair_counts.end(); ++it) {
        if (best == pair_counts.end() || it->second > best->second) best = it;
      }
      if (best == pair_counts.end() || best->second < min_pair_count) return;
      const auto [left, right] = best->first;
      const std::int64_t merged = add_merge(left, right);
      for (auto& w : words) {
        std::vector<std::int64_t> next;
        next.reserve(w.symbols.size());
        for (std::size_t i = 0; i < w.symbols.size(); ++i) {
          if (i + 1 < w.symbols.size() && w.symbols[i] == left && w.symbols[i + 1] == right) {
            next.push_back(merged);
            ++i;
          } else {
            next.push_back(w.symbols[i]);
          }
        }
        w.symbols = std::move(next);
      }
    }
  }

  // Pairs of existing tokens chosen at random, as long as they make a new word-sized token:
  // they fill the vocabulary to a real model's size, so that loading and tokenizing face the
  // same number of entries as with real weights.
  void generate(std::int64_t target) {
    const std::string space = byte_symbols_table().text_of_byte[' '];
    const std::string newline = byte_symbols_table().text_of_byte['\n'];
    std::uint64_t state = vocabulary_seed;
    while (size() < target) {
      const auto count = static_cast<std::uint64_t>(size());
      const auto left = static_cast<std::int64_t>(splitmix64(state) % count);
      const auto right = static_cast<std::int64_t>(splitmix64(state) % count);
      const std::string& a = tokens_[static_cast<std::size_t>(left)];
      const std::string& b = tokens_[static_cast<std::size_t>(right)];
      if (b.starts_with(space) || a.find(newline) != std::string::npos || b.find(newline) != std::string::npos ||
          a.size() + b.size() > max_generated_token_bytes || known_.contains(a + b)) {
        continue;
      }
      add_merge(left, right);
    }
  }

  std::vector<std::string> take_tokens() { return std::move(tokens_); }
  std::vector<std::string> take_merges() { return std::move(merges_); }

 private:
  std::int64_t add_token(std::string text) {
    known_.insert(text);
    tokens_.push_back(std::move(text));
    return size() - 1;
  }

  std::int64_t add_merge(std::int64_t left, std::int64_t right) {
    const std::string& a = tokens_[static_cast<std::size_t>(left)];
    const std::string& b = tokens_[static_cast<std::size_t>(right)];
    merges_.push_back(a + " " + b);
    std::string merged = a + b;
    // Two different pairs can spell the same token; it keeps its first id.
    if (known_.contains(merged)) {
      return static_cast<std::int64_t>(std::find(tokens_.begin(), tokens_.end(), merged) - tokens_.begin());
    }
    return add_token(std::move(merged));
  }

  std::vector<std::string> tokens_;
  std::vector<std::string> merges_;
  std::unordered_set<std::string> known_;
};

// Llama 3's special tokens in their order; the rest of the block is reserved tokens.
constexpr std::string_view llama3_specials[] = {
    "<|begin_of_text|>",      "<|end_of_text|>",          "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
    "<|start_header_id|>",    "<|end_header_id|>",        "<|eom_id|>",
    "<|eot_id|>",             "<|python_tag|>",
};
constexpr std::int64_t llama3_first_reserved = 3;  // reserved_special_token_0..2 are above
constexpr std::string_view chatml_specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

std::int64_t id_of(const synthetic_vocab& vocab, std::string_view text) {
  const auto it = std::find(vocab.tokens.begin() + vocab.first_special, vocab.tokens.end(), text);
  return static_cast<std::int64_t>(it - vocab.tokens.begin());
}

}  // namespace

synthetic_vocab make_synthetic_vocab(special_token_style style, std::int64_t vocab_size, std::int64_t special_count,
                                     std::int64_t model_max_length) {
  const auto* named = style == special_token_style::llama3 ? std::begin(llama3_specials) : std::begin(chatml_specials);
  const auto* named_end = style == special_token_style::llama3 ? std::end(llama3_specials) : std::end(chatml_specials);
  const auto named_count = static_cast<std::int64_t>(named_end - named);
  special_count = std::max(special_count, named_count);
  const std::int64_t base_size = std::max(vocab_size - special_count, byte_symbols);

  vocabulary_builder builder;
  builder.learn(base_size);
  builder.generate(base_size);

  synthetic_vocab vocab;
  vocab.tokens = builder.take_tokens();
  vocab.merges = builder.take_merges();
  vocab.first_special = static_cast<std::int64_t>(vocab.tokens.size());
  vocab.model_max_length = model_max_length;
  for (const auto* it = named; it != named_end; ++it) vocab.tokens.emplace_back(*it);
  std::int64_t reserved = style == special_token_style::llama3 ? llama3_first_reserved : 0;
  while (static_cast<std::int64_t>(vocab.tokens.size()) < vocab_size) {
    vocab.tokens.push_back(edge::format("<|reserved_special_token_{}|>", reserved++));
  }

  if (style == special_token_style::llama3) {
    vocab.bos_id = id_of(vocab, "<|begin_of_text|>");
    vocab.add_bos = true;
    vocab.eos_id = id_of(vocab, "<|eot_id|>");
    vocab.pad_id = id_of(vocab, "<|end_of_text|>");
    vocab.chat_template = std::string(chat_format_of(chat_template_kind::llama3).jinja);
  } else {
    vocab.eos_id = id_of(vocab, "<|im_end|>");
    vocab.pad_id = id_of(vocab, "<|endoftext|>");
    vocab.chat_template = std::string(chat_format_of(chat_template_kind::chatml).jinja);
  }
  return vocab;
}

std::string tokenizer_json(const synthetic_vocab& vocab) {
  constexpr std::size_t typical_bytes_per_token = 48;  // a vocab entry and a merge line
  std::string out;
  out.reserve(vocab.tokens.size() * typical_bytes_per_token);
  out += "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [";
  for (std::size_t id = static_cast<std::size_t>(vocab.first_special); id < vocab.tokens.size(); ++id) {
    out += id == static_cast<std::size_t>(vocab.first_special) ? "\n    " : ",\n    ";
    out += "{\"id\": " + std::to_string(id) + ", \"content\": " + json_string(vocab.tokens[id]) +
           ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": false, "
           "\"special\": true}";
  }
  out += "\n  ],\n  \"normalizer\": null,\n";
  out += "  \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
         "{\"Regex\": " +
         json_string(detail::llama3_pattern) +
         "}, \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
         "\"trim_offsets\": true, \"use_regex\": false}]},\n";
  if (vocab.bos_id && vocab.add_bos) {
    const auto bos = json_string(vocab.tokens[static_cast<std::size_t>(*vocab.bos_id)]);
    out += "  \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": " + bos +
           ", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"pair\": [{\"SpecialToken\": "
           "{\"id\": " +
           bos + ", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, {\"SpecialToken\": {\"id\": " +
           bos + ", \"type_id\": 1}}, {\"Sequence\": {\"id\": \"B\", \"type_id\": 1}}], \"special_tokens\": {" + bos +
           ": {\"id\": " + bos + ", \"ids\": [" + std::to_string(*vocab.bos_id) + "], \"tokens\": [" + bos +
           "]}}},\n";
  } else {
    out += "  \"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": false, "
           "\"use_regex\": false},\n";
  }
  out += "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, "
         "\"use_regex\": true},\n";
  out += "  \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": null, "
         "\"end_of_word_suffix\": null, \"fuse_unk\": false, \"byte_fallback\": false, \"ignore_merges\": false,\n"
         "    \"vocab\": {";
  for (std::int64_t id = 0; id < vocab.first_special; ++id) {
    out += id == 0 ? "\n      " : ",\n      ";
    append_json_string(out, vocab.tokens[static_cast<std::size_t>(id)]);
    out += ": " + std::to_string(id);
  }
  out += "\n    },\n    \"merges\": [";
  for (std::size_t i = 0; i < vocab.merges.size(); ++i) {
    out += i == 0 ? "\n      " : ",\n      ";
    append_json_string(out, vocab.merges[i]);
  }
  out += "\n    ]\n  }\n}\n";
  return out;
}

std::string tokenizer_config_json(const synthetic_vocab& vocab) {
  const auto text_of = [&](std::int64_t id) { return json_string(vocab.tokens[static_cast<std::size_t>(id)]); };
  std::string out = "{\n";
  out += std::string("  \"add_bos_token\": ") + (vocab.add_bos ? "true" : "false") + ",\n  \"add_eos_token\": false,\n";
  out += "  \"added_tokens_decoder\": {";
  for (auto id = vocab.first_special; id < static_cast<std::int64_t>(vocab.tokens.size()); ++id) {
    out += id == vocab.first_special ? "\n    " : ",\n    ";
    out += "\"" + std::to_string(id) + "\": {\"content\": " + text_of(id) +
           ", \"lstrip\": false, \"normalized\": false, \"rstrip\": false, \"single_word\": false, "
           "\"special\": true}";
  }
  out += "\n  },\n";
  out += "  \"bos_token\": " + (vocab.bos_id ? text_of(*vocab.bos_id) : std::string("null")) + ",\n";
  out += "  \"eos_token\": " + text_of(vocab.eos_id) + ",\n";
  out += "  \"pad_token\": " + text_of(vocab.pad_id) + ",\n";
  out += "  \"chat_template\": " + json_string(vocab.chat_template) + ",\n";
  out += "  \"clean_up_tokenization_spaces\": false,\n";
  out += "  \"model_max_length\": " + std::to_string(vocab.model_max_length) + ",\n";
  out += "  \"tokenizer_class\": \"PreTrainedTokenizerFast\"\n}\n";
  return out;
}

}  // namespace edge::backend
