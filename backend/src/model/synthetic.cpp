#include "edge/backend/model/synthetic.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <numbers>
#include <span>
#include <utility>
#include <vector>

#include "backend/src/tokenizer/synthetic_tokenizer.h"
#include "edge/backend/io/dtype_names.h"
#include "edge/backend/io/gguf.h"
#include "edge/backend/io/mapped_file.h"
#include "edge/backend/io/output_files.h"
#include "edge/backend/io/safetensors.h"
#include "edge/backend/model/formats.h"
#include "edge/backend/model/model_plan.h"
#include "edge/common/format.h"
#include "edge/common/json_fields.h"
#include "edge/common/json_text.h"
#include "edge/common/splitmix64.h"
#include "edge/kernels/numerics.h"
#include "hf_config_text.h"
#include "model_checks.h"
#include "rope_row_order.h"
#include "tensor_schema.h"

namespace edge::backend {
namespace {

namespace fs = std::filesystem;

// Uniform on [-w, w] has the standard deviation w / sqrt(3): this matches N(0, 0.02), the
// initialisation Llama-family models are trained from.
constexpr double weight_std = 0.02;
constexpr float weight_half_width = static_cast<float>(weight_std * std::numbers::sqrt3);
constexpr float norm_value = 1.0f;

// Progress is reported about this often (in bytes written).
constexpr std::uint64_t progress_step_bytes = std::uint64_t{32} << 20;

// The context lengths make-model writes: one KV block at least, and what the serving options
// accept (--max-model-len) at most.
constexpr std::int64_t min_context_length = 16;
constexpr std::int64_t max_context_length = std::int64_t{1} << 24;

// ---- presets --------------------------------------------------------------------------------

model_config llama_config(std::int64_t vocab, std::int64_t hidden, std::int64_t intermediate, std::int64_t layers,
                          std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim, std::int64_t max_position,
                          double rope_theta, bool tied) {
  model_config c;
  c.arch = architecture::llama;
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.max_position = max_position;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = rope_theta;
  c.rope = rope_layout::half_split;
  c.tie_embeddings = tied;
  return c;
}

model_config qwen2_config(std::int64_t vocab, std::int64_t hidden, std::int64_t intermediate, std::int64_t layers,
                          std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim, std::int64_t max_position) {
  constexpr double qwen2_rope_theta = 1'000'000.0;
  model_config c = llama_config(vocab, hidden, intermediate, layers, heads, kv_heads, head_dim, max_position,
                                qwen2_rope_theta, true);
  c.arch = architecture::qwen2;
  c.rms_norm_eps = 1e-6;
  c.qkv_bias = true;
  return c;
}

model_config qwen3_config(std::int64_t vocab, std::int64_t hidden, std::int64_t intermediate, std::int64_t layers,
                          std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim, std::int64_t max_position) {
  model_config c = qwen2_config(vocab, hidden, intermediate, layers, heads, kv_heads, head_dim, max_position);
  c.arch = architecture::qwen3;
  c.qkv_bias = false;
  c.qk_norm = true;
  return c;
}

model_config qwen3_moe_config(std::int64_t vocab, std::int64_t hidden, std::int64_t intermediate, std::int64_t layers,
                              std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim,
                              std::int64_t max_position, const moe_config& moe) {
  model_config c = qwen3_config(vocab, hidden, intermediate, layers, heads, kv_heads, head_dim, max_position);
  c.arch = architecture::qwen3_moe;
  c.tie_embeddings = false;
  c.moe = moe;
  c.moe->scoring = kernels::router_scoring::softmax;
  return c;
}

// GLM-4.5: Q/K/V biases, RoPE over the first half of each head, a sigmoid router with a
// correction bias, shared experts.
model_config glm4_moe_config(std::int64_t vocab, std::int64_t hidden, std::int64_t intermediate, std::int64_t layers,
                             std::int64_t heads, std::int64_t kv_heads, std::int64_t head_dim,
                             std::int64_t max_position, const moe_config& moe) {
  model_config c = qwen2_config(vocab, hidden, intermediate, layers, heads, kv_heads, head_dim, max_position);
  c.arch = architecture::glm4_moe;
  c.tie_embeddings = false;
  c.rms_norm_eps = 1e-5;
  c.rotary_dim = head_dim / 2;
  c.moe = moe;
  c.moe->scoring = kernels::router_scoring::sigmoid;
  c.moe->correction_bias = true;
  return c;
}

// DeepSeek-V3 / Kimi K2 (model_type deepseek_v3): latent attention, the sigmoid router with
// groups, shared experts; `yarn` when the preset has YaRN scaling.
model_config deepseek_v3_config(std::int64_t vocab, std::int64_t hidden, std::int64_t intermediate, std::int64_t layers,
                                std::int64_t heads, const mla_config& mla, std::int64_t max_position, double rope_theta,
                                const moe_config& moe, std::optional<rope_scaling_yarn> yarn) {
  model_config c = llama_config(vocab, hidden, intermediate, layers, heads, heads, mla.qk_head_dim(), max_position,
                                rope_theta, false);
  c.arch = architecture::deepseek_v3;
  c.rms_norm_eps = 1e-6;
  c.rope = rope_layout::adjacent_pairs;  // rope_interleave
  c.mla = mla;
  c.yarn = yarn;
  c.moe = moe;
  c.moe->scoring = kernels::router_scoring::sigmoid;
  c.moe->correction_bias = true;
  return c;
}

// GLM-5 (GlmMoeDsaForCausalLM): DeepSeek-V3's layers plus the DSA indexer.
model_config glm_moe_dsa_config(std::int64_t vocab, std::int64_t hidden, std::int64_t intermediate, std::int64_t layers,
                                std::int64_t heads, const mla_config& mla, std::int64_t max_position, const moe_config& moe,
                                const dsa_config& dsa) {
  constexpr double glm_rope_theta = 1'000'000.0;
  model_config c = deepseek_v3_config(vocab, hidden, intermediate, layers, heads, mla, max_position, glm_rope_theta, moe,
                                      std::nullopt);
  c.arch = architecture::glm_moe_dsa;
  c.rms_norm_eps = 1e-5;
  c.dsa = dsa;
  return c;
}

mla_config latent(std::int64_t q_lora, std::int64_t kv_lora, std::int64_t nope, std::int64_t rope, std::int64_t v) {
  return {.q_lora_rank = q_lora, .kv_lora_rank = kv_lora, .qk_nope_head_dim = nope, .qk_rope_head_dim = rope,
          .v_head_dim = v};
}

moe_config experts_of(std::int64_t experts, std::int64_t top_k, std::int64_t width, std::int64_t shared = 0,
                      std::int64_t first_dense = 0) {
  moe_config m;
  m.num_experts = experts;
  m.experts_per_token = top_k;
  m.expert_intermediate = width;
  m.shared_experts = shared;
  m.first_dense_layers = first_dense;
  m.normalize_weights = true;
  return m;
}

const std::vector<synthetic_preset>& preset_table() {
  // Llama 3's vocabulary: 128000 BPE tokens and a block of 256 special ones.
  constexpr std::int64_t llama3_vocab = 128256;
  constexpr std::int64_t llama3_specials = 256;
  constexpr double llama3_theta = 500'000.0;
  // Qwen2.5 pads its embedding to 151936 rows; the tokenizer proper has 151643 BPE tokens.
  constexpr std::int64_t qwen25_vocab = 151936;
  constexpr std::int64_t qwen25_specials = qwen25_vocab - 151643;
  constexpr std::int64_t tiny_vocab = 512;

  static const std::vector<synthetic_preset> presets = [] {
    std::vector<synthetic_preset> table;
    table.push_back({"tiny", "Llama architecture, 2 layers, hidden 64, 4 heads / 2 KV heads, vocab 512 (tests)",
                     llama_config(tiny_vocab, 64, 176, 2, 4, 2, 16, 2048, 10000.0, false), 16});
    // Heads 128 wide, as in Llama 3 8B/70B, Mistral and Qwen2.5-7B: at that width an fp8 KV cache
    // holds 1.94x the tokens of bf16 (the scales cost 4 bytes per 128), where stories260K's
    // 8-wide heads give 1.33x. Small enough for KV capacity tests on a CPU.
    table.push_back({"tiny-hd128", "Llama architecture with 128-wide heads, 2 layers, hidden 256, 2 heads / 1 KV "
                     "head, vocab 512 (KV capacity tests)",
                     llama_config(tiny_vocab, 256, 688, 2, 2, 1, 128, 4096, 10000.0, false), 16});
    table.push_back({"tiny-qwen2", "Qwen2 architecture (Q/K/V biases, tied), 2 layers, hidden 64, vocab 512 (tests)",
                     qwen2_config(tiny_vocab, 64, 176, 2, 4, 2, 16, 4096), 8});
    // Heads wider than hidden / heads, as Qwen3 has them (its 0.6B: hidden 1024, 16 x 128).
    table.push_back({"tiny-qwen3", "Qwen3 architecture (per-head Q/K RMSNorm, heads of 32 over hidden 64), 2 layers, "
                     "vocab 512 (tests)",
                     qwen3_config(tiny_vocab, 64, 176, 2, 4, 2, 32, 4096), 8});
    // Every MoE rule in three layers: Qwen3-MoE with a dense layer between two sparse ones
    // (mlp_only_layers); GLM-4.5 with a first dense layer, grouped choice (4 groups, 2 kept),
    // a shared expert and a routed scaling of 2.5.
    moe_config tiny_qwen_experts = experts_of(8, 2, 32);
    tiny_qwen_experts.dense_layers = {1};
    table.push_back({"tiny-qwen3-moe", "Qwen3-MoE architecture, 3 layers (the middle one dense), 8 experts, top 2, "
                     "hidden 64, vocab 512 (tests)",
                     qwen3_moe_config(tiny_vocab, 64, 176, 3, 4, 2, 32, 4096, tiny_qwen_experts), 8});
    // GGUF qwen3moe holds sparse layers only: this one has every layer sparse.
    table.push_back({"tiny-qwen3-moe-sparse", "Qwen3-MoE architecture, 2 layers, both sparse (as GGUF qwen3moe holds "
                     "them), 8 experts, top 2, hidden 64, vocab 512 (tests)",
                     qwen3_moe_config(tiny_vocab, 64, 176, 2, 4, 2, 32, 4096, experts_of(8, 2, 32)), 8});
    moe_config tiny_glm_experts = experts_of(16, 4, 32, 1, 1);
    tiny_glm_experts.groups = 4;
    tiny_glm_experts.top_groups = 2;
    tiny_glm_experts.routed_scaling = 2.5;
    table.push_back({"tiny-glm4-moe", "GLM-4.5 architecture (Q/K/V biases, half-rotary heads), 3 layers (the first "
                     "dense), 16 experts in 4 groups, top 4 + 1 shared, hidden 64, vocab 512 (tests)",
                     glm4_moe_config(tiny_vocab, 64, 176, 3, 4, 2, 32, 4096, tiny_glm_experts), 8});
    auto llama_32_1b = llama_config(llama3_vocab, 2048, 8192, 16, 32, 8, 64, 131072, llama3_theta, true);
    llama_32_1b.rope_scaling = rope_scaling_llama3{32.0, 1.0, 4.0, 8192};
    table.push_back({"llama-3.2-1b", "Llama 3.2 1B shapes: 16 layers, hidden 2048, 32/8 heads, tied, llama3 RoPE "
                     "scaling (about 2.5 GB in bf16)",
                     llama_32_1b, llama3_specials});
    table.push_back({"llama-3-8b", "Llama 3 8B shapes: 32 layers, hidden 4096, 32/8 heads, untied (about 16 GB in bf16)",
                     llama_config(llama3_vocab, 4096, 14336, 32, 32, 8, 128, 8192, llama3_theta, false),
                     llama3_specials});
    table.push_back({"qwen2.5-0.5b", "Qwen2.5 0.5B shapes: 24 layers, hidden 896, 14/2 heads, Q/K/V biases, tied "
                     "(about 1 GB in bf16)",
                     qwen2_config(qwen25_vocab, 896, 4864, 24, 14, 2, 64, 32768), qwen25_specials});
    // The published MoE shapes, whole or cut with --layers.
    table.push_back({"qwen3-30b-a3b", "Qwen3-30B-A3B shapes: 48 layers, hidden 2048, 32/4 heads of 128, 128 experts "
                     "of 768, top 8 (about 61 GB in bf16; use --layers)",
                     qwen3_moe_config(qwen25_vocab, 2048, 6144, 48, 32, 4, 128, 40960, experts_of(128, 8, 768)),
                     qwen25_specials});
    // The baseline that shows only active experts are read: the same attention, and one dense
    // SwiGLU as wide as all 128 experts together, so every layer holds the same bytes and every
    // token reads all of them.
    table.push_back({"qwen3-30b-a3b-dense", "Qwen3-30B-A3B's layers with its 128 experts merged into one dense MLP "
                     "of 98304 (the same bytes, all read by every token: the MoE decode benchmark's baseline)",
                     [&] {
                       model_config dense = qwen3_config(qwen25_vocab, 2048, 128 * 768, 48, 32, 4, 128, 40960);
                       dense.tie_embeddings = false;  // as the MoE model's
                       return dense;
                     }(),
                     qwen25_specials});
    // Latent attention. The tiny ones keep every rule small: YaRN with both of its attention
    // factors (mscale 1, mscale_all_dim 0.8), grouped routing, a first dense layer; its twin for
    // GGUF deepseek2, which holds neither expert groups nor a second mscale (one group, mscale =
    // mscale_all_dim = 0.8, so YaRN still scales the softmax); one without q_lora_rank and with
    // half-split RoPE (rope_interleave false); GLM-5 with an indexer that keeps 8 positions (a
    // 12-token prompt goes past it), a layer reusing its choice and a multi-token-prediction
    // layer the loader skips.
    moe_config tiny_deepseek_experts = experts_of(8, 2, 32, 1, 1);
    tiny_deepseek_experts.groups = 2;
    tiny_deepseek_experts.top_groups = 1;
    tiny_deepseek_experts.routed_scaling = 2.5;
    const rope_scaling_yarn tiny_yarn{.factor = 32.0, .original_max_position = 64, .beta_fast = 32.0, .beta_slow = 1.0,
                                      .truncate = true, .mscale = 1.0, .mscale_all_dim = 0.8};
    table.push_back({"deepseek-v3-tiny", "DeepSeek-V3 architecture (latent attention with q_lora, YaRN with mscale 1 "
                     "and mscale_all_dim 0.8), 3 layers (the first dense), 8 experts in 2 groups, top 2 + 1 shared, "
                     "hidden 64, vocab 512 (tests; safetensors only: deepseek-v3-tiny-gguf is its GGUF deepseek2 twin)",
                     deepseek_v3_config(tiny_vocab, 64, 176, 3, 4, latent(48, 32, 16, 8, 16), 2048, 10000.0,
                                        tiny_deepseek_experts, tiny_yarn),
                     8});
    moe_config tiny_deepseek_gguf_experts = tiny_deepseek_experts;
    tiny_deepseek_gguf_experts.groups = 1;
    tiny_deepseek_gguf_experts.top_groups = 1;
    rope_scaling_yarn tiny_gguf_yarn = tiny_yarn;
    tiny_gguf_yarn.mscale = tiny_gguf_yarn.mscale_all_dim;
    table.push_back({"deepseek-v3-tiny-gguf", "deepseek-v3-tiny as GGUF deepseek2 can hold it: 8 experts in one "
                     "group, YaRN with mscale = mscale_all_dim = 0.8, 3 layers (the first dense), hidden 64, vocab 512 "
                     "(tests and the llama.cpp comparison; also as GGUF deepseek2)",
                     deepseek_v3_config(tiny_vocab, 64, 176, 3, 4, latent(48, 32, 16, 8, 16), 2048, 10000.0,
                                        tiny_deepseek_gguf_experts, tiny_gguf_yarn),
                     8});
    // A DeepSeek-V3 of a few GB for decode benchmarks next to llama.cpp: 2048 wide with 16 heads
    // and 64 experts of 1408 (top 6 + 2 shared), as the 16B-A3B DeepSeek-V3-architecture models
    // are, with a q_lora bottleneck of 768 (GGUF deepseek2 keys q_lora off the layer count) and
    // DeepSeek-V2's vocabulary.
    constexpr std::int64_t deepseek_v2_vocab = 102400;
    moe_config small_deepseek_experts = experts_of(64, 6, 1408, 2, 1);
    small_deepseek_experts.routed_scaling = 2.5;
    table.push_back({"deepseek-v3-small", "DeepSeek-V3 architecture at a benchmark size: 4 layers (the first dense), "
                     "hidden 2048, 16 heads of latent attention (q_lora 768, kv_lora 512), 64 experts of 1408 + 2 "
                     "shared, top 6, one group, vocab 102400 (about 4.5 GB in bf16; also as GGUF deepseek2)",
                     deepseek_v3_config(deepseek_v2_vocab, 2048, 10944, 4, 16, latent(768, 512, 128, 64, 128), 4096,
                                        10000.0, small_deepseek_experts, std::nullopt),
                     256});
    auto tiny_q_proj = deepseek_v3_config(tiny_vocab, 64, 176, 2, 4, latent(0, 32, 16, 8, 24), 4096, 10000.0,
                                          experts_of(8, 2, 32, 1, 1), std::nullopt);
    tiny_q_proj.rope = rope_layout::half_split;
    tiny_q_proj.moe->routed_scaling = 1.5;
    table.push_back({"deepseek-v3-tiny-qproj", "DeepSeek-V3 architecture without q_lora (one q_proj), half-split "
                     "RoPE, no rope scaling, 2 layers, hidden 64, vocab 512 (tests)",
                     tiny_q_proj, 8});
    moe_config tiny_glm5_experts = experts_of(8, 2, 32, 1, 1);
    tiny_glm5_experts.routed_scaling = 2.5;
    auto tiny_glm5 = glm_moe_dsa_config(tiny_vocab, 64, 176, 3, 4, latent(48, 32, 16, 8, 24), 4096, tiny_glm5_experts,
                                        {.index_topk = 8, .index_heads = 8, .index_head_dim = 16,
                                         .shared_layers = {false, false, true}});
    tiny_glm5.nextn_layers = 1;
    table.push_back({"glm-5-tiny", "GLM-5 architecture (latent attention, DSA indexer keeping 8 positions, the third "
                     "layer reusing the second's choice, one multi-token-prediction layer), 3 layers, hidden 64, "
                     "vocab 512 (tests)",
                     tiny_glm5, 8});
    // Kimi K2 as released (config.json of moonshotai/Kimi-K2-Instruct): DeepSeek-V3's shapes with
    // 64 heads, 384 experts in one group, a first dense layer and YaRN 32 over 4096 positions.
    constexpr std::int64_t kimi_vocab = 163840;
    moe_config kimi_experts = experts_of(384, 8, 2048, 1, 1);
    kimi_experts.routed_scaling = 2.827;
    const rope_scaling_yarn kimi_yarn{.factor = 32.0, .original_max_position = 4096, .beta_fast = 1.0,
                                      .beta_slow = 1.0, .truncate = true, .mscale = 1.0, .mscale_all_dim = 1.0};
    table.push_back({"kimi-k2", "Kimi K2 shapes: 61 layers (the first dense), hidden 7168, 64 heads of latent "
                     "attention (kv_lora 512, q_lora 1536), 384 experts of 2048 + 1 shared, top 8, YaRN x32 (about 2 TB "
                     "in bf16; use --layers)",
                     deepseek_v3_config(kimi_vocab, 7168, 18432, 61, 64, latent(1536, 512, 128, 64, 128), 131072, 50000.0,
                                        kimi_experts, kimi_yarn),
                     256});
    // GLM-5 as GlmMoeDsaConfig describes it (zai-org/GLM-5).
    constexpr std::int64_t glm5_vocab = 154880;
    moe_config glm5_experts = experts_of(256, 8, 2048, 1, 3);
    glm5_experts.routed_scaling = 2.5;
    auto glm5 = glm_moe_dsa_config(glm5_vocab, 6144, 12288, 78, 64, latent(2048, 512, 192, 64, 256), 202752,
                                   glm5_experts, {.index_topk = 2048, .index_heads = 32, .index_head_dim = 128});
    glm5.nextn_layers = 1;
    table.push_back({"glm-5", "GLM-5 shapes: 78 layers (the first 3 dense), hidden 6144, 64 heads of latent attention "
                     "(kv_lora 512, q_lora 2048) with the DSA indexer (top 2048 of 32 heads x 128), 256 experts of 2048 "
                     "+ 1 shared, top 8 (about 1.5 TB in bf16; use --layers)",
                     glm5, 256});
    constexpr std::int64_t glm_vocab = 151552;
    auto glm_air = glm4_moe_config(glm_vocab, 4096, 10944, 46, 96, 8, 128, 131072, experts_of(128, 8, 1408, 1, 1));
    table.push_back({"glm-4.5-air", "GLM-4.5-Air shapes: 46 layers (the first dense), hidden 4096, 96/8 heads of 128, "
                     "128 experts of 1408 + 1 shared, top 8 (about 220 GB in bf16; use --layers)",
                     glm_air, glm_vocab - 151329});
    return table;
  }();
  return presets;
}

// ---- what is written --------------------------------------------------------------------------

enum class fill {
  random,
  ones,
  values,
  block_scales,  // the FP8 block scales (weight_scale_inv) of the random matrix named by `identity`
};

// DeepSeek-V3's FP8 format: one scale per 128 × 128 block.
constexpr std::int64_t fp8_block_side = 128;

struct planned_tensor {
  std::string identity;  // the Hugging Face name: the same values under either format's name
  std::string name;      // in the file
  std::vector<std::int64_t> shape;
  kernels::dtype type = kernels::dtype::f32;
  // The values are those of this dtype: a GGUF tensor kept in F32 holds what llama.cpp's
  // converter widens from the checkpoint's dtype.
  kernels::dtype precision = kernels::dtype::f32;
  fill contents = fill::random;
  // GGUF llama Q/K: rows reordered within each of this many heads for adjacent-pair RoPE.
  std::int64_t permute_heads = 0;
  std::vector<float> values;  // fill::values
  // A random matrix written as FP8 E4M3 codes scaled per block (type fp8_e4m3), or the block
  // scales of one (fill::block_scales, shape [ceil(rows / 128), ceil(cols / 128)]).
  bool fp8_blocks = false;
  std::vector<std::int64_t> source_shape;  // fill::block_scales: the matrix's shape
  // A stack of matrices (GGUF's ffn_*_exps: [experts, rows, cols]): the identity of each, whose
  // rows it holds in turn.
  std::vector<std::string> stacked;
};

std::vector<planned_tensor> plan_tensors(const model_config& c, synthetic_format format, kernels::dtype dtype,
                                         bool fp8_blocks) {
  const bool gguf = format == synthetic_format::gguf;
  // llama.cpp's converter keeps one-dimensional tensors (norms, biases) and MoE routers in F32
  // whatever the file type, and permutes the Q and K rows of those it reads with adjacent-pair
  // RoPE (Llama's).
  const kernels::dtype vector_type = gguf ? kernels::dtype::f32 : dtype;
  const bool permute_qk = gguf && traits_of(c.arch).gguf_rope == rope_layout::adjacent_pairs;

  std::vector<planned_tensor> plan;
  for (const schema_tensor& s : tensor_schema(c)) {
    const std::string& name = gguf ? s.gguf : s.hf;
    if (name.empty()) continue;
    if (s.fill == tensor_fill::rope_factors) {
      planned_tensor t;
      t.identity = t.name = name;
      t.shape = s.shape;
      t.contents = fill::values;
      t.values = llama3_rope_factors(*c.rope_scaling, c.rope_theta, c.head_dim);
      plan.push_back(std::move(t));
      continue;
    }
    if (gguf && s.expert >= 0) {
      // One stack of every expert's matrix, in expert order: the identity of each, whose rows
      // it holds in turn.
      if (s.expert == 0) {
        planned_tensor t;
        t.identity = t.name = name;
        t.shape = {c.moe->num_experts, s.shape[0], s.shape[1]};
        t.type = t.precision = dtype;
        plan.push_back(std::move(t));
      }
      plan.back().stacked.push_back(s.hf);
      continue;
    }
    planned_tensor t;
    t.name = name;
    t.identity = s.hf;
    t.type = s.shape.size() == 1 || s.router ? vector_type : dtype;
    t.precision = dtype;
    t.shape = s.shape;
    t.contents = s.fill == tensor_fill::ones ? fill::ones : fill::random;
    if (permute_qk && s.rope_rows && s.shape.size() == 2) t.permute_heads = s.shape[0] / c.head_dim;
    plan.push_back(std::move(t));
    // A projection: FP8 with its block scales beside it when asked, as the FP8 releases store
    // them; the embedding, the classifier and the router stay in `dtype`.
    if (!fp8_blocks || !s.projection) continue;
    plan.back().type = kernels::dtype::fp8_e4m3;
    plan.back().fp8_blocks = true;
    planned_tensor scales;
    scales.identity = s.hf;
    scales.name = s.hf.substr(0, s.hf.size() - std::string_view("weight").size()) + "weight_scale_inv";
    scales.shape = {(s.shape[0] + fp8_block_side - 1) / fp8_block_side, (s.shape[1] + fp8_block_side - 1) / fp8_block_side};
    scales.type = kernels::dtype::f32;
    scales.contents = fill::block_scales;
    scales.source_shape = s.shape;
    plan.push_back(std::move(scales));
  }
  return plan;
}

// ---- values -----------------------------------------------------------------------------------

std::uint64_t fnv1a(std::string_view text) {
  constexpr std::uint64_t offset_basis = 0xcbf2'9ce4'8422'2325ull;
  constexpr std::uint64_t prime = 0x0000'0100'0000'01b3ull;
  std::uint64_t hash = offset_basis;
  for (const char c : text) hash = (hash ^ static_cast<std::uint8_t>(c)) * prime;
  return hash;
}

// Each row's values come from its own stream, keyed by seed, tensor and row: rows can be made
// in any order (the GGUF permutation) and every format gets the same numbers.
void fill_row(const planned_tensor& t, std::string_view identity, std::uint64_t seed_hash, std::int64_t row,
              std::span<float> out) {
  switch (t.contents) {
    case fill::ones: std::fill(out.begin(), out.end(), norm_value); return;
    case fill::values: std::copy(t.values.begin(), t.values.end(), out.begin()); return;
    case fill::random:
    case fill::block_scales: break;  // block scales are made from the matrix's random rows
  }
  std::uint64_t mixer = seed_hash ^ fnv1a(identity);
  std::uint64_t state = splitmix64(mixer) + static_cast<std::uint64_t>(row);
  state = splitmix64(state);
  constexpr int mantissa_bits = 24;  // a float's precision: uniform steps of 2^-24
  constexpr float unit = 1.0f / static_cast<float>(1 << mantissa_bits);
  constexpr int half_word = 32;
  const auto to_weight = [&](std::uint32_t bits) {
    const float uniform = static_cast<float>(bits >> (half_word - mantissa_bits)) * unit;  // [0, 1)
    return (2.0f * uniform - 1.0f) * weight_half_width;
  };
  std::size_t i = 0;
  for (; i + 1 < out.size(); i += 2) {
    const std::uint64_t bits = splitmix64(state);
    out[i] = to_weight(static_cast<std::uint32_t>(bits));
    out[i + 1] = to_weight(static_cast<std::uint32_t>(bits >> half_word));
  }
  if (i < out.size()) out[i] = to_weight(static_cast<std::uint32_t>(splitmix64(state)));
}

// Rounds each value to the nearest of `type`, kept as a float.
void round_to(std::span<float> values, kernels::dtype type) {
  switch (type) {
    case kernels::dtype::bf16:
      for (float& v : values) v = kernels::bf16_to_float(kernels::float_to_bf16(v));
      return;
    case kernels::dtype::f16:
      for (float& v : values) v = kernels::fp16_to_float(kernels::float_to_fp16(v));
      return;
    case kernels::dtype::f32:
    case kernels::dtype::fp8_e4m3: return;  // FP8 is refused by write_synthetic_model
  }
}

void encode(std::span<const float> values, kernels::dtype type, std::byte* out) {
  switch (type) {
    case kernels::dtype::f32: std::memcpy(out, values.data(), values.size_bytes()); return;
    case kernels::dtype::bf16:
      for (std::size_t i = 0; i < values.size(); ++i) {
        const std::uint16_t code = kernels::float_to_bf16(values[i]);
        std::memcpy(out + 2 * i, &code, sizeof(code));
      }
      return;
    case kernels::dtype::f16:
      for (std::size_t i = 0; i < values.size(); ++i) {
        const std::uint16_t code = kernels::float_to_fp16(values[i]);
        std::memcpy(out + 2 * i, &code, sizeof(code));
      }
      return;
    case kernels::dtype::fp8_e4m3: return;  // refused by write_synthetic_model
  }
}

// ---- output -----------------------------------------------------------------------------------

// Reports bytes written to the caller at a steady pace.
class progress_meter {
 public:
  explicit progress_meter(const synthetic_options& options) : callback_(options.progress) {}
  void start(std::uint64_t total) {
    total_ = total;
    if (callback_) callback_(0, total_);
  }
  void add(std::uint64_t bytes) {
    done_ += bytes;
    if (callback_ && (done_ >= next_report_ || done_ == total_)) {
      callback_(done_, total_);
      next_report_ = done_ + progress_step_bytes;
    }
  }

