// `edgeinfer eval`: quantization fidelity. Teacher-forces a model over a text under every
// (weight dtype × KV cache dtype) configuration and compares each with the f32 reference
// (backend/engine/eval.h): a table on stdout (rows: metrics; columns: configurations), each
// configuration's greedy continuation of the prompt after it, and with --json the same as JSON.
#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string_view>
#include <thread>

#include "commands.h"
#include "edge/backend/engine/eval.h"
#include "edge/backend/model/model.h"
#include "edge/common/format.h"
#include "edge/common/log.h"
#include "edge/common/thread_pool.h"
#include "weight_options.h"

namespace edge::cli {
namespace {

config::schema eval_options() {
  config::schema s;
  s.add_path("model", std::nullopt, "Model: a GGUF file, a llama2.c checkpoint or a Hugging Face folder (required)");
  s.add_path("tokenizer", std::nullopt, "Tokenizer file for a llama2.c checkpoint (default: beside it)");
  s.add_path("text", std::nullopt, "Text file to teacher-force the model over (required)");
  s.add_path("json", std::nullopt, "Also write the results to this JSON file");
  s.add_string("configs", std::nullopt,
               "Configurations to compare with the f32/f32 reference, as WEIGHTS/KV separated by commas, e.g. "
               "f32/fp8,f32/bf16 (default: every weight dtype with bf16 and fp8 KV, and f32/f16)");
  s.add_string("weight-dtype", std::nullopt,
               "Weight dtypes to compare, separated by commas (f32, bf16, f16, fp8, int4, int8), each with a bf16 and an "
               "fp8 KV cache; the default configurations otherwise. --configs names configurations one by one");
  add_quantize_on_load_options(s);
  s.add_string("prompt", std::nullopt, "Prompt of the greedy continuations (default: the text's first sentence)");
  s.add_integer("max-tokens", 64, 1, std::int64_t{1} << 20, "Length of the greedy continuations compared");
  s.add_integer("window", 0, 0, std::int64_t{1} << 30,
                "Tokens per teacher-forced window; 0 means the model's context");
  s.add_integer("threads", 0, 0, 1024, "Compute threads; 0 means one per hardware thread");
  return s;
}

result<std::string> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(format("cannot open {}", path.string()));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

boost::json::object metrics_json(const backend::eval_metrics& r) {
  boost::json::array continuation;
  for (auto id : r.continuation) continuation.push_back(id);
  return {{"name", r.config.name()},
          {"weights", r.config.weights},
          {"kv_cache", std::string(kernels::to_string(r.config.kv))},
          {"reference", r.config.is_reference()},
          {"predictions", r.predictions},
          {"top1_matches", r.top1_matches},
          {"top1_agreement", r.top1_agreement},
          {"mean_kl", r.mean_kl},
          {"max_kl", r.max_kl},
          {"perplexity", r.perplexity},
          {"greedy_match", r.greedy_match},
          {"greedy_tokens", r.continuation.size()},
          {"continuation", r.continuation_text},
          {"continuation_ids", std::move(continuation)}};
}

// "int4,fp8": each weight dtype with a bf16 and an fp8 KV cache (f32 weights also with f32).
result<std::vector<backend::eval_configuration>> configurations_for_weights(std::string_view list) {
  std::string expanded;
  std::size_t begin = 0;
  while (begin <= list.size()) {
    const std::size_t end = std::min(list.find(',', begin), list.size());
    std::string_view weights = list.substr(begin, end - begin);
    begin = end + 1;
    while (!weights.empty() && weights.front() == ' ') weights.remove_prefix(1);
    while (!weights.empty() && weights.back() == ' ') weights.remove_suffix(1);
    if (weights.empty()) continue;
    if (weights.find('/') != std::string_view::npos) {
      return invalid_argument(format("--weight-dtype takes weight dtypes (e.g. int4,fp8), not \"{}\"", weights));
    }
    for (std::string_view kv : {"bf16", "fp8"}) expanded += format("{}/{},", weights, kv);
  }
  if (expanded.empty()) return invalid_argument("--weight-dtype names no weight dtype");
  return backend::parse_eval_configurations(expanded);
}

// The model as a configuration's weights want it: the reference model itself for "f32" (the
// weights as stored, widened exactly in the matmul), else loaded again with those weights.
// Holds one converted model at a time: configurations with the same weights in a row share it.
class weight_variants {
 public:
  weight_variants(const backend::model& reference, backend::load_options load)
      : reference_(reference), load_(std::move(load)) {}

