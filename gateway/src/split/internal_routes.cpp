#include "edge/gateway/split/internal_routes.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "edge/common/format.h"
#include "edge/common/sha256.h"
#include "edge/gateway/http/event_relay.h"
#include "edge/gateway/http/json_response.h"
#include "edge/gateway/openai/grammar_compiler.h"
#include "edge/gateway/openai/refusals.h"
#include "edge/gateway/tenancy/tenant.h"

namespace edge::gateway {
namespace {

// 256 bits, as an API key's secret.
constexpr std::size_t internal_token_bytes = 32;
// A token file is one line; anything much longer is not one.
constexpr std::size_t max_token_file_bytes = 4096;
constexpr mode_t owner_only = 0600;
constexpr mode_t group_or_others = 0077;

status file_error(std::string_view what, const std::filesystem::path& file, int error) {
  return unavailable(format("cannot {} {}: {}", what, file.string(), std::strerror(error)));
}

// The token in `file`; not_found when there is no such file.
result<std::string> read_token_file(const std::filesystem::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return not_found(format("no {}", file.string()));
    return file_error("open", file, errno);
  }
  struct stat st {};
  std::array<char, max_token_file_bytes> buffer{};
  std::size_t size = 0;
  int error = ::fstat(fd, &st) == 0 ? 0 : errno;
  while (error == 0 && size < buffer.size()) {
    const ssize_t n = ::read(fd, buffer.data() + size, buffer.size() - size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) error = errno;
    if (n <= 0) break;
    size += static_cast<std::size_t>(n);
  }
  ::close(fd);
  if (error != 0) return file_error("read", file, error);
  // As ssh does with keys: a token others can read guards nothing.
  if ((st.st_mode & group_or_others) != 0) {
    return failed_precondition(format("{} may be read by others (mode 0{}{}{}): chmod 600 {}", file.string(),
                                      (st.st_mode >> 6) & 7, (st.st_mode >> 3) & 7, st.st_mode & 7, file.string()));
  }
  std::string_view text(buffer.data(), size);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.remove_suffix(1);
  const bool one_word = text.find_first_of(" \t\r\n") == std::string_view::npos;
  if (text.size() < min_internal_token_length || !one_word) {
    return failed_precondition(format("{} holds no token of at least {} characters on one line: fix it, or remove it "
                                      "and a new one is made on the next start",
                                      file.string(), min_internal_token_length));
  }
  return std::string(text);
}

// Writes `token` to `file` unless the file exists: written whole to a file of its own first,
// then linked into place, so that a backend starting at the same time on the same folder reads
// either no token file or the whole token. False when the file existed.
result<bool> create_token_file(const std::filesystem::path& file, std::string_view token) {
  std::filesystem::path partial = file;
  partial += format(".{}.partial", ::getpid());
  const int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, owner_only);
  if (fd < 0) return file_error("create", partial, errno);
  const std::string line = std::string(token) + "\n";
  std::size_t written = 0;
  int error = ::fchmod(fd, owner_only) == 0 ? 0 : errno;
  while (error == 0 && written < line.size()) {
    const ssize_t n = ::write(fd, line.data() + written, line.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) error = errno;
    if (n <= 0) break;
    written += static_cast<std::size_t>(n);
  }
  if (error == 0 && ::fsync(fd) != 0) error = errno;
  ::close(fd);
  if (error != 0) {
    ::unlink(partial.c_str());
    return file_error("write", partial, error);
  }
  const int linked = ::link(partial.c_str(), file.c_str());
  const int link_error = errno;
  ::unlink(partial.c_str());
  if (linked == 0) return true;
  if (link_error == EEXIST) return false;
  return file_error("create", file, link_error);
}

using namespace boost::asio::experimental::awaitable_operators;
using clock = std::chrono::steady_clock;

response text_response(http::status code, std::string body, std::string_view content_type) {
  response res{code, 11};
  res.set(http::field::content_type, content_type);
  res.body() = std::move(body);
  return res;
}

class internal_service {
 public:
  internal_service(const internal_backend_slot& backends, internal_route_options options)
      : backends_(backends), options_(std::move(options)) {}

  asio::awaitable<void> info(exchange& ex);
  asio::awaitable<void> load(exchange& ex);
  asio::awaitable<void> generate(exchange& ex);

 private:
  // The engine, or nothing when a refusal (401, 503) was answered.
  asio::awaitable<std::shared_ptr<const internal_backend>> admit(exchange& ex);

