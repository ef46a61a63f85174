// Mutation: the GPU program's metrics and tolerances (tests/kernel_cases/kernel_cases.h) reject
// each class of bug a review of the CUDA kernels feared, and accept the rounding the tensor
// cores really do. Each "wrong kernel" is the reference with one thing changed (the next
// group's scale, the neighbouring row's scale, rows g and g + 8 of a 16-row fragment swapped,
// the last 16-wide k step or the last output row of a tile left out; K and V scales swapped,
// the next key's scale, the query's own key left out; for MLA, an FP8 row read with the next
// row's scale, its latents summed with the next row's, its RoPE part scored without it, the last
// position attended left out); the "right kernel" is the reference with x (and INT4's q x scale)
// rounded to bf16, or q, K and the softmax weights rounded to bf16, as on the tensor cores. Every
// case of the list in a tensor-core format up to 2048 x 7168, at its first token count.
#include <doctest/doctest.h>

#include <numeric>
#include <sstream>
#include <string>

#include "edge/common/thread_pool.h"
#include "kernel_test_util.h"
#include "tests/kernel_cases/mla_problems.h"
#include "tests/kernel_cases/problems.h"

namespace {

using namespace edge::kernel_cases;
namespace ek = edge::kernels;

ek::stream cpu() { return edge::testing::cpu_stream(); }
edge::thread_pool& pool() { return edge::testing::kernel_test_pool(); }

}  // namespace

TEST_CASE("mutation: the matmul metric rejects wrong scales, rows and edges and accepts bf16 rounding") {
  std::uint32_t seed = 300;
  int cases = 0;
  double worst_accepted = 0.0, least_rejected = INFINITY;
  for (const matmul_case& c : matmul_cases()) {
    if (c.format != weight_format::bf16 && c.format != weight_format::fp8_e4m3 && c.format != weight_format::int4) continue;
    // Up to Kimi K2's expert gate (2048 x 7168): the larger matrices add nothing to what a
    // scale or an edge does to the metric, and each copy costs a quarter of a gigabyte.
    if (c.n * c.k > 2048 * 7168) continue;
    const std::int64_t tokens = c.tokens.front();
    const host_weights w = make_weights(c, ++seed, cpu());
    const auto x = activations(tokens, c.k, ++seed);
    const auto exact = dense_matmul(x, w.dense, tokens, c.n, c.k, c.k, cpu());
    const auto l2 = products_l2(x, squared(w.dense), tokens, c.n, c.k, c.k, cpu());
    const auto error = [&](const std::vector<float>& y) {
      return worst_matmul_error(y, exact, l2, nullptr, nullptr, tokens, c.n);
    };
    std::ostringstream name;
    name << c.shape << " " << to_string(c.format) << " n " << c.n << " k " << c.k << " group " << w.group_size
         << " tokens " << tokens;
    ++cases;

    // The tensor cores: x rounded to bf16; INT4's q x scale too (the 9+ token GEMM).
    std::vector<float> x_bf16 = x;
    for (auto& v : x_bf16) v = bf16_round(v);
    std::vector<float> w_bf16 = w.dense;
    if (c.format == weight_format::int4) {
      for (auto& v : w_bf16) v = bf16_round(v);
    }
    const double rounding = error(dense_matmul(x_bf16, w_bf16, tokens, c.n, c.k, c.k, cpu()));
    INFO(name.str() << ": bf16 rounding scores " << rounding);
    CHECK(rounding <= matmul_tensor_core_tolerance);
    worst_accepted = std::max(worst_accepted, rounding);

    const auto rejected = [&](const std::string& bug, const std::vector<float>& y) {
      const double e = error(y);
      INFO(name.str() << ": " << bug << " scores " << e << " (tolerance " << matmul_tensor_core_tolerance << ")");
      CHECK(e > matmul_tensor_core_tolerance);
      least_rejected = std::min(least_rejected, e);
    };
    if (c.format == weight_format::int4 && c.k / w.group_size >= 2) {
      // Each group read with the next group's scale (the row's last with the next row's first).
      std::vector<float> next = w.scales;
      for (std::size_t i = 0; i + 1 < next.size(); ++i) next[i] = w.scales[i + 1];
      rejected("the next group's scale", dense_matmul(x, w.dense_with(next, cpu()), tokens, c.n, c.k, c.k, cpu()));
    }
    if (!w.scales.empty() && c.n >= 2) {
      // Each row read with the next row's scales (the last row with its own).
      const std::size_t per_row = w.scales.size() / static_cast<std::size_t>(c.n);
      std::vector<float> neighbour = w.scales;
      for (std::size_t i = 0; i + per_row < neighbour.size(); ++i) neighbour[i] = w.scales[i + per_row];
      rejected("the neighbouring row's scale",
               dense_matmul(x, w.dense_with(neighbour, cpu()), tokens, c.n, c.k, c.k, cpu()));
    }
    if (c.n >= 9) {
      // An accumulator fragment's rows g and g + 8 swapped (c0 c1 against c2 c3).
      std::vector<float> y = exact;
      for (std::int64_t t = 0; t < tokens; ++t) {
        for (std::int64_t r = 0; r + 8 < c.n; ++r) {
          if (r % 16 < 8) std::swap(y[static_cast<std::size_t>(t * c.n + r)], y[static_cast<std::size_t>(t * c.n + r + 8)]);
        }
      }
      rejected("rows g and g + 8 swapped", y);
    }
    if (c.k > 16 && tokens * c.n >= 16) {
      // (With fewer outputs a missed step cannot be told from an unlucky draw of the data: the
      // same path's larger cases see it.)
      // The last 16-wide k step (an mma's k) left out.
      std::vector<float> short_k = w.dense;
      const std::int64_t from = (c.k - 1) / 16 * 16;
      for (std::int64_t r = 0; r < c.n; ++r) {
        for (std::int64_t j = from; j < c.k; ++j) short_k[static_cast<std::size_t>(r * c.k + j)] = 0.0f;
      }
      rejected("the last k step left out", dense_matmul(x, short_k, tokens, c.n, c.k, c.k, cpu()));
    }
    {
      // The last output row of the last tile never written: it keeps what the GPU program
      // filled the output with before a call that does not accumulate, NaN.
      std::vector<float> y = exact;
      for (std::int64_t t = 0; t < tokens; ++t) y[static_cast<std::size_t>(t * c.n + c.n - 1)] = std::nanf("");
      rejected("the last row left out", y);
    }
  }
  MESSAGE("matmul: " << cases << " cases; bf16 rounding scored at most " << worst_accepted << ", the bugs at least "
                     << least_rejected << ", tolerance " << matmul_tensor_core_tolerance);
}

