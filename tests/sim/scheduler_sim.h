// A discrete-event driver for the real scheduler and the real block pool, without a model:
// time is simulated (each step costs what a cost model says), a sampled token is a made-up id,
// and a request stops after the number of tokens its trace entry says (each of its choices,
// when it asks for several: one sequence forked into as many). Shared by the scheduler's
// property and fairness tests (tests/unit/backend/engine) and the trace simulator (tests/bench).
//
// One simulation is single-threaded and deterministic: the same requests and configuration give
// the same steps, whatever the machine.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "edge/backend/engine/scheduler.h"
#include "edge/backend/runtime/kv_block_pool.h"
#include "edge/common/format.h"
#include "edge/common/status.h"

namespace edge::sim {

using backend::sequence_id;

struct request {
  sequence_id id = 0;
  std::string tenant = "default";
  double weight = 1.0;
  std::int32_t priority = 0;
  double arrival = 0.0;               // simulated seconds
  std::vector<std::int32_t> prompt;
  std::int64_t output_tokens = 1;     // generated before it stops by itself (EOS), if max_tokens allows
  std::int64_t max_tokens = 1;
  std::optional<double> cancel_at;    // the client goes away at this time
  std::int64_t choices = 1;           // n: sequences forked from the first (fork_id names them)
  bool prompt_logits = false;         // logits rows for the prompt's positions
};

// The sequence id of choice `choice` of request `id` (choice 0 is the request's own id).
inline sequence_id fork_id(sequence_id id, std::int64_t choice) {
  return choice == 0 ? id : (id << 16) | static_cast<sequence_id>(choice);
}

// What happened to one request.
struct outcome {
  std::optional<double> admitted;     // first admission
  std::optional<double> first_token;
  std::optional<double> finished;     // when it stopped, ran out of max_tokens or was cancelled
  bool cancelled = false;
  bool rejected = false;              // scheduler::add refused it
  std::int64_t generated = 0;         // by all its choices
  std::int64_t preemptions = 0;
  int finish_count = 0;               // must end up 1
};

// What a step computed, for the cost model.
struct step_work {
  std::int64_t sequences = 0;
  std::int64_t tokens = 0;            // tokens computed (prefill chunks and decode tokens)
  std::int64_t decode_tokens = 0;     // chunks of one token that sample
  std::int64_t context_tokens = 0;    // K/V entries attention reads: Σ over chunks of start + count
  std::int64_t attended = 0;          // query-key pairs: Σ over chunks' tokens of the positions each sees
};

// Seconds a step takes.
using cost_model = std::function<double(const step_work&)>;

inline double unit_cost(const step_work&) { return 1.0; }

// The made-up token a sequence samples at `position`: deterministic, and never a token the
// prompts of other requests are likely to share a block with.
inline std::int32_t sampled_token(sequence_id id, std::int64_t position) {
  std::uint64_t x = id * 0x9E3779B97F4A7C15ULL + static_cast<std::uint64_t>(position) * 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 31;
  return static_cast<std::int32_t>(x % 30000);
}

class simulation {
 public:
  // Called after every step with the plan it ran (already completed and sampled).
  using step_hook = std::function<status(const simulation&, const backend::step_plan&)>;

  static result<std::unique_ptr<simulation>> create(const backend::scheduler_config& config, std::int64_t num_blocks,
                                                    cost_model cost = unit_cost) {
    std::unique_ptr<simulation> s(new simulation(num_blocks, std::move(cost)));
    EDGE_ASSIGN_OR_RETURN(s->scheduler_, backend::scheduler::create(config, *s->pool_));
    return s;
  }

