#include "edge/backend/engine/eval.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <functional>
#include <numeric>

#include "edge/backend/engine/generator.h"
#include "edge/backend/runtime/cpu_executor.h"
#include "edge/backend/runtime/kv_cache.h"
#include "edge/common/format.h"
#include "edge/common/thread_pool.h"

namespace edge::backend {
namespace {

constexpr std::int64_t eval_block_size = 16;

// Rows scored per parallel task: each row is a pass over the vocabulary in double.
constexpr std::size_t rows_per_task = 1;

// The KV dtypes a configuration may name, in --kv-cache-dtype's spelling.
std::string_view kv_name(kernels::dtype type) {
  return type == kernels::dtype::fp8_e4m3 ? std::string_view("fp8") : kernels::to_string(type);
}

// log Σ exp(row), in double.
double log_sum_exp(std::span<const float> row) {
  const double top = *std::max_element(row.begin(), row.end());
  double sum = 0.0;
  for (float x : row) sum += std::exp(static_cast<double>(x) - top);
  return top + std::log(sum);
}

// The most likely token; ties go to the lower id, as greedy sampling breaks them.
std::int32_t argmax(std::span<const float> row) {
  return static_cast<std::int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// A model with a KV cache of one dtype and an executor over it.
struct session {
  std::unique_ptr<kv_cache> cache;
  std::unique_ptr<cpu_executor> exec;
};

result<session> open_session(const model& m, kernels::dtype kv, std::int64_t tokens, std::int64_t batch_tokens,
                             const eval_options& options) {
  session s;
  auto cache = kv_cache::create(kv_cache_layout::for_tokens(m.config, kv, eval_block_size, tokens));
  if (!cache.ok()) return cache.error();
  s.cache = std::move(cache).value();
  auto exec = cpu_executor::create(m, *s.cache, options.pool,
                                   // At least a block: the greedy continuation's scheduler prefills in whole blocks.
                                   {.max_batch_tokens = std::max(batch_tokens, eval_block_size), .max_sequences = options.chunk});
  if (!exec.ok()) return exec.error();
  s.exec = std::move(exec).value();
  return s;
}

// Feeds `text` through the executor window by window and calls on_rows(first, next, logits)
// after each forward pass: prediction indices first.. (index i predicts text[i + 1]), the
// tokens they predict, and their logits ([rows, vocab]). Each position is its own batch entry
// with logits, all entries of a window sharing one block table, which works because the
// executor writes a step's K/V before any of its attention reads them. Returns the number of
// windows.
result<std::int64_t> teacher_forced(
    executor& exec, std::span<const token_id> text, std::int64_t window, std::int64_t chunk,
    const std::function<status(std::int64_t, std::span<const token_id>, std::span<const float>)>& on_rows) {
  const auto n = static_cast<std::int64_t>(text.size());
  const std::int64_t vocab = exec.vocab_size();
  std::vector<std::int32_t> table(static_cast<std::size_t>((window + eval_block_size - 1) / eval_block_size));
  std::iota(table.begin(), table.end(), 0);
  std::vector<float> logits;
  batch_plan plan;
  std::int64_t windows = 0;
  std::int64_t index = 0;
  for (std::int64_t start = 0; start + 1 < n; ++windows) {
    // The window's last token is only predicted; the next window starts with it.
    const std::int64_t length = std::min(window, n - start);
    for (std::int64_t first = 0; first < length - 1; first += chunk) {
      const std::int64_t count = std::min(chunk, length - 1 - first);
      plan.entries.clear();
      for (std::int64_t p = first; p < first + count; ++p) {
        plan.entries.push_back({.tokens = text.subspan(static_cast<std::size_t>(start + p), 1),
                                .start_position = p,
                                .block_table = table,
                                .compute_logits = true});
      }
      logits.resize(static_cast<std::size_t>(count * vocab));
      EDGE_RETURN_IF_ERROR(exec.forward(plan, logits));
      EDGE_RETURN_IF_ERROR(
          on_rows(index, text.subspan(static_cast<std::size_t>(start + first + 1), static_cast<std::size_t>(count)),
                  logits));
      index += count;
    }
    start += length - 1;
  }
  return windows;
}

result<generation_output> greedy_continuation(const model& m, executor& exec, std::int64_t num_blocks,
                                              std::span<const token_id> prompt, std::int64_t tokens) {
  generate_request request;
  request.prompt.assign(prompt.begin(), prompt.end());
  request.max_tokens = tokens;
  request.ignore_eos = true;  // every configuration continues for the same number of tokens
  request.sampling.temperature = 0.0f;
  kv_block_pool blocks(num_blocks);
  generator gen(m, exec, blocks);
  auto out = gen.run({&request, 1});
  if (!out.ok()) return out.error();
  return std::move(out->front());
}

// Per-row results of one forward pass, computed in parallel and summed in order.
struct row_scores {
  std::vector<double> kl;
  std::vector<double> nll;
  std::vector<std::int32_t> top;
};

}  // namespace

std::string eval_configuration::name() const { return weights + "/" + std::string(kv_name(kv)); }

std::span<const std::string_view> eval_weight_dtypes() {
  // "f32" first: it is the reference's weights. The others are load_options::weight_dtype names.
  static constexpr std::array<std::string_view, 6> names = {"f32", "bf16", "f16", "fp8", "int4", "int8"};
  return names;
}

std::vector<eval_configuration> default_eval_configurations() {
  std::vector<eval_configuration> configs = {{"f32", kernels::dtype::f32},
                                             {"f32", kernels::dtype::bf16},
                                             {"f32", kernels::dtype::f16},
                                             {"f32", kernels::dtype::fp8_e4m3}};
  for (std::string_view weights : eval_weight_dtypes()) {
    if (weights == "f32") continue;
    for (kernels::dtype kv : {kernels::dtype::bf16, kernels::dtype::fp8_e4m3}) {
      configs.push_back({std::string(weights), kv});
    }
  }
  return configs;
}

result<std::vector<eval_configuration>> parse_eval_configurations(std::string_view list) {
  std::vector<eval_configuration> configs = {{"f32", kernels::dtype::f32}};
  std::size_t begin = 0;
  while (begin <= list.size()) {
    const std::size_t end = std::min(list.find(',', begin), list.size());
    std::string_view item = list.substr(begin, end - begin);
    begin = end + 1;
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (item.empty()) continue;
    const std::size_t slash = item.find('/');
    if (slash == std::string_view::npos) {
      return invalid_argument(format("configuration \"{}\" is not WEIGHTS/KV (e.g. f32/fp8)", item));
    }
    const std::string_view weights = item.substr(0, slash);
    const auto known = eval_weight_dtypes();
    if (std::find(known.begin(), known.end(), weights) == known.end()) {
      std::string names;
      for (std::string_view k : known) names += (names.empty() ? "" : ", ") + std::string(k);
      return invalid_argument(format("configuration \"{}\": weight dtype \"{}\" is not one of {}", item, weights, names));
    }
    auto kv = parse_kv_cache_dtype(item.substr(slash + 1));
    if (!kv.ok()) return invalid_argument(format("configuration \"{}\": {}", item, kv.error().message()));
    if (!kv->has_value()) return invalid_argument(format("configuration \"{}\": name the KV dtype, not auto", item));
    const eval_configuration config{std::string(weights), **kv};
    if (std::find(configs.begin(), configs.end(), config) == configs.end()) configs.push_back(config);
  }
  return configs;
}

result<eval_reference> eval_reference::run(const model& reference_model, std::vector<token_id> text,
                                           std::vector<token_id> prompt, const eval_options& options) {
  const std::int64_t context = reference_model.config.max_position;
  if (text.size() < 2) return invalid_argument("the text must have at least two tokens");
  if (prompt.empty()) return invalid_argument("the greedy prompt is empty");
  if (options.chunk <= 0 || options.greedy_tokens <= 0) {
    return invalid_argument("chunk and greedy_tokens must be positive");
  }
  if (static_cast<std::int64_t>(prompt.size()) + options.greedy_tokens > context) {
    return out_of_range(format("the prompt ({} tokens) and {} greedy tokens exceed the model's context of {}",
                               prompt.size(), options.greedy_tokens, context));
  }
  eval_reference r;
  r.text_ = std::move(text);
  r.prompt_ = std::move(prompt);
  r.options_ = options;
  r.window_ = std::min(options.window > 0 ? std::min(options.window, context) : context,
                       static_cast<std::int64_t>(r.text_.size()));
  if (r.window_ < 2) return invalid_argument("the window must hold at least two tokens");
  r.vocab_ = reference_model.config.vocab_size;

  const eval_configuration reference{"f32", kernels::dtype::f32};
  const auto predictions = static_cast<std::size_t>(r.text_.size() - 1);
  r.logits_.reserve(predictions * static_cast<std::size_t>(r.vocab_));
  r.log_norm_.resize(predictions);
  r.argmax_.resize(predictions);
  double nll = 0.0;

  const std::int64_t cache_tokens =
      std::max(r.window_, static_cast<std::int64_t>(r.prompt_.size()) + options.greedy_tokens);
  auto s = open_session(reference_model, reference.kv, cache_tokens,
                        std::max(options.chunk, static_cast<std::int64_t>(r.prompt_.size())), options);
  if (!s.ok()) return s.error();
  auto windows = teacher_forced(
      *s->exec, r.text_, r.window_, options.chunk,
      [&](std::int64_t first, std::span<const token_id> next, std::span<const float> logits) -> status {
        r.logits_.insert(r.logits_.end(), logits.begin(), logits.end());
        for (std::size_t i = 0; i < next.size(); ++i) {
          const std::span<const float> row = logits.subspan(i * static_cast<std::size_t>(r.vocab_),
                                                            static_cast<std::size_t>(r.vocab_));
          const auto index = static_cast<std::size_t>(first) + i;
          r.log_norm_[index] = log_sum_exp(row);
          r.argmax_[index] = argmax(row);
          nll += r.log_norm_[index] - row[static_cast<std::size_t>(next[i])];
        }
        return {};
      });
  if (!windows.ok()) return windows.error();
  r.windows_ = *windows;

  auto greedy = greedy_continuation(reference_model, *s->exec, s->cache->layout().num_blocks, r.prompt_,
                                    options.greedy_tokens);
  if (!greedy.ok()) return greedy.error();
  r.self_ = {.config = reference,
             .predictions = static_cast<std::int64_t>(predictions),
             .top1_matches = static_cast<std::int64_t>(predictions),
             .top1_agreement = 1.0,
             .mean_kl = 0.0,
             .max_kl = 0.0,
             .perplexity = std::exp(nll / static_cast<double>(predictions)),
             .greedy_match = static_cast<std::int64_t>(greedy->tokens.size()),
             .continuation = std::move(greedy->tokens),
             .continuation_text = std::move(greedy->text)};
  return r;
}

result<eval_metrics> eval_reference::compare(const model& m, const eval_configuration& config) const {
  if (m.config.vocab_size != vocab_) {
    return invalid_argument(format("{}: the model's vocabulary has {} tokens, the reference's {}", config.name(),
                                   m.config.vocab_size, vocab_));
  }
  const auto vocab = static_cast<std::size_t>(vocab_);
  const std::int64_t cache_tokens =
      std::max(window_, static_cast<std::int64_t>(prompt_.size()) + options_.greedy_tokens);
  auto s = open_session(m, config.kv, cache_tokens,
                        std::max(options_.chunk, static_cast<std::int64_t>(prompt_.size())), options_);
  if (!s.ok()) return s.error();

  eval_metrics out;
  out.config = config;
  double kl_sum = 0.0, nll = 0.0;
  row_scores scores;
  auto windows = teacher_forced(
      *s->exec, text_, window_, options_.chunk,
      [&](std::int64_t first, std::span<const token_id> next, std::span<const float> logits) -> status {
        const std::size_t rows = next.size();
        scores.kl.assign(rows, 0.0);
        scores.nll.assign(rows, 0.0);
        scores.top.assign(rows, 0);
        const auto score = [&](std::size_t begin, std::size_t end) {
          for (std::size_t i = begin; i < end; ++i) {
            const std::span<const float> row = logits.subspan(i * vocab, vocab);
            const std::size_t index = static_cast<std::size_t>(first) + i;
            const float* ref = logits_.data() + index * vocab;
            const double ref_norm = log_norm_[index];
            const double norm = log_sum_exp(row);
            double kl = 0.0;
            for (std::size_t v = 0; v < vocab; ++v) {
              const double ref_log_p = static_cast<double>(ref[v]) - ref_norm;
              kl += std::exp(ref_log_p) * (ref_log_p - (static_cast<double>(row[v]) - norm));
            }
            // KL is never negative; a value a few ulps below zero is rounding in the sum.
            scores.kl[i] = std::max(kl, 0.0);
            scores.nll[i] = norm - row[static_cast<std::size_t>(next[i])];
            scores.top[i] = argmax(row);
          }
        };
        if (options_.pool != nullptr) {
          options_.pool->parallel_for(0, rows, rows_per_task, score);
        } else {
          score(0, rows);
        }
        for (std::size_t i = 0; i < rows; ++i) {
          kl_sum += scores.kl[i];
          out.max_kl = std::max(out.max_kl, scores.kl[i]);
          nll += scores.nll[i];
          if (scores.top[i] == argmax_[static_cast<std::size_t>(first) + i]) ++out.top1_matches;
        }
        return {};
      });
  if (!windows.ok()) return windows.error();

  out.predictions = self_.predictions;
  out.top1_agreement = static_cast<double>(out.top1_matches) / static_cast<double>(out.predictions);
  out.mean_kl = kl_sum / static_cast<double>(out.predictions);
  out.perplexity = std::exp(nll / static_cast<double>(out.predictions));

  auto greedy = greedy_continuation(m, *s->exec, s->cache->layout().num_blocks, prompt_, options_.greedy_tokens);
  if (!greedy.ok()) return greedy.error();
  const auto& expected = self_.continuation;
  const auto mismatch = std::mismatch(greedy->tokens.begin(), greedy->tokens.end(), expected.begin(), expected.end());
  out.greedy_match = static_cast<std::int64_t>(mismatch.first - greedy->tokens.begin());
  out.continuation = std::move(greedy->tokens);
  out.continuation_text = std::move(greedy->text);
  return out;
}

std::string first_sentence(std::string_view text) {
  const auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  const std::size_t end = text.find_first_of(".!?\n");
  std::string_view sentence = end == std::string_view::npos ? text : text.substr(0, end + (text[end] == '\n' ? 0 : 1));
  while (!sentence.empty() && is_space(sentence.back())) sentence.remove_suffix(1);
  return std::string(sentence);
}

std::string format_eval_table(std::span<const eval_metrics> results) {
  const auto scientific = [](double value) {
    if (value == 0.0) return std::string("0");
    char buffer[32];
    const auto written = std::to_chars(buffer, buffer + sizeof(buffer), value, std::chars_format::scientific, 2);
    return std::string(buffer, written.ptr);
  };
  const std::int64_t greedy = results.empty() ? 0 : static_cast<std::int64_t>(results.front().continuation.size());
  struct table_row {
    std::string label;
    std::function<std::string(const eval_metrics&)> cell;
  };
  const std::vector<table_row> rows = {
      {"weights/KV cache", [](const eval_metrics& r) { return r.config.name(); }},
      {"top-1 agreement", [](const eval_metrics& r) { return format("{:.2f}%", 100.0 * r.top1_agreement); }},
      {"mean KL (nats)", [&](const eval_metrics& r) { return scientific(r.mean_kl); }},
      {"max KL (nats)", [&](const eval_metrics& r) { return scientific(r.max_kl); }},
      {"perplexity", [](const eval_metrics& r) { return format("{:.3f}", r.perplexity); }},
      {format("greedy match (of {})", greedy), [](const eval_metrics& r) { return format("{}", r.greedy_match); }},
  };
  std::size_t label_width = 0;
  for (const auto& row : rows) label_width = std::max(label_width, row.label.size());
  std::vector<std::size_t> widths;
  for (const auto& r : results) {
    std::size_t width = 0;
    for (const auto& row : rows) width = std::max(width, row.cell(r).size());
    widths.push_back(width);
  }
  std::string out;
  for (const auto& row : rows) {
    out += row.label + std::string(label_width - row.label.size(), ' ');
    for (std::size_t c = 0; c < results.size(); ++c) {
      const std::string cell = row.cell(results[c]);
      out += "  " + std::string(widths[c] - cell.size(), ' ') + cell;
    }
    out += '\n';
  }
  return out;
}

}  // namespace edge::backend
