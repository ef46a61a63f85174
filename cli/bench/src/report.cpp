#include "edge/bench/report.h"

#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>

#include "edge/bench/workload.h"
#include "edge/common/format.h"

namespace edge::bench {
namespace {

namespace json = boost::json;

constexpr std::string_view format_tag = "edgeinfer-bench/1";

// ---- JSON ---------------------------------------------------------------------------------

json::object distribution_json(const distribution& d) {
  return {{"count", d.count}, {"mean", d.mean}, {"std", d.std}, {"median", d.median}, {"p90", d.p90},
          {"p99", d.p99},     {"min", d.min},   {"max", d.max}};
}

double number_of(const json::value* v) {
  if (v == nullptr) return 0;
  if (v->is_double()) return v->as_double();
  if (v->is_int64()) return static_cast<double>(v->as_int64());
  if (v->is_uint64()) return static_cast<double>(v->as_uint64());
  return 0;
}

std::int64_t integer_of(const json::value* v) { return static_cast<std::int64_t>(std::llround(number_of(v))); }

std::string string_of(const json::value* v) { return v && v->is_string() ? std::string(v->as_string()) : std::string(); }

distribution distribution_from(const json::value* v) {
  distribution d;
  if (v == nullptr || !v->is_object()) return d;
  const json::object& o = v->as_object();
  d.count = static_cast<std::size_t>(integer_of(o.if_contains("count")));
  d.mean = number_of(o.if_contains("mean"));
  d.std = number_of(o.if_contains("std"));
  d.median = number_of(o.if_contains("median"));
  d.p90 = number_of(o.if_contains("p90"));
  d.p99 = number_of(o.if_contains("p99"));
  d.min = number_of(o.if_contains("min"));
  d.max = number_of(o.if_contains("max"));
  return d;
}

// ---- metric lookup ------------------------------------------------------------------------

struct metric_info {
  std::string key;
  std::string title;
  std::function<std::optional<double>(const run_metrics&)> get;
  bool higher_is_better = true;
  bool whole_number = false;  // a count: shown without decimals
};

std::vector<metric_info> all_metrics() {
  std::vector<metric_info> out = {
      {"output_throughput", "Output token throughput (tok/s)", [](const run_metrics& m) { return m.output_throughput; }},
      {"total_token_throughput", "Total token throughput (tok/s)",
       [](const run_metrics& m) { return m.total_token_throughput; }},
      {"request_throughput", "Request throughput (req/s)", [](const run_metrics& m) { return m.request_throughput; }},
      {"goodput", "Request goodput (req/s)", [](const run_metrics& m) { return m.goodput; }},
      {"completed", "Completed requests",
       [](const run_metrics& m) -> std::optional<double> { return static_cast<double>(m.completed); }, true, true},
      {"failed", "Failed requests",
       [](const run_metrics& m) -> std::optional<double> { return static_cast<double>(m.failed); }, false, true},
      {"cached_prompt_share", "Prompt tokens from the prefix cache (%)",
       [](const run_metrics& m) -> std::optional<double> {
         const std::optional<double> share = m.cache.share();
         if (!share) return std::nullopt;
         return *share * 100;
       },
       false},
  };
  const std::array<std::pair<std::string_view, distribution run_metrics::*>, 4> latencies = {{
      {"ttft", &run_metrics::ttft_ms}, {"tpot", &run_metrics::tpot_ms}, {"itl", &run_metrics::itl_ms},
      {"e2el", &run_metrics::e2el_ms}}};
  const std::array<std::pair<std::string_view, double distribution::*>, 4> stats = {{
      {"mean", &distribution::mean}, {"median", &distribution::median}, {"p90", &distribution::p90},
      {"p99", &distribution::p99}}};
  for (const auto& [name, member] : latencies) {
    for (const auto& [stat, field] : stats) {
      std::string upper(name);
      std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
      out.push_back({format("{}_{}_ms", name, stat), format("{} {} (ms)", upper, stat),
                     [member, field](const run_metrics& m) -> std::optional<double> {
                       const distribution& d = m.*member;
                       if (d.count == 0) return std::nullopt;
                       return d.*field;
                     },
                     false});
    }
  }
  return out;
}

const metric_info* find_metric(const std::vector<metric_info>& metrics, std::string_view key) {
  for (const auto& m : metrics) {
    if (m.key == key) return &m;
  }
  return nullptr;
}

// ---- points across results ----------------------------------------------------------------

// The row a point belongs to: its concurrency, else its request rate.
std::string point_key(const point_summary& p) {
  if (p.concurrency) return format("{}", *p.concurrency);
  if (std::isinf(p.request_rate)) return "unbounded";
  return format("{} req/s", p.request_rate);
}

double point_order(const point_summary& p) {
  if (p.concurrency) return static_cast<double>(*p.concurrency);
  return std::isinf(p.request_rate) ? 1e300 : 1e12 + p.request_rate;
}

std::vector<std::string> point_keys(const std::vector<bench_result>& results) {
  std::vector<std::pair<double, std::string>> keys;
  for (const auto& r : results) {
    for (const auto& p : r.points) {
      std::pair<double, std::string> key{point_order(p), point_key(p)};
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(std::move(key));
    }
  }
  std::sort(keys.begin(), keys.end());
  std::vector<std::string> out;
  for (auto& k : keys) out.push_back(std::move(k.second));
  return out;
}

const point_summary* find_point(const bench_result& r, std::string_view key) {
  for (const auto& p : r.points) {
    if (point_key(p) == key) return &p;
  }
  return nullptr;
}

// Every run of every configuration, for what is common to all of them (the rows, the axis).
std::vector<bench_result> all_runs(const std::vector<configuration>& configs) {
  std::vector<bench_result> out;
  for (const configuration& c : configs) out.insert(out.end(), c.runs.begin(), c.runs.end());
  return out;
}

bool by_concurrency(const std::vector<bench_result>& results) {
  return std::all_of(results.begin(), results.end(), [](const bench_result& r) {
    return std::all_of(r.points.begin(), r.points.end(), [](const point_summary& p) { return p.concurrency.has_value(); });
  });
}

// One metric at one point over a configuration's runs.
struct run_values {
  std::vector<double> sorted;  // [runs that measured it], ascending
  std::optional<double> median() const {
    if (sorted.empty()) return std::nullopt;
    return percentile(sorted, 50);
  }
};

run_values values_at(const configuration& c, std::string_view key,
                     const std::function<std::optional<double>(const run_metrics&)>& get) {
  run_values out;
  for (const bench_result& r : c.runs) {
    const point_summary* p = find_point(r, key);
    if (p == nullptr) continue;
    if (const std::optional<double> v = get(p->metrics)) out.sorted.push_back(*v);
  }
  std::sort(out.sorted.begin(), out.sorted.end());
  return out;
}

// Whether any run of the configuration measured a warm prefix cache at this point.
bool warm_at(const configuration& c, std::string_view key) {
  return std::any_of(c.runs.begin(), c.runs.end(), [&](const bench_result& r) {
    const point_summary* p = find_point(r, key);
    return p != nullptr && warm_cache(p->metrics.cache);
  });
}

std::string fixed(double v, int digits) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(digits);
  s << v;
  return s.str();
}

// Two decimals below 100, one below 10000, none above: readable in a narrow column.
std::string readable(double v) {
  const double a = std::fabs(v);
  return fixed(v, a < 100 ? 2 : a < 10000 ? 1 : 0);
}

std::string html_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// ---- SVG charts ---------------------------------------------------------------------------

struct chart_series {
  std::string name;
  std::vector<std::optional<double>> values;  // [x categories]
  std::string color;
  bool dashed = false;
  std::vector<bool> warm;  // [x categories] or empty: points that measured a warm prefix cache, ringed
};

constexpr std::array<std::string_view, 8> palette = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                                     "#9467bd", "#8c564b", "#e377c2", "#17becf"};
// Rings and table rows of points that measured a warm prefix cache.
constexpr std::string_view warm_color = "#b8860b";

