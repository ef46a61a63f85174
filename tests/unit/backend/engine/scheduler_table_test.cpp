// The scheduler step by step, as tables of iterations and the state expected after each, run
// against the real block pool at tiny sizes (blocks of 4 tokens, pools of a few blocks).
//
// A row's expectation reads, left to right:
//   chunks computed in plan order      A@0+6*   (A computes 6 tokens from position 0; * = samples;
//                                      {0+5}: logits rows for its tokens 0 to 4, prompt logits)
//   admissions and preemptions         +A -B
//   forks and block copies             A>B,C copy 2>3,2>4
//   requests that ended after the step ~A     (generated their output length)
//   requests still waiting             wait=B,C
//   free blocks at the end of the row  free=4
// Fields with nothing to show are left out.
#include <doctest/doctest.h>

#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "edge/backend/engine/scheduler.h"
#include "edge/backend/runtime/kv_block_pool.h"

namespace {

using namespace edge::backend;

constexpr std::int64_t block = 4;

std::vector<std::int32_t> tokens(std::int64_t n, std::int32_t first = 100) {
  std::vector<std::int32_t> out(static_cast<std::size_t>(n));
  std::iota(out.begin(), out.end(), first);
  return out;
}

// Requests are named by one letter; their id is the letter's code.
sequence_id id_of(char name) { return static_cast<sequence_id>(name); }
char name_of(sequence_id id) { return static_cast<char>(id); }

struct request_shape {
  char name = 'A';
  std::int64_t prompt = 1;
  std::int64_t output = 1;  // tokens it generates before it ends by itself
  std::int64_t max_tokens = 0;  // 0: the output length
  std::int32_t priority = 0;
  std::string tenant = "default";
  std::int32_t first_token = 100;  // prompt tokens are first_token, first_token + 1, ...
  std::string forks;               // the names of its further choices
  bool prompt_logits = false;
};

class table_driver {
 public:
  table_driver(scheduler_config config, std::int64_t blocks) : pool_(blocks) {
    config.block_size = block;
    auto s = scheduler::create(config, pool_);
    REQUIRE_MESSAGE(s.ok(), s.error().message());
    sched_ = std::move(s).value();
  }

  void add(const request_shape& r) {
    std::vector<sequence_id> forks;
    for (const char f : r.forks) forks.push_back(id_of(f));
    const auto added = sched_->add({.id = id_of(r.name),
                                    .tenant = r.tenant,
                                    .priority = r.priority,
                                    .prompt = tokens(r.prompt, r.first_token),
                                    .max_tokens = r.max_tokens > 0 ? r.max_tokens : r.output,
                                    .forks = forks,
                                    .prompt_logits = r.prompt_logits});
    REQUIRE_MESSAGE(added.ok(), added.message());
    for (const sequence_id id : forks) output_[id] = r.max_tokens > 0 ? std::min(r.output, r.max_tokens) : r.output;
    output_[id_of(r.name)] = r.max_tokens > 0 ? std::min(r.output, r.max_tokens) : r.output;
    order_.push_back(id_of(r.name));
    order_.insert(order_.end(), forks.begin(), forks.end());
  }

  void cancel(char name) { REQUIRE(sched_->remove(id_of(name))); }

