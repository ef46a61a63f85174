// libFuzzer harness: encoding arbitrary text and decoding arbitrary ids with real tokenizers,
// loaded once at start:
//
//   $EDGE_FUZZ_TOKENIZERS/    the small tokenizers edge_fuzz_seeds writes (required):
//     byte_level.json         byte-level BPE in Llama 3's style (split regex, ByteLevel)
//     spm_style.json          SentencePiece-style BPE as Llama 2's tokenizer.json has it
//     spm.bin                 a llama2.c (SentencePiece) vocabulary with byte fallback
//   ${EDGE_TEST_MODELS:-<source>/../shared/models}/stories260K/
//     tok512.bin, stories260K.gguf   the stories260K vocabulary, when the fixtures are there
//
// The first input byte picks the tokenizer and the options; the rest is the text, or in ids
// mode little-endian 16-bit ids (some outside the vocabulary), decoded with or without special
// tokens as the byte says. Besides every tokenizer's promises (tokenizer_checks.h), each of
// these round-trips: decode(encode(text)) == text for valid UTF-8 when special tokens are not
// parsed. The SentencePiece ones spell a space as U+2581, so text holding that character is
// exempt for them.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace {

namespace be = edge::backend;
namespace fs = std::filesystem;

constexpr std::string_view spm_space = "\xE2\x96\x81";  // U+2581

struct loaded_tokenizer {
  std::string name;
  std::unique_ptr<be::tokenizer> tok;
  bool spells_space_as_u2581 = false;
};

std::vector<loaded_tokenizer>& tokenizers() {
  static std::vector<loaded_tokenizer> loaded;
  return loaded;
}

void load(const fs::path& path, bool spm) {
  auto tok = be::load_tokenizer(path);
  if (!tok.ok()) {
    std::fprintf(stderr, "cannot load the tokenizer %s: %s\n", path.c_str(), tok.error().to_string().c_str());
    std::exit(1);
  }
  tokenizers().push_back({path.string(), std::move(tok).value(), spm});
}

fs::path test_models_dir() {
  if (const char* env = std::getenv("EDGE_TEST_MODELS"); env && *env) return env;
  return fs::path(EDGE_SOURCE_DIR) / ".." / "shared" / "models";
}

// Input byte 0: which tokenizer, and how.
struct mode {
  std::size_t tokenizer;
  bool add_bos;
  bool parse_special;
  bool with_special;
  bool ids;
};

mode read_mode(std::uint8_t b) {
  return {static_cast<std::size_t>(b & 7u) % tokenizers().size(), (b & 8u) != 0, (b & 16u) != 0, (b & 32u) != 0,
          (b & 64u) != 0};
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* folder = std::getenv("EDGE_FUZZ_TOKENIZERS");
  if (!folder || !*folder) {
    std::fprintf(stderr, "set EDGE_FUZZ_TOKENIZERS to the tokenizers folder edge_fuzz_seeds writes\n");
    std::exit(1);
  }
  load(fs::path(folder) / "byte_level.json", false);
  load(fs::path(folder) / "spm_style.json", true);
  load(fs::path(folder) / "spm.bin", true);
  const fs::path stories = test_models_dir() / "stories260K";
  std::error_code ec;
  if (fs::is_regular_file(stories / "tok512.bin", ec)) load(stories / "tok512.bin", true);
  if (fs::is_regular_file(stories / "stories260K.gguf", ec)) load(stories / "stories260K.gguf", true);
  for (const auto& t : tokenizers()) std::fprintf(stderr, "tokenizer: %s (%lld tokens)\n", t.name.c_str(),
                                                   static_cast<long long>(t.tok->vocab_size()));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const mode m = read_mode(data[0]);
  const loaded_tokenizer& entry = tokenizers()[m.tokenizer];
  const be::tokenizer& tok = *entry.tok;
  if (m.ids) {
    // Ids from a little below 0 to a little past the vocabulary: decoding skips what is not a token.
    std::vector<be::token_id> ids;
    const auto span = static_cast<std::uint32_t>(tok.vocab_size() + 8);
    for (std::size_t i = 1; i + 1 < size; i += 2) {
      const std::uint32_t raw = data[i] | (static_cast<std::uint32_t>(data[i + 1]) << 8);
      ids.push_back(static_cast<be::token_id>(raw % span) - 4);
    }
    edge::fuzz::check_decoding(tok, ids, m.with_special);
    return 0;
  }
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const auto ids = edge::fuzz::check_encoding(tok, text, {.add_bos = m.add_bos, .parse_special = m.parse_special});
  const bool exempt = entry.spells_space_as_u2581 && text.find(spm_space) != std::string_view::npos;
  if (!m.parse_special && !exempt && edge::fuzz::is_utf8(text)) {
    edge::fuzz::require(tok.decode(ids) == text);
  }
  return 0;
}