// The smallest 1, 2 or 5 times a power of ten at or above v.
double nice_ceiling(double v) {
  if (v <= 0) return 1;
  const double magnitude = std::pow(10.0, std::floor(std::log10(v)));
  for (double step : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (step * magnitude >= v) return step * magnitude;
  }
  return 10 * magnitude;
}

std::string svg_chart(std::string_view id, std::string_view title, std::string_view y_label,
                      std::string_view x_label, const std::vector<std::string>& x, const std::vector<chart_series>& series) {
  constexpr double width = 560, height = 340, left = 70, right = 20, top = 40, bottom = 80;
  constexpr int y_ticks = 5;
  const double plot_w = width - left - right, plot_h = height - top - bottom;
  double max_value = 0;
  for (const auto& s : series) {
    for (const auto& v : s.values) {
      if (v) max_value = std::max(max_value, *v);
    }
  }
  const double y_max = nice_ceiling(max_value * 1.05);
  const auto px = [&](std::size_t i) {
    return x.size() <= 1 ? left + plot_w / 2 : left + plot_w * static_cast<double>(i) / static_cast<double>(x.size() - 1);
  };
  const auto py = [&](double v) { return top + plot_h * (1 - v / y_max); };

  std::string svg = format(
      "<svg id=\"{}\" class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "viewBox=\"0 0 {} {}\" role=\"img\" aria-label=\"{}\">\n",
      id, width, height, width, height, html_escape(title));
  svg += format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n", width, height);
  svg += format("<text x=\"{}\" y=\"22\" text-anchor=\"middle\" class=\"title\">{}</text>\n", width / 2,
                html_escape(title));
  for (int t = 0; t <= y_ticks; ++t) {
    const double v = y_max * t / y_ticks;
    svg += format("<line class=\"grid\" x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\"/>", left, left + plot_w, py(v), py(v));
    const std::string tick = v == std::floor(v) ? format("{}", static_cast<long long>(v)) : readable(v);
    svg += format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\" class=\"tick\">{}</text>\n", left - 6, py(v) + 4, tick);
  }
  for (std::size_t i = 0; i < x.size(); ++i) {
    svg += format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" class=\"tick\">{}</text>", px(i), top + plot_h + 16,
                  html_escape(x[i]));
  }
  svg += format("<line class=\"axis\" x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\"/>", left, left + plot_w, top + plot_h,
                top + plot_h);
  svg += format("<line class=\"axis\" x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\"/>\n", left, left, top, top + plot_h);
  svg += format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" class=\"label\">{}</text>\n", left + plot_w / 2,
                top + plot_h + 34, html_escape(x_label));
  svg += format("<text transform=\"translate(16 {}) rotate(-90)\" text-anchor=\"middle\" class=\"label\">{}</text>\n",
                top + plot_h / 2, html_escape(y_label));
  for (const auto& s : series) {
    std::string points;
    std::string dots;
    for (std::size_t i = 0; i < s.values.size() && i < x.size(); ++i) {
      if (!s.values[i]) continue;
      points += format("{:.1f},{:.1f} ", px(i), py(*s.values[i]));
      const bool warm = i < s.warm.size() && s.warm[i];
      dots += format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\"><title>{}: {}{}</title></circle>", px(i),
                     py(*s.values[i]), s.color, html_escape(s.name), readable(*s.values[i]),
                     warm ? " (warm prefix cache)" : "");
      if (warm) {
        dots += format("<circle class=\"warm\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"7\" fill=\"none\" stroke=\"{}\" "
                       "stroke-width=\"1.5\"/>",
                       px(i), py(*s.values[i]), warm_color);
      }
    }
    svg += format("<polyline class=\"series\" data-series=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2.5\"{} "
                  "points=\"{}\"/>{}\n",
                  html_escape(s.name), s.color, s.dashed ? " stroke-dasharray=\"6 4\"" : "", points, dots);
  }
  // Legend: two columns under the axis label.
  for (std::size_t i = 0; i < series.size(); ++i) {
    const double lx = left + static_cast<double>(i % 2) * plot_w / 2;
    const double ly = top + plot_h + 52 + static_cast<double>(i / 2) * 14;
    svg += format("<line x1=\"{}\" x2=\"{}\" y1=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"2.5\"{}/>", lx, lx + 18,
                  ly - 4, ly - 4, series[i].color, series[i].dashed ? " stroke-dasharray=\"6 4\"" : "");
    svg += format("<text x=\"{}\" y=\"{}\" class=\"legend\">{}</text>\n", lx + 24, ly, html_escape(series[i].name));
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace

// ---- JSON ---------------------------------------------------------------------------------

std::string to_json(const bench_result& result) {
  json::array points;
  for (const point_summary& p : result.points) {
    const run_metrics& m = p.metrics;
    json::object failures;
    for (const auto& [category, count] : m.failures) failures[category] = count;
    json::object o;
    o["concurrency"] = p.concurrency ? json::value(*p.concurrency) : json::value(nullptr);
    o["request_rate"] = std::isinf(p.request_rate) ? json::value(nullptr) : json::value(p.request_rate);
    o["completed"] = m.completed;
    o["failed"] = m.failed;
    o["failures"] = std::move(failures);
    o["duration_s"] = m.duration_s;
    o["total_input_tokens"] = m.total_input_tokens;
    o["total_output_tokens"] = m.total_output_tokens;
    o["request_throughput"] = m.request_throughput;
    o["output_throughput"] = m.output_throughput;
    o["total_token_throughput"] = m.total_token_throughput;
    o["goodput"] = m.goodput ? json::value(*m.goodput) : json::value(nullptr);
    o["good_requests"] = m.good_requests;
    o["ttft_ms"] = distribution_json(m.ttft_ms);
    o["tpot_ms"] = distribution_json(m.tpot_ms);
    o["itl_ms"] = distribution_json(m.itl_ms);
    o["e2el_ms"] = distribution_json(m.e2el_ms);
    o["token_check"] = json::object{{"requests_with_usage", m.tokens.requests_with_usage},
                                    {"usage_completion_tokens", m.tokens.usage_completion_tokens},
                                    {"client_completion_tokens", m.tokens.client_completion_tokens},
                                    {"mismatched_requests", m.tokens.mismatched_requests},
                                    {"more_deltas_requests", m.tokens.more_deltas_requests}};
    const std::optional<double> share = m.cache.share();
    o["prompt_cache"] = json::object{{"requests_reporting", m.cache.requests_reporting},
                                     {"prompt_tokens", m.cache.prompt_tokens},
                                     {"cached_tokens", m.cache.cached_tokens},
                                     {"share", share ? json::value(*share) : json::value(nullptr)}};
    o["warmup"] = json::object{{"requests", p.warmup_requests},
                               {"input_tokens", p.warmup_input_tokens},
                               {"output_tokens", p.warmup_output_tokens}};
    o["connections_opened"] = p.connections_opened;
    if (!m.by_turn.empty()) {
      // Turns are numbered from 1 here, as people count them.
      json::array turns;
      for (const turn_metrics& t : m.by_turn) {
        const std::optional<double> turn_share = t.cache.share();
        turns.push_back(json::object{{"turn", t.turn + 1},
                                     {"completed", t.completed},
                                     {"requests_reporting", t.cache.requests_reporting},
                                     {"prompt_tokens", t.cache.prompt_tokens},
                                     {"cached_tokens", t.cache.cached_tokens},
                                     {"share", turn_share ? json::value(*turn_share) : json::value(nullptr)},
                                     {"ttft_ms", distribution_json(t.ttft_ms)}});
      }
      o["turns"] = std::move(turns);
      o["sessions_cut"] = p.sessions_cut;
    }
    points.push_back(std::move(o));
  }
  json::object root;
  root["format"] = format_tag;
  root["label"] = result.label;
  root["base_url"] = result.base_url;
  root["endpoint"] = result.endpoint;
  root["model"] = result.model;
  root["dataset"] = result.dataset;
  root["seed"] = result.seed;
  root["prompts"] = result.reuse_prompts ? "reused" : "per_point";
  root["slo"] = result.slo;
  root["started_at"] = result.started_at;
  root["points"] = std::move(points);
  return json::serialize(root) + "\n";
}

result<bench_result> parse_result_json(std::string_view text) {
  boost::system::error_code ec;
  const json::value v = json::parse(text, ec);
  if (ec || !v.is_object()) return invalid_argument("not a JSON object");
  const json::object& root = v.as_object();
  if (string_of(root.if_contains("format")) != format_tag) {
    return invalid_argument(format("not an edgeinfer bench result (\"format\" is not \"{}\")", format_tag));
  }
  bench_result r;
  r.label = string_of(root.if_contains("label"));
  r.base_url = string_of(root.if_contains("base_url"));
  r.endpoint = string_of(root.if_contains("endpoint"));
  r.model = string_of(root.if_contains("model"));
  r.dataset = string_of(root.if_contains("dataset"));
  r.seed = static_cast<std::uint64_t>(integer_of(root.if_contains("seed")));
  // Files written before "prompts" was: every point sent the first point's prompts.
  r.reuse_prompts = string_of(root.if_contains("prompts")) != "per_point";
  r.slo = string_of(root.if_contains("slo"));
  r.started_at = string_of(root.if_contains("started_at"));
  const json::value* points = root.if_contains("points");
  if (points == nullptr || !points->is_array()) return invalid_argument("\"points\" is missing");
  for (const json::value& item : points->as_array()) {
    if (!item.is_object()) return invalid_argument("a point is not an object");
    const json::object& o = item.as_object();
    point_summary p;
    if (const json::value* c = o.if_contains("concurrency"); c && !c->is_null()) p.concurrency = integer_of(c);
    const json::value* rate = o.if_contains("request_rate");
    p.request_rate = rate == nullptr || rate->is_null() ? unlimited_rate : number_of(rate);
    run_metrics& m = p.metrics;
    m.completed = integer_of(o.if_contains("completed"));
    m.failed = integer_of(o.if_contains("failed"));
    if (const json::value* f = o.if_contains("failures"); f && f->is_object()) {
      for (const auto& [key, count] : f->as_object()) m.failures[std::string(key)] = integer_of(&count);
    }
    m.duration_s = number_of(o.if_contains("duration_s"));
    m.total_input_tokens = integer_of(o.if_contains("total_input_tokens"));
    m.total_output_tokens = integer_of(o.if_contains("total_output_tokens"));
    m.request_throughput = number_of(o.if_contains("request_throughput"));
    m.output_throughput = number_of(o.if_contains("output_throughput"));
    m.total_token_throughput = number_of(o.if_contains("total_token_throughput"));
    if (const json::value* g = o.if_contains("goodput"); g && !g->is_null()) m.goodput = number_of(g);
    m.good_requests = integer_of(o.if_contains("good_requests"));
    m.ttft_ms = distribution_from(o.if_contains("ttft_ms"));
    m.tpot_ms = distribution_from(o.if_contains("tpot_ms"));
    m.itl_ms = distribution_from(o.if_contains("itl_ms"));
    m.e2el_ms = distribution_from(o.if_contains("e2el_ms"));
    if (const json::value* t = o.if_contains("token_check"); t && t->is_object()) {
      const json::object& tc = t->as_object();
      m.tokens.requests_with_usage = integer_of(tc.if_contains("requests_with_usage"));
      m.tokens.usage_completion_tokens = integer_of(tc.if_contains("usage_completion_tokens"));
      m.tokens.client_completion_tokens = integer_of(tc.if_contains("client_completion_tokens"));
      m.tokens.mismatched_requests = integer_of(tc.if_contains("mismatched_requests"));
      m.tokens.more_deltas_requests = integer_of(tc.if_contains("more_deltas_requests"));
    }
    if (const json::value* c = o.if_contains("prompt_cache"); c && c->is_object()) {
      const json::object& pc = c->as_object();
      m.cache.requests_reporting = integer_of(pc.if_contains("requests_reporting"));
      m.cache.prompt_tokens = integer_of(pc.if_contains("prompt_tokens"));
      m.cache.cached_tokens = integer_of(pc.if_contains("cached_tokens"));
    }
    if (const json::value* w = o.if_contains("warmup"); w && w->is_object()) {
      p.warmup_requests = integer_of(w->as_object().if_contains("requests"));
      p.warmup_input_tokens = integer_of(w->as_object().if_contains("input_tokens"));
      p.warmup_output_tokens = integer_of(w->as_object().if_contains("output_tokens"));
    }
    p.connections_opened = integer_of(o.if_contains("connections_opened"));
    p.sessions_cut = integer_of(o.if_contains("sessions_cut"));
    if (const json::value* turns = o.if_contains("turns"); turns && turns->is_array()) {
      for (const json::value& turn_item : turns->as_array()) {
        if (!turn_item.is_object()) return invalid_argument("a turn is not an object");
        const json::object& t = turn_item.as_object();
        turn_metrics tm;
        tm.turn = integer_of(t.if_contains("turn")) - 1;
        tm.completed = integer_of(t.if_contains("completed"));
        tm.cache.requests_reporting = integer_of(t.if_contains("requests_reporting"));
        tm.cache.prompt_tokens = integer_of(t.if_contains("prompt_tokens"));
        tm.cache.cached_tokens = integer_of(t.if_contains("cached_tokens"));
        tm.ttft_ms = distribution_from(t.if_contains("ttft_ms"));
        m.by_turn.push_back(tm);
      }
    }
    r.points.push_back(std::move(p));
  }
  return r;
}

result<bench_result> read_result_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(format("cannot read {}", path.string()));
  std::stringstream text;
  text << in.rdbuf();
  auto parsed = parse_result_json(text.str());
  if (!parsed.ok()) return invalid_argument(format("{}: {}", path.string(), parsed.error().message()));
  if (parsed->label.empty()) parsed->label = path.stem().string();
  return parsed;
}

