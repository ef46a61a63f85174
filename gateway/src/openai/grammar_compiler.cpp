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

result<grammar_compiler::compiled, grammar::grammar_error> grammar_compiler::compile_now(const grammar::grammar& g) {
  std::call_once(vocabulary_once_, [this] { vocabulary_ = grammar::token_vocabulary::create(tok_); });
  const auto started = std::chrono::steady_clock::now();
  auto made = grammar::compile(g, vocabulary_);
  if (metrics_ != nullptr) {
    metrics_->grammar_compile_seconds.Observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  }
  if (!made.ok()) return made.error();
  return std::move(made).value();
}

void grammar_compiler::finish(const std::string& key, const answer& made) {
  std::vector<waiter> waiting;
  {
    std::lock_guard lock(mutex_);
    --queued_;
    if (made.ok()) remember(key, *made);
    const auto it = in_flight_.find(key);
    waiting = std::move(it->second);
    in_flight_.erase(it);
  }
  for (waiter& w : waiting) w(made);
}

void grammar_compiler::remember(const std::string& key, compiled value) {
  lru_.emplace_front(key, std::move(value));
  index_.emplace(key, lru_.begin());
  while (lru_.size() > std::max<std::size_t>(options_.cache_entries, 1)) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

asio::awaitable<grammar_compiler::answer> grammar_compiler::compile(std::shared_ptr<const grammar::grammar> g) {
  const std::string& key = g->text();
  if (compiled hit = lookup(key)) {
    if (metrics_ != nullptr) metrics_->grammar_cache_hits.Increment();
    co_return answer(std::move(hit));
  }
  // Joined to a compile of the same text in flight, or the one that starts it.
  enum class role { joined, compiles, refused } taken = role::compiles;
  answer out = co_await asio::async_initiate<const asio::use_awaitable_t<>&, void(answer)>(
      [this, &g, &key, &taken](auto resume) {
        // Resumes the request on its own executor, with a copy of the compile's answer.
        auto handler = std::make_shared<decltype(resume)>(std::move(resume));
        waiter wake = [handler](const answer& made) {
          const auto executor = asio::get_associated_executor(*handler);
          asio::post(executor, [handler, made = answer(made)]() mutable { std::move(*handler)(std::move(made)); });
        };
        {
          std::lock_guard lock(mutex_);
          if (const auto cached = index_.find(key); cached != index_.end()) {  // finished since the lookup
            taken = role::joined;
            wake(answer(cached->second->second));
            return;
          }
          if (const auto it = in_flight_.find(key); it != in_flight_.end()) {
            taken = role::joined;
            it->second.push_back(std::move(wake));
            return;
          }
          if (queued_ >= options_.max_queued) {
            taken = role::refused;
          } else {
            ++queued_;
            in_flight_[key].push_back(std::move(wake));
          }
        }
        if (taken == role::refused) {
          wake(answer(grammar::grammar_error(resource_exhausted(
              format("{} grammars are waiting to be compiled: try again shortly", options_.max_queued)))));
          return;
        }
        pool_->submit([this, g] { finish(g->text(), compile_now(*g)); });
      },
      asio::use_awaitable);
  if (metrics_ != nullptr) {
    if (taken == role::joined) {
      metrics_->grammar_cache_hits.Increment();
    } else if (taken == role::compiles) {
      metrics_->grammar_cache_misses.Increment();
    }
  }
  co_return out;
}

#pragma GCC diagnostic pop

}  // namespace edge::gateway
