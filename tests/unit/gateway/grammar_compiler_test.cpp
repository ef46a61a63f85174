// The gateway's grammar compiler, with its first compile held at a gate the test opens (the
// compiler reads the vocabulary once, in its first compile, and the tokenizer below cannot be read
// until the gate opens), so that what is queued behind it, and in which order it runs, is the
// test's to arrange:
//   * requests that bring a text while it compiles wait for that one compile; a full queue
//     refuses a new text but still lets a request join a compile in flight;
//   * the queue is fair: each tenant's compiles take turns, a tenant's queue and the server's are
//     bounded apart, and a request that stops waiting before its compile began costs no compile;
//   * the cache and the compiles in flight are each tenant's own, bounded in bytes, and the tenant
//     holding the most gives room;
//   * compile time is charged to a per-tenant budget (compile_budget, on a manual clock).
#include <doctest/doctest.h>

#include <prometheus/registry.h>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <exception>
#include <latch>
#include <list>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backend/grammar/grammar_test_support.h"
#include "edge/common/format.h"
#include "edge/common/time_source.h"
#include "edge/gateway/openai/grammar_compiler.h"
#include "edge/monitoring/gateway_metrics.h"

namespace gw = edge::gateway;
namespace g = edge::backend::grammar;
namespace asio = boost::asio;
using namespace std::chrono_literals;

namespace {

// A tokenizer whose vocabulary cannot be read until `gate` opens. The compiler reads it once, in
// its first compile on its pool, so that compile (and every compile queued behind it) waits.
class gated_tokenizer final : public edge::backend::tokenizer {
 public:
  gated_tokenizer(const edge::backend::tokenizer& inner, std::latch& gate) : inner_(inner), gate_(gate) {}

  std::vector<edge::backend::token_id> encode(std::string_view text, const edge::backend::encode_options& o) const override {
    return inner_.encode(text, o);
  }
  void append_token_bytes(edge::backend::token_id id, bool after_bos, bool with_special, std::string& out) const override {
    inner_.append_token_bytes(id, after_bos, with_special, out);
  }
  std::int64_t vocab_size() const override {
    gate_.wait();
    return inner_.vocab_size();
  }
  std::optional<edge::backend::token_id> bos_id() const override { return inner_.bos_id(); }
  std::span<const edge::backend::token_id> eos_ids() const override { return inner_.eos_ids(); }
  bool is_special(edge::backend::token_id id) const override { return inner_.is_special(id); }
  bool is_added(edge::backend::token_id id) const override { return inner_.is_added(id); }
  std::optional<edge::backend::token_id> find_token(std::string_view text) const override { return inner_.find_token(text); }
  std::string token_text(edge::backend::token_id id) const override { return inner_.token_text(id); }

 private:
  const edge::backend::tokenizer& inner_;
  std::latch& gate_;
};

std::shared_ptr<const g::grammar> schema_grammar(std::string_view schema) {
  g::grammar_builder b;
  auto root = b.json_schema(schema);
  REQUIRE_MESSAGE(root.ok(), root.error().message());
  auto built = b.build(*root);
  REQUIRE_MESSAGE(built.ok(), built.error().message());
  return std::make_shared<const g::grammar>(std::move(built).value());
}

// Distinct schemas of one shape (so their compiled grammars are the same size): an object with
// the one integer property "f<i>" (i < 10).
std::shared_ptr<const g::grammar> field_schema(int i) {
  return schema_grammar(edge::format(R"({{"type":"object","properties":{{"f{}":{{"type":"integer"}}}},"required":["f{}"]}})", i, i));
}

std::uint64_t compiles(edge::monitoring::gateway_metrics& metrics) {
  return metrics.grammar_compile_seconds.Collect().histogram.sample_count;
}

double rejections(edge::monitoring::gateway_metrics& metrics, const std::string& tenant, const std::string& reason) {
  return metrics.grammar_compile_rejections.Add({{"tenant", tenant}, {"reason", reason}}).Value();
}

// Requests started on one io_context; `start` returns once each has either been answered or is
// waiting for a compile (the pool cannot finish one while the gate is shut). `done` lists the
// requests in the order their answers came.
struct requests {
  gw::grammar_compiler& compiler;
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  std::vector<std::optional<gw::grammar_compiler::answer>> answers;
  std::vector<std::size_t> done;
  std::list<asio::cancellation_signal> signals;  // stable addresses: the slots point into them
  std::size_t outstanding = 0;
  bool finishing = false;

