#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "edge/bench/report.h"
#include "edge/bench/workload.h"

namespace bench = edge::bench;

namespace {

bench::bench_result sample(std::string label, double scale) {
  bench::bench_result r;
  r.label = std::move(label);
  r.model = "stories260K";
  r.dataset = "random (input 16, output 16, range 0)";
  r.endpoint = "completions";
  for (std::int64_t c : {1, 8}) {
    bench::point_summary p;
    p.concurrency = c;
    p.request_rate = bench::unlimited_rate;
    p.metrics.completed = 10;
    p.metrics.output_throughput = scale * static_cast<double>(c) * 100;
    p.metrics.ttft_ms = bench::summarize({10, 20, 30});
    p.metrics.failures["http_503"] = 1;
    p.metrics.failed = 1;
    p.metrics.cache = {.requests_reporting = 10, .prompt_tokens = 1000, .cached_tokens = c == 1 ? 0 : 900};
    r.points.push_back(p);
  }
  return r;
}

bench::configuration one(bench::bench_result r) { return bench::configuration{{std::move(r)}}; }

std::size_t count_of(const std::string& text, std::string_view what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

}  // namespace

TEST_CASE("result JSON round-trips") {
  bench::bench_result r = sample("int4", 1.5);
  r.reuse_prompts = true;
  r.points[1].metrics.goodput = 2.5;
  r.points[1].metrics.tokens.more_deltas_requests = 2;
  bench::point_summary open;
  open.request_rate = 4;
  r.points.push_back(open);
  auto back = bench::parse_result_json(bench::to_json(r));
  REQUIRE(back.ok());
  CHECK(back->label == "int4");
  REQUIRE(back->points.size() == 3);
  CHECK(back->points[1].concurrency == 8);
  CHECK(std::isinf(back->points[0].request_rate));
  CHECK(back->points[2].request_rate == 4);
  CHECK_FALSE(back->points[2].concurrency.has_value());
  CHECK(back->points[1].metrics.output_throughput == doctest::Approx(1200));
  CHECK(back->points[1].metrics.goodput == 2.5);
  CHECK(back->points[0].metrics.failures.at("http_503") == 1);
  CHECK(back->points[0].metrics.ttft_ms.median == doctest::Approx(20));
  CHECK(back->reuse_prompts);
  CHECK(back->points[1].metrics.tokens.more_deltas_requests == 2);
  CHECK(back->points[1].metrics.cache.cached_tokens == 900);
  CHECK(back->points[1].metrics.cache.prompt_tokens == 1000);
  CHECK(back->points[1].metrics.cache.requests_reporting == 10);
  CHECK(bench::to_json(r).find("\"share\":9E-1") != std::string::npos);
  CHECK(bench::to_json(r).find("\"prompts\":\"reused\"") != std::string::npos);
  CHECK_FALSE(back->points[2].metrics.cache.share().has_value());
  CHECK(bench::to_json(r).find("\"share\":null") != std::string::npos);
  CHECK_FALSE(bench::parse_result_json("{\"points\": []}").ok());
  r.reuse_prompts = false;
  CHECK_FALSE(bench::parse_result_json(bench::to_json(r))->reuse_prompts);
  // A file written before prompts were drawn per point and the prompt cache reported: its points
  // reused the first point's prompts, and its cached share is unknown.
  auto old = bench::parse_result_json(
      "{\"format\":\"edgeinfer-bench/1\",\"points\":[{\"concurrency\":1,\"completed\":3}]}");
  REQUIRE(old.ok());
  CHECK(old->reuse_prompts);
  CHECK_FALSE(old->points[0].metrics.cache.share().has_value());
}

TEST_CASE("comparisons put concurrency in rows, configurations in columns and the difference last") {
  auto table = bench::format_comparison({one(sample("int4", 1.5)), one(sample("fp8", 1.0)), one(sample("bf16", 0.5))},
                                        "output_throughput");
  REQUIRE(table.ok());
  CHECK(table->starts_with("Output token throughput (tok/s)\n"));
  CHECK(table->find("| concurrency | int4 | fp8 | bf16 | int4 vs fp8 |") != std::string::npos);
  // The point at 8 measured a warm cache (90% cached): its values are marked, with the note.
  CHECK(table->find("| 1 | 150.0 | 100.0 | 50.00 | +50.0% |") != std::string::npos);
  CHECK(table->find("| 8 | 1200.0 * | 800.0 * | 400.0 * | +50.0% |") != std::string::npos);
  CHECK(table->find("Values marked * come from points where over 5% of the prompt tokens") != std::string::npos);
  auto latency = bench::format_comparison({one(sample("a", 1)), one(sample("b", 1))}, "ttft_median_ms");
  REQUIRE(latency.ok());
  CHECK(latency->find("| 1 | 20.00 | 20.00 | +0.0% |") != std::string::npos);
  auto failed = bench::format_comparison({one(sample("a", 1))}, "failed");
  REQUIRE(failed.ok());
  CHECK(failed->find("| 1 | 1 |") != std::string::npos);  // a count, without decimals
  auto cached = bench::format_comparison({one(sample("a", 1))}, "cached_prompt_share");
  REQUIRE(cached.ok());
  CHECK(cached->find("| 1 | 0.00 |") != std::string::npos);
  CHECK(cached->find("| 8 | 90.00 * |") != std::string::npos);
  CHECK(bench::format_comparison({one(sample("a", 1))}, "speed").error().message().find("unknown metric") !=
        std::string::npos);
  CHECK_FALSE(bench::format_comparison({}, "failed").ok());
}

TEST_CASE("a configuration of several runs shows their median and range; the percentage compares medians") {
  bench::configuration repeated{{sample("int4", 1.0), sample("int4", 3.0), sample("int4", 1.5)}};
  repeated.runs[1].points.pop_back();  // a run that measured only the first point
  const bench::configuration single = one(sample("fp8", 1.0));
  auto table = bench::format_comparison({repeated, single}, "output_throughput");
  REQUIRE(table.ok());
  CHECK(table->starts_with("Output token throughput (tok/s), median (range) of 1-3 runs\n"));
  CHECK(table->find("| concurrency | int4 | fp8 | int4 vs fp8 |") != std::string::npos);
  CHECK(table->find("| 1 | 150.0 (100.0–300.0) | 100.0 | +50.0% |") != std::string::npos);
  CHECK(table->find("| 8 | 1000.0 (800.0–1200.0) * | 800.0 * | +25.0% |") != std::string::npos);
  auto same = bench::format_comparison({repeated, repeated}, "ttft_median_ms");
  REQUIRE(same.ok());
  CHECK(same->starts_with("TTFT median (ms), median (range) of 3 runs\n"));
}

TEST_CASE("the CSV has a header and one row per point") {
  bench::bench_result r = sample("fp8", 1);
  r.points[0].metrics.cache = {};  // a server that sends no cached_tokens
  const std::string csv = bench::to_csv(r);
  CHECK(csv.starts_with("label,concurrency,request_rate,completed,failed"));
  CHECK(csv.find(",mismatched_requests,more_deltas_requests,cache_reporting_requests,cached_prompt_tokens,"
                 "cached_prompt_share\n") != std::string::npos);
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 3);
  CHECK(csv.find("\nfp8,8,inf,10,1,") != std::string::npos);
  CHECK(csv.find(",0,0,0,0,0,0,\nfp8,8,") != std::string::npos);  // unknown share: an empty cell
  CHECK(csv.ends_with(",0,0,0,0,10,900,0.9000\n"));
}

