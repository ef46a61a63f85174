// The engine's sampling features on stories260K with the real CPU executor: the prompt's own
// log probabilities against a separate forward pass, n choices forked from one prefill (each
// the same as a request of its own seed), cancelling a request of several choices, logit_bias
// bans and forced tokens on the executor's and the host's sampling paths, and the submissions
// refused for fields out of range.
#include <doctest/doctest.h>

#include <cmath>
#include <set>

#include "engine_test_support.h"

namespace {

using namespace edge::backend;
using namespace edge::testing;
namespace kernels = edge::kernels;

const std::string story =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a "
    "big, red ball. She wanted to play with it, but it was too high. Lily asked her mom to help her. Her mom said, "
    "\"Of course, Lily!\" They went to the tree together and Lily's mom reached up high.";

engine_setup setup(scheduler_config sched, std::int64_t blocks = 256) {
  engine_setup s;
  s.num_blocks = blocks;
  s.options.scheduler = sched;
  return s;
}

// Each prompt token's log probability (and `top` alternatives) given those before it, one
// token per forward on an executor of the test's own: the decode path, not the prompt logits rows.
std::vector<sampled_logprobs> prompt_reference(const model& m, const std::vector<token_id>& prompt, std::int32_t top) {
  const std::int64_t blocks = static_cast<std::int64_t>(prompt.size()) / 16 + 1;
  auto cache = kv_cache::create(kv_cache_layout::for_tokens(m.config, kernels::dtype::f32, 16, blocks * 16));
  REQUIRE(cache.ok());
  auto exec = cpu_executor::create(m, **cache, nullptr, {.max_batch_tokens = 64, .max_sequences = 1});
  REQUIRE(exec.ok());
  std::vector<std::int32_t> table(static_cast<std::size_t>(blocks));
  for (std::size_t b = 0; b < table.size(); ++b) table[b] = static_cast<std::int32_t>(b);
  std::vector<float> logits(static_cast<std::size_t>((*exec)->vocab_size()));
  std::vector<sampled_logprobs> out;
  for (std::size_t p = 0; p + 1 < prompt.size(); ++p) {
    batch_plan plan;
    plan.entries.push_back({.tokens = std::span<const token_id>(prompt).subspan(p, 1),
                            .start_position = static_cast<std::int64_t>(p),
                            .block_table = table,
                            .compute_logits = true});
    REQUIRE((*exec)->forward(plan, logits).ok());
    out.push_back(logprobs_of(logits, prompt[p + 1], top));
  }
  return out;
}

// A request's events, kept whole.
struct recorded {
  std::vector<prompt_logprobs_event> prompts;
  std::vector<delta_event> deltas;
  std::vector<finished_event> ends;
};

event_sink recorder(recorded& into, event_log& log, const std::string& name) {
  return [&into, sink = log.sink(name)](engine_event e) mutable {
    if (const auto* p = std::get_if<prompt_logprobs_event>(&e)) into.prompts.push_back(*p);
    if (const auto* d = std::get_if<delta_event>(&e)) into.deltas.push_back(*d);
    if (const auto* f = std::get_if<finished_event>(&e)) into.ends.push_back(*f);
    sink(std::move(e));
  };
}

std::vector<token_id> tokens_of_choice(const recorded& r, std::int32_t index) {
  std::vector<token_id> out;
  for (const delta_event& d : r.deltas) {
    if (d.index == index) out.insert(out.end(), d.tokens.begin(), d.tokens.end());
  }
  return out;
}

void check_close(const sampled_logprobs& got, const sampled_logprobs& want) {
  CHECK(got.chosen.id == want.chosen.id);
  CHECK(got.chosen.logprob == doctest::Approx(want.chosen.logprob).epsilon(1e-4));
  REQUIRE(got.top.size() == want.top.size());
  for (std::size_t k = 0; k < got.top.size(); ++k) {
    CHECK(got.top[k].logprob == doctest::Approx(want.top[k].logprob).epsilon(1e-4));
  }
}

}  // namespace

