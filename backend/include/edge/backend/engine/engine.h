// The serving engine: the one seam between the gateway and the model.
//
// One engine thread owns the executor, the KV block pool and the scheduler and runs steps of
// continuous batching for as long as there is work. Other threads talk to it only through
//   * submit(): validates the request on the caller's thread and queues it (a bounded queue:
//     beyond max_queued_requests waiting requests it refuses with resource_exhausted);
//   * the request_handle it returns: destroying it cancels the request; the cancellation
//     reaches the engine thread at its next step, which frees the request's blocks;
//   * the request's event_sink, which the engine thread calls with the request's events:
//     admitted (once, when it first gets KV blocks), prompt log probabilities (once, before the
//     first delta, when asked for), delta (a choice's text and token ids, as produced; its last
//     delta says why it ended) and finished (exactly once per accepted request, whatever
//     happens: stop, length, content_filter, abort or error, with usage and timings). A sink must not block:
//     the gateway posts each event to its connection's strand.
//   * stats(), health() and drain().
//
// A bug on the engine thread (an exception escaping a step: a broken invariant, memory
// exhausted) ends the engine loop: every accepted request finishes with error, health() says
// failed for good, and submit() refuses with unavailable. A failed executor step is not a bug:
// that step's requests finish with error and the engine goes on.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "edge/backend/engine/engine_observer.h"
#include "edge/backend/engine/scheduler.h"
#include "edge/backend/runtime/executor.h"
#include "edge/backend/runtime/kv_block_pool.h"
#include "edge/backend/runtime/sampler.h"
#include "edge/backend/runtime/sequence_decoder.h"
#include "edge/backend/tokenizer/tokenizer.h"
#include "edge/common/status.h"
#include "edge/common/time_source.h"

namespace edge::backend {

namespace grammar {
class compiled_grammar;
}

struct generate_request {
  std::string id;                 // the caller's request id, for logs
  std::string tenant = "default";  // also the prefix cache's salt: tenants never share cached blocks
  double weight = 1.0;            // the tenant's share of the engine relative to others (> 0)
  std::int32_t priority = 0;      // higher is admitted first within its tenant and preempted last
  std::vector<token_id> prompt;
  sampling_params sampling;
  std::int64_t max_tokens = 16;
  std::vector<std::string> stop;  // stop strings; the text ends right before the first one
  std::vector<token_id> stop_token_ids;
  bool ignore_eos = false;
  // Log probabilities: none, or the sampled token's plus this many most likely alternatives
  // (0: the sampled token's alone; at most max_top_logprobs).
  std::optional<std::int32_t> logprobs;
  // What the output must match (structured outputs, constrained tool calls), compiled for this
  // engine's tokenizer (another tokenizer's is invalid_argument); null: unconstrained. Each step
  // allows only the tokens that continue it; EOS (and the stop token ids) only once it is
  // matched whole, and then nothing else. Log probabilities stay the model's own, unmasked.
  std::shared_ptr<const grammar::compiled_grammar> grammar;
  // Choices (OpenAI's n, 1..max_choices): this many completions of the prompt, which is computed
  // once for all of them. Choice i samples with the request's settings and, given a seed,
  // choice_seed(seed, i); max_tokens is per choice.
  std::int32_t n = 1;
  // The prompt's own log probabilities, each prompt token's but the first with this many
  // alternatives (at most max_top_logprobs): a prompt_logprobs_event before the first delta. The
  // prompt is then computed whole, never taken from the prefix cache.
  std::optional<std::int32_t> prompt_logprobs;
  // false: special tokens' text is in the deltas (decode_limits::skip_special_tokens).
  bool skip_special_tokens = true;
  // Bytes of the host and disk KV tiers the tenant's cached blocks may take at most (its
  // quotas): beyond them, the tenant's blocks replace its own, never another tenant's.
  std::int64_t host_tier_cap_bytes = std::numeric_limits<std::int64_t>::max();
  std::int64_t disk_tier_cap_bytes = std::numeric_limits<std::int64_t>::max();
  // The client's session key (x-session-affinity, prompt_cache_key); empty: none. The engine
  // keeps a session's cached blocks in KV memory over other cached blocks.
  std::string session;
};

// The most choices one request may ask for (OpenAI's limit for n), and the most alternatives per
// log probability (OpenAI's top_logprobs limit).
inline constexpr std::int32_t max_choices = 128;
inline constexpr std::int32_t max_top_logprobs = 20;

struct token_usage {
  std::int64_t prompt_tokens = 0;
  std::int64_t completion_tokens = 0;
  std::int64_t cached_tokens = 0;  // prompt tokens served from the prefix cache

