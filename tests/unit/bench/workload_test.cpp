#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>

#include "edge/bench/client.h"
#include "edge/bench/workload.h"

namespace bench = edge::bench;

namespace {

std::size_t word_count(const std::string& text) {
  std::istringstream in(text);
  std::size_t n = 0;
  for (std::string w; in >> w;) ++n;
  return n;
}

std::filesystem::path write_temp(const std::string& name, const std::string& contents) {
  const auto path = std::filesystem::temp_directory_path() / name;
  std::ofstream(path) << contents;
  return path;
}

}  // namespace

TEST_CASE("Poisson arrivals are reproducible from the seed and have mean gap 1/rate") {
  const auto a = bench::poisson_schedule(4.0, 20000, 7);
  const auto b = bench::poisson_schedule(4.0, 20000, 7);
  const auto c = bench::poisson_schedule(4.0, 20000, 8);
  CHECK(a == b);
  CHECK(a != c);
  CHECK(a.front() == 0);
  CHECK(std::is_sorted(a.begin(), a.end()));
  std::vector<double> gaps(a.size() - 1);
  for (std::size_t i = 1; i < a.size(); ++i) gaps[i - 1] = a[i] - a[i - 1];
  const double mean = std::accumulate(gaps.begin(), gaps.end(), 0.0) / static_cast<double>(gaps.size());
  CHECK(mean == doctest::Approx(0.25).epsilon(0.03));
  // Exponential: the standard deviation equals the mean, and P(gap > mean) = 1/e.
  double squares = 0;
  for (double g : gaps) squares += (g - mean) * (g - mean);
  CHECK(std::sqrt(squares / static_cast<double>(gaps.size())) == doctest::Approx(0.25).epsilon(0.05));
  const auto above = std::count_if(gaps.begin(), gaps.end(), [&](double g) { return g > mean; });
  CHECK(static_cast<double>(above) / static_cast<double>(gaps.size()) == doctest::Approx(std::exp(-1.0)).epsilon(0.05));
}

TEST_CASE("an unlimited rate sends every request at once") {
  const auto t = bench::poisson_schedule(bench::unlimited_rate, 5, 1);
  CHECK(std::all_of(t.begin(), t.end(), [](double x) { return x == 0; }));
}

TEST_CASE("the random dataset is reproducible and keeps lengths within the range") {
  auto d = bench::dataset::create({.kind = bench::dataset_kind::random, .input_len = 100, .output_len = 40,
                                   .range_ratio = 0.5, .jsonl_path = {}, .seed = 3});
  REQUIRE(d.ok());
  auto again = bench::dataset::create(d->options());
  REQUIRE(again.ok());
  std::int64_t low = 1 << 30, high = 0;
  for (std::size_t i = 0; i < 500; ++i) {
    const bench::request_spec r = d->at(i);
    CHECK(r.prompt == again->at(i).prompt);
    CHECK(word_count(r.prompt) == static_cast<std::size_t>(r.expected_prompt_tokens));
    CHECK(r.expected_prompt_tokens >= 50);
    CHECK(r.expected_prompt_tokens <= 150);
    CHECK(r.max_tokens >= 20);
    CHECK(r.max_tokens <= 60);
    low = std::min(low, r.expected_prompt_tokens);
    high = std::max(high, r.expected_prompt_tokens);
  }
  CHECK(low < 60);   // the range is used, not just its middle
  CHECK(high > 140);
  CHECK(d->at(0).prompt != d->at(1).prompt);

  auto fixed = bench::dataset::create({.kind = bench::dataset_kind::random, .input_len = 32, .output_len = 8,
                                       .range_ratio = 0, .jsonl_path = {}, .seed = 3});
  REQUIRE(fixed.ok());
  CHECK(fixed->at(5).expected_prompt_tokens == 32);
  CHECK(fixed->at(5).max_tokens == 8);
  auto other_seed = bench::dataset::create({.kind = bench::dataset_kind::random, .input_len = 32, .output_len = 8,
                                            .range_ratio = 0, .jsonl_path = {}, .seed = 4});
  CHECK(other_seed->at(5).prompt != fixed->at(5).prompt);
}

