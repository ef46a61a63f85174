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
//   agent         sessions of several turns, as a coding or tool-using agent sends them: each
//                 session opens with a system prompt and tool descriptions of its own
//                 (system_prompt_len words), and every turn resends the whole conversation so far
//                 (the earlier user messages with the answers the server really gave) plus a new
//                 user message of turn_len_min..turn_len_max words. A turn's request depends on
//                 the answers before it, so the requests are built as the run goes
//                 (agent_conversation); at(i) is the first turn of session i.
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
  std::vector<chat_message> messages;  // a JSONL file's "messages", or an agent's conversation
  std::int64_t expected_prompt_tokens = 0;  // the dataset's length (0 when unknown)
  std::int64_t max_tokens = 0;
  std::string session;  // sent as x-session-affinity when not empty (agent dataset)
  std::optional<std::int64_t> turn;  // agent dataset: the turn of its session, from 0
};

// The text a completions request sends for `spec`: its prompt, else its messages' contents
// joined by newlines (so that an agent's prompt of turn t is the start of its prompt of turn
// t + 1, byte for byte).
std::string completions_prompt(const request_spec& spec);

enum class dataset_kind { random, conversation, shared_prefix, jsonl, agent };

struct dataset_options {
  dataset_kind kind = dataset_kind::random;
  std::int64_t input_len = 128;   // shared-prefix: the words after the prefix
  std::int64_t output_len = 128;
  double range_ratio = 0.0;  // random, shared-prefix: spread of lengths around input_len/output_len
  std::int64_t shared_prefix_len = 256;  // shared-prefix: words of each shared prefix
  std::int64_t shared_prefixes = 1;      // shared-prefix: how many; request i starts with prefix i mod this
  std::filesystem::path jsonl_path;
  std::uint64_t seed = 0;
  // agent: the sessions of a point, the turns of each, the words of each session's system
  // prompt and tool descriptions, the words of each turn's new user message, and whether each
  // request names its session (x-session-affinity)
  std::int64_t sessions = 50;
  std::int64_t turns = 20;
  std::int64_t system_prompt_len = 1000;
  std::int64_t turn_len_min = 300;
  std::int64_t turn_len_max = 1500;
  bool session_affinity = true;
  // random, conversation, shared-prefix: the context the server serves the model with (0:
  // unknown), and the tokens its tokenizer makes of a prompt word (the synthetic prompts' words;
  // 1 when unknown). A request whose prompt and output would not fit is cut to fit (its prompt
  // first, its output to half the context at most), and the run says how many were.
  std::int64_t context = 0;
  double tokens_per_word = 1.0;
};

// `count` words of the synthetic prompts' vocabulary, always the same: what a server's
// tokenizer is asked to count to learn tokens_per_word.
std::string word_sample(std::int64_t count);

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
  // How many of requests first .. first + count - 1 were cut to fit options().context.
  std::size_t cut_to_context(std::size_t first, std::size_t count) const;
  // The index of point `point`'s first request in a sweep whose earlier points sent
  // `sent_before` measured requests: a generated dataset gives each point its own range, so that
  // a point's prompts depend only on (seed, point); a file continues where the previous point
  // stopped (cycling at its end, where prompts come round again).
  std::size_t point_start(std::size_t point, std::size_t sent_before) const;
  const dataset_options& options() const { return options_; }
  std::string describe() const;

  // agent: session `session`'s key, its opening system message (system prompt and tool
  // descriptions), and the user message of its turn `turn`; each depends only on (seed, session,
  // turn).
  std::string session_key(std::size_t session) const;
  std::string system_message(std::size_t session) const;
  std::string user_message(std::size_t session, std::int64_t turn) const;

 private:
  dataset_options options_;
  std::vector<request_spec> file_requests_;  // jsonl only
  std::vector<std::string> prefixes_;        // shared-prefix only: [shared_prefixes]
};

// One agent session's conversation as it grows: the request of its next turn is everything
// sent and answered so far plus the turn's new user message. Owned by whoever runs the session.
class agent_conversation {
 public:
  // Session `session` of `data` (an agent dataset, which must outlive this).
  agent_conversation(const dataset& data, std::size_t session);

  std::size_t session() const { return session_; }
  std::int64_t turn() const { return turn_; }  // the next turn to send
  bool finished() const { return turn_ >= data_->options().turns; }
  // The next turn's request: the system message, the earlier turns (user message, then the
  // answer), the new user message.
  request_spec next() const;
  // The answer to the request next() made: it joins the conversation, and the turn after comes next.
  void answered(std::string answer);

 private:
  const dataset* data_;
  std::size_t session_;
  std::int64_t turn_ = 0;
  std::vector<chat_message> history_;  // the system message, then a user message and its answer per turn done
  std::int64_t history_words_ = 0;     // words of the system and user messages in history_
  std::int64_t answer_tokens_ = 0;     // max_tokens of the answers in history_ (their length in tokens)
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
