#include "edge/bench/workload.h"

#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <numbers>
#include <string_view>

#include "edge/common/format.h"

namespace edge::bench {
namespace {

namespace json = boost::json;

// Short, common words: one token each in the vocabularies of large models, and words a model
// trained on simple stories (stories260K) knows.
constexpr std::array<std::string_view, 64> words = {
    "the",  "a",    "and",   "to",   "was",  "he",   "she",  "it",   "of",   "in",   "is",   "they", "you",
    "that", "with", "for",   "on",   "her",  "his",  "day",  "one",  "said", "big",  "dog",  "cat",  "sun",
    "tree", "play", "happy", "park", "ball", "red",  "blue", "box",  "home", "mom",  "dad",  "friend", "little",
    "went", "saw",  "new",   "good", "time", "run",  "jump", "book", "bird", "fish", "sky",  "toy",  "cake",
    "girl", "boy",  "fun",   "nice", "sad",  "ran",  "up",   "down", "car",  "hat",  "bed",  "sea"};

// Lengths of the conversation dataset: log-normal around the median, long right tail.
constexpr double conversation_prompt_sigma = 1.0;
constexpr double conversation_output_sigma = 0.8;
constexpr double conversation_max_factor = 16.0;

// Separate the streams of shared prefixes, agents' system messages, their user messages and
// their answers' lengths from those of requests drawn with the same seed.
constexpr std::uint64_t prefix_stream = 0xA5C1E7B3D2F40968ull;
constexpr std::uint64_t system_stream = 0x3D4E8F1A2B6C9075ull;
constexpr std::uint64_t turn_stream = 0xC6A29E51F07B3D84ull;
constexpr std::uint64_t answer_stream = 0x58F3B0D7E19A6C42ull;

std::uint64_t mix(std::uint64_t seed, std::uint64_t index) {
  // Distinct streams per request: the index goes through one SplitMix64 round first.
  rng r(seed ^ (index * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull));
  return r.next();
}

std::int64_t uniform_length(rng& r, std::int64_t len, double range) {
  const auto low = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::floor(static_cast<double>(len) * (1 - range))));
  const auto high = std::max<std::int64_t>(low, static_cast<std::int64_t>(std::ceil(static_cast<double>(len) * (1 + range))));
  return low + static_cast<std::int64_t>(r.below(static_cast<std::uint64_t>(high - low + 1)));
}

std::int64_t lognormal_length(rng& r, std::int64_t median, double sigma) {
  const double value = static_cast<double>(median) * std::exp(sigma * r.normal());
  const double clipped = std::clamp(value, 1.0, static_cast<double>(median) * conversation_max_factor);
  return static_cast<std::int64_t>(std::llround(clipped));
}

std::int64_t words_in(std::string_view text) {
  std::int64_t n = 0;
  bool in_word = false;
  for (const char c : text) {
    const bool space = c == ' ' || c == '\n';
    if (!space && !in_word) ++n;
    in_word = !space;
  }
  return n;
}

std::string random_words(rng& r, std::int64_t count) {
  std::string text;
  text.reserve(static_cast<std::size_t>(count) * 5);
  for (std::int64_t i = 0; i < count; ++i) {
    if (i > 0) text += ' ';
    text += words[r.below(words.size())];
  }
  return text;
}