TEST_CASE("mutation: the attention metric rejects wrong K / V scales and a missed key and accepts bf16 rounding") {
  std::uint32_t seed = 400;
  int cases = 0;
  double worst_accepted = 0.0, least_rejected = INFINITY;
  for (const attention_case& c : attention_cases()) {
    // The cases the tensor cores take (prefill chunks), at the quick set's sizes.
    if (!c.quick || !ek::cuda_attention_uses_tensor_cores(c.kv, c.head_dim, c.group, true, c.chunk)) continue;
    const attention_problem p = make_attention_problem(c, ++seed, cpu());
    const attention_reference exact = reference_attention(p, false, attention_flaw::none, &pool());
    const auto score = [&](const attention_reference& r) {
      std::vector<float> out(r.out.begin(), r.out.end());
      return worst_attention_error(out, exact, p);
    };
    std::ostringstream name;
    name << c.shape << " " << to_string(c.kv) << " head_dim " << c.head_dim << " gqa " << c.group << ":1 block "
         << c.block_size;
    ++cases;
    const double rounding = score(reference_attention(p, true, attention_flaw::none, &pool()));
    INFO(name.str() << ": bf16 rounding scores " << rounding);
    CHECK(rounding <= attention_tensor_core_tolerance);
    worst_accepted = std::max(worst_accepted, rounding);
    std::vector<std::pair<const char*, attention_flaw>> flaws = {{"the query's own key left out", attention_flaw::last_key_missed}};
    if (p.scaled()) {
      flaws.push_back({"K and V scales swapped", attention_flaw::kv_scales_swapped});
      flaws.push_back({"the next key's scale", attention_flaw::neighbour_key_scale});
    }
    for (const auto& [bug, flaw] : flaws) {
      const double e = score(reference_attention(p, false, flaw, &pool()));
      INFO(name.str() << ": " << std::string(bug) << " scores " << e << " (tolerance " << attention_tensor_core_tolerance << ")");
      CHECK(e > attention_tensor_core_tolerance);
      least_rejected = std::min(least_rejected, e);
    }
  }
  CHECK(cases > 0);
  MESSAGE("attention: " << cases << " cases; bf16 rounding scored at most " << worst_accepted << ", the bugs at least "
                        << least_rejected << ", tolerance " << attention_tensor_core_tolerance);
}

