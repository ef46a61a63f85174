// Every CUDA kernel against its CPU reference, over the cases of tests/kernel_cases/kernel_cases.h
// (awkward shapes: sizes 1, 54, 97, k = 288 / 96 for INT4 groups of 32 that end half-way through
// a tensor-core tile, KV block sizes 1, 8 and 16, head_dim 64, 128 and 256, GQA up to 16:1; and
// the real shapes of Llama 3 8B, Qwen3-30B-A3B, Kimi K2 and GLM-5), with the inputs the CPU suite
// checks the CPU references on (tests/kernel_cases/*.h build them for both); packed and strided
// activations; every weight format and KV dtype; magnitudes that differ per row, group, head and
// token, so that a wrong scale shows; weight scales followed by a NaN, so that a read past them
// shows, and outputs that start as NaN, so that one never written shows. Each line prints the
// largest error and the tolerance it is held to:
//   * exact (tolerance 0): embedding, quantize / dequantize, kv_cache_write (the same encoders
//     and IEEE division on both sides), kv_block_copy, greedy sampling (logit biases included);
//   * float rounding and summation order: rmsnorm, rope, silu_mul (absolute, for the value
//     ranges stated on each line);
//   * matmul (kernel_cases::matmul_error): |y - y_ref| over the L2 norm of the output's products,
//     2^-13 with f32 products, 2^-4 on bf16 tensor cores (cuda_matmul_uses_tensor_cores: x, and
//     in the wmma GEMM INT4's q x scale, rounded to bf16); the CPU reference with exact
//     activations;
//   * paged attention (kernel_cases::attention_error): |o - o_ref| over the largest |v| the query
//     attends, 2^-13 in f32, 2^-6 on tensor cores (q, K and the softmax weights in bf16);
//   * MLA attention (kernel_cases::mla_error): likewise over the largest |c| among the latents
//     the token attends, 2^-13 in f32, 2^-6 on tensor cores (cuda_mla_uses_tensor_cores: the
//     queries and the softmax weights times an FP8 row's scale in bf16);
//     tests/unit/kernels/kernel_mutation_test.cpp shows these metrics reject a wrong group, row,
//     K / V, latent or neighbour's scale and a missed key or tile edge, and accept the emulated
//     bf16 rounding;
//   * seeded sampling: the GPU's token is the CPU's, or the draw lies within float rounding of
//     the boundary between the two (rows with logit biases too; a banned token never drawn); with
//     a grammar's token mask (three tokens, or nine in ten), no token outside it on either
//     device, and the same rule;
//   * MoE routing: the same experts in the same order, except in rows with a near tie (within
//     1e-5, in double) among the best choice values or group scores, which expf's rounding may
//     break either way; where the experts agree, weights within 2e-6 relative;
//   * MoE experts (kernel_cases::experts_error): |out - out_ref| over the spread of the rounding
//     of every product feeding it (gate, up and down, in double), 2^-13: f32 products in another
//     order; 2^-4 where the grouped GEMM runs on tensor cores (9+ tokens of bf16, fp8 or int4
//     weights); against the double reference where the CPU's integer dot products round INT4's
//     activations to int8; tokens per expert exact, a graph replay bit-identical to the eager
//     call;
//   * DSA selection: the same positions, except for tokens whose top_k-th and next best scores
//     (in double) lie within 1e-5 of their magnitudes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "edge/common/format.h"
#include "edge/common/thread_pool.h"
#include "edge/kernels/numerics.h"
#include "gpu_test_support.h"
#include "kernels/cpu/isa.h"
#include "kernels/embedding/embedding.h"
#include "kernels/kv_cache_write/kv_cache_write.h"
#include "kernels/matmul/matmul.h"
#include "kernels/mla_attention/mla_attention.h"
#include "kernels/moe_experts/moe_experts.h"
#include "kernels/moe_routing/moe_routing.h"
#include "kernels/paged_attention/paged_attention.h"
#include "kernels/quantize/quantize.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/sampling/sampling.h"
#include "kernels/silu_mul/silu_mul.h"
#include "tests/kernel_cases/mla_problems.h"
#include "tests/kernel_cases/moe_problems.h"
#include "tests/kernel_cases/problems.h"
#include "tests/kernel_cases/sampling_problems.h"
#include "tests/kernel_cases/small_ops.h"

namespace {

using namespace edge;
using namespace edge::kernels;
using gpu_test::device_array;
using gpu_test::random_floats;
using kernel_cases::encode;
using kernel_cases::host_weights;

thread_pool* pool_ptr = nullptr;
cudaStream_t cuda_stream = nullptr;
// --quick: small shapes only, for a run under compute-sanitizer (which is slow): every kernel
// and path, the edge cases above among them, none of the large matrices or long contexts.
bool quick = false;

stream cpu() { return {.where = device::cpu, .pool = pool_ptr, .cuda_stream = nullptr}; }
stream gpu() { return {.where = device::cuda, .pool = nullptr, .cuda_stream = cuda_stream}; }
void sync() { gpu_test::check_cuda(cudaStreamSynchronize(cuda_stream), "kernel"); }

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
}

template <class T>
std::size_t count_different(const std::vector<T>& a, const std::vector<T>& b) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(T)) != 0 ? 1 : 0;
  return n;
}

// ---- embedding, rmsnorm, rope, silu_mul -----------------------------------------------------

void test_embedding(gpu_test::results& r) {
  std::uint32_t seed = 1;
  for (const kernel_cases::embedding_case& c : kernel_cases::embedding_cases()) {
    const kernel_cases::embedding_problem p = kernel_cases::make_embedding_problem(c, ++seed);
    std::vector<float> want(static_cast<std::size_t>(c.tokens * c.hidden));
    gpu_test::check_ok(run_embedding({.ids = p.ids.data(), .table = p.table.data(), .table_type = c.table,
                                      .out = want.data(), .tokens = c.tokens, .vocab = c.vocab, .hidden = c.hidden},
                                     cpu()),
                       "cpu embedding");
    device_array<std::int32_t> d_ids(p.ids);
    device_array<std::uint8_t> d_table(p.table);
    device_array<float> d_out(std::vector<float>(want.size(), std::nanf("")));
    gpu_test::check_ok(run_embedding({.ids = d_ids.get(), .table = d_table.get(), .table_type = c.table, .out = d_out.get(),
                                      .tokens = c.tokens, .vocab = c.vocab, .hidden = c.hidden},
                                     gpu()),
                       "gpu embedding");
    sync();
    r.check(format("embedding {} hidden {}", to_string(c.table), c.hidden), max_abs_diff(want, d_out.download()), 0.0);
  }
}