  friend bool operator==(const token_usage&, const token_usage&) = default;
};

struct request_timings {
  double queued_seconds = 0.0;           // submitted to first admitted
  double time_to_first_token = 0.0;      // submitted to first token; 0 if none
  double total_seconds = 0.0;            // submitted to finished
  std::int64_t preemptions = 0;          // times it was preempted and recomputed
};

struct admitted_event {};

struct prompt_logprobs_event {
  // [prompt tokens - 1]: entry i is prompt token i + 1's log probability given the tokens before
  // it, with its alternatives (the first prompt token has none).
  std::vector<sampled_logprobs> logprobs;
  // The first of the choices this prompt opens (it opens n): 0 from the engine, whose request has
  // one prompt; a gateway answering a batch of prompts numbers each prompt's choices on.
  std::int32_t first_index = 0;
};

struct delta_event {
  std::int32_t index = 0;                 // the choice (0 .. n - 1)
  std::string text;                       // may be empty (held back: part of a character or a stop string)
  std::vector<token_id> tokens;           // the tokens sampled
  std::vector<sampled_logprobs> logprobs; // one per token, when asked for
  std::optional<finish_reason> finish;    // on the choice's last delta: why it ended (stop or length)
  std::string stop_string;                // finish stop by one of the request's stop strings: which
};

struct finished_event {
  // abort or error when the request did not complete; else how its last choice to end did
  // (each choice's own reason is on its last delta).
  finish_reason reason = finish_reason::stop;
  token_usage usage;  // completion_tokens: every choice's
  request_timings timings;
  std::string error;  // reason error: what went wrong
};

using engine_event = std::variant<admitted_event, delta_event, finished_event, prompt_logprobs_event>;

// Called on the engine thread, one event at a time per request, in order. Must not block.
using event_sink = std::function<void(engine_event)>;

struct engine_options {
  scheduler_config scheduler;
  std::int64_t max_queued_requests = 1024;  // waiting requests beyond which submit() refuses
  engine_observer* observer = nullptr;      // may be null; must outlive the engine
  const time_source* clock = nullptr;       // null: process_time(); the engine reads monotonic_time()
  // A round of work (applying submissions and cancellations, one step, publishing) that runs
  // longer than this is a stalled engine (health() says stalled): a hung executor or a
  // blocking event sink. vLLM's engine iteration timeout has the same default.
  std::chrono::milliseconds stall_timeout{std::chrono::seconds(60)};
  // Blocks of the host-memory KV tier below the executor's KV memory (kv_tiers.h; the executor
  // allocates them): evicted cached blocks are kept there. 0: none.
  std::int64_t host_tier_blocks = 0;
  // The disk tier below the host tier (kv_disk_tier::open for this model and KV layout), or null.
  // Needs a host tier.
  std::shared_ptr<kv_disk_tier> disk_tier;
  // For tests only: called on the engine thread before each step. What it throws ends the
  // engine loop as a bug would; blocking in it stalls the engine. Empty in production.
  std::function<void()> before_step;
};

struct engine_stats {
  std::int64_t running = 0;
  std::int64_t waiting = 0;  // accepted and not running (queued or preempted)
  std::int64_t in_flight = 0;  // accepted and not finished
  std::int64_t blocks_total = 0;
  std::int64_t blocks_free = 0;
  std::int64_t cached_blocks = 0;  // blocks holding a registered prompt prefix, in use or free
  std::int64_t capacity_tokens = 0;
  std::int64_t steps = 0;
  std::int64_t preemptions = 0;
  std::int64_t prefix_cache_queries = 0;
  std::int64_t prefix_cache_hits = 0;   // tokens found in KV memory or the host tier
  std::int64_t host_tier_hits = 0;      // of those, tokens copied back from a host slot
  std::int64_t disk_tier_hits = 0;      // of those, tokens read from disk into a host slot first
  std::int64_t host_tier_blocks = 0;    // its slots
  std::int64_t host_tier_used_blocks = 0;
  std::int64_t host_tier_block_bytes = 0;  // one block's bytes there
  std::int64_t disk_tier_bytes = 0;     // its capacity
  std::int64_t disk_tier_used_bytes = 0;
  std::int64_t spilled_blocks = 0;      // blocks copied to the host tier
  std::int64_t restored_blocks = 0;     // blocks copied back from it
  std::int64_t computed_tokens = 0;  // tokens whose K/V were computed: prompt chunks, recomputation, decode
  std::int64_t prompt_tokens = 0;
  std::int64_t generation_tokens = 0;
  std::int64_t finished = 0;
};

enum class engine_state {
  running,  // the engine thread is waiting for work or its current round is within stall_timeout
  stalled,  // its current round has run longer than stall_timeout; it may still come back
  failed,   // an exception ended the engine loop; it never comes back
};
std::string_view to_string(engine_state state);

struct engine_health {
  engine_state state = engine_state::running;
  std::string failure;        // failed: what ended the engine loop
  double busy_seconds = 0.0;  // how long the current round of work has run; 0 while waiting for work
};

// A submitted request: destroying it (or cancel()) cancels the request, unless it has
// finished. Movable. What cancelling means is the canceller's: the engine's own (a
// cancellation queued for the engine thread), or whatever stands between a caller and an
// engine elsewhere (the split gateway closes its connection to a backend).
class request_handle {
 public:
  class canceller {
   public:
    virtual ~canceller() = default;
    // Called at most once, from the thread (or strand) that owns the handle.
    virtual void cancel() = 0;
  };

