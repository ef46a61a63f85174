// libFuzzer harness: the SentencePiece-style (and GGUF byte-level) vocabulary loaders on
// arbitrary bytes. Bytes that start with the GGUF magic go through parse_gguf and
// tokenizer_from_gguf (tokenizer.ggml.model "llama" or "gpt2"); anything else is a llama2.c
// tokenizer file. Each returns a tokenizer or a status and never crashes; what they accept
// keeps every tokenizer's promises (tokenizer_checks.h) on a probe text, and a llama2.c file
// read for fewer tokens than it holds loads, for more it is data_loss.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "edge/backend/io/gguf.h"
#include "tokenizer_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

namespace be = edge::backend;

constexpr std::string_view probe =
    "Once upon a time there was a  little girl. 2024 caf\u00e9 \u65e5\u672c \U0001F600 <s>x</s>\xE2\x96";

void check(const be::tokenizer& tok) {
  edge::fuzz::check_encoding(tok, probe, {.add_bos = true, .parse_special = true});
  edge::fuzz::check_encoding(tok, probe, {.add_bos = false, .parse_special = false});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  if (bytes.starts_with("GGUF")) {
    const auto file = be::parse_gguf(std::span(reinterpret_cast<const std::byte*>(data), size));
    if (!file.ok()) return 0;
    const auto tok = be::tokenizer_from_gguf(*file);
    if (tok.ok()) check(**tok);
    return 0;
  }
  const auto tok = be::parse_llama2c_tokenizer(bytes, 0);
  if (!tok.ok()) return 0;
  check(**tok);
  const std::int64_t count = (*tok)->vocab_size();
  if (count > 3) edge::fuzz::require(be::parse_llama2c_tokenizer(bytes, count - 1).ok());
  const auto too_many = be::parse_llama2c_tokenizer(bytes, count + 1);
  edge::fuzz::require(!too_many.ok() && too_many.error().code() == edge::status_code::data_loss);
  return 0;
}
