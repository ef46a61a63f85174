// Where a request's grammar is compiled for the model's tokenizer: on a small pool of its own,
// so that neither an HTTP thread nor the engine thread ever spends the compile's time (the
// awaiting coroutine resumes on its own executor), with a bounded LRU cache of compiled
// grammars keyed by the grammar's canonical text (equal schemas, equal texts). Requests that
// bring the same text while it is being compiled wait for that compile rather than start one.
//
// `edgeinfer serve` compiles here before it submits; `edgeinfer backend` compiles what a split
// gateway sent (the gateway itself never compiles: the grammar's text travels to the backend).
#pragma once

#include <boost/asio/awaitable.hpp>

#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "edge/backend/grammar/compiled_grammar.h"
#include "edge/common/thread_pool.h"

namespace edge::monitoring {
struct gateway_metrics;
}

namespace edge::gateway {

struct grammar_compiler_options {
  std::size_t threads = 1;         // compiles at once
  std::size_t cache_entries = 64;  // compiled grammars kept (least recently used goes first)
  std::size_t max_queued = 64;     // compiles waiting beyond which a request is refused (503)
};

class grammar_compiler {
 public:
  // `tok` (and `metrics`, when not null) must outlive the compiler.
  grammar_compiler(const backend::tokenizer& tok, grammar_compiler_options options,
                   monitoring::gateway_metrics* metrics);
  // Waits for the compiles in flight (their requests resume on executors that must still run).
  ~grammar_compiler();

  using compiled = std::shared_ptr<const backend::grammar::compiled_grammar>;
  using answer = result<compiled, backend::grammar::grammar_error>;

  // The grammar compiled, from the cache, from a compile of the same text already in flight, or
  // made now off this thread. Errors: the grammar's (invalid_argument, with the path of the
  // piece at fault when it has one), or resource_exhausted when max_queued compiles are waiting.
  boost::asio::awaitable<answer> compile(std::shared_ptr<const backend::grammar::grammar> g);

  std::size_t cached() const;

 private:
  // Resumes one request waiting for a compile.
  using waiter = std::function<void(const answer&)>;

  answer compile_now(const backend::grammar::grammar& g);
  compiled lookup(const std::string& key);
  // Ends a compile: caches its grammar and resumes everyone waiting for it.
  void finish(const std::string& key, const answer& made);
  void remember(const std::string& key, compiled value);  // mutex_ held

  const backend::tokenizer& tok_;
  const grammar_compiler_options options_;
  monitoring::gateway_metrics* metrics_;
  std::once_flag vocabulary_once_;
  std::shared_ptr<const backend::grammar::token_vocabulary> vocabulary_;  // made by the first compile, then read-only

  mutable std::mutex mutex_;
  // Guarded by mutex_: most recently used first; the map points into the list.
  std::list<std::pair<std::string, compiled>> lru_;
  std::unordered_map<std::string, std::list<std::pair<std::string, compiled>>::iterator> index_;
  // Guarded by mutex_: per grammar text being compiled, the requests waiting for it; and how many
  // compiles are queued or running.
  std::unordered_map<std::string, std::vector<waiter>> in_flight_;
  std::size_t queued_ = 0;

  std::unique_ptr<thread_pool> pool_;  // declared last, destroyed first: queued compiles run while the rest exists
};

}  // namespace edge::gateway
