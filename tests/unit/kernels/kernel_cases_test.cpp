// The case list (tests/kernel_cases/kernel_cases.h): every CUDA kernel has cases, and the CPU
// references the GPU program compares against are right on every case, checked against plain
// references written from each op's header: double-precision sums held to the GPU program's own
// metrics and tolerances, or the exact bytes where the op is exact. The inputs are the GPU
// program's (tests/kernel_cases/*.h build them for both). Where the double sums of a long case
// would take long, a test checks a sample of its tokens, rows or heads, and says which.
#include <doctest/doctest.h>

#include <cctype>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <string>

#include "edge/common/thread_pool.h"
#include "kernel_test_util.h"
#include "kernels/cpu/isa.h"
#include "tests/kernel_cases/mla_problems.h"
#include "tests/kernel_cases/moe_problems.h"
#include "tests/kernel_cases/problems.h"
#include "tests/kernel_cases/sampling_problems.h"
#include "tests/kernel_cases/small_ops.h"

namespace {

using namespace edge::kernel_cases;
namespace ek = edge::kernels;

ek::stream cpu() { return edge::testing::cpu_stream(); }
edge::thread_pool& pool() { return edge::testing::kernel_test_pool(); }

// Whether two float arrays hold the same bits (the exact ops; NaN where NaN).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("case list: every CUDA kernel has cases") {
  std::ifstream in(std::string(EDGE_SOURCE_DIR) + "/kernels/cuda/launchers.h");
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  const std::string launchers = text.str();
  // Every "status run_NAME(" of the file.
  std::set<std::string> launched;
  const std::string entry = "status run_";
  for (std::size_t at = launchers.find(entry); at != std::string::npos; at = launchers.find(entry, at + 1)) {
    std::size_t end = at + entry.size();
    while (end < launchers.size() && (std::islower(static_cast<unsigned char>(launchers[end])) != 0 ||
                                      std::isdigit(static_cast<unsigned char>(launchers[end])) != 0 ||
                                      launchers[end] == '_')) {
      ++end;
    }
    if (end < launchers.size() && launchers[end] == '(') {
      launched.insert(launchers.substr(at + entry.size(), end - at - entry.size()));
    }
  }
  CHECK(launched.size() >= 15);
  for (const std::string& name : launched) {
    INFO("kernels/cuda/launchers.h launches run_" << name << ": give it cases in tests/kernel_cases/kernel_cases.h");
    CHECK(std::find(kernel_names.begin(), kernel_names.end(), name) != kernel_names.end());
    CHECK(case_count(name) > 0);
  }
  for (const auto name : kernel_names) {
    INFO(name);
    CHECK(launched.count(std::string(name)) == 1);
    CHECK(case_count(name) > 0);
  }
  // The real shapes are there.
  std::set<std::string> models;
  for (const auto& c : matmul_cases()) models.insert(c.shape.substr(0, c.shape.find(' ')));
  for (const char* model : {"llama-3-8b", "qwen3-30b-a3b", "kimi-k2", "glm-5"}) {
    INFO(model);
    CHECK(models.count(model) == 1);
  }
}

