// The serving engine end to end on stories260K with the real CPU executor: outputs that do not
// depend on how the scheduler served a request, cancellation, the queue limit, shutdown,
// timings from an injected clock, and KV admission for fp8 and bf16 caches.
#include <doctest/doctest.h>

#include <random>
#include <thread>

#include "edge/backend/model/synthetic.h"
#include "engine_test_support.h"

namespace {

using namespace edge::backend;
using namespace edge::testing;
namespace kernels = edge::kernels;

const std::vector<std::string> short_prompts = {
    "Once upon a time", "The little dog", "Tom and Sue went to the park", "She had a red ball",
    "One day", "The sun was hot and the sky was blue", "A big bird", "There was a cat named Kitty"};

const std::string long_prompt =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a "
    "big, red ball. She wanted to play with it, but it was too high. Lily asked her mom to help her.";

engine_setup setup_with(kernels::dtype kv, std::int64_t blocks, scheduler_config sched) {
  engine_setup s;
  s.kv_dtype = kv;
  s.num_blocks = blocks;
  s.options.scheduler = sched;
  return s;
}

// Runs each prompt alone on a roomy engine without prefix caching: the undisturbed reference.
std::vector<std::vector<token_id>> reference_tokens(kernels::dtype kv, const std::vector<std::string>& prompts,
                                                    std::int64_t max_tokens) {
  event_log log;
  engine_runtime rt(setup_with(kv, 512, {.enable_prefix_caching = false}));
  std::vector<std::vector<token_id>> out;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const std::string name = "ref" + std::to_string(i);
    auto h = rt.eng->submit(greedy_request(rt.encode(prompts[i]), max_tokens), log.sink(name));
    REQUIRE(h.ok());
    REQUIRE(log.wait_finished(name));
    const auto r = log.get(name);
    REQUIRE(r.end->reason == finish_reason::length);
    REQUIRE(r.tokens.size() == static_cast<std::size_t>(max_tokens));
    out.push_back(r.tokens);
  }
  return out;
}

}  // namespace

constexpr std::int64_t equal_max_tokens = 80;
constexpr kernels::dtype equal_kv_dtypes[] = {kernels::dtype::f32, kernels::dtype::fp8_e4m3};

TEST_CASE("a preempted and recomputed request gives the undisturbed greedy tokens") {
  for (const auto kv : equal_kv_dtypes) {
    CAPTURE(kernels::to_string(kv));
    const auto expected = reference_tokens(kv, short_prompts, equal_max_tokens);
    // 8 requests of up to 6 blocks each in 20 blocks: most are preempted at least once. No
    // prefix caching, so a preempted request really recomputes everything it had.
    event_log log;
    engine_runtime rt(setup_with(kv, 20, {.enable_prefix_caching = false, .watermark = 0.0}));
    std::vector<request_handle> handles;
    for (std::size_t i = 0; i < short_prompts.size(); ++i) {
      auto h = rt.eng->submit(greedy_request(rt.encode(short_prompts[i]), equal_max_tokens), log.sink(std::to_string(i)));
      REQUIRE(h.ok());
      handles.push_back(std::move(h).value());
    }
    REQUIRE(log.wait_all_finished(short_prompts.size()));
    std::int64_t preempted = 0;
    for (std::size_t i = 0; i < short_prompts.size(); ++i) {
      const auto r = log.get(std::to_string(i));
      CAPTURE(short_prompts[i]);
      CHECK(r.tokens == expected[i]);
      preempted += r.end->timings.preemptions;
    }
    CHECK(preempted > 0);
    CHECK(rt.eng->stats().preemptions == preempted);
  }
}

TEST_CASE("a chunk-prefilled request gives the undisturbed greedy tokens") {
  for (const auto kv : equal_kv_dtypes) {
    CAPTURE(kernels::to_string(kv));
    const std::vector<std::string> prompts = {long_prompt, long_prompt + " She was sad.", "A big bird"};
    const auto expected = reference_tokens(kv, prompts, equal_max_tokens);
    peak_observer peaks;
    event_log log;
    auto setup = setup_with(kv, 256, {.max_num_batched_tokens = 16, .enable_prefix_caching = false});
    setup.options.observer = &peaks;
    engine_runtime rt(setup);
    REQUIRE(rt.encode(long_prompt).size() > 40);
    std::vector<request_handle> handles;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      auto h = rt.eng->submit(greedy_request(rt.encode(prompts[i]), equal_max_tokens), log.sink(std::to_string(i)));
      REQUIRE(h.ok());
      handles.push_back(std::move(h).value());
    }
    REQUIRE(log.wait_all_finished(prompts.size()));
    for (std::size_t i = 0; i < prompts.size(); ++i) CHECK(log.get(std::to_string(i)).tokens == expected[i]);
    // Every step stayed within 16 tokens, so the 40+ token prompts went in chunks.
    CHECK(peaks.peak_batch_tokens() <= 16);
  }
}