TEST_CASE("the HTML report is self-contained with one SVG chart per metric") {
  const std::string html = bench::html_report({one(sample("int4", 1.5)), one(sample("fp8", 1.0))}, "int4 <vs> fp8");
  CHECK(html.find("<title>int4 &lt;vs&gt; fp8</title>") != std::string::npos);
  for (const char* id : {"chart-output-throughput", "chart-request-throughput", "chart-ttft", "chart-tpot", "chart-itl",
                         "chart-e2el"}) {
    CHECK(html.find(std::string("id=\"") + id + "\"") != std::string::npos);
  }
  CHECK(html.find("<script") == std::string::npos);
  CHECK(html.find("http://") == html.find("http://www.w3.org/2000/svg"));  // the SVG namespace only
  CHECK(html.find("data-series=\"int4\"") != std::string::npos);
  CHECK(html.find("data-series=\"fp8 p99\"") != std::string::npos);
  // The warm point (8) of each configuration: its table row, and a ring on each chart line.
  CHECK(count_of(html, "<tr class=\"warm\">") == 2);
  CHECK(html.find("<tr class=\"warm\"><td>8</td>") != std::string::npos);
  CHECK(html.find("900 (90.0%) ⚠") != std::string::npos);
  CHECK(html.find("<td class=\"cache\">0 (0.0%)</td>") != std::string::npos);
  // Throughput: a line per configuration; TTFT (the only latency the sample has): p50 and p99 each.
  CHECK(count_of(html, "<circle class=\"warm\"") == 2 * 2 + 2 * 2);
  CHECK(html.find("class=\"warm-note\"") != std::string::npos);
  CHECK(html.find("prompts drawn per point") != std::string::npos);

  bench::bench_result cold = sample("cold", 1);
  for (auto& p : cold.points) p.metrics.cache.cached_tokens = 0;
  const std::string plain = bench::html_report({one(cold)}, "cold");
  CHECK(plain.find("<tr class=\"warm\"") == std::string::npos);
  CHECK(plain.find("<circle class=\"warm\"") == std::string::npos);
  CHECK(plain.find("class=\"warm-note\"") == std::string::npos);
}

