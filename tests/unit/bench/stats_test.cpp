#include <doctest/doctest.h>

#include <vector>

#include "edge/bench/stats.h"

namespace bench = edge::bench;

namespace {

bench::request_record done(double ttft_s, double latency_s, std::int64_t tokens, std::vector<double> itl = {}) {
  bench::request_record r;
  r.success = true;
  r.ttft_s = ttft_s;
  r.latency_s = latency_s;
  r.content_deltas = tokens;
  r.usage_completion_tokens = tokens;
  r.usage_prompt_tokens = 10;
  r.itl_s = std::move(itl);
  return r;
}

}  // namespace

TEST_CASE("percentiles interpolate between ranks as numpy does") {
  const std::vector<double> four = {1, 2, 3, 4};
  CHECK(bench::percentile(four, 50) == doctest::Approx(2.5));
  CHECK(bench::percentile(four, 90) == doctest::Approx(3.7));
  CHECK(bench::percentile(four, 0) == doctest::Approx(1));
  CHECK(bench::percentile(four, 100) == doctest::Approx(4));
  const std::vector<double> ten = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  CHECK(bench::percentile(ten, 99) == doctest::Approx(9.91));
  CHECK(bench::percentile(ten, 90) == doctest::Approx(9.1));
  const std::vector<double> one = {7};
  CHECK(bench::percentile(one, 99) == doctest::Approx(7));
  CHECK(bench::percentile(std::vector<double>{}, 50) == 0);
}

TEST_CASE("summaries sort their input and report mean, std, median, p90, p99") {
  const bench::distribution d = bench::summarize({4, 1, 3, 2});
  CHECK(d.count == 4);
  CHECK(d.mean == doctest::Approx(2.5));
  CHECK(d.std == doctest::Approx(1.118034).epsilon(1e-5));  // population std of 1..4
  CHECK(d.median == doctest::Approx(2.5));
  CHECK(d.p90 == doctest::Approx(3.7));
  CHECK(d.min == 1);
  CHECK(d.max == 4);
}

TEST_CASE("TPOT excludes the first token and uses the server's count when it has one") {
  bench::request_record r = done(0.2, 0.65, 10);
  CHECK(r.tpot_s() == doctest::Approx(0.05));  // (0.65 - 0.2) / 9
  r.usage_completion_tokens.reset();
  r.content_deltas = 4;
  CHECK(r.tpot_s() == doctest::Approx(0.15));  // falls back to the client's delta count
  r.content_deltas = 1;
  CHECK(r.tpot_s() == 0);
}

TEST_CASE("metrics count failures by category and compute throughput over the duration") {
  std::vector<bench::request_record> records = {done(0.1, 1.0, 10, {0.1, 0.1}), done(0.3, 2.0, 20, {0.2})};
  bench::request_record refused;
  refused.error = "http_429";
  records.push_back(refused);
  records.push_back(refused);
  bench::request_record dropped;
  dropped.error = "connection";
  records.push_back(dropped);

  const bench::run_metrics m = bench::compute_metrics(records, 2.0, {});
  CHECK(m.completed == 2);
  CHECK(m.failed == 3);
  CHECK(m.failures.at("http_429") == 2);
  CHECK(m.failures.at("connection") == 1);
  CHECK(m.total_output_tokens == 30);
  CHECK(m.total_input_tokens == 20);
  CHECK(m.request_throughput == doctest::Approx(1.0));
  CHECK(m.output_throughput == doctest::Approx(15.0));
  CHECK(m.total_token_throughput == doctest::Approx(25.0));
  CHECK(m.ttft_ms.mean == doctest::Approx(200));
  CHECK(m.itl_ms.count == 3);
  CHECK(m.itl_ms.median == doctest::Approx(100));
  CHECK_FALSE(m.goodput.has_value());
  CHECK(m.tokens.requests_with_usage == 2);
  CHECK(m.tokens.mismatched_requests == 0);
}

TEST_CASE("client and server token counts are cross-checked per request") {
  bench::request_record merged = done(0.1, 1.0, 10);
  merged.content_deltas = 9;  // the server merged two tokens into one delta
  bench::request_record no_usage = done(0.1, 1.0, 5);
  no_usage.usage_completion_tokens.reset();
  const std::vector<bench::request_record> records = {merged, no_usage, done(0.1, 1.0, 3)};
  const bench::run_metrics m = bench::compute_metrics(records, 1.0, {});
  CHECK(m.tokens.requests_with_usage == 2);
  CHECK(m.tokens.usage_completion_tokens == 13);
  CHECK(m.tokens.client_completion_tokens == 12);
  CHECK(m.tokens.mismatched_requests == 1);
  CHECK(m.tokens.more_deltas_requests == 0);
  CHECK(m.total_output_tokens == 18);  // usage where sent, deltas elsewhere

  bench::request_record undercounted = done(0.1, 1.0, 4);
  undercounted.content_deltas = 6;  // more deltas than the usage's tokens: the usage is wrong
  const std::vector<bench::request_record> both = {merged, undercounted};
  const bench::run_metrics wrong = bench::compute_metrics(both, 1.0, {});
  CHECK(wrong.tokens.mismatched_requests == 2);
  CHECK(wrong.tokens.more_deltas_requests == 1);
}

