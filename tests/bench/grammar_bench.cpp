// Structured outputs: what grammar-constrained decoding costs (docs/performance.md).
//
//   edge_bench_grammar --tokenizer tokenizer.json [--model DIR] [--walks 20] [--tokens 24]
//
// 1. Compile: each schema of a realistic set compiled for the vocabulary, cold (a fresh compile)
//    and cached (what a request pays on a cache hit: the schema read into a grammar, its text
//    looked up). Medians of several runs.
// 2. Masks: random walks through each schema (each step a token drawn uniformly from the mask,
//    end tokens taken once allowed); the time of every fill_mask, median and p99 in us.
// 3. Decode (with --model, a model whose tokenizer is the same vocabulary): tokens/s at batch 1
//    and 16 with and without a schema, side by side, runs taking turns so that a shared
//    machine's drift slows both alike.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "edge/backend/engine/generator.h"
#include "edge/backend/grammar/compiled_grammar.h"
#include "edge/backend/model/model.h"
#include "edge/backend/runtime/cpu_executor.h"
#include "edge/common/format.h"
#include "edge/common/thread_pool.h"

namespace {

namespace g = edge::backend::grammar;
using clock_type = std::chrono::steady_clock;

double since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const auto at = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(at, v.size() - 1)];
}

struct named_schema {
  const char* name;
  const char* text;
};

// What agents ask for: a flat record, a nested one with arrays and enums, numbers with bounds,
// an anyOf union, a recursive $ref, and a tool's arguments with optional fields.
const std::vector<named_schema>& schemas() {
  static const std::vector<named_schema> list = {
      {"person", R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0,"maximum":150},"email":{"type":"string"}},"required":["name","age","email"],"additionalProperties":false})"},
      {"order", R"({"type":"object","properties":{"id":{"type":"string","format":"uuid"},"date":{"type":"string","format":"date"},"items":{"type":"array","items":{"type":"object","properties":{"sku":{"type":"string","maxLength":16},"qty":{"type":"integer","minimum":1,"maximum":99},"price":{"type":"number","minimum":0,"exclusiveMaximum":10000}},"required":["sku","qty","price"],"additionalProperties":false},"minItems":1,"maxItems":20},"status":{"enum":["pending","shipped","delivered"]}},"required":["id","date","items","status"],"additionalProperties":false})"},
      {"union", R"({"anyOf":[{"type":"object","properties":{"type":{"const":"circle"},"r":{"type":"number","exclusiveMinimum":0}},"required":["type","r"],"additionalProperties":false},{"type":"object","properties":{"type":{"const":"rect"},"w":{"type":"number"},"h":{"type":"number"}},"required":["type","w","h"],"additionalProperties":false}]})"},
      {"tree", R"({"$defs":{"node":{"type":"object","properties":{"label":{"type":"string","maxLength":24},"children":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":4}},"required":["label","children"],"additionalProperties":false}},"$ref":"#/$defs/node"})"},
      {"tool args", R"({"type":"object","properties":{"location":{"type":"string","description":"City"},"unit":{"type":"string","enum":["celsius","fahrenheit"]},"days":{"type":"integer","minimum":1,"maximum":14},"include_hourly":{"type":"boolean"}},"required":["location"],"additionalProperties":false})"},
      {"json_object", nullptr},
  };
  return list;
}

edge::result<g::grammar> grammar_of(const named_schema& s) {
  g::grammar_builder b;
  if (s.text == nullptr) return b.build(b.json_object());
  auto root = b.json_schema(s.text);
  if (!root.ok()) return edge::status(root.error());
  return b.build(*root);
}

struct options {
  std::string tokenizer;
  std::string model;
  int walks = 20;
  int walk_steps = 300;
  std::int64_t tokens = 24;
  int repeat = 3;
  std::size_t threads = 0;
};

