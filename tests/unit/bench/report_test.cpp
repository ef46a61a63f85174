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
    r.points.push_back(p);
  }
  return r;
}

}  // namespace

TEST_CASE("result JSON round-trips") {
  bench::bench_result r = sample("int4", 1.5);
  r.points[1].metrics.goodput = 2.5;
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
  CHECK_FALSE(bench::parse_result_json("{\"points\": []}").ok());
}

TEST_CASE("comparisons put concurrency in rows, configurations in columns and the difference last") {
  auto table = bench::format_comparison({sample("int4", 1.5), sample("fp8", 1.0), sample("bf16", 0.5)},
                                        "output_throughput");
  REQUIRE(table.ok());
  CHECK(table->find("| concurrency | int4 | fp8 | bf16 | int4 vs fp8 |") != std::string::npos);
  CHECK(table->find("| 1 | 150.0 | 100.0 | 50.00 | +50.0% |") != std::string::npos);
  CHECK(table->find("| 8 | 1200.0 | 800.0 | 400.0 | +50.0% |") != std::string::npos);
  auto latency = bench::format_comparison({sample("a", 1), sample("b", 1)}, "ttft_median_ms");
  REQUIRE(latency.ok());
  CHECK(latency->find("| 1 | 20.00 | 20.00 | +0.0% |") != std::string::npos);
  auto failed = bench::format_comparison({sample("a", 1)}, "failed");
  REQUIRE(failed.ok());
  CHECK(failed->find("| 8 | 1.00 |") != std::string::npos);
  CHECK(bench::format_comparison({sample("a", 1)}, "speed").error().message().find("unknown metric") !=
        std::string::npos);
}

TEST_CASE("the CSV has a header and one row per point") {
  const std::string csv = bench::to_csv(sample("fp8", 1));
  CHECK(csv.starts_with("label,concurrency,request_rate,completed,failed"));
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 3);
  CHECK(csv.find("\nfp8,8,inf,10,1,") != std::string::npos);
}

TEST_CASE("the HTML report is self-contained with one SVG chart per metric") {
  const std::string html = bench::html_report({sample("int4", 1.5), sample("fp8", 1.0)}, "int4 <vs> fp8");
  CHECK(html.find("<title>int4 &lt;vs&gt; fp8</title>") != std::string::npos);
  for (const char* id : {"chart-output-throughput", "chart-request-throughput", "chart-ttft", "chart-tpot", "chart-itl",
                         "chart-e2el"}) {
    CHECK(html.find(std::string("id=\"") + id + "\"") != std::string::npos);
  }
  CHECK(html.find("<script") == std::string::npos);
  CHECK(html.find("http://") == html.find("http://www.w3.org/2000/svg"));  // the SVG namespace only
  CHECK(html.find("data-series=\"int4\"") != std::string::npos);
  CHECK(html.find("data-series=\"fp8 p99\"") != std::string::npos);
}

TEST_CASE("the terminal table reports failures by category") {
  const bench::bench_result r = sample("x", 1);
  const std::string table = bench::format_point_table(r, r.points[0]);
  CHECK(table.find("Failed requests:") != std::string::npos);
  CHECK(table.find("1 (http_503: 1)") != std::string::npos);
  CHECK(table.find("Median TTFT (ms):") != std::string::npos);
}