TEST_CASE("a request served from the prefix cache gives the undisturbed greedy tokens") {
  for (const auto kv : equal_kv_dtypes) {
    CAPTURE(kernels::to_string(kv));
    const std::vector<std::string> prompts = {long_prompt, long_prompt, long_prompt + " She was sad."};
    const auto expected = reference_tokens(kv, prompts, equal_max_tokens);
    event_log log;
    engine_runtime rt(setup_with(kv, 256, {}));
    std::vector<std::int64_t> cached;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      const std::string name = std::to_string(i);
      auto h = rt.eng->submit(greedy_request(rt.encode(prompts[i]), equal_max_tokens), log.sink(name));
      REQUIRE(h.ok());
      REQUIRE(log.wait_finished(name));
      const auto r = log.get(name);
      CHECK(r.tokens == expected[i]);
      cached.push_back(r.end->usage.cached_tokens);
    }
    const auto prompt_length = static_cast<std::int64_t>(rt.encode(long_prompt).size());
    CHECK(cached[0] == 0);
    // Every full block but the one holding the last prompt token.
    CHECK(cached[1] == (prompt_length - 1) / 16 * 16);
    // The longer prompt starts with the first one: it finds at least its first full blocks.
    CHECK(cached[2] >= 32);
    CHECK(rt.eng->stats().prefix_cache_hits >= cached[1] + cached[2]);
  }
}

TEST_CASE("a request served from the host tier after its blocks left KV memory gives the undisturbed greedy tokens") {
  for (const auto kv : equal_kv_dtypes) {
    CAPTURE(kernels::to_string(kv));
    const auto expected = reference_tokens(kv, {long_prompt}, equal_max_tokens);
    event_log log;
    // 12 blocks of KV memory: the long prompt's blocks are evicted by the short prompts after
    // it, and kept in 64 host slots.
    auto setup = setup_with(kv, 12, {.watermark = 0.0});
    setup.options.host_tier_blocks = 64;
    engine_runtime rt(setup);
    const auto run = [&](const std::string& name, const std::string& text, const std::string& tenant) {
      auto request = greedy_request(rt.encode(text), equal_max_tokens);
      request.tenant = tenant;
      auto h = rt.eng->submit(std::move(request), log.sink(name));
      REQUIRE(h.ok());
      REQUIRE(log.wait_finished(name));
      return log.get(name);
    };
    CHECK(run("first", long_prompt, "t").tokens == expected[0]);
    for (std::size_t i = 0; i < short_prompts.size(); ++i) run("short" + std::to_string(i), short_prompts[i], "t");
    CHECK(rt.eng->stats().spilled_blocks > 0);
    CHECK(rt.eng->stats().host_tier_used_blocks > 0);

    const auto again = run("again", long_prompt, "t");
    CHECK(again.tokens == expected[0]);
    const auto prompt_length = static_cast<std::int64_t>(rt.encode(long_prompt).size());
    CHECK(again.end->usage.cached_tokens == (prompt_length - 1) / 16 * 16);
    CHECK(rt.eng->stats().host_tier_hits > 0);
    CHECK(rt.eng->stats().restored_blocks > 0);

    // Another tenant's identical prompt finds nothing in either tier, and is computed the same.
    const std::int64_t hits_before = rt.eng->stats().host_tier_hits;
    const auto other = run("other", long_prompt, "u");
    CHECK(other.end->usage.cached_tokens == 0);
    CHECK(other.tokens == expected[0]);
    CHECK(rt.eng->stats().host_tier_hits == hits_before);
  }
}

