// The model as data: each supported architecture's configuration becomes the plan the one
// forward pass walks (layer kinds, widths, biases, RoPE layout and scaling), and the loader
// stacks Q/K/V and gate/up into the layout both executors run.
#include <doctest/doctest.h>

#include <cmath>

#include "edge/backend/model/formats.h"
#include "edge/backend/model/model.h"
#include "edge/backend/model/model_plan.h"
#include "edge/backend/model/synthetic.h"
#include "test_support.h"

namespace {

using namespace edge::backend;
using edge::kernels::rope_pairs;

model_plan plan_of(std::string_view config_json) {
  auto parsed = parse_hf_config(config_json);
  REQUIRE_MESSAGE(parsed.ok(), parsed.error().message());
  auto plan = plan_model(parsed->config);
  REQUIRE_MESSAGE(plan.ok(), plan.error().message());
  return std::move(plan).value();
}

void check_uniform_gqa(const model_plan& plan, std::int64_t layers, std::int64_t heads, std::int64_t kv_heads,
                       std::int64_t head_dim, std::int64_t intermediate, bool bias) {
  REQUIRE(static_cast<std::int64_t>(plan.layers.size()) == layers);
  for (const layer_plan& l : plan.layers) {
    CHECK(l.attention.kind == attention_kind::gqa);
    CHECK(l.mlp.kind == mlp_kind::dense);
    CHECK(l.attention.num_heads == heads);
    CHECK(l.attention.num_kv_heads == kv_heads);
    CHECK(l.attention.head_dim == head_dim);
    CHECK(l.attention.qkv_dim() == (heads + 2 * kv_heads) * head_dim);
    CHECK(l.attention.qkv_bias == bias);
    CHECK(l.attention.softmax_scale == doctest::Approx(1.0 / std::sqrt(static_cast<double>(head_dim))));
    CHECK(l.attention.rope.rotary_dim == head_dim);
    CHECK(l.mlp.intermediate == intermediate);
  }
  CHECK(plan.max_qkv_dim() == (heads + 2 * kv_heads) * head_dim);
  CHECK(plan.max_intermediate() == intermediate);
}

}  // namespace

TEST_CASE("a Llama 3.1 configuration plans GQA layers with llama3 RoPE scaling") {
  const model_plan plan = plan_of(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 256,
    "intermediate_size": 688, "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2,
    "vocab_size": 1000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
    "tie_word_embeddings": true})");
  CHECK(plan.arch == architecture::llama);
  CHECK(plan.hidden == 256);
  CHECK(plan.vocab == 1000);
  CHECK(plan.context == 4096);
  CHECK(plan.norm_eps == doctest::Approx(1e-6));
  CHECK(plan.tied_embeddings);
  check_uniform_gqa(plan, 3, 8, 2, 32, 688, false);
  const rope_plan& rope = plan.layers[0].attention.rope;
  CHECK(rope.pairs == rope_pairs::half_split);  // Hugging Face checkpoints
  CHECK(rope.theta == 500000.0);
  REQUIRE(rope.scaling.has_value());
  CHECK(rope.scaling->factor == 8.0);
  CHECK(rope.scaling->original_max_position == 8192.0);
  // The lowest frequency is stretched by the factor; the highest is kept.
  const auto inv_freq = rope.inv_freq();
  REQUIRE(inv_freq.size() == 16);
  CHECK(inv_freq[0] == doctest::Approx(1.0));
  CHECK(inv_freq[15] == doctest::Approx(std::pow(500000.0, -30.0 / 32.0) / 8.0));
}

TEST_CASE("a Qwen2 configuration plans Q/K/V biases; a Mistral one plain multi-head layers") {
  const model_plan qwen = plan_of(R"({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 128,
    "intermediate_size": 320, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "vocab_size": 500, "max_position_embeddings": 2048})");
  CHECK(qwen.arch == architecture::qwen2);
  check_uniform_gqa(qwen, 2, 4, 2, 32, 320, true);
  CHECK_FALSE(qwen.layers[0].attention.rope.scaling.has_value());

  const model_plan mistral = plan_of(R"({"architectures": ["MistralForCausalLM"], "hidden_size": 128,
    "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "head_dim": 48,
    "vocab_size": 500})");
  CHECK(mistral.arch == architecture::mistral);
  check_uniform_gqa(mistral, 4, 4, 4, 48, 256, false);
  CHECK(mistral.max_q_dim() == 4 * 48);
}

