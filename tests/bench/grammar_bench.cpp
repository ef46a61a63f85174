// Structured outputs: what grammar-constrained decoding costs (docs/performance.md).
//
//   edge_bench_grammar (--model DIR | --tokenizer tokenizer.json) [--only a,b] [--walks 20]
//                      [--decode] [--tokens 24] [--repeat 3]
//
// 1. Compile: each schema of the corpus compiled for the vocabulary, cold (a fresh compile: time,
//    the heap's peak above what it held before, what the compiled grammar keeps on the heap, and
//    what compile_stats::memory_bytes says it keeps) and cached (what a request pays on a cache
//    hit: the schema read into a grammar, its text looked up). Medians of --repeat runs.
// 2. Limits: schemas past compile_limits, and how long the refusal takes.
// 3. Masks: random walks through each schema (each step a token drawn uniformly from the mask,
//    end tokens taken once allowed); the time of every fill_mask, median and p99 in us.
// 4. Decode (--decode, with --model): tokens/s at batch 1 and 16 with and without a schema, side
//    by side, runs taking turns so that a shared machine's drift slows both alike.
//
// --model reads the tokenizer as serving does (the folder's tokenizer.json and
// tokenizer_config.json); --only compiles and walks the named schemas only (one at a time under
// `timeout`, for code whose compiles take minutes).
#include <malloc.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "edge/backend/engine/generator.h"
#include "edge/backend/grammar/compiled_grammar.h"
#include "edge/backend/model/model.h"
#include "edge/backend/runtime/cpu_executor.h"
#include "edge/common/format.h"
#include "edge/common/thread_pool.h"
#include "schema_shapes.h"

// ---- heap accounting: every operator new of the process, live bytes and their peak ----------------

namespace {

std::atomic<std::int64_t> heap_live{0};
std::atomic<std::int64_t> heap_peak{0};

void* counted(void* p) {
  if (p == nullptr) throw std::bad_alloc();
  const auto now = heap_live.fetch_add(static_cast<std::int64_t>(malloc_usable_size(p))) +
                   static_cast<std::int64_t>(malloc_usable_size(p));
  for (std::int64_t seen = heap_peak.load(); now > seen && !heap_peak.compare_exchange_weak(seen, now);) {
  }
  return p;
}

void uncounted(void* p) noexcept {
  if (p == nullptr) return;
  heap_live.fetch_sub(static_cast<std::int64_t>(malloc_usable_size(p)));
  std::free(p);
}

void* aligned(std::size_t n, std::align_val_t a) {
  const auto alignment = static_cast<std::size_t>(a);
  return std::aligned_alloc(alignment, (n + alignment - 1) / alignment * alignment);
}

}  // namespace

