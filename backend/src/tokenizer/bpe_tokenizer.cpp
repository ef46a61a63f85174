// BPE by merge rank, as Hugging Face `tokenizers` runs it: added tokens are split out first,
// each run between them is normalized and pre-tokenized, and each pre-token ("word") is merged
// on its own. Byte-level models (GPT-2, Llama 3, Qwen) start a word from one symbol per byte
// (the vocabulary spells bytes with GPT-2's printable characters); the others (SentencePiece
// models converted to tokenizer.json) start from one symbol per character, with <0xXX> tokens
// for characters the vocabulary lacks.
//
// Merging uses a priority queue of (rank, position) over a linked list of symbols, checked
// lazily when popped, and a hash table keyed by the pair of ids: O(n log n) per word, no string
// built per symbol. There is no per-word result cache: merging a typical word costs about what a
// locked cache lookup would, and without one the tokenizer holds no mutable state at all, so
// concurrent encode() calls need no synchronisation.
#include <algorithm>
#include <array>

#include "builders.h"
#include "edge/common/format.h"
#include "edge/common/utf8.h"

namespace edge::backend::detail {

std::array<char32_t, 256> byte_to_char_table() {
  std::array<char32_t, 256> table{};
  const auto printable = [](unsigned b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174); };
  char32_t next = 256;
  for (unsigned b = 0; b < 256; ++b) table[b] = printable(b) ? b : next++;
  return table;
}

namespace {

// The pair table: open addressing over 64-bit keys (left id, right id).
class merge_table {
 public:
  struct value {
    std::int32_t rank;
    token_id merged;
  };

  void reserve(std::size_t count) {
    std::size_t capacity = 16;
    while (capacity < count * 2) capacity *= 2;
    slots_.assign(capacity, slot{});
    mask_ = capacity - 1;
  }

  // Keeps the first (lowest) rank when a pair is listed twice.
  void insert(token_id left, token_id right, value v) {
    const std::uint64_t key = pack(left, right);
    for (std::size_t i = hash(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == empty_key) {
        slots_[i] = {key, v};
        return;
      }
      if (slots_[i].key == key) return;
    }
  }

  const value* find(token_id left, token_id right) const {
    const std::uint64_t key = pack(left, right);
    for (std::size_t i = hash(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return &slots_[i].v;
      if (slots_[i].key == empty_key) return nullptr;
    }
  }

 private:
  static constexpr std::uint64_t empty_key = ~std::uint64_t{0};
  struct slot {
    std::uint64_t key = empty_key;
    value v{};
  };
  static std::uint64_t pack(token_id left, token_id right) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) | static_cast<std::uint32_t>(right);
  }
  std::size_t hash(std::uint64_t key) const {
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ULL) >> 17) & mask_;
  }

  std::vector<slot> slots_;
  std::size_t mask_ = 0;
};

using span = std::pair<std::size_t, std::size_t>;  // [begin, end) in a buffer

// The pieces of one run as pre-tokenization goes: spans over `text`. A step that only splits
// replaces the spans; one that edits (prefixes, replacements) writes a new text.
struct pre_tokenized {
  std::string text;
  std::vector<span> pieces;
};

