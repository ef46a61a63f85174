#include "edge/bench/runner.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <deque>
#include <exception>

// GCC 12 reports a mismatched operator delete in the frames of Asio's awaitables: Asio
// allocates and frees them with its own matching pair, which the warning's inlining-based
// analysis does not see through (a known false positive; the gateway does the same).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace edge::bench {
namespace {

using clock = std::chrono::steady_clock;
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

// Warm-up requests take their prompts from far past the measured ones (of every point), so they
// never warm a prefix cache for the requests that are measured.
constexpr std::size_t warmup_index_base = std::size_t{1} << 62;

void rethrow(const std::exception_ptr& e) {
  if (e) std::rethrow_exception(e);
}

// Requests in flight and a timer cancelled whenever one ends. io_context thread only.
struct flight {
  explicit flight(const asio::any_io_executor& executor) : changed(executor, clock::time_point::max()) {}
  std::int64_t in_flight = 0;
  asio::steady_timer changed;

  asio::awaitable<void> wait_below(std::int64_t limit) {
    while (in_flight >= limit) {
      changed.expires_at(clock::time_point::max());
      co_await changed.async_wait(use_tuple);
    }
  }
};

asio::awaitable<void> warm_up(connection_pool& pool, const client_options& client, const dataset& data,
                              const point_options& options, point_result& out) {
  if (options.warmup_requests <= 0) co_return;
  const asio::any_io_executor executor = co_await asio::this_coro::executor;
  flight f(executor);
  const std::int64_t limit = options.concurrency.value_or(options.warmup_requests);
  for (std::int64_t i = 0; i < options.warmup_requests; ++i) {
    co_await f.wait_below(limit);
    ++f.in_flight;
    const request_spec spec = data.at(warmup_index_base + options.first_request + static_cast<std::size_t>(i));
    asio::co_spawn(
        executor,
        [&, spec]() -> asio::awaitable<void> {
          const request_record r = co_await send_request(pool, client, spec, clock::now());
          if (r.success) {
            ++out.warmup_completed;
            out.warmup_output_tokens += r.output_tokens();
            out.warmup_input_tokens += r.input_tokens();
          } else {
            ++out.warmup_failed;
          }
          --f.in_flight;
          f.changed.cancel();
        },
        rethrow);
  }
  co_await f.wait_below(1);
}

asio::awaitable<void> drive(connection_pool& pool, const client_options& client, const dataset& data,
                            const point_options& options, const progress_callback& progress, point_result& out) {
  co_await warm_up(pool, client, data, options, out);

  const asio::any_io_executor executor = co_await asio::this_coro::executor;
  flight f(executor);
  asio::steady_timer pacing(executor);
  poisson_arrivals arrivals(options.request_rate, options.seed);
  const clock::time_point origin = clock::now();
  const std::optional<clock::time_point> stop_at =
      options.duration ? std::optional(origin + *options.duration) : std::nullopt;
  const std::int64_t total = options.duration ? 0 : options.num_requests;
  std::int64_t finished = 0;
  clock::time_point last_end = origin;
  const auto past_stop = [&] { return stop_at && clock::now() >= *stop_at; };

  for (std::size_t index = 0;; ++index) {
    if (!options.duration && static_cast<std::int64_t>(index) >= options.num_requests) break;
    const auto arrival = origin + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(arrivals.next()));
    if (stop_at && arrival >= *stop_at) break;
    if (arrival > clock::now()) {
      pacing.expires_at(arrival);
      co_await pacing.async_wait(use_tuple);
    }
    if (options.concurrency) co_await f.wait_below(*options.concurrency);
    if (past_stop()) break;
    ++f.in_flight;
    out.records.emplace_back();
    asio::co_spawn(
        executor,
        [&, index, spec = data.at(options.first_request + index)]() -> asio::awaitable<void> {
          request_record r = co_await send_request(pool, client, spec, origin);
          out.records[index] = std::move(r);
          last_end = clock::now();
          --f.in_flight;
          ++finished;
          f.changed.cancel();
          if (progress) progress(finished, total, std::chrono::duration<double>(last_end - origin).count());
        },
        rethrow);
  }
  co_await f.wait_below(1);
  out.duration_s = std::chrono::duration<double>(last_end - origin).count();
}

asio::awaitable<void> drive_sessions(connection_pool& pool, const client_options& client, const dataset& data,
                                     const point_options& options, const progress_callback& progress,
                                     point_result& out) {
  co_await warm_up(pool, client, data, options, out);

  const asio::any_io_executor executor = co_await asio::this_coro::executor;
  flight f(executor);
  const std::int64_t limit = options.concurrency.value_or(1);
  const auto sessions = static_cast<std::size_t>(data.options().sessions);
  const std::int64_t total = data.options().sessions * data.options().turns;
  // Every session's conversation, owned here; `ready` holds the sessions waiting to send their
  // next turn, longest waiting first.
  std::vector<agent_conversation> conversations;
  conversations.reserve(sessions);
  std::deque<std::size_t> ready;
  for (std::size_t s = 0; s < sessions; ++s) {
    conversations.emplace_back(data, options.first_request + s);
    ready.push_back(s);
  }
  const clock::time_point origin = clock::now();
  clock::time_point last_end = origin;
  std::int64_t finished = 0;
  for (;;) {
    co_await f.wait_below(limit);
    while (ready.empty() && f.in_flight > 0) {
      f.changed.expires_at(clock::time_point::max());
      co_await f.changed.async_wait(use_tuple);
    }
    if (ready.empty()) break;
    const std::size_t s = ready.front();
    ready.pop_front();
    const std::size_t index = out.records.size();
    out.records.emplace_back();
    ++f.in_flight;
    asio::co_spawn(
        executor,
        [&, s, index, spec = conversations[s].next()]() -> asio::awaitable<void> {
          request_record r = co_await send_request(pool, client, spec, origin);
          agent_conversation& conversation = conversations[s];
          if (r.success) {
            conversation.answered(std::move(r.output_text));
            if (!conversation.finished()) ready.push_back(s);
          } else {
            ++out.sessions_cut;
          }
          r.output_text.clear();
          out.records[index] = std::move(r);
          last_end = clock::now();
          --f.in_flight;
          ++finished;
          f.changed.cancel();
          if (progress) progress(finished, total, std::chrono::duration<double>(last_end - origin).count());
        },
        rethrow);
  }
  out.duration_s = std::chrono::duration<double>(last_end - origin).count();
}

}  // namespace

point_result run_point(const client_options& client, const dataset& data, const point_options& options,
                       const progress_callback& progress) {
  asio::io_context context(1);
  connection_pool pool(context.get_executor(), client.url);
  point_result out;
  asio::co_spawn(context, drive(pool, client, data, options, progress, out), rethrow);
  context.run();
  out.connections_opened = pool.connections_opened();
  return out;
}

point_result run_sessions(const client_options& client, const dataset& data, const point_options& options,
                          const progress_callback& progress) {
  client_options keeping = client;
  keeping.keep_output_text = true;
  asio::io_context context(1);
  connection_pool pool(context.get_executor(), keeping.url);
  point_result out;
  asio::co_spawn(context, drive_sessions(pool, keeping, data, options, progress, out), rethrow);
  context.run();
  out.connections_opened = pool.connections_opened();
  return out;
}

}  // namespace edge::bench