void test_rmsnorm(gpu_test::results& r) {
  std::uint32_t seed = 2;
  for (const kernel_cases::rows_case& c : kernel_cases::rmsnorm_cases()) {
    const kernel_cases::rmsnorm_problem p = kernel_cases::make_rmsnorm_problem(c, seed += 4);
    const std::int64_t rows = c.rows;
    const std::int64_t cols = c.cols;
    device_array<float> d_w(p.weight);
    device_array<float> d_res(p.residual);
    for (const bool residual : {false, true}) {
      std::vector<float> x_cpu = p.x;
      std::vector<float> out_cpu(p.x.size());
      gpu_test::check_ok(run_rmsnorm({.x = x_cpu.data(), .residual = residual ? p.residual.data() : nullptr,
                                      .weight = p.weight.data(), .out = out_cpu.data(), .rows = rows, .cols = cols,
                                      .x_stride = cols, .out_stride = cols, .eps = 1e-5f},
                                     cpu()),
                         "cpu rmsnorm");
      device_array<float> d_x(p.x);
      device_array<float> d_out(std::vector<float>(p.x.size(), std::nanf("")));
      gpu_test::check_ok(run_rmsnorm({.x = d_x.get(), .residual = residual ? d_res.get() : nullptr, .weight = d_w.get(),
                                      .out = d_out.get(), .rows = rows, .cols = cols, .x_stride = cols,
                                      .out_stride = cols, .eps = 1e-5f},
                                     gpu()),
                         "gpu rmsnorm");
      sync();
      r.check(format("rmsnorm rows {} cols {} residual {} (abs, values up to ~3)", rows, cols, residual),
              std::max(max_abs_diff(out_cpu, d_out.download()), max_abs_diff(x_cpu, d_x.download())),
              kernel_cases::rmsnorm_tolerance);
    }
    // Per-head norms: the row as heads of 64, each normalised on its own, in place.
    if (p.per_head()) {
      const std::int64_t groups = cols / kernel_cases::rmsnorm_head;
      std::vector<float> cpu_heads = p.heads;
      gpu_test::check_ok(run_rmsnorm({.x = cpu_heads.data(), .weight = p.head_weight.data(), .out = cpu_heads.data(),
                                      .rows = rows, .cols = kernel_cases::rmsnorm_head, .groups = groups,
                                      .x_stride = cols, .out_stride = cols, .eps = 1e-6f},
                                     cpu()),
                         "cpu rmsnorm groups");
      device_array<float> d_heads(p.heads);
      device_array<float> d_hw(p.head_weight);
      gpu_test::check_ok(run_rmsnorm({.x = d_heads.get(), .weight = d_hw.get(), .out = d_heads.get(), .rows = rows,
                                      .cols = kernel_cases::rmsnorm_head, .groups = groups, .x_stride = cols,
                                      .out_stride = cols, .eps = 1e-6f},
                                     gpu()),
                         "gpu rmsnorm groups");
      sync();
      r.check(format("rmsnorm rows {} groups {} of 64, in place (abs, values up to ~3)", rows, groups),
              max_abs_diff(cpu_heads, d_heads.download()), kernel_cases::rmsnorm_tolerance);
    }
    // The gather form (the rows that produce logits): every third row, backwards.
    const auto n = static_cast<std::int64_t>(p.gather.size());
    std::vector<float> x_cpu = p.x;
    std::vector<float> out_cpu(static_cast<std::size_t>(n * cols));
    gpu_test::check_ok(run_rmsnorm({.x = x_cpu.data(), .row_index = p.gather.data(), .weight = p.weight.data(),
                                    .out = out_cpu.data(), .rows = n, .cols = cols, .x_stride = cols,
                                    .out_stride = cols, .eps = 1e-5f},
                                   cpu()),
                       "cpu rmsnorm gather");
    device_array<float> d_x(p.x);
    device_array<std::int64_t> d_index(p.gather);
    device_array<float> d_out(std::vector<float>(out_cpu.size(), std::nanf("")));
    gpu_test::check_ok(run_rmsnorm({.x = d_x.get(), .row_index = d_index.get(), .weight = d_w.get(), .out = d_out.get(),
                                    .rows = n, .cols = cols, .x_stride = cols, .out_stride = cols, .eps = 1e-5f},
                                   gpu()),
                       "gpu rmsnorm gather");
    sync();
    r.check(format("rmsnorm gather rows {} of {} cols {} (abs)", n, rows, cols), max_abs_diff(out_cpu, d_out.download()),
            kernel_cases::rmsnorm_tolerance);
  }
}

void test_rope(gpu_test::results& r) {
  std::uint32_t seed = 3;
  for (const kernel_cases::rope_case& c : kernel_cases::rope_cases()) {
    const kernel_cases::rope_problem p = kernel_cases::make_rope_problem(c, ++seed);
    std::vector<float> x_cpu = p.x;
    gpu_test::check_ok(run_rope(p.params(x_cpu.data(), p.positions.data(), p.inv_freq.data()), cpu()), "cpu rope");
    device_array<float> d_x(p.x);
    device_array<std::int32_t> d_pos(p.positions);
    device_array<float> d_freq(p.inv_freq);
    gpu_test::check_ok(run_rope(p.params(d_x.get(), d_pos.get(), d_freq.get()), gpu()), "gpu rope");
    sync();
    r.check(format("rope head_dim {} rotary {} heads {} {} (abs, |x| <= 1)", c.head_dim, c.rotary_dim, c.heads,
                   c.pairs == rope_pairs::adjacent ? "adjacent" : "half_split"),
            max_abs_diff(x_cpu, d_x.download()), kernel_cases::rope_tolerance);
  }
}

void test_silu_mul(gpu_test::results& r) {
  std::uint32_t seed = 5;
  for (const kernel_cases::rows_case& c : kernel_cases::silu_mul_cases()) {
    const kernel_cases::silu_mul_problem p = kernel_cases::make_silu_mul_problem(c, seed += 2);
    std::vector<float> out_cpu(p.gate.size());
    gpu_test::check_ok(run_silu_mul({.gate = p.gate.data(), .up = p.up.data(), .out = out_cpu.data(), .rows = c.rows,
                                     .cols = c.cols, .in_stride = c.cols, .out_stride = c.cols},
                                    cpu()),
                       "cpu silu_mul");
    device_array<float> d_gate(p.gate);
    device_array<float> d_up(p.up);
    device_array<float> d_out(std::vector<float>(p.gate.size(), std::nanf("")));
    gpu_test::check_ok(run_silu_mul({.gate = d_gate.get(), .up = d_up.get(), .out = d_out.get(), .rows = c.rows,
                                     .cols = c.cols, .in_stride = c.cols, .out_stride = c.cols},
                                    gpu()),
                       "gpu silu_mul");
    sync();
    r.check(format("silu_mul rows {} cols {} (abs, gates up to 8)", c.rows, c.cols),
            max_abs_diff(out_cpu, d_out.download()), kernel_cases::silu_mul_tolerance);
  }
}

// ---- quantize, matmul ---------------------------------------------------------------------

void test_quantize(gpu_test::results& r) {
  std::uint32_t seed = 7;
  for (const kernel_cases::quantize_case& c : kernel_cases::quantize_cases()) {
    if (quick && !c.quick) continue;
    const kernel_cases::quantize_problem p = kernel_cases::make_quantize_problem(c, ++seed);
    const weight_format f = c.format;
    const std::int64_t n = c.n;
    const std::int64_t k = c.k;
    std::vector<std::uint8_t> values(p.values_bytes());
    std::vector<float> scales(p.scale_count());
    gpu_test::check_ok(run_quantize({.x = p.x.data(), .rows = n, .k = k, .x_stride = k, .format = f,
                                     .group_size = p.group, .values = values.data(), .scales = scales.data()},
                                    cpu()),
                       "cpu quantize");
    device_array<float> d_x(p.x);
    device_array<std::uint8_t> d_values(values.size());
    device_array<float> d_scales(scales.size());
    gpu_test::check_ok(run_quantize({.x = d_x.get(), .rows = n, .k = k, .x_stride = k, .format = f,
                                     .group_size = p.group, .values = d_values.get(), .scales = d_scales.get()},
                                    gpu()),
                       "gpu quantize");
    sync();
    const auto got_values = d_values.download();
    const auto got_scales = d_scales.download();
    r.check(format("quantize {} [{}, {}] group {}: differing bytes + scales", to_string(f), n, k, p.group),
            static_cast<double>(count_different(values, got_values) + count_different(scales, got_scales)), 0.0);
    std::vector<float> dense_cpu(p.x.size());
    const weight_view view{.format = f, .values = values.data(), .scales = scales.data(), .group_size = p.group};
    gpu_test::check_ok(run_dequantize({.w = view, .k = k, .row_begin = 0, .rows = n, .y = dense_cpu.data(), .y_stride = k}, cpu()),
                       "cpu dequantize");
    device_array<float> d_dense(std::vector<float>(p.x.size(), std::nanf("")));
    const weight_view d_view{.format = f, .values = d_values.get(), .scales = d_scales.get(), .group_size = p.group};
    gpu_test::check_ok(run_dequantize({.w = d_view, .k = k, .row_begin = 0, .rows = n, .y = d_dense.get(), .y_stride = k}, gpu()),
                       "gpu dequantize");
    sync();
    r.check(format("dequantize {} [{}, {}]", to_string(f), n, k), max_abs_diff(dense_cpu, d_dense.download()), 0.0);
  }
}

