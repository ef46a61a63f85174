#include "edge/backend/engine/submission.h"

#include "edge/backend/grammar/compiled_grammar.h"
#include "edge/backend/grammar/output_reach.h"
#include "edge/backend/runtime/sampler.h"
#include "edge/common/format.h"

namespace edge::backend {

std::optional<submit_error> check_submission(const generate_request& request, const submission_limits& limits) {
  if (!(request.weight > 0.0)) return submit_error(invalid_argument(format("tenant weight {} is not positive", request.weight)));
  if (request.logprobs && (*request.logprobs < 0 || *request.logprobs > max_top_logprobs)) {
    return submit_error(invalid_argument(format("logprobs must be between 0 and {}", max_top_logprobs)), "logprobs");
  }
  if (request.prompt_logprobs && (*request.prompt_logprobs < 0 || *request.prompt_logprobs > max_top_logprobs)) {
    return submit_error(invalid_argument(format("prompt_logprobs must be between 0 and {}", max_top_logprobs)),
                        "prompt_logprobs");
  }
  if (request.n < 1 || request.n > max_choices) {
    return submit_error(invalid_argument(format("n must be between 1 and {}", max_choices)), "n");
  }
  const auto refusal = [](const request_error& e) { return submit_error(invalid_argument(e.message), e.param); };
  if (auto e = find_token_outside_vocabulary(std::span(request.prompt), limits.vocab, "prompt")) return refusal(*e);
  if (auto e = find_logit_bias_error(request.sampling.logit_bias, limits.vocab)) return refusal(*e);
  const scheduler_config& config = limits.sched.config();
  if (config.max_model_len > 0) {
    if (auto e = prompt_does_not_fit(static_cast<std::int64_t>(request.prompt.size()), config.max_model_len, "prompt")) {
      return submit_error(out_of_range(e->message), e->param);
    }
  }
  if (request.prompt_logprobs && config.max_prompt_logits < config.block_size) {
    return submit_error(invalid_argument("this executor computes no prompt log probabilities"), "prompt_logprobs");
  }
  if (status fits = limits.sched.check_fits(static_cast<std::int64_t>(request.prompt.size()), request.max_tokens, request.n);
      !fits.ok()) {
    return submit_error(fits, "prompt");
  }
  if (!request.grammar) return std::nullopt;
  const bool other_tokenizer = limits.grammar_tokenizer != nullptr
                                   ? &request.grammar->vocabulary().source() != limits.grammar_tokenizer
                                   : request.grammar->vocabulary().size() != limits.vocab;
  if (other_tokenizer) {
    return submit_error(invalid_argument("the request's grammar was compiled for another tokenizer than the engine's"),
                        "grammar");
  }
  // Bans can close every way through a grammar (a JSON object without "{"): known now, that is
  // the client's 400, not an output cut short.
  std::vector<token_id> banned;
  for (const kernels::logit_bias& b : request.sampling.logit_bias) {
    if (b.bias <= kernels::logit_ban) banned.push_back(b.id);
  }
  if (!banned.empty() &&
      grammar::find_output(request.grammar, banned, request.stop_token_ids) == grammar::output_reach::impossible) {
    return submit_error(invalid_argument("logit_bias bans every token that could write the output the request's "
                                         "response format or tool choice requires"),
                        "logit_bias");
  }
  return std::nullopt;
}

std::vector<std::unique_ptr<sequence_decoder>> choice_decoders(const generate_request& request, const tokenizer& tok,
                                                               std::int64_t context) {
  std::vector<std::unique_ptr<sequence_decoder>> decoders;
  decoders.reserve(static_cast<std::size_t>(request.n));
  for (std::int32_t i = 0; i < request.n; ++i) {
    sampling_params sampling = request.sampling;
    if (sampling.seed) sampling.seed = choice_seed(*sampling.seed, i);
    decoders.push_back(std::make_unique<sequence_decoder>(
        tok, sampling, request.prompt,
        decode_limits{.max_tokens = request.max_tokens,
                      .context = context,
                      .ignore_eos = request.ignore_eos,
                      .stop_token_ids = request.stop_token_ids,
                      .stop = request.stop,
                      .grammar = request.grammar,
                      .skip_special_tokens = request.skip_special_tokens}));
  }
  return decoders;
}

}  // namespace edge::backend
