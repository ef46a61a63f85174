// GPU benchmarks (printed, never asserted):
//   1. The device-copy bandwidth (cudaMemcpy device to device of 2 GiB, bytes read + written
//      per second): the ceiling the memory-bound kernels are compared with.
//   2. W4A16 and FP8 GEMV at 1, 4 and 8 tokens over Llama-3-8B's matrices (fused gate+up [28672, 4096],
//      down [4096, 14336]), rotating through enough copies that nothing stays in L2: bytes of
//      weights and scales read per second, and that as a fraction of the copy bandwidth.
//   3. FP8 and BF16 KV decode attention (64 sequences x 4096 positions, 32 query / 8 KV heads,
//      head_dim 128, blocks of 16): KV bytes (codes and scales) read per second, and the fraction;
//      and MLA decode attention at Kimi K2's shape (64 heads, latent 512 + RoPE 64, 4096
//      positions, 1 to 64 tokens) over FP8 and BF16 latent rows, likewise.
//   4. The GEMM at 16, 64, 256 and 1024 tokens for int4, fp8 and bf16 weights over the
//      [4096, 14336] down projection: the pipelined tensor-core kernel against the general
//      wmma one on the same call (x rows left unaligned), in weight GB/s and TFLOP/s.
//   5. Causal prefill attention (4 chunks of 512 tokens at 2048 positions, d 128) in TFLOP/s:
//      bf16 and fp8 caches on the tensor-core kernel, an f16 cache on the f32 one.
//   6. Sampling 64 rows of a 128,256-token vocabulary, greedy and through each filter.
//   7. Decode tokens/s of the whole CUDA engine for a synthetic Llama-3-8B (32 layers, hidden
//      4096, 14336, 32/8 heads, vocab 128256; random weights made on the device, embedding and
//      classifier bf16) at 1, 8, 16, 32 and 64 concurrent sequences, each 1024 positions deep,
//      for int4 vs fp8 weights and bf16 vs fp8 KV: CUDA-graph decode steps with greedy sampling
//      on the device, timed over 32 steps after 3 warm-up steps (which capture the graphs).
//   8. The decode shapes a review found slow on Kimi K2: the W4A16 GEMV of few rows (kv_a_proj
//      576 x 7168, Qwen3's k_proj 512 x 2048), split over k; the absorbed MLA projections of 64
//      heads in one launch against a matmul per head; the routed experts of one token (8 of 384,
//      hidden 7168, 2048 wide, INT4) over a grid of the chosen experts; and of a 256-token
//      prefill chunk on the grouped tensor-core GEMM, routed at random (about 5 rows per expert)
//      and with every token on the same 8 experts (256 rows each), in TFLOP/s.
// Every bandwidth is also given as a fraction of the device's HBM peak (H100 SXM 3.35 TB/s,
// H100 PCIe 2.0, H200 4.8; the copy bandwidth above is what a kernel can reach in practice), and
// every TFLOP/s of the dense bf16 peak (989; 756 on the PCIe card).
// Timings are CUDA events (kernels) or the host clock around synchronised steps (engine); each
// figure is the median of 5 repetitions.
#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <random>
#include <cstdio>
#include <string>
#include <vector>

#include "edge/backend/model/model_config.h"
#include "edge/backend/runtime/cuda_executor.h"
#include "edge/common/format.h"
#include "gpu_test_support.h"
#include "kernels/kv_cache_write/kv_cache_write.h"
#include "kernels/matmul/matmul.h"
#include "kernels/mla_attention/mla_attention.h"
#include "kernels/moe_experts/moe_experts.h"
#include "kernels/paged_attention/paged_attention.h"
#include "kernels/quantize/quantize.h"
#include "kernels/sampling/sampling.h"

namespace {

using namespace edge;
using gpu_test::check_cuda;
using gpu_test::check_ok;

constexpr int repetitions = 5;
constexpr double giga = 1e9;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds per call of `body`, by CUDA events over `calls` calls; the median of repetitions.
template <class F>
double time_calls(cudaStream_t stream, int calls, const F& body) {
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  check_cuda(cudaEventCreate(&start), "event");
  check_cuda(cudaEventCreate(&stop), "event");
  body(0);  // warm-up
  std::vector<double> seconds;
  for (int rep = 0; rep < repetitions; ++rep) {
    check_cuda(cudaEventRecord(start, stream), "event");
    for (int i = 0; i < calls; ++i) body(i);
    check_cuda(cudaEventRecord(stop, stream), "event");
    check_cuda(cudaEventSynchronize(stop), "event");
    float ms = 0.0f;
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "event");
    seconds.push_back(static_cast<double>(ms) / 1e3 / calls);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return median(seconds);
}

double copy_bandwidth(cudaStream_t stream) {
  const std::size_t bytes = std::size_t{2} << 30;
  gpu_test::device_array<std::uint8_t> a(bytes), b(bytes);
  check_cuda(cudaMemset(a.get(), 1, bytes), "memset");
  const double s = time_calls(stream, 10, [&](int) {
    check_cuda(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream), "copy");
  });
  return 2.0 * static_cast<double>(bytes) / s;  // read + written
}