  // The request's slot; with `cancellable`, its signal is cancel_signal(slot).
  std::size_t start(const std::string& tenant, const std::shared_ptr<const g::grammar>& grammar,
                    bool cancellable = false) {
    const std::size_t slot = answers.size();
    answers.emplace_back();
    ++outstanding;
    auto rethrow = [](std::exception_ptr failure) {
      if (failure) std::rethrow_exception(failure);
    };
    if (cancellable) {
      asio::co_spawn(io, request(this, slot, tenant, grammar),
                     asio::bind_cancellation_slot(signals.emplace_back().slot(), rethrow));
    } else {
      asio::co_spawn(io, request(this, slot, tenant, grammar), rethrow);
    }
    io.poll();
    return slot;
  }
  asio::cancellation_signal& last_signal() { return signals.back(); }
  // The answer is not default-constructible, so the coroutine stores it rather than return it.
  // Its arguments are its own copies (a lambda's captures would not outlive the call).
  static asio::awaitable<void> request(requests* self, std::size_t slot, std::string tenant,
                                       std::shared_ptr<const g::grammar> grammar) {
    self->answers[slot] = co_await self->compiler.compile(std::move(tenant), std::move(grammar));
    self->done.push_back(slot);
    // Kept running until finish(): an io_context that ran out of work stops, and a later poll
    // would not start the next request.
    if (--self->outstanding == 0 && self->finishing) self->work.reset();
  }
  void finish() {
    finishing = true;
    if (outstanding == 0) work.reset();
    io.run();
  }
  const gw::grammar_compiler::compiled& value(std::size_t slot) {
    REQUIRE(answers[slot].has_value());
    REQUIRE_MESSAGE(answers[slot]->ok(), answers[slot]->error().message());
    return answers[slot]->value();
  }
  gw::compile_failure::kind refusal(std::size_t slot) {
    REQUIRE(answers[slot].has_value());
    REQUIRE_FALSE(answers[slot]->ok());
    return answers[slot]->error().what();
  }
};

// A compiler over the gated byte tokenizer, with its metrics.
struct gated_compiler {
  std::unique_ptr<edge::backend::tokenizer> inner = edge::testing::byte_tokenizer();
  std::latch gate{1};
  gated_tokenizer tok{*inner, gate};
  prometheus::Registry registry;
  edge::monitoring::gateway_metrics metrics{registry};
  edge::manual_time_source clock;
  gw::grammar_compiler compiler;

  explicit gated_compiler(gw::grammar_compiler_options options) : compiler(tok, options, &metrics, clock) {}
  // Once the one worker has taken the first compile (and is held at the gate in it), `waiting`
  // are queued.
  void until_waiting(std::size_t waiting) const {
    while (compiler.compiles_waiting() != waiting) std::this_thread::yield();
  }
  // Opened before the compiler is destroyed, whatever the test did: its pool must finish.
  ~gated_compiler() {
    if (!gate.try_wait()) gate.count_down();
  }
};

constexpr std::string_view kPoint = R"({"type":"object","properties":{"x":{"type":"integer"},"y":{"type":"integer"}},"required":["x","y"]})";
constexpr std::string_view kName = R"({"type":"object","properties":{"name":{"type":"string"}},"required":["name"]})";
constexpr std::string_view kFlag = R"({"type":"object","properties":{"on":{"type":"boolean"}}})";

}  // namespace

