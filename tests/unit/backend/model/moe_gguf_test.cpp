// GGUF qwen3moe, as llama.cpp's converter writes it: make-model's GGUF and safetensors forms of
// a seed load as the same network (each expert a slice of its layer's stacked tensors, used in
// place), compute the same logits and choose the same experts; bad expert tensors and metadata
// are named.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "edge/backend/io/gguf.h"
#include "edge/backend/model/formats.h"
#include "edge/backend/model/model.h"
#include "edge/backend/model/synthetic.h"
#include "forward_test_support.h"
#include "model_test_support.h"
#include "synthetic_test_support.h"
#include "test_support.h"
#include "weight_test_support.h"

using namespace edge::backend;
using edge::status_code;
namespace t = edge::testing;
namespace fs = std::filesystem;

namespace {

constexpr std::string_view preset = "tiny-qwen3-moe-sparse";

fs::path make(const fs::path& out, synthetic_format format, std::uint64_t seed, edge::kernels::dtype dtype) {
  return t::make_synthetic(out, std::string(preset), format, seed, dtype);
}

}  // namespace

TEST_CASE("GGUF qwen3moe: the keys and stacked experts llama.cpp writes, each expert a slice used in place") {
  for (const auto dtype : {edge::kernels::dtype::bf16, edge::kernels::dtype::f16}) {
    CAPTURE(edge::kernels::to_string(dtype));
    t::temp_dir dir;
    const auto hf = t::load(make(dir / "hf", synthetic_format::safetensors, 21, dtype));
    const auto gguf = t::load(make(dir / "moe.gguf", synthetic_format::gguf, 21, dtype));

    auto file = load_gguf(dir / "moe.gguf");
    REQUIRE(file.ok());
    CHECK(*file->find("general.architecture")->as_string() == "qwen3moe");
    CHECK(file->find("qwen3moe.expert_count")->as_int() == 8);
    CHECK(file->find("qwen3moe.expert_used_count")->as_int() == 2);
    CHECK(file->find("qwen3moe.expert_feed_forward_length")->as_int() == 32);
    CHECK(file->find_tensor("blk.0.ffn_gate_inp.weight")->shape == std::vector<std::int64_t>{8, 64});
    CHECK(file->find_tensor("blk.1.ffn_gate_exps.weight")->shape == std::vector<std::int64_t>{8, 32, 64});
    CHECK(file->find_tensor("blk.1.ffn_up_exps.weight")->shape == std::vector<std::int64_t>{8, 32, 64});
    CHECK(file->find_tensor("blk.1.ffn_down_exps.weight")->shape == std::vector<std::int64_t>{8, 64, 32});
    CHECK(file->find_tensor("blk.0.ffn_gate.weight") == nullptr);

    const model_config& c = gguf->config;
    CHECK(c.arch == architecture::qwen3_moe);
    CHECK(c.rope == rope_layout::half_split);
    CHECK(c.qk_norm);
    REQUIRE(c.moe);
    CHECK(c.moe->num_experts == 8);
    CHECK(c.moe->experts_per_token == 2);
    CHECK(c.moe->expert_intermediate == 32);
    CHECK(c.moe->normalize_weights);
    CHECK(c.moe->scoring == edge::kernels::router_scoring::softmax);
    CHECK(c.moe->shared_experts == 0);
    for (std::int64_t l = 0; l < c.num_layers; ++l) CHECK(c.moe->sparse(l));
    CHECK(gguf->chat_template.spec().jinja.find("<|im_start|>") != std::string::npos);

    REQUIRE(gguf->weights.layers.size() == hf->weights.layers.size());
    for (std::size_t l = 0; l < gguf->weights.layers.size(); ++l) {
      CAPTURE(l);
      const layer_weights& g = gguf->weights.layers[l];
      const layer_weights& h = hf->weights.layers[l];
      // llama.cpp keeps routers (and norms) in F32, holding the checkpoint's values widened.
      CHECK(g.router.format == edge::kernels::weight_format::f32);
      CHECK(g.router.shape == h.router.shape);
      for (std::int64_t i = 0; i < h.router.elements(); ++i) REQUIRE(t::element(g.router, i) == t::element(h.router, i));
      for (std::int64_t i = 0; i < h.q_norm.elements(); ++i) REQUIRE(t::element(g.q_norm, i) == t::element(h.q_norm, i));
      REQUIRE(g.experts.size() == 8);
      const std::string blk = "blk." + std::to_string(l) + ".";
      for (std::size_t e = 0; e < g.experts.size(); ++e) {
        CAPTURE(e);
        CHECK(t::same_bytes(g.experts[e].w_gate, h.experts[e].w_gate));
        CHECK(t::same_bytes(g.experts[e].w_up, h.experts[e].w_up));
        CHECK(t::same_bytes(g.experts[e].w_down, h.experts[e].w_down));
        // Slice e of each stack, in the file's own pages.
        for (const auto& [matrix, stack] : {std::pair{&g.experts[e].w_gate, "ffn_gate_exps"},
                                            std::pair{&g.experts[e].w_up, "ffn_up_exps"},
                                            std::pair{&g.experts[e].w_down, "ffn_down_exps"}}) {
          const auto* stacked = file->find_tensor(blk + stack + ".weight");
          REQUIRE(stacked != nullptr);
          const auto offset = static_cast<std::ptrdiff_t>(stacked->data - file->file->bytes().data());
          const std::byte* mapped = gguf->files.front()->bytes().data() + offset;
          CHECK(matrix->data == mapped + e * stacked->bytes() / 8);
          CHECK(matrix->name == blk + stack + ".weight[" + std::to_string(e) + "]");
        }
        CHECK(!g.experts[e].w_gate_up.present());  // in place: not stacked
      }
    }
  }
}