  result<const backend::model*> get(const std::string& weights) {
    if (weights == "f32") return &reference_;
    if (current_ && current_name_ == weights) return current_.get();
    current_.reset();  // before the next load: a 1B model in bf16 is 2.5 GB
    backend::load_options load = load_;
    load.weight_dtype = kernels::parse_weight_format(weights);
    if (!load.weight_dtype) return invalid_argument(format("unknown weight dtype \"{}\"", weights));
    const auto start = std::chrono::steady_clock::now();
    EDGE_ASSIGN_OR_RETURN(current_, backend::load_model(load));
    current_name_ = weights;
    logger{"eval"}.info("loaded the model with {} weights ({:.1f} s)", weights,
                        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return current_.get();
  }

 private:
  const backend::model& reference_;
  backend::load_options load_;
  std::unique_ptr<backend::model> current_;
  std::string current_name_;
};

int run_eval(const config::values& settings) {
  const logger log{"eval"};
  if (!settings.has("model") || !settings.has("text")) {
    std::fprintf(stderr, "edgeinfer eval: --model and --text are required\n");
    return 2;
  }
  if (settings.has("configs") && settings.has("weight-dtype")) {
    std::fprintf(stderr, "edgeinfer eval: give --configs or --weight-dtype, not both\n");
    return 2;
  }
  auto configs = settings.has("configs")        ? backend::parse_eval_configurations(settings.string("configs"))
                 : settings.has("weight-dtype") ? configurations_for_weights(settings.string("weight-dtype"))
                                                : backend::default_eval_configurations();
  if (!configs.ok()) {
    std::fprintf(stderr, "edgeinfer eval: %s\n", configs.error().message().c_str());
    return 2;
  }
  auto text = read_file(settings.string("text"));
  if (!text.ok()) {
    log.error("{}", text.error().message());
    return 1;
  }

  backend::load_options load;
  load.path = settings.string("model");
  if (settings.has("tokenizer")) load.tokenizer = settings.string("tokenizer");
  apply_quantize_on_load(settings, load);
  load.cpu_tiles = true;  // eval runs the CPU executor
  auto reference_model = backend::load_model(load);
  if (!reference_model.ok()) {
    log.error("{}", reference_model.error().message());
    return 1;
  }
  const backend::model& m = **reference_model;
  if (m.synthetic) log.warn("{} is a synthetic model: its random weights say little about real models", m.name);

  const std::string prompt_text = settings.optional_string("prompt").value_or(backend::first_sentence(*text));
  auto tokens = m.tok->encode(*text, {.add_bos = true, .parse_special = false});
  auto prompt = m.tok->encode(prompt_text, {.add_bos = true, .parse_special = false});

  std::size_t threads = static_cast<std::size_t>(settings.integer("threads"));
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  // The calling thread computes too, so the pool holds one worker fewer.
  std::unique_ptr<thread_pool> pool = threads > 1 ? std::make_unique<thread_pool>(threads - 1) : nullptr;
  const backend::eval_options options{.window = settings.integer("window"),
                                      .greedy_tokens = settings.integer("max-tokens"),
                                      .pool = pool.get()};

  auto start = std::chrono::steady_clock::now();
  auto reference = backend::eval_reference::run(m, tokens, prompt, options);
  if (!reference.ok()) {
    log.error("{}", reference.error().message());
    return 1;
  }
  log.info("reference f32/f32: {} tokens, {} predictions in {} window(s) of up to {} tokens ({:.1f} s)",
           reference->text_tokens(), reference->self().predictions, reference->windows(), reference->window(),
           seconds_since(start));

  std::vector<backend::eval_metrics> results;
  weight_variants variants(m, load);
  for (const backend::eval_configuration& config : *configs) {
    auto variant = variants.get(config.weights);
    if (!variant.ok()) {
      log.error("{}: {}", config.name(), variant.error().message());
      return 1;
    }
    start = std::chrono::steady_clock::now();
    // The reference column is the reference run itself.
    auto r = config.is_reference() ? backend::eval_metrics(reference->self()) : reference->compare(**variant, config);
    if (!r.ok()) {
      log.error("{}", r.error().message());
      return 1;
    }
    log.info("{}: top-1 {:.2f}% ({:.1f} s)", config.name(), 100.0 * r->top1_agreement, seconds_since(start));
    results.push_back(std::move(r).value());
  }

  std::string report = format("{}: {} tokens of {}, {} predictions; greedy continuations of \"{}\"\n\n", m.name,
                              reference->text_tokens(), settings.string("text"), reference->self().predictions,
                              prompt_text);
  report += backend::format_eval_table(results);
  report += "\n";
  for (const auto& r : results) report += format("{}: {}{}\n", r.config.name(), prompt_text, r.continuation_text);
  std::fwrite(report.data(), 1, report.size(), stdout);
  std::fflush(stdout);

  if (settings.has("json")) {
    boost::json::array columns;
    for (const auto& r : results) columns.push_back(metrics_json(r));
    const boost::json::object doc = {{"model", m.name},
                                     {"synthetic", m.synthetic},
                                     {"text", settings.string("text")},
                                     {"text_tokens", reference->text_tokens()},
                                     {"predictions", reference->self().predictions},
                                     {"window", reference->window()},
                                     {"windows", reference->windows()},
                                     {"prompt", prompt_text},
                                     {"configurations", std::move(columns)}};
    std::ofstream out(settings.string("json"), std::ios::binary | std::ios::trunc);
    out << boost::json::serialize(doc) << '\n';
    if (!out) {
      log.error("cannot write {}", settings.string("json"));
      return 1;
    }
  }
  return 0;
}

}  // namespace

command make_eval_command(CLI::App& app) {
  return command(app, "eval",
                 "Measure how far quantized weights and KV caches move a model's predictions from f32, over a text",
                 eval_options(), run_eval);
}

}  // namespace edge::cli