TEST_CASE("the conversation dataset has a long tail around its medians") {
  auto d = bench::dataset::create({.kind = bench::dataset_kind::conversation, .input_len = 200, .output_len = 100,
                                   .range_ratio = 0, .jsonl_path = {}, .seed = 11});
  REQUIRE(d.ok());
  std::vector<double> inputs, outputs;
  for (std::size_t i = 0; i < 4000; ++i) {
    const auto r = d->at(i);
    inputs.push_back(static_cast<double>(r.expected_prompt_tokens));
    outputs.push_back(static_cast<double>(r.max_tokens));
  }
  std::sort(inputs.begin(), inputs.end());
  std::sort(outputs.begin(), outputs.end());
  const double median = inputs[inputs.size() / 2];
  CHECK(median == doctest::Approx(200).epsilon(0.1));
  CHECK(outputs[outputs.size() / 2] == doctest::Approx(100).epsilon(0.1));
  const double mean = std::accumulate(inputs.begin(), inputs.end(), 0.0) / static_cast<double>(inputs.size());
  CHECK(mean > 1.3 * median);           // right-skewed: the mean sits well above the median
  CHECK(inputs[inputs.size() * 99 / 100] > 5 * median);  // and the tail is long
  CHECK(inputs.back() <= 16 * 200);
  CHECK(inputs.front() >= 1);
}

TEST_CASE("JSONL prompts are read in order, cycled, and bad lines name their line") {
  const auto good = write_temp("edge_bench_prompts.jsonl",
                               "{\"prompt\": \"Once upon a time\"}\n\n"
                               "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 7}\n");
  auto d = bench::dataset::create({.kind = bench::dataset_kind::jsonl, .input_len = 1, .output_len = 32,
                                   .range_ratio = 0, .jsonl_path = good, .seed = 0});
  REQUIRE(d.ok());
  CHECK(d->at(0).prompt == "Once upon a time");
  CHECK(d->at(0).max_tokens == 32);
  CHECK(d->at(1).messages.size() == 1);
  CHECK(d->at(1).max_tokens == 7);
  CHECK(d->at(2).prompt == "Once upon a time");

  const auto bad = write_temp("edge_bench_bad.jsonl", "{\"prompt\": \"ok\"}\n{\"prompt\": 5}\n");
  auto failed = bench::dataset::create({.kind = bench::dataset_kind::jsonl, .input_len = 1, .output_len = 1,
                                        .range_ratio = 0, .jsonl_path = bad, .seed = 0});
  REQUIRE_FALSE(failed.ok());
  CHECK(failed.error().message().find("line 2") != std::string::npos);
  auto missing = bench::dataset::create({.kind = bench::dataset_kind::jsonl, .input_len = 1, .output_len = 1,
                                         .range_ratio = 0, .jsonl_path = "/nonexistent/x.jsonl", .seed = 0});
  CHECK_FALSE(missing.ok());
}

TEST_CASE("each point of a sweep starts at its own request, far from the others") {
  auto d = bench::dataset::create({.kind = bench::dataset_kind::random, .input_len = 24, .output_len = 8,
                                   .range_ratio = 0.2, .jsonl_path = {}, .seed = 5});
  REQUIRE(d.ok());
  CHECK(d->point_start(0, 0) == 0);
  // Generated datasets: the point's index alone decides, not what earlier points sent.
  CHECK(d->point_start(1, 17) == bench::point_stride);
  CHECK(d->point_start(1, 900) == bench::point_stride);
  CHECK(d->point_start(3, 0) == 3 * bench::point_stride);
  std::vector<std::string> prompts;
  for (std::size_t point = 0; point < 3; ++point) {
    for (std::size_t i = 0; i < 50; ++i) prompts.push_back(d->at(d->point_start(point, 0) + i).prompt);
  }
  std::sort(prompts.begin(), prompts.end());
  CHECK(std::adjacent_find(prompts.begin(), prompts.end()) == prompts.end());  // no prompt twice
  // The first point is what a single run sends: request i is at(i).
  CHECK(d->at(d->point_start(0, 0) + 7).prompt == d->at(7).prompt);

  // A file continues where the previous point stopped, and comes round at its end.
  const auto file = write_temp("edge_bench_points.jsonl", "{\"prompt\": \"a\"}\n{\"prompt\": \"b\"}\n{\"prompt\": \"c\"}\n");
  auto lines = bench::dataset::create({.kind = bench::dataset_kind::jsonl, .input_len = 1, .output_len = 4,
                                       .range_ratio = 0, .jsonl_path = file, .seed = 0});
  REQUIRE(lines.ok());
  CHECK(lines->point_start(0, 0) == 0);
  CHECK(lines->at(lines->point_start(1, 2)).prompt == "c");
  CHECK(lines->at(lines->point_start(2, 4)).prompt == "b");
}