TEST_CASE("GGUF qwen3moe: the same logits and the same chosen experts as the safetensors folder") {
  t::temp_dir dir;
  const auto hf = t::load(make(dir / "hf", synthetic_format::safetensors, 4, edge::kernels::dtype::f32));
  const auto gguf = t::load(make(dir / "moe.gguf", synthetic_format::gguf, 4, edge::kernels::dtype::f32));
  const auto tokens = hf->tok->encode("Experts of a mixture, chosen per token.", {});
  REQUIRE(tokens.size() >= 8);
  CHECK(gguf->tok->encode("Experts of a mixture, chosen per token.", {}) == tokens);

  const t::forced_run a = t::force(*hf, tokens);
  const t::forced_run b = t::force(*gguf, tokens);
  CHECK(a.moe_layers == hf->config.num_layers);
  CHECK(t::logit_difference(a, b) <= 1e-5f);
  t::check_same_experts(a, b, 6);
}

TEST_CASE("GGUF qwen3moe: a missing or misshapen expert stack, and bad MoE metadata, are named") {
  t::temp_dir dir;
  const auto path = make(dir / "moe.gguf", synthetic_format::gguf, 2, edge::kernels::dtype::bf16);
  auto file = load_gguf(path);
  REQUIRE(file.ok());
  auto config = config_from_gguf(*file);
  REQUIRE_MESSAGE(config.ok(), config.error().to_string());

  SUBCASE("ffn_up_exps of the wrong shape") {
    auto copy = *file;
    for (auto& v : copy.tensors) {
      if (v.name == "blk.1.ffn_up_exps.weight") v.shape = {8, 64, 32};
    }
    const auto weights = weights_from_gguf(copy, config->config);
    REQUIRE(!weights.ok());
    CHECK(weights.error().code() == status_code::invalid_argument);
    CHECK(weights.error().message() == "tensor \"blk.1.ffn_up_exps.weight\" has shape [8, 64, 32], expected [8, 32, 64]");
  }
  SUBCASE("a stack of fewer experts") {
    auto copy = *file;
    for (auto& v : copy.tensors) {
      if (v.name == "blk.0.ffn_down_exps.weight") v.shape = {4, 64, 32};
    }
    const auto weights = weights_from_gguf(copy, config->config);
    REQUIRE(!weights.ok());
    CHECK(weights.error().message() == "tensor \"blk.0.ffn_down_exps.weight\" has shape [4, 64, 32], expected [8, 64, 32]");
  }
  SUBCASE("a missing stack") {
    auto copy = *file;
    std::erase_if(copy.tensors, [](const tensor_view& v) { return v.name == "blk.1.ffn_gate_exps.weight"; });
    const auto weights = weights_from_gguf(copy, config->config);
    REQUIRE(!weights.ok());
    CHECK(weights.error().message() == "missing tensor \"blk.1.ffn_gate_exps.weight\" (expected shape [8, 32, 64])");
  }
  SUBCASE("a missing router") {
    auto copy = *file;
    std::erase_if(copy.tensors, [](const tensor_view& v) { return v.name == "blk.0.ffn_gate_inp.weight"; });
    const auto weights = weights_from_gguf(copy, config->config);
    REQUIRE(!weights.ok());
    CHECK(weights.error().message() == "missing tensor \"blk.0.ffn_gate_inp.weight\" (expected shape [8, 64])");
  }
  SUBCASE("MoE metadata") {
    auto copy = *file;
    copy.metadata.erase("qwen3moe.expert_count");
    CHECK(config_from_gguf(copy).error().message().find("qwen3moe.expert_count") != std::string::npos);
    copy = *file;
    copy.metadata["qwen3moe.expert_used_count"] = gguf_value{std::uint64_t{9}};
    CHECK(config_from_gguf(copy).error().code() == status_code::invalid_argument);
    copy = *file;
    copy.metadata["qwen3moe.expert_weights_norm"] = gguf_value{false};
    CHECK(config_from_gguf(copy).error().code() == status_code::unimplemented);
    // Without expert_feed_forward_length, llama.cpp takes feed_forward_length / expert_used_count.
    copy = *file;
    copy.metadata.erase("qwen3moe.expert_feed_forward_length");
    copy.metadata["qwen3moe.feed_forward_length"] = gguf_value{std::uint64_t{64}};
    auto fallback = config_from_gguf(copy);
    REQUIRE(fallback.ok());
    CHECK(fallback->config.moe->expert_intermediate == 32);
  }
}