 private:
  const std::function<void(std::uint64_t, std::uint64_t)>& callback_;
  std::uint64_t total_ = 0;
  std::uint64_t done_ = 0;
  std::uint64_t next_report_ = progress_step_bytes;
};

// One band of up to 128 rows of an FP8 block-quantized matrix (rows [first, first + band) of
// `source`): the rows' random values, and each block's scale, amax / 448 (0 for a block of zeros).
struct fp8_band {
  std::vector<float> values;  // [band, cols]
  std::vector<float> scales;  // [ceil(cols / 128)]
};

fp8_band make_fp8_band(const planned_tensor& source, std::uint64_t seed_hash, std::int64_t first, std::int64_t band,
                       std::int64_t cols) {
  fp8_band out;
  out.values.resize(static_cast<std::size_t>(band * cols));
  out.scales.assign(static_cast<std::size_t>((cols + fp8_block_side - 1) / fp8_block_side), 0.0f);
  for (std::int64_t r = 0; r < band; ++r) {
    std::span<float> row(out.values.data() + r * cols, static_cast<std::size_t>(cols));
    fill_row(source, source.identity, seed_hash, first + r, row);
    for (std::int64_t c = 0; c < cols; ++c) {
      float& amax = out.scales[static_cast<std::size_t>(c / fp8_block_side)];
      amax = std::max(amax, std::abs(row[static_cast<std::size_t>(c)]));
    }
  }
  for (float& s : out.scales) s /= kernels::fp8_e4m3_traits::max;
  return out;
}

// A matrix as FP8 codes (fp8_blocks) or its block scales (fill::block_scales), band by band.
status write_fp8_blocks(atomic_file& out, const planned_tensor& t, std::uint64_t seed_hash, progress_meter& progress) {
  planned_tensor source = t;
  source.contents = fill::random;
  const std::vector<std::int64_t>& shape = t.contents == fill::block_scales ? t.source_shape : t.shape;
  const std::int64_t rows = shape[0];
  const std::int64_t cols = shape[1];
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(cols));
  for (std::int64_t first = 0; first < rows; first += fp8_block_side) {
    const std::int64_t band = std::min(fp8_block_side, rows - first);
    const fp8_band b = make_fp8_band(source, seed_hash, first, band, cols);
    if (t.contents == fill::block_scales) {
      EDGE_RETURN_IF_ERROR(out.write(b.scales.data(), b.scales.size() * sizeof(float)));
      progress.add(b.scales.size() * sizeof(float));
      continue;
    }
    for (std::int64_t r = 0; r < band; ++r) {
      for (std::int64_t c = 0; c < cols; ++c) {
        const float scale = b.scales[static_cast<std::size_t>(c / fp8_block_side)];
        const float v = b.values[static_cast<std::size_t>(r * cols + c)];
        codes[static_cast<std::size_t>(c)] = kernels::float_to_fp8_e4m3(scale > 0.0f ? v / scale : 0.0f);
      }
      EDGE_RETURN_IF_ERROR(out.write(codes.data(), codes.size()));
      progress.add(codes.size());
    }
  }
  return {};
}

// The tensor's rows in order (a stack's: each matrix's in turn), each made and encoded as it is
// written.
status write_rows(atomic_file& out, const planned_tensor& t, std::uint64_t seed_hash, progress_meter& progress) {
  if (t.fp8_blocks || t.contents == fill::block_scales) return write_fp8_blocks(out, t, seed_hash, progress);
  const std::int64_t cols = t.shape.back();
  std::int64_t rows = 1;
  for (std::size_t d = 0; d + 1 < t.shape.size(); ++d) rows *= t.shape[d];
  const std::int64_t rows_per_matrix = t.stacked.empty() ? rows : rows / static_cast<std::int64_t>(t.stacked.size());
  std::vector<float> row(static_cast<std::size_t>(cols));  // [cols]
  std::vector<std::byte> encoded(static_cast<std::size_t>(cols) * kernels::dtype_size(t.type));
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t source = t.permute_heads > 0 ? half_split_row(r, rows / t.permute_heads) : r;
    const std::string& identity =
        t.stacked.empty() ? t.identity : t.stacked[static_cast<std::size_t>(r / rows_per_matrix)];
    fill_row(t, identity, seed_hash, source % rows_per_matrix, row);
    if (t.precision != t.type) round_to(row, t.precision);
    encode(row, t.type, encoded.data());
    EDGE_RETURN_IF_ERROR(out.write(encoded.data(), encoded.size()));
    progress.add(encoded.size());
  }
  return {};
}