TEST_CASE("the shared-prefix dataset starts every prompt with one of its shared prefixes") {
  const bench::dataset_options options{.kind = bench::dataset_kind::shared_prefix, .input_len = 10, .output_len = 6,
                                        .range_ratio = 0.5, .shared_prefix_len = 40, .shared_prefixes = 3,
                                        .jsonl_path = {}, .seed = 2};
  auto d = bench::dataset::create(options);
  REQUIRE(d.ok());
  const auto prefix_of = [](const std::string& prompt) {
    std::istringstream in(prompt);
    std::string out;
    std::string w;
    for (int i = 0; i < 40 && in >> w; ++i) out += w + ' ';
    return out;
  };
  std::set<std::string> prefixes, suffixes;
  for (std::size_t i = 0; i < 60; ++i) {
    const bench::request_spec r = d->at(i);
    CHECK(word_count(r.prompt) == static_cast<std::size_t>(r.expected_prompt_tokens));
    CHECK(r.expected_prompt_tokens >= 40 + 5);
    CHECK(r.expected_prompt_tokens <= 40 + 15);
    CHECK(r.max_tokens >= 3);
    CHECK(r.max_tokens <= 9);
    CHECK(prefix_of(r.prompt) == prefix_of(d->at(i + 3).prompt));  // request i uses prefix i mod 3
    prefixes.insert(prefix_of(r.prompt));
    suffixes.insert(r.prompt.substr(prefix_of(r.prompt).size()));
  }
  CHECK(prefixes.size() == 3);
  CHECK(suffixes.size() == 60);  // each request has its own question
  // The prefixes depend on the seed alone: the same in every point of a sweep, and again.
  auto again = bench::dataset::create(options);
  REQUIRE(again.ok());
  CHECK(prefix_of(again->at(d->point_start(2, 0)).prompt) == prefix_of(d->at(d->point_start(2, 0)).prompt));
  CHECK(d->describe() == "shared-prefix (3 prefixes of 40 words, then input 10, output 6, range 0.5)");

  CHECK_FALSE(bench::dataset::create({.kind = bench::dataset_kind::shared_prefix, .shared_prefix_len = 0}).ok());
  CHECK_FALSE(bench::dataset::create({.kind = bench::dataset_kind::shared_prefix, .shared_prefixes = 0}).ok());
  CHECK_FALSE(bench::dataset::create({.kind = bench::dataset_kind::shared_prefix,
                                      .shared_prefixes = bench::max_shared_prefixes + 1})
                  .ok());
}

namespace {

bench::dataset_options agent_options(std::uint64_t seed) {
  bench::dataset_options o;
  o.kind = bench::dataset_kind::agent;
  o.output_len = 12;
  o.seed = seed;
  o.sessions = 6;
  o.turns = 5;
  o.system_prompt_len = 80;
  o.turn_len_min = 30;
  o.turn_len_max = 150;
  return o;
}

// What a server might answer to turn `turn` of session `session`: text of its own per request.
std::string answer_of(std::size_t session, std::int64_t turn) {
  return "answer " + std::to_string(session) + "." + std::to_string(turn) + " with some words";
}

// Every turn of one session, each answered with answer_of.
std::vector<bench::request_spec> run_session(const bench::dataset& d, std::size_t session) {
  bench::agent_conversation conversation(d, session);
  std::vector<bench::request_spec> turns;
  while (!conversation.finished()) {
    turns.push_back(conversation.next());
    conversation.answered(answer_of(session, conversation.turn()));
  }
  return turns;
}

}  // namespace