TEST_CASE("prompt log probabilities equal a separate forward's at every position, cached prompt or not") {
  event_log log;
  engine_runtime rt(setup({.enable_prefix_caching = true}));
  const std::vector<token_id> prompt = rt.encode(story);
  // Longer than one step's prompt logits rows (64 with blocks of 16): several steps score it.
  REQUIRE(prompt.size() > static_cast<std::size_t>(rt.exec->max_prompt_logits_rows()) + 8);
  const auto reference = prompt_reference(*rt.m, prompt, 3);

  // First with the prompt's blocks already in the prefix cache: they are computed all the same.
  auto warm = rt.eng->submit(greedy_request(prompt, 1), log.sink("warm"));
  REQUIRE(warm.ok());
  REQUIRE(log.wait_finished("warm"));
  for (const std::int32_t n : {1, 3}) {
    CAPTURE(n);
    recorded got;
    const std::string name = "scored" + std::to_string(n);
    auto r = greedy_request(prompt, 4);
    r.prompt_logprobs = 3;
    r.n = n;
    auto h = rt.eng->submit(r, recorder(got, log, name));
    REQUIRE(h.ok());
    REQUIRE(log.wait_finished(name));
    REQUIRE(got.prompts.size() == 1);
    const auto& scores = got.prompts[0].logprobs;
    REQUIRE(scores.size() == prompt.size() - 1);
    for (std::size_t i = 0; i < scores.size(); ++i) {
      CAPTURE(i);
      check_close(scores[i], reference[i]);
    }
    // Before any delta, and the usage says nothing came from the cache.
    CHECK(got.deltas.size() == static_cast<std::size_t>(4 * n));
    REQUIRE(got.ends.size() == 1);
    CHECK(got.ends[0].usage.cached_tokens == 0);
    CHECK(got.ends[0].usage.completion_tokens == 4 * n);
  }
}

TEST_CASE("n choices: the prompt is computed once, and each choice is the request of its own seed") {
  event_log log;
  // No prefix cache: what is shared is shared by forking alone.
  engine_runtime rt(setup({.enable_prefix_caching = false}));
  std::vector<token_id> prompt = rt.encode(story);
  prompt.resize(37);  // the last prompt token sits mid-block: the forks copy that block
  constexpr std::int64_t max_tokens = 12;
  constexpr std::uint64_t seed = 7;

  recorded together;
  auto r = greedy_request(prompt, max_tokens);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = seed;
  r.n = 3;
  const auto before = rt.eng->stats();
  auto h = rt.eng->submit(r, recorder(together, log, "n3"));
  REQUIRE(h.ok());
  REQUIRE(log.wait_finished("n3"));
  REQUIRE(rt.eng->drain(std::chrono::minutes(1)));
  const auto after = rt.eng->stats();
  // 36 prompt tokens once, then per choice the last prompt token and 11 more.
  CHECK(after.computed_tokens - before.computed_tokens == 36 + 3 * max_tokens);
  CHECK(after.blocks_free == after.blocks_total);
  REQUIRE(together.ends.size() == 1);
  CHECK(together.ends[0].reason == finish_reason::length);
  CHECK(together.ends[0].usage.completion_tokens == 3 * max_tokens);
  CHECK(together.ends[0].usage.prompt_tokens == 37);
  CHECK(log.get("n3").admitted == 1);

  // Each choice, alone: seed choice_seed(7, i) (choice 0's is 7 itself).
  engine_runtime alone_rt(setup({.enable_prefix_caching = false}));
  std::set<std::vector<token_id>> distinct;
  for (std::int32_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    const auto mine = tokens_of_choice(together, i);
    REQUIRE(mine.size() == static_cast<std::size_t>(max_tokens));
    std::int32_t finishes = 0;
    for (const delta_event& d : together.deltas) {
      if (d.index != i || !d.finish) continue;
      ++finishes;
      CHECK(*d.finish == finish_reason::length);
    }
    CHECK(finishes == 1);
    auto single = greedy_request(prompt, max_tokens);
    single.sampling.temperature = 1.0f;
    single.sampling.seed = choice_seed(seed, i);
    const std::string name = "alone" + std::to_string(i);
    auto one = alone_rt.eng->submit(single, log.sink(name));
    REQUIRE(one.ok());
    REQUIRE(log.wait_finished(name));
    CHECK(log.get(name).tokens == mine);
    distinct.insert(mine);
  }
  CHECK(distinct.size() == 3);  // different seeds, different texts
  CHECK(choice_seed(seed, 0) == seed);

  // Greedy, every choice is the greedy text, and a choice that stops early ends alone.
  recorded greedy;
  auto g = greedy_request(prompt, max_tokens);
  g.n = 2;
  auto gh = alone_rt.eng->submit(g, recorder(greedy, log, "greedy"));
  REQUIRE(gh.ok());
  REQUIRE(log.wait_finished("greedy"));
  CHECK(tokens_of_choice(greedy, 0) == tokens_of_choice(greedy, 1));
}