// Seconds per matmul call over `copies` distinct [n, k] matrices in format f (enough to cover
// 1 GiB, so every call reads its weights from HBM rather than the 60 MB L2), at each token count,
// with a split-K workspace as the engine gives one. x rows `x_pad` floats longer than k: 0 packs
// them (the executor's layout); 1 leaves them unaligned, which sends 9+ tokens to the general
// wmma GEMM instead of the pipelined one. Also the weight + scale bytes of one matrix.
struct matmul_timing {
  std::vector<double> seconds;  // per token count
  std::size_t matrix_bytes = 0;
};
matmul_timing time_matmul(kernels::weight_format f, std::int64_t n, std::int64_t k,
                          const std::vector<std::int64_t>& token_counts, std::int64_t x_pad, cudaStream_t stream) {
  const kernels::stream s{.where = kernels::device::cuda, .pool = nullptr, .cuda_stream = stream};
  const std::int64_t group = f == kernels::weight_format::int4 ? kernels::int4_group_size_for(k) : 0;
  const auto value_bytes = static_cast<std::size_t>(kernels::weight_values_bytes(f, n, k));
  const auto scale_count = static_cast<std::size_t>(kernels::weight_scale_count(f, n, k, group));
  matmul_timing out;
  out.matrix_bytes = value_bytes + scale_count * sizeof(float);
  const int copies = static_cast<int>(std::max<std::size_t>(4, (std::size_t{1} << 30) / out.matrix_bytes));
  std::vector<std::unique_ptr<gpu_test::device_array<std::uint8_t>>> values;
  std::vector<std::unique_ptr<gpu_test::device_array<float>>> scales;
  {
    // One random matrix quantized on the device, copied.
    gpu_test::device_array<float> dense(static_cast<std::size_t>(n * k));
    gpu_test::device_array<float> x_init(gpu_test::random_floats(static_cast<std::size_t>(std::min<std::int64_t>(n * k, 1 << 24)), 1));
    for (std::int64_t at = 0; at < n * k; at += static_cast<std::int64_t>(x_init.size())) {
      const auto count = std::min<std::int64_t>(static_cast<std::int64_t>(x_init.size()), n * k - at);
      check_cuda(cudaMemcpy(dense.get() + at, x_init.get(), static_cast<std::size_t>(count) * sizeof(float), cudaMemcpyDeviceToDevice), "copy");
    }
    for (int c = 0; c < copies; ++c) {
      values.push_back(std::make_unique<gpu_test::device_array<std::uint8_t>>(value_bytes));
      scales.push_back(std::make_unique<gpu_test::device_array<float>>(scale_count));
      check_ok(kernels::run_quantize({.x = dense.get(), .rows = n, .k = k, .x_stride = k, .format = f, .group_size = group,
                                      .values = values.back()->get(), .scales = scales.back()->get()},
                                     s),
               "quantize");
    }
  }
  const std::int64_t most = *std::max_element(token_counts.begin(), token_counts.end());
  const std::int64_t workspace_floats = kernels::matmul_workspace_floats(most, n);
  gpu_test::device_array<float> workspace(static_cast<std::size_t>(workspace_floats));
  for (const std::int64_t tokens : token_counts) {
    const std::int64_t x_stride = k + x_pad;
    gpu_test::device_array<float> x(gpu_test::random_floats(static_cast<std::size_t>(tokens * x_stride), 2));  // [tokens, x_stride]
    gpu_test::device_array<float> y(static_cast<std::size_t>(tokens * n));                                    // [tokens, n]
    out.seconds.push_back(time_calls(stream, std::min(copies * 4, 64), [&](int i) {
      const auto c = static_cast<std::size_t>(i % copies);
      check_ok(kernels::run_matmul({.x = x.get(),
                                    .w = {.format = f, .values = values[c]->get(), .scales = scales[c]->get(), .group_size = group},
                                    .y = y.get(), .tokens = tokens, .n = n, .k = k, .x_stride = x_stride, .y_stride = n,
                                    .workspace = workspace.get(), .workspace_floats = workspace_floats},
                                   s),
               "matmul");
    }));
  }
  return out;
}