TEST_CASE("case list: the CPU matmul reference on every case") {
  std::uint32_t seed = 100;
  for (const matmul_case& c : matmul_cases()) {
    const host_weights w = make_weights(c, ++seed, cpu());
    const auto bias = scaled_floats(static_cast<std::size_t>(c.n), ++seed, 1, 1.0f);
    for (const std::int64_t tokens : c.tokens) {
      const bool with_bias = tokens % 2 == 1;
      const auto x = activations(tokens, c.k, ++seed);
      std::vector<float> y(static_cast<std::size_t>(tokens * c.n));
      REQUIRE(ek::run_matmul({.x = x.data(), .w = w.view(), .bias = with_bias ? bias.data() : nullptr, .y = y.data(),
                              .tokens = tokens, .n = c.n, .k = c.k, .x_stride = c.k, .y_stride = c.n,
                              .exact_activations = true},
                             cpu())
                  .ok());
      // Large cases: the first and the last token (the sums in double take a while).
      const bool every_token = tokens * c.n * c.k <= (std::int64_t{1} << 24);
      double worst = 0.0;
      for (std::int64_t t = 0; t < tokens; ++t) {
        if (!every_token && t != 0 && t != tokens - 1) continue;
        const auto exact = exact_matmul(x.data() + t * c.k, w, with_bias ? bias.data() : nullptr, 1, c.k);
        for (std::int64_t r = 0; r < c.n; ++r) {
          const auto at = static_cast<std::size_t>(r);
          worst = std::max(worst, matmul_error(y[static_cast<std::size_t>(t * c.n + r)], exact.y[at], exact.l2[at],
                                               with_bias ? std::fabs(bias[at]) : 0.0));
        }
      }
      INFO(c.shape << " " << to_string(c.format) << " n " << c.n << " k " << c.k << " tokens " << tokens << ": error "
                   << worst);
      CHECK(worst <= matmul_f32_tolerance);
    }
  }
}

TEST_CASE("case list: the CPU paged attention reference on every case") {
  std::uint32_t seed = 200;
  for (const attention_case& c : attention_cases()) {
    const attention_problem p = make_attention_problem(c, ++seed, cpu());
    std::vector<float> out(static_cast<std::size_t>(p.tokens * p.heads * c.head_dim));
    REQUIRE(ek::run_paged_attention(p.params(out.data()), cpu()).ok());
    const double error = worst_attention_error(out, reference_attention(p, false, attention_flaw::none, &pool()), p);
    INFO(c.shape << " " << to_string(c.kv) << " head_dim " << c.head_dim << " gqa " << c.group << ":1 block "
                 << c.block_size << ": error " << error);
    CHECK(error <= attention_f32_tolerance);
  }
}

TEST_CASE("case list: the CPU embedding reference on every case") {
  std::uint32_t seed = 500;
  for (const embedding_case& c : embedding_cases()) {
    const embedding_problem p = make_embedding_problem(c, ++seed);
    std::vector<float> out(static_cast<std::size_t>(c.tokens * c.hidden), std::nanf(""));
    REQUIRE(ek::run_embedding({.ids = p.ids.data(), .table = p.table.data(), .table_type = c.table, .out = out.data(),
                               .tokens = c.tokens, .vocab = c.vocab, .hidden = c.hidden},
                              cpu())
                .ok());
    INFO(to_string(c.table) << " hidden " << c.hidden);
    CHECK(same_bits(out, reference_embedding(p)));
  }
}