class bpe_tokenizer final : public vocab_tokenizer {
 public:
  explicit bpe_tokenizer(bpe_settings s)
      : normalizers_(std::move(s.normalizers)),
        pre_tokenizers_(std::move(s.pre_tokenizers)),
        unknown_(s.unknown),
        byte_level_(s.byte_level),
        byte_fallback_(s.byte_fallback),
        ignore_merges_(s.ignore_merges),
        fuse_unk_(s.fuse_unk) {
    texts_ = std::move(s.texts);
    kinds_ = std::move(s.kinds);
    for (const added_token& token : s.added) {
      const auto id = static_cast<std::size_t>(token.id);
      texts_[id] = token.content;
      kinds_[id] = token.special ? token_kind::control : token_kind::user_defined;
    }
    index_texts();
    // Added tokens win over a model piece with the same text, as in `tokenizers`.
    for (const added_token& token : s.added) ids_[token.content] = token.id;

    bos_ = s.bos;
    add_bos_ = s.add_bos;
    strip_space_after_bos_ = s.strip_space_after_bos;

    const auto table = byte_to_char_table();
    std::array<std::int32_t, 0x144> char_to_byte{};
    char_to_byte.fill(-1);
    for (unsigned b = 0; b < 256; ++b) {
      byte_chars_[b].clear();
      utf8::append_code_point(byte_chars_[b], table[b]);
      char_to_byte[table[b]] = static_cast<std::int32_t>(b);
    }
    byte_ids_.fill(-1);
    for (unsigned b = 0; b < 256; ++b) {
      if (byte_level_) {
        if (const auto id = find_piece(byte_chars_[b])) byte_ids_[b] = *id;
      } else if (byte_fallback_) {
        if (const auto id = find_token(format("<0x{}{}>", "0123456789ABCDEF"[b >> 4], "0123456789ABCDEF"[b & 15]))) {
          byte_ids_[b] = *id;
        }
      }
    }

    merges_.reserve(s.merges.size());
    for (std::size_t rank = 0; rank < s.merges.size(); ++rank) {
      const auto& [a, b] = s.merges[rank];
      const auto left = find_token(a);
      const auto right = find_token(b);
      const auto merged = find_token(a + b);
      if (!left || !right || !merged) {
        bad_merge_ = a + " " + b;
        break;
      }
      merges_.insert(*left, *right, {static_cast<std::int32_t>(rank), *merged});
    }

    decoded_.resize(texts_.size());
    for (std::size_t id = 0; id < texts_.size(); ++id) {
      std::string bytes = texts_[id];
      if (s.decode_byte_level) {
        std::string mapped;
        bool all_mapped = true;
        for (std::size_t pos = 0; pos < bytes.size();) {
          const std::size_t length = utf8::valid_length(bytes, pos);
          const char32_t c = length ? utf8::decode(std::string_view(bytes).substr(pos), length) : 0x110000;
          if (c >= char_to_byte.size() || char_to_byte[c] < 0) {
            all_mapped = false;
            break;
          }
          mapped += static_cast<char>(char_to_byte[c]);
          pos += length;
        }
        if (all_mapped) bytes = std::move(mapped);
      }
      if (!s.decode_replace_from.empty()) {
        std::string replaced;
        for (std::size_t pos = 0; pos < bytes.size();) {
          if (bytes.compare(pos, s.decode_replace_from.size(), s.decode_replace_from) == 0) {
            replaced += ' ';
            pos += s.decode_replace_from.size();
          } else {
            replaced += bytes[pos++];
          }
        }
        bytes = std::move(replaced);
      }
      if (s.decode_byte_fallback) {
        if (const auto byte = parse_byte_token(texts_[id])) bytes = std::string(1, static_cast<char>(*byte));
      }
      decoded_[id] = std::move(bytes);
    }

    set_eos(s.eos);
    for (const added_token& token : s.added) {
      specials_.add(token.content, token.id, {.always = !token.special, .lstrip = token.lstrip, .rstrip = token.rstrip});
    }
    specials_.finish();
  }

  // A merge whose tokens are missing from the vocabulary (the tokenizer is unusable); empty when
  // every merge is sound.
  const std::string& bad_merge() const { return bad_merge_; }

 private:
  struct symbol {
    token_id id;
    std::int32_t prev;
    std::int32_t next;
    bool alive;
  };
  struct candidate {
    std::int32_t rank;
    std::int32_t left;
    token_id merged;
  };
  struct lower_priority {
    bool operator()(const candidate& a, const candidate& b) const {
      if (a.rank != b.rank) return a.rank > b.rank;
      return a.left > b.left;
    }
  };
  // Reused across the words of one run.
  struct scratch {
    std::vector<symbol> symbols;
    std::vector<candidate> queue;
    std::string mapped;
    std::vector<span> matches;
    std::vector<span> segments;
    std::vector<char> is_match;  // [segments]
  };

  void encode_run(std::string_view run, bool at_start, std::vector<token_id>& out) const override {
    pre_tokenized state;
    if (normalizers_.empty()) {
      state.text.assign(run);
    } else {
      normalize(run, state.text);
    }
    if (state.text.empty()) return;
    state.pieces.push_back({0, state.text.size()});
    scratch work;
    for (const pre_tokenizer_step& step : pre_tokenizers_) apply(step, at_start, state, work);
    for (const auto& [begin, end] : state.pieces) {
      if (end > begin) encode_word(std::string_view(state.text).substr(begin, end - begin), work, out);
    }
  }

