// The scheduler's invariants over thousands of random workloads on tiny pools: random arrivals,
// prompt and output lengths, shared prompt prefixes, priorities, tenants, cancellations, block
// sizes, budgets and policies, requests for several choices (forks), each run to the end by the
// simulation driver (tests/sim) with the real scheduler and the real block pool. After every step:
//   * blocks are conserved: every block is free exactly once or referenced exactly as many
//     times as block tables hold it (scheduler::check_invariants, kv_block_pool's own check);
//   * usage never exceeds the budget: held + free = total, and a step that admitted left at
//     least the watermark free;
//   * no block is owned twice except a full block shared by reference count (a cached prefix,
//     or a prompt block a request's choices share), no step writes into a block another
//     sequence holds, and a fork's copy goes into a block of its own;
//   * a step stays within max_num_seqs and max_num_batched_tokens, and a partial prompt chunk
//     ends on a block boundary (or right before the last prompt token of a request that forks);
//   * reserve admission never preempts and never grows a block table;
//   * prompt logits rows stay within the step's bound, inside their chunk, before the last
//     prompt token, and never cover a position twice.
// At the end: every request finished exactly once, within a bounded number of steps (none
// waits forever), each of its choices generated what it was meant to, a request that asked for
// prompt logits got a row for every prompt position but the last, and every block is free again.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <set>
#include <unordered_map>

#include "sim/scheduler_sim.h"

