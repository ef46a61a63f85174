// Drives one benchmark point: a fixed number of requests in flight (closed loop), or arrivals
// at a Poisson rate (open loop), optionally with a cap on requests in flight too; or, for the
// agent dataset, sessions whose turns follow one another.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "edge/bench/client.h"
#include "edge/bench/stats.h"
#include "edge/bench/workload.h"

namespace edge::bench {

struct point_options {
  std::optional<std::int64_t> concurrency;  // none: unbounded (open loop only)
  double request_rate = unlimited_rate;     // requests/s; infinite: as fast as the slots allow
  std::int64_t num_requests = 0;            // used when duration is none
  std::optional<std::chrono::milliseconds> duration;  // send new requests until then
  std::int64_t warmup_requests = 0;         // sent first at the same concurrency, not measured
  std::uint64_t seed = 0;                   // arrivals
  std::size_t first_request = 0;            // the dataset index of the first measured request (dataset::point_start)
};

struct point_result {
  std::vector<request_record> records;  // in the order requests were started
  double duration_s = 0;
  std::int64_t warmup_completed = 0;
  std::int64_t warmup_failed = 0;
  std::int64_t warmup_output_tokens = 0;  // by usage, else deltas
  std::int64_t warmup_input_tokens = 0;
  std::int64_t connections_opened = 0;
  std::int64_t sessions_cut = 0;  // agent dataset: sessions a failed turn ended before their last
};

// Called on the run's thread after each measured request ends: (finished, total or 0 when
// running for a duration, elapsed seconds).
using progress_callback = std::function<void(std::int64_t done, std::int64_t total, double elapsed_s)>;

// Runs the point to completion on its own io_context (one thread: the client does little but
// wait, and one thread keeps every timestamp on one clock without locks).
point_result run_point(const client_options& client, const dataset& data, const point_options& options,
                       const progress_callback& progress);

// The agent dataset's point: sessions first_request .. first_request + sessions - 1, each sending
// its turns one after another (a turn starts when the previous one has ended, with the answer
// it got), up to `concurrency` requests in flight (1 when unset). The next request is the next
// turn of the session that has waited longest since its last answer, so every session's turns
// interleave with all the others', as many agents' do on one server. A failed turn ends its
// session. The warm-up sends the first turns of sessions far past the measured ones. Rate and
// duration do not apply.
point_result run_sessions(const client_options& client, const dataset& data, const point_options& options,
                          const progress_callback& progress);

}  // namespace edge::bench
