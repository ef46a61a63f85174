#include "unicode_normalize.h"

#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <cstdint>
#include <vector>

#include "edge/common/utf8.h"

namespace edge::backend::detail {
namespace {

const UNormalizer2* instance(normalization_form form) {
  UErrorCode status = U_ZERO_ERROR;
  const UNormalizer2* n = nullptr;
  switch (form) {
    case normalization_form::nfc: n = unorm2_getNFCInstance(&status); break;
    case normalization_form::nfd: n = unorm2_getNFDInstance(&status); break;
    case normalization_form::nfkc: n = unorm2_getNFKCInstance(&status); break;
    case normalization_form::nfkd: n = unorm2_getNFKDInstance(&status); break;
  }
  return U_SUCCESS(status) ? n : nullptr;
}

bool is_ascii(std::string_view text) {
  for (char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

}  // namespace

void append_normalized(normalization_form form, std::string_view text, std::string& out) {
  const UNormalizer2* normalizer = instance(form);
  if (!normalizer || is_ascii(text) || !utf8::is_valid(text) || text.size() > INT32_MAX / 2) {
    out.append(text);
    return;
  }
  UErrorCode status = U_ZERO_ERROR;
  int32_t utf16_length = 0;
  u_strFromUTF8(nullptr, 0, &utf16_length, text.data(), static_cast<int32_t>(text.size()), &status);
  if (status != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(status)) {
    out.append(text);
    return;
  }
  std::vector<UChar> source(static_cast<std::size_t>(utf16_length));
  status = U_ZERO_ERROR;
  u_strFromUTF8(source.data(), utf16_length, nullptr, text.data(), static_cast<int32_t>(text.size()), &status);
  if (U_FAILURE(status)) {
    out.append(text);
    return;
  }
  if (unorm2_isNormalized(normalizer, source.data(), utf16_length, &status) && U_SUCCESS(status)) {
    out.append(text);
    return;
  }
  // Decomposition can grow the text (NFKD of some characters up to 18 times); ask ICU for the
  // size when the first guess is short.
  status = U_ZERO_ERROR;
  std::vector<UChar> normalized(static_cast<std::size_t>(utf16_length) * 2 + 16);
  int32_t normalized_length = unorm2_normalize(normalizer, source.data(), utf16_length, normalized.data(),
                                               static_cast<int32_t>(normalized.size()), &status);
  if (status == U_BUFFER_OVERFLOW_ERROR) {
    normalized.resize(static_cast<std::size_t>(normalized_length));
    status = U_ZERO_ERROR;
    normalized_length = unorm2_normalize(normalizer, source.data(), utf16_length, normalized.data(),
                                         static_cast<int32_t>(normalized.size()), &status);
  }
  if (U_FAILURE(status)) {
    out.append(text);
    return;
  }
  int32_t utf8_length = 0;
  status = U_ZERO_ERROR;
  u_strToUTF8(nullptr, 0, &utf8_length, normalized.data(), normalized_length, &status);
  const std::size_t offset = out.size();
  out.resize(offset + static_cast<std::size_t>(utf8_length));
  status = U_ZERO_ERROR;
  u_strToUTF8(out.data() + offset, utf8_length, nullptr, normalized.data(), normalized_length, &status);
  if (U_FAILURE(status)) {
    out.resize(offset);
    out.append(text);
  }
}

}  // namespace edge::backend::detail