// One paged-attention call timed: `seqs` sequences with `context` positions each (32 query / 8 KV
// heads, head_dim 128, blocks of 16, handed out scattered), the last `chunk` positions of each
// as the queries (1: decode), in runs, with a split workspace as the executor gives one
// (sized for 64 tokens). Returns seconds per call, the KV bytes the call reads at least once,
// and the (query, visible key) pairs it scores.
struct attention_timing {
  double seconds = 0.0;
  double kv_bytes = 0.0;
  double visible = 0.0;
};
attention_timing time_attention(kernels::dtype type, std::int64_t seqs, std::int64_t context, std::int64_t chunk,
                                int calls, cudaStream_t stream) {
  const kernels::stream s{.where = kernels::device::cuda, .pool = nullptr, .cuda_stream = stream};
  constexpr std::int64_t heads = 32, kv_heads = 8, head_dim = 128, block = 16;
  const std::int64_t blocks_per_seq = context / block;
  const std::int64_t num_blocks = seqs * blocks_per_seq;
  const std::int64_t tokens = seqs * chunk;
  const std::size_t cache_bytes = static_cast<std::size_t>(num_blocks * kv_heads * block * head_dim) * kernels::dtype_size(type);
  const std::size_t scale_count = static_cast<std::size_t>(num_blocks * kv_heads * block);
  const bool scaled = kernels::kv_cache_scaled(type);
  gpu_test::device_array<std::uint8_t> kc(cache_bytes), vc(cache_bytes);
  gpu_test::device_array<float> ks(std::vector<float>(scale_count, 0.01f)), vs(std::vector<float>(scale_count, 0.01f));
  // Codes of moderate magnitude everywhere (0x30 is 0.5 in E4M3 and a small 16-bit pattern).
  check_cuda(cudaMemset(kc.get(), 0x30, cache_bytes), "memset");
  check_cuda(cudaMemset(vc.get(), 0x30, cache_bytes), "memset");
  std::vector<std::int32_t> tables(static_cast<std::size_t>(num_blocks));
  for (std::int64_t i = 0; i < num_blocks; ++i) tables[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 7919) % num_blocks);
  std::vector<std::int32_t> table_begin(static_cast<std::size_t>(seqs + 1)), runs(static_cast<std::size_t>(seqs + 1));
  std::vector<std::int32_t> seq(static_cast<std::size_t>(tokens)), pos(static_cast<std::size_t>(tokens));
  attention_timing out;
  for (std::int64_t q = 0; q <= seqs; ++q) {
    table_begin[static_cast<std::size_t>(q)] = static_cast<std::int32_t>(q * blocks_per_seq);
    runs[static_cast<std::size_t>(q)] = static_cast<std::int32_t>(q * chunk);
  }
  for (std::int64_t q = 0; q < seqs; ++q) {
    for (std::int64_t i = 0; i < chunk; ++i) {
      seq[static_cast<std::size_t>(q * chunk + i)] = static_cast<std::int32_t>(q);
      pos[static_cast<std::size_t>(q * chunk + i)] = static_cast<std::int32_t>(context - chunk + i);
      out.visible += static_cast<double>(context - chunk + i + 1);
    }
  }
  gpu_test::device_array<std::int32_t> d_tables(tables), d_table_begin(table_begin), d_seq(seq), d_pos(pos), d_runs(runs);
  gpu_test::device_array<float> q(gpu_test::random_floats(static_cast<std::size_t>(tokens * heads * head_dim), 3));
  gpu_test::device_array<float> result(static_cast<std::size_t>(tokens * heads * head_dim));
  const std::int64_t workspace_floats = kernels::paged_attention_workspace_floats(64, heads, head_dim);
  gpu_test::device_array<float> workspace(static_cast<std::size_t>(workspace_floats));
  out.seconds = time_calls(stream, calls, [&](int) {
    check_ok(kernels::run_paged_attention(
                 {.q = q.get(), .out = result.get(), .k_cache = kc.get(), .v_cache = vc.get(),
                  .k_scales = scaled ? ks.get() : nullptr, .v_scales = scaled ? vs.get() : nullptr, .kv_type = type,
                  .seq = d_seq.get(), .pos = d_pos.get(), .block_tables = d_tables.get(),
                  .table_begin = d_table_begin.get(), .tokens = tokens, .num_heads = heads, .num_kv_heads = kv_heads,
                  .head_dim = head_dim, .block_size = block, .num_blocks = num_blocks, .q_stride = heads * head_dim,
                  .out_stride = heads * head_dim, .scale = 0.088f, .seq_token_begin = d_runs.get(), .num_seqs = seqs,
                  .max_seq_tokens = chunk, .workspace = workspace.get(), .workspace_floats = workspace_floats},
                 s),
             "attention");
  });
  out.kv_bytes = 2.0 * static_cast<double>(cache_bytes) + (scaled ? 2.0 * static_cast<double>(scale_count) * 4 : 0.0);
  return out;
}

// One MLA decode attention call timed at Kimi K2's shape (64 heads, latent 512 + RoPE 64, blocks
// of 16 handed out scattered): `batch` tokens, each the last position of its own `context`-deep
// sequence, with the split workspace the executor gives (sized for 8 tokens). Consecutive calls
// take the next `batch` of 64 sequences, so that even one token's rows (2.4 MB in FP8) come from
// HBM, not from the 60 MB L2. Returns seconds per call and the cache bytes (rows and scales) one
// call reads.
struct mla_timing {
  double seconds = 0.0;
  double bytes = 0.0;
};
mla_timing time_mla_decode(kernels::dtype type, std::int64_t batch, std::int64_t context, cudaStream_t stream) {
  const kernels::stream s{.where = kernels::device::cuda, .pool = nullptr, .cuda_stream = stream};
  constexpr std::int64_t sequences = 64, heads = 64, latent = 512, rope = 64, block = 16;
  constexpr std::int64_t width = latent + rope;
  const std::int64_t blocks_per_seq = context / block;
  const std::int64_t num_blocks = sequences * blocks_per_seq;
  const std::size_t cache_bytes = static_cast<std::size_t>(num_blocks * block * width) * kernels::dtype_size(type);
  const std::size_t scale_count = static_cast<std::size_t>(num_blocks * block);
  const bool scaled = kernels::kv_cache_scaled(type);
  gpu_test::device_array<std::uint8_t> cache(cache_bytes);
  gpu_test::device_array<float> scales(std::vector<float>(scale_count, 0.01f));
  // Codes of moderate magnitude everywhere (0x30 is 0.5 in E4M3 and a small 16-bit pattern).
  check_cuda(cudaMemset(cache.get(), 0x30, cache_bytes), "memset");
  std::vector<std::int32_t> tables(static_cast<std::size_t>(num_blocks));
  for (std::int64_t i = 0; i < num_blocks; ++i) tables[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 7919) % num_blocks);
  std::vector<std::int32_t> table_begin(static_cast<std::size_t>(sequences + 1));
  for (std::int64_t q = 0; q <= sequences; ++q) table_begin[static_cast<std::size_t>(q)] = static_cast<std::int32_t>(q * blocks_per_seq);
  // The sequences of each call: rotation r takes sequences r batch .. r batch + batch - 1.
  const std::int64_t rotations = sequences / batch;
  std::vector<std::int32_t> seq(static_cast<std::size_t>(rotations * batch));
  std::iota(seq.begin(), seq.end(), 0);
  const std::vector<std::int32_t> pos(static_cast<std::size_t>(batch), static_cast<std::int32_t>(context - 1));
  gpu_test::device_array<std::int32_t> d_tables(tables), d_table_begin(table_begin), d_seq(seq), d_pos(pos);
  gpu_test::device_array<float> q_latent(gpu_test::random_floats(static_cast<std::size_t>(batch * heads * latent), 4));
  gpu_test::device_array<float> q_rope(gpu_test::random_floats(static_cast<std::size_t>(batch * heads * rope), 5));
  gpu_test::device_array<float> out(static_cast<std::size_t>(batch * heads * latent));
  const std::int64_t workspace_floats = kernels::mla_attention_workspace_floats(8, heads, latent);
  gpu_test::device_array<float> workspace(static_cast<std::size_t>(workspace_floats));
  mla_timing timing;
  timing.seconds = time_calls(stream, static_cast<int>(std::max<std::int64_t>(rotations, 20)), [&](int call) {
    check_ok(kernels::run_mla_attention(
                 {.q_latent = q_latent.get(), .q_rope = q_rope.get(), .out = out.get(), .cache = cache.get(),
                  .scales = scaled ? scales.get() : nullptr, .kv_type = type,
                  .seq = d_seq.get() + (call % rotations) * batch, .pos = d_pos.get(), .block_tables = d_tables.get(),
                  .table_begin = d_table_begin.get(), .tokens = batch, .num_heads = heads, .latent_dim = latent,
                  .rope_dim = rope, .block_size = block, .num_blocks = num_blocks, .q_latent_stride = heads * latent,
                  .q_rope_stride = heads * rope, .q_rope_head_stride = rope, .out_stride = heads * latent,
                  .scale = 0.072f, .workspace = workspace.get(), .workspace_floats = workspace_floats},
                 s),
             "mla attention");
  });
  timing.bytes = static_cast<double>(batch * context) *
                 static_cast<double>(width * static_cast<std::int64_t>(kernels::dtype_size(type)) + (scaled ? 4 : 0));
  return timing;
}

