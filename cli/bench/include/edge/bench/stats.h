// The statistics of `edgeinfer bench`, with the same definitions as vLLM's `bench serve`, so
// numbers from either tool can sit in one table.
//
// Per request (times in seconds from the moment the request was started, connection included):
//   TTFT  time to the first content delta
//   ITL   the gaps between successive content deltas (one list per request, pooled)
//   TPOT  (end-to-end latency - TTFT) / (output tokens - 1), for requests with > 1 output token
//   E2EL  end-to-end latency: until the stream ended (`data: [DONE]`)
// Output tokens are the server's `usage.completion_tokens` when it reports usage, else the
// number of non-empty content deltas the client received. A delta carries at most one token's
// text on most servers, but a token that prints nothing (BOS, EOS under ignore_eos, other
// special tokens) sends none, and the bytes of a character split across tokens come with the
// token that completes it: so the delta count can be lower than the tokens, never higher.
// Prompt tokens served from the server's prefix cache are its
// `usage.prompt_tokens_details.cached_tokens` (OpenAI's field), summed per point (and per turn
// for the agent dataset's sessions): their share of the prompt tokens is the cache's hit ratio.
// Per run: throughput is completed requests (or their tokens) divided by the benchmark's
// duration (first request sent to last response finished); goodput counts only requests that
// meet every SLO given.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "edge/common/status.h"

namespace edge::bench {

// The p-th percentile (0..100) of ascending `sorted` values, linearly interpolated between the
// closest ranks (numpy's default, which vLLM uses). 0 for no values.
double percentile(std::span<const double> sorted, double p);

struct distribution {
  std::size_t count = 0;
  double mean = 0;
  double std = 0;  // population standard deviation, as numpy's default
  double median = 0;
  double p90 = 0;
  double p99 = 0;
  double min = 0;
  double max = 0;
};

distribution summarize(std::vector<double> values);

// What the client saw of one request.
struct request_record {
  bool success = false;
  std::string error;         // failed: a category ("http_429", "http_503", "connection", "timeout", "stream_error", ...)
  std::string error_detail;  // failed: what the server or the socket said
  double start_s = 0;        // when it was started, from the start of the run
  double ttft_s = 0;
  double latency_s = 0;
  std::vector<double> itl_s;               // [content deltas - 1]
  std::int64_t content_deltas = 0;         // non-empty content deltas received
  std::int64_t expected_prompt_tokens = 0;  // the dataset's length for the prompt (0 when unknown)
  std::optional<std::int64_t> usage_prompt_tokens;
  std::optional<std::int64_t> usage_completion_tokens;
  std::optional<std::int64_t> usage_cached_tokens;  // usage.prompt_tokens_details.cached_tokens
  std::optional<std::int64_t> turn;  // agent dataset: the turn of its session, from 0
  std::string output_text;           // the answer's text, when the client was asked to keep it

  std::int64_t output_tokens() const { return usage_completion_tokens.value_or(content_deltas); }
  std::int64_t input_tokens() const { return usage_prompt_tokens.value_or(expected_prompt_tokens); }
  // 0 when the request produced at most one token (as vLLM).
  double tpot_s() const;
};

// Service-level objectives for goodput, in milliseconds; a request is "good" when it meets
// every one given.
struct slo {
  std::optional<double> ttft_ms;
  std::optional<double> tpot_ms;
  std::optional<double> itl_ms;  // every gap of the request
  std::optional<double> e2el_ms;
  bool empty() const { return !ttft_ms && !tpot_ms && !itl_ms && !e2el_ms; }
};

// "ttft:500 tpot:50" or "ttft:500,e2el:2000" (milliseconds; keys ttft, tpot, itl, e2el).
result<slo> parse_slo(std::string_view text);
std::string to_string(const slo& objectives);

bool meets(const request_record& r, const slo& objectives);

// How the client's counts compare with the server's usage.
struct token_check {
  std::int64_t requests_with_usage = 0;       // completed requests whose stream carried usage
  std::int64_t usage_completion_tokens = 0;   // over those requests
  std::int64_t client_completion_tokens = 0;  // content deltas over those requests
  std::int64_t mismatched_requests = 0;       // where the two differ
  std::int64_t more_deltas_requests = 0;      // of those, with more deltas than tokens (usage undercounts)
};

// How much of the prompts the server's prefix cache served, by its usage.
struct prompt_cache_use {
  std::int64_t requests_reporting = 0;  // completed requests whose usage gave prompt and cached tokens
  std::int64_t prompt_tokens = 0;       // usage.prompt_tokens over those requests
  std::int64_t cached_tokens = 0;       // usage.prompt_tokens_details.cached_tokens over those requests
  // cached / prompt tokens; none when no request reported them.
  std::optional<double> share() const;
};

// Above this share of cached prompt tokens a point measured a warm prefix cache, and the
// reports say so. Below it, what every request shares anyway (a chat template's opening
// tokens, filling a first cache block) and chance.
constexpr double warm_cache_share = 0.05;
bool warm_cache(const prompt_cache_use& cache);

// What the requests of one turn of an agent's sessions measured (the agent dataset).
struct turn_metrics {
  std::int64_t turn = 0;  // from 0
  std::int64_t completed = 0;
  prompt_cache_use cache;
  distribution ttft_ms;
};

struct run_metrics {
  std::int64_t completed = 0;
  std::int64_t failed = 0;
  std::map<std::string, std::int64_t> failures;  // category -> count
  double duration_s = 0;
  std::int64_t total_input_tokens = 0;
  std::int64_t total_output_tokens = 0;
  double request_throughput = 0;      // completed requests/s
  double output_throughput = 0;       // output tokens/s
  double total_token_throughput = 0;  // (input + output) tokens/s
  std::optional<double> goodput;      // good requests/s, when SLOs were given
  std::int64_t good_requests = 0;
  distribution ttft_ms;
  distribution tpot_ms;
  distribution itl_ms;
  distribution e2el_ms;
  token_check tokens;
  prompt_cache_use cache;
  std::vector<turn_metrics> by_turn;  // [turns], ascending; empty unless the requests were turns of sessions
};

run_metrics compute_metrics(std::span<const request_record> records, double duration_s, const slo& objectives);

}  // namespace edge::bench
