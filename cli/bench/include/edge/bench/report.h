// Results of `edgeinfer bench`: JSON and CSV files, the terminal table, the side-by-side
// comparison of several result files, and the HTML report with charts.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "edge/bench/stats.h"
#include "edge/common/status.h"

namespace edge::bench {

// One point of a sweep as stored: what was asked and what was measured.
struct point_summary {
  std::optional<std::int64_t> concurrency;
  double request_rate = 0;  // infinity: none
  run_metrics metrics;
  std::int64_t warmup_requests = 0;
  std::int64_t warmup_output_tokens = 0;
  std::int64_t warmup_input_tokens = 0;
  std::int64_t connections_opened = 0;
  std::int64_t sessions_cut = 0;  // agent dataset: sessions a failed turn ended early
};

struct bench_result {
  std::string label;       // the configuration's name in comparisons
  std::string base_url;
  std::string endpoint;    // "completions" or "chat"
  std::string model;
  std::string dataset;     // describe() of the dataset
  std::uint64_t seed = 0;
  bool reuse_prompts = false;  // every point sent the first point's prompts (--reuse-prompts)
  std::string slo;         // "" when none
  std::string started_at;  // UTC, ISO 8601
  std::vector<point_summary> points;
};

// One configuration of a comparison: its runs (one, or several of a benchmark repeated on a
// noisy machine), shown as their median and range. Its label is the first run's.
struct configuration {
  std::vector<bench_result> runs;  // at least one
  const std::string& label() const { return runs.front().label; }
};

std::string to_json(const bench_result& result);
result<bench_result> parse_result_json(std::string_view text);
result<bench_result> read_result_file(const std::filesystem::path& path);

std::string to_csv(const bench_result& result);

// vLLM's summary block for one point, in a box of fixed width.
std::string format_point_table(const bench_result& result, const point_summary& point);

// Rows: concurrency (or request rate); columns: one per configuration; last column: the first
// configuration against the second, in percent. A configuration of several runs shows their
// median with the range, and the percentage compares medians. A value from a point where a run
// measured a warm prefix cache (warm_cache) is marked with '*'. `metric` is a key of
// metric_names().
result<std::string> format_comparison(const std::vector<configuration>& configs, std::string_view metric);
// The metrics a comparison can show ("output_throughput", "ttft_median_ms", ...).
std::vector<std::string> metric_names();

// A self-contained HTML page (inline SVG, no script, nothing fetched): throughput and latency
// percentiles against concurrency for each configuration (the median of its runs), and the
// numbers of every result in tables. Points that measured a warm prefix cache are marked in
// both. Results of the agent dataset add the prompt-token cache hit ratio and TTFT by turn
// (charts and tables).
std::string html_report(const std::vector<configuration>& configs, std::string_view title);

status write_file(const std::filesystem::path& path, std::string_view contents);

}  // namespace edge::bench
