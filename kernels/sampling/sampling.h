// Choosing the next token from a row of logits: the row's logit biases first, then greedy
// (argmax), or a draw after temperature, top-k, min-p and top-p. Randomness comes in as one
// uniform number per row, so the caller decides seeding (a request's seed and step give the
// same token for the same logits, whatever the batch; on a GPU the logits themselves may change
// with the batch: matmul.h).
#pragma once

#include <cstdint>
#include <span>

#include "edge/common/status.h"
#include "edge/kernels/stream.h"

namespace edge::kernels {

// One entry of a request's logit_bias (OpenAI's): added to the token's logit before anything
// else looks at the row. A bias of logit_ban or below bans the token outright: it is dropped from
// the row (as a NaN is), so that no rounding and no fallback can ever choose it.
struct logit_bias {
  std::int32_t id = 0;
  float bias = 0.0f;
};
inline constexpr float logit_ban = -100.0f;

struct sampling_row {
  float temperature = 1.0f;  // 0: greedy
  std::int32_t top_k = 0;    // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  float uniform = 0.0f;      // in [0, 1): where the draw lands in the kept distribution
  // The row of sampling_params::allowed this draw keeps to (constrained decoding: a grammar's
  // token mask); -1: any token. Tokens outside it are dropped first, as NaN logits are.
  std::int32_t allowed_row = -1;
  // The row's entries of sampling_params::biases: [bias_begin, bias_begin + bias_count).
  std::int32_t bias_begin = 0;
  std::int32_t bias_count = 0;
};

struct sampling_params {
  float* logits;                    // [rows, vocab]; overwritten (used as scratch)
  const sampling_row* config;       // [rows]
  std::int32_t* out;                // [rows] chosen token ids
  std::int64_t rows = 0;
  std::int64_t vocab = 0;
  // [Σ rows' bias_count] every row's biases, a row's ids distinct (null when no row has any).
  // Ids outside the vocabulary are skipped.
  const logit_bias* biases = nullptr;
  // [allowed rows, allowed_words(vocab)]: bit (t % 32) of word t / 32 set when token t may be
  // drawn; read by rows whose allowed_row is set (may be null when none is).
  const std::uint32_t* allowed = nullptr;
};

constexpr std::int64_t allowed_words(std::int64_t vocab) { return (vocab + 31) / 32; }

// The CPU reference of the mask: sets to NaN the logits of the tokens `allowed` ([words]) leaves
// out, so that every later step (argmax, softmax, the draw) passes them over.
void keep_allowed(float* logits, std::int64_t vocab, const std::uint32_t* allowed);

// Adds `biases` to a row of logits (bans become NaN): what run_sampling does first, for a row
// whose caller needs the biased values themselves.
void apply_logit_bias(float* row, std::int64_t vocab, const logit_bias* biases, std::int64_t count);

status run_sampling(const sampling_params& p, const stream& s);

// The index of the largest value; the lowest such index on ties. NaNs are never chosen.
std::int32_t argmax(std::span<const float> values);

}  // namespace edge::kernels