std::uint64_t seed_hash_of(std::uint64_t seed) {
  std::uint64_t state = seed;
  return splitmix64(state);
}

special_token_style style_of(const model_config& config) {
  return traits_of(config.arch).synthetic_chatml ? special_token_style::chatml : special_token_style::llama3;
}

// The plan as the writers take it: each tensor's rows made as they are written.
std::vector<output_tensor> output_tensors(const std::vector<planned_tensor>& plan, std::uint64_t seed_hash,
                                          progress_meter& progress) {
  std::vector<output_tensor> tensors;
  tensors.reserve(plan.size());
  for (const auto& t : plan) {
    tensors.push_back({.name = t.name, .type = {.type = t.type}, .shape = t.shape,
                       .write = [&t, seed_hash, &progress](atomic_file& out) {
                         return write_rows(out, t, seed_hash, progress);
                       }});
  }
  return tensors;
}

std::uint64_t total_bytes(std::span<const output_tensor> tensors) {
  std::uint64_t total = 0;
  for (const auto& t : tensors) total += t.bytes();
  return total;
}

// ---- safetensors folder -------------------------------------------------------------------------

std::string hf_config_json(const synthetic_preset& preset, const synthetic_options& options,
                           const synthetic_vocab& vocab) {
  const model_config& c = preset.config;
  std::string out = "{\n";
  out += hf_config_shape_fields(c);
  out += std::string("  \"tie_word_embeddings\": ") + (c.tie_embeddings ? "true" : "false") + ",\n";
  out += "  \"hidden_act\": \"silu\",\n";
  out += hf_config_class_fields(c);
  if (vocab.bos_id) out += "  \"bos_token_id\": " + std::to_string(*vocab.bos_id) + ",\n";
  out += "  \"eos_token_id\": " + std::to_string(vocab.eos_id) + ",\n";
  out += "  \"torch_dtype\": \"" + std::string(torch_dtype_name(options.dtype)) + "\",\n";
  if (options.fp8_blocks) {
    out += "  \"quantization_config\": {\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", \"activation_scheme\": "
           "\"dynamic\", \"weight_block_size\": [" + std::to_string(fp8_block_side) + ", " +
           std::to_string(fp8_block_side) + "]},\n";
  }
  out += "  \"edgeinfer_synthetic\": true,\n";
  out += "  \"edgeinfer_preset\": " + json_string(preset.name) + ",\n";
  out += "  \"edgeinfer_seed\": " + std::to_string(options.seed) + "\n}\n";
  return out;
}