  void normalize(std::string_view run, std::string& out) const {
    std::string current(run);
    std::string next;
    for (const normalizer_step& step : normalizers_) {
      next.clear();
      switch (step.kind) {
        case normalizer_step::type::unicode:
          append_normalized(step.form, current, next);
          break;
        case normalizer_step::type::prepend:
          if (!current.empty()) next = step.text + current;
          break;
        case normalizer_step::type::replace:
          if (step.regex) {
            std::vector<span> found;
            step.regex->find_all(current, found);
            std::size_t last = 0;
            for (const auto& [begin, end] : found) {
              next.append(current, last, begin - last);
              next += step.content;
              last = end;
            }
            next.append(current, last);
          } else if (!step.text.empty()) {
            std::size_t last = 0;
            for (std::size_t pos = current.find(step.text); pos != std::string::npos;
                 pos = current.find(step.text, last)) {
              next.append(current, last, pos - last);
              next += step.content;
              last = pos + step.text.size();
            }
            next.append(current, last);
          } else {
            next = current;
          }
          break;
      }
      current.swap(next);
    }
    out = std::move(current);
  }

  // Splits every piece by the step's regex (or literal) with the step's delimiter behaviour.
  static void split(const std::optional<pcre_regex>& regex, std::string_view literal, split_behavior behavior,
                    bool invert, pre_tokenized& state, scratch& work) {
    std::vector<span> result;
    result.reserve(state.pieces.size() * 2);
    const std::string_view text = state.text;
    for (const auto& [begin, end] : state.pieces) {
      const std::string_view piece = text.substr(begin, end - begin);
      work.matches.clear();
      if (regex) {
        regex->find_all(piece, work.matches);
      } else if (!literal.empty()) {
        for (std::size_t pos = piece.find(literal); pos != std::string_view::npos;
             pos = piece.find(literal, pos + literal.size())) {
          work.matches.emplace_back(pos, pos + literal.size());
        }
      }
      // Segments covering the piece in order: the matches and the gaps between them.
      work.segments.clear();
      std::vector<char>& is_match = work.is_match;
      is_match.clear();
      std::size_t last = 0;
      for (const auto& [m_begin, m_end] : work.matches) {
        if (m_begin > last) {
          work.segments.emplace_back(begin + last, begin + m_begin);
          is_match.push_back(static_cast<char>(invert));
        }
        work.segments.emplace_back(begin + m_begin, begin + m_end);
        is_match.push_back(static_cast<char>(!invert));
        last = m_end;
      }
      if (last < piece.size()) {
        work.segments.emplace_back(begin + last, end);
        is_match.push_back(static_cast<char>(invert));
      }
      apply_behavior(behavior, work.segments, is_match, result);
    }
    state.pieces = std::move(result);
  }

  static void apply_behavior(split_behavior behavior, const std::vector<span>& segments,
                             const std::vector<char>& is_match, std::vector<span>& out) {
    const std::size_t first_out = out.size();
    bool previous_match = false;
    switch (behavior) {
      case split_behavior::removed:
        for (std::size_t i = 0; i < segments.size(); ++i) {
          if (!is_match[i]) out.push_back(segments[i]);
        }
        break;
      case split_behavior::isolated:
        out.insert(out.end(), segments.begin(), segments.end());
        break;
      case split_behavior::merged_with_previous:
        for (std::size_t i = 0; i < segments.size(); ++i) {
          if (is_match[i] && !previous_match && out.size() > first_out) {
            out.back().second = segments[i].second;
          } else {
            out.push_back(segments[i]);
          }
          previous_match = is_match[i] != 0;
        }
        break;
      case split_behavior::merged_with_next: {
        // Walks backwards: a delimiter joins the piece after it.
        std::vector<span> reversed;
        for (std::size_t i = segments.size(); i-- > 0;) {
          if (is_match[i] && !previous_match && !reversed.empty()) {
            reversed.back().first = segments[i].first;
          } else {
            reversed.push_back(segments[i]);
          }
          previous_match = is_match[i] != 0;
        }
        out.insert(out.end(), reversed.rbegin(), reversed.rend());
        break;
      }
      case split_behavior::contiguous:
        for (std::size_t i = 0; i < segments.size(); ++i) {
          if (i > 0 && (is_match[i] != 0) == previous_match && out.size() > first_out) {
            out.back().second = segments[i].second;
          } else {
            out.push_back(segments[i]);
          }
          previous_match = is_match[i] != 0;
        }
        break;
    }
  }

