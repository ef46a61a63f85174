// The requests of a benchmark run and when they arrive, both reproducible from a seed.
//
// Datasets:
//   random        input and output lengths uniform in [len * (1 - range), len * (1 + range)]
//   conversation  long-tailed lengths like chat logs (ShareGPT): log-normal around the given
//                 medians (sigma 1.0 for prompts, 0.8 for outputs), clipped to 16x the median
//   shared-prefix every prompt starts with one of a few shared prefixes (a common system
//                 prompt) of shared_prefix_len words, followed by a random part with the random
//                 dataset's lengths: a workload made to hit a server's prefix cache
//   jsonl         one request per line: {"prompt": "..."} or {"messages": [...]}, optional
//                 "max_tokens" (else the output length option); lines are used in file order,
//                 cycling when more requests are asked for than the file holds
// Synthetic prompts are made of common English words drawn at random, one word per prompt
// token asked for. The client tokenizes nothing (it must work with any server's model): a
// word is one token in large vocabularies and one to three in small ones, so the server's
// `usage.prompt_tokens` is what the results report as input tokens when the server sends it.
//
// Request i depends only on (seed, i), so a run of N requests and the first N of a longer run
// hold the same prompts, whatever the concurrency. A shared prefix depends only on (seed, its
// number). Each point of a sweep starts at its own index (point_start), so that no point sends
// the prompts of an earlier one, which a server's prefix cache would still hold.
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

enum class dataset_kind { random, conversation, shared_prefix, jsonl };

struct dataset_options {
  dataset_kind kind = dataset_kind::random;
  std::int64_t input_len = 128;   // shared-prefix: the words after the prefix
  std::int64_t output_len = 128;
  double range_ratio = 0.0;  // random, shared-prefix: spread of lengths around input_len/output_len
  std::int64_t shared_prefix_len = 256;  // shared-prefix: words of each shared prefix
  std::int64_t shared_prefixes = 1;      // shared-prefix: how many; request i starts with prefix i mod this
  std::filesystem::path jsonl_path;
  std::uint64_t seed = 0;
};

// Shared prefixes a dataset holds at most (each is made once, when the dataset is created).
constexpr std::int64_t max_shared_prefixes = 1 << 16;

// Where the generated datasets start each point of a sweep: far enough apart that no point
// runs into the next one's requests (a point sends at most 2^32).
constexpr std::size_t point_stride = std::size_t{1} << 40;

class dataset {
 public:
  // Checks the options; reads the JSONL file. Bad lines are errors naming the line.
  static result<dataset> create(const dataset_options& options);

  request_spec at(std::size_t index) const;
  // The index of point `point`'s first request in a sweep whose earlier points sent
  // `sent_before` measured requests: a generated dataset gives each point its own range, so that
  // a point's prompts depend only on (seed, point); a file continues where the previous point
  // stopped (cycling at its end, where prompts come round again).
  std::size_t point_start(std::size_t point, std::size_t sent_before) const;
  const dataset_options& options() const { return options_; }
  std::string describe() const;

 private:
  dataset_options options_;
  std::vector<request_spec> file_requests_;  // jsonl only
  std::vector<std::string> prefixes_;        // shared-prefix only: [shared_prefixes]
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