result<request_spec> parse_jsonl_line(std::string_view line, std::int64_t default_output) {
  boost::system::error_code ec;
  json::value v = json::parse(line, ec);
  if (ec) return invalid_argument(format("not valid JSON ({})", ec.message()));
  if (!v.is_object()) return invalid_argument("each line must be a JSON object");
  const json::object& o = v.as_object();
  request_spec spec;
  spec.max_tokens = default_output;
  if (const json::value* p = o.if_contains("prompt")) {
    if (!p->is_string()) return invalid_argument("\"prompt\" must be a string");
    spec.prompt = std::string(p->as_string());
  }
  if (const json::value* m = o.if_contains("messages")) {
    if (!m->is_array()) return invalid_argument("\"messages\" must be an array of {role, content}");
    for (const json::value& item : m->as_array()) {
      const json::object* message = item.if_object();
      const json::value* role = message ? message->if_contains("role") : nullptr;
      const json::value* content = message ? message->if_contains("content") : nullptr;
      if (!role || !content || !role->is_string() || !content->is_string()) {
        return invalid_argument("\"messages\" must be an array of {\"role\": string, \"content\": string}");
      }
      spec.messages.push_back({std::string(role->as_string()), std::string(content->as_string())});
    }
  }
  if (spec.prompt.empty() && spec.messages.empty()) {
    return invalid_argument("a line needs a non-empty \"prompt\" or \"messages\"");
  }
  for (const char* key : {"max_tokens", "output_len"}) {
    if (const json::value* n = o.if_contains(key)) {
      if (!n->is_int64() || n->as_int64() < 1) return invalid_argument(format("\"{}\" must be a positive integer", key));
      spec.max_tokens = n->as_int64();
    }
  }
  return spec;
}

}  // namespace

std::string completions_prompt(const request_spec& spec) {
  if (!spec.prompt.empty()) return spec.prompt;
  std::string prompt;
  for (const chat_message& m : spec.messages) {
    if (!prompt.empty()) prompt += '\n';
    prompt += m.content;
  }
  return prompt;
}