TEST_CASE("a cancelled request ends with abort and its blocks are free before another step runs") {
  event_log log;
  gate hold;
  bool first = true;
  engine_runtime rt(setup_with(kernels::dtype::f32, 256, {}));
  // The engine thread waits in the sink on the first token until the test has cancelled.
  auto submitted = rt.eng->submit(greedy_request(rt.encode(long_prompt), 1000),
                                  log.sink("r", [&](const engine_event& e) {
                                    if (std::holds_alternative<delta_event>(e) && std::exchange(first, false)) {
                                      hold.wait_open();
                                    }
                                  }));
  REQUIRE(submitted.ok());
  request_handle handle = std::move(submitted).value();
  REQUIRE(hold.wait_reached());
  handle.cancel();
  hold.open();
  REQUIRE(log.wait_finished("r"));
  const auto r = log.get("r");
  CHECK(r.end->reason == finish_reason::abort);
  CHECK(r.end->usage.completion_tokens == 1);
  CHECK(r.finished == 1);
  // The round that applied the cancellation ran no step: the first step is the only one.
  REQUIRE(rt.eng->drain(std::chrono::minutes(1)));
  const auto stats = rt.eng->stats();
  CHECK(stats.steps == 1);
  CHECK(stats.blocks_free == stats.blocks_total);
  CHECK(stats.in_flight == 0);
}

TEST_CASE("destroying the handle cancels the request") {
  event_log log;
  gate hold;
  bool first = true;
  engine_runtime rt(setup_with(kernels::dtype::f32, 256, {}));
  {
    auto submitted = rt.eng->submit(greedy_request(rt.encode(long_prompt), 1000),
                                    log.sink("r", [&](const engine_event& e) {
                                      if (std::holds_alternative<delta_event>(e) && std::exchange(first, false)) {
                                        hold.wait_open();
                                      }
                                    }));
    REQUIRE(submitted.ok());
    REQUIRE(hold.wait_reached());
  }  // the handle goes here
  hold.open();
  REQUIRE(log.wait_finished("r"));
  CHECK(log.get("r").end->reason == finish_reason::abort);
  REQUIRE(rt.eng->drain(std::chrono::minutes(1)));
  CHECK(rt.eng->stats().blocks_free == rt.eng->stats().blocks_total);
}

TEST_CASE("beyond max_queued_requests waiting requests, submit refuses with resource_exhausted") {
  auto setup = setup_with(kernels::dtype::f32, 64, {.max_num_seqs = 1});
  setup.options.max_queued_requests = 2;
  event_log log;
  gate hold;
  engine_runtime rt(setup);
  // Holds the engine thread once the first request is admitted, so nothing else is admitted.
  auto a = rt.eng->submit(greedy_request(rt.encode("One day"), 4), log.sink("a", [&](const engine_event& e) {
    if (std::holds_alternative<admitted_event>(e)) hold.wait_open();
  }));
  REQUIRE(a.ok());
  REQUIRE(hold.wait_reached());
  auto b = rt.eng->submit(greedy_request(rt.encode("One day"), 4), log.sink("b"));
  auto c = rt.eng->submit(greedy_request(rt.encode("One day"), 4), log.sink("c"));
  REQUIRE(b.ok());
  REQUIRE(c.ok());
  auto d = rt.eng->submit(greedy_request(rt.encode("One day"), 4), log.sink("d"));
  REQUIRE(!d.ok());
  CHECK(d.error().code() == edge::status_code::resource_exhausted);
  CHECK(d.error().message().find("overloaded") != std::string::npos);
  hold.open();
  REQUIRE(log.wait_all_finished(3));
  CHECK(log.get("d").finished == 0);  // a refused request gets no events
  // Once the queue has room again, requests are accepted.
  auto e = rt.eng->submit(greedy_request(rt.encode("One day"), 4), log.sink("e"));
  REQUIRE(e.ok());
  REQUIRE(log.wait_finished("e"));
  CHECK(log.get("e").end->reason == finish_reason::length);
}

