// Fair share across tenants, measured on the real scheduler and block pool in simulated time
// (tests/sim: each step costs one time unit), so the figures are exact and the same on every
// machine. Slots (max_num_seqs) are the scarce resource here; the KV cache has room to spare.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "sim/scheduler_sim.h"

namespace {

using namespace edge::backend;

constexpr std::int64_t slots = 8;

scheduler_config config(tenant_order order) {
  return {.block_size = 16,
          .max_num_seqs = slots,
          .max_num_batched_tokens = 1024,
          .order = order,
          .enable_prefix_caching = false};
}

// Enough blocks for every slot's longest request: the cache never limits admission.
constexpr std::int64_t num_blocks = 256;

std::vector<std::int32_t> prompt_of(std::int64_t n, std::int32_t seed) {
  std::vector<std::int32_t> p(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) p[static_cast<std::size_t>(i)] = seed * 1000 + static_cast<std::int32_t>(i);
  return p;
}

// `count` requests of one tenant arriving at `arrival`, ids from `first_id`.
std::vector<edge::sim::request> burst(const std::string& tenant, double weight, std::int64_t count, double arrival,
                                      edge::sim::sequence_id first_id, std::int64_t prompt, std::int64_t output,
                                      std::mt19937_64* jitter = nullptr) {
  std::vector<edge::sim::request> out;
  for (std::int64_t i = 0; i < count; ++i) {
    edge::sim::request r;
    r.id = first_id + static_cast<edge::sim::sequence_id>(i);
    r.tenant = tenant;
    r.weight = weight;
    r.arrival = arrival;
    r.prompt = prompt_of(prompt, static_cast<std::int32_t>(r.id));
    // With jitter, output lengths vary by ±50%, so slots free at different times.
    r.output_tokens = jitter ? std::uniform_int_distribution<std::int64_t>(output / 2, output * 3 / 2)(*jitter) : output;
    r.max_tokens = r.output_tokens;
    out.push_back(std::move(r));
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2.0;
}

// B's median queueing time (first admission - arrival) when B's 10 requests arrive just after
// A's backlog of `backlog`.
double b_median_queue_time(tenant_order order, std::int64_t backlog) {
  auto requests = burst("A", 1.0, backlog, 0.0, 1, 32, 32);
  auto b = burst("B", 1.0, 10, 0.5, 100'000, 32, 32);
  requests.insert(requests.end(), b.begin(), b.end());
  auto sim = edge::sim::simulation::create(config(order), num_blocks);
  REQUIRE(sim.ok());
  const auto ran = (*sim)->run(requests, 1'000'000);
  REQUIRE_MESSAGE(ran.ok(), ran.message());
  std::vector<double> waits;
  for (const auto& r : b) {
    const auto& o = (*sim)->outcome_of(r.id);
    REQUIRE(o.admitted);
    waits.push_back(*o.admitted - r.arrival);
  }
  return median(waits);
}

// Tokens served per tenant over the steps in which every tenant had a request waiting.
struct backlogged_service {
  std::map<std::string, double> tokens;
  std::int64_t steps = 0;
};

backlogged_service serve_while_backlogged(const std::vector<edge::sim::request>& requests, tenant_order order) {
  auto created = edge::sim::simulation::create(config(order), num_blocks);
  REQUIRE(created.ok());
  auto& sim = **created;
  std::set<std::string> all_tenants;
  for (const auto& r : requests) all_tenants.insert(r.tenant);
  backlogged_service out;
  const auto ran = sim.run(requests, 1'000'000, [&](const edge::sim::simulation& s, const step_plan& plan) {
    std::set<std::string> waiting;
    for (const auto id : s.live()) {
      if (s.scheduler().state_of(id) == sequence_state::waiting) waiting.insert(s.request_of(id).tenant);
    }
    if (waiting.size() == all_tenants.size()) {
      ++out.steps;
      for (const auto& chunk : plan.chunks) {
        out.tokens[s.request_of(chunk.id).tenant] += static_cast<double>(chunk.tokens.size());
      }
    }
    return edge::status{};
  });
  REQUIRE_MESSAGE(ran.ok(), ran.message());
  return out;
}

double jain_index(const std::vector<double>& x) {
  double sum = 0.0;
  double squares = 0.0;
  for (const double v : x) {
    sum += v;
    squares += v * v;
  }
  return squares == 0.0 ? 0.0 : sum * sum / (static_cast<double>(x.size()) * squares);
}

}  // namespace

TEST_CASE("fair share: a small tenant's queueing time does not grow with another tenant's backlog") {
  const double fair_50 = b_median_queue_time(tenant_order::fair_share, 50);
  const double fair_200 = b_median_queue_time(tenant_order::fair_share, 200);
  const double fcfs_50 = b_median_queue_time(tenant_order::first_come_first_served, 50);
  const double fcfs_200 = b_median_queue_time(tenant_order::first_come_first_served, 200);
  MESSAGE("B's median queueing time in steps: fair share ", fair_50, " (A's backlog 50) and ", fair_200,
          " (200); first come first served ", fcfs_50, " and ", fcfs_200);
  // About the same whatever A's backlog: within one request's duration (33 steps).
  CHECK(std::abs(fair_200 - fair_50) <= 33.0);
  CHECK(fair_200 < fcfs_50);
  // First come first served: B waits behind all of A's backlog, so its wait grows with it
  // (four times the backlog, about four times the wait).
  CHECK(fcfs_200 > 3.0 * fcfs_50);
  CHECK(fcfs_50 > 4.0 * fair_50);
}

TEST_CASE("fair share: tokens served per weight are even while both tenants are backlogged (Jain index)") {
  std::mt19937_64 jitter(7);
  // A sends long requests, B short ones: fairness is over tokens, not requests.
  auto requests = burst("A", 1.0, 200, 0.0, 1, 64, 64, &jitter);
  auto b = burst("B", 1.0, 400, 0.0, 100'000, 16, 8, &jitter);
  requests.insert(requests.end(), b.begin(), b.end());

  const auto fair = serve_while_backlogged(requests, tenant_order::fair_share);
  const double a = fair.tokens.at("A");
  const double bb = fair.tokens.at("B");
  const double fair_jain = jain_index({a, bb});
  const auto fcfs = serve_while_backlogged(requests, tenant_order::first_come_first_served);
  const double fcfs_jain = jain_index({fcfs.tokens.count("A") ? fcfs.tokens.at("A") : 0.0,
                                       fcfs.tokens.count("B") ? fcfs.tokens.at("B") : 0.0});
  MESSAGE("fair share: A ", a, " tokens, B ", bb, " over ", fair.steps, " backlogged steps: Jain ", fair_jain,
          "; first come first served: Jain ", fcfs_jain);
  REQUIRE(fair.steps > 500);
  CHECK(fair_jain >= 0.9);
  CHECK(fcfs_jain < 0.9);
}

TEST_CASE("fair share: weights 3:1 give about 3:1 throughput") {
  std::mt19937_64 jitter(11);
  auto requests = burst("A", 3.0, 300, 0.0, 1, 32, 32, &jitter);
  auto b = burst("B", 1.0, 300, 0.0, 100'000, 32, 32, &jitter);
  requests.insert(requests.end(), b.begin(), b.end());
  const auto served = serve_while_backlogged(requests, tenant_order::fair_share);
  const double ratio = served.tokens.at("A") / served.tokens.at("B");
  MESSAGE("A (weight 3) ", served.tokens.at("A"), " tokens, B (weight 1) ", served.tokens.at("B"), ": ratio ", ratio,
          " over ", served.steps, " steps");
  REQUIRE(served.steps > 500);
  CHECK(ratio > 2.7);
  CHECK(ratio < 3.3);
  // Per unit of weight, even.
  CHECK(jain_index({served.tokens.at("A") / 3.0, served.tokens.at("B")}) >= 0.99);
}

TEST_CASE("fair share: a tenant that was idle gets no credit for it") {
  // A runs alone for a while, then B arrives with a backlog as large as A's: B does not get to
  // monopolise the engine to "catch up" on the time it sent nothing.
  auto requests = burst("A", 1.0, 400, 0.0, 1, 32, 32);
  auto b = burst("B", 1.0, 400, 500.0, 100'000, 32, 32);
  requests.insert(requests.end(), b.begin(), b.end());
  const auto served = serve_while_backlogged(requests, tenant_order::fair_share);
  REQUIRE(served.steps > 300);
  const double ratio = served.tokens.at("B") / served.tokens.at("A");
  MESSAGE("after B arrives: B ", served.tokens.at("B"), " tokens, A ", served.tokens.at("A"));
  CHECK(ratio < 1.3);
  CHECK(ratio > 0.7);
}