  const internal_backend_slot& backends_;
  internal_route_options options_;
};

asio::awaitable<std::shared_ptr<const internal_backend>> internal_service::admit(exchange& ex) {
  const std::string_view header = ex.req()[http::field::authorization];
  constexpr std::string_view bearer = "Bearer ";
  const std::string_view presented = header.starts_with(bearer) ? header.substr(bearer.size()) : std::string_view{};
  // Digests compared, so neither the token's length nor its contents leak by timing.
  const sha256_digest expected = sha256(options_.token);
  const sha256_digest got = sha256(presented);
  if (options_.token.empty() || !constant_time_equal(expected, got)) {
    co_await ex.respond(error_response(http::status::unauthorized, "The internal token is missing or wrong",
                                       "invalid_request_error", std::nullopt, "invalid_internal_token"));
    co_return nullptr;
  }
  auto backend = backends_.get();
  if (backend == nullptr) {
    response res = refusal_response({.kind = refusal_kind::model_not_ready, .message = "The model is still loading"});
    co_await ex.respond(std::move(res));
  }
  co_return backend;
}

asio::awaitable<void> internal_service::info(exchange& ex) {
  const auto backend = co_await admit(ex);
  if (backend == nullptr) co_return;
  co_await ex.respond(text_response(http::status::ok, encode_info(backend->info), "application/json"));
}

asio::awaitable<void> internal_service::load(exchange& ex) {
  const auto backend = co_await admit(ex);
  if (backend == nullptr) co_return;
  const backend_load_report report = load_report_from(backend->engine->stats(), backend->info.block_size);
  co_await ex.respond(text_response(http::status::ok, encode_load(report), "application/json"));
}

// GCC 12 reports a mismatched operator delete inside the coroutine frames that Asio's awaitable
// operators create (a known false positive; openai_routes.cpp explains).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

asio::awaitable<void> internal_service::generate(exchange& ex) {
  const auto backend = co_await admit(ex);
  if (backend == nullptr) co_return;
  auto parsed = parse_generate_request(ex.req().body());
  std::optional<internal_request_error> refused;
  if (auto* error = std::get_if<internal_request_error>(&parsed)) {
    refused = std::move(*error);
  } else {
    refused = check_generate_request(std::get<parsed_generate_request>(parsed).request, backend->info);
  }
  if (refused) {
    response answer = refusal_response({.kind = refused->kind, .message = refused->message, .param = refused->param});
    co_await ex.respond(std::move(answer));
    co_return;
  }
  backend::generate_request& request = std::get<parsed_generate_request>(parsed).request;
  if (const auto& grammar = std::get<parsed_generate_request>(parsed).grammar; grammar != nullptr) {
    // Compiled off this thread in the tenant's turn (cached per tenant: the same grammar a gateway
    // sends again for that tenant is found at once); a gateway that leaves first costs no compile.
    auto compiled = co_await backend->grammars->compile_unless(request.tenant, grammar, ex.watch_disconnect());
    if (!compiled) co_return;  // the gateway is gone
    if (!compiled->ok()) {
      response not_compiled = refusal_response(refusal_of(compiled->error(), "grammar"));
      co_await ex.respond(std::move(not_compiled));
      co_return;
    }
    request.grammar = std::move(*compiled).value();
  }
  if (request.id.empty()) request.id = ex.request_id();
  ex.access().tenant = request.tenant;
  const auto prompt_tokens = static_cast<std::int64_t>(request.prompt.size());
  ex.access().prompt_tokens = prompt_tokens;

  const asio::any_io_executor strand = co_await asio::this_coro::executor;
  auto events = std::make_shared<event_relay>(strand);
  auto submitted = backend->engine->submit(std::move(request), relay_sink(events, strand));
  if (!submitted.ok()) {
    // Read back by the split gateway with the same table: refusal_kind_of, then split_handling.
    response answer = refusal_response(refusal_of(submitted.error()));
    co_await ex.respond(std::move(answer));
    co_return;
  }
  // Destroying the handle (leaving this coroutine in any way, the gateway gone included)
  // cancels the request.
  const backend::request_handle handle = std::move(submitted).value();

  http::response_header<> head;
  head.result(http::status::ok);
  head.set(http::field::content_type, ndjson_content_type);
  head.set(http::field::cache_control, "no-cache");
  head.set("x-accel-buffering", "no");
  if (!co_await ex.begin_stream(std::move(head))) co_return;
  clock::time_point last_write = clock::now();
  std::int64_t completion_tokens = 0;

  for (;;) {
    // Everything queued goes out as one chunk.
    std::string lines;
    bool finished = false;
    while (!events->events.empty()) {
      const backend::engine_event event = std::move(events->events.front());
      events->events.pop_front();
      if (const auto* delta = std::get_if<backend::delta_event>(&event)) {
        completion_tokens += static_cast<std::int64_t>(delta->tokens.size());
      }
      if (const auto* done = std::get_if<backend::finished_event>(&event)) {
        ex.access().cached_tokens = done->usage.cached_tokens;
        finished = true;
      }
      lines += encode_event(event);
    }
    if (!lines.empty()) {
      ex.access().completion_tokens = completion_tokens;
      if (!co_await ex.write_chunk(lines)) co_return;
      last_write = clock::now();
    }
    if (finished) {
      co_await ex.end_stream();
      co_return;
    }
    if (ex.was_cut()) {
      // Ended as the engine ends a request it aborts at shutdown, with what was generated: the
      // gateway answers its client with that error (or, before the first token, tries another
      // backend). The handle cancels the request here.
      backend::finished_event cut{.reason = backend::finish_reason::abort,
                                  .usage = {.prompt_tokens = prompt_tokens, .completion_tokens = completion_tokens},
                                  .timings = {},
                                  .error = "the backend is shutting down"};
      ex.record_stream_failure(http::status::service_unavailable);
      if (co_await ex.write_chunk(encode_event(cut))) co_await ex.end_stream();
      co_return;
    }

    // Events posted while the chunk was being written found no wait to cancel: send them now
    // rather than after the heartbeat.
    if (!events->events.empty()) continue;
    // Sleep until an event arrives, the heartbeat is due, or the gateway leaves.
    events->wake.expires_at(last_write + options_.heartbeat);
    const auto woken = co_await (events->wake.async_wait(asio::as_tuple(asio::use_awaitable)) || ex.watch_disconnect());
    if (woken.index() == 1 && !ex.was_cut()) co_return;  // the gateway is gone: the handle cancels the request
    if (events->events.empty() && clock::now() >= last_write + options_.heartbeat) {
      if (!co_await ex.write_chunk(encode_heartbeat())) co_return;
      last_write = clock::now();
    }
  }
}

