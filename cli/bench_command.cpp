// `edgeinfer bench`: a load generator for any OpenAI-compatible server (cli/bench/ holds the
// client, the statistics and the reports). Sweeps a list of concurrencies and/or request
// rates; prints vLLM's result block per point; writes JSON, CSV and an HTML report.
// `--compare a.json b.json ...` lays result files side by side instead of running.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <memory>

#include "commands.h"
#include "edge/bench/client.h"
#include "edge/bench/report.h"
#include "edge/bench/runner.h"
#include "edge/bench/stats.h"
#include "edge/bench/workload.h"
#include "edge/common/format.h"
#include "edge/common/log.h"

namespace edge::cli {
namespace {

using namespace std::chrono_literals;

constexpr std::int64_t max_concurrency = 1 << 16;
constexpr std::int64_t max_requests = std::int64_t{1} << 32;
constexpr std::int64_t max_length = 1 << 24;
constexpr std::int64_t max_sessions = 1 << 20;
constexpr std::int64_t max_turns = 1 << 16;

config::schema bench_options() {
  config::schema s;
  s.add_string("base-url", "http://127.0.0.1:8080", "The server: http://HOST:PORT (a trailing /v1 is fine)");
  s.add_string("api-key", std::nullopt, "Sent as 'Authorization: Bearer KEY'");
  s.add_string("model", std::nullopt, "The model id to send (required to run)");
  s.add_choice("endpoint", "completions", {"completions", "chat"},
               "completions: POST /v1/completions; chat: POST /v1/chat/completions");
  s.add_string("concurrency", "1", "Requests in flight, or a comma-separated sweep such as 1,8,16,32,64");
  s.add_string("request-rate", "inf",
               "Poisson arrivals at this many requests/s (a comma-separated sweep is allowed); inf sends as fast as "
               "--concurrency allows");
  s.add_integer("num-requests", 100, 1, max_requests, "Measured requests per point (unless --duration)");
  s.add_duration("duration", "0s", 0ms, 24h,
                 "Send new requests for this long per point instead of --num-requests (0: use the count)");
  s.add_integer("warmup-requests", 1, 0, max_requests, "Requests sent before each point and not measured");
  s.add_choice("dataset", "random", {"random", "conversation", "shared-prefix", "jsonl", "agent"},
               "random: uniform lengths; conversation: long-tailed chat-like lengths; shared-prefix: every prompt "
               "starts with a shared prefix (--shared-prefix-len), made to hit the server's prefix cache; jsonl: "
               "prompts from --prompts; agent: --sessions conversations of --turns turns, each turn resending the "
               "whole conversation so far (the answers included) plus a new user message");
  s.add_path("prompts", std::nullopt, "JSONL file of {\"prompt\": ...} or {\"messages\": [...]} (implies --dataset jsonl)");
  s.add_integer("input-len", 128, 1, max_length,
                "Prompt length in words (random: mean; conversation: median; shared-prefix: words after the prefix)");
  s.add_integer("output-len", 128, 1, max_length, "max_tokens per request (random: mean; conversation: median)");
  s.add_number("range-ratio", 0.0, 0.0, 0.99, "random, shared-prefix: lengths uniform in len * [1 - r, 1 + r]");
  s.add_integer("shared-prefix-len", 256, 1, max_length,
                "shared-prefix: words of the prefix every prompt starts with; --input-len words follow it");
  s.add_integer("shared-prefixes", 1, 1, bench::max_shared_prefixes,
                "shared-prefix: distinct prefixes; request i starts with prefix i mod this");
  s.add_integer("sessions", 50, 1, max_sessions, "agent: sessions per point, each running its turns in order");
  s.add_integer("turns", 20, 1, max_turns, "agent: turns per session");
  s.add_integer("system-prompt-len", 1000, 1, max_length,
                "agent: words of each session's system prompt and tool descriptions, which open its conversation");
  s.add_integer("turn-len-min", 300, 1, max_length, "agent: fewest words a turn's new user message adds");
  s.add_integer("turn-len-max", 1500, 1, max_length, "agent: most words a turn's new user message adds");
  s.add_boolean("session-affinity", true,
                "agent: send each request's session as the x-session-affinity header (a split gateway routes a "
                "session to the backend that holds it)");
  s.add_boolean("reuse-prompts", false,
                "Send every point of a sweep the first point's prompts (by default each point draws its own, so "
                "none finds an earlier point's prompts in the server's prefix cache)");
  s.add_integer("seed", 0, 0, std::numeric_limits<std::int64_t>::max(), "Seed of the prompts, lengths and arrivals");
  s.add_duration("timeout", "10m", 100ms, 24h, "A request still running after this long fails as a timeout");
  s.add_number("temperature", 0.0, 0.0, 2.0, "Sampling temperature sent with each request");
  s.add_boolean("ignore-eos", true, "Ask the server to generate max_tokens tokens (vLLM's ignore_eos)");
  s.add_string("goodput", std::nullopt, "SLOs for goodput in ms, e.g. --goodput ttft:500 tpot:50 (also itl, e2el)");
  s.add_string("label", std::nullopt, "Name of this configuration in result files and comparisons");
  s.add_path("output-json", std::nullopt, "Write the results as JSON here");
  s.add_path("output-csv", std::nullopt, "Write the results as CSV here (one row per point)");
  s.add_path("html", std::nullopt, "Write an HTML report with charts here (opens offline)");
  s.add_string("compare", std::nullopt,
               "Result JSON files to lay side by side (no benchmark is run); files joined by '+' are runs of one "
               "configuration, shown as their median and range");
  s.add_string("compare-metric", "output_throughput",
               "Metrics for --compare, comma-separated (output_throughput, ttft_median_ms, tpot_p99_ms, ...)");
  return s;
}

result<std::vector<std::int64_t>> parse_concurrency(std::string_view text) {
  std::vector<std::int64_t> out;
  for (const std::string& item : split_list(text)) {
    char* end = nullptr;
    const long long value = std::strtoll(item.c_str(), &end, 10);
    if (end != item.c_str() + item.size() || value < 1 || value > max_concurrency) {
      return invalid_argument(format("--concurrency: \"{}\" is not a whole number from 1 to {}", item, max_concurrency));
    }
    out.push_back(value);
  }
  if (out.empty()) return invalid_argument("--concurrency needs at least one value, e.g. 1,8,16");
  return out;
}

result<std::vector<double>> parse_rates(std::string_view text) {
  std::vector<double> out;
  for (const std::string& item : split_list(text)) {
    if (item == "inf") {
      out.push_back(bench::unlimited_rate);
      continue;
    }
    char* end = nullptr;
    const double value = std::strtod(item.c_str(), &end);
    if (end != item.c_str() + item.size() || !(value > 0) || !std::isfinite(value)) {
      return invalid_argument(format("--request-rate: \"{}\" is not a positive number of requests/s or inf", item));
    }
    out.push_back(value);
  }
  if (out.empty()) return invalid_argument("--request-rate needs a value, e.g. 4 or inf");
  return out;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm parts{};
  gmtime_r(&now, &parts);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &parts);
  return text;
}

// A one-line progress display on stderr, only on a terminal.
class request_progress {
 public:
  explicit request_progress(std::string label) : label_(std::move(label)), enabled_(::isatty(STDERR_FILENO) == 1) {}
  ~request_progress() {
    if (drawn_) std::fputc('\n', stderr);
  }
  void update(std::int64_t done, std::int64_t total, double elapsed_s) {
    constexpr int width = 30;
    constexpr auto redraw = 100ms;
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    if ((total == 0 || done < total) && now - last_ < redraw) return;
    last_ = now;
    if (total > 0) {
      const double fraction = static_cast<double>(done) / static_cast<double>(total);
      std::string bar(static_cast<std::size_t>(fraction * width), '#');
      bar.resize(width, '.');
      std::fprintf(stderr, "\r%s [%s] %lld/%lld requests, %.1f s", label_.c_str(), bar.c_str(),
                   static_cast<long long>(done), static_cast<long long>(total), elapsed_s);
    } else {
      std::fprintf(stderr, "\r%s %lld requests, %.1f s", label_.c_str(), static_cast<long long>(done), elapsed_s);
    }
    std::fflush(stderr);
    drawn_ = true;
  }