  // One iteration: schedule, "run" it, sample for the chunks that sample, end the requests
  // that reached their output length. Returns the row as described at the top.
  std::string step() {
    const step_plan plan = sched_->schedule();
    std::string line;
    const auto add_field = [&line](const std::string& field) {
      if (field.empty()) return;
      if (!line.empty()) line += " | ";
      line += field;
    };
    std::string chunks;
    for (const auto& c : plan.chunks) {
      if (!chunks.empty()) chunks += ' ';
      chunks += std::string(1, name_of(c.id)) + "@" + std::to_string(c.start) + "+" + std::to_string(c.tokens.size()) +
                (c.samples ? "*" : "");
      if (c.prompt_logits_count > 0) {
        chunks += "{" + std::to_string(c.prompt_logits_offset) + "+" + std::to_string(c.prompt_logits_count) + "}";
      }
      // What the executor relies on: the table covers every position computed.
      CHECK(static_cast<std::int64_t>(c.block_table.size()) * block >= c.start + static_cast<std::int64_t>(c.tokens.size()));
    }
    add_field(chunks);
    std::string moves;
    for (const auto id : plan.admitted) moves += (moves.empty() ? "+" : " +") + std::string(1, name_of(id));
    for (const auto id : plan.preempted) moves += (moves.empty() ? "-" : " -") + std::string(1, name_of(id));
    add_field(moves);
    std::string forks;  // "A>B,C": a parent's forks are consecutive in plan.forked
    sequence_id last_parent = 0;
    for (const auto& [parent, child] : plan.forked) {
      forks += parent == last_parent ? std::string(",") : (forks.empty() ? "" : " ") + std::string(1, name_of(parent)) + ">";
      forks += name_of(child);
      last_parent = parent;
    }
    std::string copies;
    for (const block_copy& copy : plan.copies) {
      copies += (copies.empty() ? "copy " : ",") + std::to_string(copy.from) + ">" + std::to_string(copy.to);
    }
    add_field(forks + (forks.empty() || copies.empty() ? "" : " ") + copies);

    sched_->complete(plan);
    std::string ended;
    for (const auto& c : plan.chunks) {
      if (!c.samples) continue;
      sched_->append_token(c.id, 7);
      if (++generated_[c.id] >= output_.at(c.id)) {
        REQUIRE(sched_->remove(c.id));
        ended += (ended.empty() ? "~" : " ~") + std::string(1, name_of(c.id));
      }
    }
    add_field(ended);
    std::string waiting;
    for (const auto id : order_) {
      if (sched_->state_of(id) == sequence_state::waiting) waiting += (waiting.empty() ? "wait=" : ",") + std::string(1, name_of(id));
    }
    add_field(waiting);
    add_field("free=" + std::to_string(pool_.free_blocks()));
    const auto ok = sched_->check_invariants();
    CHECK_MESSAGE(ok.ok(), ok.message());
    return line;
  }

  // Runs rows: each may add or cancel requests before its step.
  struct row {
    std::vector<request_shape> add;
    std::vector<char> cancel;
    std::string expect;
  };
  void run(const std::vector<row>& rows) {
    int i = 0;
    for (const auto& r : rows) {
      for (const auto& a : r.add) add(a);
      for (const char c : r.cancel) cancel(c);
      CAPTURE(i);
      CHECK(step() == r.expect);
      ++i;
    }
  }

  scheduler& sched() { return *sched_; }
  kv_block_pool& pool() { return pool_; }

 private:
  kv_block_pool pool_;
  std::unique_ptr<scheduler> sched_;
  std::map<sequence_id, std::int64_t> output_;
  std::map<sequence_id, std::int64_t> generated_;
  std::vector<sequence_id> order_;
};

scheduler_config config(std::int64_t max_seqs = 8, std::int64_t max_tokens = 64,
                        admission_policy policy = admission_policy::optimistic, bool prefix = false,
                        double watermark = 0.0, std::int64_t prompt_logits = 0) {
  return {.max_num_seqs = max_seqs,
          .max_num_batched_tokens = max_tokens,
          .admission = policy,
          .enable_prefix_caching = prefix,
          .watermark = watermark,
          .max_prompt_logits = prompt_logits};
}

}  // namespace

TEST_CASE("admission: within max_num_seqs, by arrival; a finished request's slot goes to the next") {
  table_driver t(config(/*max_seqs=*/2), 8);
  t.run({
      {.add = {{.name = 'A', .prompt = 6, .output = 2}, {.name = 'B', .prompt = 5, .output = 1},
               {.name = 'C', .prompt = 3, .output = 1}},
       .expect = "A@0+6* B@0+5* | +A +B | ~B | wait=C | free=6"},
      // A decodes its 7th token in its second block; C takes B's place.
      {.expect = "A@6+1* C@0+3* | +C | ~A ~C | free=8"},
  });
}