// Sampling 64 rows of a 128,256-token vocabulary: microseconds per call, greedy (one pass over
// the rows: the floor) and seeded draws through each filter, with the copy that restores the
// logits (sampling uses them as scratch) timed alone and subtracted.
void sampling_times(cudaStream_t stream) {
  const kernels::stream s{.where = kernels::device::cuda, .pool = nullptr, .cuda_stream = stream};
  constexpr std::int64_t rows = 64, vocab = 128256;
  const auto count = static_cast<std::size_t>(rows * vocab);
  gpu_test::device_array<float> pristine(gpu_test::random_floats(count, 21, -8.0f, 8.0f));
  gpu_test::device_array<float> logits(count);
  gpu_test::device_array<std::int32_t> out(static_cast<std::size_t>(rows));
  const auto restore = [&] {
    check_cuda(cudaMemcpyAsync(logits.get(), pristine.get(), count * sizeof(float), cudaMemcpyDeviceToDevice, stream),
               "restore");
  };
  const double copy = time_calls(stream, 20, [&](int) { restore(); });
  const std::vector<std::pair<std::string, kernels::sampling_row>> configs = {
      {"greedy", {.temperature = 0.0f}},
      {"temperature 1", {.temperature = 1.0f, .uniform = 0.37f}},
      {"top_k 50", {.temperature = 0.8f, .top_k = 50, .uniform = 0.37f}},
      {"top_p 0.9", {.temperature = 0.8f, .top_p = 0.9f, .uniform = 0.37f}},
      {"top_k 50, top_p 0.95, min_p 0.05", {.temperature = 0.6f, .top_k = 50, .top_p = 0.95f, .min_p = 0.05f, .uniform = 0.37f}},
  };
  std::printf("\n| sampling, 64 rows x vocab 128256 | us per call | x greedy |\n|---|---|---|\n");
  double greedy = 0.0;
  for (const auto& [name, row] : configs) {
    gpu_test::device_array<kernels::sampling_row> config(std::vector<kernels::sampling_row>(rows, row));
    const double seconds = time_calls(stream, 20, [&](int) {
                             restore();
                             check_ok(kernels::run_sampling({.logits = logits.get(), .config = config.get(),
                                                             .out = out.get(), .rows = rows, .vocab = vocab},
                                                            s),
                                      "sampling");
                           }) - copy;
    if (greedy == 0.0) greedy = seconds;
    std::printf("| %s | %.1f | %.1f |\n", name.c_str(), seconds * 1e6, seconds / greedy);
  }
}

backend::model_config llama3_8b() {
  backend::model_config c;
  c.vocab_size = 128256;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_layers = 32;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.max_position = 8192;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.rope = backend::rope_layout::half_split;
  return c;
}