TEST_CASE("grammar_compiler: requests for a text being compiled share its one compile") {
  gated_compiler c({.threads = 1});

  requests r{c.compiler};
  for (int i = 0; i < 8; ++i) r.start("a", schema_grammar(kPoint));  // equal texts, distinct objects
  for (const auto& a : r.answers) CHECK_FALSE(a.has_value());        // all wait: the compile is held
  CHECK(compiles(c.metrics) == 0);

  c.gate.count_down();
  r.finish();
  REQUIRE(r.answers.size() == 8);
  for (std::size_t i = 0; i < 8; ++i) CHECK(r.value(i).get() == r.value(0).get());  // one compiled grammar, shared
  CHECK(compiles(c.metrics) == 1);
  CHECK(c.metrics.grammar_cache_misses.Value() == 1);
  CHECK(c.metrics.grammar_cache_hits.Value() == 7);
  CHECK(c.compiler.cached() == 1);
  CHECK(c.compiler.cached_bytes() >= r.value(0)->stats().memory_bytes);
  CHECK(c.metrics.grammar_cache_bytes.Value() == static_cast<double>(c.compiler.cached_bytes()));

  // Now cached: answered at once, the same grammar, no compile.
  requests again{c.compiler};
  again.start("a", schema_grammar(kPoint));
  CHECK(again.value(0).get() == r.value(0).get());
  CHECK(compiles(c.metrics) == 1);
  CHECK(c.metrics.grammar_cache_hits.Value() == 8);
}

TEST_CASE("grammar_compiler: a full queue refuses a new text, not a request joining a compile in flight") {
  gated_compiler c({.threads = 1, .max_queued = 2});

  requests r{c.compiler};
  r.start("a", schema_grammar(kPoint));
  r.start("b", schema_grammar(kName));  // the queue is full: two compiles, one running and held
  r.start("c", schema_grammar(kFlag));  // a third text: refused at once
  r.start("b", schema_grammar(kName));  // joins the queued compile of the same text
  CHECK(r.refusal(2) == gw::compile_failure::kind::server_queue);
  CHECK(r.answers[2]->error().message().find("grammars are waiting to be compiled") != std::string::npos);
  CHECK(r.answers[2]->error().retry_after() > 0ms);
  CHECK_FALSE(r.answers[3].has_value());
  CHECK(rejections(c.metrics, "c", "server_queue") == 1);

  c.gate.count_down();
  r.finish();
  CHECK(r.value(1).get() == r.value(3).get());
  CHECK(r.value(0).get() != r.value(1).get());
  CHECK(compiles(c.metrics) == 2);
  CHECK(c.metrics.grammar_cache_misses.Value() == 2);
  CHECK(c.metrics.grammar_cache_hits.Value() == 1);

  // Once the queue has drained, the refused text compiles.
  requests later{c.compiler};
  later.start("c", schema_grammar(kFlag));
  later.finish();
  CHECK(later.value(0) != nullptr);
  CHECK(compiles(c.metrics) == 3);
}

TEST_CASE("grammar_compiler: tenants take turns, so one tenant's queue delays another by one compile") {
  gated_compiler c({.threads = 1, .max_queued_per_tenant = 16});

  requests r{c.compiler};
  std::vector<std::size_t> a;
  for (int i = 0; i < 6; ++i) a.push_back(r.start("a", field_schema(i)));  // the first runs, held; five wait
  const std::size_t b1 = r.start("b", field_schema(0));  // the same text as a's first: b's own compile
  const std::size_t b2 = r.start("b", field_schema(1));
  const std::size_t c1 = r.start("c", field_schema(2));
  c.until_waiting(8);
  CHECK(c.metrics.grammar_compiles_waiting.Value() == 8);

  c.gate.count_down();
  r.finish();
  // First in, first out would answer b and c after all of a's six.
  const std::vector<std::size_t> expected = {a[0], b1, c1, a[1], b2, a[2], a[3], a[4], a[5]};
  CHECK(r.done == expected);
  CHECK(compiles(c.metrics) == 9);
  CHECK(r.value(b1).get() != r.value(a[0]).get());  // neither shares the other's compile
  CHECK(c.metrics.grammar_compile_wait_seconds.Collect().histogram.sample_count == 9);
  CHECK(c.compiler.compiles_waiting() == 0);
}