TEST_CASE("admission: blocks must fit under the watermark, and a request that does not fit is not overtaken") {
  // 10 blocks, watermark 0.2: admission leaves 2 blocks free.
  table_driver t(config(8, 64, admission_policy::optimistic, false, 0.2), 10);
  t.run({
      {.add = {{.name = 'A', .prompt = 16, .output = 3},   // 4 blocks
               {.name = 'B', .prompt = 16, .output = 1},   // 4 more would leave 2: fits exactly
               {.name = 'C', .prompt = 5, .output = 1},    // 2 more would leave 0: must wait
               {.name = 'D', .prompt = 1, .output = 1}},   // 1 block would fit, but D is behind C
       .expect = "A@0+16* B@0+16* | +A +B | ~B | wait=C,D | free=6"},
      // A grows into a fifth block (running sequences may use the watermark); C needs 2 and
      // 6 - 1 - 2 = 3 >= 2 leaves the watermark free; then D fits too.
      {.expect = "A@16+1* C@0+5* D@0+1* | +C +D | ~C ~D | free=5"},
      {.expect = "A@17+1* | ~A | free=10"},
  });
}

TEST_CASE("chunked prefill: a long prompt in whole blocks under the step's token budget") {
  // 8 tokens per step at most.
  table_driver t(config(8, /*max_tokens=*/8), 16);
  t.run({
      {.add = {{.name = 'A', .prompt = 19, .output = 3}}, .expect = "A@0+8 | +A | free=11"},
      // B arrives, but A's chunk takes the whole budget.
      {.add = {{.name = 'B', .prompt = 2, .output = 4}}, .expect = "A@8+8 | wait=B | free=11"},
      // A's last 3 tokens end its prompt (no block boundary needed); B fits in the 5 left.
      {.expect = "A@16+3* B@0+2* | +B | free=10"},
      {.expect = "A@19+1* B@2+1* | free=10"},
      // C's 12-token prompt gets the 6 tokens left: cut back to the block boundary at 4.
      {.add = {{.name = 'C', .prompt = 12, .output = 1}}, .expect = "A@20+1* B@3+1* C@0+4 | +C | ~A | free=12"},
      // 7 tokens left for C: again cut back to a block boundary, at 8.
      {.expect = "B@4+1* C@4+4 | ~B | free=13"},
      {.expect = "C@8+4* | ~C | free=16"},
  });
}

TEST_CASE("preemption by recompute: the latest arrival gives its blocks back and is recomputed from its tokens") {
  // 4 blocks of 4; A and B take 2 each, and the first to need a third forces a preemption.
  table_driver t(config(), 4);
  t.run({
      {.add = {{.name = 'A', .prompt = 7, .output = 5}, {.name = 'B', .prompt = 7, .output = 3}},
       .expect = "A@0+7* B@0+7* | +A +B | free=0"},
      {.expect = "A@7+1* B@7+1* | free=0"},
      // A needs a third block for position 8: B (arrived last) is preempted.
      {.expect = "A@8+1* | -B | wait=B | free=1"},
      // B needs 3 blocks for its 9 tokens (prompt + 2 generated): only 1 is free.
      {.expect = "A@9+1* | wait=B | free=1"},
      {.expect = "A@10+1* | ~A | wait=B | free=4"},
      // B recomputes all 9 tokens and samples its third.
      {.expect = "B@0+9* | +B | ~B | free=4"},
  });
  CHECK(t.sched().counters().preemptions == 1);
}

