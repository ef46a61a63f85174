// Launches per step: the forward pass of a decode step at the real shapes of Kimi K2 and GLM-5,
// run on device::count (each op adds the CUDA kernels it would queue and reads nothing: no
// weights, no GPU), held under a stated count. A CUDA launch costs a few microseconds of the
// CPU and of the GPU's front end whatever it computes, so a decode step of thousands of tiny
// launches is bound by them, not by the weights it reads.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "edge/backend/model/model_plan.h"
#include "edge/backend/model/synthetic.h"
#include "edge/backend/runtime/forward.h"
#include "edge/backend/runtime/kv_cache.h"

namespace {

using namespace edge::backend;
namespace ek = edge::kernels;

// Views that point somewhere (device::count reads none of them), each matrix one part, as the
// CUDA placement stacks them, and the experts with gate and up stacked.
forward_weights counting_weights(const model_plan& plan) {
  static float somewhere[64];
  const ek::weight_view matrix{.format = ek::weight_format::int4, .values = somewhere, .scales = somewhere,
                               .group_size = 128};
  forward_weights w{.embedding = somewhere, .embedding_type = ek::dtype::bf16, .final_norm = somewhere,
                    .lm_head = matrix};
  for (const layer_plan& l : plan.layers) {
    layer_forward_weights lw{.attn_norm = somewhere, .q_norm = somewhere, .k_norm = somewhere,
                             .rope_inv_freq = somewhere, .wo = matrix, .q_a_norm = somewhere, .wq_b = matrix,
                             .kv_a_norm = somewhere, .wkv_b = matrix, .w_uk_t = matrix, .index_wq = matrix,
                             .index_k_norm = somewhere, .index_k_norm_bias = somewhere, .ffn_norm = somewhere,
                             .w_down = matrix, .router = matrix, .router_bias = somewhere};
    lw.qkv = {{.w = matrix, .rows = l.attention.qkv_dim()}};
    if (l.mlp.intermediate > 0) lw.gate_up = {{.w = matrix, .rows = 2 * l.mlp.intermediate}};
    if (l.mlp.kind == mlp_kind::moe) {
      lw.experts.assign(static_cast<std::size_t>(l.mlp.experts), {.gate = matrix, .up = {}, .down = matrix});
    }
    w.layers.push_back(std::move(lw));
  }
  return w;
}

struct step_launches {
  std::int64_t total = 0;      // the forward pass of one decode token
  std::int64_t per_layer = 0;  // of its busiest layer
};

step_launches decode_launches(const char* preset) {
  const auto* p = find_synthetic_preset(preset);
  REQUIRE(p != nullptr);
  auto plan = plan_model(p->config);
  REQUIRE(plan.ok());
  const forward_weights weights = counting_weights(*plan);
  const forward_buffer_shape shape{.tokens = 1, .logits_rows = 1, .context = 256, .where = ek::device::cuda};
  std::vector<std::byte> memory(forward_buffer_bytes(*plan, shape) + forward_buffer_alignment);
  auto* base = memory.data() +
               (forward_buffer_alignment - reinterpret_cast<std::uintptr_t>(memory.data()) % forward_buffer_alignment);
  const forward_buffers buffers = carve_forward_buffers(*plan, shape, base);
  const kv_cache_layout layout = kv_cache_layout::for_tokens(p->config, ek::dtype::fp8_e4m3, 16, 256);
  kv_cache_view kv = kv_cache_view::plan(layout, layout.num_blocks, 256);
  std::vector<std::byte> cache(kv.total_bytes());
  kv.base = cache.data();
  step_launches out;
  out.total = count_decode_launches(*plan, weights, buffers, kv);
  REQUIRE(out.total > 0);
  // The busiest layer: the model cut to its first layers, one layer more each time.
  std::int64_t before = 0;
  for (std::size_t l = 1; l <= plan->layers.size() && l <= 6; ++l) {
    model_plan cut = *plan;
    cut.layers.resize(l);
    const std::int64_t launches = count_decode_launches(cut, counting_weights(cut), buffers, kv);
    REQUIRE(launches > 0);
    if (l > 1) out.per_layer = std::max(out.per_layer, launches - before);
    before = launches;
  }
  MESSAGE(std::string(preset) << ": a decode step's forward pass queues " << out.total << " kernels (" << out.per_layer
                 << " in its busiest layer), plus the sampler's one");
  return out;
}

}  // namespace

TEST_CASE("launches per step: a Kimi K2 and a GLM-5 decode step at their real shapes") {
  // Kimi K2: 61 layers of latent attention (64 heads), the first dense, then 384 experts. A MoE
  // layer: 12 for attention (norms, projections, RoPE, the cache row, the two absorbed
  // projections of every head, attention, the output), 13 for the experts (norm, router,
  // routing, 7 for the routed experts, 3 for the shared one). Each head's absorbed projections
  // were two launches per head: 151 a layer, 9,205 a step.
  const step_launches kimi = decode_launches("kimi-k2");
  CHECK(kimi.per_layer <= 25);
  CHECK(kimi.total <= 1550);
  // GLM-5: 78 layers, the first 3 dense, each with the DSA indexer (7 more: its key's norm,
  // RoPE and cache row, its queries and their RoPE, scoring and picking): 32 a layer, 158 before;
  // 12,300 a step before.
  const step_launches glm = decode_launches("glm-5");
  CHECK(glm.per_layer <= 32);
  CHECK(glm.total <= 2500);
}

TEST_CASE("launches per step: the MoE grid covers the experts a step chose, not every expert") {
  // Kimi K2's decode: one token, 8 of 384 experts, gate and up stacked (2 x 2048 rows) and down
  // (7168 rows), 4 weight rows a block. A grid over every expert launched 1,081,344 blocks a
  // layer, all but 8 in 384 of them returning at once.
  const std::int64_t gate_up = ek::moe_grouped_blocks(2 * 2048, 1, 8, 384);
  const std::int64_t down = ek::moe_grouped_blocks(7168, 1, 8, 384);
  CHECK(gate_up + down == 22528);
  CHECK((2 * 2048 / 4 + 7168 / 4) * 384 == 1081344);
  // A prefill of 256 tokens can choose every expert: the grid is then the whole set.
  CHECK(ek::moe_grouped_blocks(7168, 256, 8, 384) == 7168 / 4 * 384);
}