void test_matmul(gpu_test::results& r) {
  const std::int64_t workspace_floats = matmul_workspace_floats(128, 16384);
  device_array<float> workspace(static_cast<std::size_t>(workspace_floats));
  std::uint32_t seed = 9;
  for (const kernel_cases::matmul_case& c : kernel_cases::matmul_cases()) {
    if (quick && !c.quick) continue;
    const host_weights w = kernel_cases::make_weights(c, ++seed, cpu());
    device_array<std::uint8_t> d_values(w.values);
    // A NaN past the last scale: a kernel that reads beyond the scales turns its output NaN.
    std::vector<float> scales_with_canary = w.scales;
    scales_with_canary.push_back(std::nanf(""));
    device_array<float> d_scales(scales_with_canary);
    const weight_view device_view{.format = c.format, .values = d_values.get(),
                                  .scales = w.scales.empty() ? nullptr : d_scales.get(), .group_size = w.group_size};
    const auto bias = kernel_cases::scaled_floats(static_cast<std::size_t>(c.n), ++seed, 1, 1.0f);
    device_array<float> d_bias(bias);
    const auto w2 = kernel_cases::squared(w.dense);
    for (const std::int64_t tokens : c.tokens) {
      for (const int mode : {0, 1, 2}) {
        // 0: packed rows (k a multiple of 4 takes the aligned float4 x path the executor
        // uses, and the pipelined GEMM), no split; 1: packed, split-K; 2: rows that are not
        // 16-byte aligned (the scalar path; the wmma GEMM at 9+ tokens), split-K. Both
        // epilogues in each, by the parity of the token count.
        const bool split = mode >= 1;
        const std::int64_t x_stride = mode == 2 ? c.k + 3 : c.k;
        const auto x = kernel_cases::activations(tokens, x_stride, ++seed);
        const bool accumulate = (mode == 1) != (tokens % 2 == 0);
        // Accumulating calls add to y0; the others start from NaN, so that an output the kernel
        // never writes shows.
        const auto y0 = accumulate ? random_floats(static_cast<std::size_t>(tokens * c.n), ++seed)
                                   : std::vector<float>(static_cast<std::size_t>(tokens * c.n), std::nanf(""));
        std::vector<float> y_cpu = y0;
        gpu_test::check_ok(run_matmul({.x = x.data(), .w = w.view(), .bias = bias.data(), .y = y_cpu.data(),
                                       .tokens = tokens, .n = c.n, .k = c.k, .x_stride = x_stride, .y_stride = c.n,
                                       .accumulate = accumulate, .exact_activations = true},
                                      cpu()),
                           "cpu matmul");
        device_array<float> d_x(x);
        device_array<float> d_y(y0);
        gpu_test::check_ok(run_matmul({.x = d_x.get(), .w = device_view, .bias = d_bias.get(), .y = d_y.get(),
                                       .tokens = tokens, .n = c.n, .k = c.k, .x_stride = x_stride, .y_stride = c.n,
                                       .accumulate = accumulate, .workspace = split ? workspace.get() : nullptr,
                                       .workspace_floats = split ? workspace_floats : 0},
                                      gpu()),
                           "gpu matmul");
        sync();
        const auto l2 = kernel_cases::products_l2(x, w2, tokens, c.n, c.k, x_stride, cpu());
        const double worst = kernel_cases::worst_matmul_error(d_y.download(), y_cpu, l2, bias.data(),
                                                              accumulate ? y0.data() : nullptr, tokens, c.n);
        const bool tensor_cores = cuda_matmul_uses_tensor_cores(c.format, tokens, w.group_size);
        r.check(format("matmul {} {} n {} k {} g {} tokens {}{}{}{} (/ |x.w|2)", c.shape, to_string(c.format), c.n, c.k,
                       w.group_size, tokens, split ? " split-k" : "", accumulate ? " acc" : "",
                       x_stride == c.k ? " packed" : ""),
                worst,
                tensor_cores ? kernel_cases::matmul_tensor_core_tolerance : kernel_cases::matmul_f32_tolerance);
      }
    }
  }
}

// ---- KV cache write, paged attention -------------------------------------------------------

void test_kv_cache_write(gpu_test::results& r) {
  std::uint32_t seed = 12;
  for (const kernel_cases::kv_write_case& c : kernel_cases::kv_cache_write_cases()) {
    const kernel_cases::kv_write_problem p = kernel_cases::make_kv_write_problem(c, ++seed);
    const std::size_t cache_bytes = p.cache_bytes();
    const std::size_t scale_count = p.scale_count();
    std::vector<std::uint8_t> kc(cache_bytes, 0), vc(cache_bytes, 0);
    std::vector<float> ks(scale_count, 0.0f), vs(scale_count, 0.0f);
    gpu_test::check_ok(run_kv_cache_write(p.params(p.qkv.data(), p.slots.data(), kc.data(), vc.data(), ks.data(), vs.data()),
                                          cpu()),
                       "cpu kv_cache_write");
    device_array<float> d_qkv(p.qkv);
    device_array<std::int64_t> d_slots(p.slots);
    device_array<std::uint8_t> d_kc(std::vector<std::uint8_t>(cache_bytes, 0)), d_vc(std::vector<std::uint8_t>(cache_bytes, 0));
    device_array<float> d_ks(std::vector<float>(scale_count, 0.0f)), d_vs(std::vector<float>(scale_count, 0.0f));
    gpu_test::check_ok(run_kv_cache_write(p.params(d_qkv.get(), d_slots.get(), d_kc.get(), d_vc.get(), d_ks.get(), d_vs.get()),
                                          gpu()),
                       "gpu kv_cache_write");
    sync();
    const std::size_t differing = count_different(kc, d_kc.download()) + count_different(vc, d_vc.download()) +
                                  count_different(ks, d_ks.download()) + count_different(vs, d_vs.download());
    r.check(format("kv_cache_write {} head_dim {} kv heads {} block {}{}: differing cache bytes + scales",
                   to_string(c.kv), c.head_dim, c.kv_heads, c.block_size, c.values ? "" : ", K rows only"),
            static_cast<double>(differing), 0.0);
  }
}

