#include "edge/gateway/openai/engine_client.h"

namespace edge::gateway {

boost::asio::awaitable<result<backend::request_handle>> local_engine_client::submit(backend::generate_request request,
                                                                                    backend::event_sink sink) {
  co_return engine_.submit(std::move(request), std::move(sink));
}

}  // namespace edge::gateway