bool is_earlier_output(const fs::path& folder) {
  const auto mapping = mapped_file::open(folder / "config.json");
  if (!mapping.ok()) return false;
  const auto bytes = (*mapping)->bytes();
  simdjson::dom::parser parser;
  const auto object = parse_json_object(parser, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  if (!object.ok()) return false;
  const auto marker = json_fields(*object).optional<bool>("edgeinfer_synthetic");
  return marker.ok() && marker->value_or(false);
}

// An empty (or new) folder, or an earlier make-model output whose files are removed first so
// that no stale shard survives next to the new ones.
status prepare_folder(const fs::path& folder) {
  EDGE_ASSIGN_OR_RETURN(const bool has_files, output_folder_has_files(folder));
  if (!has_files) return {};
  if (!is_earlier_output(folder)) {
    return failed_precondition(edge::format(
        "{} is not empty and not an earlier make-model output; choose a new folder", folder.string()));
  }
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    const auto name = entry.path().filename().string();
    const bool ours = name == "config.json" || name == "tokenizer.json" || name == "tokenizer_config.json" ||
                      name.ends_with(".safetensors") || name == safetensors_index_file ||
                      name.ends_with(atomic_file::partial_suffix);
    if (ours) fs::remove(entry.path(), ec);
  }
  return {};
}