void* operator new(std::size_t n) { return counted(std::malloc(n == 0 ? 1 : n)); }
void* operator new[](std::size_t n) { return counted(std::malloc(n == 0 ? 1 : n)); }
void* operator new(std::size_t n, std::align_val_t a) { return counted(aligned(n == 0 ? 1 : n, a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted(aligned(n == 0 ? 1 : n, a)); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  void* p = std::malloc(n == 0 ? 1 : n);
  return p == nullptr ? nullptr : counted(p);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  void* p = std::malloc(n == 0 ? 1 : n);
  return p == nullptr ? nullptr : counted(p);
}
void operator delete(void* p) noexcept { uncounted(p); }
void operator delete[](void* p) noexcept { uncounted(p); }
void operator delete(void* p, std::size_t) noexcept { uncounted(p); }
void operator delete[](void* p, std::size_t) noexcept { uncounted(p); }
void operator delete(void* p, std::align_val_t) noexcept { uncounted(p); }
void operator delete[](void* p, std::align_val_t) noexcept { uncounted(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { uncounted(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { uncounted(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { uncounted(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { uncounted(p); }

namespace {

namespace g = edge::backend::grammar;
using clock_type = std::chrono::steady_clock;
using edge::testing::enum_schema;
using edge::testing::properties_schema;

double since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

// This thread's CPU seconds: on a shared machine, what a compile costs apart from the time it
// waited for a core.
double thread_cpu() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}
double mb(std::int64_t bytes) { return static_cast<double>(bytes) / 1e6; }

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const auto at = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(at, v.size() - 1)];
}

struct named_schema {
  std::string name;
  std::string text;  // empty: json_object
};

// The corpus: what agents send (a flat record, an order with arrays and enums, a union, a
// recursive tree, a tool's arguments, json_object) and the shapes that made compiles slow
// (a long bounded string, a large enum, many properties, nested arrays).
std::vector<named_schema> corpus() {
  return {
      {"person", R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0,"maximum":150},"email":{"type":"string"}},"required":["name","age","email"],"additionalProperties":false})"},
      {"order", R"({"type":"object","properties":{"id":{"type":"string","format":"uuid"},"date":{"type":"string","format":"date"},"items":{"type":"array","items":{"type":"object","properties":{"sku":{"type":"string","maxLength":16},"qty":{"type":"integer","minimum":1,"maximum":99},"price":{"type":"number","minimum":0,"exclusiveMaximum":10000}},"required":["sku","qty","price"],"additionalProperties":false},"minItems":1,"maxItems":20},"status":{"enum":["pending","shipped","delivered"]}},"required":["id","date","items","status"],"additionalProperties":false})"},
      {"union", R"({"anyOf":[{"type":"object","properties":{"type":{"const":"circle"},"r":{"type":"number","exclusiveMinimum":0}},"required":["type","r"],"additionalProperties":false},{"type":"object","properties":{"type":{"const":"rect"},"w":{"type":"number"},"h":{"type":"number"}},"required":["type","w","h"],"additionalProperties":false}]})"},
      {"tree", R"({"$defs":{"node":{"type":"object","properties":{"label":{"type":"string","maxLength":24},"children":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":4}},"required":["label","children"],"additionalProperties":false}},"$ref":"#/$defs/node"})"},
      {"tool args", R"({"type":"object","properties":{"location":{"type":"string","description":"City"},"unit":{"type":"string","enum":["celsius","fahrenheit"]},"days":{"type":"integer","minimum":1,"maximum":14},"include_hourly":{"type":"boolean"}},"required":["location"],"additionalProperties":false})"},
      {"json_object", ""},
      {"string 4096", R"({"type":"string","maxLength":4096})"},
      {"enum 1000", enum_schema(1000)},
      {"props 200", properties_schema(200)},
      {"nested arrays", R"({"type":"array","items":{"type":"array","items":{"type":"array","items":{"type":"array","items":{"type":"integer","minimum":-1000,"maximum":1000},"maxItems":16},"maxItems":16},"maxItems":16},"minItems":1,"maxItems":64})"},
      {"array 1024", R"({"type":"array","items":{"type":"object","properties":{"k":{"type":"string","maxLength":32},"v":{"type":"number"}},"required":["k","v"]},"maxItems":1024})"},
  };
}

// Schemas at and past compile_limits: compiled within them, or refused at once.
std::vector<named_schema> past_limits() {
  std::string three = R"({"type":"object","properties":{)";
  for (int i = 0; i < 3; ++i) three += edge::format(R"({}"s{}":{{"type":"string","maxLength":{}}})", i ? "," : "", i, 4096 - i);
  three += "}}";
  std::string strings = R"({"type":"object","properties":{)";
  for (int i = 0; i < 64; ++i) strings += edge::format(R"({}"s{}":{{"type":"string","maxLength":{}}})", i ? "," : "", i, 1000 + i);
  strings += "}}";
  std::string nested;
  for (int i = 0; i < 12; ++i) nested += R"({"anyOf":[{"type":"array","items":)";
  nested += R"({"type":"string","maxLength":64})";
  for (int i = 0; i < 12; ++i) nested += R"(},{"type":"array","items":{"type":"string"}}]})";
  return {{"3 strings ~4096", three},
          {"64 strings ~1000", strings},
          {"enum 20000", enum_schema(20000)},
          {"props 1000", properties_schema(1000)},
          {"anyOf arrays x12", nested},
          {"strings 100-2000", R"({"type":"object","properties":{"title":{"type":"string","maxLength":100},"summary":{"type":"string","maxLength":500},"body":{"type":"string","maxLength":2000}},"required":["title","summary","body"]})"},
          {"array 1024 x3", R"({"type":"array","items":{"type":"array","items":{"type":"array","items":{"type":"integer"},"maxItems":1024},"maxItems":1024},"maxItems":1024})"}};
}

edge::result<g::grammar> grammar_of(const named_schema& s) {
  g::grammar_builder b;
  if (s.text.empty()) return b.build(b.json_object());
  auto root = b.json_schema(s.text);
  if (!root.ok()) return edge::status(root.error());
  return b.build(*root);
}

