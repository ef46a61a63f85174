// SentencePiece-style BPE by score with byte fallback (Llama 2, Mistral, stories260K).
//
// A run of text becomes "▁" + the text with spaces as "▁", split into characters. The adjacent
// pair whose concatenation is a vocabulary piece with the highest score is merged (the leftmost
// on a tie) until no pair is a piece; a priority queue of candidate pairs over a linked list of
// symbols keeps that O(n log n). A symbol left that is not a piece becomes its <0xXX> byte
// tokens (or <unk> without them).
#include <array>
#include <queue>

#include "builders.h"
#include "edge/common/format.h"
#include "edge/common/utf8.h"

namespace edge::backend::detail {
namespace {

class spm_tokenizer final : public vocab_tokenizer {
 public:
  explicit spm_tokenizer(spm_settings settings) : scores_(std::move(settings.scores)) {
    texts_ = std::move(settings.texts);
    kinds_ = std::move(settings.kinds);
    unknown_ = settings.unknown;
    add_space_prefix_ = settings.add_space_prefix;
    strip_space_after_bos_ = settings.add_space_prefix;
    bos_ = settings.bos;
    add_bos_ = settings.add_bos;
    byte_ids_.fill(-1);
    decoded_.resize(texts_.size());
    for (std::size_t id = 0; id < texts_.size(); ++id) {
      const std::string& text = texts_[id];
      if (kinds_[id] == token_kind::byte) {
        if (const auto byte = parse_byte_token(text)) {
          if (byte_ids_[*byte] < 0) byte_ids_[*byte] = static_cast<token_id>(id);
          decoded_[id] = std::string(1, static_cast<char>(*byte));
          continue;
        }
      }
      if (kinds_[id] == token_kind::normal || kinds_[id] == token_kind::user_defined) {
        std::string bytes;
        bytes.reserve(text.size());
        for (std::size_t pos = 0; pos < text.size();) {
          if (text.compare(pos, spm_space.size(), spm_space) == 0) {
            bytes += ' ';
            pos += spm_space.size();
          } else {
            bytes += text[pos++];
          }
        }
        decoded_[id] = std::move(bytes);
      } else {
        decoded_[id] = text;
      }
    }
    index_texts();
    set_eos(settings.eos);
    register_special_tokens();
  }

 private:
  struct symbol {
    std::uint32_t begin;  // offset in the normalized text
    std::uint32_t size;   // 0 once merged into its left neighbour
    std::int32_t prev;
    std::int32_t next;
  };
  struct candidate {
    float score;
    std::int32_t left;
    std::uint32_t size;  // of the pair when queued: a different size means the pair has changed
  };
  struct lower_priority {
    bool operator()(const candidate& a, const candidate& b) const {
      if (a.score != b.score) return a.score < b.score;
      return a.left > b.left;
    }
  };

  void encode_run(std::string_view run, bool, std::vector<token_id>& out) const override {
    // SentencePiece prefixes every separately encoded text, which is what each run between
    // special tokens is (as llama.cpp and Hugging Face's legacy Llama tokenizer do it).
    std::string normalized;
    normalized.reserve(run.size() + run.size() / 2 + spm_space.size());
    if (add_space_prefix_) normalized.append(spm_space);
    for (char c : run) {
      if (c == ' ') {
        normalized.append(spm_space);
      } else {
        normalized += c;
      }
    }

    std::vector<symbol> symbols;
    symbols.reserve(normalized.size());
    for (std::size_t pos = 0; pos < normalized.size();) {
      const std::size_t length = std::max<std::size_t>(1, utf8::valid_length(normalized, pos));
      const auto index = static_cast<std::int32_t>(symbols.size());
      symbols.push_back({static_cast<std::uint32_t>(pos), static_cast<std::uint32_t>(length), index - 1, index + 1});
      pos += length;
    }
    if (symbols.empty()) return;
    symbols.back().next = -1;

    std::vector<candidate> storage;
    storage.reserve(symbols.size());
    std::priority_queue<candidate, std::vector<candidate>, lower_priority> queue(lower_priority{}, std::move(storage));
    const auto consider = [&](std::int32_t left) {
      if (left < 0) return;
      const std::int32_t right = symbols[left].next;
      if (right < 0) return;
      const std::uint32_t size = symbols[left].size + symbols[right].size;
      const auto piece = find_piece(std::string_view(normalized).substr(symbols[left].begin, size));
      if (!piece) return;
      queue.push({scores_[static_cast<std::size_t>(*piece)], left, size});
    };
    for (std::int32_t i = 0; i + 1 < static_cast<std::int32_t>(symbols.size()); ++i) consider(i);

    while (!queue.empty()) {
      const candidate top = queue.top();
      queue.pop();
      symbol& left = symbols[top.left];
      if (left.size == 0 || left.next < 0) continue;
      symbol& right = symbols[left.next];
      if (left.size + right.size != top.size) continue;
      left.size += right.size;
      right.size = 0;
      left.next = right.next;
      if (left.next >= 0) symbols[left.next].prev = top.left;
      consider(left.prev);
      consider(top.left);
    }

    for (std::int32_t i = 0; i >= 0; i = symbols[i].next) {
      const std::string_view text = std::string_view(normalized).substr(symbols[i].begin, symbols[i].size);
      if (const auto piece = find_piece(text)) {
        out.push_back(*piece);
        continue;
      }
      for (char c : text) {
        const token_id byte = byte_ids_[static_cast<unsigned char>(c)];
        if (byte >= 0) {
          out.push_back(byte);
        } else if (unknown_) {
          out.push_back(*unknown_);
        }
      }
    }
  }

  std::vector<float> scores_;          // [vocab]
  std::array<token_id, 256> byte_ids_{};  // <0xXX> token per byte; -1 when the vocabulary has none
  std::optional<token_id> unknown_;
  bool add_space_prefix_ = true;
};

}  // namespace

result<std::unique_ptr<tokenizer>> make_spm_tokenizer(spm_settings settings) {
  const std::size_t n = settings.texts.size();
  if (n == 0) return invalid_argument("the vocabulary is empty");
  if (settings.scores.size() != n || settings.kinds.size() != n) {
    return invalid_argument(format("the vocabulary has {} pieces but {} scores and {} types", n,
                                   settings.scores.size(), settings.kinds.size()));
  }
  if (n > static_cast<std::size_t>(INT32_MAX)) return invalid_argument("the vocabulary is too large");
  for (const auto* id : {&settings.bos, &settings.eos, &settings.unknown}) {
    if (*id && (**id < 0 || static_cast<std::size_t>(**id) >= n)) {
      return invalid_argument(format("special token id {} is outside the vocabulary of {} pieces", **id, n));
    }
  }
  return std::unique_ptr<tokenizer>(std::make_unique<spm_tokenizer>(std::move(settings)));
}

}  // namespace edge::backend::detail