status write_safetensors_folder(const synthetic_preset& preset, const synthetic_options& options,
                                const synthetic_vocab& vocab) {
  const fs::path& folder = options.out;
  EDGE_RETURN_IF_ERROR(prepare_folder(folder));
  const auto plan = plan_tensors(preset.config, synthetic_format::safetensors, options.dtype, options.fp8_blocks);

  EDGE_RETURN_IF_ERROR(write_text_file(folder / "tokenizer.json", tokenizer_json(vocab)));
  EDGE_RETURN_IF_ERROR(write_text_file(folder / "tokenizer_config.json", tokenizer_config_json(vocab)));

  progress_meter progress(options);
  const auto tensors = output_tensors(plan, seed_hash_of(options.seed), progress);
  progress.start(total_bytes(tensors));
  const safetensors_metadata metadata = {{"edgeinfer_synthetic", "true"},
                                         {"edgeinfer_preset", options.preset},
                                         {"edgeinfer_seed", std::to_string(options.seed)}};
  EDGE_RETURN_IF_ERROR(write_safetensors_weights(folder, tensors, metadata, options.max_shard_bytes));
  // Last, so that a folder is only loadable once everything else is in place.
  return write_text_file(folder / "config.json", hf_config_json(preset, options, vocab));
}

// ---- GGUF -------------------------------------------------------------------------------------

