#include "edge/backend/engine/engine.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <iterator>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "edge/backend/engine/step_driver.h"
#include "edge/backend/engine/submission.h"
#include "edge/common/format.h"
#include "edge/common/log.h"

namespace edge::backend {
namespace {

using time_point = std::chrono::steady_clock::time_point;

// What engine::state::round_started holds while the engine thread waits for work.
constexpr time_point waiting_for_work = time_point::max();

double seconds_between(time_point from, time_point to) { return std::chrono::duration<double>(to - from).count(); }

double stall_seconds(const engine_options& options) {
  return std::chrono::duration<double>(options.stall_timeout).count();
}

}  // namespace

std::string_view to_string(engine_state state) {
  switch (state) {
    case engine_state::running: return "running";
    case engine_state::stalled: return "stalled";
    case engine_state::failed: return "failed";
  }
  return "failed";
}

// ---- the queue between threads ----------------------------------------------------------------

struct submission {
  sequence_id id = 0;  // the first choice's; choice i's is id + i
  generate_request request;
  event_sink sink;
  std::shared_ptr<std::atomic<bool>> finished;
  std::vector<std::unique_ptr<sequence_decoder>> decoders;  // [n]
  time_point arrival;
};

struct cancellation {
  sequence_id id = 0;
};

using command = std::variant<submission, cancellation>;

// Shared by the engine and every handle, so a handle that outlives its engine stays harmless.
// Bounded: submissions beyond max_queued waiting requests are refused, and each accepted
// request adds at most one cancellation.
class engine_inbox {
 public:
  std::mutex mutex;
  std::condition_variable wake;     // the engine thread waits here for commands
  std::condition_variable settled;  // drain() waits here for in_flight to reach zero
  std::deque<command> commands;     // guarded by mutex
  bool stopping = false;            // guarded by mutex
  bool accepting = true;            // guarded by mutex
  // Guarded by mutex; set once, by the engine thread, when a bug ended its loop (with stopping).
  std::optional<std::string> failure;
  std::int64_t queued = 0;          // guarded by mutex: accepted, never admitted yet, not finished
  std::int64_t in_flight = 0;       // guarded by mutex: accepted, not finished

  void cancel(sequence_id id) {
    {
      std::lock_guard lock(mutex);
      if (stopping) return;
      commands.emplace_back(cancellation{id});
    }
    wake.notify_one();
  }
};

request_handle& request_handle::operator=(request_handle&& other) noexcept {
  if (this != &other) {
    cancel();
    canceller_ = std::move(other.canceller_);
  }
  return *this;
}

void request_handle::cancel() {
  if (canceller_ == nullptr) return;
  canceller_->cancel();
  canceller_.reset();
}

namespace {

// The engine's own cancellation: a command for the engine thread, unless the request has
// finished. Holds the inbox, so a handle that outlives its engine stays harmless.
class engine_canceller final : public request_handle::canceller {
 public:
  engine_canceller(std::shared_ptr<engine_inbox> inbox, sequence_id id, std::shared_ptr<std::atomic<bool>> finished)
      : inbox_(std::move(inbox)), id_(id), finished_(std::move(finished)) {}

  void cancel() override {
    if (!finished_->load(std::memory_order_acquire)) inbox_->cancel(id_);
  }

 private:
  std::shared_ptr<engine_inbox> inbox_;
  sequence_id id_;
  std::shared_ptr<std::atomic<bool>> finished_;
};

}  // namespace

// ---- the engine thread ------------------------------------------------------------------------

namespace {

// One choice of a request: a sequence of the scheduler's (the first one's id is the request's).
struct active_choice {
  sequence_id id = 0;
  std::unique_ptr<sequence_decoder> decoder;
  bool done = false;
  time_point last_token;
};

// A request the engine thread is serving. Engine thread only.
struct active_request {
  std::string client_id;
  event_sink sink;
  std::shared_ptr<std::atomic<bool>> finished;
  std::vector<active_choice> choices;  // [n]
  std::int64_t choices_left = 0;
  finish_reason last_reason = finish_reason::stop;  // of the choice that ended last
  std::optional<std::int32_t> logprobs;
  std::optional<std::int32_t> prompt_logprobs;
  std::vector<sampled_logprobs> prompt_scores;  // gathered step by step until they are sent
  bool prompt_scores_sent = false;
  std::int64_t prompt_tokens = 0;
  std::int64_t cached_tokens = 0;
  std::int64_t preemptions = 0;
  time_point arrival;
  std::optional<time_point> admitted;
  std::optional<time_point> first_token;