  // Rewrites every piece through `edit(piece, index, out)`, which appends the new piece text.
  template <class Edit>
  static void rewrite(pre_tokenized& state, Edit edit) {
    std::string text;
    text.reserve(state.text.size() + state.pieces.size());
    std::vector<span> pieces;
    pieces.reserve(state.pieces.size());
    for (std::size_t i = 0; i < state.pieces.size(); ++i) {
      const auto [begin, end] = state.pieces[i];
      const std::size_t start = text.size();
      edit(std::string_view(state.text).substr(begin, end - begin), i, text);
      pieces.emplace_back(start, text.size());
    }
    state.text = std::move(text);
    state.pieces = std::move(pieces);
  }

  void apply(const pre_tokenizer_step& step, bool at_start, pre_tokenized& state, scratch& work) const {
    switch (step.kind) {
      case pre_tokenizer_step::type::split:
        split(step.regex, step.literal, step.behavior, step.invert, state, work);
        break;
      case pre_tokenizer_step::type::byte_level:
        if (step.add_prefix_space) {
          rewrite(state, [](std::string_view piece, std::size_t, std::string& out) {
            if (!piece.starts_with(' ')) out += ' ';
            out.append(piece);
          });
        }
        if (step.regex) split(step.regex, {}, split_behavior::isolated, false, state, work);
        break;
      case pre_tokenizer_step::type::metaspace: {
        const std::string& replacement = step.replacement;
        rewrite(state, [&](std::string_view piece, std::size_t index, std::string& out) {
          std::string replaced;
          replaced.reserve(piece.size());
          for (char c : piece) {
            if (c == ' ') {
              replaced += replacement;
            } else {
              replaced += c;
            }
          }
          const bool prepend = step.prepend == prepend_scheme::always ||
                               (step.prepend == prepend_scheme::first && at_start && index == 0);
          if (prepend && !std::string_view(replaced).starts_with(replacement)) out += replacement;
          out += replaced;
        });
        if (step.split_on_replacement) {
          split(std::nullopt, replacement, split_behavior::merged_with_next, false, state, work);
        }
        break;
      }
    }
  }

  void push_unknown(std::vector<symbol>& symbols) const {
    if (!unknown_) return;
    if (fuse_unk_ && !symbols.empty() && symbols.back().id == *unknown_) return;
    symbols.push_back({*unknown_, 0, 0, true});
  }