gguf_metadata_writer gguf_keys(const synthetic_preset& preset, const synthetic_options& options,
                               const synthetic_vocab& vocab) {
  constexpr std::int32_t token_type_normal = 1;
  constexpr std::int32_t token_type_control = 3;
  const model_config& c = preset.config;
  // write_synthetic_model refuses the architectures GGUF has no name for.
  const std::string arch(gguf_architecture_name(c.arch).value_or(""));
  gguf_metadata_writer keys;
  // GGUF keeps hyperparameters as u32 and f32.
  const auto add_u32 = [&keys](std::string_view key, std::int64_t value) {
    keys.add_u32(key, static_cast<std::uint32_t>(value));
  };
  const auto add_f32 = [&keys](std::string_view key, double value) { keys.add_f32(key, static_cast<float>(value)); };
  keys.add_string("general.architecture", arch);
  keys.add_string("general.name", preset.name + "-synthetic");
  // FP8, which has no file type, is refused by write_synthetic_model.
  keys.add_u32("general.file_type", gguf_file_type(options.dtype).value_or(0));
  add_u32(arch + ".vocab_size", c.vocab_size);
  add_u32(arch + ".context_length", c.max_position);
  add_u32(arch + ".embedding_length", c.hidden_size);
  add_u32(arch + ".block_count", c.num_layers);
  add_u32(arch + ".feed_forward_length", c.intermediate_size);
  add_u32(arch + ".attention.head_count", c.num_heads);
  add_u32(arch + ".attention.head_count_kv", c.num_kv_heads);
  add_u32(arch + ".attention.key_length", c.head_dim);
  add_u32(arch + ".attention.value_length", c.mla ? c.mla->v_head_dim : c.head_dim);
  add_u32(arch + ".rope.dimension_count", c.mla ? c.mla->qk_rope_head_dim : c.head_dim);
  add_f32(arch + ".rope.freq_base", c.rope_theta);
  add_f32(arch + ".attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  if (c.moe) {
    add_u32(arch + ".expert_count", c.moe->num_experts);
    add_u32(arch + ".expert_used_count", c.moe->experts_per_token);
    add_u32(arch + ".expert_feed_forward_length", c.moe->expert_intermediate);
  }
  if (c.mla) {
    // deepseek2, as llama.cpp's converter writes DeepseekV2Model / DeepseekV3 (check_gguf_expressible
    // has refused what these keys cannot say).
    constexpr std::uint32_t gating_softmax = 1;
    constexpr std::uint32_t gating_sigmoid = 2;
    const moe_config& moe = *c.moe;
    if (c.mla->q_lora_rank > 0) add_u32(arch + ".attention.q_lora_rank", c.mla->q_lora_rank);
    add_u32(arch + ".attention.kv_lora_rank", c.mla->kv_lora_rank);
    add_u32(arch + ".leading_dense_block_count", moe.first_dense_layers);
    add_u32(arch + ".expert_shared_count", moe.shared_experts);
    add_f32(arch + ".expert_weights_scale", moe.routed_scaling);
    keys.add_bool(arch + ".expert_weights_norm", moe.normalize_weights);
    keys.add_u32(arch + ".expert_gating_func",
                 moe.scoring == kernels::router_scoring::sigmoid ? gating_sigmoid : gating_softmax);
    if (c.yarn) {
      keys.add_string(arch + ".rope.scaling.type", "yarn");
      add_f32(arch + ".rope.scaling.factor", c.yarn->factor);
      add_u32(arch + ".rope.scaling.original_context_length", c.yarn->original_max_position);
    }
    // llama.cpp of the converter's time requires the key, 0 without YaRN.
    add_f32(arch + ".rope.scaling.yarn_log_multiplier",
            c.yarn ? gguf_yarn_log_multiplier_per_mscale * c.yarn->mscale_all_dim : 0.0);
  }
  keys.add_bool("edgeinfer.synthetic", true);
  keys.add_string("edgeinfer.preset", preset.name);
  keys.add_u64("edgeinfer.seed", options.seed);

  std::vector<std::int32_t> token_types(vocab.tokens.size(), token_type_normal);
  std::fill(token_types.begin() + vocab.first_special, token_types.end(), token_type_control);
  keys.add_string("tokenizer.ggml.model", "gpt2");
  // The split regex of tokenizer.json, which is Llama 3's for every preset.
  keys.add_string("tokenizer.ggml.pre", "llama-bpe");
  keys.add_strings("tokenizer.ggml.tokens", vocab.tokens);
  keys.add_i32s("tokenizer.ggml.token_type", token_types);
  keys.add_strings("tokenizer.ggml.merges", vocab.merges);
  add_u32("tokenizer.ggml.bos_token_id", vocab.bos_id.value_or(vocab.pad_id));
  add_u32("tokenizer.ggml.eos_token_id", vocab.eos_id);
  add_u32("tokenizer.ggml.padding_token_id", vocab.pad_id);
  keys.add_bool("tokenizer.ggml.add_bos_token", vocab.add_bos);
  keys.add_string("tokenizer.chat_template", vocab.chat_template);
  return keys;
}