TEST_CASE("grammar_compiler: a tenant's full queue refuses its new texts (429), not another tenant's") {
  gated_compiler c({.threads = 1, .max_queued = 64, .max_queued_per_tenant = 2});

  requests r{c.compiler};
  r.start("a", field_schema(0));                          // running, held
  r.start("a", field_schema(1));                          // waiting: a has two
  const std::size_t over = r.start("a", field_schema(2));  // refused at once
  const std::size_t join = r.start("a", field_schema(1));  // joins a's compile in flight
  const std::size_t other = r.start("b", field_schema(2));
  CHECK(r.refusal(over) == gw::compile_failure::kind::tenant_queue);
  CHECK(r.answers[over]->error().retry_after() > 0ms);
  CHECK(rejections(c.metrics, "a", "tenant_queue") == 1);
  CHECK_FALSE(r.answers[join].has_value());
  CHECK_FALSE(r.answers[other].has_value());

  c.gate.count_down();
  r.finish();
  CHECK(r.value(join) != nullptr);
  CHECK(r.value(other) != nullptr);
  CHECK(compiles(c.metrics) == 3);
}

TEST_CASE("grammar_compiler: a request that stops waiting before its compile began costs no compile") {
  gated_compiler c({.threads = 1});

  requests r{c.compiler};
  r.start("a", field_schema(0));  // running, held
  const std::size_t alone = r.start("a", field_schema(1), true);
  const std::size_t shared_left = r.start("a", field_schema(2), true);
  const std::size_t shared_stays = r.start("a", field_schema(2));
  c.until_waiting(2);

  r.signals.front().emit(asio::cancellation_type::terminal);
  std::next(r.signals.begin())->emit(asio::cancellation_type::terminal);
  r.io.poll();
  CHECK(r.refusal(alone) == gw::compile_failure::kind::cancelled);
  CHECK(r.refusal(shared_left) == gw::compile_failure::kind::cancelled);
  CHECK_FALSE(r.answers[shared_stays].has_value());
  CHECK(c.compiler.compiles_waiting() == 1);  // the compile of field 1 is dropped; field 2's is still wanted
  CHECK(c.metrics.grammar_compiles_dropped.Value() == 1);

  c.gate.count_down();
  r.finish();
  CHECK(r.value(shared_stays) != nullptr);
  CHECK(compiles(c.metrics) == 2);
  CHECK(c.compiler.cached() == 2);
}

TEST_CASE("grammar_compiler: the cache and the compiles in flight are each tenant's own") {
  gated_compiler c({.threads = 1});

  requests r{c.compiler};
  const std::size_t a = r.start("a", schema_grammar(kPoint));
  const std::size_t b = r.start("b", schema_grammar(kPoint));  // the same text: not joined to a's compile
  c.gate.count_down();
  r.finish();
  CHECK(compiles(c.metrics) == 2);
  CHECK(c.metrics.grammar_cache_misses.Value() == 2);
  CHECK(r.value(a).get() != r.value(b).get());

  // Each finds its own, at once; a third tenant finds neither.
  requests again{c.compiler};
  const std::size_t a2 = again.start("a", schema_grammar(kPoint));
  const std::size_t b2 = again.start("b", schema_grammar(kPoint));
  CHECK(again.value(a2).get() == r.value(a).get());
  CHECK(again.value(b2).get() == r.value(b).get());
  CHECK(compiles(c.metrics) == 2);
  const std::size_t c3 = again.start("c", schema_grammar(kPoint));
  again.finish();
  CHECK(again.value(c3).get() != r.value(a).get());
  CHECK(compiles(c.metrics) == 3);
  // Tenant names cannot run into the text: "a" with "b{..." is not "ab" with "{...".
  requests tricky{c.compiler};
  tricky.start("ab", schema_grammar(kPoint));
  tricky.finish();
  CHECK(compiles(c.metrics) == 4);
}