TEST_CASE("n choices with stop strings: each choice stops on its own, the request ends once after the last") {
  event_log log;
  engine_runtime rt(setup({}));
  recorded got;
  auto r = greedy_request(rt.encode("Once upon a time"), 40);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 11;
  r.n = 4;
  r.stop = {"."};
  auto h = rt.eng->submit(r, recorder(got, log, "stops"));
  REQUIRE(h.ok());
  REQUIRE(log.wait_finished("stops"));
  REQUIRE(got.ends.size() == 1);
  std::int64_t tokens = 0;
  for (std::int32_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    std::string text;
    std::optional<finish_reason> reason;
    for (const delta_event& d : got.deltas) {
      if (d.index != i) continue;
      REQUIRE(!reason);  // nothing after a choice's last delta
      text += d.text;
      tokens += static_cast<std::int64_t>(d.tokens.size());
      reason = d.finish;
    }
    REQUIRE(reason);
    CHECK(text.find('.') == std::string::npos);
    if (*reason == finish_reason::length) CHECK(tokens_of_choice(got, i).size() == 40);
  }
  CHECK(got.ends[0].usage.completion_tokens == tokens);
}

TEST_CASE("cancelling a request of several choices ends every choice, once, and frees every block") {
  event_log log;
  gate hold;
  bool first = true;
  engine_runtime rt(setup({}));
  auto r = greedy_request(rt.encode(story), 100);
  r.n = 4;
  auto submitted = rt.eng->submit(r, log.sink("r", [&](const engine_event& e) {
    if (std::holds_alternative<delta_event>(e) && std::exchange(first, false)) hold.wait_open();
  }));
  REQUIRE(submitted.ok());
  request_handle handle = std::move(submitted).value();
  REQUIRE(hold.wait_reached());
  handle.cancel();
  hold.open();
  REQUIRE(log.wait_finished("r"));
  const auto got = log.get("r");
  CHECK(got.end->reason == finish_reason::abort);
  CHECK(got.finished == 1);
  // The first step after the fork samples every choice once.
  CHECK(got.end->usage.completion_tokens == 4);
  REQUIRE(rt.eng->drain(std::chrono::minutes(1)));
  const auto stats = rt.eng->stats();
  CHECK(stats.blocks_free == stats.blocks_total);
  CHECK(stats.in_flight == 0);
}