TEST_CASE("the terminal table reports failures by category") {
  const bench::bench_result r = sample("x", 1);
  const std::string table = bench::format_point_table(r, r.points[0]);
  CHECK(table.find("Failed requests:") != std::string::npos);
  CHECK(table.find("1 (http_503: 1)") != std::string::npos);
  CHECK(table.find("Median TTFT (ms):") != std::string::npos);
  CHECK(table.find("Prompts:                                  drawn for this point\n") != std::string::npos);
  CHECK(table.find("Cached prompt tokens:                     0 of 1000 (0.0%)\n") != std::string::npos);
  CHECK(table.find("warm cache") == std::string::npos);
  CHECK(table.find("fewer deltas") == std::string::npos);  // the counts agree

  bench::bench_result warm = sample("x", 1);
  warm.reuse_prompts = true;
  warm.points[1].metrics.tokens = {.requests_with_usage = 10, .usage_completion_tokens = 100,
                                   .client_completion_tokens = 97, .mismatched_requests = 3, .more_deltas_requests = 0};
  const std::string second = bench::format_point_table(warm, warm.points[1]);
  CHECK(second.find("the first point's, at every point") != std::string::npos);
  CHECK(second.find("900 of 1000 (90.0%)") != std::string::npos);
  CHECK(second.find("(Over 5% of the prompt tokens came from the server's") != std::string::npos);
  CHECK(second.find("  with fewer deltas than tokens:          3\n") != std::string::npos);
  CHECK(second.find("(Fewer is expected: a token that prints nothing") != std::string::npos);
  CHECK(second.find("usage counts fewer tokens than it streamed") == std::string::npos);
  // Notes are wrapped to the table's width.
  const std::size_t note = second.find("(Fewer");
  const std::size_t note_end = second.find(")\n", note);
  REQUIRE(note_end != std::string::npos);
  for (std::size_t start = note, end; start < note_end; start = end + 1) {
    end = second.find('\n', start);
    CHECK(end - start <= 58);
  }
  warm.points[1].metrics.cache = {};
  CHECK(bench::format_point_table(warm, warm.points[1]).find("not reported by the server") != std::string::npos);
}

namespace {

// An agent run: one point whose requests were turns of sessions.
bench::bench_result agent_sample(std::string label, std::int64_t cached_per_turn) {
  bench::bench_result r = sample(std::move(label), 1);
  r.dataset = "agent (4 sessions x 3 turns, system prompt 100 words, turns of 30-60 words, output 8, session affinity on)";
  r.points.resize(1);
  bench::run_metrics& m = r.points[0].metrics;
  for (std::int64_t t = 0; t < 3; ++t) {
    bench::turn_metrics turn;
    turn.turn = t;
    turn.completed = 4;
    turn.cache = {.requests_reporting = 4, .prompt_tokens = 1000 * (t + 1), .cached_tokens = t == 0 ? 0 : cached_per_turn * t};
    turn.ttft_ms = bench::summarize({100.0 / static_cast<double>(t + 1), 200.0});
    m.by_turn.push_back(turn);
  }
  r.points[0].sessions_cut = 1;
  return r;
}

}  // namespace

TEST_CASE("agent results carry the hit ratio and TTFT by turn through JSON, the terminal and HTML") {
  const bench::bench_result r = agent_sample("affinity + host tier", 800);
  const std::string json = bench::to_json(r);
  CHECK(json.find("\"turns\":[{\"turn\":1,") != std::string::npos);  // numbered from 1
  auto back = bench::parse_result_json(json);
  REQUIRE(back.ok());
  const bench::run_metrics& m = back->points[0].metrics;
  REQUIRE(m.by_turn.size() == 3);
  CHECK(m.by_turn[0].turn == 0);
  CHECK(m.by_turn[2].cache.cached_tokens == 1600);
  CHECK(m.by_turn[2].cache.prompt_tokens == 3000);
  CHECK(m.by_turn[1].ttft_ms.median == doctest::Approx(125));
  CHECK(back->points[0].sessions_cut == 1);
  CHECK(bench::parse_result_json(bench::to_json(sample("plain", 1)))->points[0].metrics.by_turn.empty());

  const std::string table = bench::format_point_table(r, r.points[0]);
  CHECK(table.find("Sessions ended by a failed turn:          1\n") != std::string::npos);
  CHECK(table.find("turn requests     cached/prompt  hit % TTFT p50 TTFT p99\n") != std::string::npos);
  CHECK(table.find("   3        4         1600/3000   53.3    116.7    198.3\n") != std::string::npos);
  CHECK(bench::format_point_table(sample("plain", 1), sample("plain", 1).points[0]).find("by turn") == std::string::npos);

  const std::string html = bench::html_report({one(r), one(agent_sample("neither", 100))}, "agents");
  CHECK(html.find("id=\"chart-turn-hit-ratio\"") != std::string::npos);
  CHECK(html.find("id=\"chart-turn-ttft\"") != std::string::npos);
  CHECK(html.find("data-series=\"affinity + host tier\"") != std::string::npos);
  CHECK(html.find("<title>neither: 53.33</title>") == std::string::npos);
  CHECK(html.find("<title>affinity + host tier: 53.33</title>") != std::string::npos);  // turn 3's hit ratio in %
  CHECK(html.find("agent sessions by turn · hit ratio") != std::string::npos);
  CHECK(html.find("<tr><td>3</td><td>4</td><td>3000</td><td>1600</td><td>53.3%</td>") != std::string::npos);
  CHECK(bench::html_report({one(sample("plain", 1))}, "plain").find("chart-turn") == std::string::npos);
}