  void encode_word(std::string_view word, scratch& work, std::vector<token_id>& out) const {
    if (byte_level_ && word.size() == 1 && byte_ids_[static_cast<unsigned char>(word[0])] >= 0) {
      out.push_back(byte_ids_[static_cast<unsigned char>(word[0])]);
      return;
    }
    if (ignore_merges_) {
      std::string_view whole = word;
      if (byte_level_) {
        work.mapped.clear();
        for (char c : word) work.mapped += byte_chars_[static_cast<unsigned char>(c)];
        whole = work.mapped;
      }
      if (const auto id = find_piece(whole)) {
        out.push_back(*id);
        return;
      }
    }

    std::vector<symbol>& symbols = work.symbols;
    symbols.clear();
    if (byte_level_) {
      for (char c : word) {
        const token_id id = byte_ids_[static_cast<unsigned char>(c)];
        if (id >= 0) {
          symbols.push_back({id, 0, 0, true});
        } else {
          push_unknown(symbols);
        }
      }
    } else {
      for (std::size_t pos = 0; pos < word.size();) {
        const std::size_t length = std::max<std::size_t>(1, utf8::valid_length(word, pos));
        const std::string_view character = word.substr(pos, length);
        pos += length;
        if (const auto id = find_piece(character)) {
          symbols.push_back({*id, 0, 0, true});
          continue;
        }
        const bool bytes_known = byte_fallback_ && std::all_of(character.begin(), character.end(), [&](char c) {
          return byte_ids_[static_cast<unsigned char>(c)] >= 0;
        });
        if (bytes_known) {
          for (char c : character) symbols.push_back({byte_ids_[static_cast<unsigned char>(c)], 0, 0, true});
        } else {
          push_unknown(symbols);
        }
      }
    }
    const auto count = static_cast<std::int32_t>(symbols.size());
    for (std::int32_t i = 0; i < count; ++i) {
      symbols[i].prev = i - 1;
      symbols[i].next = i + 1 < count ? i + 1 : -1;
    }

    // A binary heap kept in the scratch vector, so its capacity serves every word of the run.
    std::vector<candidate>& queue = work.queue;
    queue.clear();
    const auto push = [&](candidate c) {
      queue.push_back(c);
      std::push_heap(queue.begin(), queue.end(), lower_priority{});
    };
    for (std::int32_t i = 0; i + 1 < count; ++i) {
      if (const auto* m = merges_.find(symbols[i].id, symbols[i + 1].id)) push({m->rank, i, m->merged});
    }
    while (!queue.empty()) {
      std::pop_heap(queue.begin(), queue.end(), lower_priority{});
      const candidate top = queue.back();
      queue.pop_back();
      symbol& left = symbols[top.left];
      if (!left.alive || left.next < 0) continue;
      symbol& right = symbols[left.next];
      const auto* m = merges_.find(left.id, right.id);
      if (!m || m->merged != top.merged) continue;
      left.id = top.merged;
      right.alive = false;
      left.next = right.next;
      if (left.next >= 0) symbols[left.next].prev = top.left;
      if (left.prev >= 0) {
        if (const auto* before = merges_.find(symbols[left.prev].id, left.id)) {
          push({before->rank, left.prev, before->merged});
        }
      }
      if (left.next >= 0) {
        if (const auto* after = merges_.find(left.id, symbols[left.next].id)) {
          push({after->rank, top.left, after->merged});
        }
      }
    }
    for (std::int32_t i = count > 0 ? 0 : -1; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
  }

  std::vector<normalizer_step> normalizers_;
  std::vector<pre_tokenizer_step> pre_tokenizers_;
  merge_table merges_;
  std::array<token_id, 256> byte_ids_{};  // byte-level: the token of each byte's character;
                                          // otherwise its <0xXX> token; -1 when absent
  std::array<std::string, 256> byte_chars_;  // GPT-2's character for each byte, as UTF-8
  std::optional<token_id> unknown_;
  bool byte_level_;
  bool byte_fallback_;
  bool ignore_merges_;
  bool fuse_unk_;
  std::string bad_merge_;
};

}  // namespace

result<std::unique_ptr<tokenizer>> make_bpe_tokenizer(bpe_settings settings) {
  std::size_t n = settings.texts.size();
  for (const added_token& token : settings.added) {
    if (token.id < 0) return invalid_argument(format("added token \"{}\" has a negative id", token.content));
    n = std::max(n, static_cast<std::size_t>(token.id) + 1);
  }
  if (n == 0) return invalid_argument("the vocabulary is empty");
  if (n > static_cast<std::size_t>(INT32_MAX)) return invalid_argument("the vocabulary is too large");
  if (settings.kinds.size() != settings.texts.size()) {
    return invalid_argument(format("the vocabulary has {} tokens but {} types", settings.texts.size(),
                                   settings.kinds.size()));
  }
  settings.texts.resize(n);
  settings.kinds.resize(n, token_kind::unused);
  for (const auto* id : {&settings.bos, &settings.eos, &settings.unknown}) {
    if (*id && (**id < 0 || static_cast<std::size_t>(**id) >= n)) {
      return invalid_argument(format("special token id {} is outside the vocabulary of {} tokens", **id, n));
    }
  }
  auto made = std::make_unique<bpe_tokenizer>(std::move(settings));
  if (!made->bad_merge().empty()) {
    return invalid_argument(format("the merge \"{}\" names a token that is not in the vocabulary", made->bad_merge()));
  }
  return std::unique_ptr<tokenizer>(std::move(made));
}

}  // namespace edge::backend::detail