  request_handle() = default;
  explicit request_handle(std::unique_ptr<canceller> cancel) : canceller_(std::move(cancel)) {}
  request_handle(request_handle&& other) noexcept = default;
  request_handle& operator=(request_handle&& other) noexcept;
  request_handle(const request_handle&) = delete;
  request_handle& operator=(const request_handle&) = delete;
  ~request_handle() { cancel(); }

  void cancel();
  bool valid() const { return canceller_ != nullptr; }

 private:
  std::unique_ptr<canceller> canceller_;
};

// Why submit() refused a request: the status, and the generate_request field at fault when one
// is ("prompt", "n", "logprobs", "prompt_logprobs", "logit_bias", "grammar"; "" otherwise), so
// that each API names its own parameter in the answer.
class submit_error : public status {
 public:
  // A limit of the request's tenant that waiting cures: a split backend's grammar compile queue
  // or compile seconds for that tenant, as the split gateway reads its 429. Final on every
  // backend (the tenant's own traffic, not the backend's fault); answered 429 with retry-after.
  struct tenant_limit {
    std::string name;  // the limit, as the error's type: "grammar_compile_queue", ...
    std::chrono::milliseconds retry_after{0};
  };

  submit_error() = default;
  submit_error(status s, std::string field = {}) : status(std::move(s)), field_(std::move(field)) {}  // NOLINT: implicit by design
  submit_error(status s, tenant_limit limit) : status(std::move(s)), limit_(std::move(limit)) {}
  const std::string& field() const noexcept { return field_; }
  const std::optional<tenant_limit>& limit() const noexcept { return limit_; }

 private:
  std::string field_;
  std::optional<tenant_limit> limit_;
};

class engine {
 public:
  // Starts the engine thread. The tokenizer, executor and pool must outlive the engine; the pool
  // hands out blocks of the executor's KV cache. `context` is the model's context length.
  // invalid_argument for inconsistent options, and when the scheduler's block size or the
  // pool's blocks disagree with the executor's KV layout.
  static result<std::unique_ptr<engine>> create(const tokenizer& tok, executor& exec, kv_block_pool& pool,
                                                std::int64_t context, engine_options options);
  // Stops the engine thread: requests still queued or running finish with abort.
  ~engine();
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  // Queues a request; the sink gets its events. Errors (nothing is queued, no event follows):
  // invalid_argument / out_of_range for a request that can never run (empty prompt, longer
  // than the context or than the KV cache, more choices than max_num_seqs, a field out of its
  // range: logprobs, n, logit_bias, prompt_logprobs; a grammar whose every output the logit_bias
  // bans make impossible to write, as far as grammar::find_output can tell), resource_exhausted
  // when max_queued_requests are waiting, failed_precondition once drain() began, unavailable
  // once the engine has failed (health()). A stalled engine still queues requests. Thread-safe.
  result<request_handle, submit_error> submit(generate_request request, event_sink sink);

  // A snapshot as of the end of the latest step. Thread-safe.
  engine_stats stats() const;

  // Whether the engine thread is alive and stepping, as of now. Thread-safe and cheap: what
  // /readyz asks on every probe.
  engine_health health() const;

  // Refuses new submissions from now on and waits until every accepted request has finished
  // or `timeout` passed; true when all finished. Thread-safe.
  bool drain(std::chrono::milliseconds timeout);

 private:
  struct state;
  explicit engine(std::unique_ptr<state> s);
  std::unique_ptr<state> state_;
};

}  // namespace edge::backend
