// The rules of a generate request that need the model (its vocabulary and context), written once
// with the public API's wording for every side that checks them: the OpenAI routes, before a
// grammar is compiled; the split protocol's backend route, which trusts no gateway; and the
// engine's check_submission, which trusts no route.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "kernels/sampling/sampling.h"

namespace edge::backend {

// A request the client must fix: a 400 whose `param` names the field ("" for the body as a
// whole, e.g. malformed JSON).
struct request_error {
  std::string message;
  std::string param;
  friend bool operator==(const request_error&, const request_error&) = default;
};

// The rules that need the model: the error, or nothing. `what` names the prompt's field
// ("messages", "prompt").
request_error token_outside_vocabulary(std::string_view what, std::size_t index, std::int64_t id,
                                       std::int64_t vocab_size);
template <class Id>
std::optional<request_error> find_token_outside_vocabulary(std::span<const Id> ids, std::int64_t vocab_size,
                                                           std::string_view what) {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || static_cast<std::int64_t>(ids[i]) >= vocab_size) {
      return token_outside_vocabulary(what, i, static_cast<std::int64_t>(ids[i]), vocab_size);
    }
  }
  return std::nullopt;
}
// The prompt must leave room for at least one token of completion (OpenAI's and vLLM's rule),
// and prompt + max_tokens must fit in the context (context_length_exceeded, both).
std::optional<request_error> prompt_does_not_fit(std::int64_t prompt_length, std::int64_t context,
                                                 std::string_view what);
std::optional<request_error> completion_does_not_fit(std::int64_t prompt_length, std::int64_t max_tokens,
                                                     std::int64_t context, std::string_view what);
// logit_bias's rules, as the error naming "logit_bias": at most max_logit_bias_entries distinct
// ids inside the vocabulary, each bias in [-max_logit_bias, max_logit_bias] (runtime/sampler.h).
std::optional<request_error> find_logit_bias_error(std::span<const kernels::logit_bias> bias, std::int64_t vocab_size);

}  // namespace edge::backend