TEST_CASE("grammar_compiler: the cache is bounded in bytes, and the tenant holding the most gives room") {
  // One entry's size, from a compiler that keeps everything: field schemas of one shape, tenants
  // of one-letter names.
  std::int64_t entry = 0;
  {
    gated_compiler sizing({.threads = 1});
    sizing.gate.count_down();
    requests r{sizing.compiler};
    for (int i = 0; i < 3; ++i) r.start("a", field_schema(i));
    r.finish();
    REQUIRE(sizing.compiler.cached() == 3);
    entry = sizing.compiler.cached_bytes() / 3;
    REQUIRE(sizing.compiler.cached_bytes() == 3 * entry);  // all three the same size
    CHECK(entry > r.value(0)->stats().memory_bytes);        // the key counts too
  }

  SUBCASE("three fit; the fourth evicts the largest holder's least recently used") {
    gated_compiler c({.threads = 1, .cache_bytes = 3 * entry + entry / 2});
    c.gate.count_down();
    requests r{c.compiler};
    r.start("b", field_schema(0));  // the oldest entry
    r.finish();
    requests more{c.compiler};
    more.start("a", field_schema(0));
    more.start("a", field_schema(1));
    more.finish();
    CHECK(c.compiler.cached() == 3);
    requests fourth{c.compiler};
    fourth.start("b", field_schema(1));  // a holds two, b one: a's least recently used (field 0) goes
    fourth.finish();
    CHECK(c.compiler.cached() == 3);
    CHECK(c.compiler.cached_bytes() <= 3 * entry + entry / 2);
    CHECK(compiles(c.metrics) == 4);

    requests hits{c.compiler};
    hits.start("b", field_schema(0));  // b's oldest kept: b held the least (a global LRU would drop it)
    hits.start("a", field_schema(1));
    hits.start("b", field_schema(1));
    hits.finish();
    CHECK(compiles(c.metrics) == 4);
    requests evicted{c.compiler};
    evicted.start("a", field_schema(0));
    evicted.finish();
    CHECK(compiles(c.metrics) == 5);
  }

  SUBCASE("a grammar larger than the whole cache is answered, not kept") {
    gated_compiler c({.threads = 1, .cache_bytes = entry - 1});
    c.gate.count_down();
    requests r{c.compiler};
    r.start("a", field_schema(0));
    r.finish();
    CHECK(r.value(0) != nullptr);
    CHECK(c.compiler.cached() == 0);
    CHECK(c.compiler.cached_bytes() == 0);
    requests again{c.compiler};
    again.start("a", field_schema(0));
    again.finish();
    CHECK(again.value(0) != nullptr);
    CHECK(compiles(c.metrics) == 2);
  }
}

TEST_CASE("compile_budget: spending past a minute's budget refuses until it is paid back") {
  edge::manual_time_source clock;
  gw::compile_budget budget(6.0, clock);  // 6 compile seconds per minute: 1 s pays back in 10 s
  CHECK_FALSE(budget.admit("a"));
  budget.charge("a", 3s);
  CHECK_FALSE(budget.admit("a"));  // 30 s owed: within the minute's burst
  budget.charge("a", 3s);
  CHECK_FALSE(budget.admit("a"));  // 60 s owed: the whole minute, not past it
  budget.charge("a", 1s);
  const auto wait = budget.admit("a");
  REQUIRE(wait);
  CHECK(*wait == 10s);
  CHECK_FALSE(budget.admit("b"));  // another tenant owes nothing

  clock.advance(10s - 1ms);
  REQUIRE(budget.admit("a"));
  CHECK(*budget.admit("a") == 1ms);
  clock.advance(1ms);
  CHECK_FALSE(budget.admit("a"));

  // Paid back while idle: a quiet minute restores the whole burst, and not more.
  clock.advance(10min);
  budget.charge("a", 6s);
  CHECK_FALSE(budget.admit("a"));
  budget.charge("a", 1ms);
  CHECK(budget.admit("a"));
}