// A paged cache filled (by the CPU writer) with the K/V of several sequences, and queries.
void test_paged_attention(gpu_test::results& r) {
  std::uint32_t seed = 14;
  for (const kernel_cases::attention_case& c : kernel_cases::attention_cases()) {
    if (quick != c.quick) continue;  // --quick: the short twins of the long cases
    const kernel_cases::attention_problem p = kernel_cases::make_attention_problem(c, ++seed, cpu());
    const std::int64_t attention_workspace = paged_attention_workspace_floats(p.tokens, p.heads, c.head_dim);
    device_array<float> workspace(static_cast<std::size_t>(attention_workspace));
    std::vector<float> out_cpu(p.q.size());
    gpu_test::check_ok(run_paged_attention(p.params(out_cpu.data()), cpu()), "cpu attention");
    // The metric's denominators: the largest |v| each query attends.
    const kernel_cases::attention_reference ref{.out = std::vector<double>(out_cpu.begin(), out_cpu.end()),
                                                .v_max = kernel_cases::attended_v_max(p)};
    device_array<std::uint8_t> d_kc(p.k_cache), d_vc(p.v_cache);
    device_array<float> d_ks(p.k_scales), d_vs(p.v_scales), d_q(p.q);
    device_array<std::int32_t> d_seq(p.seq), d_pos(p.pos), d_tables(p.tables), d_table_begin(p.table_begin),
        d_runs(p.run_begin);
    for (int mode = 0; mode < 3; ++mode) {
      // 0: a block per token; 1: prefill tiles over the runs; 2: runs and split-K.
      const bool runs = mode >= 1;
      const bool split = mode == 2;
      device_array<float> d_out(std::vector<float>(p.q.size(), std::nanf("")));
      paged_attention_params g = p.params(d_out.get());
      g.q = d_q.get();
      g.k_cache = d_kc.get();
      g.v_cache = d_vc.get();
      g.k_scales = p.scaled() ? d_ks.get() : nullptr;
      g.v_scales = p.scaled() ? d_vs.get() : nullptr;
      g.seq = d_seq.get();
      g.pos = d_pos.get();
      g.block_tables = d_tables.get();
      g.table_begin = d_table_begin.get();
      g.seq_token_begin = runs ? d_runs.get() : nullptr;
      g.num_seqs = runs ? p.num_seqs() : 0;
      g.max_seq_tokens = runs ? c.chunk : 0;
      g.workspace = split ? workspace.get() : nullptr;
      g.workspace_floats = split ? attention_workspace : 0;
      gpu_test::check_ok(run_paged_attention(g, gpu()), "gpu attention");
      sync();
      const bool tensor_cores = cuda_attention_uses_tensor_cores(c.kv, c.head_dim, c.group, runs, c.chunk);
      r.check(format("paged_attention {} {} head_dim {} gqa {}:1 block {} {}{} (/ max |v|)", c.shape, to_string(c.kv),
                     c.head_dim, c.group, c.block_size,
                     mode == 0 ? "per token" : (mode == 1 ? "prefill tiles" : "tiles + split-k"),
                     tensor_cores ? " tensor cores" : ""),
              kernel_cases::worst_attention_error(d_out.download(), ref, p),
              tensor_cores ? kernel_cases::attention_tensor_core_tolerance : kernel_cases::attention_f32_tolerance);
    }
  }
}

// ---- sampling -----------------------------------------------------------------------------

// The CPU's kept distribution for a row, in its sorted order: (id, probability).
std::vector<std::pair<std::int32_t, double>> kept_distribution(const std::vector<float>& logits, const sampling_row& c) {
  std::vector<std::pair<float, std::int32_t>> pool;
  const float inv_t = 1.0f / c.temperature;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    if (!std::isnan(logits[i])) pool.push_back({logits[i] * inv_t, static_cast<std::int32_t>(i)});
  }
  const auto before = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  std::sort(pool.begin(), pool.end(), before);
  if (c.top_k > 0 && static_cast<std::size_t>(c.top_k) < pool.size()) pool.resize(static_cast<std::size_t>(c.top_k));
  double total = 0.0;
  const float max_value = pool.front().first;
  for (auto& x : pool) {
    x.first = std::exp(x.first - max_value);
    total += x.first;
  }
  const float inv_total = static_cast<float>(1.0 / total);
  std::vector<std::pair<std::int32_t, double>> out;
  double mass = 0.0;
  for (auto& x : pool) {
    const float p = x.first * inv_total;
    if (c.min_p > 0.0f && p < c.min_p * inv_total) continue;
    if (c.top_p < 1.0f && mass >= c.top_p) break;
    mass += p;
    out.push_back({x.second, p});
  }
  return out;
}

// Whether a seeded draw from `logits` under `c` lands within float rounding of the boundary
// between two kept tokens: there two correct samplers may choose differently.
bool draw_near_boundary(const std::vector<float>& logits, const sampling_row& c) {
  const auto kept = kept_distribution(logits, c);
  double total = 0.0;
  for (const auto& k : kept) total += k.second;
  const double target = static_cast<double>(c.uniform) * total;
  double cumulative = 0.0;
  for (const auto& k : kept) {
    cumulative += k.second;
    if (std::fabs(cumulative - target) <= 1e-5 * total) return true;
  }
  return false;
}

void test_sampling(gpu_test::results& r) {
  std::uint32_t seed = 17;
  for (const kernel_cases::sampling_case& c : kernel_cases::sampling_cases()) {
    if (c.masked || (quick && !c.quick)) continue;  // masks: test_masked_sampling
    const kernel_cases::sampling_problem p = kernel_cases::make_sampling_problem(c, ++seed);
    const std::int64_t vocab = c.vocab;
    std::vector<float> cpu_logits = p.logits;
    std::vector<std::int32_t> cpu_out(static_cast<std::size_t>(c.rows));
    gpu_test::check_ok(run_sampling(p.params(cpu_logits.data(), p.config.data(), cpu_out.data(), p.biases.data(), nullptr),
                                    cpu()),
                       "cpu sampling");
    device_array<float> d_logits(p.logits);
    device_array<sampling_row> d_config(p.config);
    device_array<logit_bias> d_biases(p.biases);
    device_array<std::int32_t> d_out(static_cast<std::size_t>(c.rows));
    gpu_test::check_ok(run_sampling(p.params(d_logits.get(), d_config.get(), d_out.get(), d_biases.get(), nullptr), gpu()),
                       "gpu sampling");
    sync();
    const auto gpu_out = d_out.download();
    int greedy_mismatch = 0;
    int unexplained = 0;
    int differing = 0;
    int banned_drawn = 0;
    int forced_missed = 0;
    for (std::int64_t i = 0; i < c.rows; ++i) {
      const auto at = static_cast<std::size_t>(i);
      const std::int32_t ban = p.banned[at];
      if (ban >= 0 && (gpu_out[at] == ban || cpu_out[at] == ban)) ++banned_drawn;
      const std::int32_t forced = p.forced[at];
      if (forced >= 0) forced_missed += (gpu_out[at] != forced) + (cpu_out[at] != forced);
      if (gpu_out[at] == cpu_out[at]) continue;
      ++differing;
      const sampling_row& row_config = p.config[at];
      if (row_config.temperature <= 0.0f || row_config.top_k == 1) {
        ++greedy_mismatch;
        continue;
      }
      // A different token is acceptable only where the draw sits on the boundary between them
      // (of the row as biased).
      if (!draw_near_boundary(p.effective_row(i), row_config)) ++unexplained;
    }
    r.check(format("sampling vocab {}: greedy / top-1 rows that differ", vocab), greedy_mismatch, 0.0);
    r.check(format("sampling vocab {}: banned tokens drawn, +100 tokens not drawn", vocab), banned_drawn + forced_missed,
            0.0);
    r.check(format("sampling vocab {}: seeded draws that differ away from a boundary ({} differ in all)", vocab, differing),
            unexplained, 0.0);
  }
}

