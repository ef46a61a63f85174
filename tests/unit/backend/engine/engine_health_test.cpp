// What the engine does when things go wrong on its thread, on stories260K with the real CPU
// executor: a bug that ends the engine loop (engine_options::before_step throws), a step that
// does not end (before_step blocks, time from an injected clock), and an executor step that
// fails; and the executor's own counters reaching the engine's observer.
#include <doctest/doctest.h>

#include <stdexcept>
#include <thread>

#include "engine_test_support.h"

namespace {

using namespace edge::backend;
using namespace edge::testing;
namespace kernels = edge::kernels;

engine_setup small_setup(scheduler_config sched) {
  engine_setup s;
  s.num_blocks = 64;
  s.options.scheduler = sched;
  return s;
}

// Polls `done` for up to a minute: for a state the engine thread reaches on its own, after the
// event a test can wait for.
bool eventually(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// The CPU executor, failing its next step when the test says so.
class failing_executor final : public executor {
 public:
  explicit failing_executor(executor& inner) : inner_(inner) {}

  edge::status forward(const batch_plan& plan, std::span<float> logits) override {
    if (fail_next.exchange(false)) return injected();
    return inner_.forward(plan, logits);
  }
  edge::status forward_sample(const batch_plan& plan, std::span<const row_sampling> rows,
                              std::span<std::int32_t> tokens, std::span<float> logits,
                              const edge::backend::mask_filler& fill_masks) override {
    if (fail_next.exchange(false)) return injected();
    return inner_.forward_sample(plan, rows, tokens, logits, fill_masks);
  }
  const kv_cache_layout& kv_layout() const override { return inner_.kv_layout(); }
  std::int64_t max_batch_tokens() const override { return inner_.max_batch_tokens(); }
  std::int64_t max_sequences() const override { return inner_.max_sequences(); }
  std::int64_t vocab_size() const override { return inner_.vocab_size(); }
  std::int64_t max_prompt_logits_rows() const override { return inner_.max_prompt_logits_rows(); }
  executor_counters counters() const override { return {.graph_capture_failures = capture_failures.load()}; }

  std::atomic<bool> fail_next{false};
  std::atomic<std::int64_t> capture_failures{0};  // what counters() reports

 private:
  static edge::status injected() { return edge::internal_error("injected executor failure"); }

  executor& inner_;
};

}  // namespace

TEST_CASE("a bug in the engine loop fails the engine for good: every request ends once with error, new ones are refused") {
  event_log log;
  gate admitted;  // holds the engine thread in A's admitted event
  gate failing;   // holds it in the hook, just before it throws
  std::atomic<bool> armed{false};
  auto setup = small_setup({.max_num_seqs = 1});
  setup.options.before_step = [&] {
    if (!armed.load()) return;
    failing.wait_open();
    throw std::runtime_error("injected bug");
  };
  engine_runtime rt(setup);

  // A runs; its first token arms the hook, so the step after it throws.
  auto a = rt.eng->submit(greedy_request(rt.encode("One day"), 1000), log.sink("a", [&](const engine_event& e) {
    if (std::holds_alternative<admitted_event>(e)) admitted.wait_open();
    if (std::holds_alternative<delta_event>(e)) armed = true;
  }));
  REQUIRE(a.ok());
  REQUIRE(admitted.wait_reached());
  // B reaches the scheduler before the failing step and waits there (one sequence at a time).
  auto b = rt.eng->submit(greedy_request(rt.encode("One day"), 4), log.sink("b"));
  REQUIRE(b.ok());
  admitted.open();
  REQUIRE(failing.wait_reached());
  // C is still in the engine's inbox when the loop fails.
  auto c = rt.eng->submit(greedy_request(rt.encode("One day"), 4), log.sink("c"));
  REQUIRE(c.ok());
  CHECK(rt.eng->health().state == engine_state::running);
  failing.open();

  REQUIRE(log.wait_all_finished(3));
  for (const std::string name : {"a", "b", "c"}) {
    CAPTURE(name);
    const auto r = log.get(name);
    CHECK(r.finished == 1);
    CHECK(r.end->reason == finish_reason::error);
    CHECK(r.end->error.find("injected bug") != std::string::npos);
  }
  CHECK(log.get("a").admitted == 1);
  CHECK(log.get("a").tokens.size() == 1);
  CHECK(log.get("b").admitted == 0);
  CHECK(log.get("c").admitted == 0);

  const engine_health health = rt.eng->health();
  CHECK(health.state == engine_state::failed);
  CHECK(health.failure == "injected bug");
  CHECK(to_string(health.state) == "failed");

  auto d = rt.eng->submit(greedy_request(rt.encode("One day"), 4), log.sink("d"));
  REQUIRE(!d.ok());
  CHECK(d.error().code() == edge::status_code::unavailable);
  CHECK(d.error().message().find("injected bug") != std::string::npos);
  CHECK(rt.eng->drain(std::chrono::minutes(1)));
  CHECK(rt.eng->stats().in_flight == 0);
  // Cancelling a request the failure ended, and destroying the engine, add no events.
  a->cancel();
  rt.eng.reset();
  for (const std::string name : {"a", "b", "c"}) CHECK(log.get(name).finished == 1);
  CHECK(log.get("d").finished == 0);
}

TEST_CASE("a step that does not end stalls the engine: health says so, and what is submitted meanwhile waits") {
  edge::manual_time_source clock;
  event_log log;
  gate hold;
  std::atomic<bool> first{true};
  auto setup = small_setup({});
  setup.options.clock = &clock;
  setup.options.stall_timeout = std::chrono::seconds(10);
  setup.options.before_step = [&] {
    if (first.exchange(false)) hold.wait_open();
  };
  engine_runtime rt(setup);
  CHECK(rt.eng->health().state == engine_state::running);  // waiting for work

  auto a = rt.eng->submit(greedy_request(rt.encode("One day"), 8), log.sink("a"));
  REQUIRE(a.ok());
  REQUIRE(hold.wait_reached());
  CHECK(rt.eng->health().busy_seconds == 0.0);
  clock.advance(std::chrono::seconds(10));
  CHECK(rt.eng->health().state == engine_state::running);  // at the limit, not past it
  CHECK(rt.eng->health().busy_seconds == 10.0);
  clock.advance(std::chrono::seconds(1));
  const engine_health stalled = rt.eng->health();
  CHECK(stalled.state == engine_state::stalled);
  CHECK(stalled.busy_seconds == 11.0);
  CHECK(stalled.failure.empty());

  // A slow step is not a stuck one: a request submitted now is queued, not refused.
  auto b = rt.eng->submit(greedy_request(rt.encode("One day"), 8), log.sink("b"));
  REQUIRE(b.ok());
  CHECK(log.get("b").finished == 0);

  // The step ends: both requests complete, and the engine runs again.
  hold.open();
  REQUIRE(log.wait_finished("a"));
  REQUIRE(log.wait_finished("b"));
  CHECK(log.get("a").end->reason == finish_reason::length);
  CHECK(log.get("b").end->reason == finish_reason::length);
  REQUIRE(eventually([&] { return rt.eng->health().state == engine_state::running; }));
  auto c = rt.eng->submit(greedy_request(rt.encode("One day"), 8), log.sink("c"));
  REQUIRE(c.ok());
  REQUIRE(log.wait_finished("c"));
  CHECK(log.get("c").end->reason == finish_reason::length);
}

TEST_CASE("a failed executor step ends that step's requests with error and the engine goes on") {
  event_log log;
  engine_runtime rt(small_setup({}));
  rt.eng.reset();
  failing_executor exec(*rt.exec);
  auto created = engine::create(*rt.m->tok, exec, *rt.blocks, rt.m->config.max_position, {});
  REQUIRE(created.ok());
  const std::unique_ptr<engine> eng = std::move(created).value();

  // A's first token makes the step after it fail.
  auto a = eng->submit(greedy_request(rt.encode("One day"), 100), log.sink("a", [&](const engine_event& e) {
    if (std::holds_alternative<delta_event>(e)) exec.fail_next = true;
  }));
  REQUIRE(a.ok());
  REQUIRE(log.wait_finished("a"));
  const auto ra = log.get("a");
  CHECK(ra.finished == 1);
  CHECK(ra.end->reason == finish_reason::error);
  CHECK(ra.end->error == "injected executor failure");
  CHECK(ra.tokens.size() == 1);
  CHECK(eng->health().state == engine_state::running);

  auto b = eng->submit(greedy_request(rt.encode("One day"), 8), log.sink("b"));
  REQUIRE(b.ok());
  REQUIRE(log.wait_finished("b"));
  CHECK(log.get("b").end->reason == finish_reason::length);
  CHECK(log.get("b").tokens.size() == 8);
  REQUIRE(eng->drain(std::chrono::minutes(1)));
  CHECK(eng->stats().blocks_free == eng->stats().blocks_total);
}

TEST_CASE("the executor's own counters reach the engine's observer as increments") {
  struct summing_observer final : engine_observer {
    void on_step(const engine_step_report& report) override { capture_failures += report.graph_capture_failures; }
    std::atomic<std::int64_t> capture_failures{0};
  } observer;
  event_log log;
  engine_runtime rt(small_setup({}));
  rt.eng.reset();
  failing_executor exec(*rt.exec);
  auto created = engine::create(*rt.m->tok, exec, *rt.blocks, rt.m->config.max_position, {.observer = &observer});
  REQUIRE(created.ok());
  const std::unique_ptr<engine> eng = std::move(created).value();
  // Two failed captures counted by the executor during A's run, one more during B's.
  auto a = eng->submit(greedy_request(rt.encode("One day"), 8), log.sink("a", [&](const engine_event& e) {
    if (std::holds_alternative<delta_event>(e) && exec.capture_failures.load() == 0) exec.capture_failures = 2;
  }));
  REQUIRE(a.ok());
  REQUIRE(log.wait_finished("a"));
  auto b = eng->submit(greedy_request(rt.encode("One day"), 8), log.sink("b", [&](const engine_event& e) {
    if (std::holds_alternative<delta_event>(e) && exec.capture_failures.load() == 2) exec.capture_failures = 3;
  }));
  REQUIRE(b.ok());
  REQUIRE(log.wait_finished("b"));
  REQUIRE(eng->drain(std::chrono::minutes(1)));
  CHECK(observer.capture_failures.load() == 3);
}