TEST_CASE("requests that can never run are refused by submit with a clear error") {
  event_log log;
  engine_runtime rt(setup_with(kernels::dtype::f32, 8, {.block_size = 16}));
  const auto refused = [&](generate_request r) {
    auto h = rt.eng->submit(std::move(r), log.sink("x"));
    REQUIRE(!h.ok());
    return h.error();
  };
  CHECK(refused(greedy_request({}, 4)).code() == edge::status_code::invalid_argument);
  CHECK(refused(greedy_request({1, 600}, 4)).code() == edge::status_code::invalid_argument);  // vocab is 512
  auto lp = greedy_request({1, 403}, 4);
  lp.logprobs = 21;
  CHECK(refused(lp).code() == edge::status_code::invalid_argument);
  auto w = greedy_request({1, 403}, 4);
  w.weight = 0.0;
  CHECK(refused(w).code() == edge::status_code::invalid_argument);
  // The context is 2048 tokens.
  CHECK(refused(greedy_request(std::vector<token_id>(2048, 403), 1)).code() == edge::status_code::out_of_range);
  // 8 blocks of 16 hold 128 tokens.
  const auto too_long = refused(greedy_request(std::vector<token_id>(100, 403), 100));
  CHECK(too_long.code() == edge::status_code::out_of_range);
  CHECK(too_long.message().find("KV cache") != std::string::npos);
  CHECK(!rt.eng->submit(greedy_request({1, 403}, 4), nullptr).ok());
  CHECK(rt.eng->stats().in_flight == 0);
}

TEST_CASE("drain refuses new requests and waits for those in flight; destruction aborts what is left") {
  event_log log;
  {
    engine_runtime rt(setup_with(kernels::dtype::f32, 64, {}));  // `log` outlives it
    auto a = rt.eng->submit(greedy_request(rt.encode("One day"), 20), log.sink("a"));
    REQUIRE(a.ok());
    CHECK(rt.eng->drain(std::chrono::minutes(1)));
    CHECK(log.get("a").end->reason == finish_reason::length);
    const auto late = rt.eng->submit(greedy_request(rt.encode("One day"), 20), log.sink("late"));
    REQUIRE(!late.ok());
    CHECK(late.error().code() == edge::status_code::failed_precondition);
  }
  {
    gate hold;
    engine_runtime rt(setup_with(kernels::dtype::f32, 64, {.max_num_seqs = 1}));
    auto a = rt.eng->submit(greedy_request(rt.encode("One day"), 1000), log.sink("b", [&](const engine_event& e) {
      if (std::holds_alternative<admitted_event>(e)) hold.wait_open();
    }));
    REQUIRE(a.ok());
    auto c = rt.eng->submit(greedy_request(rt.encode("One day"), 1000), log.sink("c"));
    REQUIRE(c.ok());
    REQUIRE(hold.wait_reached());
    CHECK(!rt.eng->drain(std::chrono::milliseconds(1)));
    hold.open();
    rt.eng.reset();  // stops the engine thread with both requests unfinished
  }
  CHECK(log.get("b").finished == 1);
  CHECK(log.get("c").finished == 1);
  CHECK(log.get("b").end->reason == finish_reason::abort);
  CHECK(log.get("c").end->reason == finish_reason::abort);
  CHECK(log.get("c").admitted == 0);
}

TEST_CASE("queueing time and latencies come from the injected clock") {
  edge::manual_time_source clock;
  peak_observer observed;
  auto setup = setup_with(kernels::dtype::f32, 64, {.max_num_seqs = 1});
  setup.options.clock = &clock;
  setup.options.observer = &observed;
  event_log log;
  gate hold;
  engine_runtime rt(setup);
  auto a = rt.eng->submit(greedy_request(rt.encode("One day"), 3), log.sink("a", [&](const engine_event& e) {
    if (std::holds_alternative<admitted_event>(e)) hold.wait_open();
  }));
  REQUIRE(a.ok());
  REQUIRE(hold.wait_reached());
  // B arrives while A runs, and waits 5 s (of the test's clock) for A's slot.
  auto b = rt.eng->submit(greedy_request(rt.encode("One day"), 3), log.sink("b"));
  REQUIRE(b.ok());
  clock.advance(std::chrono::milliseconds(5000));
  hold.open();
  REQUIRE(log.wait_all_finished(2));
  const auto ta = log.get("a").end->timings;
  const auto tb = log.get("b").end->timings;
  CHECK(ta.queued_seconds == 0.0);
  CHECK(tb.queued_seconds == 5.0);
  CHECK(ta.time_to_first_token == 5.0);  // A's first token was produced after the clock moved
  CHECK(tb.time_to_first_token == 5.0);
  CHECK(tb.total_seconds == 5.0);
  const auto queued = observed.queue_times();
  REQUIRE(queued.size() == 2);
  CHECK(queued[0] == 0.0);
  CHECK(queued[1] == 5.0);
}