TEST_CASE("agent sessions: each turn resends the conversation so far with the real answers and a new message") {
  auto d = bench::dataset::create(agent_options(7));
  REQUIRE(d.ok());
  CHECK(d->describe() == "agent (6 sessions x 5 turns, system prompt 80 words, turns of 30-150 words, output 12, "
                         "session affinity on)");
  std::set<std::string> systems, messages;
  std::int64_t shortest = 1 << 30, longest = 0;
  for (std::size_t session = 0; session < 6; ++session) {
    const std::vector<bench::request_spec> turns = run_session(*d, session);
    REQUIRE(turns.size() == 5);
    systems.insert(turns[0].messages[0].content);
    for (std::size_t t = 0; t < turns.size(); ++t) {
      const bench::request_spec& r = turns[t];
      CHECK(r.turn == static_cast<std::int64_t>(t));
      CHECK(r.session == d->session_key(session));
      CHECK(r.max_tokens == 12);
      // The system message, a user message and its answer per earlier turn, the new message.
      REQUIRE(r.messages.size() == 2 + 2 * t);
      CHECK(r.messages[0].role == "system");
      CHECK(word_count(r.messages[0].content) == 80);
      for (std::size_t k = 1; k < r.messages.size(); ++k) CHECK(r.messages[k].role == (k % 2 == 1 ? "user" : "assistant"));
      const std::string& fresh = r.messages.back().content;
      CHECK(fresh == d->user_message(session, static_cast<std::int64_t>(t)));
      const auto words = static_cast<std::int64_t>(word_count(fresh));
      CHECK(words >= 30);
      CHECK(words <= 150);
      shortest = std::min(shortest, words);
      longest = std::max(longest, words);
      messages.insert(fresh);
      if (t == 0) continue;
      // Turn t is turn t - 1's request, the answer it got, and a new user message: as messages
      // and, for the completions API, as text that starts with the previous prompt byte for byte.
      const bench::request_spec& before = turns[t - 1];
      std::vector<bench::chat_message> expected = before.messages;
      expected.push_back({"assistant", answer_of(session, static_cast<std::int64_t>(t - 1))});
      expected.push_back({"user", fresh});
      REQUIRE(r.messages.size() == expected.size());
      for (std::size_t k = 0; k < expected.size(); ++k) {
        CHECK(r.messages[k].role == expected[k].role);
        CHECK(r.messages[k].content == expected[k].content);
      }
      CHECK(bench::completions_prompt(r) == bench::completions_prompt(before) + "\n" +
                                                answer_of(session, static_cast<std::int64_t>(t - 1)) + "\n" + fresh);
      CHECK(r.expected_prompt_tokens > before.expected_prompt_tokens + words);
    }
  }
  CHECK(systems.size() == 6);        // each session has a system prompt of its own
  CHECK(messages.size() == 6 * 5);   // and every turn a message of its own
  CHECK(shortest < 50);              // the range of lengths is used, not only its middle
  CHECK(longest > 130);
  // The first turn of session i is what at(i) sends (warm-ups and sweeps draw sessions by index).
  CHECK(d->at(3).messages.size() == 2);
  CHECK(d->at(3).messages[1].content == d->user_message(3, 0));
  CHECK(d->at(3).session == d->session_key(3));
}

TEST_CASE("agent sessions are reproducible from the seed, and without affinity send no session key") {
  auto d = bench::dataset::create(agent_options(7));
  auto again = bench::dataset::create(agent_options(7));
  auto other = bench::dataset::create(agent_options(8));
  REQUIRE(d.ok());
  REQUIRE(again.ok());
  REQUIRE(other.ok());
  const auto a = run_session(*d, 4);
  const auto b = run_session(*again, 4);
  const auto c = run_session(*other, 4);
  for (std::size_t t = 0; t < a.size(); ++t) {
    CHECK(bench::completions_prompt(a[t]) == bench::completions_prompt(b[t]));
    CHECK(a[t].max_tokens == b[t].max_tokens);
    CHECK(a[t].messages.back().content != c[t].messages.back().content);
  }
  CHECK(d->session_key(4) == again->session_key(4));
  CHECK(d->session_key(4) != d->session_key(5));
  CHECK(d->session_key(4) != other->session_key(4));
  // Each point of a sweep runs sessions of its own.
  CHECK(d->at(d->point_start(1, 30)).messages[0].content != d->at(0).messages[0].content);

  bench::dataset_options plain = agent_options(7);
  plain.session_affinity = false;
  plain.range_ratio = 0.5;
  auto anonymous = bench::dataset::create(plain);
  REQUIRE(anonymous.ok());
  for (const bench::request_spec& r : run_session(*anonymous, 4)) {
    CHECK(r.session.empty());
    CHECK(r.max_tokens >= 6);
    CHECK(r.max_tokens <= 18);
  }
  CHECK(bench::completions_prompt(run_session(*anonymous, 4)[2]) == bench::completions_prompt(a[2]));
}

