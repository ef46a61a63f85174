// Quantization fidelity (`edgeinfer eval`): how far a configuration (weight dtype × KV cache
// dtype) moves a model's predictions away from the f32 reference, teacher-forced over a text.
//
// The reference runs the model with f32 weights and an f32 KV cache; its next-token logits at
// every position of the text, and its greedy continuation of a prompt, are kept. Each
// configuration then runs over the same tokens and is scored against them:
//   * top-1 agreement: the share of positions whose most likely next token (ties to the lower
//     id, as greedy sampling breaks them) is the reference's;
//   * mean KL divergence KL(reference ‖ configuration) of the next-token distributions, in
//     nats, computed in double;
//   * perplexity of the text itself under the configuration;
//   * greedy-continuation match: how many leading tokens of the configuration's greedy
//     continuation of the prompt equal the reference's.
//
// A text longer than the model's context is scored in windows of `window` tokens; consecutive
// windows share one token so that every token after the first is predicted exactly once (a
// window's first predictions see little context, as at the start of the text).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "edge/backend/model/model.h"
#include "edge/common/status.h"
#include "edge/kernels/dtype.h"

namespace edge {
class thread_pool;
}

namespace edge::backend {

// One column of the report: how the weights are held and what the KV cache stores.
struct eval_configuration {
  // "f32": the weights as the checkpoint stores them (f32, f16 or bf16, all widened to f32
  // exactly in the matmul, so this is the f32 reference); any other name is a weight dtype
  // that load_model quantizes to (eval_weight_dtypes()).
  std::string weights = "f32";
  kernels::dtype kv = kernels::dtype::f32;

  // "weights/kv", e.g. "f32/fp8", "int4/bf16".
  std::string name() const;
  bool is_reference() const { return weights == "f32" && kv == kernels::dtype::f32; }
  bool operator==(const eval_configuration&) const = default;
};

// The weight dtypes a configuration may name: "f32" (as stored), then "bf16", "f16", "fp8" and
// "int4", which load_model converts or quantizes the projections to (kernels::parse_weight_format
// reads each name).
std::span<const std::string_view> eval_weight_dtypes();

// Every weight dtype with bf16 and fp8 KV, and f32 weights with f16 KV; the reference first.
std::vector<eval_configuration> default_eval_configurations();

// "f32/fp8,int4/bf16" (weights/KV, KV as --kv-cache-dtype takes it, auto excluded). The
// reference is put first whether listed or not; duplicates are dropped.
result<std::vector<eval_configuration>> parse_eval_configurations(std::string_view list);

struct eval_options {
  std::int64_t window = 0;           // tokens per teacher-forced window; 0 (or more): the model's context
  std::int64_t chunk = 128;          // positions per forward pass
  std::int64_t greedy_tokens = 64;   // length of the greedy continuations compared
  thread_pool* pool = nullptr;       // compute threads besides the caller's; may be null
};

struct eval_metrics {
  eval_configuration config;
  std::int64_t predictions = 0;      // positions scored
  std::int64_t top1_matches = 0;
  double top1_agreement = 0.0;       // top1_matches / predictions
  double mean_kl = 0.0;              // nats
  double max_kl = 0.0;               // the worst position's, nats
  double perplexity = 0.0;           // exp(mean negative log-likelihood of the text's tokens)
  std::int64_t greedy_match = 0;     // leading tokens equal to the reference's continuation
  std::vector<token_id> continuation;
  std::string continuation_text;
};

// The reference's outputs, against which configurations are compared. Holds every position's
// logits: predictions × vocab floats (about 0.5 KiB × vocab per token of text).
class eval_reference {
 public:
  // Runs `reference_model` (loaded as stored) with an f32 KV cache over `text` (at least two
  // tokens) and greedily continues `prompt` (not empty).
  static result<eval_reference> run(const model& reference_model, std::vector<token_id> text,
                                    std::vector<token_id> prompt, const eval_options& options);

  // Scores `m` (the same network, loaded with config.weights) with a config.kv cache; for the
  // reference configuration itself that is a second, identical run (agreement 1, KL 0).
  // invalid_argument when its vocabulary differs from the reference's.
  result<eval_metrics> compare(const model& m, const eval_configuration& config) const;

  // The reference scored against itself: agreement 1, KL 0, its own perplexity.
  const eval_metrics& self() const { return self_; }
  // The reference's most likely next token after each prefix of the text ([predictions]).
  std::span<const std::int32_t> predicted() const { return argmax_; }
  std::int64_t text_tokens() const { return static_cast<std::int64_t>(text_.size()); }
  std::int64_t window() const { return window_; }
  std::int64_t windows() const { return windows_; }

 private:
  eval_reference() = default;

  std::vector<token_id> text_;
  std::vector<token_id> prompt_;
  eval_options options_;
  std::int64_t window_ = 0;
  std::int64_t windows_ = 0;
  std::int64_t vocab_ = 0;
  std::vector<float> logits_;          // [predictions, vocab]
  std::vector<double> log_norm_;       // [predictions] log Σ exp(logits)
  std::vector<std::int32_t> argmax_;   // [predictions]
  eval_metrics self_;
};

// The text up to and including its first sentence end ('.', '!' or '?', or a line break),
// without surrounding white space; the whole text when it has none.
std::string first_sentence(std::string_view text);

// The report as a table: one row per metric, one column per configuration.
std::string format_eval_table(std::span<const eval_metrics> results);

}  // namespace edge::backend