TEST_CASE("every request finishes exactly once under random submissions and cancellations") {
  // A small cache (preemptions), prefix caching, chunked prefill, and cancellations from the
  // test thread at random moments, racing the engine thread.
  event_log log;
  engine_runtime rt(setup_with(kernels::dtype::f32, 24, {.max_num_seqs = 8, .max_num_batched_tokens = 32}));
  std::mt19937_64 rng(5);
  std::vector<std::pair<std::string, request_handle>> live;
  constexpr int requests = 200;
  for (int i = 0; i < requests; ++i) {
    const auto& prompt = short_prompts[static_cast<std::size_t>(i) % short_prompts.size()];
    const std::string text = i % 3 == 0 ? long_prompt : prompt;
    auto r = greedy_request(rt.encode(text), std::uniform_int_distribution<std::int64_t>(1, 60)(rng));
    r.tenant = i % 2 ? "odd" : "even";
    r.priority = static_cast<std::int32_t>(i % 3);
    auto h = rt.eng->submit(std::move(r), log.sink(std::to_string(i)));
    REQUIRE(h.ok());
    live.emplace_back(std::to_string(i), std::move(h).value());
    if (std::bernoulli_distribution(0.3)(rng)) {
      const auto victim = std::uniform_int_distribution<std::size_t>(0, live.size() - 1)(rng);
      live[victim].second.cancel();
    }
    if (i % 20 == 0) std::this_thread::yield();
  }
  REQUIRE(log.wait_all_finished(requests));
  REQUIRE(rt.eng->drain(std::chrono::minutes(1)));
  int aborted = 0;
  for (int i = 0; i < requests; ++i) {
    const auto r = log.get(std::to_string(i));
    CAPTURE(i);
    CHECK(r.finished == 1);
    CHECK(r.admitted <= 1);
    CHECK(!r.delta_before_admitted);
    CHECK(r.end->usage.completion_tokens == static_cast<std::int64_t>(r.tokens.size()));
    if (r.end->reason == finish_reason::abort) ++aborted;
    else CHECK(r.end->reason == finish_reason::length);
  }
  CHECK(aborted > 0);
  const auto stats = rt.eng->stats();
  CHECK(stats.in_flight == 0);
  CHECK(stats.running == 0);
  CHECK(stats.waiting == 0);
  CHECK(stats.finished == requests);
  CHECK(stats.blocks_free == stats.blocks_total);
}

namespace {

// Reserve admission, 64 requests of at most 32 tokens each (2 blocks of 16), submitted while
// the engine is held so that all of them wait together: how many run at once.
struct admission_run {
  std::int64_t blocks = 0;
  std::int64_t peak_running = 0;
  int completed = 0;
};

admission_run run_64_streams(const std::filesystem::path& model, kernels::dtype kv, std::size_t budget) {
  peak_observer peaks;
  engine_setup setup;
  setup.model_path = model;
  setup.kv_dtype = kv;
  setup.budget_bytes = budget;
  setup.options.scheduler = {.max_num_seqs = 64, .max_num_batched_tokens = 2048, .admission = admission_policy::reserve,
                             .enable_prefix_caching = false, .watermark = 0.0};
  setup.options.observer = &peaks;
  event_log log;
  gate hold;
  engine_runtime rt(setup);
  std::vector<request_handle> handles;
  for (int i = 0; i < 64; ++i) {
    std::vector<token_id> prompt(16, 0);
    for (std::size_t k = 0; k < prompt.size(); ++k) prompt[k] = static_cast<token_id>(3 + (i * 16 + k) % 500);
    std::function<void(const engine_event&)> on_event;
    if (i == 0) {
      on_event = [&hold](const engine_event& e) {
        if (std::holds_alternative<admitted_event>(e)) hold.wait_open();
      };
    }
    auto h = rt.eng->submit(greedy_request(prompt, 16), log.sink(std::to_string(i), on_event));
    REQUIRE_MESSAGE(h.ok(), h.error().message());
    handles.push_back(std::move(h).value());
    if (i == 0) REQUIRE(hold.wait_reached());
  }
  hold.open();
  REQUIRE(log.wait_all_finished(64));
  admission_run out;
  out.blocks = rt.blocks->total_blocks();
  out.peak_running = peaks.peak_running();
  for (int i = 0; i < 64; ++i) out.completed += log.get(std::to_string(i)).end->reason == finish_reason::length ? 1 : 0;
  return out;
}

void check_fp8_admits_more(const std::filesystem::path& model, double expected_ratio) {
  auto loaded = load_model({.path = model});
  REQUIRE(loaded.ok());
  // Exactly 64 requests × 2 blocks of 16 tokens in fp8.
  const kv_cache_layout fp8 = kv_cache_layout::for_tokens((*loaded)->config, kernels::dtype::fp8_e4m3, 16, 64 * 32);
  const std::size_t budget = fp8.bytes_per_block() * static_cast<std::size_t>(fp8.num_blocks);
  const auto f = run_64_streams(model, kernels::dtype::fp8_e4m3, budget);
  const auto b = run_64_streams(model, kernels::dtype::bf16, budget);
  const double predicted = kv_cache_capacity_for((*loaded)->config, kernels::dtype::fp8_e4m3, 16, budget).ratio_to_bf16;
  MESSAGE(model.filename().string(), ": fp8 ", f.blocks, " blocks, ", f.peak_running, " at once; bf16 ", b.blocks,
          " blocks, ", b.peak_running, " at once; ratio ", static_cast<double>(f.peak_running) / b.peak_running,
          " (capacity arithmetic: ", predicted, ")");
  CHECK(f.blocks == 128);
  CHECK(f.completed == 64);
  CHECK(f.peak_running == 64);
  CHECK(b.completed == 64);
  CHECK(b.peak_running == b.blocks / 2);
  CHECK(b.peak_running < 64);
  CHECK(predicted == doctest::Approx(expected_ratio).epsilon(0.01));
  // Whole requests: the measured ratio is the predicted one up to one request's rounding.
  CHECK(static_cast<double>(f.peak_running) / static_cast<double>(b.peak_running) ==
        doctest::Approx(predicted).epsilon(1.0 / static_cast<double>(b.peak_running)));
}

}  // namespace

