// The gateway's grammar compiler, with its compile held at a gate the test opens: requests that
// bring a text while it compiles wait for that one compile (one miss, the rest hits, one
// compile, one shared result); a full queue refuses a new text but still lets a request join a
// compile in flight; a cached text is answered without a compile.
#include <doctest/doctest.h>

#include <prometheus/registry.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <exception>
#include <latch>
#include <optional>
#include <vector>

#include "backend/grammar/grammar_test_support.h"
#include "edge/gateway/openai/grammar_compiler.h"
#include "edge/monitoring/gateway_metrics.h"

namespace gw = edge::gateway;
namespace g = edge::backend::grammar;
namespace asio = boost::asio;

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

std::uint64_t compiles(edge::monitoring::gateway_metrics& metrics) {
  return metrics.grammar_compile_seconds.Collect().histogram.sample_count;
}

// Requests started on one io_context; `start` returns once each has either been answered or is
// waiting for a compile (the pool cannot finish one while the gate is shut).
struct requests {
  gw::grammar_compiler& compiler;
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  std::vector<std::optional<gw::grammar_compiler::answer>> answers;
  std::size_t outstanding = 0;

  void start(const std::shared_ptr<const g::grammar>& grammar) {
    const std::size_t slot = answers.size();
    answers.emplace_back();
    ++outstanding;
    asio::co_spawn(io, request(this, slot, grammar), [](std::exception_ptr failure) {
      if (failure) std::rethrow_exception(failure);
    });
    io.poll();
  }
  // The answer is not default-constructible, so the coroutine stores it rather than return it.
  // Its arguments are its own copies (a lambda's captures would not outlive the call).
  static asio::awaitable<void> request(requests* self, std::size_t slot, std::shared_ptr<const g::grammar> grammar) {
    self->answers[slot] = co_await self->compiler.compile(std::move(grammar));
    if (--self->outstanding == 0) self->work.reset();
  }
  void finish() {
    if (outstanding == 0) work.reset();
    io.run();
  }
};

constexpr std::string_view kPoint = R"({"type":"object","properties":{"x":{"type":"integer"},"y":{"type":"integer"}},"required":["x","y"]})";
constexpr std::string_view kName = R"({"type":"object","properties":{"name":{"type":"string"}},"required":["name"]})";
constexpr std::string_view kFlag = R"({"type":"object","properties":{"on":{"type":"boolean"}}})";

}  // namespace

TEST_CASE("grammar_compiler: requests for a text being compiled share its one compile") {
  const auto inner = edge::testing::byte_tokenizer();
  std::latch gate(1);
  const gated_tokenizer tok(*inner, gate);
  prometheus::Registry registry;
  edge::monitoring::gateway_metrics metrics(registry);
  gw::grammar_compiler compiler(tok, {.threads = 1}, &metrics);

  requests r{compiler};
  for (int i = 0; i < 8; ++i) r.start(schema_grammar(kPoint));  // equal texts, distinct objects
  for (const auto& a : r.answers) CHECK_FALSE(a.has_value());   // all wait: the compile is held
  CHECK(compiles(metrics) == 0);

  gate.count_down();
  r.finish();
  REQUIRE(r.answers.size() == 8);
  for (const auto& a : r.answers) {
    REQUIRE(a.has_value());
    REQUIRE_MESSAGE(a->ok(), a->error().message());
    CHECK(a->value().get() == r.answers.front()->value().get());  // one compiled grammar, shared
  }
  CHECK(compiles(metrics) == 1);
  CHECK(metrics.grammar_cache_misses.Value() == 1);
  CHECK(metrics.grammar_cache_hits.Value() == 7);
  CHECK(compiler.cached() == 1);

  // Now cached: answered at once, the same grammar, no compile.
  requests again{compiler};
  again.start(schema_grammar(kPoint));
  REQUIRE(again.answers[0].has_value());
  REQUIRE(again.answers[0]->ok());
  CHECK(again.answers[0]->value().get() == r.answers.front()->value().get());
  CHECK(compiles(metrics) == 1);
  CHECK(metrics.grammar_cache_hits.Value() == 8);
}

TEST_CASE("grammar_compiler: a full queue refuses a new text, not a request joining a compile in flight") {
  const auto inner = edge::testing::byte_tokenizer();
  std::latch gate(1);
  const gated_tokenizer tok(*inner, gate);
  prometheus::Registry registry;
  edge::monitoring::gateway_metrics metrics(registry);
  gw::grammar_compiler compiler(tok, {.threads = 1, .max_queued = 2}, &metrics);

  requests r{compiler};
  r.start(schema_grammar(kPoint));
  r.start(schema_grammar(kName));  // the queue is full: two compiles, one running and held
  r.start(schema_grammar(kFlag));  // a third text: refused at once
  r.start(schema_grammar(kName));  // joins the queued compile of the same text
  REQUIRE(r.answers[2].has_value());
  REQUIRE_FALSE(r.answers[2]->ok());
  CHECK(r.answers[2]->error().message().find("grammars are waiting to be compiled") != std::string::npos);
  CHECK_FALSE(r.answers[3].has_value());

  gate.count_down();
  r.finish();
  for (const std::size_t i : {0u, 1u, 3u}) {
    REQUIRE(r.answers[i].has_value());
    REQUIRE_MESSAGE(r.answers[i]->ok(), r.answers[i]->error().message());
  }
  CHECK(r.answers[1]->value().get() == r.answers[3]->value().get());
  CHECK(r.answers[0]->value().get() != r.answers[1]->value().get());
  CHECK(compiles(metrics) == 2);
  CHECK(metrics.grammar_cache_misses.Value() == 2);
  CHECK(metrics.grammar_cache_hits.Value() == 1);

  // Once the queue has drained, the refused text compiles.
  requests later{compiler};
  later.start(schema_grammar(kFlag));
  later.finish();
  REQUIRE(later.answers[0].has_value());
  CHECK(later.answers[0]->ok());
  CHECK(compiles(metrics) == 3);
}