TEST_CASE("case list: the CPU rmsnorm reference on every case") {
  std::uint32_t seed = 600;
  const auto itself = [](std::int64_t r) { return r; };
  for (const rows_case& c : rmsnorm_cases()) {
    const rmsnorm_problem p = make_rmsnorm_problem(c, seed += 4);
    INFO("rows " << c.rows << " cols " << c.cols);
    for (const bool residual : {false, true}) {
      std::vector<float> x = p.x;
      std::vector<float> out(x.size(), std::nanf(""));
      REQUIRE(ek::run_rmsnorm({.x = x.data(), .residual = residual ? p.residual.data() : nullptr,
                               .weight = p.weight.data(), .out = out.data(), .rows = c.rows, .cols = c.cols,
                               .x_stride = c.cols, .out_stride = c.cols, .eps = 1e-5f},
                              cpu())
                  .ok());
      // The residual add is the float sum x + residual, written back to x.
      std::vector<float> summed = p.x;
      if (residual) {
        for (std::size_t i = 0; i < summed.size(); ++i) summed[i] += p.residual[i];
      }
      CHECK(same_bits(x, summed));
      const double error =
          worst_rms_error(out, c.cols, summed.data(), c.cols, p.weight.data(), c.rows, c.cols, 1e-5, itself);
      INFO("residual " << residual << ": error " << error);
      CHECK(error <= rmsnorm_tolerance);
    }
    if (p.per_head()) {
      std::vector<float> heads = p.heads;
      REQUIRE(ek::run_rmsnorm({.x = heads.data(), .weight = p.head_weight.data(), .out = heads.data(), .rows = c.rows,
                               .cols = rmsnorm_head, .groups = c.cols / rmsnorm_head, .x_stride = c.cols,
                               .out_stride = c.cols, .eps = 1e-6f},
                              cpu())
                  .ok());
      // Every head of 64 a vector of its own: rows · groups vectors, one after the other.
      const double error = worst_rms_error(heads, rmsnorm_head, p.heads.data(), rmsnorm_head, p.head_weight.data(),
                                           c.rows * c.cols / rmsnorm_head, rmsnorm_head, 1e-6, itself);
      INFO("per head: error " << error);
      CHECK(error <= rmsnorm_tolerance);
    }
    const auto n = static_cast<std::int64_t>(p.gather.size());
    std::vector<float> x = p.x;
    std::vector<float> out(static_cast<std::size_t>(n * c.cols), std::nanf(""));
    REQUIRE(ek::run_rmsnorm({.x = x.data(), .row_index = p.gather.data(), .weight = p.weight.data(), .out = out.data(),
                             .rows = n, .cols = c.cols, .x_stride = c.cols, .out_stride = c.cols, .eps = 1e-5f},
                            cpu())
                .ok());
    CHECK(same_bits(x, p.x));  // a gather only reads x
    const double error = worst_rms_error(out, c.cols, p.x.data(), c.cols, p.weight.data(), n, c.cols, 1e-5,
                                         [&](std::int64_t r) { return p.gather[static_cast<std::size_t>(r)]; });
    INFO("gather: error " << error);
    CHECK(error <= rmsnorm_tolerance);
  }
}

TEST_CASE("case list: the CPU rope reference on every case") {
  std::uint32_t seed = 700;
  for (const rope_case& c : rope_cases()) {
    const rope_problem p = make_rope_problem(c, ++seed);
    std::vector<float> x = p.x;
    REQUIRE(ek::run_rope(p.params(x.data(), p.positions.data(), p.inv_freq.data()), cpu()).ok());
    const auto want = reference_rope(p);
    double error = 0.0;
    std::size_t untouched_changed = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      error = std::max(error, std::fabs(x[i] - want[i]));
      // The gap after each token's heads and the unrotated tail of a head keep their bits.
      if (want[i] == static_cast<double>(p.x[i]) && x[i] != p.x[i]) ++untouched_changed;
    }
    INFO("head_dim " << c.head_dim << " rotary " << c.rotary_dim << " heads " << c.heads << " pairs "
                     << std::string(c.pairs == ek::rope_pairs::adjacent ? "adjacent" : "half_split") << ": error " << error);
    CHECK(error <= rope_tolerance);
    CHECK(untouched_changed == 0);
  }
}

TEST_CASE("case list: the CPU silu_mul reference on every case") {
  std::uint32_t seed = 800;
  for (const rows_case& c : silu_mul_cases()) {
    const silu_mul_problem p = make_silu_mul_problem(c, seed += 2);
    std::vector<float> out(p.gate.size(), std::nanf(""));
    REQUIRE(ek::run_silu_mul({.gate = p.gate.data(), .up = p.up.data(), .out = out.data(), .rows = c.rows,
                              .cols = c.cols, .in_stride = c.cols, .out_stride = c.cols},
                             cpu())
                .ok());
    const auto want = reference_silu_mul(p);
    double error = 0.0;
    for (std::size_t i = 0; i < out.size(); ++i) error = std::max(error, std::fabs(out[i] - want[i]));
    INFO("rows " << c.rows << " cols " << c.cols << ": error " << error);
    CHECK(error <= silu_mul_tolerance);
  }
}