TEST_CASE("an agent's request bodies carry its conversation, for chat as messages and for completions as text") {
  bench::client_options options;
  options.model = "m";
  options.endpoint = bench::api_endpoint::chat_completions;
  auto d = bench::dataset::create(agent_options(1));
  REQUIRE(d.ok());
  bench::agent_conversation conversation(*d, 0);
  conversation.answered("first answer");
  const std::string chat = bench::request_body(options, conversation.next());
  CHECK(chat.find("{\"role\":\"assistant\",\"content\":\"first answer\"}") != std::string::npos);
  CHECK(chat.find("{\"role\":\"system\",\"content\":\"" + d->system_message(0) + "\"}") != std::string::npos);
  options.endpoint = bench::api_endpoint::completions;
  const std::string completions = bench::request_body(options, conversation.next());
  CHECK(completions.find("\"prompt\":\"" + d->system_message(0) + "\\n") != std::string::npos);
  CHECK(completions.find("\\nfirst answer\\n" + d->user_message(0, 1) + "\"") != std::string::npos);
}

TEST_CASE("bad dataset options are refused") {
  bench::dataset_options agent = agent_options(1);
  CHECK(bench::dataset::create(agent).ok());
  agent.turn_len_max = 29;
  CHECK(bench::dataset::create(agent).error().message() == "--turn-len-max (29) is below --turn-len-min (30)");
  agent = agent_options(1);
  agent.sessions = 0;
  CHECK_FALSE(bench::dataset::create(agent).ok());
  agent = agent_options(1);
  agent.turns = 0;
  CHECK_FALSE(bench::dataset::create(agent).ok());
  agent = agent_options(1);
  agent.system_prompt_len = 0;
  CHECK_FALSE(bench::dataset::create(agent).ok());
  agent = agent_options(1);
  agent.output_len = 0;
  CHECK_FALSE(bench::dataset::create(agent).ok());
  agent = agent_options(1);
  agent.input_len = 0;  // not an agent's option
  CHECK(bench::dataset::create(agent).ok());
  CHECK_FALSE(bench::dataset::create({.kind = bench::dataset_kind::random, .input_len = 0}).ok());
  CHECK_FALSE(bench::dataset::create({.kind = bench::dataset_kind::random, .range_ratio = 1.0}).ok());
}

TEST_CASE("SSE events are split across reads, with LF or CRLF, and comments are skipped") {
  bench::sse_parser parser;
  std::vector<std::string> events;
  const auto collect = [&](std::string_view data) { events.emplace_back(data); };
  parser.feed("data: {\"a\":1}\n\nda", collect);
  CHECK(events == std::vector<std::string>{"{\"a\":1}"});
  parser.feed("ta: {\"b\":2}\r\n\r\n: ping\n\ndata: [DONE]\n", collect);
  CHECK(events.size() == 2);
  parser.feed("\n", collect);
  CHECK(events == std::vector<std::string>{"{\"a\":1}", "{\"b\":2}", "[DONE]"});
  parser.feed("data:x\ndata: y\n\n", collect);
  CHECK(events.back() == "x\ny");
}

TEST_CASE("base URLs and request bodies follow OpenAI's API") {
  auto url = bench::parse_base_url("http://127.0.0.1:8080/v1/");
  REQUIRE(url.ok());
  CHECK(url->host == "127.0.0.1");
  CHECK(url->port == "8080");
  CHECK(bench::request_path(*url, bench::api_endpoint::completions) == "/v1/completions");
  CHECK(bench::request_path(*url, bench::api_endpoint::chat_completions) == "/v1/chat/completions");
  auto prefixed = bench::parse_base_url("http://example.test/openai");
  REQUIRE(prefixed.ok());
  CHECK(prefixed->port == "80");
  CHECK(bench::request_path(*prefixed, bench::api_endpoint::completions) == "/openai/v1/completions");
  CHECK(bench::parse_base_url("http://[::1]:9000")->host == "::1");
  CHECK(bench::parse_base_url("https://api.example.test").error().message().find("https") != std::string::npos);
  CHECK_FALSE(bench::parse_base_url("127.0.0.1:8080").ok());
  CHECK_FALSE(bench::parse_base_url("http://host:99999").ok());

  bench::client_options options;
  options.model = "m";
  bench::request_spec spec;
  spec.prompt = "hello";
  spec.max_tokens = 5;
  const std::string completions = bench::request_body(options, spec);
  CHECK(completions.find("\"prompt\":\"hello\"") != std::string::npos);
  CHECK(completions.find("\"stream_options\":{\"include_usage\":true}") != std::string::npos);
  CHECK(completions.find("\"max_tokens\":5") != std::string::npos);
  options.endpoint = bench::api_endpoint::chat_completions;
  const std::string chat = bench::request_body(options, spec);
  CHECK(chat.find("\"messages\":[{\"role\":\"user\",\"content\":\"hello\"}]") != std::string::npos);
}
