// libFuzzer harness: parse_hf_tokenizer on arbitrary bytes (a tokenizer.json, then optionally
// a NUL and a tokenizer_config.json) returns a tokenizer or a status; it never crashes, hangs
// or allocates without bound. A tokenizer it accepts keeps every tokenizer's promises
// (tokenizer_checks.h) on a probe text, and has a fingerprint.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tokenizer_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

// Text that reaches what differs between tokenizers: pre-tokenizer splits, digits,
// normalization, byte fallback, special tokens and whitespace runs.
constexpr std::string_view probe =
    "Once upon a time, 12345 caf\u00e9 cafe\u0301 \uFB01 \u65e5\u672c \U0001F600 <s><|im_start|>x</s>\n\t  end\xC3";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = input.find('\0');
  const std::string_view json = input.substr(0, nul);
  const std::string_view config = nul == std::string_view::npos ? std::string_view{} : input.substr(nul + 1);
  const auto tok = edge::backend::parse_hf_tokenizer(json, config);
  if (!tok.ok()) return 0;
  edge::fuzz::check_encoding(**tok, probe, {.add_bos = true, .parse_special = true});
  edge::fuzz::check_encoding(**tok, probe, {.add_bos = false, .parse_special = false});
  edge::fuzz::require(edge::backend::tokenizer_fingerprint(**tok).size() == 64);
  return 0;
}