TEST_CASE("case list: the CPU quantize reference on every case") {
  std::uint32_t seed = 900;
  for (const quantize_case& c : quantize_cases()) {
    const quantize_problem p = make_quantize_problem(c, ++seed);
    std::vector<std::uint8_t> values(p.values_bytes(), 0xAB);
    std::vector<float> scales(p.scale_count(), std::nanf(""));
    REQUIRE(ek::run_quantize({.x = p.x.data(), .rows = c.n, .k = c.k, .x_stride = c.k, .format = c.format,
                              .group_size = p.group, .values = values.data(), .scales = scales.data()},
                             cpu())
                .ok());
    const quantized_bytes want = reference_quantize(p);
    INFO(to_string(c.format) << " [" << c.n << ", " << c.k << "] group " << p.group);
    CHECK(values == want.values);
    CHECK(same_bits(scales, want.scales));
  }
}

TEST_CASE("case list: the CPU dequantize reference on every case") {
  std::uint32_t seed = 900;
  for (const quantize_case& c : quantize_cases()) {
    const quantize_problem p = make_quantize_problem(c, ++seed);
    const quantized_bytes q = reference_quantize(p);
    std::vector<float> dense(p.x.size(), std::nanf(""));
    const ek::weight_view view{.format = c.format, .values = q.values.data(), .scales = q.scales.data(),
                               .group_size = p.group};
    REQUIRE(ek::run_dequantize({.w = view, .k = c.k, .row_begin = 0, .rows = c.n, .y = dense.data(), .y_stride = c.k},
                               cpu())
                .ok());
    const auto want = reference_dequantize(p, q);
    INFO(to_string(c.format) << " [" << c.n << ", " << c.k << "] group " << p.group);
    CHECK(same_bits(dense, want));
    // And the round trip lands within half a step of every weight: INT4's step is its group's
    // scale; E4M3's is 2^-3 of the value (2^-9 of the row's scale below the normal range).
    double worst = 0.0;
    for (std::int64_t i = 0; i < c.n * c.k; ++i) {
      const auto at = static_cast<std::size_t>(i);
      const bool int4 = c.format == ek::weight_format::int4;
      const float scale = q.scales[static_cast<std::size_t>(int4 ? i / p.group : i / c.k)];
      const double step = int4 ? scale : std::max(std::fabs(p.x[at]) * 0x1p-3, scale * 0x1p-9);
      worst = std::max(worst, std::fabs(want[at] - p.x[at]) / step);
    }
    INFO("round trip: " << worst << " of a step");
    CHECK(worst <= 0.5 + 1e-6);
  }
}

TEST_CASE("case list: the CPU kv_cache_write reference on every case") {
  std::uint32_t seed = 1000;
  for (const kv_write_case& c : kv_cache_write_cases()) {
    const kv_write_problem p = make_kv_write_problem(c, ++seed);
    std::vector<std::uint8_t> kc(p.cache_bytes(), 0), vc(p.cache_bytes(), 0);
    std::vector<float> ks(p.scale_count(), 0.0f), vs(p.scale_count(), 0.0f);
    REQUIRE(ek::run_kv_cache_write(p.params(p.qkv.data(), p.slots.data(), kc.data(), vc.data(), ks.data(), vs.data()),
                                   cpu())
                .ok());
    const kv_cache_bytes want = reference_kv_cache_write(p);
    INFO(to_string(c.kv) << " head_dim " << c.head_dim << " kv heads " << c.kv_heads << " block " << c.block_size
                         << std::string(c.values ? "" : ", K rows only"));
    CHECK(kc == want.k);
    CHECK(vc == want.v);
    CHECK(same_bits(ks, want.k_scales));
    CHECK(same_bits(vs, want.v_scales));
  }
}

TEST_CASE("case list: the CPU kv_block_copy reference on every case") {
  std::uint32_t seed = 1100;
  for (const std::size_t block_bytes : kv_block_copy_cases()) {
    const block_copy_problem p = make_block_copy_problem(block_bytes, ++seed);
    std::vector<std::uint8_t> bytes = p.bytes;
    REQUIRE(ek::run_kv_block_copy(p.params(bytes.data()), cpu()).ok());
    INFO("blocks of " << block_bytes << " bytes");
    CHECK(bytes == reference_block_copy(p));
  }
}