TEST_CASE("preemption takes the lowest priority first, even when it arrived earlier") {
  table_driver t(config(), 4);
  t.run({
      {.add = {{.name = 'L', .prompt = 7, .output = 4, .priority = 0}, {.name = 'H', .prompt = 7, .output = 4, .priority = 5}},
       // Running order is priority first: H is planned before L.
       .expect = "H@0+7* L@0+7* | +H +L | free=0"},
      {.expect = "H@7+1* L@7+1* | free=0"},
      {.expect = "H@8+1* | -L | wait=L | free=1"},
  });
}

TEST_CASE("a running sequence that is itself last in line preempts itself and waits") {
  // A's two blocks hold positions up to 7; B's one block fills at position 3.
  table_driver t(config(), 3);
  t.run({
      {.add = {{.name = 'A', .prompt = 5, .output = 3}, {.name = 'B', .prompt = 4, .output = 2}},
       .expect = "A@0+5* B@0+4* | +A +B | free=0"},
      // B needs a second block, none is free, and B is last in line: it gives back its own.
      {.expect = "A@5+1* | -B | wait=B | free=1"},
      {.expect = "A@6+1* | ~A | wait=B | free=3"},
      {.expect = "B@0+5* | +B | ~B | free=3"},
  });
}

TEST_CASE("reserve: prompt + max_tokens up front, so nothing ever grows or is preempted") {
  table_driver t(config(8, 64, admission_policy::reserve), 6);
  t.run({
      // Each needs blocks for 7 + 4 = 11 tokens: 3 blocks. Two fit.
      {.add = {{.name = 'A', .prompt = 7, .output = 4, .max_tokens = 4},
               {.name = 'B', .prompt = 7, .output = 2, .max_tokens = 4},
               {.name = 'C', .prompt = 7, .output = 1, .max_tokens = 4}},
       .expect = "A@0+7* B@0+7* | +A +B | wait=C | free=0"},
      {.expect = "A@7+1* B@7+1* | ~B | wait=C | free=3"},
      {.expect = "A@8+1* C@0+7* | +C | ~C | free=3"},
      {.expect = "A@9+1* | ~A | free=6"},
  });
  CHECK(t.sched().counters().preemptions == 0);
}

TEST_CASE("priority: a higher-priority request is admitted before earlier ones of its tenant") {
  table_driver t(config(/*max_seqs=*/1), 8);
  t.run({
      {.add = {{.name = 'A', .prompt = 3, .output = 2}}, .expect = "A@0+3* | +A | free=7"},
      {.add = {{.name = 'L', .prompt = 3, .output = 1}, {.name = 'H', .prompt = 3, .output = 1, .priority = 1}},
       .expect = "A@3+1* | ~A | wait=L,H | free=8"},
      {.expect = "H@0+3* | +H | ~H | wait=L | free=8"},
      {.expect = "L@0+3* | +L | ~L | free=8"},
  });
}

TEST_CASE("fair share: slots that free at once are shared, each admission charged before the next is chosen") {
  // Tenant a: A, C, D; tenant b: B, E, F. Two slots.
  table_driver t(config(/*max_seqs=*/2), 16);
  t.run({
      // Both start level; a goes first (a tie goes to the tenant picked longest ago, then by name).
      {.add = {{.name = 'A', .prompt = 4, .output = 5, .tenant = "a"}, {.name = 'B', .prompt = 3, .output = 5, .tenant = "b"}},
       .expect = "A@0+4* B@0+3* | +A +B | free=14"},
      {.add = {{.name = 'C', .prompt = 3, .output = 1, .tenant = "a"}, {.name = 'D', .prompt = 3, .output = 1, .tenant = "a"},
               {.name = 'E', .prompt = 3, .output = 1, .tenant = "b"}, {.name = 'F', .prompt = 3, .output = 1, .tenant = "b"}},
       .expect = "A@4+1* B@3+1* | wait=C,D,E,F | free=13"},
      {.expect = "A@5+1* B@4+1* | wait=C,D,E,F | free=12"},
      {.expect = "A@6+1* B@5+1* | wait=C,D,E,F | free=12"},
      // Served so far: a 8 tokens, b 7.
      {.expect = "A@7+1* B@6+1* | ~A ~B | wait=C,D,E,F | free=16"},
      // b is behind and gets E (b: 10); now a is behind and gets C (a: 11): one slot each, not
      // both to b because b's charge for E counted before the second slot was given.
      {.expect = "E@0+3* C@0+3* | +E +C | ~E ~C | wait=D,F | free=16"},
      {.expect = "F@0+3* D@0+3* | +F +D | ~F ~D | free=16"},
  });
  CHECK(t.sched().tokens_served("a") == 0);  // forgotten once it has nothing left
}