  // Runs the requests (any order; they are taken by arrival) until every one has finished or
  // `max_steps` steps ran (internal error then: something waits forever). The hook may stop
  // the run with an error.
  status run(std::vector<request> requests, std::int64_t max_steps, const step_hook& hook = {}) {
    std::stable_sort(requests.begin(), requests.end(),
                     [](const request& a, const request& b) { return a.arrival < b.arrival; });
    requests_ = std::move(requests);
    for (const request& r : requests_) {
      for (std::int64_t c = 0; c < r.choices; ++c) index_.emplace(fork_id(r.id, c), &r);
      outcomes_.emplace(r.id, outcome{});
    }
    std::size_t next_arrival = 0;
    std::size_t open_requests = requests_.size();
    for (steps_ = 0; open_requests > 0;) {
      if (steps_ >= max_steps) {
        return internal_error(format("{} requests still open after {} steps", open_requests, steps_));
      }
      // Nothing to do until the next arrival: jump there.
      if (scheduler_->idle() && next_arrival < requests_.size()) now_ = std::max(now_, requests_[next_arrival].arrival);
      for (; next_arrival < requests_.size() && requests_[next_arrival].arrival <= now_; ++next_arrival) {
        const request& r = requests_[next_arrival];
        std::vector<sequence_id> forks;
        for (std::int64_t c = 1; c < r.choices; ++c) forks.push_back(fork_id(r.id, c));
        const status added = scheduler_->add({.id = r.id,
                                              .tenant = r.tenant,
                                              .weight = r.weight,
                                              .priority = r.priority,
                                              .prompt = r.prompt,
                                              .max_tokens = r.max_tokens,
                                              .forks = std::move(forks),
                                              .prompt_logits = r.prompt_logits});
        if (!added.ok()) {
          outcome& o = outcomes_.at(r.id);
          o.rejected = true;
          end(r.id, o);
          --open_requests;
        } else {
          live_.push_back(r.id);
          choices_left_[r.id] = r.choices;
        }
      }
      // Cancellations that are due.
      for (std::size_t i = 0; i < live_.size();) {
        const request& r = *index_.at(live_[i]);
        if (r.cancel_at && *r.cancel_at <= now_) {
          // Every choice still running (one not forked yet goes with the first).
          bool removed = false;
          for (std::int64_t c = 0; c < r.choices; ++c) removed |= scheduler_->remove(fork_id(r.id, c));
          if (!removed) return internal_error(format("request {} vanished before its cancellation", r.id));
          outcome& o = outcomes_.at(r.id);
          o.cancelled = true;
          end(r.id, o);
          --open_requests;
          live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
          ++i;
        }
      }
      if (scheduler_->idle()) continue;

      backend::step_plan plan = scheduler_->schedule();
      ++steps_;
      step_work work;
      for (const auto& chunk : plan.chunks) {
        ++work.sequences;
        const auto count = static_cast<std::int64_t>(chunk.tokens.size());
        work.tokens += count;
        work.context_tokens += chunk.start + count;
        // Token i of the chunk (at position start + i) attends to start + i + 1 positions.
        work.attended += count * chunk.start + count * (count + 1) / 2;
        if (count == 1 && chunk.samples) ++work.decode_tokens;
      }
      const double step_start = now_;
      now_ += cost_(work);
      // (A fork of a request may be preempted and readmitted too.)
      for (const sequence_id id : plan.admitted) {
        outcome& o = outcomes_.at(index_.at(id)->id);
        if (!o.admitted) o.admitted = step_start;
      }
      for (const sequence_id id : plan.preempted) ++outcomes_.at(index_.at(id)->id).preemptions;
      scheduler_->complete(plan);
      std::vector<sequence_id> done;  // choices that ended
      for (const auto& chunk : plan.chunks) {
        if (!chunk.samples) continue;
        const request& r = *index_.at(chunk.id);
        outcome& o = outcomes_.at(r.id);
        const std::int64_t length = scheduler_->sequence_length(chunk.id);
        scheduler_->append_token(chunk.id, sampled_token(chunk.id, length));
        ++o.generated;
        const std::int64_t generated = ++generated_[chunk.id];
        if (!o.first_token) o.first_token = now_;
        const std::int64_t context = scheduler_->config().max_model_len;
        if (generated >= std::min(r.output_tokens, r.max_tokens) || (context > 0 && length + 1 >= context)) {
          done.push_back(chunk.id);
        }
      }
      if (hook) EDGE_RETURN_IF_ERROR(hook(*this, plan));
      tokens_computed_ += plan.tokens;
      for (const sequence_id id : done) {
        if (!scheduler_->remove(id)) return internal_error(format("finished sequence {} was not in the scheduler", id));
        const sequence_id request_id = index_.at(id)->id;
        if (--choices_left_.at(request_id) > 0) continue;
        end(request_id, outcomes_.at(request_id));
        --open_requests;
        live_.erase(std::find(live_.begin(), live_.end(), request_id));
      }
    }
    return {};
  }

  backend::scheduler& scheduler() { return *scheduler_; }
  const backend::scheduler& scheduler() const { return *scheduler_; }
  const backend::kv_block_pool& pool() const { return *pool_; }
  double now() const { return now_; }
  std::int64_t steps() const { return steps_; }
  std::int64_t tokens_computed() const { return tokens_computed_; }
  const outcome& outcome_of(sequence_id id) const { return outcomes_.at(id); }
  // The request a sequence (any of its choices) belongs to.
  const request& request_of(sequence_id id) const { return *index_.at(id); }
  // Requests added and not finished, in arrival order.
  const std::vector<sequence_id>& live() const { return live_; }
  // The scheduler's sequences of the live requests: their choices that run or wait.
  std::vector<sequence_id> live_sequences() const {
    std::vector<sequence_id> out;
    for (const sequence_id id : live_) {
      for (std::int64_t c = 0; c < index_.at(id)->choices; ++c) {
        if (scheduler_->contains(fork_id(id, c))) out.push_back(fork_id(id, c));
      }
    }
    return out;
  }

 private:
  simulation(std::int64_t num_blocks, cost_model cost)
      : pool_(std::make_unique<backend::kv_block_pool>(num_blocks)), cost_(std::move(cost)) {}

  void end(sequence_id, outcome& o) {
    o.finished = now_;
    ++o.finish_count;
  }

  std::unique_ptr<backend::kv_block_pool> pool_;
  std::unique_ptr<backend::scheduler> scheduler_;  // declared after the pool: destroyed first
  cost_model cost_;
  std::vector<request> requests_;
  std::unordered_map<sequence_id, const request*> index_;
  std::unordered_map<sequence_id, outcome> outcomes_;
  std::unordered_map<sequence_id, std::int64_t> generated_;     // by sequence (choice)
  std::unordered_map<sequence_id, std::int64_t> choices_left_;  // by request
  std::vector<sequence_id> live_;
  double now_ = 0.0;
  std::int64_t steps_ = 0;
  std::int64_t tokens_computed_ = 0;
};

}  // namespace edge::sim