TEST_CASE("case list: the CPU sampling reference on every case") {
  std::uint32_t seed = 1200;
  for (const sampling_case& c : sampling_cases()) {
    const sampling_problem p = make_sampling_problem(c, ++seed);
    std::vector<float> scratch = p.logits;
    std::vector<std::int32_t> out(static_cast<std::size_t>(c.rows), -1);
    REQUIRE(ek::run_sampling(p.params(scratch.data(), p.config.data(), out.data(), p.biases.data(), p.masks.data()), cpu())
                .ok());
    int greedy = 0, seeded = 0, near = 0;
    std::vector<float> effective;
    for (std::int64_t i = 0; i < c.rows; ++i) {
      const auto at = static_cast<std::size_t>(i);
      const ek::sampling_row& row = p.config[at];
      p.effective_row(i, effective);
      const sampling_reference want = reference_sample(effective, row);
      INFO("vocab " << c.vocab << std::string(c.masked ? " masked" : "") << " row " << i << ": drew " << out[at]
                    << ", the reference " << want.token
                    << std::string(want.near_boundary ? " (a boundary of the kept set near)" : ""));
      // Kept tokens only, and the one the uniform number lands on (a neighbour where it lands
      // within rounding of their boundary); greedy rows exactly the argmax.
      CHECK(want.keeps(effective, out[at]));
      CHECK(want.allows(effective, out[at]));
      if (row.temperature <= 0.0f) {
        ++greedy;
        CHECK(out[at] == want.token);
      } else {
        ++seeded;
        near += want.near_boundary ? 1 : 0;
      }
      if (p.banned[at] >= 0) CHECK(out[at] != p.banned[at]);
      if (p.forced[at] >= 0) CHECK(out[at] == p.forced[at]);
    }
    // Both kinds of row, and boundaries of the kept set too rare to hide a wrong draw (at 10^5
    // tokens, top_k's lies within float rounding in one row of twenty or so).
    CHECK(greedy > 0);
    CHECK(seeded > 0);
    CHECK(near <= seeded / 8);
  }
}

TEST_CASE("case list: the CPU moe_routing reference on every case") {
  std::uint32_t seed = 1300;
  for (const routing_case& c : moe_routing_cases()) {
    for (const std::int64_t tokens : c.tokens) {
      const routing_problem p = make_routing_problem(c, tokens, seed += 2);
      const auto pairs = static_cast<std::size_t>(tokens * c.top_k);
      std::vector<std::int32_t> experts(pairs, -1);
      std::vector<float> weights(pairs, std::nanf(""));
      REQUIRE(ek::run_moe_routing(p.params(p.logits.data(), p.bias.data(), experts.data(), weights.data()), cpu()).ok());
      const routing_reference want = reference_routing(p);
      int differing = 0, unexplained = 0, near = 0;
      double worst = 0.0;
      for (std::int64_t t = 0; t < tokens; ++t) {
        const auto at = static_cast<std::ptrdiff_t>(t * c.top_k);
        near += want.near_tie[static_cast<std::size_t>(t)] ? 1 : 0;
        if (!std::equal(experts.begin() + at, experts.begin() + at + c.top_k, want.experts.begin() + at)) {
          ++differing;
          if (!want.near_tie[static_cast<std::size_t>(t)]) ++unexplained;
          continue;
        }
        for (std::int64_t i = 0; i < c.top_k; ++i) {
          const auto j = static_cast<std::size_t>(at + i);
          const double d = std::fabs(weights[j] - want.weights[j]) / std::max(std::fabs(want.weights[j]), 1e-30);
          worst = std::max(worst, std::isnan(d) ? INFINITY : d);
        }
      }
      INFO(c.shape << " experts " << c.experts << " top " << c.top_k << " groups " << c.groups << " tokens " << tokens
                   << ": " << differing << " rows differ (" << near << " near a tie), weights within " << worst);
      CHECK(unexplained == 0);
      CHECK(worst <= routing_weight_tolerance);
      // Near ties too rare to hide a wrong choice.
      CHECK(near <= std::max<std::int64_t>(1, tokens / 8));
    }
  }
}

