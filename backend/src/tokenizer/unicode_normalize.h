// Unicode normalization (NFC, NFD, NFKC, NFKD) through ICU, for tokenizer.json normalizers.
#pragma once

#include <string>
#include <string_view>

namespace edge::backend::detail {

enum class normalization_form { nfc, nfd, nfkc, nfkd };

// Appends `text` in the given form. ASCII text is already in every form and is copied as is;
// so is text that is not valid UTF-8 (normalizing would have to replace its bytes).
void append_normalized(normalization_form form, std::string_view text, std::string& out);

}  // namespace edge::backend::detail