int run(const options& opt) {
  auto tok = edge::backend::load_tokenizer(opt.tokenizer);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.error().message().c_str());
    return 1;
  }
  const auto started = clock_type::now();
  const auto vocabulary = g::token_vocabulary::create(**tok);
  std::printf("vocabulary: %lld tokens, trie of %lld nodes, longest token %lld bytes, built in %.0f ms\n\n",
              static_cast<long long>(vocabulary->size()), static_cast<long long>(vocabulary->trie_nodes()),
              static_cast<long long>(vocabulary->max_token_bytes()), since(started) * 1e3);

  std::printf("== compile (ms; median of %d) ==\n", opt.repeat);
  std::printf("%-12s %8s %8s %8s %10s %12s\n", "schema", "states", "tables", "cold", "cached", "table memory");
  std::vector<std::shared_ptr<const g::compiled_grammar>> compiled;
  for (const named_schema& s : schemas()) {
    std::vector<double> cold;
    std::shared_ptr<const g::compiled_grammar> last;
    for (int r = 0; r < opt.repeat; ++r) {
      const auto t = clock_type::now();
      auto grammar = grammar_of(s);
      auto made = g::compile(*grammar, vocabulary);
      cold.push_back(since(t));
      if (!made.ok()) {
        std::fprintf(stderr, "%s: %s\n", s.name, made.error().message().c_str());
        return 1;
      }
      last = *made;
    }
    // A cache hit: the schema read into a grammar, its text looked up.
    std::unordered_map<std::string, std::shared_ptr<const g::compiled_grammar>> cache;
    cache.emplace(grammar_of(s)->text(), last);
    std::vector<double> cached;
    for (int r = 0; r < 50; ++r) {
      const auto t = clock_type::now();
      auto grammar = grammar_of(s);
      const auto hit = cache.find(grammar->text());
      cached.push_back(since(t));
      if (hit == cache.end()) return 1;
    }
    std::printf("%-12s %8lld %8lld %8.1f %10.3f %10.1f MB\n", s.name, static_cast<long long>(last->stats().states),
                static_cast<long long>(last->stats().tables), percentile(cold, 0.5) * 1e3, percentile(cached, 0.5) * 1e3,
                static_cast<double>(last->stats().memory_bytes) / 1e6);
    compiled.push_back(last);
  }

  std::printf("\n== masks: fill_mask per token (us), random walks of %d steps at most ==\n", opt.walk_steps);
  std::printf("%-12s %8s %8s %8s %8s\n", "schema", "tokens", "median", "p99", "max");
  const std::int64_t vocab = vocabulary->size();
  std::vector<std::uint32_t> mask(static_cast<std::size_t>(g::mask_words(vocab)));
  std::vector<double> everything;
  for (std::size_t i = 0; i < compiled.size(); ++i) {
    std::vector<double> times;
    for (int w = 0; w < opt.walks; ++w) {
      std::mt19937_64 rng(static_cast<std::uint64_t>(w) * 7919 + i);
      g::grammar_matcher m(compiled[i]);
      std::vector<edge::backend::token_id> allowed;
      for (int step = 0; step < opt.walk_steps; ++step) {
        const auto t = clock_type::now();
        m.fill_mask(mask);
        times.push_back(since(t) * 1e6);
        if (m.can_end()) break;
        allowed.clear();
        for (std::int64_t id = 0; id < vocab; ++id) {
          if ((mask[static_cast<std::size_t>(id) / 32] >> (id % 32)) & 1u) allowed.push_back(static_cast<edge::backend::token_id>(id));
        }
        if (allowed.empty()) break;
        if (!m.accept(allowed[std::uniform_int_distribution<std::size_t>(0, allowed.size() - 1)(rng)])) return 1;
      }
    }
    everything.insert(everything.end(), times.begin(), times.end());
    std::printf("%-12s %8zu %8.1f %8.1f %8.1f\n", schemas()[i].name, times.size(), percentile(times, 0.5),
                percentile(times, 0.99), percentile(times, 1.0));
  }
  std::printf("%-12s %8zu %8.1f %8.1f %8.1f\n", "all", everything.size(), percentile(everything, 0.5),
              percentile(everything, 0.99), percentile(everything, 1.0));
  if (opt.model.empty()) return 0;

  std::printf("\n== decode tokens/s, synthetic model with this vocabulary (%s), with and without a schema ==\n",
              opt.model.c_str());
  auto loaded = edge::backend::load_model({.path = opt.model});
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", loaded.error().message().c_str());
    return 1;
  }
  const edge::backend::model& m = **loaded;
  const std::size_t threads = opt.threads > 0 ? opt.threads : std::max(1u, std::thread::hardware_concurrency());
  std::unique_ptr<edge::thread_pool> pool = threads > 1 ? std::make_unique<edge::thread_pool>(threads - 1) : nullptr;
  // A schema the outputs do not finish within the measured tokens: every sequence decodes them all.
  g::grammar_builder b;
  auto root = b.json_schema(R"({"type":"array","items":{"type":"string","maxLength":64},"minItems":64})");
  auto array_grammar = b.build(*root);
  const auto model_vocabulary = g::token_vocabulary::create(*m.tok);
  auto long_grammar = g::compile(*array_grammar, model_vocabulary);
  if (!long_grammar.ok()) return 1;
  std::printf("%6s %14s %14s %8s\n", "batch", "unconstrained", "schema", "ratio");
  for (const std::int64_t batch : {std::int64_t{1}, std::int64_t{16}}) {
    const std::int64_t prompt = 16;
    const auto layout = edge::backend::kv_cache_layout::for_tokens(m.config, edge::kernels::dtype::bf16, 16,
                                                                   (prompt + opt.tokens + 32) * batch + 64);
    auto cache = edge::backend::kv_cache::create(layout);
    auto exec = edge::backend::cpu_executor::create(
        m, **cache, pool.get(), {.max_batch_tokens = std::max<std::int64_t>(prompt * batch, 16), .max_sequences = batch});
    if (!exec.ok()) return 1;
    edge::backend::kv_block_pool blocks(layout.num_blocks);
    edge::backend::generator gen(m, **exec, blocks);
    std::vector<double> rates[2];
    for (int r = 0; r < opt.repeat; ++r) {
      for (int constrained = 0; constrained < 2; ++constrained) {
        std::vector<edge::backend::generate_request> requests(static_cast<std::size_t>(batch));
        for (std::size_t i = 0; i < requests.size(); ++i) {
          auto& q = requests[i];
          for (std::int64_t t = 0; t < prompt; ++t) q.prompt.push_back(static_cast<edge::backend::token_id>(1000 + 37 * t + 11 * static_cast<std::int64_t>(i)));
          q.max_tokens = opt.tokens;
          q.ignore_eos = true;
          q.sampling.temperature = 1.0f;
          q.sampling.seed = static_cast<std::uint64_t>(r * 100 + static_cast<int>(i));
          if (constrained) q.grammar = *long_grammar;
        }
        edge::backend::generation_timing timing;
        if (auto ran = gen.run(requests, {}, &timing); !ran.ok()) {
          std::fprintf(stderr, "%s\n", ran.error().message().c_str());
          return 1;
        }
        rates[constrained].push_back(static_cast<double>(timing.decode_tokens) / timing.decode_seconds);
      }
    }
    const double plain = percentile(rates[0], 0.5);
    const double with = percentile(rates[1], 0.5);
    std::printf("%6lld %8.2f (%.2f-%.2f) %8.2f (%.2f-%.2f) %8.3f\n", static_cast<long long>(batch), plain,
                percentile(rates[0], 0), percentile(rates[0], 1), with, percentile(rates[1], 0), percentile(rates[1], 1),
                with / plain);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options opt;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const std::string value = argv[i + 1];
    if (key == "--tokenizer") opt.tokenizer = value;
    else if (key == "--model") opt.model = value;
    else if (key == "--walks") opt.walks = std::atoi(value.c_str());
    else if (key == "--tokens") opt.tokens = std::atoll(value.c_str());
    else if (key == "--repeat") opt.repeat = std::atoi(value.c_str());
    else if (key == "--threads") opt.threads = static_cast<std::size_t>(std::atoll(value.c_str()));
    else {
      std::fprintf(stderr, "unknown option %s\n", key.c_str());
      return 2;
    }
  }
  if (opt.tokenizer.empty()) {
    std::fprintf(stderr, "usage: edge_bench_grammar --tokenizer tokenizer.json [--model DIR] [--walks N] [--tokens N]\n");
    return 2;
  }
  return run(opt);
}