// Decode tokens/s at each batch size for one weight format and KV dtype.
std::vector<double> engine_decode(kernels::weight_format weights, kernels::dtype kv, const std::vector<std::int64_t>& batches) {
  constexpr std::int64_t context = 1024, warmup = 3, steps = 32, block = 16;
  const backend::model_config config = llama3_8b();
  const std::int64_t max_batch = *std::max_element(batches.begin(), batches.end());
  const std::int64_t blocks_per_seq = (context + warmup + steps + block) / block + 1;
  const std::size_t kv_bytes = static_cast<std::size_t>(max_batch * blocks_per_seq + 2) *
                               backend::kv_cache_layout::for_budget(config, kv, block, 0).bytes_per_block();
  auto created = backend::cuda_executor::create_synthetic(
      config, weights, 7, {.max_batch_tokens = max_batch, .max_sequences = max_batch, .kv_dtype = kv, .block_size = block,
                           .kv_cache_bytes = kv_bytes});
  check_ok(created.ok() ? status{} : created.error(), "create_synthetic");
  backend::cuda_executor& exec = **created;
  std::printf("  %s weights, %s KV: %s\n", std::string(kernels::to_string(weights)).c_str(),
              std::string(kernels::to_string(kv)).c_str(), exec.describe().c_str());
  check_ok(exec.fill_kv_random(11), "fill_kv_random");
  std::vector<std::vector<std::int32_t>> tables(static_cast<std::size_t>(max_batch));
  for (std::int64_t s = 0; s < max_batch; ++s) {
    for (std::int64_t b = 0; b < blocks_per_seq; ++b) tables[static_cast<std::size_t>(s)].push_back(static_cast<std::int32_t>(s * blocks_per_seq + b));
  }
  std::vector<double> rates;
  for (const std::int64_t batch : batches) {
    std::vector<std::vector<std::int32_t>> ids(static_cast<std::size_t>(batch), std::vector<std::int32_t>{1});
    const std::vector<backend::row_sampling> config_rows(static_cast<std::size_t>(batch),
                                                         backend::row_sampling{.config = {.temperature = 0.0f}});
    std::vector<std::int32_t> out(static_cast<std::size_t>(batch));
    const auto step = [&](std::int64_t position) {
      backend::batch_plan plan;
      for (std::int64_t s = 0; s < batch; ++s) {
        plan.entries.push_back({.tokens = ids[static_cast<std::size_t>(s)], .start_position = position,
                                .block_table = tables[static_cast<std::size_t>(s)], .compute_logits = true});
      }
      check_ok(exec.forward_sample(plan, config_rows, out, {}, {}), "decode step");
      for (std::int64_t s = 0; s < batch; ++s) ids[static_cast<std::size_t>(s)][0] = out[static_cast<std::size_t>(s)];
    };
    for (std::int64_t i = 0; i < warmup; ++i) step(context + i);
    std::vector<double> per_rep;
    for (int rep = 0; rep < repetitions; ++rep) {
      const auto start = std::chrono::steady_clock::now();
      for (std::int64_t i = 0; i < steps; ++i) step(context + warmup + i);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      per_rep.push_back(static_cast<double>(batch * steps) / seconds);
    }
    rates.push_back(median(per_rep));
  }
  return rates;
}

}  // namespace

