#include "edge/gateway/generation_backend.h"

namespace edge::gateway {
namespace {

class local_handle final : public generation_handle {
 public:
  explicit local_handle(backend::request_handle handle) : handle_(std::move(handle)) {}

 private:
  backend::request_handle handle_;  // cancels the request when destroyed
};

}  // namespace

boost::asio::awaitable<result<std::unique_ptr<generation_handle>>> local_generation_backend::submit(
    backend::generate_request request, backend::event_sink sink) {
  auto submitted = engine_.submit(std::move(request), std::move(sink));
  if (!submitted.ok()) co_return submitted.error();
  co_return std::unique_ptr<generation_handle>(std::make_unique<local_handle>(std::move(submitted).value()));
}

}  // namespace edge::gateway
