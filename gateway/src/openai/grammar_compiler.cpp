#include "edge/gateway/openai/grammar_compiler.h"

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>

#include "edge/common/format.h"
#include "edge/monitoring/gateway_metrics.h"

namespace edge::gateway {

namespace asio = boost::asio;
namespace grammar = backend::grammar;

grammar_compiler::grammar_compiler(const backend::tokenizer& tok, grammar_compiler_options options,
                                   monitoring::gateway_metrics* metrics)
    : tok_(tok),
      options_(options),
      metrics_(metrics),
      pool_(std::make_unique<thread_pool>(std::max<std::size_t>(options.threads, 1))) {}

grammar_compiler::~grammar_compiler() { pool_.reset(); }

std::size_t grammar_compiler::cached() const {
  std::lock_guard lock(mutex_);
  return lru_.size();
}

grammar_compiler::compiled grammar_compiler::lookup(const std::string& key) {
  std::lock_guard lock(mutex_);
  const auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

void grammar_compiler::store(const std::string& key, compiled value) {
  std::lock_guard lock(mutex_);
  if (index_.contains(key)) return;  // compiled twice at once: the first one stays
  lru_.emplace_front(key, std::move(value));
  index_.emplace(key, lru_.begin());
  while (lru_.size() > std::max<std::size_t>(options_.cache_entries, 1)) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

result<grammar_compiler::compiled, grammar::grammar_error> grammar_compiler::compile_now(const grammar::grammar& g) {
  std::call_once(vocabulary_once_, [this] { vocabulary_ = grammar::token_vocabulary::create(tok_); });
  const auto started = std::chrono::steady_clock::now();
  auto made = grammar::compile(g, vocabulary_);
  if (metrics_ != nullptr) {
    metrics_->grammar_compile_seconds.Observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  }
  if (!made.ok()) return made.error();
  store(g.text(), *made);
  return std::move(made).value();
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

asio::awaitable<result<grammar_compiler::compiled, grammar::grammar_error>> grammar_compiler::compile(
    std::shared_ptr<const grammar::grammar> g) {
  using answer = result<compiled, grammar::grammar_error>;
  if (compiled hit = lookup(g->text())) {
    if (metrics_ != nullptr) metrics_->grammar_cache_hits.Increment();
    co_return answer(std::move(hit));
  }
  if (metrics_ != nullptr) metrics_->grammar_cache_misses.Increment();
  if (queued_.fetch_add(1, std::memory_order_relaxed) >= options_.max_queued) {
    queued_.fetch_sub(1, std::memory_order_relaxed);
    co_return answer(grammar::grammar_error(
        resource_exhausted(format("{} grammars are waiting to be compiled: try again shortly", options_.max_queued))));
  }
  answer out = co_await asio::async_initiate<const asio::use_awaitable_t<>&, void(answer)>(
      [this, &g](auto resume) {
        pool_->submit([this, g, resume = std::move(resume)]() mutable {
          answer made = compile_now(*g);
          const auto executor = asio::get_associated_executor(resume);
          asio::post(executor, [resume = std::move(resume), made = std::move(made)]() mutable {
            std::move(resume)(std::move(made));
          });
          queued_.fetch_sub(1, std::memory_order_release);
        });
      },
      asio::use_awaitable);
  co_return out;
}

#pragma GCC diagnostic pop

}  // namespace edge::gateway