namespace {

// The published peaks of the device: HBM bytes per second and dense bf16 tensor FLOP/s (0 when
// the device is not one of these: its fractions are then left out).
struct device_peaks {
  double hbm = 0.0;
  double bf16 = 0.0;
};
device_peaks peaks_of(const cudaDeviceProp& p) {
  const std::string name = p.name;
  if (name.find("H200") != std::string::npos) return {4.8e12, 989e12};
  if (name.find("H100") != std::string::npos && name.find("PCIe") != std::string::npos) return {2.0e12, 756e12};
  if (name.find("H100") != std::string::npos) return {3.35e12, 989e12};
  return {};
}
device_peaks peaks;
double of_peak(double rate, double peak) { return peak > 0.0 ? rate / peak : 0.0; }

// Random weights [n, k] quantized on the device.
struct device_matrix {
  std::unique_ptr<gpu_test::device_array<std::uint8_t>> values;
  std::unique_ptr<gpu_test::device_array<float>> scales;
  kernels::weight_view view;
  std::size_t bytes = 0;
};
device_matrix make_matrix(kernels::weight_format f, std::int64_t n, std::int64_t k, std::uint32_t seed,
                          const kernels::stream& s) {
  device_matrix m;
  const std::int64_t group = f == kernels::weight_format::int4 ? kernels::int4_group_size_for(k) : 0;
  m.values = std::make_unique<gpu_test::device_array<std::uint8_t>>(
      static_cast<std::size_t>(kernels::weight_values_bytes(f, n, k)));
  m.scales = std::make_unique<gpu_test::device_array<float>>(
      static_cast<std::size_t>(kernels::weight_scale_count(f, n, k, group)));
  gpu_test::device_array<float> dense(gpu_test::random_floats(static_cast<std::size_t>(n * k), seed));
  check_ok(kernels::run_quantize({.x = dense.get(), .rows = n, .k = k, .x_stride = k, .format = f, .group_size = group,
                                  .values = m.values->get(), .scales = m.scales->get()},
                                 s),
           "quantize");
  m.view = {.format = f, .values = m.values->get(), .scales = m.scales->get(), .group_size = group};
  m.bytes = m.values->size() + m.scales->size() * sizeof(float);
  return m;
}

// Kimi K2's absorbed projections (INT4): every head in one launch against a matmul per head.
void head_matmul_times(cudaStream_t stream) {
  const kernels::stream s{.where = kernels::device::cuda, .pool = nullptr, .cuda_stream = stream};
  constexpr std::int64_t heads = 64;
  struct shape {
    const char* name;
    std::int64_t n, k, first_row, head_rows;
  };
  std::printf("\n| Kimi K2 absorbed projection, 64 heads, int4 | tokens | one launch (us) | a matmul per head (us) | "
              "speed-up |\n|---|---|---|---|---|\n");
  for (const shape& sh : {shape{"q_nope through W_UK^T (512 x 128 a head)", 512, 128, 0, 512},
                          shape{"latent through W_UV (128 x 512 a head)", 128, 512, 128, 256}}) {
    const device_matrix w = make_matrix(kernels::weight_format::int4, sh.first_row + (heads - 1) * sh.head_rows + sh.n,
                                        sh.k, 7, s);
    for (const std::int64_t tokens : {1, 8, 64}) {
      gpu_test::device_array<float> x(gpu_test::random_floats(static_cast<std::size_t>(tokens * heads * sh.k), 8));
      gpu_test::device_array<float> y(static_cast<std::size_t>(tokens * heads * sh.n));
      const kernels::head_matmul_params p{.x = x.get(), .w = w.view, .y = y.get(), .tokens = tokens, .heads = heads,
                                          .n = sh.n, .k = sh.k, .first_row = sh.first_row, .head_rows = sh.head_rows,
                                          .x_stride = heads * sh.k, .x_head_stride = sh.k, .y_stride = heads * sh.n,
                                          .y_head_stride = sh.n};
      const double one = time_calls(stream, 50, [&](int) { check_ok(kernels::run_head_matmul(p, s), "head matmul"); });
      const double each = time_calls(stream, 10, [&](int) {
        for (std::int64_t h = 0; h < heads; ++h) {
          check_ok(kernels::run_matmul({.x = x.get() + h * sh.k,
                                        .w = kernels::weight_rows_from(w.view, sh.first_row + h * sh.head_rows, sh.k),
                                        .y = y.get() + h * sh.n, .tokens = tokens, .n = sh.n, .k = sh.k,
                                        .x_stride = heads * sh.k, .y_stride = heads * sh.n},
                                       s),
                   "matmul");
        }
      });
      std::printf("| %s | %lld | %.1f | %.1f | %.1f |\n", sh.name, static_cast<long long>(tokens), one * 1e6, each * 1e6,
                  each / one);
    }
  }
}

// One token through Kimi K2's routed experts (8 of 384, hidden 7168, 2048 wide, INT4): the
// grid covers the 8 chosen. The 384 views share 8 real experts' weights (only chosen experts
// are read, so the bytes read are the 8's, all distinct).
void moe_decode_times(cudaStream_t stream, double copy) {
  const kernels::stream s{.where = kernels::device::cuda, .pool = nullptr, .cuda_stream = stream};
  constexpr std::int64_t hidden = 7168, inter = 2048, experts = 384, top_k = 8;
  std::vector<device_matrix> gate_up, down;
  std::size_t bytes = 0;
  for (std::int64_t e = 0; e < top_k; ++e) {
    gate_up.push_back(make_matrix(kernels::weight_format::int4, 2 * inter, hidden, 20 + static_cast<std::uint32_t>(e), s));
    down.push_back(make_matrix(kernels::weight_format::int4, hidden, inter, 40 + static_cast<std::uint32_t>(e), s));
    bytes += gate_up.back().bytes + down.back().bytes;
  }
  std::vector<kernels::moe_expert_weights> views(static_cast<std::size_t>(experts));
  for (std::int64_t e = 0; e < experts; ++e) {
    views[static_cast<std::size_t>(e)] = {.gate = gate_up[static_cast<std::size_t>(e % top_k)].view, .up = {},
                                          .down = down[static_cast<std::size_t>(e % top_k)].view};
  }
  gpu_test::device_array<kernels::moe_expert_weights> device_views(views);
  // The token's experts: 8 ids far apart whose views are the 8 distinct matrices.
  std::vector<std::int32_t> chosen(top_k);
  for (std::int64_t i = 0; i < top_k; ++i) chosen[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i + top_k * (5 * i));
  gpu_test::device_array<std::int32_t> ids(chosen);
  gpu_test::device_array<float> weights(std::vector<float>(top_k, 0.125f));
  gpu_test::device_array<float> x(gpu_test::random_floats(hidden, 9)), out(hidden);
  const std::int64_t workspace_floats = kernels::moe_experts_workspace_floats(1, top_k, experts, hidden, inter);
  gpu_test::device_array<float> workspace(static_cast<std::size_t>(workspace_floats));
  const double seconds = time_calls(stream, 50, [&](int) {
    check_ok(kernels::run_moe_experts({.x = x.get(), .experts = ids.get(), .weights = weights.get(),
                                       .matrices = views.data(), .out = out.get(), .tokens = 1, .top_k = top_k,
                                       .num_experts = experts, .hidden = hidden, .intermediate = inter,
                                       .x_stride = hidden, .out_stride = hidden, .workspace = workspace.get(),
                                       .workspace_floats = workspace_floats,
                                       .device_matrices = device_views.get()},
                                      s),
             "moe experts");
  });
  const double rate = static_cast<double>(bytes) / seconds;
  std::printf("\n| Kimi K2 routed experts, 1 token, 8 of 384, int4 | us | GB/s | of copy | of HBM peak | grid blocks |\n"
              "|---|---|---|---|---|---|\n| gate-up + down | %.1f | %.0f | %.2f | %.2f | %lld (a grid over every expert: %lld) |\n",
              seconds * 1e6, rate / giga, rate / copy, of_peak(rate, peaks.hbm),
              static_cast<long long>(kernels::moe_grouped_blocks(2 * inter, 1, top_k, experts) +
                                     kernels::moe_grouped_blocks(hidden, 1, top_k, experts)),
              static_cast<long long>((2 * inter / 4 + hidden / 4) * experts));

  // A prefill chunk of 256 tokens (moe_experts_chunk_tokens), 8 choices each.
  constexpr std::int64_t tokens = kernels::moe_experts_chunk_tokens;
  const std::int64_t chunk_floats = kernels::moe_experts_workspace_floats(tokens, top_k, experts, hidden, inter);
  gpu_test::device_array<float> chunk_workspace(static_cast<std::size_t>(chunk_floats));
  gpu_test::device_array<float> chunk_x(gpu_test::random_floats(tokens * hidden, 10)), chunk_out(tokens * hidden);
  gpu_test::device_array<float> chunk_weights(std::vector<float>(tokens * top_k, 0.125f));
  std::mt19937 rng(11);
  std::printf("\n| Kimi K2 routed experts, %lld tokens, 8 of 384, int4 | experts chosen | rows each | us | TFLOP/s | "
              "of bf16 peak |\n|---|---|---|---|---|---|\n",
              static_cast<long long>(tokens));
  for (const bool spread : {true, false}) {
    std::vector<std::int32_t> routed(static_cast<std::size_t>(tokens * top_k));
    std::vector<int> seen(static_cast<std::size_t>(experts), 0);
    for (std::int64_t t = 0; t < tokens; ++t) {
      std::vector<std::int32_t> all(static_cast<std::size_t>(experts));
      std::iota(all.begin(), all.end(), 0);
      if (spread) std::shuffle(all.begin(), all.end(), rng);  // else the 8 of the decode row, for every token
      for (std::int64_t i = 0; i < top_k; ++i) {
        const std::int32_t e = spread ? all[static_cast<std::size_t>(i)] : chosen[static_cast<std::size_t>(i)];
        routed[static_cast<std::size_t>(t * top_k + i)] = e;
        seen[static_cast<std::size_t>(e)] = 1;
      }
    }
    gpu_test::device_array<std::int32_t> chunk_ids(routed);
    const double chunk_seconds = time_calls(stream, 10, [&](int) {
      check_ok(kernels::run_moe_experts({.x = chunk_x.get(), .experts = chunk_ids.get(), .weights = chunk_weights.get(),
                                         .matrices = views.data(), .out = chunk_out.get(), .tokens = tokens,
                                         .top_k = top_k, .num_experts = experts, .hidden = hidden,
                                         .intermediate = inter, .x_stride = hidden, .out_stride = hidden,
                                         .workspace = chunk_workspace.get(), .workspace_floats = chunk_floats,
                                         .device_matrices = device_views.get()},
                                        s),
               "moe experts (prefill)");
    });
    const int chosen_count = std::accumulate(seen.begin(), seen.end(), 0);
    const double flops = 2.0 * static_cast<double>(tokens * top_k) * static_cast<double>(3 * inter * hidden);
    std::printf("| %s | %d | %.1f | %.1f | %.1f | %.2f |\n", spread ? "routed at random" : "every token on the same 8",
                chosen_count, static_cast<double>(tokens * top_k) / chosen_count, chunk_seconds * 1e6,
                flops / chunk_seconds / 1e12, of_peak(flops / chunk_seconds, peaks.bf16));
  }
}

}  // namespace

