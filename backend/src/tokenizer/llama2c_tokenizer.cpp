// llama2.c's tokenizer file (tokenizer.bin, tok512.bin): uint32 max_token_length, then for each
// token float32 score, uint32 length and the bytes, all little-endian. Ids 0, 1 and 2 are
// <unk>, BOS and EOS; byte tokens are "<0xXX>". llama2.c's exporter writes a space where
// SentencePiece writes "▁", and BOS/EOS as "\n<s>\n" / "\n</s>\n"; both are put back in
// SentencePiece's spelling so that every SentencePiece vocabulary looks alike.
#include <bit>
#include <cstring>

#include "builders.h"
#include "edge/common/format.h"
#include "file_io.h"

namespace edge::backend {
namespace {

static_assert(std::endian::native == std::endian::little, "llama2.c files are little-endian");

std::string spm_spelling(std::string_view piece) {
  std::string out;
  out.reserve(piece.size());
  for (char c : piece) {
    if (c == ' ') {
      out.append(detail::spm_space);
    } else {
      out += c;
    }
  }
  return out;
}

std::string_view trim_newlines(std::string_view text) {
  while (!text.empty() && (text.front() == '\n' || text.front() == ' ')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  return text;
}

}  // namespace

result<std::unique_ptr<tokenizer>> parse_llama2c_tokenizer(std::string_view bytes, std::int64_t vocab_size) {
  const auto fail = [](std::string what) { return data_loss(std::move(what)); };
  if (bytes.size() < 4) return fail("truncated: no header");
  std::uint32_t max_token_length = 0;
  std::memcpy(&max_token_length, bytes.data(), 4);

  detail::spm_settings s;
  const bool to_end = vocab_size <= 0;
  const std::size_t wanted = to_end ? 0 : static_cast<std::size_t>(vocab_size);
  std::size_t pos = 4;
  while (to_end ? pos < bytes.size() : s.texts.size() < wanted) {
    const std::size_t index = s.texts.size();
    if (bytes.size() - pos < 8) {
      return fail(format("truncated at token {}{}", index, to_end ? "" : format(" of {}", wanted)));
    }
    float score = 0;
    std::uint32_t length = 0;
    std::memcpy(&score, bytes.data() + pos, 4);
    std::memcpy(&length, bytes.data() + pos + 4, 4);
    pos += 8;
    if (length > max_token_length) {
      return fail(format("token {} is {} bytes, longer than the header's max_token_length {}", index, length,
                         max_token_length));
    }
    if (bytes.size() - pos < length) {
      return fail(format("truncated inside token {}{}", index, to_end ? "" : format(" of {}", wanted)));
    }
    const std::string_view piece = bytes.substr(pos, length);
    pos += length;

    detail::token_kind kind = detail::token_kind::normal;
    std::string text;
    if (index <= 2) {
      static constexpr std::string_view fixed_names[] = {"<unk>", "<s>", "</s>"};
      static constexpr detail::token_kind fixed_kinds[] = {detail::token_kind::unknown, detail::token_kind::control,
                                                           detail::token_kind::control};
      const std::string_view trimmed = trim_newlines(piece);
      text = std::string(trimmed.empty() ? fixed_names[index] : trimmed);
      kind = fixed_kinds[index];
    } else if (detail::parse_byte_token(piece)) {
      text = std::string(piece);
      kind = detail::token_kind::byte;
    } else {
      text = spm_spelling(piece);
    }
    s.texts.push_back(std::move(text));
    s.scores.push_back(score);
    s.kinds.push_back(kind);
  }
  if (s.texts.size() < 3) return fail(format("only {} tokens; <unk>, BOS and EOS are required", s.texts.size()));
  s.unknown = 0;
  s.bos = 1;
  s.eos = 2;
  return detail::make_spm_tokenizer(std::move(s));
}

result<std::unique_ptr<tokenizer>> load_llama2c_tokenizer(const std::filesystem::path& path, std::int64_t vocab_size) {
  EDGE_ASSIGN_OR_RETURN(const auto bytes, detail::read_whole_file(path));
  auto made = parse_llama2c_tokenizer(bytes, vocab_size);
  if (!made.ok()) return made.error().with_context(path.string());
  return made;
}

}  // namespace edge::backend