struct options {
  std::string tokenizer;
  std::string model;
  std::set<std::string> only;
  bool decode = false;
  int walks = 20;
  int walk_steps = 300;
  std::int64_t tokens = 24;
  int repeat = 3;
  std::size_t threads = 0;
};

std::vector<named_schema> selected(std::vector<named_schema> all, const options& opt) {
  if (opt.only.empty()) return all;
  std::erase_if(all, [&](const named_schema& s) { return !opt.only.contains(s.name); });
  return all;
}

int decode(const options& opt);

int run(const options& opt) {
  auto tok = opt.model.empty() ? edge::backend::load_tokenizer(opt.tokenizer)
                               : edge::backend::load_model_tokenizer(opt.model);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.error().message().c_str());
    return 1;
  }
  const auto started = clock_type::now();
  const auto vocabulary = g::token_vocabulary::create(**tok);
  std::printf("tokenizer: %s, vocab_size %lld\n", opt.model.empty() ? opt.tokenizer.c_str() : opt.model.c_str(),
              static_cast<long long>((*tok)->vocab_size()));
  std::printf("vocabulary: %lld tokens, trie of %lld nodes, longest token %lld bytes, built in %.0f ms\n\n",
              static_cast<long long>(vocabulary->size()), static_cast<long long>(vocabulary->trie_nodes()),
              static_cast<long long>(vocabulary->max_token_bytes()), since(started) * 1e3);

  std::printf("== compile (ms, MB; median of %d; peak: the heap's high-water mark above where it was; kept: what the "
              "compiled grammar holds on the heap; stats: compile_stats::memory_bytes) ==\n",
              opt.repeat);
  std::printf("%-16s %8s %8s %9s %9s %9s %9s %9s %9s %9s\n", "schema", "states", "tables", "work M", "cold ms", "cpu ms",
              "cached ms", "peak MB", "kept MB", "stats MB");
  std::vector<std::pair<std::string, std::shared_ptr<const g::compiled_grammar>>> compiled;
  for (const named_schema& s : selected(corpus(), opt)) {
    std::vector<double> cold;
    std::vector<double> cpu;
    std::int64_t peak = 0;
    std::int64_t kept = 0;
    std::shared_ptr<const g::compiled_grammar> last;
    for (int r = 0; r < opt.repeat; ++r) {
      last.reset();
      const std::int64_t before = heap_live.load();
      heap_peak.store(before);
      {
        const auto t = clock_type::now();
        const double c = thread_cpu();
        auto grammar = grammar_of(s);
        if (!grammar.ok()) {
          std::fprintf(stderr, "%s: %s\n", s.name.c_str(), grammar.error().message().c_str());
          return 1;
        }
        auto made = g::compile(*grammar, vocabulary);
        cold.push_back(since(t));
        cpu.push_back(thread_cpu() - c);
        if (!made.ok()) {
          std::fprintf(stderr, "%s: %s\n", s.name.c_str(), made.error().message().c_str());
          return 1;
        }
        last = *made;
      }
      peak = heap_peak.load() - before;
      kept = heap_live.load() - before;
    }
    // A cache hit: the schema read into a grammar, its text looked up.
    std::unordered_map<std::string, std::shared_ptr<const g::compiled_grammar>> cache;
    cache.emplace(grammar_of(s)->text(), last);
    std::vector<double> cached;
    for (int r = 0; r < 20; ++r) {
      const auto t = clock_type::now();
      auto grammar = grammar_of(s);
      const auto hit = cache.find(grammar->text());
      cached.push_back(since(t));
      if (hit == cache.end()) return 1;
    }
    std::printf("%-16s %8lld %8lld %9.2f %9.1f %9.1f %9.3f %9.1f %9.1f %9.1f\n", s.name.c_str(),
                static_cast<long long>(last->stats().states), static_cast<long long>(last->stats().tables),
                static_cast<double>(last->stats().work) / 1e6, percentile(cold, 0.5) * 1e3, percentile(cpu, 0.5) * 1e3, percentile(cached, 0.5) * 1e3, mb(peak),
                mb(kept), mb(last->stats().memory_bytes));
    std::fflush(stdout);
    compiled.emplace_back(s.name, last);
  }

  const auto limited = selected(past_limits(), opt);
  if (!limited.empty()) {
    std::printf("\n== at and past the limits: compiled or refused, and how fast ==\n");
    std::printf("%-18s %9s %9s %9s\n", "schema", "ms", "cpu ms", "peak MB");
    for (const named_schema& s : limited) {
      const std::int64_t before = heap_live.load();
      heap_peak.store(before);
      const auto t = clock_type::now();
      const double c = thread_cpu();
      auto grammar = grammar_of(s);
      std::string outcome;
      if (!grammar.ok()) {
        outcome = "schema refused: " + grammar.error().message();
      } else if (auto made = g::compile(*grammar, vocabulary); made.ok()) {
        char line[160];
        std::snprintf(line, sizeof line, "compiled: %lld states, %lld tables, %.2f M steps, %.1f MB kept",
                      static_cast<long long>((*made)->stats().states), static_cast<long long>((*made)->stats().tables),
                      static_cast<double>((*made)->stats().work) / 1e6, mb((*made)->stats().memory_bytes));
        outcome = line;
      } else {
        outcome = "refused: " + made.error().message();
      }
      const double wall = since(t);
      std::printf("%-18s %9.1f %9.1f %9.1f  %s\n", s.name.c_str(), wall * 1e3, (thread_cpu() - c) * 1e3,
                  mb(heap_peak.load() - before), outcome.c_str());
      std::fflush(stdout);
    }
  }

  std::printf("\n== masks: fill_mask per token (us), random walks of %d steps at most ==\n", opt.walk_steps);
  std::printf("%-16s %8s %8s %8s %8s\n", "schema", "tokens", "median", "p99", "max");
  const std::int64_t vocab = vocabulary->size();
  std::vector<std::uint32_t> mask(static_cast<std::size_t>(g::mask_words(vocab)));
  std::vector<double> everything;
  for (std::size_t i = 0; i < compiled.size(); ++i) {
    std::vector<double> times;
    for (int w = 0; w < opt.walks; ++w) {
      std::mt19937_64 rng(static_cast<std::uint64_t>(w) * 7919 + i);
      g::grammar_matcher m(compiled[i].second);
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
    std::printf("%-16s %8zu %8.1f %8.1f %8.1f\n", compiled[i].first.c_str(), times.size(), percentile(times, 0.5),
                percentile(times, 0.99), percentile(times, 1.0));
  }
  std::printf("%-16s %8zu %8.1f %8.1f %8.1f\n", "all", everything.size(), percentile(everything, 0.5),
              percentile(everything, 0.99), percentile(everything, 1.0));
  if (!opt.decode || opt.model.empty()) return 0;
  return decode(opt);
}

