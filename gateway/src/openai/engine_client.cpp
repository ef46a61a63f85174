#include "edge/gateway/openai/engine_client.h"

namespace edge::gateway {

// The in-process engine's requests are compiled by the gateway (serving_model::grammars) before
// they come here: request.grammar holds what `grammar` would say.
boost::asio::awaitable<result<backend::request_handle, backend::submit_error>> local_engine_client::submit(
    backend::generate_request request, backend::event_sink sink, std::shared_ptr<const backend::grammar::grammar>) {
  co_return engine_.submit(std::move(request), std::move(sink));
}

}  // namespace edge::gateway
