#include "edge/backend/engine/request_rules.h"

#include <limits>
#include <unordered_set>

#include "edge/backend/runtime/sampler.h"
#include "edge/common/format.h"

namespace edge::backend {

request_error token_outside_vocabulary(std::string_view what, std::size_t index, std::int64_t id,
                                       std::int64_t vocab_size) {
  std::string param = format("{}[{}]", what, index);
  std::string message = format("'{}' is token {}, outside the vocabulary of {} tokens", param, id, vocab_size);
  return {std::move(message), std::move(param)};
}

std::optional<request_error> prompt_does_not_fit(std::int64_t prompt_length, std::int64_t context,
                                                 std::string_view what) {
  if (prompt_length < context) return std::nullopt;
  return request_error{format("This model's maximum context length is {} tokens. However, your {} resulted in {} "
                              "tokens. Please reduce the length of the {}.",
                              context, what, prompt_length, what),
                       std::string(what)};
}

std::optional<request_error> completion_does_not_fit(std::int64_t prompt_length, std::int64_t max_tokens,
                                                     std::int64_t context, std::string_view what) {
  if (max_tokens <= context - prompt_length) return std::nullopt;
  // max_tokens may be as large as an int64: the sum is capped, not overflowed.
  const std::int64_t requested = max_tokens > std::numeric_limits<std::int64_t>::max() - prompt_length
                                     ? std::numeric_limits<std::int64_t>::max()
                                     : prompt_length + max_tokens;
  return request_error{format("This model's maximum context length is {} tokens. However, you requested {} tokens "
                              "({} in the {}, {} for the completion). Please reduce the length of the {} or the "
                              "completion.",
                              context, requested, prompt_length, what, max_tokens, what),
                       "max_tokens"};
}

std::optional<request_error> find_logit_bias_error(std::span<const kernels::logit_bias> bias, std::int64_t vocab_size) {
  const auto refused = [](std::string message) { return request_error{std::move(message), "logit_bias"}; };
  if (static_cast<std::int64_t>(bias.size()) > max_logit_bias_entries) {
    return refused(format("logit_bias has {} entries; at most {}", bias.size(), max_logit_bias_entries));
  }
  std::unordered_set<std::int32_t> seen;
  for (const kernels::logit_bias& b : bias) {
    if (b.id < 0 || b.id >= vocab_size) {
      return refused(format("logit_bias names token {}, outside the vocabulary of {} tokens", b.id, vocab_size));
    }
    if (!seen.insert(b.id).second) return refused(format("logit_bias names token {} twice", b.id));
    if (!(b.bias >= -max_logit_bias && b.bias <= max_logit_bias)) {
      return refused(format("logit_bias of token {} is {}; it must be from {} to {}", b.id, b.bias, -max_logit_bias,
                            max_logit_bias));
    }
  }
  return std::nullopt;
}

}  // namespace edge::backend