TEST_CASE("compile_budget: no limit keeps nothing; tenants that owe nothing are forgotten") {
  edge::manual_time_source clock;
  gw::compile_budget unlimited(0.0, clock);
  unlimited.charge("a", 1h);
  CHECK_FALSE(unlimited.admit("a"));
  CHECK(unlimited.tracked() == 0);

  gw::compile_budget budget(60.0, clock);
  for (int i = 0; i < 100; ++i) budget.charge(edge::format("t{}", i), 1s);
  CHECK(budget.tracked() == 100);
  clock.advance(2s);
  for (int i = 0; i < 100; ++i) budget.charge(edge::format("u{}", i), 1s);
  CHECK(budget.tracked() < 200);  // the t's, paid back, were swept
  CHECK_FALSE(budget.admit("t0"));
}

TEST_CASE("grammar_compiler: compile time is charged to the tenant; past its budget a new text is refused") {
  // A budget so small that any compile overdraws it for a long time.
  gated_compiler c({.threads = 1, .compile_seconds_per_minute = 1e-6});

  requests r{c.compiler};
  r.start("a", field_schema(0));  // admitted: a owes nothing yet; running, held
  r.start("a", field_schema(1));  // admitted too, queued: refused at its turn, once a owes
  r.start("b", field_schema(1));
  c.gate.count_down();
  r.finish();
  CHECK(r.value(0) != nullptr);
  CHECK(r.refusal(1) == gw::compile_failure::kind::tenant_budget);
  CHECK(r.value(2) != nullptr);
  CHECK(compiles(c.metrics) == 2);
  CHECK(rejections(c.metrics, "a", "tenant_budget") == 1);
  CHECK(c.metrics.tenant_grammar_compile_seconds.Add({{"tenant", "a"}}).Value() > 0.0);
  CHECK(c.metrics.tenant_grammar_compile_seconds.Add({{"tenant", "b"}}).Value() > 0.0);

  // Refused at once now, with when to come back; the grammar it has still serves.
  requests later{c.compiler};
  const std::size_t refused = later.start("a", field_schema(2));
  const std::size_t cached = later.start("a", field_schema(0));
  CHECK(later.refusal(refused) == gw::compile_failure::kind::tenant_budget);
  const auto wait = later.answers[refused]->error().retry_after();
  CHECK(wait > 1min);
  CHECK(later.value(cached) == r.value(0));

  c.clock.advance(wait);
  requests paid{c.compiler};
  paid.start("a", field_schema(2));
  paid.finish();
  CHECK(paid.value(0) != nullptr);
}

TEST_CASE("grammar_compiler: destroyed with compiles queued, it answers their requests and compiles none") {
  const auto inner = edge::testing::byte_tokenizer();
  std::latch gate(1);
  const gated_tokenizer tok(*inner, gate);
  prometheus::Registry registry;
  edge::monitoring::gateway_metrics metrics(registry);
  const edge::manual_time_source clock;
  std::optional<gw::grammar_compiler> compiler(std::in_place, tok, gw::grammar_compiler_options{.threads = 1},
                                               &metrics, clock);

  requests r{*compiler};
  r.start("a", field_schema(0));  // running, held
  r.start("a", field_schema(1));
  r.start("b", field_schema(2));
  while (compiler->compiles_waiting() != 2) std::this_thread::yield();  // the first has begun
  // The destructor answers the queued at once, then waits for the compile running.
  std::thread destroying([&] { compiler.reset(); });
  while (!r.answers[1].has_value() || !r.answers[2].has_value()) {
    r.io.poll();
    std::this_thread::yield();
  }
  CHECK(r.refusal(1) == gw::compile_failure::kind::shutting_down);
  CHECK(r.refusal(2) == gw::compile_failure::kind::shutting_down);
  CHECK(metrics.grammar_compiles_waiting.Value() == 0);
  gate.count_down();
  destroying.join();
  r.finish();
  CHECK(r.value(0) != nullptr);
  CHECK(compiles(metrics) == 1);
}

TEST_CASE("default_grammar_compile_threads: a quarter of the hardware threads, from 1 to 4") {
  CHECK(gw::default_grammar_compile_threads(0) == 1);
  CHECK(gw::default_grammar_compile_threads(2) == 1);
  CHECK(gw::default_grammar_compile_threads(8) == 2);
  CHECK(gw::default_grammar_compile_threads(12) == 3);
  CHECK(gw::default_grammar_compile_threads(64) == 4);
}
