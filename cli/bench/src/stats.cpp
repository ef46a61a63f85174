#include "edge/bench/stats.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <numeric>

#include "edge/common/format.h"

namespace edge::bench {
namespace {

void count_cache(prompt_cache_use& cache, const request_record& r) {
  if (!r.usage_prompt_tokens || !r.usage_cached_tokens) return;
  ++cache.requests_reporting;
  cache.prompt_tokens += *r.usage_prompt_tokens;
  cache.cached_tokens += *r.usage_cached_tokens;
}

}  // namespace

double percentile(std::span<const double> sorted, double p) {
  if (sorted.empty()) return 0;
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(sorted.size() - 1);
  const auto below = static_cast<std::size_t>(std::floor(rank));
  const std::size_t above = std::min(below + 1, sorted.size() - 1);
  const double fraction = rank - static_cast<double>(below);
  return sorted[below] + (sorted[above] - sorted[below]) * fraction;
}

distribution summarize(std::vector<double> values) {
  distribution d;
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  d.count = values.size();
  const double n = static_cast<double>(values.size());
  d.mean = std::accumulate(values.begin(), values.end(), 0.0) / n;
  double squares = 0;
  for (double v : values) squares += (v - d.mean) * (v - d.mean);
  d.std = std::sqrt(squares / n);
  d.median = percentile(values, 50);
  d.p90 = percentile(values, 90);
  d.p99 = percentile(values, 99);
  d.min = values.front();
  d.max = values.back();
  return d;
}

double request_record::tpot_s() const {
  const std::int64_t tokens = output_tokens();
  if (tokens <= 1) return 0;
  return (latency_s - ttft_s) / static_cast<double>(tokens - 1);
}

std::optional<double> prompt_cache_use::share() const {
  if (requests_reporting == 0 || prompt_tokens <= 0) return std::nullopt;
  return static_cast<double>(cached_tokens) / static_cast<double>(prompt_tokens);
}

bool warm_cache(const prompt_cache_use& cache) {
  const std::optional<double> share = cache.share();
  return share && *share > warm_cache_share;
}

result<slo> parse_slo(std::string_view text) {
  slo out;
  std::size_t i = 0;
  const auto is_separator = [](char c) { return c == ',' || std::isspace(static_cast<unsigned char>(c)); };
  while (i < text.size()) {
    while (i < text.size() && is_separator(text[i])) ++i;
    if (i == text.size()) break;
    std::size_t end = i;
    while (end < text.size() && !is_separator(text[end])) ++end;
    const std::string_view item = text.substr(i, end - i);
    i = end;
    const std::size_t colon = item.find(':');
    if (colon == std::string_view::npos) {
      return invalid_argument(format("goodput objective \"{}\" must be KEY:MILLISECONDS (e.g. ttft:500)", item));
    }
    const std::string_view key = item.substr(0, colon);
    const std::string number(item.substr(colon + 1));
    char* parsed_end = nullptr;
    const double ms = std::strtod(number.c_str(), &parsed_end);
    if (number.empty() || parsed_end != number.c_str() + number.size() || !(ms > 0) || !std::isfinite(ms)) {
      return invalid_argument(format("goodput objective \"{}\": \"{}\" is not a positive number of milliseconds",
                                     item, number));
    }
    std::optional<double>* target = nullptr;
    if (key == "ttft") target = &out.ttft_ms;
    else if (key == "tpot") target = &out.tpot_ms;
    else if (key == "itl") target = &out.itl_ms;
    else if (key == "e2el") target = &out.e2el_ms;
    else return invalid_argument(format("unknown goodput objective \"{}\": use ttft, tpot, itl or e2el", key));
    if (*target) return invalid_argument(format("goodput objective \"{}\" is given twice", key));
    *target = ms;
  }
  if (out.empty()) return invalid_argument("--goodput needs at least one objective, e.g. ttft:500 tpot:50");
  return out;
}

std::string to_string(const slo& objectives) {
  std::string out;
  const auto add = [&out](std::string_view key, const std::optional<double>& ms) {
    if (!ms) return;
    if (!out.empty()) out += ' ';
    out += format("{}:{}", key, *ms);
  };
  add("ttft", objectives.ttft_ms);
  add("tpot", objectives.tpot_ms);
  add("itl", objectives.itl_ms);
  add("e2el", objectives.e2el_ms);
  return out;
}

bool meets(const request_record& r, const slo& objectives) {
  constexpr double ms_per_s = 1000.0;
  if (!r.success) return false;
  if (objectives.ttft_ms && r.ttft_s * ms_per_s > *objectives.ttft_ms) return false;
  if (objectives.tpot_ms && r.tpot_s() * ms_per_s > *objectives.tpot_ms) return false;
  if (objectives.e2el_ms && r.latency_s * ms_per_s > *objectives.e2el_ms) return false;
  if (objectives.itl_ms) {
    for (double gap : r.itl_s) {
      if (gap * ms_per_s > *objectives.itl_ms) return false;
    }
  }
  return true;
}

run_metrics compute_metrics(std::span<const request_record> records, double duration_s, const slo& objectives) {
  constexpr double ms_per_s = 1000.0;
  run_metrics m;
  m.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2el;
  for (const request_record& r : records) {
    if (!r.success) {
      ++m.failed;
      ++m.failures[r.error.empty() ? "unknown" : r.error];
      continue;
    }
    ++m.completed;
    m.total_input_tokens += r.input_tokens();
    m.total_output_tokens += r.output_tokens();
    ttft.push_back(r.ttft_s * ms_per_s);
    e2el.push_back(r.latency_s * ms_per_s);
    if (r.output_tokens() > 1) tpot.push_back(r.tpot_s() * ms_per_s);
    for (double gap : r.itl_s) itl.push_back(gap * ms_per_s);
    if (!objectives.empty() && meets(r, objectives)) ++m.good_requests;
    if (r.usage_completion_tokens) {
      ++m.tokens.requests_with_usage;
      m.tokens.usage_completion_tokens += *r.usage_completion_tokens;
      m.tokens.client_completion_tokens += r.content_deltas;
      if (*r.usage_completion_tokens != r.content_deltas) ++m.tokens.mismatched_requests;
      if (*r.usage_completion_tokens < r.content_deltas) ++m.tokens.more_deltas_requests;
    }
    count_cache(m.cache, r);
  }
  if (duration_s > 0) {
    m.request_throughput = static_cast<double>(m.completed) / duration_s;
    m.output_throughput = static_cast<double>(m.total_output_tokens) / duration_s;
    m.total_token_throughput = static_cast<double>(m.total_input_tokens + m.total_output_tokens) / duration_s;
    if (!objectives.empty()) m.goodput = static_cast<double>(m.good_requests) / duration_s;
  } else if (!objectives.empty()) {
    m.goodput = 0;
  }
  std::vector<std::vector<double>> ttft_by_turn;
  for (const request_record& r : records) {
    if (!r.success || !r.turn || *r.turn < 0) continue;
    const auto turn = static_cast<std::size_t>(*r.turn);
    if (m.by_turn.size() <= turn) {
      for (std::size_t t = m.by_turn.size(); t <= turn; ++t) m.by_turn.push_back({.turn = static_cast<std::int64_t>(t)});
      ttft_by_turn.resize(turn + 1);
    }
    turn_metrics& t = m.by_turn[turn];
    ++t.completed;
    ttft_by_turn[turn].push_back(r.ttft_s * ms_per_s);
    count_cache(t.cache, r);
  }
  for (std::size_t t = 0; t < m.by_turn.size(); ++t) m.by_turn[t].ttft_ms = summarize(std::move(ttft_by_turn[t]));
  m.ttft_ms = summarize(std::move(ttft));
  m.tpot_ms = summarize(std::move(tpot));
  m.itl_ms = summarize(std::move(itl));
  m.e2el_ms = summarize(std::move(e2el));
  return m;
}

}  // namespace edge::bench