TEST_CASE("64 concurrent streams fit an fp8 budget; bf16 admits fewer at once, as capacity predicts") {
  SUBCASE("stories260K: 8-wide heads, fp8 holds 4/3 of bf16") {
    check_fp8_admits_more(stories260k_dir() / "stories260K.gguf", 4.0 / 3.0);
  }
  SUBCASE("synthetic 128-wide heads: fp8 holds 1.94x bf16") {
    temp_dir dir;
    synthetic_options options;
    options.preset = "tiny-hd128";
    options.format = synthetic_format::gguf;
    options.dtype = kernels::dtype::f32;
    options.seed = 1;
    options.out = dir / "tiny-hd128.gguf";
    auto written = write_synthetic_model(options);
    REQUIRE_MESSAGE(written.ok(), written.error().message());
    check_fp8_admits_more(*written, 2.0 * 128.0 / (128.0 + 4.0));
  }
}

TEST_CASE("engine::create checks the scheduler and the block pool against the executor's KV layout") {
  auto loaded = load_model({.path = stories260k_dir() / "stories260K.gguf"});
  REQUIRE(loaded.ok());
  const model& m = **loaded;
  auto cache = kv_cache::create(kv_cache_layout::for_tokens(m.config, kernels::dtype::f32, 16, 64 * 16));
  REQUIRE(cache.ok());
  auto exec = cpu_executor::create(m, **cache, nullptr, {.max_batch_tokens = 256, .max_sequences = 8});
  REQUIRE(exec.ok());
  const scheduler_config sched{.block_size = 16, .max_num_seqs = 8, .max_num_batched_tokens = 256};
  kv_block_pool right(64);
  CHECK(engine::create(*m.tok, **exec, right, m.config.max_position, {.scheduler = sched}).ok());

  scheduler_config other_block = sched;
  other_block.block_size = 8;
  const auto mismatched = engine::create(*m.tok, **exec, right, m.config.max_position, {.scheduler = other_block});
  REQUIRE(!mismatched.ok());
  CHECK(mismatched.error().code() == edge::status_code::invalid_argument);
  CHECK(mismatched.error().message().find("block size") != std::string::npos);

  kv_block_pool too_many(65);
  const auto overcommitted = engine::create(*m.tok, **exec, too_many, m.config.max_position, {.scheduler = sched});
  REQUIRE(!overcommitted.ok());
  CHECK(overcommitted.error().code() == edge::status_code::invalid_argument);
}