#pragma GCC diagnostic pop

}  // namespace

void internal_backend_slot::publish(std::shared_ptr<const internal_backend> backend) {
  std::lock_guard lock(mutex_);
  backend_ = std::move(backend);
}

std::shared_ptr<const internal_backend> internal_backend_slot::get() const {
  std::lock_guard lock(mutex_);
  return backend_;
}

result<stored_internal_token> load_or_create_internal_token(const std::filesystem::path& state_dir) {
  std::error_code ec;
  std::filesystem::create_directories(state_dir, ec);
  if (ec) return unavailable(format("cannot create the state directory {}: {}", state_dir.string(), ec.message()));
  stored_internal_token stored{.token = {}, .file = state_dir / internal_token_file_name, .created = false};
  auto existing = read_token_file(stored.file);
  if (existing.ok()) {
    stored.token = std::move(existing).value();
    return stored;
  }
  if (existing.error().code() != status_code::not_found) return existing.error();
  const std::string token = generate_secret_text(internal_token_bytes);
  EDGE_ASSIGN_OR_RETURN(const bool created, create_token_file(stored.file, token));
  if (!created) {
    // Another backend made it first: both use that one.
    EDGE_ASSIGN_OR_RETURN(stored.token, read_token_file(stored.file));
    return stored;
  }
  stored.token = token;
  stored.created = true;
  return stored;
}

void add_internal_routes(router& routes, const internal_backend_slot& backends, internal_route_options options) {
  auto service = std::make_shared<internal_service>(backends, std::move(options));
  routes.add(http::verb::post, std::string(internal_generate_path), [service](exchange& ex) -> asio::awaitable<void> {
    co_await service->generate(ex);
  });
  routes.add(http::verb::get, std::string(internal_info_path), [service](exchange& ex) -> asio::awaitable<void> {
    co_await service->info(ex);
  });
  routes.add(http::verb::get, std::string(internal_load_path), [service](exchange& ex) -> asio::awaitable<void> {
    co_await service->load(ex);
  });
}

}  // namespace edge::gateway