// What GGUF deepseek2 cannot say, as llama.cpp of the converter's layout (attn_kv_b whole) runs
// it; the first reason, or none. Its graph takes a plain top-k (no expert groups); builds cos and
// sin without YaRN's magnitude factor (transformers' too only when mscale = mscale_all_dim),
// with beta_fast 32 and beta_slow 1; decides whether queries have the q_lora bottleneck by the
// layer count (27: DeepSeek-V2-Lite); normalises the q_a / kv_a latents with rms_norm_eps where
// transformers uses 1e-6; requires output.weight and the shared experts; keeps dense layers first
// only; rotates adjacent pairs.
std::optional<std::string> deepseek2_inexpressible(const model_config& c) {
  constexpr std::int64_t llama_cpp_lite_layers = 27;
  constexpr double llama_cpp_beta_fast = 32.0;
  constexpr double llama_cpp_beta_slow = 1.0;
  if (!c.moe) return std::string("no experts: deepseek2 layers past the leading dense ones are Mixture-of-Experts");
  const moe_config& moe = *c.moe;
  if (moe.groups != 1 || moe.top_groups != 1) {
    return edge::format("group-limited routing (n_group {}, topk_group {}): llama.cpp's deepseek2 chooses a plain "
                        "top-k", moe.groups, moe.top_groups);
  }
  if (c.rope != rope_layout::adjacent_pairs) return std::string("rope_interleave false: deepseek2 rotates adjacent pairs");
  if ((c.mla->q_lora_rank == 0) != (c.num_layers == llama_cpp_lite_layers)) {
    return edge::format("q_lora_rank {} with {} layers: llama.cpp's deepseek2 has queries without the q_lora "
                        "bottleneck exactly when there are {} layers", c.mla->q_lora_rank, c.num_layers,
                        llama_cpp_lite_layers);
  }
  if (static_cast<float>(c.rms_norm_eps) != mla_plan::lora_norm_eps) {
    return edge::format("rms_norm_eps {}: llama.cpp's deepseek2 normalises the q_a / kv_a latents with it, "
                        "transformers with {}", c.rms_norm_eps, mla_plan::lora_norm_eps);
  }
  if (c.yarn) {
    const rope_scaling_yarn& y = *c.yarn;
    if (y.beta_fast != llama_cpp_beta_fast || y.beta_slow != llama_cpp_beta_slow || !y.truncate) {
      return edge::format("YaRN beta_fast {} / beta_slow {}{}: llama.cpp's YaRN uses 32 / 1, truncated", y.beta_fast,
                          y.beta_slow, y.truncate ? "" : " untruncated");
    }
    if (y.rotary_factor() != 1.0) {
      return edge::format("YaRN mscale {} with mscale_all_dim {}: llama.cpp's deepseek2 leaves cos and sin unscaled, "
                          "as transformers does only when they are equal", y.mscale, y.mscale_all_dim);
    }
  }
  if (c.tie_embeddings) {
    return edge::format("a classifier tied to the embedding: deepseek2 requires {}", gguf_classifier_name());
  }
  if (moe.shared_experts < 1) return std::string("no shared experts: deepseek2 requires ffn_*_shexp in every sparse layer");
  if (!moe.dense_layers.empty() || moe.sparse_step != 1) {
    return std::string("dense layers after the first sparse one: deepseek2 has leading_dense_block_count only");
  }
  return std::nullopt;
}