int decode(const options& opt) {
  std::printf("\n== decode tokens/s, synthetic model with this vocabulary (%s), with and without a schema ==\n",
              opt.model.c_str());
  auto loaded = edge::backend::load_model({.path = opt.model});
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", loaded.error().message().c_str());
    return 1;
  }
  const edge::backend::model& m = **loaded;
  std::printf("model: vocab_size %lld (embedding rows), tokenizer vocab_size %lld\n",
              static_cast<long long>(m.config.vocab_size), static_cast<long long>(m.tok->vocab_size()));
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
  for (int i = 1; i < argc; ++i) {
    const std::string key = argv[i];
    if (key == "--decode") {
      opt.decode = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", key.c_str());
      return 2;
    }
    const std::string value = argv[++i];
    if (key == "--tokenizer") opt.tokenizer = value;
    else if (key == "--model") opt.model = value;
    else if (key == "--walks") opt.walks = std::atoi(value.c_str());
    else if (key == "--tokens") opt.tokens = std::atoll(value.c_str());
    else if (key == "--repeat") opt.repeat = std::atoi(value.c_str());
    else if (key == "--threads") opt.threads = static_cast<std::size_t>(std::atoll(value.c_str()));
    else if (key == "--only") {
      std::stringstream names(value);
      for (std::string name; std::getline(names, name, ',');) opt.only.insert(name);
    } else {
      std::fprintf(stderr, "unknown option %s\n", key.c_str());
      return 2;
    }
  }
  if (opt.tokenizer.empty() && opt.model.empty()) {
    std::fprintf(stderr,
                 "usage: edge_bench_grammar (--model DIR | --tokenizer tokenizer.json) [--only a,b] [--walks N] "
                 "[--decode] [--tokens N] [--repeat N]\n");
    return 2;
  }
  return run(opt);
}
