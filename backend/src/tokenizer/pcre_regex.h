// A compiled PCRE2 pattern with Unicode classes (UTF + UCP), JIT-compiled where the platform
// supports it, for pre-tokenizer splitting. Immutable after compile(): find_all() may run on
// many threads at once (each thread keeps its own match scratch space).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "edge/common/status.h"

namespace edge::backend::detail {

class pcre_regex {
 public:
  // invalid_argument, with PCRE2's message and offset, for a pattern PCRE2 rejects.
  static result<pcre_regex> compile(std::string_view pattern);

  // Appends [begin, end) of every non-empty, non-overlapping match in `text`, left to right;
  // each search resumes where the previous match ended. Text that is not valid UTF-8 is
  // searched too: ill-formed bytes never match.
  void find_all(std::string_view text, std::vector<std::pair<std::size_t, std::size_t>>& matches) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct code_deleter {
    void operator()(void* code) const;
  };

  std::string pattern_;
  std::shared_ptr<void> code_;  // pcre2_code_8, shared by copies, freed with the last one
};

}  // namespace edge::backend::detail