// Constrained decoding: rows with a grammar's token mask (a few allowed tokens, or most of them),
// the rest without. The GPU must draw only allowed tokens and the same ones as the CPU reference
// (keep_allowed then the same sampling), but where a seeded draw sits on a boundary.
void test_masked_sampling(gpu_test::results& r) {
  std::uint32_t seed = 23;
  for (const kernel_cases::sampling_case& c : kernel_cases::sampling_cases()) {
    if (!c.masked || (quick && !c.quick)) continue;
    const kernel_cases::sampling_problem p = kernel_cases::make_sampling_problem(c, ++seed);
    const std::int64_t vocab = c.vocab;
    std::vector<float> cpu_logits = p.logits;
    std::vector<std::int32_t> cpu_out(static_cast<std::size_t>(c.rows));
    gpu_test::check_ok(run_sampling(p.params(cpu_logits.data(), p.config.data(), cpu_out.data(), nullptr, p.masks.data()),
                                    cpu()),
                       "cpu masked sampling");
    device_array<float> d_logits(p.logits);
    device_array<sampling_row> d_config(p.config);
    device_array<std::uint32_t> d_masks(p.masks);
    device_array<std::int32_t> d_out(static_cast<std::size_t>(c.rows));
    gpu_test::check_ok(run_sampling(p.params(d_logits.get(), d_config.get(), d_out.get(), nullptr, d_masks.get()), gpu()),
                       "gpu masked sampling");
    sync();
    const auto gpu_out = d_out.download();
    int outside = 0;
    int unexplained = 0;
    for (std::int64_t i = 0; i < c.rows; ++i) {
      const auto at = static_cast<std::size_t>(i);
      const sampling_row& row_config = p.config[at];
      if (row_config.allowed_row >= 0) {
        const std::uint32_t* mask = p.masks.data() + static_cast<std::size_t>(row_config.allowed_row * p.words());
        for (const std::int32_t t : {cpu_out[at], gpu_out[at]}) {
          if (((mask[t / 32] >> (t % 32)) & 1u) == 0) ++outside;
        }
      }
      if (gpu_out[at] == cpu_out[at]) continue;
      if (row_config.temperature <= 0.0f) {
        ++unexplained;
        continue;
      }
      if (!draw_near_boundary(p.effective_row(i), row_config)) ++unexplained;
    }
    r.check(format("masked sampling vocab {}: tokens drawn outside their mask (CPU and GPU)", vocab), outside, 0.0);
    r.check(format("masked sampling vocab {}: draws that differ from the CPU away from a boundary", vocab), unexplained,
            0.0);
  }
}

// ---- KV block copies ------------------------------------------------------------------------------

// Whole blocks of a region copied in every layer, bytes as they are: 4-byte scales (word copies
// do not apply to blocks of 12 bytes) and 16-byte-aligned pools, more pairs than one launch takes.
void test_kv_block_copy(gpu_test::results& r) {
  std::uint32_t seed = 30;
  for (const std::size_t block_bytes : kernel_cases::kv_block_copy_cases()) {
    const kernel_cases::block_copy_problem p = kernel_cases::make_block_copy_problem(block_bytes, ++seed);
    std::vector<std::uint8_t> on_cpu = p.bytes;
    gpu_test::check_ok(run_kv_block_copy(p.params(on_cpu.data()), cpu()), "cpu kv_block_copy");
    device_array<std::uint8_t> d_bytes(p.bytes);
    gpu_test::check_ok(run_kv_block_copy(p.params(d_bytes.get()), gpu()), "gpu kv_block_copy");
    sync();
    const auto on_gpu = d_bytes.download();
    double differ = 0;
    for (std::size_t i = 0; i < p.bytes.size(); ++i) differ += on_gpu[i] != on_cpu[i] ? 1 : 0;
    // And the copy copied: the CPU's result moved what the pairs name.
    const bool moved = std::equal(on_cpu.begin() + 80 * static_cast<std::ptrdiff_t>(block_bytes),
                                  on_cpu.begin() + 150 * static_cast<std::ptrdiff_t>(block_bytes), p.bytes.begin());
    r.check(format("kv_block_copy blocks of {} bytes, {} layers: bytes that differ from the CPU's", block_bytes, p.layers),
            differ + (moved ? 0 : 1), 0.0);
  }
}

// ---- MoE routing and experts ------------------------------------------------------------------

void test_moe_routing(gpu_test::results& r) {
  std::uint32_t seed = 40;
  for (const kernel_cases::routing_case& c : kernel_cases::moe_routing_cases()) {
    for (const std::int64_t tokens : c.tokens) {
      if (quick && tokens > 97) continue;
      const kernel_cases::routing_problem p = kernel_cases::make_routing_problem(c, tokens, seed += 2);
      // In double: which rows have a near tie that expf's rounding on either device may break.
      const kernel_cases::routing_reference exact = kernel_cases::reference_routing(p);
      const auto pairs = static_cast<std::size_t>(tokens * c.top_k);
      std::vector<std::int32_t> cpu_experts(pairs);
      std::vector<float> cpu_weights(pairs);
      gpu_test::check_ok(run_moe_routing(p.params(p.logits.data(), p.bias.data(), cpu_experts.data(), cpu_weights.data()),
                                         cpu()),
                         "cpu moe routing");
      device_array<float> d_logits(p.logits);
      device_array<float> d_bias(p.bias);
      device_array<std::int32_t> d_experts(std::vector<std::int32_t>(pairs, -1));
      device_array<float> d_weights(std::vector<float>(pairs, std::nanf("")));
      gpu_test::check_ok(run_moe_routing(p.params(d_logits.get(), d_bias.get(), d_experts.get(), d_weights.get()), gpu()),
                         "gpu moe routing");
      sync();
      const auto gpu_experts = d_experts.download();
      const auto gpu_weights = d_weights.download();
      int unexplained = 0;
      int differing = 0;
      double worst = 0.0;
      for (std::int64_t t = 0; t < tokens; ++t) {
        const auto at = static_cast<std::ptrdiff_t>(t * c.top_k);
        if (!std::equal(cpu_experts.begin() + at, cpu_experts.begin() + at + c.top_k, gpu_experts.begin() + at)) {
          ++differing;
          if (!exact.near_tie[static_cast<std::size_t>(t)]) ++unexplained;
          continue;
        }
        for (std::int64_t i = 0; i < c.top_k; ++i) {
          const auto j = static_cast<std::size_t>(at + i);
          const double d = std::fabs(static_cast<double>(gpu_weights[j]) - cpu_weights[j]) /
                           std::max(std::fabs(static_cast<double>(cpu_weights[j])), 1e-30);
          worst = std::max(worst, std::isnan(d) ? INFINITY : d);
        }
      }
      const std::string what = format("moe routing {} experts {} top {} groups {} tokens {}{}", c.shape, c.experts,
                                      c.top_k, c.groups, tokens, c.normalize ? " normalised" : "");
      r.check(what + ": rows whose experts differ away from a near tie (" + std::to_string(differing) + " differ)",
              unexplained, 0.0);
      // Where the experts agree: expf on either side (a few ulp) through the normalisation.
      r.check(what + ": weights (relative)", worst, kernel_cases::routing_weight_tolerance);
    }
  }
}

// An expert set's matrices in device memory (scales followed by a NaN, so that a kernel reading
// beyond them turns its output NaN) and the views of them, gate and up stacked or apart.
struct device_experts {
  std::vector<std::unique_ptr<device_array<std::uint8_t>>> values;
  std::vector<std::unique_ptr<device_array<float>>> scales;
  std::vector<moe_expert_weights> stacked, apart;  // [experts]
};

device_experts upload_experts(const kernel_cases::experts_problem& p) {
  device_experts d;
  const auto place = [&](const host_weights& w) {
    d.values.push_back(std::make_unique<device_array<std::uint8_t>>(w.values));
    std::vector<float> with_canary = w.scales;
    with_canary.push_back(std::nanf(""));
    d.scales.push_back(std::make_unique<device_array<float>>(with_canary));
    return weight_view{.format = w.format, .values = d.values.back()->get(),
                       .scales = w.scales.empty() ? nullptr : d.scales.back()->get(), .group_size = w.group_size};
  };
  const weight_view gate_up = place(p.gate_up);
  const weight_view down = place(p.down);
  d.stacked = p.views(gate_up, down, true);
  d.apart = p.views(gate_up, down, false);
  return d;
}