TEST_CASE("prefix cache: full blocks of an earlier prompt are shared, never the block of the last token") {
  table_driver t(config(8, 64, admission_policy::optimistic, /*prefix=*/true), 8);
  t.run({
      {.add = {{.name = 'A', .prompt = 9, .output = 1}}, .expect = "A@0+9* | +A | ~A | free=8"},
      // B has A's 9 tokens: blocks [0,4) and [4,8) come from the cache, token 8 is computed.
      {.add = {{.name = 'B', .prompt = 9, .output = 2}}, .expect = "B@8+1* | +B | free=5"},
      // C's prompt is exactly A's first 8 tokens: only the first block is shared, because the
      // last token must be computed (its logits are needed) in a block of C's own.
      {.add = {{.name = 'C', .prompt = 8, .output = 1}}, .expect = "B@9+1* C@4+4* | +C | ~B ~C | free=8"},
      // Another tenant's identical prompt finds nothing: the salt differs.
      {.add = {{.name = 'D', .prompt = 9, .output = 1, .tenant = "other"}}, .expect = "D@0+9* | +D | ~D | free=8"},
  });
  CHECK(t.sched().counters().prefix_hits == 8 + 4);
}

TEST_CASE("a block shared by two running sequences is freed only when both let go") {
  table_driver t(config(8, 64, admission_policy::optimistic, true), 8);
  t.run({
      {.add = {{.name = 'A', .prompt = 9, .output = 3}}, .expect = "A@0+9* | +A | free=5"},
      {.add = {{.name = 'B', .prompt = 9, .output = 3}}, .expect = "A@9+1* B@8+1* | +B | free=4"},
  });
  // A's first two blocks are in both tables.
  const auto a_table = t.sched().block_table(id_of('A'));
  const auto b_table = t.sched().block_table(id_of('B'));
  const std::vector<std::int32_t> a(a_table.begin(), a_table.end());
  const std::vector<std::int32_t> b(b_table.begin(), b_table.end());
  REQUIRE(a.size() == 3);
  REQUIRE(b.size() == 3);
  CHECK(a[0] == b[0]);
  CHECK(a[1] == b[1]);
  CHECK(a[2] != b[2]);
  CHECK(t.pool().ref_count(a[0]) == 2);
  t.cancel('A');
  CHECK(t.pool().ref_count(a[0]) == 1);
  CHECK(t.pool().free_blocks() == 5);
  t.cancel('B');
  CHECK(t.pool().free_blocks() == 8);
  CHECK(t.pool().free_cached_blocks() == 2);  // A's prefix stays findable until evicted
}

TEST_CASE("cancellation frees a running request's blocks and drops a waiting one") {
  table_driver t(config(/*max_seqs=*/1), 8);
  t.run({
      {.add = {{.name = 'A', .prompt = 9, .output = 10}, {.name = 'B', .prompt = 3, .output = 1}},
       .expect = "A@0+9* | +A | wait=B | free=5"},
      {.cancel = {'A'}, .expect = "B@0+3* | +B | ~B | free=8"},
  });
  t.run({{.add = {{.name = 'C', .prompt = 3, .output = 1}, {.name = 'D', .prompt = 3, .output = 1}},
          .cancel = {'D'},
          .expect = "C@0+3* | +C | ~C | free=8"}});
  CHECK(t.sched().idle());
}

