// The seam between the OpenAI routes and an engine: where a tokenized request goes to be
// generated. Two implementations:
//
//   local_engine_client   the engine in this process (`edgeinfer serve`)
//   remote_backend_pool   the engines of `edgeinfer backend` processes, over HTTP (`edgeinfer
//                         gateway`; remote_backend_pool.h)
//
// submit() completes once the request is accepted (queued in an engine) or refused. Errors,
// as engine::submit's (engine.h, with the field at fault): invalid_argument / out_of_range for a
// request that can never run (the client's fault: a 400), resource_exhausted when the engine's queue is full,
// failed_precondition while shutting down, unavailable when the engine has failed or no
// backend could be reached (all 503). Once accepted, the sink gets the request's events
// as engine.h describes them, ending with exactly one finished event, unless the handle is
// destroyed first: destroying it cancels the request, and the engine frees its KV blocks.
#pragma once

#include <boost/asio/awaitable.hpp>

#include "edge/backend/engine/engine.h"
#include "edge/backend/grammar/grammar.h"
#include "edge/common/status.h"

namespace edge::gateway {

class engine_client {
 public:
  virtual ~engine_client() = default;
  // Awaited on the caller's connection strand; the handle is destroyed on that strand too. The
  // sink is called from any thread, one event at a time, in order, and must not block.
  //
  // `grammar` (null: none) is what the output must match, for an engine that compiles it
  // itself: a remote backend (its text travels with the request). Where the gateway compiles
  // (serving_model::grammars), the request arrives with request.grammar set and `grammar` is
  // not needed.
  virtual boost::asio::awaitable<result<backend::request_handle, backend::submit_error>> submit(
      backend::generate_request request, backend::event_sink sink,
      std::shared_ptr<const backend::grammar::grammar> grammar) = 0;
};

// The in-process engine: submit() is engine::submit() with no I/O in between. `engine` must
// outlive this object and every handle.
class local_engine_client final : public engine_client {
 public:
  explicit local_engine_client(backend::engine& engine) : engine_(engine) {}
  boost::asio::awaitable<result<backend::request_handle, backend::submit_error>> submit(
      backend::generate_request request, backend::event_sink sink,
      std::shared_ptr<const backend::grammar::grammar> grammar) override;

 private:
  backend::engine& engine_;
};

}  // namespace edge::gateway