 private:
  std::string label_;
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_{};
};

// A one-line-per-point overview after a sweep.
std::string sweep_summary(const bench::bench_result& r) {
  std::string out =
      "\n  load        done  fail    req/s   out tok/s  TTFT p50  TTFT p99  TPOT p50  TPOT p99   E2EL p50   cached\n";
  for (const auto& p : r.points) {
    const auto& m = p.metrics;
    const std::string load = p.concurrency ? format("c={}", *p.concurrency)
                                           : (std::isinf(p.request_rate) ? "unbounded" : format("{} req/s", p.request_rate));
    const std::optional<double> share = m.cache.share();
    const std::string cached = share ? format("{:.1f}%{}", *share * 100, bench::warm_cache(m.cache) ? " *" : "") : "-";
    char line[256];
    std::snprintf(line, sizeof line, "  %-10s %5lld %5lld %8.2f %11.2f %9.1f %9.1f %9.2f %9.2f %10.1f %8s\n",
                  load.c_str(), static_cast<long long>(m.completed), static_cast<long long>(m.failed),
                  m.request_throughput, m.output_throughput, m.ttft_ms.median, m.ttft_ms.p99, m.tpot_ms.median,
                  m.tpot_ms.p99, m.e2el_ms.median, cached.c_str());
    out += line;
  }
  if (std::any_of(r.points.begin(), r.points.end(), [](const auto& p) { return bench::warm_cache(p.metrics.cache); })) {
    out += format("  (cached: prompt tokens the server's prefix cache served; * over {:.0f}%: a warm cache)\n",
                  bench::warm_cache_share * 100);
  }
  return out;
}

int run_compare(const config::values& settings) {
  // Each item is one configuration: a result file, or the files of its runs joined by '+'.
  std::vector<bench::configuration> results;
  for (const std::string& item : split_list(settings.string("compare"))) {
    bench::configuration config;
    for (const std::string& file : split_list(item, "+")) {
      auto read = bench::read_result_file(file);
      if (!read.ok()) {
        std::fprintf(stderr, "edgeinfer bench: %s\n", read.error().message().c_str());
        return 1;
      }
      config.runs.push_back(std::move(read).value());
    }
    if (!config.runs.empty()) results.push_back(std::move(config));
  }
  if (results.empty()) {
    std::fprintf(stderr, "edgeinfer bench: --compare needs result files\n");
    return 2;
  }
  std::string out;
  for (const std::string& metric : split_list(settings.string("compare-metric"))) {
    auto table = bench::format_comparison(results, metric);
    if (!table.ok()) {
      std::fprintf(stderr, "edgeinfer bench: --compare-metric: %s\n", table.error().message().c_str());
      return 2;
    }
    out += *table + "\n";
  }
  std::fputs(out.c_str(), stdout);
  if (auto html = settings.optional_string("html")) {
    std::string title = "edgeinfer bench:";
    for (std::size_t i = 0; i < results.size(); ++i) title += (i ? " vs " : " ") + results[i].label();
    if (status written = bench::write_file(*html, bench::html_report(results, title)); !written.ok()) {
      std::fprintf(stderr, "edgeinfer bench: %s\n", written.message().c_str());
      return 1;
    }
  }
  return 0;
}

int run_bench(const config::values& settings) {
  if (settings.has("compare")) return run_compare(settings);
  const logger log{"bench"};
  const auto usage_error = [](const std::string& message) {
    std::fprintf(stderr, "edgeinfer bench: %s\n", message.c_str());
    return 2;
  };

  auto url = bench::parse_base_url(settings.string("base-url"));
  if (!url.ok()) return usage_error(url.error().message());
  const auto model = settings.optional_string("model");
  if (!model || model->empty()) return usage_error("--model is required: the model id the server serves");
  auto concurrencies = parse_concurrency(settings.string("concurrency"));
  if (!concurrencies.ok()) return usage_error(concurrencies.error().message());
  auto rates = parse_rates(settings.string("request-rate"));
  if (!rates.ok()) return usage_error(rates.error().message());
  bench::slo objectives;
  if (auto goodput = settings.optional_string("goodput")) {
    auto parsed = bench::parse_slo(*goodput);
    if (!parsed.ok()) return usage_error(parsed.error().message());
    objectives = *parsed;
  }

  bench::dataset_options data_options;
  const std::string& kind = settings.string("dataset");
  data_options.kind = kind == "conversation"    ? bench::dataset_kind::conversation
                      : kind == "shared-prefix" ? bench::dataset_kind::shared_prefix
                      : kind == "jsonl"         ? bench::dataset_kind::jsonl
                      : kind == "agent"         ? bench::dataset_kind::agent
                                                : bench::dataset_kind::random;
  if (auto prompts = settings.optional_string("prompts")) {
    data_options.kind = bench::dataset_kind::jsonl;
    data_options.jsonl_path = *prompts;
  } else if (data_options.kind == bench::dataset_kind::jsonl) {
    return usage_error("--dataset jsonl needs --prompts FILE");
  }
  data_options.input_len = settings.integer("input-len");
  data_options.output_len = settings.integer("output-len");
  data_options.range_ratio = settings.number("range-ratio");
  for (const char* option : {"shared-prefix-len", "shared-prefixes"}) {
    if (data_options.kind != bench::dataset_kind::shared_prefix &&
        settings.source_of(option) != config::origin::default_value) {
      return usage_error(format("--{} applies to --dataset shared-prefix only", option));
    }
  }
  const bool agent = data_options.kind == bench::dataset_kind::agent;
  for (const char* option : {"sessions", "turns", "system-prompt-len", "turn-len-min", "turn-len-max", "session-affinity"}) {
    if (!agent && settings.source_of(option) != config::origin::default_value) {
      return usage_error(format("--{} applies to --dataset agent only", option));
    }
  }
  // An agent's requests follow its sessions: their number is sessions x turns, each session in
  // turn order, at most --concurrency at once.
  for (const char* option : {"input-len", "num-requests", "duration", "request-rate"}) {
    if (agent && settings.source_of(option) != config::origin::default_value) {
      return usage_error(format("--{} does not apply to --dataset agent (use --sessions, --turns, --system-prompt-len "
                                "and --turn-len-min/--turn-len-max)",
                                option));
    }
  }
  data_options.sessions = settings.integer("sessions");
  data_options.turns = settings.integer("turns");
  data_options.system_prompt_len = settings.integer("system-prompt-len");
  data_options.turn_len_min = settings.integer("turn-len-min");
  data_options.turn_len_max = settings.integer("turn-len-max");
  data_options.session_affinity = settings.boolean("session-affinity");
  data_options.shared_prefix_len = settings.integer("shared-prefix-len");
  data_options.shared_prefixes = settings.integer("shared-prefixes");
  data_options.seed = static_cast<std::uint64_t>(settings.integer("seed"));

  bench::client_options client;
  client.url = *url;
  client.endpoint = settings.string("endpoint") == "chat" ? bench::api_endpoint::chat_completions
                                                          : bench::api_endpoint::completions;
  client.api_key = settings.optional_string("api-key").value_or("");
  client.model = *model;
  client.temperature = settings.number("temperature");
  client.ignore_eos = settings.boolean("ignore-eos");
  client.timeout = settings.duration("timeout");

  // Generated requests fit the model's context where the server says what it is.
  const bool generated = !agent && data_options.kind != bench::dataset_kind::jsonl;
  if (generated) {
    if (const auto context = bench::served_context(client)) {
      data_options.context = *context;
      // How many tokens a prompt word is to this server's tokenizer, where it can say.
      constexpr std::int64_t sample_words = 200;
      if (const auto tokens = bench::served_token_count(client, bench::word_sample(sample_words))) {
        data_options.tokens_per_word = static_cast<double>(*tokens) / static_cast<double>(sample_words);
      }
      log.info("the server serves {} with a context of {} tokens ({:.2f} tokens a prompt word): longer requests are cut "
               "to fit",
               *model, *context, data_options.tokens_per_word);
    }
  }
  auto data = bench::dataset::create(data_options);
  if (!data.ok()) return usage_error(data.error().message());

  bench::bench_result result;
  result.label = settings.optional_string("label").value_or(*model);
  result.base_url = settings.string("base-url");
  result.endpoint = settings.string("endpoint");
  result.model = *model;
  result.dataset = data->describe();
  result.seed = data_options.seed;
  result.reuse_prompts = settings.boolean("reuse-prompts");
  result.slo = objectives.empty() ? "" : bench::to_string(objectives);
  result.started_at = utc_now();

  const auto write_outputs = [&]() -> bool {
    const auto write = [&](std::string_view option, const std::string& contents) {
      const auto path = settings.optional_string(option);
      if (!path) return true;
      if (status written = bench::write_file(*path, contents); !written.ok()) {
        log.error("{}", written.message());
        return false;
      }
      return true;
    };
    return write("output-json", bench::to_json(result)) && write("output-csv", bench::to_csv(result)) &&
           write("html", bench::html_report({bench::configuration{{result}}}, "edgeinfer bench: " + result.label));
  };

  // One point per (rate, concurrency); with a finite rate and the default concurrency of 1
  // left unset, arrivals are not capped (vLLM's --max-concurrency is unset by default).
  const bool cap_open_loop = settings.source_of("concurrency") != config::origin::default_value;
  log.info("benchmarking {} at {} ({}, endpoint {})", *model, settings.string("base-url"), result.dataset,
           result.endpoint);
  bool every_point_completed = true;
  std::size_t sent_before = 0;  // measured requests of the earlier points
  for (const double rate : *rates) {
    const bool open_loop = !std::isinf(rate);
    const std::vector<std::int64_t> limits = open_loop && !cap_open_loop ? std::vector<std::int64_t>{0} : *concurrencies;
    for (const std::int64_t limit : limits) {
      bench::point_options point;
      if (limit > 0) point.concurrency = limit;
      point.request_rate = rate;
      point.num_requests = settings.integer("num-requests");
      if (settings.duration("duration") > 0ms) point.duration = settings.duration("duration");
      point.warmup_requests = settings.integer("warmup-requests");
      point.seed = data_options.seed;
      point.first_request = result.reuse_prompts ? 0 : data->point_start(result.points.size(), sent_before);
      const std::string name = limit > 0 ? format("c={}", limit) : format("{} req/s", rate);
      bench::point_result measured;
      {
        request_progress progress(name);
        const auto report = [&progress](std::int64_t done, std::int64_t total, double elapsed) {
          progress.update(done, total, elapsed);
        };
        measured = agent ? bench::run_sessions(client, *data, point, report)
                         : bench::run_point(client, *data, point, report);
      }
      if (const std::size_t cut = data->cut_to_context(point.first_request, measured.records.size()); cut > 0) {
        log.warn("{}: {} of {} requests were cut to fit the context of {} tokens (a prompt word counted as a token; "
                 "lower --input-len or --output-len to send them whole)",
                 name, cut, measured.records.size(), data_options.context);
      }
      sent_before += measured.records.size();
      if (measured.warmup_failed > 0) {
        log.warn("{}: {} of {} warm-up requests failed", name, measured.warmup_failed, point.warmup_requests);
      }
      bench::point_summary summary;
      summary.concurrency = point.concurrency;
      summary.request_rate = rate;
      summary.metrics = bench::compute_metrics(measured.records, measured.duration_s, objectives);
      summary.warmup_requests = point.warmup_requests;
      summary.warmup_input_tokens = measured.warmup_input_tokens;
      summary.warmup_output_tokens = measured.warmup_output_tokens;
      summary.connections_opened = measured.connections_opened;
      summary.sessions_cut = measured.sessions_cut;
      if (measured.sessions_cut > 0) {
        log.warn("{}: a failed turn ended {} of {} sessions early", name, measured.sessions_cut, data_options.sessions);
      }
      for (const auto& r : measured.records) {
        if (!r.success) log.debug("{} failed: {}: {}", name, r.error, r.error_detail);
      }
      if (summary.metrics.failed > 0) {
        for (const auto& r : measured.records) {
          if (r.success) continue;
          log.warn("{}: {} requests failed; first: {}: {}", name, summary.metrics.failed, r.error, r.error_detail);
          break;
        }
      }
      if (summary.metrics.completed == 0) every_point_completed = false;
      if (bench::warm_cache(summary.metrics.cache) && !result.reuse_prompts &&
          data_options.kind != bench::dataset_kind::shared_prefix && !agent) {
        log.warn("{}: {} of {} prompt tokens came from the server's prefix cache (its prompts came round again, or "
                 "another client sent them)",
                 name, summary.metrics.cache.cached_tokens, summary.metrics.cache.prompt_tokens);
      }
      result.points.push_back(summary);
      std::fputs(bench::format_point_table(result, result.points.back()).c_str(), stdout);
      std::fflush(stdout);
      if (!write_outputs()) return 1;
    }
  }
  if (result.points.size() > 1) std::fputs(sweep_summary(result).c_str(), stdout);
  if (!every_point_completed) {
    log.error("no request completed at some point of the sweep; is the server at {} serving \"{}\"?",
              settings.string("base-url"), *model);
    return 1;
  }
  return 0;
}

}  // namespace

command make_bench_command(CLI::App& app) {
  command bench(app, "bench", "Measure an OpenAI-compatible server: throughput, TTFT, TPOT, ITL, goodput",
                bench_options(), run_bench);
  // Several values after one flag: `--goodput ttft:500 tpot:50`, `--compare a.json b.json`.
  for (const char* name : {"--goodput", "--compare"}) {
    bench.app()
        .get_option(name)
        ->expected(1, CLI::detail::expected_max_vector_size)
        ->allow_extra_args(true)
        ->multi_option_policy(CLI::MultiOptionPolicy::Join);
  }
  return bench;
}

}  // namespace edge::cli