int main() {
  const cudaDeviceProp device = gpu_test::require_device("decode_bench_gpu");
  peaks = peaks_of(device);
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreate(&stream), "stream");

  const double copy = copy_bandwidth(stream);
  std::printf("\ndevice copy bandwidth (read + write): %.0f GB/s (%.2f of the %.0f GB/s HBM peak)\n\n", copy / giga,
              of_peak(copy, peaks.hbm), peaks.hbm / giga);

  // Weight bytes per second at 1, 4 and 8 tokens: decode's GEMV reads each weight once for
  // every token of the step, so the share should stay near the one-token figure up to 8.
  // 576 x 7168 (Kimi K2's kv_a_proj) and 512 x 2048 (Qwen3-30B-A3B's k_proj): few rows, split
  // over k (matmul_split_count).
  std::printf("| kernel (decode) | shape | tokens | GB/s | fraction of copy bandwidth | of HBM peak |\n"
              "|---|---|---|---|---|---|\n");
  for (const auto f : {kernels::weight_format::int4, kernels::weight_format::fp8_e4m3}) {
    for (const auto& [n, k] : std::vector<std::pair<std::int64_t, std::int64_t>>{
             {28672, 4096}, {4096, 14336}, {6144, 4096}, {576, 7168}, {512, 2048}}) {
      const std::vector<std::int64_t> token_counts = {1, 4, 8};
      const matmul_timing timing = time_matmul(f, n, k, token_counts, 0, stream);
      for (std::size_t i = 0; i < token_counts.size(); ++i) {
        const double rate = static_cast<double>(timing.matrix_bytes) / timing.seconds[i];
        std::printf("| %s GEMV | [%lld, %lld] | %lld | %.0f | %.2f | %.2f |\n",
                    f == kernels::weight_format::int4 ? "W4A16" : "W8A16 (fp8)", static_cast<long long>(n),
                    static_cast<long long>(k), static_cast<long long>(token_counts[i]), rate / giga, rate / copy,
                    of_peak(rate, peaks.hbm));
      }
    }
  }
  for (const auto kv : {kernels::dtype::fp8_e4m3, kernels::dtype::bf16}) {
    const attention_timing decode = time_attention(kv, 64, 4096, 1, 20, stream);
    const double bw = decode.kv_bytes / decode.seconds;
    std::printf("| %s KV decode attention | 64 seqs x 4096 positions, 32/8 heads, d 128 | 64 | %.0f | %.2f |\n",
                std::string(kernels::to_string(kv)).c_str(), bw / giga, bw / copy);
  }
  // Latent attention reads one row per position for all heads; at 64 heads its FLOPs per byte
  // are high enough (about 240 per FP8 byte) that the tensor cores set the pace.
  for (const auto kv : {kernels::dtype::fp8_e4m3, kernels::dtype::bf16}) {
    for (const std::int64_t batch : {1, 8, 32, 64}) {
      const mla_timing decode = time_mla_decode(kv, batch, 4096, stream);
      const double bw = decode.bytes / decode.seconds;
      std::printf("| %s KV MLA decode attention | Kimi K2: 64 heads, latent 512 + RoPE 64, 4096 positions | %lld | %.0f | %.2f |\n",
                  std::string(kernels::to_string(kv)).c_str(), static_cast<long long>(batch), bw / giga, bw / copy);
    }
  }

  head_matmul_times(stream);
  moe_decode_times(stream, copy);

  // The GEMM at 16 to 1024 tokens (batched decode to prefill) over the [4096, 14336] down
  // projection: the pipelined kernel against the general wmma one, run on the same call with
  // unaligned x rows. Weight bytes per second (what bounds batched decode) and TFLOP/s (what
  // bounds prefill).
  std::printf("\n| GEMM [4096, 14336] | tokens | pipelined GB/s | TFLOP/s | of bf16 peak | wmma TFLOP/s | pipelined / wmma |\n"
              "|---|---|---|---|---|---|---|\n");
  for (const auto f : {kernels::weight_format::int4, kernels::weight_format::fp8_e4m3, kernels::weight_format::bf16}) {
    const std::vector<std::int64_t> token_counts = {16, 64, 256, 1024};
    const matmul_timing pipelined = time_matmul(f, 4096, 14336, token_counts, 0, stream);
    const matmul_timing general = time_matmul(f, 4096, 14336, token_counts, 1, stream);
    for (std::size_t i = 0; i < token_counts.size(); ++i) {
      const double flops = 2.0 * static_cast<double>(token_counts[i]) * 4096.0 * 14336.0;
      std::printf("| %s | %lld | %.0f | %.1f | %.2f | %.1f | %.2f |\n", std::string(kernels::to_string(f)).c_str(),
                  static_cast<long long>(token_counts[i]),
                  static_cast<double>(pipelined.matrix_bytes) / pipelined.seconds[i] / giga,
                  flops / pipelined.seconds[i] / 1e12, of_peak(flops / pipelined.seconds[i], peaks.bf16),
                  flops / general.seconds[i] / 1e12, general.seconds[i] / pipelined.seconds[i]);
    }
  }
  std::printf("\n");

  std::printf("| prefill attention, 4 x 512 tokens at 2048 positions, 32/8 heads, d 128 | TFLOP/s |\n|---|---|\n");
  // Causal prefill: 4 chunks of 512 tokens at the end of 2048-position contexts; FLOP/s of the
  // QKᵀ and PV products (2 · 2 · heads · head_dim per visible key and query).
  const auto prefill_flops = [&](kernels::dtype kv) {
    const attention_timing prefill = time_attention(kv, 4, 2048, 512, 10, stream);
    return 4.0 * 32.0 * 128.0 * prefill.visible / prefill.seconds;
  };
  const double f16_flops = prefill_flops(kernels::dtype::f16);
  for (const auto kv : {kernels::dtype::bf16, kernels::dtype::fp8_e4m3}) {
    const double flops = prefill_flops(kv);
    std::printf("| %s KV (tensor cores) | %.1f (%.1fx the f32 kernel on f16) |\n", std::string(kernels::to_string(kv)).c_str(),
                flops / 1e12, flops / f16_flops);
  }
  std::printf("| f16 KV (f32 kernel) | %.1f |\n", f16_flops / 1e12);

  sampling_times(stream);

  const std::vector<std::int64_t> batches = {1, 8, 16, 32, 64};
  std::printf("\nsynthetic Llama-3-8B decode, 1024 positions per sequence:\n");
  std::vector<std::pair<std::string, std::vector<double>>> rows;
  for (const auto weights : {kernels::weight_format::int4, kernels::weight_format::fp8_e4m3}) {
    for (const auto kv : {kernels::dtype::bf16, kernels::dtype::fp8_e4m3}) {
      rows.emplace_back(format("{} weights, {} KV", kernels::to_string(weights), kernels::to_string(kv)),
                        engine_decode(weights, kv, batches));
    }
  }
  std::printf("\n| decode tokens/s | 1 | 8 | 16 | 32 | 64 |\n|---|---|---|---|---|---|\n");
  for (const auto& [name, rates] : rows) {
    std::printf("| %s |", name.c_str());
    for (double r : rates) std::printf(" %.0f |", r);
    std::printf("\n");
  }
  std::printf("\n| int4 / fp8 weights | 1 | 8 | 16 | 32 | 64 |\n|---|---|---|---|---|---|\n");
  for (int kv = 0; kv < 2; ++kv) {
    std::printf("| %s KV |", kv == 0 ? "bf16" : "fp8");
    for (std::size_t i = 0; i < batches.size(); ++i) std::printf(" %.2f |", rows[static_cast<std::size_t>(kv)].second[i] / rows[static_cast<std::size_t>(2 + kv)].second[i]);
    std::printf("\n");
  }
  std::printf("\n| fp8 / bf16 KV | 1 | 8 | 16 | 32 | 64 |\n|---|---|---|---|---|---|\n");
  for (int w = 0; w < 2; ++w) {
    std::printf("| %s weights |", w == 0 ? "int4" : "fp8");
    for (std::size_t i = 0; i < batches.size(); ++i) std::printf(" %.2f |", rows[static_cast<std::size_t>(2 * w + 1)].second[i] / rows[static_cast<std::size_t>(2 * w)].second[i]);
    std::printf("\n");
  }
  cudaStreamDestroy(stream);
  return 0;
}