// What GGUF (as llama.cpp reads it) cannot hold: GLM-4.5 and GLM-5 at all, a DeepSeek-V3 that
// deepseek2 would run differently, and in a qwen3moe file dense layers or unnormalised expert
// weights (llama.cpp builds every layer sparse and renormalises).
status check_gguf_expressible(const synthetic_preset& preset) {
  const model_config& c = preset.config;
  if (!gguf_architecture_name(c.arch)) {
    return status(status_code::unimplemented,
                  edge::format("{} is a {} model, which make-model writes as a safetensors folder only: edgeinfer "
                               "reads no GGUF of that architecture",
                               preset.name, traits_of(c.arch).hf_class));
  }
  if (c.mla) {
    if (const auto why = deepseek2_inexpressible(c)) {
      return status(status_code::unimplemented,
                    edge::format("{} has {}; write it as safetensors{}", preset.name, *why,
                                 find_synthetic_preset(preset.name + "-gguf") ? ", or use " + preset.name + "-gguf" : ""));
    }
    return {};
  }
  if (!c.moe) return {};
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    if (!c.moe->sparse(i)) {
      return status(status_code::unimplemented,
                    edge::format("{} has a dense layer ({}: mlp_only_layers / decoder_sparse_step), which a GGUF "
                                 "qwen3moe cannot hold; write it as safetensors, or cut it with --layers",
                                 preset.name, i));
    }
  }
  if (!c.moe->normalize_weights) {
    return status(status_code::unimplemented,
                  edge::format("{} does not renormalise its experts' weights (norm_topk_prob false), which a GGUF "
                               "qwen3moe cannot say",
                               preset.name));
  }
  return {};
}

status write_gguf_file(const synthetic_preset& preset, const synthetic_options& options, const synthetic_vocab& vocab) {
  std::error_code ec;
  if (fs::is_directory(options.out, ec)) {
    return invalid_argument(edge::format("{} is a folder; a GGUF model is one file (e.g. {}/{}.gguf)",
                                         options.out.string(), options.out.string(), preset.name));
  }
  if (options.out.has_parent_path()) fs::create_directories(options.out.parent_path(), ec);

  const auto plan = plan_tensors(preset.config, synthetic_format::gguf, options.dtype, false);
  progress_meter progress(options);
  const auto tensors = output_tensors(plan, seed_hash_of(options.seed), progress);
  progress.start(total_bytes(tensors));
  return write_gguf(options.out, gguf_keys(preset, options, vocab), tensors);
}

}  // namespace

std::optional<synthetic_format> parse_synthetic_format(std::string_view name) {
  if (name == "safetensors") return synthetic_format::safetensors;
  if (name == "gguf") return synthetic_format::gguf;
  return std::nullopt;
}

std::span<const synthetic_preset> synthetic_presets() { return preset_table(); }

const synthetic_preset* find_synthetic_preset(std::string_view name) {
  for (const auto& preset : preset_table()) {
    if (preset.name == name) return &preset;
  }
  return nullptr;
}

result<fs::path> write_synthetic_model(const synthetic_options& options) {
  const auto* preset = find_synthetic_preset(options.preset);
  if (preset == nullptr) {
    std::string names;
    for (const auto& p : preset_table()) names += (names.empty() ? "" : ", ") + p.name;
    return invalid_argument(edge::format("unknown preset \"{}\" (presets: {})", options.preset, names));
  }
  if (options.out.empty()) return invalid_argument("no output path given");
  if (options.max_shard_bytes == 0) return invalid_argument("the shard size limit must be positive");
  if (options.fp8_blocks && options.format == synthetic_format::gguf) {
    return invalid_argument("FP8 block-scaled weights are written as safetensors only");
  }
  if (options.dtype == kernels::dtype::fp8_e4m3) {
    return invalid_argument("synthetic weights are f32, f16 or bf16; quantize them afterwards");
  }

  synthetic_preset chosen = *preset;
  if (options.layers != 0) {
    if (options.layers < 1 || options.layers > preset->config.num_layers) {
      return invalid_argument(edge::format("--layers {} is outside [1, {}] for {}", options.layers,
                                           preset->config.num_layers, preset->name));
    }
    // The first layers of the model, each at its real shape; the MoE layer rules kept.
    model_config& c = chosen.config;
    c.num_layers = options.layers;
    if (c.moe) {
      c.moe->first_dense_layers = std::min(c.moe->first_dense_layers, c.num_layers);
      std::erase_if(c.moe->dense_layers, [&](std::int64_t layer) { return layer >= c.num_layers; });
    }
    if (c.dsa && !c.dsa->shared_layers.empty()) c.dsa->shared_layers.resize(static_cast<std::size_t>(c.num_layers));
  }
  if (options.experts != 0) {
    model_config& c = chosen.config;
    if (!c.moe) return invalid_argument(edge::format("--experts: {} has no experts", preset->name));
    moe_config& m = *c.moe;
    if (options.experts < m.experts_per_token || options.experts > m.num_experts) {
      return invalid_argument(edge::format("--experts {} is outside [{}, {}] (experts per token .. experts) for {}",
                                           options.experts, m.experts_per_token, m.num_experts, preset->name));
    }
    m.num_experts = options.experts;
    if (m.num_experts % m.groups != 0 || m.top_groups * (m.num_experts / m.groups) < m.experts_per_token) {
      m.groups = 1;
      m.top_groups = 1;
    }
  }
  if (options.context_length != 0) {
    if (options.context_length < min_context_length || options.context_length > max_context_length) {
      return invalid_argument(edge::format("--context-length {} is outside [{}, {}]", options.context_length,
                                           min_context_length, max_context_length));
    }
    chosen.config.max_position = options.context_length;
  }
  if (options.format == synthetic_format::gguf) EDGE_RETURN_IF_ERROR(check_gguf_expressible(chosen));
  const auto vocab = make_synthetic_vocab(style_of(chosen.config), chosen.config.vocab_size, chosen.special_tokens,
                                          chosen.config.max_position);
  const status written = options.format == synthetic_format::gguf ? write_gguf_file(chosen, options, vocab)
                                                                  : write_safetensors_folder(chosen, options, vocab);
  if (!written.ok()) return written.with_context(edge::format("writing {}", options.out.string()));
  return options.out;
}

}  // namespace edge::backend