TEST_CASE("requests that can never run are refused when added") {
  kv_block_pool pool(4);
  auto s = scheduler::create({.block_size = 4, .max_num_batched_tokens = 16, .max_model_len = 32}, pool);
  REQUIRE(s.ok());
  auto& sched = **s;
  CHECK(sched.add({.id = 1, .prompt = {}, .max_tokens = 1}).code() == edge::status_code::invalid_argument);
  CHECK(sched.add({.id = 1, .prompt = tokens(3), .max_tokens = 0}).code() == edge::status_code::invalid_argument);
  // Longer than the context.
  CHECK(sched.add({.id = 1, .prompt = tokens(32), .max_tokens = 1}).code() == edge::status_code::out_of_range);
  // 15 + 2 tokens need 5 blocks of the 4 there are (the watermark is 1% of 4 blocks: 0).
  CHECK(sched.add({.id = 1, .prompt = tokens(15), .max_tokens = 2}).code() == edge::status_code::out_of_range);
  CHECK(sched.add({.id = 1, .prompt = tokens(15), .max_tokens = 1}).ok());
  CHECK(sched.add({.id = 1, .prompt = tokens(3), .max_tokens = 1}).code() == edge::status_code::invalid_argument);
  CHECK(sched.add({.id = 2, .weight = 0.0, .prompt = tokens(3), .max_tokens = 1}).code() ==
        edge::status_code::invalid_argument);
  // A huge max_tokens is capped by the context, not an overflow.
  CHECK(sched.add({.id = 3, .prompt = tokens(3), .max_tokens = std::numeric_limits<std::int64_t>::max()}).code() ==
        edge::status_code::out_of_range);
}

TEST_CASE("inconsistent configurations are refused") {
  kv_block_pool pool(4);
  CHECK(scheduler::create({.block_size = 0}, pool).error().code() == edge::status_code::invalid_argument);
  CHECK(scheduler::create({.block_size = 16, .max_num_seqs = 0}, pool).error().code() == edge::status_code::invalid_argument);
  CHECK(scheduler::create({.block_size = 16, .max_num_batched_tokens = 8}, pool).error().code() ==
        edge::status_code::invalid_argument);
  CHECK(scheduler::create({.block_size = 16, .watermark = 1.0}, pool).error().code() == edge::status_code::invalid_argument);
  kv_block_pool one(1);
  CHECK(scheduler::create({.block_size = 16, .watermark = 0.99}, one).ok());
  CHECK(admission_policy::reserve == parse_admission_policy("reserve"));
  CHECK(!parse_admission_policy("greedy"));
}

TEST_CASE("forks: the prompt but its last token is computed once, then every choice computes that token and samples") {
  table_driver t(config(), 8);
  t.run({
      // 10 prompt tokens: 9 computed for all; blocks for A's 10 tokens (3) and one for each fork.
      {.add = {{.name = 'A', .prompt = 10, .output = 2, .forks = "BC"}}, .expect = "A@0+9 | +A | free=3"},
      // Two full blocks shared, the third (positions 8..9 of A's) copied into each fork's own.
      {.expect = "A@9+1* B@9+1* C@9+1* | A>B,C copy 2>3,2>4 | free=3"},
      {.expect = "A@10+1* B@10+1* C@10+1* | ~A ~B ~C | free=8"},
  });
}