  std::int64_t generated() const {
    std::int64_t n = 0;
    for (const active_choice& c : choices) n += c.decoder->generated();
    return n;
  }
};

// Where a sequence belongs: its request (the first choice's id) and its choice.
struct choice_ref {
  sequence_id request = 0;
  std::size_t index = 0;
};

// What one round of the loop reports to the observer. Engine thread only.
struct round_report {
  std::vector<double> time_to_first_token;
  std::vector<double> inter_token_latency;
  std::vector<double> queue_time;
  std::vector<finished_request_report> finished;
  std::vector<double> expert_load_imbalance;
  std::vector<std::int64_t> experts_touched;
  std::int64_t routed_tokens = 0;
  std::int64_t batch_tokens = 0;
  std::int64_t prompt_tokens = 0;
  std::int64_t generation_tokens = 0;
  std::int64_t finished_requests = 0;
  std::vector<double> copy_back_seconds;

  void clear() { *this = round_report{}; }
};

}  // namespace

struct engine::state {
  state(const tokenizer& t, executor& e, kv_block_pool& p, std::int64_t ctx, engine_options o)
      : tok(t), exec(e), pool(p), context(ctx), options(o),
        clock(o.clock != nullptr ? *o.clock : process_time()),
        inbox(std::make_shared<engine_inbox>()) {}

  const tokenizer& tok;
  executor& exec;
  kv_block_pool& pool;
  const std::int64_t context;
  const engine_options options;
  const time_source& clock;
  std::shared_ptr<engine_inbox> inbox;
  std::atomic<sequence_id> next_id{1};
  std::unique_ptr<kv_tiers> tiers;  // engine thread only (through sched); null without lower tiers
  std::unique_ptr<scheduler> sched;  // engine thread only (check_fits is safe from any thread)
  logger log{"engine"};

  mutable std::mutex stats_mutex;
  engine_stats snapshot;  // guarded by stats_mutex

  // Written by the engine thread, read by any thread (health()): when its current
  // round of work began, or waiting_for_work.
  std::atomic<time_point> round_started{waiting_for_work};

  // Engine thread only.
  std::unordered_map<sequence_id, active_request> requests;  // by the first choice's id
  std::unordered_map<sequence_id, choice_ref> choice_of;     // every choice's sequence id
  round_report report;
  scheduler_counters reported;  // the scheduler's counters as of the last report
  executor_counters reported_executor;  // and the executor's
  kv_tier_counters reported_tiers;      // and the lower tiers'
  kv_disk_tier_counters reported_disk;
  std::int64_t steps = 0;
  std::int64_t prompt_tokens_total = 0;
  std::int64_t generation_tokens_total = 0;
  std::int64_t finished_total = 0;
  std::unique_ptr<step_driver> driver;
  std::vector<sequence_id> first_admitted;    // admitted for the first time in this step

  std::thread thread;