status write_file(const std::filesystem::path& path, std::string_view contents) {
  if (path.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(path.parent_path(), ec);
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return invalid_argument(format("cannot write {}", path.string()));
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  if (!out.flush()) return invalid_argument(format("cannot write {}", path.string()));
  return {};
}

// ---- CSV ----------------------------------------------------------------------------------

std::string to_csv(const bench_result& result) {
  std::string out =
      "label,concurrency,request_rate,completed,failed,duration_s,total_input_tokens,total_output_tokens,"
      "request_throughput,output_throughput,total_token_throughput,goodput";
  for (const char* name : {"ttft", "tpot", "itl", "e2el"}) {
    out += format(",{}_mean_ms,{}_median_ms,{}_p90_ms,{}_p99_ms", name, name, name, name);
  }
  out += ",usage_completion_tokens,client_completion_tokens,mismatched_requests,more_deltas_requests,"
         "cache_reporting_requests,cached_prompt_tokens,cached_prompt_share\n";
  std::string label = result.label;
  std::replace(label.begin(), label.end(), ',', ';');
  for (const point_summary& p : result.points) {
    const run_metrics& m = p.metrics;
    out += format("{},{},{},{},{},{:.3f},{},{},{:.4f},{:.3f},{:.3f},{}", label,
                  p.concurrency ? format("{}", *p.concurrency) : "",
                  std::isinf(p.request_rate) ? "inf" : format("{}", p.request_rate), m.completed, m.failed,
                  m.duration_s, m.total_input_tokens, m.total_output_tokens, m.request_throughput, m.output_throughput,
                  m.total_token_throughput, m.goodput ? format("{:.4f}", *m.goodput) : "");
    for (const distribution* d : {&m.ttft_ms, &m.tpot_ms, &m.itl_ms, &m.e2el_ms}) {
      out += format(",{:.3f},{:.3f},{:.3f},{:.3f}", d->mean, d->median, d->p90, d->p99);
    }
    const std::optional<double> share = m.cache.share();
    out += format(",{},{},{},{},{},{},{}\n", m.tokens.usage_completion_tokens, m.tokens.client_completion_tokens,
                  m.tokens.mismatched_requests, m.tokens.more_deltas_requests, m.cache.requests_reporting,
                  m.cache.cached_tokens, share ? format("{:.4f}", *share) : "");
  }
  return out;
}

// ---- terminal -----------------------------------------------------------------------------

std::string format_point_table(const bench_result& result, const point_summary& point) {
  constexpr std::size_t width = 58;
  constexpr std::size_t label_width = 42;
  const run_metrics& m = point.metrics;
  std::string out;
  const auto banner = [&](std::string_view title, char fill) {
    const std::size_t pad = width > title.size() ? width - title.size() : 0;
    out += std::string(pad / 2, fill) + std::string(title) + std::string(pad - pad / 2, fill) + "\n";
  };
  const auto row = [&](std::string_view label, const std::string& value) {
    std::string line(label);
    if (line.size() < label_width) line.resize(label_width, ' ');
    out += line + value + "\n";
  };
  // A remark under the rows, in words wrapped to the table's width.
  const auto note = [&](std::string_view text) {
    std::string line;
    std::istringstream words{std::string(text)};
    for (std::string word; words >> word;) {
      if (!line.empty() && line.size() + 1 + word.size() > width) {
        out += line + "\n";
        line.clear();
      }
      line += (line.empty() ? "" : " ") + word;
    }
    if (!line.empty()) out += line + "\n";
  };
  banner(" Serving Benchmark Result ", '=');
  if (!result.label.empty()) row("Configuration:", result.label);
  row("Concurrency:", point.concurrency ? format("{}", *point.concurrency) : "unbounded");
  row("Request rate (req/s):", std::isinf(point.request_rate) ? "inf" : readable(point.request_rate));
  row("Successful requests:", format("{}", m.completed));
  std::string failed = format("{}", m.failed);
  if (!m.failures.empty()) {
    failed += " (";
    bool first = true;
    for (const auto& [category, count] : m.failures) {
      failed += format("{}{}: {}", first ? "" : ", ", category, count);
      first = false;
    }
    failed += ")";
  }
  row("Failed requests:", failed);
  row("Benchmark duration (s):", fixed(m.duration_s, 2));
  row("Total input tokens:", format("{}", m.total_input_tokens));
  row("Total generated tokens:", format("{}", m.total_output_tokens));
  row("Request throughput (req/s):", fixed(m.request_throughput, 2));
  if (m.goodput) row("Request goodput (req/s):", fixed(*m.goodput, 2));
  row("Output token throughput (tok/s):", fixed(m.output_throughput, 2));
  row("Total token throughput (tok/s):", fixed(m.total_token_throughput, 2));
  const auto section = [&](std::string_view title, std::string_view name, const distribution& d) {
    banner(title, '-');
    row(format("Mean {} (ms):", name), fixed(d.mean, 2));
    row(format("Median {} (ms):", name), fixed(d.median, 2));
    row(format("P90 {} (ms):", name), fixed(d.p90, 2));
    row(format("P99 {} (ms):", name), fixed(d.p99, 2));
  };
  section("Time to First Token", "TTFT", m.ttft_ms);
  section("Time per Output Token (excl. 1st token)", "TPOT", m.tpot_ms);
  section("Inter-token Latency", "ITL", m.itl_ms);
  section("End-to-end Latency", "E2EL", m.e2el_ms);
  banner("Token counts: client vs server usage", '-');
  row("Requests with usage:", format("{}", m.tokens.requests_with_usage));
  row("Output tokens (usage / content deltas):",
      format("{} / {}", m.tokens.usage_completion_tokens, m.tokens.client_completion_tokens));
  row("Requests where they differ:", format("{}", m.tokens.mismatched_requests));
  const std::int64_t fewer = m.tokens.mismatched_requests - m.tokens.more_deltas_requests;
  if (m.tokens.mismatched_requests > 0) {
    row("  with fewer deltas than tokens:", format("{}", fewer));
    row("  with more deltas than tokens:", format("{}", m.tokens.more_deltas_requests));
  }
  if (fewer > 0) {
    note("(Fewer is expected: a token that prints nothing, such as BOS or EOS, sends no delta, and a character "
         "split across tokens arrives in one delta. Token counts and TPOT use the usage.)");
  }
  if (m.tokens.more_deltas_requests > 0) {
    note("(More means the server's usage counts fewer tokens than it streamed: its usage is wrong.)");
  }
  banner("Prefix cache (server usage)", '-');
  row("Prompts:", result.reuse_prompts ? "the first point's, at every point" : "drawn for this point");
  const std::optional<double> share = m.cache.share();
  row("Cached prompt tokens:", share ? format("{} of {} ({}%)", m.cache.cached_tokens, m.cache.prompt_tokens,
                                              fixed(*share * 100, 1))
                                     : std::string("not reported by the server"));
  if (warm_cache(m.cache)) {
    note(format("(Over {}% of the prompt tokens came from the server's prefix cache: TTFT and throughput at "
                "this point measure a warm cache.)",
                fixed(warm_cache_share * 100, 0)));
  }
  if (!m.by_turn.empty()) {
    banner("Agent sessions by turn", '-');
    row("Sessions ended by a failed turn:", format("{}", point.sessions_cut));
    char line[128];
    std::snprintf(line, sizeof line, "%4s %8s %17s %6s %8s %8s\n", "turn", "requests", "cached/prompt", "hit %",
                  "TTFT p50", "TTFT p99");
    out += line;
    for (const turn_metrics& t : m.by_turn) {
      const std::optional<double> turn_share = t.cache.share();
      const std::string tokens = format("{}/{}", t.cache.cached_tokens, t.cache.prompt_tokens);
      const std::string hit = turn_share ? fixed(*turn_share * 100, 1) : "-";
      std::snprintf(line, sizeof line, "%4lld %8lld %17s %6s %8.1f %8.1f\n", static_cast<long long>(t.turn + 1),
                    static_cast<long long>(t.completed), tokens.c_str(), hit.c_str(), t.ttft_ms.median, t.ttft_ms.p99);
      out += line;
    }
  }
  banner("", '=');
  return out;
}

// ---- comparison ---------------------------------------------------------------------------

std::vector<std::string> metric_names() {
  std::vector<std::string> out;
  for (const auto& m : all_metrics()) out.push_back(m.key);
  return out;
}

result<std::string> format_comparison(const std::vector<configuration>& configs, std::string_view metric) {
  const std::vector<metric_info> metrics = all_metrics();
  const metric_info* info = find_metric(metrics, metric);
  if (info == nullptr) {
    std::string known;
    for (const auto& m : metrics) known += (known.empty() ? "" : ", ") + m.key;
    return invalid_argument(format("unknown metric \"{}\"; one of: {}", metric, known));
  }
  const std::vector<bench_result> results = all_runs(configs);
  if (results.empty()) return invalid_argument("nothing to compare");
  std::size_t fewest_runs = results.size(), most_runs = 0;
  for (const configuration& c : configs) {
    fewest_runs = std::min(fewest_runs, c.runs.size());
    most_runs = std::max(most_runs, c.runs.size());
  }
  const auto shown = [&](double v) { return info->whole_number ? format("{}", std::llround(v)) : readable(v); };
  std::string out(info->title);
  if (most_runs > 1) {
    out += format(", median (range) of {} runs",
                  fewest_runs == most_runs ? format("{}", most_runs) : format("{}-{}", fewest_runs, most_runs));
  }
  out += format("\n\n| {} |", by_concurrency(results) ? "concurrency" : "load");
  std::string rule = "|---:|";
  for (const configuration& c : configs) {
    out += format(" {} |", c.label());
    rule += "---:|";
  }
  if (configs.size() >= 2) {
    out += format(" {} vs {} |", configs[0].label(), configs[1].label());
    rule += "---:|";
  }
  out += "\n" + rule + "\n";
  bool any_warm = false;
  for (const std::string& key : point_keys(results)) {
    out += format("| {} |", key);
    std::vector<std::optional<double>> medians;
    for (const configuration& c : configs) {
      const run_values v = values_at(c, key, info->get);
      medians.push_back(v.median());
      if (!v.median()) {
        out += " – |";
        continue;
      }
      std::string cell = shown(*v.median());
      if (v.sorted.size() > 1) cell += format(" ({}–{})", shown(v.sorted.front()), shown(v.sorted.back()));
      if (warm_at(c, key)) {
        cell += " *";
        any_warm = true;
      }
      out += format(" {} |", cell);
    }
    if (configs.size() >= 2) {
      if (medians[0] && medians[1] && *medians[1] != 0) {
        const double diff = (*medians[0] - *medians[1]) / *medians[1] * 100.0;
        out += format(" {}{}% |", diff >= 0 ? "+" : "", fixed(diff, 1));
      } else {
        out += " – |";
      }
    }
    out += "\n";
  }
  if (any_warm) {
    out += format("\nValues marked * come from points where over {}% of the prompt tokens came from the server's "
                  "prefix cache (a warm cache).\n",
                  fixed(warm_cache_share * 100, 0));
  }
  return out;
}

// ---- HTML ---------------------------------------------------------------------------------

std::string html_report(const std::vector<configuration>& configs, std::string_view title) {
  const std::vector<bench_result> results = all_runs(configs);
  const std::vector<std::string> keys = point_keys(results);
  const std::string x_label = by_concurrency(results) ? "concurrent requests" : "load";
  // A configuration's line: the median of its runs at each point.
  const auto values_of = [&](const configuration& c, const std::function<std::optional<double>(const run_metrics&)>& get) {
    std::vector<std::optional<double>> v;
    for (const auto& key : keys) v.push_back(values_at(c, key, get).median());
    return v;
  };
  const auto warm_of = [&](const configuration& c) {
    std::vector<bool> v;
    for (const auto& key : keys) v.push_back(warm_at(c, key));
    return v;
  };

  std::string charts;
  // Throughput: one line per configuration.
  const auto throughput_chart = [&](std::string_view id, std::string_view chart_title, std::string_view unit,
                                    double run_metrics::*member) {
    std::vector<chart_series> series;
    for (std::size_t i = 0; i < configs.size(); ++i) {
      series.push_back({configs[i].label(),
                        values_of(configs[i], [member](const run_metrics& m) -> std::optional<double> { return m.*member; }),
                        std::string(palette[i % palette.size()]), false, warm_of(configs[i])});
    }
    charts += "<figure>" + svg_chart(id, chart_title, unit, x_label, keys, series) + "</figure>\n";
  };
  throughput_chart("chart-output-throughput", "Output token throughput", "tokens/s", &run_metrics::output_throughput);
  throughput_chart("chart-request-throughput", "Request throughput", "requests/s", &run_metrics::request_throughput);

  // Latencies: p50/p90/p99 for one configuration; median (solid) and p99 (dashed) per configuration for several.
  const auto latency_chart = [&](std::string_view id, std::string_view chart_title, distribution run_metrics::*member) {
    std::vector<chart_series> series;
    const auto pick = [member](double distribution::*field) {
      return [member, field](const run_metrics& m) -> std::optional<double> {
        const distribution& d = m.*member;
        if (d.count == 0) return std::nullopt;
        return d.*field;
      };
    };
    if (configs.size() == 1) {
      const std::vector<bool> warm = warm_of(configs[0]);
      series.push_back({"p50", values_of(configs[0], pick(&distribution::median)), std::string(palette[0]), false, warm});
      series.push_back({"p90", values_of(configs[0], pick(&distribution::p90)), std::string(palette[3]), false, warm});
      series.push_back({"p99", values_of(configs[0], pick(&distribution::p99)), std::string(palette[1]), false, warm});
    } else {
      for (std::size_t i = 0; i < configs.size(); ++i) {
        const std::string color(palette[i % palette.size()]);
        const std::vector<bool> warm = warm_of(configs[i]);
        series.push_back({configs[i].label() + " p50", values_of(configs[i], pick(&distribution::median)), color, false, warm});
        series.push_back({configs[i].label() + " p99", values_of(configs[i], pick(&distribution::p99)), color, true, warm});
      }
    }
    charts += "<figure>" + svg_chart(id, chart_title, "milliseconds", x_label, keys, series) + "</figure>\n";
  };
  latency_chart("chart-ttft", "Time to first token", &run_metrics::ttft_ms);
  latency_chart("chart-tpot", "Time per output token", &run_metrics::tpot_ms);
  latency_chart("chart-itl", "Inter-token latency", &run_metrics::itl_ms);
  latency_chart("chart-e2el", "End-to-end latency", &run_metrics::e2el_ms);

  // Agent sessions: the prompt-token cache hit ratio and TTFT p50 by turn, a line per
  // configuration (and per point, where a result holds several), the median of its runs.
  std::size_t most_turns = 0;
  std::vector<std::string> agent_keys;  // the points that measured turns
  for (const bench_result& r : results) {
    for (const point_summary& p : r.points) {
      if (p.metrics.by_turn.empty()) continue;
      most_turns = std::max(most_turns, p.metrics.by_turn.size());
      if (std::find(agent_keys.begin(), agent_keys.end(), point_key(p)) == agent_keys.end()) agent_keys.push_back(point_key(p));
    }
  }
  if (most_turns > 0) {
    std::vector<std::string> turn_numbers;
    for (std::size_t t = 0; t < most_turns; ++t) turn_numbers.push_back(format("{}", t + 1));
    const auto by_turn_chart = [&](std::string_view id, std::string_view chart_title, std::string_view unit,
                                   const std::function<std::optional<double>(const turn_metrics&)>& get) {
      std::vector<chart_series> series;
      std::size_t lines = 0;
      for (std::size_t i = 0; i < configs.size(); ++i) {
        for (const std::string& key : agent_keys) {
          chart_series line{configs[i].label() + (agent_keys.size() > 1 ? " c=" + key : ""), {},
                            std::string(palette[lines++ % palette.size()]), false, {}};
          bool any = false;
          for (std::size_t t = 0; t < most_turns; ++t) {
            std::vector<double> runs;
            for (const bench_result& r : configs[i].runs) {
              const point_summary* p = find_point(r, key);
              if (p == nullptr || t >= p->metrics.by_turn.size()) continue;
              if (const std::optional<double> v = get(p->metrics.by_turn[t])) runs.push_back(*v);
            }
            std::sort(runs.begin(), runs.end());
            line.values.push_back(runs.empty() ? std::nullopt : std::optional(percentile(runs, 50)));
            any = any || !runs.empty();
          }
          if (any) series.push_back(std::move(line));
        }
      }
      charts += "<figure>" + svg_chart(id, chart_title, unit, "turn of each session", turn_numbers, series) + "</figure>\n";
    };
    by_turn_chart("chart-turn-hit-ratio", "Prompt-token cache hit ratio by turn", "percent",
                  [](const turn_metrics& t) -> std::optional<double> {
                    const std::optional<double> share = t.cache.share();
                    if (!share) return std::nullopt;
                    return *share * 100;
                  });
    by_turn_chart("chart-turn-ttft", "Time to first token by turn (p50)", "milliseconds",
                  [](const turn_metrics& t) -> std::optional<double> {
                    if (t.ttft_ms.count == 0) return std::nullopt;
                    return t.ttft_ms.median;
                  });
  }

  std::string tables;
  bool any_warm = false;
  for (const auto& r : results) {
    tables += format("<h3>{}</h3>\n<p class=\"meta\">model {} · {} · {} · endpoint {} · seed {}{} · {}</p>\n",
                     html_escape(r.label), html_escape(r.model), html_escape(r.dataset),
                     r.reuse_prompts ? "every point sends the first point's prompts" : "prompts drawn per point",
                     html_escape(r.endpoint), r.seed, r.slo.empty() ? "" : " · SLO " + html_escape(r.slo),
                     html_escape(r.started_at));
    tables +=
        "<table><tr><th>load</th><th>completed</th><th>failed</th><th>req/s</th><th>output tok/s</th>"
        "<th>total tok/s</th><th>TTFT p50</th><th>TTFT p99</th><th>TPOT p50</th><th>TPOT p99</th>"
        "<th>ITL p50</th><th>E2EL p50</th><th>E2EL p99</th><th>cached prompt tokens</th></tr>\n";
    for (const auto& p : r.points) {
      const run_metrics& m = p.metrics;
      const bool warm = warm_cache(m.cache);
      any_warm = any_warm || warm;
      const std::optional<double> share = m.cache.share();
      const std::string cached =
          share ? format("{} ({}%){}", m.cache.cached_tokens, fixed(*share * 100, 1), warm ? " ⚠" : "") : "–";
      tables += format(
          "<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
          "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"cache\">{}</td></tr>\n",
          warm ? " class=\"warm\"" : "", html_escape(point_key(p)), m.completed, m.failed, readable(m.request_throughput),
          readable(m.output_throughput), readable(m.total_token_throughput), readable(m.ttft_ms.median),
          readable(m.ttft_ms.p99), readable(m.tpot_ms.median), readable(m.tpot_ms.p99), readable(m.itl_ms.median),
          readable(m.e2el_ms.median), readable(m.e2el_ms.p99), cached);
    }
    tables += "</table>\n";
    for (const auto& p : r.points) {
      if (p.metrics.by_turn.empty()) continue;
      const std::optional<double> share = p.metrics.cache.share();
      tables += format(
          "<table class=\"turns\"><caption>load {}: agent sessions by turn · hit ratio {} · TTFT p50 {} ms, p99 {} ms"
          " · sessions ended by a failed turn: {}</caption>\n<tr><th>turn</th><th>requests</th><th>prompt tokens</th>"
          "<th>cached tokens</th><th>hit ratio</th><th>TTFT p50</th><th>TTFT p99</th></tr>\n",
          html_escape(point_key(p)), share ? fixed(*share * 100, 1) + "%" : "–", readable(p.metrics.ttft_ms.median),
          readable(p.metrics.ttft_ms.p99), p.sessions_cut);
      for (const turn_metrics& t : p.metrics.by_turn) {
        const std::optional<double> turn_share = t.cache.share();
        tables += format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                         t.turn + 1, t.completed, t.cache.prompt_tokens, t.cache.cached_tokens,
                         turn_share ? fixed(*turn_share * 100, 1) + "%" : "–", readable(t.ttft_ms.median),
                         readable(t.ttft_ms.p99));
      }
      tables += "</table>\n";
    }
  }
  if (any_warm) {
    tables += format(
        "<p class=\"warm-note\">⚠ Marked rows, and ringed points in the charts: over {}% of the point's prompt tokens "
        "came from the server's prefix cache (<code>usage.prompt_tokens_details.cached_tokens</code>), so its TTFT and "
        "throughput measure a warm cache.</p>\n",
        fixed(warm_cache_share * 100, 0));
  }

  return format(R"(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px; color: #222; background: #fafafa; }}
h1 {{ font-size: 22px; }}
.charts {{ display: flex; flex-wrap: wrap; gap: 16px; }}
figure {{ margin: 0; background: #fff; border: 1px solid #ddd; }}
svg text {{ font-family: system-ui, sans-serif; fill: #333; }}
svg .title {{ font-size: 15px; font-weight: 600; }}
svg .tick {{ font-size: 11px; }}
svg .label, svg .legend {{ font-size: 12px; }}
svg .grid {{ stroke: #e5e5e5; }}
svg .axis {{ stroke: #555; }}
table {{ border-collapse: collapse; margin-bottom: 16px; background: #fff; }}
caption {{ text-align: left; font-size: 13px; padding: 4px 0; }}
td, th {{ border: 1px solid #ccc; padding: 3px 8px; text-align: right; font-size: 13px; }}
.meta {{ color: #666; font-size: 13px; }}
tr.warm td {{ background: #fff4d6; }}
tr.warm td.cache {{ color: {}; font-weight: 600; }}
.warm-note {{ color: {}; font-size: 13px; }}
</style>
</head>
<body>
<h1>{}</h1>
<p class="meta">Latencies in milliseconds; throughput against the number of concurrent requests; the lines are the median of a configuration's runs. Written by edgeinfer bench.</p>
<div class="charts">
{}</div>
<h2>Numbers</h2>
{}</body>
</html>
)",
                html_escape(title), warm_color, warm_color, html_escape(title), charts, tables);
}

}  // namespace edge::bench