namespace {

using namespace edge::backend;

struct coverage {
  std::int64_t workloads = 0;
  std::int64_t preemptions = 0;
  std::int64_t prefix_hits = 0;
  std::int64_t partial_chunks = 0;
  std::int64_t cancellations = 0;
  std::int64_t rejections = 0;
  std::int64_t completed = 0;
  std::int64_t forks = 0;
  std::int64_t copies = 0;
  std::int64_t prompt_rows = 0;
};

// Prompt positions that got a logits row, per request.
using scored_positions = std::unordered_map<sequence_id, std::vector<int>>;

struct workload {
  scheduler_config config;
  std::int64_t num_blocks = 0;
  std::vector<edge::sim::request> requests;
};

workload random_workload(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto pick = [&rng](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  const auto chance = [&rng](double p) { return std::bernoulli_distribution(p)(rng); };

  workload w;
  static constexpr std::int64_t block_sizes[] = {1, 2, 4, 8, 16};
  w.config.block_size = block_sizes[pick(0, 4)];
  w.num_blocks = pick(1, 40);
  w.config.max_num_seqs = pick(1, 8);
  w.config.max_num_batched_tokens = w.config.block_size * pick(1, 8) + pick(0, w.config.block_size - 1);
  w.config.admission = chance(0.5) ? admission_policy::optimistic : admission_policy::reserve;
  w.config.order = chance(0.8) ? tenant_order::fair_share : tenant_order::first_come_first_served;
  w.config.enable_prefix_caching = chance(0.7);
  static constexpr double watermarks[] = {0.0, 0.01, 0.1, 0.3};
  w.config.watermark = watermarks[pick(0, 3)];
  w.config.max_model_len = chance(0.3) ? pick(2, 200) : 0;
  w.config.max_prompt_logits = w.config.block_size * pick(1, 4);
  if (static_cast<std::int64_t>(w.config.watermark * static_cast<double>(w.num_blocks)) >= w.num_blocks) {
    w.config.watermark = 0.0;
  }

  const std::int64_t capacity = w.num_blocks * w.config.block_size;
  // A few prompt "families": requests of one family share a beginning, so the prefix cache
  // gets hits (and a tiny vocabulary makes accidental matches too).
  std::vector<std::vector<std::int32_t>> families(static_cast<std::size_t>(pick(1, 3)));
  for (auto& f : families) {
    f.resize(static_cast<std::size_t>(pick(0, std::max<std::int64_t>(1, capacity))));
    for (auto& t : f) t = static_cast<std::int32_t>(pick(0, 3));
  }
  const std::int64_t tenants = pick(1, 3);
  std::vector<double> weights;
  for (std::int64_t t = 0; t < tenants; ++t) weights.push_back(static_cast<double>(pick(1, 3)));

  const std::int64_t count = pick(1, 24);
  const std::int64_t horizon = pick(1, 40);
  for (std::int64_t i = 0; i < count; ++i) {
    edge::sim::request r;
    r.id = static_cast<edge::sim::sequence_id>(i + 1);
    const std::int64_t tenant = pick(0, tenants - 1);
    r.tenant = "t" + std::to_string(tenant);
    r.weight = weights[static_cast<std::size_t>(tenant)];
    r.priority = static_cast<std::int32_t>(pick(0, 2));
    r.arrival = static_cast<double>(pick(0, horizon));
    // Up to a little over the whole cache: some requests cannot ever fit and are refused.
    const std::int64_t length = pick(1, capacity + 4);
    const auto& family = families[static_cast<std::size_t>(pick(0, static_cast<std::int64_t>(families.size()) - 1))];
    for (std::int64_t k = 0; k < length; ++k) {
      r.prompt.push_back(k < static_cast<std::int64_t>(family.size()) && chance(0.9)
                             ? family[static_cast<std::size_t>(k)]
                             : static_cast<std::int32_t>(pick(0, 3)));
    }
    r.output_tokens = pick(1, 20);
    r.max_tokens = chance(0.3) ? pick(1, 8) : pick(1, std::max<std::int64_t>(1, capacity));
    if (chance(0.2)) r.cancel_at = r.arrival + static_cast<double>(pick(0, 20));
    if (chance(0.3)) r.choices = pick(2, 4);
    r.prompt_logits = chance(0.2);
    w.requests.push_back(std::move(r));
  }
  return w;
}

edge::status check_step(const edge::sim::simulation& sim, const step_plan& plan, const workload& w,
                        std::unordered_map<sequence_id, std::size_t>& reserved, scored_positions& scored,
                        coverage& seen) {
  using edge::format;
  using edge::internal_error;
  const scheduler& sched = sim.scheduler();
  const kv_block_pool& pool = sim.pool();
  const scheduler_config& c = w.config;
  EDGE_RETURN_IF_ERROR(sched.check_invariants());

  if (plan.tokens > c.max_num_batched_tokens) {
    return internal_error(format("step computes {} tokens, over the budget of {}", plan.tokens, c.max_num_batched_tokens));
  }
  if (static_cast<std::int64_t>(plan.chunks.size()) > c.max_num_seqs || sched.num_running() > c.max_num_seqs) {
    return internal_error(format("{} chunks, {} running: over max_num_seqs {}", plan.chunks.size(), sched.num_running(),
                                 c.max_num_seqs));
  }

  // Blocks held, each counted once, plus free ones: the whole pool, never more.
  std::set<std::int32_t> held;
  for (const sequence_id id : sim.live_sequences()) {
    for (const std::int32_t b : sched.block_table(id)) held.insert(b);
    for (const std::int32_t b : sched.fork_blocks(id)) held.insert(b);
  }
  if (static_cast<std::int64_t>(held.size()) + pool.free_blocks() != pool.total_blocks()) {
    return internal_error(format("{} blocks held and {} free of {}", held.size(), pool.free_blocks(), pool.total_blocks()));
  }
  const auto watermark_blocks = static_cast<std::int64_t>(c.watermark * static_cast<double>(pool.total_blocks()));
  if (!plan.admitted.empty() && pool.free_blocks() < watermark_blocks) {
    return internal_error(format("admitted with {} blocks free, under the watermark of {}", pool.free_blocks(),
                                 watermark_blocks));
  }

  std::int64_t tokens = 0;
  for (const scheduled_chunk& chunk : plan.chunks) {
    const auto count = static_cast<std::int64_t>(chunk.tokens.size());
    tokens += count;
    if (count == 0) return internal_error(format("empty chunk for {}", chunk.id));
    const std::int64_t end = chunk.start + count;
    if (static_cast<std::int64_t>(chunk.block_table.size()) * c.block_size < end) {
      return internal_error(format("sequence {}: {} blocks do not cover position {}", chunk.id, chunk.block_table.size(), end));
    }
    if (!chunk.samples) {
      ++seen.partial_chunks;
      const auto& r = sim.request_of(chunk.id);
      const bool before_fork = r.choices > 1 && end == static_cast<std::int64_t>(r.prompt.size()) - 1;
      if (end % c.block_size != 0 && !before_fork) {
        return internal_error(format("partial chunk of {} ends mid-block at {}", chunk.id, end));
      }
    }
    // The blocks this chunk wrote belong to this sequence alone.
    for (std::int64_t b = chunk.start / c.block_size; b < (end + c.block_size - 1) / c.block_size; ++b) {
      const std::int32_t block = chunk.block_table[static_cast<std::size_t>(b)];
      if (pool.ref_count(block) != 1) {
        return internal_error(format("sequence {} wrote block {}, which {} sequences hold", chunk.id, block,
                                     pool.ref_count(block)));
      }
    }
  }
  if (tokens != plan.tokens) return internal_error("the plan's token count is not the sum of its chunks");

  std::int64_t rows = 0;
  for (const scheduled_chunk& chunk : plan.chunks) {
    if (chunk.prompt_logits_count == 0) continue;
    const auto& r = sim.request_of(chunk.id);
    const auto count = static_cast<std::int64_t>(chunk.tokens.size());
    if (!r.prompt_logits || chunk.prompt_logits_offset < 0 || chunk.prompt_logits_offset + chunk.prompt_logits_count > count) {
      return internal_error(format("sequence {}: prompt logits rows [{}, +{}) in a chunk of {}", chunk.id,
                                   chunk.prompt_logits_offset, chunk.prompt_logits_count, count));
    }
    rows += chunk.prompt_logits_count;
    auto& positions = scored[r.id];
    positions.resize(r.prompt.size(), 0);
    for (std::int64_t i = 0; i < chunk.prompt_logits_count; ++i) {
      const std::int64_t position = chunk.start + chunk.prompt_logits_offset + i;
      if (position >= static_cast<std::int64_t>(r.prompt.size()) - 1) {
        return internal_error(format("sequence {} got a prompt logits row at position {} of a prompt of {}", chunk.id,
                                     position, r.prompt.size()));
      }
      if (++positions[static_cast<std::size_t>(position)] > 1) {
        return internal_error(format("sequence {} got a second prompt logits row at position {}", chunk.id, position));
      }
    }
  }
  if (rows > c.max_prompt_logits) {
    return internal_error(format("{} prompt logits rows in a step, over the bound of {}", rows, c.max_prompt_logits));
  }
  seen.prompt_rows += rows;

  // A fork's copy lands in a block of the fork's own, right after the prompt blocks it shares.
  for (const block_copy& copy : plan.copies) {
    ++seen.copies;
    if (pool.ref_count(copy.to) != 1) {
      return internal_error(format("a copy into block {}, which {} sequences hold", copy.to, pool.ref_count(copy.to)));
    }
    const bool forked_there = std::any_of(plan.forked.begin(), plan.forked.end(), [&](const auto& f) {
      const auto table = sched.block_table(f.second);
      const auto parent = sched.block_table(f.first);
      const auto shared = static_cast<std::size_t>((static_cast<std::int64_t>(sim.request_of(f.second).prompt.size()) - 1) /
                                                   c.block_size);
      return table.size() > shared && parent.size() > shared && table[shared] == copy.to && parent[shared] == copy.from;
    });
    if (!forked_there) return internal_error(format("a copy {} -> {} that no fork of this step asked for", copy.from, copy.to));
  }
  seen.forks += static_cast<std::int64_t>(plan.forked.size());

  if (c.admission == admission_policy::reserve) {
    if (!plan.preempted.empty()) return internal_error("reserve admission preempted");
    for (const sequence_id id : plan.admitted) reserved[id] = sched.block_table(id).size();
    for (const auto& [parent, child] : plan.forked) reserved[child] = sched.block_table(child).size();
    for (const sequence_id id : sim.live_sequences()) {
      if (sched.state_of(id) != sequence_state::running) continue;
      if (sched.block_table(id).size() != reserved.at(id)) {
        return internal_error(format("reserved sequence {} grew from {} to {} blocks", id, reserved.at(id),
                                     sched.block_table(id).size()));
      }
    }
  }
  return {};
}

}  // namespace

TEST_CASE("scheduler invariants hold over thousands of random workloads") {
  constexpr std::uint64_t workloads = 4000;
  coverage seen;
  for (std::uint64_t seed = 1; seed <= workloads; ++seed) {
    const workload w = random_workload(seed);
    CAPTURE(seed);
    auto created = edge::sim::simulation::create(w.config, w.num_blocks);
    REQUIRE_MESSAGE(created.ok(), created.error().message());
    auto& sim = **created;
    std::unordered_map<sequence_id, std::size_t> reserved;
    scored_positions scored;
    // Generous: a workload has at most 24 requests of at most a few hundred tokens each.
    constexpr std::int64_t max_steps = 100'000;
    const auto ran = sim.run(w.requests, max_steps, [&](const edge::sim::simulation& s, const step_plan& plan) {
      return check_step(s, plan, w, reserved, scored, seen);
    });
    REQUIRE_MESSAGE(ran.ok(), ran.message());

    for (const auto& r : w.requests) {
      const auto& o = sim.outcome_of(r.id);
      CAPTURE(r.id);
      CHECK(o.finish_count == 1);
      if (o.cancelled) ++seen.cancellations;
      if (o.rejected) ++seen.rejections;
      if (!o.cancelled && !o.rejected) {
        ++seen.completed;
        // A request that ran to its end generated exactly what it was meant to.
        std::int64_t expected = std::min(r.output_tokens, r.max_tokens);
        if (w.config.max_model_len > 0) {
          expected = std::min<std::int64_t>(expected, w.config.max_model_len - static_cast<std::int64_t>(r.prompt.size()));
        }
        CHECK(o.generated == expected * r.choices);
        if (r.prompt_logits) {
          // Every position but the last has its row (and none twice: check_step).
          const auto& positions = scored[r.id];
          const auto wanted = static_cast<std::int64_t>(r.prompt.size()) - 1;
          CHECK(std::count(positions.begin(), positions.end(), 1) == wanted);
        }
      }
    }
    CHECK(sim.scheduler().idle());
    CHECK(sim.pool().free_blocks() == w.num_blocks);
    CHECK(sim.scheduler().check_invariants().ok());
    seen.preemptions += sim.scheduler().counters().preemptions;
    seen.prefix_hits += sim.scheduler().counters().prefix_hits;
    ++seen.workloads;
  }
  // The workloads exercise what the invariants are about.
  MESSAGE("preemptions ", seen.preemptions, ", prefix-cache hit tokens ", seen.prefix_hits, ", partial prompt chunks ",
          seen.partial_chunks, ", cancellations ", seen.cancellations, ", refused ", seen.rejections, ", completed ",
          seen.completed, ", forks ", seen.forks, ", copies ", seen.copies, ", prompt logits rows ", seen.prompt_rows);
  CHECK(seen.preemptions > 100);
  CHECK(seen.prefix_hits > 1000);
  CHECK(seen.partial_chunks > 1000);
  CHECK(seen.cancellations > 1000);
  CHECK(seen.rejections > 100);
  CHECK(seen.completed > 10000);
  CHECK(seen.forks > 1000);
  CHECK(seen.copies > 500);
  CHECK(seen.prompt_rows > 10000);
}
