// The requests of a benchmark run and when they arrive, both reproducible from a seed.
//
// Datasets:
//   random        input and output lengths uniform in [len * (1 - range), len * (1 + range)]
//   conversation  long-tailed lengths like chat logs (ShareGPT): log-normal around the given
//                 medians (sigma 1.0 for prompts, 0.8 for outputs), clipped to 16x the median
//   jsonl         one request per line: {"prompt": "..."} or {"messages": [...]}, optional
//                 "max_tokens" (else the output length option); lines are used in file order,
//                 cycling when more requests are asked for than the file holds
// Synthetic prompts are made of common English words drawn at random, one word per prompt
// token asked for. The client tokenizes nothing (it must work with any server's model): a
// word is one token in large vocabularies and one to three in small ones, so the server's
// `usage.prompt_tokens` is what the results report as input tokens when the server sends it.
//
// Request i depends only on (seed, i), so a run of N requests and the first N of a longer run
// hold the same prompts, whatever the concurrency.
#pragma once

#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "edge/common/status.h"

namespace edge::bench {

// SplitMix64: a small, fast generator whose output is the same on every platform (the
// standard distributions are not), so a seed means the same workload everywhere.
class rng {
 public:
  explicit rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next();
  double uniform();  // [0, 1)
  double normal();   // standard normal (Box-Muller)
  std::uint64_t below(std::uint64_t n);  // [0, n)

 private:
  std::uint64_t state_;
};

struct chat_message {
  std::string role;
  std::string content;
};

struct request_spec {
  std::string prompt;                 // the completions prompt; for chat, the user message
  std::vector<chat_message> messages;  // from a JSONL file's "messages" (chat endpoint only)
  std::int64_t expected_prompt_tokens = 0;  // the dataset's length (0 when unknown)
  std::int64_t max_tokens = 0;
};

enum class dataset_kind { random, conversation, jsonl };

struct dataset_options {
  dataset_kind kind = dataset_kind::random;
  std::int64_t input_len = 128;
  std::int64_t output_len = 128;
  double range_ratio = 0.0;  // random: spread of lengths around input_len/output_len
  std::filesystem::path jsonl_path;
  std::uint64_t seed = 0;
};

class dataset {
 public:
  // Checks the options; reads the JSONL file. Bad lines are errors naming the line.
  static result<dataset> create(const dataset_options& options);

  request_spec at(std::size_t index) const;
  const dataset_options& options() const { return options_; }
  std::string describe() const;

 private:
  dataset_options options_;
  std::vector<request_spec> file_requests_;  // jsonl only
};

// Open-loop arrivals: exponential gaps with mean 1/rate from the seed (a Poisson process).
// An infinite rate sends every request at time 0.
class poisson_arrivals {
 public:
  poisson_arrivals(double rate, std::uint64_t seed);
  double next();  // seconds from the start of the run; non-decreasing

 private:
  double rate_;
  rng random_;
  double now_ = 0;
};

constexpr double unlimited_rate = std::numeric_limits<double>::infinity();

std::vector<double> poisson_schedule(double rate, std::size_t count, std::uint64_t seed);

}  // namespace edge::bench
