#include "edge/backend/engine/generator.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "edge/backend/engine/scheduler.h"
#include "edge/backend/engine/step_driver.h"
#include "edge/backend/engine/submission.h"
#include "edge/common/format.h"

namespace edge::backend {
namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

// One request in flight.
struct sequence {
  std::unique_ptr<sequence_decoder> decoder;
  generation_output output;
};

}  // namespace

generator::generator(const model& m, executor& exec, kv_block_pool& blocks, generator_options options)
    : model_(m), exec_(exec), blocks_(blocks), options_(options) {}

result<std::vector<generation_output>> generator::run(
    std::span<const generate_request> requests, const std::function<void(std::size_t, std::string_view)>& on_text,
    generation_timing* timing) {
  const std::int64_t context = model_.config.max_position;
  const std::int64_t budget = options_.max_num_batched_tokens > 0
                                  ? std::min(options_.max_num_batched_tokens, exec_.max_batch_tokens())
                                  : exec_.max_batch_tokens();
  // Every request is queued up front and the set is known: serve them in arrival order, and
  // leave no block idle (no watermark, no prefix cache: runs are independent).
  const scheduler_config config{.block_size = exec_.kv_layout().block_size,
                                .max_num_seqs = exec_.max_sequences(),
                                .max_num_batched_tokens = budget,
                                .admission = admission_policy::optimistic,
                                .order = tenant_order::first_come_first_served,
                                .enable_prefix_caching = false,
                                .watermark = 0.0,
                                .max_model_len = context};
  EDGE_ASSIGN_OR_RETURN(auto sched, scheduler::create(config, blocks_));
  step_driver driver(*sched, exec_);

  std::vector<sequence> seqs(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const generate_request& r = requests[i];
    if (auto refused = check_submission(r, {.sched = *sched, .vocab = exec_.vocab_size()})) {
      return status(std::move(*refused)).with_context(format("request {}", i));
    }
    if (r.n != 1) return invalid_argument(format("request {}: the generator runs one choice per request, not {}", i, r.n));
    seqs[i].decoder = std::move(choice_decoders(r, *model_.tok, context).front());
    EDGE_RETURN_IF_ERROR(sched->add({.id = i, .prompt = r.prompt, .max_tokens = r.max_tokens}));
  }

  generation_timing measured;
  while (!sched->idle()) {
    const auto start = clock_type::now();
    const step_plan plan = sched->schedule();
    if (plan.empty()) return resource_exhausted("the KV cache cannot hold the next step of any request");
    // A chunk decodes when it is one token past the prompt; any other computes a prompt or, after
    // a preemption, recomputes a sequence.
    std::int64_t prompt_tokens = 0;
    for (const scheduled_chunk& chunk : plan.chunks) {
      const bool decodes = chunk.tokens.size() == 1 &&
                           chunk.start >= static_cast<std::int64_t>(requests[chunk.id].prompt.size());
      if (!decodes) prompt_tokens += static_cast<std::int64_t>(chunk.tokens.size());
    }
    EDGE_ASSIGN_OR_RETURN(const auto sampled, driver.run(plan, [&](sequence_id id) {
                            return driven_sequence{.decoder = seqs[id].decoder.get()};
                          }));
    for (const sampled_token& t : sampled) {
      sequence& s = seqs[t.id];
      if (!t.decoded.dropped) s.output.tokens.push_back(t.token);
      if (!t.decoded.text.empty()) {
        s.output.text += t.decoded.text;
        if (on_text) on_text(t.id, t.decoded.text);
      }
      if (t.decoded.finish) {
        if (*t.decoded.finish == finish_reason::error) return internal_error(format("request {}: {}", t.id, t.decoded.error));
        s.output.reason = *t.decoded.finish;
        sched->remove(t.id);
      }
    }
    const double seconds = seconds_since(start);
    if (prompt_tokens > 0) {
      measured.prefill_seconds += seconds;
      measured.prefill_tokens += prompt_tokens;
    } else {
      measured.decode_seconds += seconds;
      measured.decode_tokens += static_cast<std::int64_t>(sampled.size());
      ++measured.decode_steps;
    }
  }
  if (timing != nullptr) *timing = measured;

  std::vector<generation_output> outputs;
  outputs.reserve(seqs.size());
  for (auto& s : seqs) outputs.push_back(std::move(s.output));
  return outputs;
}

}  // namespace edge::backend