TEST_CASE("prompt tokens served from the prefix cache are summed over the requests that report them") {
  bench::request_record cold = done(0.1, 1.0, 4);
  cold.usage_cached_tokens = 0;
  bench::request_record warm = done(0.1, 1.0, 4);
  warm.usage_prompt_tokens = 40;
  warm.usage_cached_tokens = 32;
  bench::request_record silent = done(0.1, 1.0, 4);  // a server that does not send cached_tokens
  bench::request_record failed = warm;
  failed.success = false;
  failed.error = "http_503";
  const std::vector<bench::request_record> records = {cold, warm, silent, failed};
  const bench::run_metrics m = bench::compute_metrics(records, 1.0, {});
  CHECK(m.cache.requests_reporting == 2);
  CHECK(m.cache.prompt_tokens == 50);  // 10 + 40: the silent and the failed request are left out
  CHECK(m.cache.cached_tokens == 32);
  REQUIRE(m.cache.share().has_value());
  CHECK(*m.cache.share() == doctest::Approx(0.64));
  CHECK(bench::warm_cache(m.cache));

  const std::vector<bench::request_record> none = {silent};
  const bench::run_metrics unreported = bench::compute_metrics(none, 1.0, {});
  CHECK_FALSE(unreported.cache.share().has_value());
  CHECK_FALSE(bench::warm_cache(unreported.cache));

  // The threshold: a share at it is not warm, just above it is.
  bench::prompt_cache_use at{.requests_reporting = 1, .prompt_tokens = 100, .cached_tokens = 5};
  CHECK_FALSE(bench::warm_cache(at));
  at.cached_tokens = 6;
  CHECK(bench::warm_cache(at));
}

TEST_CASE("goodput counts only requests that meet every objective") {
  auto slo = bench::parse_slo("ttft:500 tpot:50");
  REQUIRE(slo.ok());
  CHECK(slo->ttft_ms == 500);
  CHECK(slo->tpot_ms == 50);
  CHECK_FALSE(slo->e2el_ms.has_value());

  const std::vector<bench::request_record> records = {
      done(0.2, 0.65, 10),  // ttft 200, tpot 50: good
      done(0.6, 1.0, 10),   // ttft 600: too slow to start
      done(0.2, 1.1, 10),   // tpot 100: too slow to stream
      done(0.1, 0.1, 1),    // one token: tpot 0, good
  };
  const bench::run_metrics m = bench::compute_metrics(records, 2.0, *slo);
  CHECK(m.good_requests == 2);
  REQUIRE(m.goodput.has_value());
  CHECK(*m.goodput == doctest::Approx(1.0));

  auto itl = bench::parse_slo("itl:150,e2el:2000");
  REQUIRE(itl.ok());
  CHECK(bench::meets(done(0.1, 0.5, 3, {0.1, 0.1}), *itl));
  CHECK_FALSE(bench::meets(done(0.1, 0.5, 3, {0.1, 0.2}), *itl));
  CHECK(bench::to_string(*itl) == "itl:150 e2el:2000");
}

TEST_CASE("bad goodput objectives are clear errors") {
  CHECK(bench::parse_slo("ttft").error().message().find("KEY:MILLISECONDS") != std::string::npos);
  CHECK(bench::parse_slo("latency:5").error().message().find("unknown goodput objective \"latency\"") != std::string::npos);
  CHECK(bench::parse_slo("ttft:-1").error().message().find("positive") != std::string::npos);
  CHECK(bench::parse_slo("ttft:5x").error().message().find("positive") != std::string::npos);
  CHECK(bench::parse_slo("ttft:5 ttft:6").error().message().find("twice") != std::string::npos);
  CHECK_FALSE(bench::parse_slo("  ").ok());
}

TEST_CASE("turns of agent sessions get the cache's hit ratio and TTFT of their own") {
  std::vector<bench::request_record> records;
  const auto turn = [&](std::int64_t t, std::int64_t prompt, std::int64_t cached, double ttft_s) {
    bench::request_record r = done(ttft_s, ttft_s + 0.1, 4);
    r.turn = t;
    r.usage_prompt_tokens = prompt;
    r.usage_cached_tokens = cached;
    records.push_back(r);
  };
  turn(0, 100, 0, 0.5);
  turn(1, 300, 96, 0.2);
  turn(0, 120, 16, 0.7);
  turn(1, 280, 240, 0.1);
  turn(2, 500, 400, 0.3);
  bench::request_record failed;
  failed.turn = 2;
  records.push_back(failed);
  const bench::run_metrics m = bench::compute_metrics(records, 1.0, {});
  CHECK(m.cache.prompt_tokens == 1300);
  CHECK(m.cache.cached_tokens == 752);
  REQUIRE(m.by_turn.size() == 3);
  CHECK(m.by_turn[0].turn == 0);
  CHECK(m.by_turn[0].completed == 2);
  CHECK(m.by_turn[0].cache.prompt_tokens == 220);
  CHECK(m.by_turn[0].cache.cached_tokens == 16);
  CHECK(m.by_turn[0].ttft_ms.median == doctest::Approx(600));
  CHECK(*m.by_turn[1].cache.share() == doctest::Approx(336.0 / 580.0));
  CHECK(m.by_turn[2].completed == 1);  // the failed request counts in no turn
  CHECK(m.by_turn[2].ttft_ms.p99 == doctest::Approx(300));

  records.resize(2);
  for (auto& r : records) r.turn.reset();
  CHECK(bench::compute_metrics(records, 1.0, {}).by_turn.empty());  // requests of no session: no turns
}