namespace {

// The greedy tokens of one request with penalties, by hand on an executor of its own (the
// engine's belongs to the engine thread): every step's logits on the host, penalised by the
// request's sampler and reduced to their argmax.
std::vector<token_id> penalised_reference(const model& m, const generate_request& r) {
  auto cache = kv_cache::create(kv_cache_layout::for_tokens(m.config, kernels::dtype::f32, 16, 8 * 16));
  REQUIRE(cache.ok());
  auto exec = cpu_executor::create(m, **cache, nullptr, {.max_batch_tokens = 256, .max_sequences = 1});
  REQUIRE(exec.ok());
  std::vector<std::int32_t> table = {0, 1, 2, 3, 4, 5, 6, 7};
  sequence_sampler sampler(r.sampling, r.prompt);
  std::vector<token_id> all = r.prompt;
  std::vector<token_id> out;
  std::vector<float> logits(static_cast<std::size_t>((*exec)->vocab_size()));
  std::int64_t computed = 0;
  while (static_cast<std::int64_t>(out.size()) < r.max_tokens) {
    batch_plan plan;
    plan.entries.push_back({.tokens = std::span<const token_id>(all).subspan(static_cast<std::size_t>(computed)),
                            .start_position = computed, .block_table = table, .compute_logits = true});
    REQUIRE((*exec)->forward(plan, logits).ok());
    computed = static_cast<std::int64_t>(all.size());
    sampler.apply_penalties(logits);
    const token_id next = kernels::argmax(logits);
    sampler.accept(next);
    all.push_back(next);
    out.push_back(next);
  }
  return out;
}

}  // namespace

TEST_CASE("penalties are applied on the host, log probabilities come from the raw logits, in one batch") {
  event_log log;
  engine_runtime rt(setup_with(kernels::dtype::f32, 256, {.enable_prefix_caching = false}));
  // Long enough for the greedy text to repeat a token (it does not within its first 24).
  constexpr std::int64_t tokens = 48;
  auto penalised = greedy_request(rt.encode("Once upon a time"), tokens);
  penalised.sampling.repetition_penalty = 1.8f;
  penalised.sampling.presence_penalty = 3.0f;
  const auto reference = penalised_reference(*rt.m, penalised);
  const auto plain = reference_tokens(kernels::dtype::f32, {"Once upon a time"}, tokens);
  REQUIRE(reference != plain[0]);  // the penalty changes the text, so the test sees whether it was applied

  // Penalised (host-sampled), logprobs (executor-sampled, logits copied) and plain rows together.
  auto with_logprobs = greedy_request(rt.encode("Once upon a time"), tokens);
  with_logprobs.logprobs = 3;
  std::vector<std::pair<std::string, request_handle>> live;
  const auto submit = [&](const std::string& name, generate_request r) {
    auto h = rt.eng->submit(std::move(r), log.sink(name));
    REQUIRE(h.ok());
    live.emplace_back(name, std::move(h).value());
  };
  std::vector<std::vector<sampled_logprobs>> seen;
  auto h = rt.eng->submit(with_logprobs, [&, sink = log.sink("logprobs")](engine_event e) mutable {
    if (const auto* d = std::get_if<delta_event>(&e)) seen.push_back(d->logprobs);
    sink(std::move(e));
  });
  REQUIRE(h.ok());
  submit("penalised", penalised);
  submit("plain", greedy_request(rt.encode("Once upon a time"), tokens));
  REQUIRE(log.wait_all_finished(3));
  CHECK(log.get("penalised").tokens == reference);
  CHECK(log.get("plain").tokens == plain[0]);
  const auto lp = log.get("logprobs");
  CHECK(lp.tokens == plain[0]);
  REQUIRE(seen.size() == static_cast<std::size_t>(tokens));
  for (std::size_t i = 0; i < seen.size(); ++i) {
    REQUIRE(seen[i].size() == 1);
    const sampled_logprobs& s = seen[i][0];
    CHECK(s.chosen.id == lp.tokens[i]);
    REQUIRE(s.top.size() == 3);
    CHECK(s.top[0].id == s.chosen.id);  // greedy: the most likely token
    CHECK(s.top[0].logprob == doctest::Approx(s.chosen.logprob));
    CHECK(s.top[0].logprob >= s.top[1].logprob);
    CHECK(s.top[1].logprob >= s.top[2].logprob);
    double mass = 0;
    for (const auto& t : s.top) mass += std::exp(static_cast<double>(t.logprob));
    CHECK(s.chosen.logprob <= 0.0f);
    CHECK(mass <= 1.0 + 1e-6);
  }
}