TEST_CASE("mutation: the MLA attention metric rejects wrong latent scales and a missed key and accepts bf16 rounding") {
  std::uint32_t seed = 500;
  int cases = 0;
  double worst_accepted = 0.0, least_rejected = INFINITY;
  for (const mla_case& c : mla_attention_cases()) {
    // The cases the tensor cores take (a bf16 or FP8 cache at DeepSeek-V3's row); the bugs at the
    // quick set's sizes, the rounding at every size (the long cases' decode tokens and their
    // prefill run's first and last); of more than 16 heads, those of a few bands.
    if (!ek::cuda_mla_uses_tensor_cores(c.kv, c.latent, c.rope)) continue;
    const mla_problem whole = make_mla_problem(c, ++seed, cpu());
    const mla_problem p = whole.only(checked_tokens(whole.batch, c.chunk, !c.quick));
    std::vector<std::int64_t> tokens(static_cast<std::size_t>(p.tokens)), heads;
    std::iota(tokens.begin(), tokens.end(), 0);
    for (std::int64_t h = 0; h < c.heads; ++h) {
      if (c.heads <= 16 || h < 2 || h == 8 || h == 9 || h == c.heads / 2 || h == c.heads - 1) heads.push_back(h);
    }
    for (const bool select : {false, true}) {
      const mla_reference exact = reference_mla(p, select, tokens, heads, false, mla_flaw::none, &pool());
      const auto score = [&](const mla_reference& r) {
        double worst = 0.0;
        const std::size_t per_token = heads.size() * static_cast<std::size_t>(c.latent);
        for (std::size_t i = 0; i < r.out.size(); ++i) {
          worst = std::max(worst, mla_error(r.out[i], exact.out[i], exact.c_max[i / per_token]));
        }
        return worst;
      };
      std::ostringstream name;
      name << c.shape << " " << to_string(c.kv) << " heads " << c.heads << " block " << c.block_size << " contexts up to "
           << *std::max_element(c.contexts.begin(), c.contexts.end()) << (select ? ", selection" : "");
      ++cases;
      const double rounding = score(reference_mla(p, select, tokens, heads, true, mla_flaw::none, &pool()));
      INFO(name.str() << ": bf16 rounding scores " << rounding);
      CHECK(rounding <= mla_tensor_core_tolerance);
      worst_accepted = std::max(worst_accepted, rounding);
      if (!c.quick) continue;
      std::vector<std::pair<const char*, mla_flaw>> flaws = {{"the last position attended left out", mla_flaw::own_key_missed}};
      if (p.cache.scaled()) {
        flaws.push_back({"the next row's scale", mla_flaw::neighbour_row_scale});
        flaws.push_back({"the latents summed with the next row's scale", mla_flaw::value_neighbour_scale});
        flaws.push_back({"the RoPE part scored without the row's scale", mla_flaw::rope_unscaled});
      }
      for (const auto& [bug, flaw] : flaws) {
        const double e = score(reference_mla(p, select, tokens, heads, false, flaw, &pool()));
        INFO(name.str() << ": " << std::string(bug) << " scores " << e << " (tolerance " << mla_tensor_core_tolerance << ")");
        CHECK(e > mla_tensor_core_tolerance);
        least_rejected = std::min(least_rejected, e);
      }
    }
  }
  CHECK(cases > 0);
  MESSAGE("MLA attention: " << cases << " cases; bf16 rounding scored at most " << worst_accepted
                            << ", the bugs at least " << least_rejected << ", tolerance " << mla_tensor_core_tolerance);
}
