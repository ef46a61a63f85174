// The serving engine on a real model (stories260K, or a synthetic one) with the real CPU
// executor, KV cache and block pool, and a sink that records every event for the test to wait on.
#pragma once

#include <doctest/doctest.h>

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>

#include "edge/backend/engine/engine.h"
#include "edge/backend/model/model.h"
#include "edge/backend/runtime/cpu_executor.h"
#include "edge/backend/runtime/kv_cache.h"
#include "edge/common/thread_pool.h"
#include "test_support.h"

namespace edge::testing {

using namespace edge::backend;

// The events of every request, recorded from the engine thread.
class event_log {
 public:
  struct request_events {
    int admitted = 0;
    int finished = 0;
    bool delta_before_admitted = false;
    std::vector<token_id> tokens;
    std::string text;
    std::optional<finished_event> end;
  };

  // A sink for request `name`. `on_event`, when given, runs on the engine thread after the
  // event is recorded (outside the lock): tests use it to hold the engine at a chosen point.
  event_sink sink(const std::string& name, std::function<void(const engine_event&)> on_event = {}) {
    return [this, name, on_event = std::move(on_event)](engine_event event) {
      {
        std::lock_guard lock(mutex_);
        auto& r = requests_[name];
        if (std::holds_alternative<admitted_event>(event)) ++r.admitted;
        if (const auto* d = std::get_if<delta_event>(&event)) {
          if (r.admitted == 0) r.delta_before_admitted = true;
          r.tokens.insert(r.tokens.end(), d->tokens.begin(), d->tokens.end());
          r.text += d->text;
        }
        if (const auto* f = std::get_if<finished_event>(&event)) {
          ++r.finished;
          r.end = *f;
        }
      }
      changed_.notify_all();
      if (on_event) on_event(event);
    };
  }

  // Waits (up to a minute: a hang is a failure, not a slow machine) until `done` holds.
  bool wait(const std::function<bool(const std::map<std::string, request_events>&)>& done) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, std::chrono::minutes(1), [&] { return done(requests_); });
  }
  bool wait_finished(const std::string& name) {
    return wait([&](const auto& all) { return all.contains(name) && all.at(name).finished > 0; });
  }
  bool wait_all_finished(std::size_t count) {
    return wait([&](const auto& all) {
      std::size_t n = 0;
      for (const auto& [name, r] : all) n += r.finished > 0 ? 1 : 0;
      return n >= count;
    });
  }

  request_events get(const std::string& name) {
    std::lock_guard lock(mutex_);
    return requests_[name];
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, request_events> requests_;
};

// A one-shot gate: the engine thread waits in a sink until the test opens it.
class gate {
 public:
  void wait_open() {
    std::unique_lock lock(mutex_);
    reached_ = true;
    changed_.notify_all();
    changed_.wait(lock, [&] { return open_; });
  }
  // Waits until the engine thread is held at the gate.
  bool wait_reached() {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, std::chrono::minutes(1), [&] { return reached_; });
  }
  void open() {
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool reached_ = false;
  bool open_ = false;
};

// Remembers the largest number of requests running at once, and the largest step.
class peak_observer final : public engine_observer {
 public:
  void on_step(const engine_step_report& report) override {
    std::lock_guard lock(mutex_);
    peak_running_ = std::max(peak_running_, report.running);
    peak_batch_tokens_ = std::max(peak_batch_tokens_, report.batch_tokens);
    for (const double q : report.queue_time) queue_times_.push_back(q);
  }
  std::int64_t peak_running() {
    std::lock_guard lock(mutex_);
    return peak_running_;
  }
  std::int64_t peak_batch_tokens() {
    std::lock_guard lock(mutex_);
    return peak_batch_tokens_;
  }
  std::vector<double> queue_times() {
    std::lock_guard lock(mutex_);
    return queue_times_;
  }

 private:
  std::mutex mutex_;
  std::int64_t peak_running_ = 0;
  std::int64_t peak_batch_tokens_ = 0;
  std::vector<double> queue_times_;
};

// A model with its cache, pool, executor and engine.
struct engine_setup {
  std::filesystem::path model_path = stories260k_dir() / "stories260K.gguf";
  kernels::dtype kv_dtype = kernels::dtype::f32;
  std::int64_t num_blocks = 256;               // or, when budget_bytes is set, from the budget
  std::size_t budget_bytes = 0;
  engine_options options;
};

struct engine_runtime {
  std::unique_ptr<model> m;
  std::unique_ptr<kv_cache> cache;
  std::unique_ptr<kv_block_pool> blocks;
  std::unique_ptr<cpu_executor> exec;
  std::unique_ptr<engine> eng;  // last: stopped before what it uses is destroyed

  explicit engine_runtime(engine_setup setup) {
    auto loaded = load_model({.path = setup.model_path});
    REQUIRE_MESSAGE(loaded.ok(), loaded.error().message());
    m = std::move(loaded).value();
    const std::int64_t block_size = setup.options.scheduler.block_size;
    const kv_cache_layout layout =
        setup.budget_bytes > 0 ? kv_cache_layout::for_budget(m->config, setup.kv_dtype, block_size, setup.budget_bytes)
                               : kv_cache_layout::for_tokens(m->config, setup.kv_dtype, block_size,
                                                             setup.num_blocks * block_size);
    auto c = kv_cache::create(layout);
    REQUIRE_MESSAGE(c.ok(), c.error().message());
    cache = std::move(c).value();
    blocks = std::make_unique<kv_block_pool>(cache->layout().num_blocks);
    auto e = cpu_executor::create(*m, *cache, nullptr,
                                  {.max_batch_tokens = setup.options.scheduler.max_num_batched_tokens,
                                   .max_sequences = setup.options.scheduler.max_num_seqs});
    REQUIRE_MESSAGE(e.ok(), e.error().message());
    exec = std::move(e).value();
    auto created = engine::create(*m->tok, *exec, *blocks, m->config.max_position, setup.options);
    REQUIRE_MESSAGE(created.ok(), created.error().message());
    eng = std::move(created).value();
  }

  std::vector<token_id> encode(const std::string& text) const {
    return m->tok->encode(text, {.add_bos = true, .parse_special = false});
  }
};

inline generate_request greedy_request(std::vector<token_id> prompt, std::int64_t max_tokens, std::string id = {}) {
  generate_request r;
  r.id = std::move(id);
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  r.ignore_eos = true;
  return r;
}

}  // namespace edge::testing