TEST_CASE("forks: blocks shared by reference count are freed only when every choice lets go") {
  table_driver t(config(), 8);
  t.run({
      {.add = {{.name = 'A', .prompt = 9, .output = 1, .forks = "B"}}, .expect = "A@0+8 | +A | free=4"},
      // The prompt's two full blocks are shared; the last prompt token starts a block, nothing to copy.
      {.expect = "A@8+1* B@8+1* | A>B | ~A ~B | free=8"},
  });
  table_driver u(config(), 8);
  u.add({.name = 'A', .prompt = 9, .output = 3, .forks = "B"});
  u.step();
  u.step();
  CHECK(u.pool().ref_count(u.sched().block_table(id_of('A'))[0]) == 2);
  CHECK(u.sched().block_table(id_of('A'))[1] == u.sched().block_table(id_of('B'))[1]);
  u.cancel('A');
  CHECK(u.pool().ref_count(u.sched().block_table(id_of('B'))[0]) == 1);
  CHECK(u.sched().check_invariants().ok());
  u.cancel('B');
  CHECK(u.pool().free_blocks() == 8);
}

TEST_CASE("forks: with the prompt in the prefix cache the choices split off at admission") {
  table_driver t(config(8, 64, admission_policy::optimistic, /*prefix=*/true), 8);
  t.run({
      {.add = {{.name = 'X', .prompt = 9, .output = 1}}, .expect = "X@0+9* | +X | ~X | free=8"},
      // X's two full blocks hold all of A's prompt but the last token.
      {.add = {{.name = 'A', .prompt = 9, .output = 1, .forks = "B"}}, .expect = "A@8+1* B@8+1* | +A | A>B | ~A ~B | free=8"},
  });
}

TEST_CASE("forks: a request's choices need as many max_num_seqs slots, and wait for them together") {
  table_driver t(config(/*max_seqs=*/3), 16);
  t.run({
      {.add = {{.name = 'X', .prompt = 2, .output = 2}, {.name = 'A', .prompt = 3, .output = 1, .forks = "BC"}},
       .expect = "X@0+2* | +X | wait=A | free=15"},
      {.expect = "X@2+1* | ~X | wait=A | free=16"},
      {.expect = "A@0+2 | +A | free=13"},
      {.expect = "A@2+1* B@2+1* C@2+1* | A>B,C copy 0>1,0>2 | ~A ~B ~C | free=16"},
  });
}

TEST_CASE("forks under reserve: each fork's blocks are held from admission, and nothing grows") {
  table_driver t(config(8, 64, admission_policy::reserve), 8);
  t.run({
      // prompt 6 + 3 tokens: 3 blocks for A; the fork shares 1 and holds 2 of its own.
      {.add = {{.name = 'A', .prompt = 6, .output = 3, .forks = "B"}}, .expect = "A@0+5 | +A | free=3"},
      {.expect = "A@5+1* B@5+1* | A>B copy 1>3 | free=3"},
      {.expect = "A@6+1* B@6+1* | free=3"},
      {.expect = "A@7+1* B@7+1* | ~A ~B | free=8"},
  });
}

TEST_CASE("forks: cancelling a request before it forks frees the blocks held for its forks") {
  table_driver t(config(), 8);
  t.run({
      {.add = {{.name = 'A', .prompt = 10, .output = 2, .forks = "BC"}}, .expect = "A@0+9 | +A | free=3"},
      {.cancel = {'A'}, .expect = "free=8"},
  });
}

TEST_CASE("prompt logits: a row for every position but the last, never from the prefix cache, within the step's bound") {
  table_driver t(config(8, 64, admission_policy::optimistic, /*prefix=*/true, 0.0, /*prompt_logits=*/8), 16);
  t.run({
      {.add = {{.name = 'X', .prompt = 14, .output = 1}}, .expect = "X@0+14* | +X | ~X | free=16"},
      // The same prompt: every block is cached, but A needs rows for them, 8 a step.
      {.add = {{.name = 'A', .prompt = 14, .output = 1, .prompt_logits = true}}, .expect = "A@0+8{0+8} | +A | free=12"},
      // The last 6 tokens end the prompt: rows for 5 of them (the 14th is sampled from).
      {.expect = "A@8+6*{0+5} | ~A | free=16"},
  });
}