void test_moe_experts(gpu_test::results& r) {
  std::uint32_t seed = 50;
  for (const kernel_cases::experts_case& c : kernel_cases::moe_experts_cases()) {
    if (quick && !c.quick) continue;
    const kernel_cases::experts_problem set = kernel_cases::make_experts_problem(c, seed += 100);
    const std::int64_t num_experts = c.experts;
    const std::int64_t top_k = c.top_k;
    const device_experts uploaded = upload_experts(set);
    // The GPU multiplies in f32, and so does the CPU but for INT4 in groups of 32 or more, whose
    // activations its integer dot products round to int8: there the GPU is held to the double
    // reference instead, at the same tolerance.
    const bool cpu_int8 = c.format == weight_format::int4 && set.group >= 32 && cpu::quantized_activations();
    for (const std::int64_t tokens : c.tokens) {
      if (quick && tokens > 7 && !c.quick_prefill) continue;
      // Strided x and out at 7 tokens; packed rows otherwise.
      const std::int64_t x_stride = tokens == 7 ? c.hidden + 5 : c.hidden;
      const std::int64_t out_stride = tokens == 7 ? c.hidden + 3 : c.hidden;
      const kernel_cases::experts_batch b = kernel_cases::make_experts_batch(set, tokens, x_stride, out_stride, ++seed);
      // Every token in double (experts_error's spread, and the reference where the CPU's is not
      // f32); at 7 tokens also with two choices' weights 0, which the ids outside the set below get.
      kernel_cases::experts_batch zeroed = b;
      if (tokens == 7) {
        zeroed.weights[5] = 0.0f;
        zeroed.weights[2] = 0.0f;
      }
      const auto exact_of = [&](const kernel_cases::experts_batch& batch) {
        std::vector<kernel_cases::experts_reference> out(static_cast<std::size_t>(tokens));
        pool_ptr->parallel_for(0, static_cast<std::size_t>(tokens), 1, [&](std::size_t begin, std::size_t end) {
          for (std::size_t t = begin; t < end; ++t) {
            out[t] = kernel_cases::reference_experts_token(set, batch, static_cast<std::int64_t>(t));
          }
        });
        return out;
      };
      const std::vector<kernel_cases::experts_reference> exact = exact_of(b);
      const std::vector<kernel_cases::experts_reference> exact_zeroed =
          tokens == 7 ? exact_of(zeroed) : std::vector<kernel_cases::experts_reference>{};
      // The largest experts_error of the GPU's output against the CPU's (or the double one).
      const auto worst_against = [&](const std::vector<float>& got, const std::vector<float>& cpu_out,
                                     const std::vector<kernel_cases::experts_reference>& refs) {
        double worst = 0.0;
        for (std::int64_t t = 0; t < tokens; ++t) {
          const kernel_cases::experts_reference& ref = refs[static_cast<std::size_t>(t)];
          for (std::int64_t d = 0; d < c.hidden; ++d) {
            const auto at = static_cast<std::size_t>(t * out_stride + d);
            const double want = cpu_int8 ? ref.out[static_cast<std::size_t>(d)] : cpu_out[at];
            worst = std::max(worst, kernel_cases::experts_error(got[at], want, ref.spread[static_cast<std::size_t>(d)],
                                                                std::fabs(b.out0[at])));
          }
        }
        return worst;
      };
      const std::int64_t workspace_floats = moe_experts_workspace_floats(tokens, top_k, num_experts, c.hidden, c.inter);
      for (const bool stacked : {true, false}) {
        const std::vector<moe_expert_weights> host_views = set.views(stacked);
        device_array<moe_expert_weights> d_matrices(stacked ? uploaded.stacked : uploaded.apart);
        moe_experts_params p{.tokens = tokens, .top_k = top_k, .num_experts = num_experts, .hidden = c.hidden,
                             .intermediate = c.inter, .x_stride = x_stride, .out_stride = out_stride,
                             .workspace_floats = workspace_floats};

        std::vector<float> cpu_out = b.out0;
        std::vector<std::int32_t> cpu_counts(static_cast<std::size_t>(num_experts), -1);
        std::vector<float> workspace(static_cast<std::size_t>(workspace_floats));
        p.x = b.x.data();
        p.experts = b.experts.data();
        p.weights = b.weights.data();
        p.matrices = host_views.data();
        p.out = cpu_out.data();
        p.expert_tokens = cpu_counts.data();
        p.workspace = workspace.data();
        gpu_test::check_ok(run_moe_experts(p, cpu()), "cpu moe experts");

        device_array<float> d_x(b.x);
        device_array<std::int32_t> d_experts(b.experts);
        device_array<float> d_weights(b.weights);
        device_array<float> d_out(b.out0);
        device_array<std::int32_t> d_counts(static_cast<std::size_t>(num_experts));
        device_array<float> d_workspace(static_cast<std::size_t>(workspace_floats));
        p.x = d_x.get();
        p.experts = d_experts.get();
        p.weights = d_weights.get();
        p.out = d_out.get();
        p.expert_tokens = d_counts.get();
        p.workspace = d_workspace.get();
        p.device_matrices = d_matrices.get();
        gpu_test::check_ok(run_moe_experts(p, gpu()), "gpu moe experts");
        sync();
        const auto gpu_out = d_out.download();
        const std::string what = format("moe experts {} {}{} hidden {} inter {} top {} of {} tokens {} {}{}", c.shape,
                                        to_string(c.format),
                                        c.format == weight_format::int4 ? format(" g{}", set.group) : std::string(),
                                        c.hidden, c.inter, top_k, num_experts, tokens,
                                        stacked ? "stacked" : "gate/up apart", x_stride != c.hidden ? " strided" : "");
        const bool tensor_cores = cuda_moe_experts_use_tensor_cores(c.format, tokens, c.hidden, set.group) ||
                                  cuda_moe_experts_use_tensor_cores(c.format, tokens, c.inter, set.group);
        r.check(what + (tensor_cores ? " tensor cores" : "") +
                    (cpu_int8 ? " (/ spread, against double)" : " (/ spread)"),
                worst_against(gpu_out, cpu_out, exact),
                tensor_cores ? kernel_cases::experts_tensor_core_tolerance : kernel_cases::experts_f32_tolerance);
        r.expect(what + ": tokens per expert", d_counts.download() == cpu_counts);

        if (tokens != 7 && !tensor_cores) continue;
        // The same call captured in a CUDA graph (nothing in it waits for the device) and
        // replayed gives the same bits as the eager call, on either form of the grouped matmul.
        d_out.upload(b.out0);
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        gpu_test::check_cuda(cudaStreamBeginCapture(cuda_stream, cudaStreamCaptureModeThreadLocal), "begin capture");
        const status captured = run_moe_experts(p, gpu());
        gpu_test::check_cuda(cudaStreamEndCapture(cuda_stream, &graph), "end capture");
        gpu_test::check_ok(captured, "moe experts in capture");
        gpu_test::check_cuda(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
        gpu_test::check_cuda(cudaGraphLaunch(exec, cuda_stream), "graph launch");
        sync();
        r.check(what + ": graph replay = eager call (differing floats)",
                static_cast<double>(count_different(gpu_out, d_out.download())), 0.0);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        if (tokens != 7) continue;

        // An expert id outside the set adds nothing: the CPU's sum with that pair's weight 0.
        auto broken = b.experts;
        broken[5] = static_cast<std::int32_t>(num_experts);
        broken[2] = -1;
        std::vector<float> cpu_zeroed = b.out0;
        p.x = b.x.data();
        p.experts = b.experts.data();
        p.weights = zeroed.weights.data();
        p.out = cpu_zeroed.data();
        p.expert_tokens = nullptr;
        p.workspace = workspace.data();
        p.device_matrices = nullptr;
        gpu_test::check_ok(run_moe_experts(p, cpu()), "cpu moe experts, zero weights");
        d_out.upload(b.out0);
        d_experts.upload(broken);
        p.x = d_x.get();
        p.experts = d_experts.get();
        p.weights = d_weights.get();
        p.out = d_out.get();
        p.workspace = d_workspace.get();
        p.device_matrices = d_matrices.get();
        gpu_test::check_ok(run_moe_experts(p, gpu()), "gpu moe experts, ids outside the set");
        sync();
        r.check(what + ": expert ids outside the set left out (/ spread)",
                worst_against(d_out.download(), cpu_zeroed, exact_zeroed), kernel_cases::experts_f32_tolerance);
      }
    }
  }
  // No tokens: nothing runs, and every count is 0.
  const kernel_cases::experts_problem set =
      kernel_cases::make_experts_problem({"no tokens", weight_format::bf16, 64, 32}, 90);
  const device_experts uploaded = upload_experts(set);
  const std::vector<moe_expert_weights> host_views = set.views(true);
  const std::int64_t num_experts = set.c.experts;
  device_array<moe_expert_weights> d_matrices(uploaded.stacked);
  device_array<std::int32_t> d_counts(std::vector<std::int32_t>(static_cast<std::size_t>(num_experts), -1));
  const std::int64_t no_tokens_floats = moe_experts_workspace_floats(0, set.c.top_k, num_experts, 64, 32);
  device_array<float> d_workspace(static_cast<std::size_t>(no_tokens_floats));
  gpu_test::check_ok(run_moe_experts({.x = nullptr, .experts = nullptr, .weights = nullptr, .matrices = host_views.data(),
                                      .out = nullptr, .expert_tokens = d_counts.get(), .tokens = 0, .top_k = set.c.top_k,
                                      .num_experts = num_experts, .hidden = 64, .intermediate = 32, .x_stride = 64,
                                      .out_stride = 64, .workspace = d_workspace.get(),
                                      .workspace_floats = no_tokens_floats, .device_matrices = d_matrices.get()},
                                     gpu()),
                     "gpu moe experts, no tokens");
  sync();
  r.expect("moe experts, no tokens: every count 0",
           d_counts.download() == std::vector<std::int32_t>(static_cast<std::size_t>(num_experts), 0));
}

// ---- MLA attention and DSA selection -------------------------------------------------------

void test_mla_attention(gpu_test::results& r) {
  std::uint32_t seed = 70;
  for (const kernel_cases::mla_case& c : kernel_cases::mla_attention_cases()) {
    if (quick && !c.quick) continue;
    const kernel_cases::mla_problem p = kernel_cases::make_mla_problem(c, seed += 5, cpu());
    const std::int64_t tokens = p.tokens;
    const std::int64_t workspace_floats = mla_attention_workspace_floats(tokens, c.heads, c.latent);
    device_array<std::uint8_t> d_cache(p.cache.cache);
    device_array<float> d_scales(p.cache.scales), d_q_latent(p.q_latent), d_q_full(p.q_full);
    device_array<std::int32_t> d_seq(p.batch.seq), d_pos(p.batch.pos), d_tables(p.cache.tables),
        d_table_begin(p.cache.table_begin), d_selected(p.selected), d_counts(p.counts);
    device_array<float> d_workspace(static_cast<std::size_t>(workspace_floats));
    const bool tensor_cores = cuda_mla_uses_tensor_cores(c.kv, c.latent, c.rope);
    for (const bool select : {false, true}) {
      std::vector<float> want(p.q_latent.size());
      gpu_test::check_ok(run_mla_attention(p.params(want.data(), select), cpu()), "cpu mla attention");
      // The metric's denominators: the largest |c| each token attends.
      const std::vector<double> c_max = kernel_cases::mla_attended_max(p, select);
      for (int mode = 0; mode < 3; ++mode) {
        // 0: a block per (token, band); 1: split-K; 2: split-K in place (out = q_latent).
        const bool split = mode >= 1;
        const bool in_place = mode == 2;
        device_array<float> d_out(in_place ? p.q_latent : std::vector<float>(p.q_latent.size(), NAN));
        mla_attention_params g = p.params(d_out.get(), select);
        g.q_latent = in_place ? d_out.get() : d_q_latent.get();
        g.q_rope = d_q_full.get() + kernel_cases::mla_problem::nope;
        g.cache = d_cache.get();
        g.scales = p.cache.scaled() ? d_scales.get() : nullptr;
        g.seq = d_seq.get();
        g.pos = d_pos.get();
        g.block_tables = d_tables.get();
        g.table_begin = d_table_begin.get();
        g.selected = select ? d_selected.get() : nullptr;
        g.selected_count = select ? d_counts.get() : nullptr;
        g.workspace = split ? d_workspace.get() : nullptr;
        g.workspace_floats = split ? workspace_floats : 0;
        gpu_test::check_ok(run_mla_attention(g, gpu()), "gpu mla attention");
        sync();
        const auto got = d_out.download();
        double worst = 0.0;
        for (std::int64_t t = 0; t < tokens; ++t) {
          for (std::int64_t i = 0; i < c.heads * c.latent; ++i) {
            const auto at = static_cast<std::size_t>(t * c.heads * c.latent + i);
            worst = std::max(worst, kernel_cases::mla_error(got[at], want[at], c_max[static_cast<std::size_t>(t)]));
          }
        }
        r.check(format("mla_attention {} {} latent {} rope {} heads {} block {} {}{}{} (/ max |c|)", c.shape,
                       to_string(c.kv), c.latent, c.rope, c.heads, c.block_size,
                       mode == 0 ? "one block per band" : (in_place ? "split-k, in place" : "split-k"),
                       select ? ", selection" : "", tensor_cores ? ", tensor cores" : ""),
                worst, tensor_cores ? kernel_cases::mla_tensor_core_tolerance : kernel_cases::mla_f32_tolerance);
      }
    }
  }
}

void test_dsa_select(gpu_test::results& r) {
  std::uint32_t seed = 80;
  for (const kernel_cases::dsa_case& c : kernel_cases::dsa_select_cases()) {
    if (quick && !c.quick) continue;
    const kernel_cases::dsa_problem p = kernel_cases::make_dsa_problem(c, seed += 5, cpu());
    const std::int64_t tokens = p.tokens;
    const std::int64_t longest = p.longest();
    std::vector<std::int32_t> cpu_selected(static_cast<std::size_t>(tokens * c.top_k), -1);
    std::vector<std::int32_t> cpu_counts(static_cast<std::size_t>(tokens), -1);
    gpu_test::check_ok(run_dsa_select(p.params(cpu_selected.data(), cpu_counts.data()), cpu()), "cpu dsa select");
    device_array<float> d_q(p.q), d_weights(p.weights), d_scales(p.keys.scales);
    device_array<std::uint8_t> d_keys(p.keys.cache);
    device_array<std::int32_t> d_seq(p.batch.seq), d_pos(p.batch.pos), d_tables(p.keys.tables),
        d_table_begin(p.keys.table_begin);
    // The whole batch's scores at once, and 3 tokens' at a time (several chunks).
    for (const std::int64_t chunk : {tokens, std::int64_t{3}}) {
      if (quick && chunk != tokens) continue;
      const std::int64_t workspace_floats = dsa_select_workspace_floats(chunk, longest);
      device_array<float> d_workspace(static_cast<std::size_t>(workspace_floats));
      device_array<std::int32_t> d_selected(std::vector<std::int32_t>(cpu_selected.size(), -1));
      device_array<std::int32_t> d_counts(std::vector<std::int32_t>(cpu_counts.size(), -1));
      dsa_select_params g = p.params(d_selected.get(), d_counts.get());
      g.q = d_q.get();
      g.head_weights = d_weights.get();
      g.key_cache = d_keys.get();
      g.key_scales = p.keys.scaled() ? d_scales.get() : nullptr;
      g.seq = d_seq.get();
      g.pos = d_pos.get();
      g.block_tables = d_tables.get();
      g.table_begin = d_table_begin.get();
      g.workspace = d_workspace.get();
      g.workspace_floats = workspace_floats;
      g.workspace_context = longest;
      gpu_test::check_ok(run_dsa_select(g, gpu()), "gpu dsa select");
      sync();
      const auto gpu_selected = d_selected.download();
      const auto gpu_counts = d_counts.download();
      int unexplained = 0;
      int differing = 0;
      for (std::int64_t t = 0; t < tokens; ++t) {
        const auto at = static_cast<std::ptrdiff_t>(t * c.top_k);
        const std::int32_t count = cpu_counts[static_cast<std::size_t>(t)];
        if (gpu_counts[static_cast<std::size_t>(t)] != count) {
          ++differing;
          ++unexplained;
          continue;
        }
        if (count == 0 ||
            std::equal(cpu_selected.begin() + at, cpu_selected.begin() + at + count, gpu_selected.begin() + at)) {
          continue;
        }
        ++differing;
        if (!kernel_cases::reference_dsa_choice(kernel_cases::reference_dsa_scores(p, t), c.top_k).near_tie) ++unexplained;
      }
      r.check(format("dsa_select {} {} {} heads of {} top {} block {}{}: tokens whose choice differs away from a "
                     "near tie ({} differ)",
                     c.shape, to_string(c.kv), c.heads, c.head_dim, c.top_k, c.block_size,
                     chunk == tokens ? "" : ", 3 tokens at a time", differing),
              unexplained, 0.0);
    }
  }
}

// ---- every head's matmul ------------------------------------------------------------------------

void test_head_matmul(gpu_test::results& r) {
  std::uint32_t seed = 60;
  for (const kernel_cases::head_matmul_case& c : kernel_cases::head_matmul_cases()) {
    const std::int64_t rows = c.first_row + (c.heads - 1) * c.head_rows + c.n;
    const host_weights w = kernel_cases::make_weights(c.format, rows, c.k, 0, ++seed, cpu());
    device_array<std::uint8_t> d_values(w.values);
    std::vector<float> scales_with_canary = w.scales;
    scales_with_canary.push_back(std::nanf(""));
    device_array<float> d_scales(scales_with_canary);
    weight_view device_view = w.view();
    device_view.values = d_values.get();
    device_view.scales = w.scales.empty() ? nullptr : d_scales.get();
    for (const std::int64_t tokens : c.tokens) {
      // Heads of a token side by side with gaps (x: k + 4 apart, y: n + 5 apart), which must
      // stay as they were.
      const std::int64_t x_head = c.k + 4, y_head = c.n + 5;
      const auto x = kernel_cases::activations(tokens, c.heads * x_head, ++seed);
      const std::vector<float> y0(static_cast<std::size_t>(tokens * c.heads * y_head), std::nanf(""));
      head_matmul_params p{.x = x.data(), .w = w.view(), .y = nullptr, .tokens = tokens, .heads = c.heads, .n = c.n,
                           .k = c.k, .first_row = c.first_row, .head_rows = c.head_rows,
                           .x_stride = c.heads * x_head, .x_head_stride = x_head, .y_stride = c.heads * y_head,
                           .y_head_stride = y_head, .exact_activations = true};
      std::vector<float> y_cpu = y0;
      p.y = y_cpu.data();
      gpu_test::check_ok(run_head_matmul(p, cpu()), "cpu head matmul");
      device_array<float> d_x(x), d_y(y0);
      p.x = d_x.get();
      p.y = d_y.get();
      p.w = device_view;
      p.exact_activations = false;
      gpu_test::check_ok(run_head_matmul(p, gpu()), "gpu head matmul");
      sync();
      const auto y_gpu = d_y.download();
      double worst = 0.0;
      std::size_t gaps_touched = 0;
      for (std::int64_t t = 0; t < tokens; ++t) {
        for (std::int64_t h = 0; h < c.heads; ++h) {
          const float* xr = x.data() + t * c.heads * x_head + h * x_head;
          for (std::int64_t row = 0; row < y_head; ++row) {
            const auto at = static_cast<std::size_t>((t * c.heads + h) * y_head + row);
            if (row >= c.n) {
              gaps_touched += std::isnan(y_gpu[at]) ? 0 : 1;
              continue;
            }
            const float* wr = w.dense.data() + (c.first_row + h * c.head_rows + row) * c.k;
            double squares = 0.0;
            for (std::int64_t j = 0; j < c.k; ++j) squares += static_cast<double>(xr[j]) * wr[j] * xr[j] * wr[j];
            worst = std::max(worst, kernel_cases::matmul_error(y_gpu[at], y_cpu[at], std::sqrt(squares), 0.0));
          }
        }
      }
      // Up to head_matmul_gemv_tokens: f32 products (one GEMV launch); past it a matmul per head.
      const bool tensor_cores =
          tokens > head_matmul_gemv_tokens && cuda_matmul_uses_tensor_cores(c.format, tokens, w.group_size);
      r.check(format("head_matmul {} {} heads {} n {} k {} tokens {} (/ |x.w|2)", c.shape, to_string(c.format),
                     c.heads, c.n, c.k, tokens),
              worst,
              tensor_cores ? kernel_cases::matmul_tensor_core_tolerance : kernel_cases::matmul_f32_tolerance);
      r.check(format("head_matmul {} {} tokens {}: outputs written between heads", c.shape, to_string(c.format), tokens),
              static_cast<double>(gaps_touched), 0.0);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  // --quick (above); --only NAME,NAME,...: those tests only (memcheck's subset).
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg(argv[i]);
    if (arg == "--quick") {
      quick = true;
    } else if (arg == "--only" && i + 1 < argc) {
      only = "," + std::string(argv[++i]) + ",";
    } else {
      std::fprintf(stderr, "usage: edge_gpu_kernels_test [--quick] [--only NAME,NAME,...]\n");
      return gpu_test::exit_cannot_run;
    }
  }
  const auto wanted = [&](const char* name) {
    return only.empty() || only.find("," + std::string(name) + ",") != std::string::npos;
  };
  gpu_test::require_device("kernels_gpu_test");
  thread_pool pool(std::max(2u, std::thread::hardware_concurrency()) - 1);
  pool_ptr = &pool;
  gpu_test::check_cuda(cudaStreamCreate(&cuda_stream), "cudaStreamCreate");
  gpu_test::results r("kernels_gpu_test");
  if (wanted("embedding")) test_embedding(r);
  if (wanted("rmsnorm")) test_rmsnorm(r);
  if (wanted("rope")) test_rope(r);
  if (wanted("silu_mul")) test_silu_mul(r);
  if (wanted("quantize")) test_quantize(r);
  if (wanted("matmul")) test_matmul(r);
  if (wanted("head_matmul")) test_head_matmul(r);
  if (wanted("kv_cache_write")) test_kv_cache_write(r);
  if (wanted("paged_attention")) test_paged_attention(r);
  if (wanted("sampling")) test_sampling(r);
  if (wanted("masked_sampling")) test_masked_sampling(r);
  if (wanted("kv_block_copy")) test_kv_block_copy(r);
  if (wanted("moe_routing")) test_moe_routing(r);
  if (wanted("moe_experts")) test_moe_experts(r);
  if (wanted("mla_attention")) test_mla_attention(r);
  if (wanted("dsa_select")) test_dsa_select(r);
  return r.finish();
}