  // Why submit() must refuse `request`, if it must (any thread: reads only what never changes).
  void run();
  void fail(const std::string& what);
  void loop();
  double busy_seconds(time_point now) const;
  void apply(command& c);
  void step();
  void fail_step(const std::vector<sequence_id>& ids, const status& failure);
  // Ends request `id` (its first choice's id) and every choice still running.
  void finish(sequence_id id, finish_reason reason, std::string error = {});
  // Ends the choice whose sequence is `id`, and its request with the last one.
  void finish_choice(sequence_id id, finish_reason reason, std::string error = {});
  active_request& request_of(sequence_id id) { return requests.at(choice_of.at(id).request); }
  void emit(active_request& r, engine_event event);
  void publish();
  // The step's MoE choices, summarised per layer into the round's report.
  void record_routing(const expert_routing& routing);
};

void engine::state::run() {
  try {
    loop();
  } catch (const std::exception& e) {
    fail(e.what());
  } catch (...) {
    fail("an exception of unknown type");
  }
}

// A bug ended the loop: end every request so that no client waits forever, and stop for good.
// Should this throw too (the scheduler itself broken), it escapes the thread and aborts the
// process.
void engine::state::fail(const std::string& what) {
  log.error("engine thread failed: {}", what);
  const std::string failure = format("engine failure: {}", what);
  round_started.store(waiting_for_work, std::memory_order_release);
  // Nothing will serve requests any more: refuse new ones, and end every accepted one.
  std::deque<command> left;
  {
    std::lock_guard lock(inbox->mutex);
    inbox->stopping = true;
    inbox->failure = what;
    left.swap(inbox->commands);
  }
  std::vector<sequence_id> ids;
  for (const auto& [id, r] : requests) ids.push_back(id);
  for (const sequence_id id : ids) finish(id, finish_reason::error, failure);
  std::int64_t never_applied = 0;
  for (command& c : left) {
    auto* sub = std::get_if<submission>(&c);
    if (sub == nullptr) continue;
    ++never_applied;
    sub->finished->store(true, std::memory_order_release);
    finished_event event;
    event.reason = finish_reason::error;
    event.error = failure;
    try {
      sub->sink(std::move(event));
    } catch (const std::exception& sink_error) {
      log.error("event sink of request {} threw: {}", sub->request.id, sink_error.what());
    }
  }
  {
    std::lock_guard lock(inbox->mutex);
    inbox->queued -= never_applied;
    inbox->in_flight -= never_applied;
  }
  publish();
}

void engine::state::loop() {
  std::deque<command> commands;
  for (;;) {
    bool stop = false;
    {
      std::unique_lock lock(inbox->mutex);
      if (sched->idle()) {
        round_started.store(waiting_for_work, std::memory_order_release);
        inbox->wake.wait(lock, [&] { return inbox->stopping || !inbox->commands.empty(); });
      }
      commands.swap(inbox->commands);
      stop = inbox->stopping;
    }
    round_started.store(clock.monotonic_time(), std::memory_order_release);
    const bool took_commands = !commands.empty();
    for (command& c : commands) apply(c);
    commands.clear();
    if (stop) {
      std::vector<sequence_id> ids;
      for (const auto& [id, r] : requests) ids.push_back(id);
      for (const sequence_id id : ids) finish(id, finish_reason::abort);
      publish();
      return;
    }
    const bool stepped = !sched->idle();
    if (stepped) {
      if (options.before_step) options.before_step();
      step();
    }
    if (took_commands || stepped) publish();
  }
}

double engine::state::busy_seconds(time_point now) const {
  const time_point started = round_started.load(std::memory_order_acquire);
  return started == waiting_for_work || now < started ? 0.0 : seconds_between(started, now);
}

void engine::state::apply(command& c) {
  if (auto* cancel = std::get_if<cancellation>(&c)) {
    finish(cancel->id, finish_reason::abort);
    return;
  }
  auto& s = std::get<submission>(c);
  active_request r;
  r.client_id = s.request.id;
  r.sink = std::move(s.sink);
  r.finished = std::move(s.finished);
  std::vector<sequence_id> forks;
  for (std::size_t i = 0; i < s.decoders.size(); ++i) {
    const sequence_id id = s.id + i;
    r.choices.push_back({.id = id, .decoder = std::move(s.decoders[i]), .done = false, .last_token = s.arrival});
    choice_of.emplace(id, choice_ref{.request = s.id, .index = i});
    if (i > 0) forks.push_back(id);
  }
  r.choices_left = static_cast<std::int64_t>(r.choices.size());
  r.logprobs = s.request.logprobs;
  r.prompt_logprobs = s.request.prompt_logprobs;
  r.prompt_tokens = static_cast<std::int64_t>(s.request.prompt.size());
  r.arrival = s.arrival;
  requests.emplace(s.id, std::move(r));
  const auto block_bytes = static_cast<std::int64_t>(exec.kv_layout().bytes_per_block());
  status added = sched->add({.id = s.id,
                             .tenant = std::move(s.request.tenant),
                             .weight = s.request.weight,
                             .priority = s.request.priority,
                             .prompt = std::move(s.request.prompt),
                             .max_tokens = s.request.max_tokens,
                             .forks = std::move(forks),
                             .prompt_logits = s.request.prompt_logprobs.has_value(),
                             .session = !s.request.session.empty(),
                             .caps = {.host_blocks = std::max<std::int64_t>(s.request.host_tier_cap_bytes, 0) /
                                                          std::max<std::int64_t>(block_bytes, 1),
                                           .disk_bytes = std::max<std::int64_t>(s.request.disk_tier_cap_bytes, 0)}});
  if (!added.ok()) finish(s.id, finish_reason::error, added.message());
}

void engine::state::emit(active_request& r, engine_event event) {
  try {
    r.sink(std::move(event));
  } catch (const std::exception& e) {
    log.error("event sink of request {} threw: {}", r.client_id, e.what());
  }
}

void engine::state::finish(sequence_id id, finish_reason reason, std::string error) {
  const auto it = requests.find(id);
  if (it == requests.end()) return;  // already finished: a late cancellation
  active_request& r = it->second;
  for (const active_choice& c : r.choices) {
    // A choice that ended, or a fork not split off yet, is not in the scheduler.
    if (!c.done) sched->remove(c.id);
    choice_of.erase(c.id);
  }
  const time_point now = clock.monotonic_time();
  finished_event event;
  event.reason = reason;
  event.usage = {.prompt_tokens = r.prompt_tokens, .completion_tokens = r.generated(), .cached_tokens = r.cached_tokens};
  event.timings = {.queued_seconds = r.admitted ? seconds_between(r.arrival, *r.admitted) : seconds_between(r.arrival, now),
                   .time_to_first_token = r.first_token ? seconds_between(r.arrival, *r.first_token) : 0.0,
                   .total_seconds = seconds_between(r.arrival, now),
                   .preemptions = r.preemptions};
  event.error = std::move(error);
  if (reason == finish_reason::error) log.warn("request {} failed: {}", r.client_id, event.error);

  report.finished.push_back({.reason = to_string(reason),
                             .e2e_seconds = event.timings.total_seconds,
                             .prompt_tokens = r.prompt_tokens,
                             .completion_tokens = event.usage.completion_tokens});
  ++report.finished_requests;
  if (!r.admitted) {
    std::lock_guard lock(inbox->mutex);
    --inbox->queued;
  }
  ++finished_total;

  // Set before the sink runs, so that a handle destroyed in response sends no cancellation.
  r.finished->store(true, std::memory_order_release);
  emit(r, std::move(event));
  requests.erase(it);
}

void engine::state::finish_choice(sequence_id id, finish_reason reason, std::string error) {
  const choice_ref at = choice_of.at(id);
  // A choice that fails fails its request: the answer would lack it.
  if (reason == finish_reason::error) return finish(at.request, reason, std::move(error));
  active_request& r = requests.at(at.request);
  active_choice& c = r.choices[at.index];
  if (c.done) return;
  c.done = true;
  if (reason == finish_reason::content_filter) log.info("request {} choice {} ends early: {}", r.client_id, at.index, error);
  sched->remove(id);
  r.last_reason = reason;
  if (--r.choices_left == 0) finish(at.request, r.last_reason);
}

void engine::state::fail_step(const std::vector<sequence_id>& ids, const status& failure) {
  log.error("step failed: {}", failure.message());
  for (const sequence_id id : ids) finish(id, finish_reason::error, failure.message());
}

void engine::state::step() {
  const time_point scheduled_at = clock.monotonic_time();
  step_plan plan = sched->schedule();
  ++steps;
  first_admitted.clear();
  for (const sequence_id id : plan.admitted) {
    active_request& r = request_of(id);
    if (r.admitted) continue;  // readmitted after a preemption
    r.admitted = scheduled_at;
    r.cached_tokens = sched->cached_prompt_tokens(id);
    report.queue_time.push_back(seconds_between(r.arrival, scheduled_at));
    first_admitted.push_back(id);
  }
  if (!first_admitted.empty()) {
    // They leave the queue now, not when the round is published: the queue limit counts what
    // really waits, even while this step computes.
    std::lock_guard lock(inbox->mutex);
    inbox->queued -= static_cast<std::int64_t>(first_admitted.size());
  }
  for (const sequence_id id : first_admitted) emit(request_of(id), admitted_event{});
  for (const sequence_id id : plan.preempted) ++request_of(id).preemptions;
  if (plan.empty() && plan.spills.empty() && plan.restores.empty()) return;

  auto ran = driver->run(plan, [&](sequence_id id) {
    const choice_ref at = choice_of.at(id);
    active_request& r = requests.at(at.request);
    return driven_sequence{.decoder = r.choices[at.index].decoder.get(),
                           .logprobs = r.logprobs,
                           .prompt_logprobs = r.prompt_logprobs.value_or(0)};
  });
  if (!ran.ok()) {
    std::vector<sequence_id> ids;
    ids.reserve(plan.chunks.size());
    for (const scheduled_chunk& chunk : plan.chunks) {
      const sequence_id request = choice_of.at(chunk.id).request;
      if (std::find(ids.begin(), ids.end(), request) == ids.end()) ids.push_back(request);
    }
    sched->step_failed();
    fail_step(ids, ran.error());
    return;
  }
  for (scored_prompt& scored : driver->scored_prompts()) {
    active_request& r = request_of(scored.id);
    // Rows come in position order, each once (the scheduler does not score a position twice).
    if (scored.first != static_cast<std::int64_t>(r.prompt_scores.size()) + 1) {
      throw std::logic_error(format("request {} got prompt log probabilities from token {} after {} of them",
                                    r.client_id, scored.first, r.prompt_scores.size()));
    }
    std::move(scored.logprobs.begin(), scored.logprobs.end(), std::back_inserter(r.prompt_scores));
  }
  report.batch_tokens += plan.tokens;
  record_routing(exec.last_routing());
  if (tiers) exec.take_copy_back_seconds(report.copy_back_seconds);

  const time_point produced_at = clock.monotonic_time();
  for (sampled_token& t : *ran) {
    // A choice whose request ended earlier in this step (another of its choices failed) has
    // nothing left to report.
    const auto found = choice_of.find(t.id);
    if (found == choice_of.end()) continue;
    const choice_ref at = found->second;
    active_request& req = requests.at(at.request);
    active_choice& choice = req.choices[at.index];
    if (!req.first_token) {
      req.first_token = produced_at;
      report.time_to_first_token.push_back(seconds_between(req.arrival, produced_at));
      report.prompt_tokens += req.prompt_tokens;
      prompt_tokens_total += req.prompt_tokens;
    } else if (choice.decoder->generated() > 1) {
      report.inter_token_latency.push_back(seconds_between(choice.last_token, produced_at));
    }
    choice.last_token = produced_at;
    ++report.generation_tokens;
    ++generation_tokens_total;

    if (req.prompt_logprobs && !req.prompt_scores_sent) {
      // Every prompt position but the last is computed before any choice samples.
      if (static_cast<std::int64_t>(req.prompt_scores.size()) != req.prompt_tokens - 1) {
        throw std::logic_error(format("request {} samples with {} of its {} prompt log probabilities", req.client_id,
                                      req.prompt_scores.size(), req.prompt_tokens - 1));
      }
      req.prompt_scores_sent = true;
      emit(req, prompt_logprobs_event{.logprobs = std::move(req.prompt_scores)});
    }
    delta_event delta;
    delta.index = static_cast<std::int32_t>(at.index);
    if (!t.decoded.dropped) {
      delta.tokens.push_back(t.token);
      if (t.logprobs) delta.logprobs.push_back(std::move(*t.logprobs));
    }
    delta.text = std::move(t.decoded.text);
    delta.finish = t.decoded.finish;
    delta.stop_string = std::move(t.decoded.stop_string);
    emit(req, std::move(delta));
    if (t.decoded.finish) finish_choice(t.id, *t.decoded.finish, std::move(t.decoded.error));
  }
}

void engine::state::record_routing(const expert_routing& routing) {
  for (std::int64_t layer = 0; layer < routing.moe_layers; ++layer) {
    const auto counts = routing.expert_tokens.subspan(static_cast<std::size_t>(layer * routing.experts),
                                                      static_cast<std::size_t>(routing.experts));
    std::int64_t total = 0;
    std::int64_t busiest = 0;
    std::int64_t touched = 0;
    for (const std::int32_t n : counts) {
      total += n;
      busiest = std::max<std::int64_t>(busiest, n);
      touched += n > 0 ? 1 : 0;
    }
    if (total == 0) continue;
    report.expert_load_imbalance.push_back(static_cast<double>(busiest) * static_cast<double>(routing.experts) /
                                           static_cast<double>(total));
    report.experts_touched.push_back(touched);
    report.routed_tokens += total;
  }
}

void engine::state::publish() {
  const scheduler_counters& now = sched->counters();
  const executor_counters executor_now = exec.counters();
  engine_stats s;
  s.running = sched->num_running();
  s.waiting = sched->num_waiting();
  s.in_flight = static_cast<std::int64_t>(requests.size());
  s.blocks_total = pool.total_blocks();
  s.blocks_free = pool.free_blocks();
  s.cached_blocks = pool.cached_blocks();
  s.capacity_tokens = pool.total_blocks() * options.scheduler.block_size;
  s.steps = steps;
  s.preemptions = now.preemptions;
  s.prefix_cache_queries = now.prefix_queries;
  s.prefix_cache_hits = now.prefix_hits;
  s.host_tier_hits = now.host_tier_hits;
  if (tiers) {
    s.host_tier_blocks = tiers->host().slots();
    s.host_tier_used_blocks = tiers->host().used();
    s.host_tier_block_bytes = static_cast<std::int64_t>(tiers->block_bytes());
    s.disk_tier_hits = tiers->counters().disk_hits * options.scheduler.block_size;
    if (const kv_disk_tier* disk = tiers->disk()) {
      s.disk_tier_bytes = disk->capacity_bytes();
      s.disk_tier_used_bytes = disk->used_bytes();
    }
  }
  s.spilled_blocks = now.spilled_blocks;
  s.restored_blocks = now.restored_blocks;
  s.computed_tokens = now.computed_tokens;
  s.prompt_tokens = prompt_tokens_total;
  s.generation_tokens = generation_tokens_total;
  s.finished = finished_total;
  {
    std::lock_guard lock(stats_mutex);
    snapshot = s;
  }
  if (options.observer != nullptr) {
    engine_step_report out;
    out.running = s.running;
    out.waiting = s.waiting;
    out.blocks_total = s.blocks_total;
    out.blocks_free = s.blocks_free;
    out.batch_tokens = report.batch_tokens;
    out.prompt_tokens = report.prompt_tokens;
    out.generation_tokens = report.generation_tokens;
    out.preemptions = now.preemptions - reported.preemptions;
    out.prefix_cache_queries = now.prefix_queries - reported.prefix_queries;
    out.prefix_cache_hits = now.prefix_hits - reported.prefix_hits;
    out.graph_capture_failures = executor_now.graph_capture_failures - reported_executor.graph_capture_failures;
    if (tiers) {
      const kv_tier_counters tiers_now = tiers->counters();
      out.host_tier_hit_tokens = now.host_tier_hits - reported.host_tier_hits;
      out.disk_tier_hit_tokens = (tiers_now.disk_hits - reported_tiers.disk_hits) * options.scheduler.block_size;
      out.spilled_blocks = now.spilled_blocks - reported.spilled_blocks;
      out.restored_blocks = now.restored_blocks - reported.restored_blocks;
      out.copy_back_seconds = report.copy_back_seconds;
      out.host_tier_used_bytes = s.host_tier_used_blocks * s.host_tier_block_bytes;
      out.host_tier_capacity_bytes = s.host_tier_blocks * s.host_tier_block_bytes;
      out.disk_tier_used_bytes = s.disk_tier_used_bytes;
      out.disk_tier_capacity_bytes = s.disk_tier_bytes;
      if (const kv_disk_tier* disk = tiers->disk()) {
        const kv_disk_tier_counters d = disk->counters();
        out.disk_written = d.written - reported_disk.written;
        out.disk_write_failures = d.write_failures - reported_disk.write_failures;
        out.disk_not_kept = d.not_kept - reported_disk.not_kept;
        out.disk_rejected = d.rejected - reported_disk.rejected;
        out.disk_evicted = d.evicted - reported_disk.evicted;
        reported_disk = d;
      }
      reported_tiers = tiers_now;
    }
    out.time_to_first_token = report.time_to_first_token;
    out.inter_token_latency = report.inter_token_latency;
    out.queue_time = report.queue_time;
    out.finished = report.finished;
    out.expert_load_imbalance = report.expert_load_imbalance;
    out.experts_touched = report.experts_touched;
    out.routed_tokens = report.routed_tokens;
    options.observer->on_step(out);
  }
  reported = now;
  reported_executor = executor_now;
  {
    std::lock_guard lock(inbox->mutex);
    inbox->in_flight -= report.finished_requests;
    if (inbox->in_flight == 0) inbox->settled.notify_all();
  }
  report.clear();
}

// ---- the public face --------------------------------------------------------------------------

engine::engine(std::unique_ptr<state> s) : state_(std::move(s)) {}

result<std::unique_ptr<engine>> engine::create(const tokenizer& tok, executor& exec, kv_block_pool& pool,
                                               std::int64_t context, engine_options options) {
  if (options.scheduler.max_model_len == 0) options.scheduler.max_model_len = context;
  options.scheduler.max_prompt_logits = exec.max_prompt_logits_rows();
  if (options.scheduler.max_num_batched_tokens > exec.max_batch_tokens()) {
    return invalid_argument(format("max_num_batched_tokens {} exceeds the executor's {} tokens per step",
                                   options.scheduler.max_num_batched_tokens, exec.max_batch_tokens()));
  }
  if (options.scheduler.max_num_seqs > exec.max_sequences()) {
    return invalid_argument(format("max_num_seqs {} exceeds the executor's {} sequences per step",
                                   options.scheduler.max_num_seqs, exec.max_sequences()));
  }
  if (options.max_queued_requests < 1) return invalid_argument("max_queued_requests must be at least 1");
  if (options.stall_timeout <= std::chrono::milliseconds::zero()) return invalid_argument("stall_timeout must be positive");
  const kv_cache_layout& kv = exec.kv_layout();
  if (options.scheduler.block_size != kv.block_size) {
    return invalid_argument(format("the scheduler's block size {} is not the KV cache's {}", options.scheduler.block_size,
                                   kv.block_size));
  }
  if (pool.total_blocks() > kv.num_blocks) {
    return invalid_argument(format("the block pool hands out {} blocks; the KV cache has {}", pool.total_blocks(),
                                   kv.num_blocks));
  }
  if (options.host_tier_blocks < 0) return invalid_argument("host_tier_blocks is negative");
  if (options.disk_tier && options.host_tier_blocks == 0) {
    return invalid_argument("a disk KV tier needs a host tier: its blocks pass through host memory");
  }
  if (options.disk_tier && options.disk_tier->block_bytes() != kv.bytes_per_block()) {
    return invalid_argument("the disk KV tier was opened for another KV layout");
  }
  std::unique_ptr<kv_tiers> tiers;
  if (options.host_tier_blocks > 0) {
    EDGE_ASSIGN_OR_RETURN(const std::span<std::byte> host_memory, exec.allocate_host_tier(options.host_tier_blocks));
    tiers = std::make_unique<kv_tiers>(host_memory, kv.bytes_per_block(), options.disk_tier,
                                       [&exec] { static_cast<void>(exec.finish_tier_copies()); });
    options.scheduler.restores_overlap_step = exec.restores_overlap_step();
  }
  auto s = std::make_unique<state>(tok, exec, pool, context, options);
  s->tiers = std::move(tiers);
  EDGE_ASSIGN_OR_RETURN(s->sched, scheduler::create(options.scheduler, pool, s->tiers.get()));
  s->driver = std::make_unique<step_driver>(*s->sched, exec);
  s->snapshot.blocks_total = pool.total_blocks();
  s->snapshot.blocks_free = pool.free_blocks();
  s->snapshot.capacity_tokens = pool.total_blocks() * options.scheduler.block_size;
  state* raw = s.get();
  s->thread = std::thread([raw] { raw->run(); });
  return std::unique_ptr<engine>(new engine(std::move(s)));
}

engine::~engine() {
  {
    std::lock_guard lock(state_->inbox->mutex);
    state_->inbox->stopping = true;
  }
  state_->inbox->wake.notify_one();
  state_->thread.join();
}

result<request_handle, submit_error> engine::submit(generate_request request, event_sink sink) {
  state& s = *state_;
  if (!sink) return submit_error(invalid_argument("a request needs an event sink"));
  const submission_limits limits{.sched = *s.sched, .vocab = s.exec.vocab_size(), .grammar_tokenizer = &s.tok};
  if (auto refused = check_submission(request, limits)) {
    return std::move(*refused);
  }

  submission sub;
  sub.arrival = s.clock.monotonic_time();
  sub.id = s.next_id.fetch_add(static_cast<sequence_id>(request.n), std::memory_order_relaxed);
  sub.finished = std::make_shared<std::atomic<bool>>(false);
  sub.decoders = choice_decoders(request, s.tok, s.context);
  sub.request = std::move(request);
  sub.sink = std::move(sink);
  request_handle handle(std::make_unique<engine_canceller>(s.inbox, sub.id, sub.finished));
  {
    std::lock_guard lock(s.inbox->mutex);
    if (s.inbox->failure) {
      sub.finished->store(true);  // nothing to cancel
      return submit_error(unavailable(format("the engine failed: {}", *s.inbox->failure)));
    }
    if (!s.inbox->accepting || s.inbox->stopping) {
      sub.finished->store(true);
      return submit_error(failed_precondition("the engine is shutting down"));
    }
    if (s.inbox->queued >= s.options.max_queued_requests) {
      sub.finished->store(true);
      return submit_error(
          resource_exhausted(format("the engine is overloaded: {} requests are already waiting", s.inbox->queued)));
    }
    ++s.inbox->queued;
    ++s.inbox->in_flight;
    s.inbox->commands.emplace_back(std::move(sub));
  }
  s.inbox->wake.notify_one();
  return handle;
}

engine_stats engine::stats() const {
  std::lock_guard lock(state_->stats_mutex);
  return state_->snapshot;
}

// A stalled engine still queues what is submitted (bounded by max_queued_requests): a step can
// be slow without being stuck, and /readyz tells load balancers to send work elsewhere.
engine_health engine::health() const {
  engine_health h;
  {
    std::lock_guard lock(state_->inbox->mutex);
    if (state_->inbox->failure) {
      h.state = engine_state::failed;
      h.failure = *state_->inbox->failure;
      return h;
    }
  }
  h.busy_seconds = state_->busy_seconds(state_->clock.monotonic_time());
  if (h.busy_seconds > stall_seconds(state_->options)) h.state = engine_state::stalled;
  return h;
}

bool engine::drain(std::chrono::milliseconds timeout) {
  std::unique_lock lock(state_->inbox->mutex);
  state_->inbox->accepting = false;
  return state_->inbox->settled.wait_for(lock, timeout, [&] { return state_->inbox->in_flight == 0; });
}

}  // namespace edge::backend