TEST_CASE("a GGUF llama model plans adjacent-pair RoPE; converted layers are stacked as the plan's widths say") {
  edge::testing::temp_dir dir;
  for (const char* preset : {"tiny", "tiny-qwen2"}) {
    CAPTURE(preset);
    const auto path = dir / (std::string(preset) + ".gguf");
    auto written = write_synthetic_model({.preset = preset, .format = synthetic_format::gguf, .seed = 3,
                                          .dtype = edge::kernels::dtype::bf16, .out = path});
    REQUIRE_MESSAGE(written.ok(), written.error().message());
    for (const auto weights : {edge::kernels::weight_format::f32, edge::kernels::weight_format::int4,
                               edge::kernels::weight_format::fp8_e4m3}) {
      CAPTURE(edge::kernels::to_string(weights));
      auto loaded = load_model({.path = path, .weight_dtype = weights});
      REQUIRE_MESSAGE(loaded.ok(), loaded.error().message());
      const model& m = **loaded;
      auto planned = plan_model(m.config);
      REQUIRE(planned.ok());
      const model_plan& plan = *planned;
      const bool llama = std::string(preset) == "tiny";
      CHECK(plan.layers[0].attention.rope.pairs == (llama ? rope_pairs::adjacent : rope_pairs::half_split));
      CHECK(plan.layers[0].attention.qkv_bias == !llama);
      for (std::size_t i = 0; i < plan.layers.size(); ++i) {
        const layer_weights& l = m.weights.layers[i];
        const attention_plan& a = plan.layers[i].attention;
        REQUIRE(l.wqkv.present());
        REQUIRE(l.w_gate_up.present());
        CHECK(l.wqkv.format == weights);
        CHECK(l.wqkv.rows() == a.qkv_dim());
        CHECK(l.w_gate_up.rows() == 2 * plan.layers[i].mlp.intermediate);
        // The parts are views of the stacked rows, values and scales alike.
        const auto row_bytes = edge::kernels::weight_values_bytes(l.wqkv.format, 1, l.wqkv.cols());
        CHECK(l.wq.data == l.wqkv.data);
        CHECK(l.wk.data == l.wqkv.data + a.q_dim() * row_bytes);
        CHECK(l.wv.data == l.wqkv.data + (a.q_dim() + a.kv_dim()) * row_bytes);
        CHECK(l.w_up.data == l.w_gate_up.data + plan.layers[i].mlp.intermediate * row_bytes);
        if (l.wqkv.scales != nullptr) {
          const auto scales_per_row = edge::kernels::weight_scale_count(l.wqkv.format, 1, l.wqkv.cols(), l.wqkv.group_size);
          CHECK(l.wk.scales == l.wqkv.scales + a.q_dim() * scales_per_row);
        }
      }
    }
    // Weights used in place from the file are not copied out of it to be stacked.
    auto in_place = load_model({.path = path});
    REQUIRE(in_place.ok());
    CHECK_FALSE((*in_place)->weights.layers[0].wqkv.present());
    CHECK_FALSE((*in_place)->weights.layers[0].w_gate_up.present());
  }
}

TEST_CASE("an inconsistent configuration has no plan") {
  model_config c{.vocab_size = 10, .hidden_size = 16, .intermediate_size = 32, .num_layers = 1, .num_heads = 4,
                 .num_kv_heads = 3, .head_dim = 4, .max_position = 64};
  CHECK(plan_model(c).error().code() == edge::status_code::invalid_argument);  // 4 heads in groups of 3
  c.num_kv_heads = 2;
  c.head_dim = 5;
  CHECK(plan_model(c).error().code() == edge::status_code::invalid_argument);  // odd head size for RoPE
  c.head_dim = 4;
  c.num_layers = 0;
  CHECK(plan_model(c).error().code() == edge::status_code::invalid_argument);
  c.num_layers = 1;
  CHECK(plan_model(c).ok());
}