std::uint64_t rng::next() {
  std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double rng::uniform() {
  // The top 53 bits: every double in [0, 1) with spacing 2^-53.
  constexpr double scale = 1.0 / static_cast<double>(std::uint64_t{1} << 53);
  return static_cast<double>(next() >> 11) * scale;
}

double rng::normal() {
  const double u1 = 1.0 - uniform();  // (0, 1]: the logarithm stays finite
  const double u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

std::uint64_t rng::below(std::uint64_t n) {
  // Scaling a 53-bit uniform: exact enough for the sizes a workload uses (n far below 2^53).
  return std::min(n - 1, static_cast<std::uint64_t>(uniform() * static_cast<double>(n)));
}

result<dataset> dataset::create(const dataset_options& options) {
  dataset d;
  d.options_ = options;
  if (options.kind != dataset_kind::jsonl) {
    // An agent's prompt lengths are its own options; --input-len does not apply to it.
    if (options.kind != dataset_kind::agent && options.input_len < 1) {
      return invalid_argument("--input-len must be at least 1");
    }
    if (options.output_len < 1) return invalid_argument("--output-len must be at least 1");
    if (!(options.range_ratio >= 0 && options.range_ratio < 1)) {
      return invalid_argument("--range-ratio must be at least 0 and below 1");
    }
    if (options.kind == dataset_kind::agent) {
      if (options.sessions < 1) return invalid_argument("--sessions must be at least 1");
      if (options.turns < 1) return invalid_argument("--turns must be at least 1");
      if (options.system_prompt_len < 1) return invalid_argument("--system-prompt-len must be at least 1");
      if (options.turn_len_min < 1) return invalid_argument("--turn-len-min must be at least 1");
      if (options.turn_len_max < options.turn_len_min) {
        return invalid_argument(format("--turn-len-max ({}) is below --turn-len-min ({})", options.turn_len_max,
                                       options.turn_len_min));
      }
    }
    if (options.kind == dataset_kind::shared_prefix) {
      if (options.shared_prefix_len < 1) return invalid_argument("--shared-prefix-len must be at least 1");
      if (options.shared_prefixes < 1 || options.shared_prefixes > max_shared_prefixes) {
        return invalid_argument(format("--shared-prefixes must be from 1 to {}", max_shared_prefixes));
      }
      for (std::int64_t i = 0; i < options.shared_prefixes; ++i) {
        rng r(mix(options.seed ^ prefix_stream, static_cast<std::uint64_t>(i)));
        d.prefixes_.push_back(random_words(r, options.shared_prefix_len));
      }
    }
    return d;
  }
  std::ifstream in(options.jsonl_path);
  if (!in) return not_found(format("cannot read the prompts file {}", options.jsonl_path.string()));
  std::string line;
  std::size_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto spec = parse_jsonl_line(line, options.output_len);
    if (!spec.ok()) {
      return invalid_argument(format("{} line {}: {}", options.jsonl_path.string(), number, spec.error().message()));
    }
    d.file_requests_.push_back(std::move(spec).value());
  }
  if (d.file_requests_.empty()) return invalid_argument(format("{} holds no requests", options.jsonl_path.string()));
  return d;
}

namespace {

// A generated request's lengths: prompt words (after a shared prefix's) and output tokens, and
// whether they were cut to fit the context.
struct request_lengths {
  std::int64_t prompt = 0;
  std::int64_t output = 0;
  bool cut = false;
};

request_lengths lengths_of(const dataset_options& o, rng& r) {
  request_lengths out;
  if (o.kind == dataset_kind::conversation) {
    out.prompt = lognormal_length(r, o.input_len, conversation_prompt_sigma);
    out.output = lognormal_length(r, o.output_len, conversation_output_sigma);
  } else {
    out.prompt = uniform_length(r, o.input_len, o.range_ratio);
    out.output = uniform_length(r, o.output_len, o.range_ratio);
  }
  if (o.context <= 0) return out;
  // In tokens, with room for a BOS and a margin for words that take more tokens than the sample's.
  constexpr double margin = 1.15;
  constexpr std::int64_t special_tokens = 2;
  const double per_word = std::max(o.tokens_per_word, 1.0) * margin;
  const auto tokens_of = [per_word](std::int64_t count) { return static_cast<std::int64_t>(std::ceil(static_cast<double>(count) * per_word)); };
  const std::int64_t prefix = o.kind == dataset_kind::shared_prefix ? tokens_of(o.shared_prefix_len) : 0;
  if (prefix + tokens_of(out.prompt) + special_tokens + out.output <= o.context) return out;
  out.cut = true;
  out.output = std::max<std::int64_t>(1, std::min(out.output, o.context / 2));
  const std::int64_t room = o.context - prefix - special_tokens - out.output;
  out.prompt = std::max<std::int64_t>(1, std::min(out.prompt, static_cast<std::int64_t>(room / per_word)));
  return out;
}

}  // namespace

std::string word_sample(std::int64_t count) {
  rng r(0x5a3b1e);
  return random_words(r, count);
}

request_spec dataset::at(std::size_t index) const {
  if (options_.kind == dataset_kind::jsonl) return file_requests_[index % file_requests_.size()];
  if (options_.kind == dataset_kind::agent) return agent_conversation(*this, index).next();
  rng r(mix(options_.seed, index));
  const request_lengths lengths = lengths_of(options_, r);
  request_spec spec;
  spec.expected_prompt_tokens = lengths.prompt;
  spec.max_tokens = lengths.output;
  spec.prompt = random_words(r, spec.expected_prompt_tokens);
  if (options_.kind == dataset_kind::shared_prefix) {
    spec.prompt = prefixes_[index % prefixes_.size()] + ' ' + spec.prompt;
    spec.expected_prompt_tokens += options_.shared_prefix_len;
  }
  return spec;
}

std::size_t dataset::cut_to_context(std::size_t first, std::size_t count) const {
  if (options_.context <= 0 || options_.kind == dataset_kind::jsonl || options_.kind == dataset_kind::agent) return 0;
  std::size_t cut = 0;
  for (std::size_t i = first; i < first + count; ++i) {
    rng r(mix(options_.seed, i));
    cut += lengths_of(options_, r).cut ? 1 : 0;
  }
  return cut;
}

std::size_t dataset::point_start(std::size_t point, std::size_t sent_before) const {
  if (options_.kind == dataset_kind::jsonl) return sent_before % file_requests_.size();
  return point * point_stride;
}

std::string dataset::describe() const {
  switch (options_.kind) {
    case dataset_kind::random:
      return format("random (input {}, output {}, range {})", options_.input_len, options_.output_len,
                    options_.range_ratio);
    case dataset_kind::conversation:
      return format("conversation (median input {}, median output {})", options_.input_len, options_.output_len);
    case dataset_kind::shared_prefix:
      return format("shared-prefix ({} prefix{} of {} words, then input {}, output {}, range {})",
                    options_.shared_prefixes, options_.shared_prefixes == 1 ? "" : "es", options_.shared_prefix_len,
                    options_.input_len, options_.output_len, options_.range_ratio);
    case dataset_kind::jsonl:
      return format("jsonl ({}, {} requests)", options_.jsonl_path.filename().string(), file_requests_.size());
    case dataset_kind::agent:
      return format("agent ({} sessions x {} turns, system prompt {} words, turns of {}-{} words, output {}, "
                    "session affinity {})",
                    options_.sessions, options_.turns, options_.system_prompt_len, options_.turn_len_min,
                    options_.turn_len_max, options_.output_len, options_.session_affinity ? "on" : "off");
  }
  return "";
}

std::string dataset::session_key(std::size_t session) const {
  return format("agent-{}-{}", options_.seed, session);
}

std::string dataset::system_message(std::size_t session) const {
  rng r(mix(options_.seed ^ system_stream, session));
  return random_words(r, options_.system_prompt_len);
}

std::string dataset::user_message(std::size_t session, std::int64_t turn) const {
  rng r(mix(mix(options_.seed ^ turn_stream, session), static_cast<std::uint64_t>(turn)));
  const auto span = static_cast<std::uint64_t>(options_.turn_len_max - options_.turn_len_min + 1);
  return random_words(r, options_.turn_len_min + static_cast<std::int64_t>(r.below(span)));
}

agent_conversation::agent_conversation(const dataset& data, std::size_t session) : data_(&data), session_(session) {
  history_.push_back({"system", data.system_message(session)});
  history_words_ = data.options().system_prompt_len;
}

request_spec agent_conversation::next() const {
  const dataset_options& o = data_->options();
  request_spec spec;
  spec.messages = history_;
  spec.messages.push_back({"user", data_->user_message(session_, turn_)});
  rng r(mix(mix(o.seed ^ answer_stream, session_), static_cast<std::uint64_t>(turn_)));
  spec.max_tokens = uniform_length(r, o.output_len, o.range_ratio);
  spec.expected_prompt_tokens = history_words_ + answer_tokens_ + words_in(spec.messages.back().content);
  if (o.session_affinity) spec.session = data_->session_key(session_);
  spec.turn = turn_;
  return spec;
}

void agent_conversation::answered(std::string answer) {
  request_spec sent = next();
  history_words_ += words_in(sent.messages.back().content);
  answer_tokens_ += sent.max_tokens;
  history_.push_back(std::move(sent.messages.back()));
  history_.push_back({"assistant", std::move(answer)});
  ++turn_;
}

poisson_arrivals::poisson_arrivals(double rate, std::uint64_t seed) : rate_(rate), random_(seed) {}

double poisson_arrivals::next() {
  if (std::isinf(rate_)) return 0;
  const double at = now_;
  // Inverse transform of the exponential distribution; 1 - u is in (0, 1].
  now_ += -std::log(1.0 - random_.uniform()) / rate_;
  return at;
}

std::vector<double> poisson_schedule(double rate, std::size_t count, std::uint64_t seed) {
  poisson_arrivals arrivals(rate, seed);
  std::vector<double> out(count);
  for (double& t : out) t = arrivals.next();
  return out;
}

}  // namespace edge::bench