TEST_CASE("case list: the CPU moe_experts reference on every case") {
  std::uint32_t seed = 1400;
  for (const experts_case& c : moe_experts_cases()) {
    const experts_problem set = make_experts_problem(c, seed += 100);
    const bool int8_activations = c.format == ek::weight_format::int4 && set.group >= 32 && ek::cpu::quantized_activations();
    const double tolerance = int8_activations ? experts_int8_tolerance : experts_f32_tolerance;
    // One seed for every batch of the case: with the same strides, a smaller batch is the start
    // of a larger one, so a token's reference serves each batch that holds it (and the CPU's
    // result, which the batch must not change, is held to it in each).
    const std::uint32_t batch_seed = ++seed;
    std::map<std::pair<std::int64_t, std::int64_t>, experts_reference> exact;  // by (token, x_stride)
    const std::int64_t most = *std::max_element(c.tokens.begin(), c.tokens.end());
    for (const std::int64_t tokens : c.tokens) {
      const std::int64_t x_stride = tokens == 7 ? c.hidden + 5 : c.hidden;
      const std::int64_t out_stride = tokens == 7 ? c.hidden + 3 : c.hidden;
      const experts_batch b = make_experts_batch(set, tokens, x_stride, out_stride, batch_seed);
      // The real widths: the first token and the largest batch's last (the double sums of a Kimi K2
      // expert take a while); every token elsewhere.
      std::vector<std::int64_t> checked;
      for (std::int64_t t = 0; t < tokens; ++t) {
        if (c.quick || t == 0 || t == most - 1) checked.push_back(t);
      }
      for (const std::int64_t t : checked) {
        if (exact.count({t, x_stride}) == 0) exact[{t, x_stride}] = reference_experts_token(set, b, t, &pool());
      }
      std::vector<std::int32_t> counts(static_cast<std::size_t>(c.experts), 0);
      for (const std::int32_t e : b.experts) ++counts[static_cast<std::size_t>(e)];
      const std::int64_t workspace_floats = ek::moe_experts_workspace_floats(tokens, c.top_k, c.experts, c.hidden, c.inter);
      std::vector<float> workspace(static_cast<std::size_t>(workspace_floats));
      for (const bool stacked : {true, false}) {
        const auto views = set.views(stacked);
        std::vector<float> out = b.out0;
        std::vector<std::int32_t> expert_tokens(counts.size(), -1);
        REQUIRE(ek::run_moe_experts({.x = b.x.data(), .experts = b.experts.data(), .weights = b.weights.data(),
                                     .matrices = views.data(), .out = out.data(), .expert_tokens = expert_tokens.data(),
                                     .tokens = tokens, .top_k = c.top_k, .num_experts = c.experts, .hidden = c.hidden,
                                     .intermediate = c.inter, .x_stride = x_stride, .out_stride = out_stride,
                                     .workspace = workspace.data(), .workspace_floats = workspace_floats},
                                    cpu())
                    .ok());
        double worst = 0.0;
        for (const std::int64_t t : checked) worst = std::max(worst, worst_experts_error(out, b, exact[{t, x_stride}], t));
        INFO(c.shape << " " << to_string(c.format) << " group " << set.group << " hidden " << c.hidden << " inter "
                     << c.inter << " top " << c.top_k << " of " << c.experts << " tokens " << tokens
                     << std::string(stacked ? " stacked" : " apart") << ": error " << worst);
        CHECK(worst <= tolerance);
        CHECK(expert_tokens == counts);
      }
    }
  }
}

