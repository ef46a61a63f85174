#include "pcre_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "edge/common/format.h"
#include "edge/common/utf8.h"

namespace edge::backend::detail {
namespace {

constexpr std::size_t jit_stack_start = 32 * 1024;
constexpr std::size_t jit_stack_max = 4 * 1024 * 1024;
constexpr std::uint32_t ovector_pairs = 32;

// Per-thread scratch: match data and a JIT stack larger than the default 32 KiB on the machine
// stack, so that long whitespace or letter runs never hit the JIT stack limit.
struct match_scratch {
  pcre2_match_data* data = pcre2_match_data_create(ovector_pairs, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(jit_stack_start, jit_stack_max, nullptr);

  match_scratch() {
    if (context && stack) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~match_scratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  match_scratch(const match_scratch&) = delete;
  match_scratch& operator=(const match_scratch&) = delete;
};

match_scratch& scratch() {
  thread_local match_scratch s;
  return s;
}

}  // namespace

void pcre_regex::code_deleter::operator()(void* code) const { pcre2_code_free(static_cast<pcre2_code*>(code)); }

result<pcre_regex> pcre_regex::compile(std::string_view pattern) {
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &error_offset, nullptr);
  if (!code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    return invalid_argument(format("cannot compile the regex \"{}\": {} at offset {}", pattern,
                                   reinterpret_cast<const char*>(message), error_offset));
  }
  pcre_regex regex;
  regex.pattern_ = std::string(pattern);
  regex.code_ = std::shared_ptr<void>(code, code_deleter{});
  // Without JIT (a platform or build that lacks it) pcre2_match interprets: slower, same result.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return regex;
}

void pcre_regex::find_all(std::string_view text, std::vector<std::pair<std::size_t, std::size_t>>& matches) const {
  auto* code = static_cast<const pcre2_code*>(code_.get());
  match_scratch& s = scratch();
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t start = 0;
  while (start < text.size()) {
    int rc = pcre2_match(code, subject, text.size(), start, 0, s.data, s.context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(code, subject, text.size(), start, PCRE2_NO_JIT, s.data, s.context);
    }
    // No match, or a resource limit on a pathological input: the rest stays unmatched text.
    if (rc < 0) return;
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(s.data);
    const std::size_t begin = ovector[0];
    const std::size_t end = ovector[1];
    if (end > begin) {
      matches.emplace_back(begin, end);
      start = end;
    } else {
      // An empty match: step over one character so the search moves on.
      const std::size_t length = utf8::valid_length(text, begin);
      start = begin + (length ? length : 1);
    }
  }
}

}  // namespace edge::backend::detail