TEST_CASE("logit_bias: a banned token is never sampled and a +100 one always, on the executor and on the host") {
  event_log log;
  engine_runtime rt(setup({}));
  // Runs a request to its end (the handle lives until then: destroying it would cancel).
  const auto run = [&](const generate_request& r, const std::string& name) {
    auto h = rt.eng->submit(r, log.sink(name));
    REQUIRE(h.ok());
    REQUIRE(log.wait_finished(name));
    return *log.get(name).end;
  };
  const std::vector<token_id> prompt = rt.encode("Once upon a time");
  // The tokens the unbiased model likes best after the prompt, at a high temperature.
  std::set<token_id> liked;
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    auto r = greedy_request(prompt, 24);
    r.sampling.temperature = 1.5f;
    r.sampling.seed = seed;
    const std::string name = "free" + std::to_string(seed);
    REQUIRE(run(r, name).reason == finish_reason::length);
    const auto tokens = log.get(name).tokens;
    liked.insert(tokens.begin(), tokens.end());
  }
  REQUIRE(liked.size() > 10);
  std::vector<kernels::logit_bias> bans;
  for (const token_id id : liked) bans.push_back({.id = id, .bias = -100.0f});

  for (const bool host : {false, true}) {
    CAPTURE(host);
    for (std::uint64_t seed = 1; seed <= 8; ++seed) {
      auto r = greedy_request(prompt, 24);
      r.sampling.temperature = 1.5f;
      r.sampling.seed = seed;
      r.sampling.logit_bias = bans;
      // A penalty makes the row sampled on the host, from the copied logits.
      if (host) r.sampling.presence_penalty = 0.5f;
      const std::string name = std::string(host ? "host" : "exec") + "ban" + std::to_string(seed);
      REQUIRE(run(r, name).reason == finish_reason::length);
      for (const token_id t : log.get(name).tokens) CHECK(!liked.contains(t));
    }
    // +100 on a token the model would not pick: it is every token, greedy or drawn.
    const token_id forced = 300;
    REQUIRE(!liked.contains(forced));
    for (const float temperature : {0.0f, 1.0f, 2.0f}) {
      auto r = greedy_request(prompt, 10);
      r.sampling.temperature = temperature;
      r.sampling.seed = 3;
      r.sampling.logit_bias = {{.id = forced, .bias = 100.0f}};
      if (host) r.sampling.frequency_penalty = 0.1f;
      const std::string name = std::string(host ? "host" : "exec") + "force" + std::to_string(temperature);
      REQUIRE(run(r, name).reason == finish_reason::length);
      CHECK(log.get(name).tokens == std::vector<token_id>(10, forced));
    }
  }
}

TEST_CASE("submissions with n, logit_bias or prompt_logprobs out of range are refused") {
  event_log log;
  engine_runtime rt(setup({.max_num_seqs = 8}));
  const auto refused = [&](generate_request r) {
    auto h = rt.eng->submit(std::move(r), log.sink("x"));
    REQUIRE(!h.ok());
    return h.error();
  };
  const std::vector<token_id> prompt = {1, 403};
  for (const std::int32_t n : {0, -1, max_choices + 1, 9}) {  // 9: more than max_num_seqs
    CAPTURE(n);
    auto r = greedy_request(prompt, 4);
    r.n = n;
    CHECK(refused(r).code() == edge::status_code::invalid_argument);
  }
  const std::vector<std::vector<kernels::logit_bias>> bad_bias = {
      {{.id = 512, .bias = 1.0f}},                               // outside the vocabulary of 512
      {{.id = -1, .bias = 1.0f}},
      {{.id = 5, .bias = 100.5f}},
      {{.id = 5, .bias = std::nanf("")}},
      {{.id = 5, .bias = 1.0f}, {.id = 5, .bias = 2.0f}},       // twice
      std::vector<kernels::logit_bias>(301, {.id = 1, .bias = 0.0f})};
  for (const auto& bias : bad_bias) {
    auto r = greedy_request(prompt, 4);
    r.sampling.logit_bias = bias;
    CHECK(refused(r).code() == edge::status_code::invalid_argument);
  }
  auto p = greedy_request(prompt, 4);
  p.prompt_logprobs = 21;
  CHECK(refused(p).code() == edge::status_code::invalid_argument);
  CHECK(rt.eng->stats().in_flight == 0);
}