TEST_CASE("case list: the CPU mla_attention reference on every case") {
  std::uint32_t seed = 1500;
  for (const mla_case& c : mla_attention_cases()) {
    const mla_problem whole = make_mla_problem(c, seed += 5, cpu());
    // The double sums of every head at every token take a while: the long cases' decode tokens
    // and their prefill run's first and last; of more than 16 heads, the first two of the first
    // two bands of 8 (the CPU kernel's), one in the middle and the last.
    const std::vector<std::int64_t> tokens = checked_tokens(whole.batch, c.chunk, !c.quick);
    std::vector<std::int64_t> heads;
    for (std::int64_t h = 0; h < c.heads; ++h) {
      if (c.heads <= 16 || h < 2 || h == 8 || h == 9 || h == c.heads / 2 || h == c.heads - 1) heads.push_back(h);
    }
    const mla_problem p = whole.only(tokens);
    std::vector<std::int64_t> all(tokens.size());
    std::iota(all.begin(), all.end(), 0);
    for (const bool select : {false, true}) {
      std::vector<float> out(p.q_latent.size(), std::nanf(""));
      REQUIRE(ek::run_mla_attention(p.params(out.data(), select), cpu()).ok());
      const mla_reference want = reference_mla(p, select, all, heads, false, mla_flaw::none, &pool());
      const double error = worst_mla_error(out, p, want, [](std::size_t i) { return static_cast<std::int64_t>(i); });
      INFO(c.shape << " " << to_string(c.kv) << " heads " << c.heads << " latent " << c.latent << " rope " << c.rope
                   << " block " << c.block_size << std::string(select ? ", selection" : "") << ": error " << error);
      CHECK(error <= mla_f32_tolerance);
    }
  }
}

TEST_CASE("case list: the CPU dsa_select reference on every case") {
  std::uint32_t seed = 1600;
  for (const dsa_case& c : dsa_select_cases()) {
    const dsa_problem whole = make_dsa_problem(c, seed += 5, cpu());
    // The long cases: the decode tokens up to 4096 positions and the prefill run's first and
    // last (the double scores of the 9000-position token at 64 heads take a while; its choice
    // is the same code as the 2100-position one's, over more scores).
    std::vector<std::int64_t> tokens;
    for (const std::int64_t t : checked_tokens(whole.batch, c.chunk, !c.quick)) {
      if (c.quick || whole.batch.pos[static_cast<std::size_t>(t)] < 4096) tokens.push_back(t);
    }
    const dsa_problem p = whole.only(tokens);
    std::vector<std::int32_t> selected(static_cast<std::size_t>(p.tokens * c.top_k), -1);
    std::vector<std::int32_t> counts(static_cast<std::size_t>(p.tokens), -1);
    REQUIRE(ek::run_dsa_select(p.params(selected.data(), counts.data()), cpu()).ok());
    std::vector<dsa_scores> scores(static_cast<std::size_t>(p.tokens));
    pool().parallel_for(0, static_cast<std::size_t>(p.tokens), 1, [&](std::size_t begin, std::size_t end) {
      for (std::size_t t = begin; t < end; ++t) {
        if (p.batch.pos[t] + 1 > c.top_k) scores[t] = reference_dsa_scores(p, static_cast<std::int64_t>(t));
      }
    });
    int chosen = 0;
    for (std::int64_t t = 0; t < p.tokens; ++t) {
      const auto at = static_cast<std::size_t>(t);
      INFO(c.shape << " " << to_string(c.kv) << " " << c.heads << " heads of " << c.head_dim << " top " << c.top_k
                   << " block " << c.block_size << ": the token at position " << p.batch.pos[at]);
      // Every position (count 0) up to top_k; past it the top_k best, ascending: the exact choice,
      // or where the top_k-th and the next lie within rounding, one that swaps only such ties.
      if (p.batch.pos[at] + 1 <= c.top_k) {
        CHECK(counts[at] == 0);
        continue;
      }
      ++chosen;
      REQUIRE(counts[at] == c.top_k);
      const std::vector<std::int32_t> got(selected.begin() + t * c.top_k, selected.begin() + (t + 1) * c.top_k);
      const dsa_choice want = reference_dsa_choice(scores[at], c.top_k);
      CHECK(dsa_choice_within_rounding(scores[at], c.top_k, got));
      if (!want.near_tie) CHECK(got == want.selected);
    }
    CHECK(chosen > 0);
  }
}
