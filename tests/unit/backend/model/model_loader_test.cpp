// load_model over every format, with the tokenizer and chat template attached.
#include <doctest/doctest.h>

#include "edge/backend/model/model.h"
#include "edge/backend/model/synthetic.h"
#include "model_test_support.h"
#include "synthetic_test_support.h"
#include "weight_test_support.h"
#include "test_support.h"

using namespace edge::backend;
using edge::status_code;
namespace t = edge::testing;
namespace fs = std::filesystem;

namespace {

std::unique_ptr<model> load(load_options options) {
  auto loaded = load_model(options);
  REQUIRE_MESSAGE(loaded.ok(), loaded.error().to_string());
  return std::move(loaded).value();
}

}  // namespace

TEST_CASE("load_model: stories260K as GGUF and as a llama2.c checkpoint") {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> reports;
  load_options options;
  options.path = t::stories260k_dir() / "stories260K.gguf";
  options.progress = [&](std::uint64_t done, std::uint64_t total) { reports.emplace_back(done, total); };
  const auto gguf = load(options);
  CHECK(gguf->name == "stories260K");
  CHECK(gguf->format == model_format::gguf);
  CHECK(gguf->config.num_layers == 5);
  CHECK(gguf->config.vocab_size == 512);
  CHECK(gguf->tok->vocab_size() == 512);
  CHECK(gguf->tok->bos_id() == 1);
  CHECK(gguf->chat_template.spec().builtin == chat_template_kind::plain);
  CHECK(!gguf->synthetic);
  CHECK(gguf->files.size() == 1);
  // Progress runs from 0 to the bytes of every weight (the classifier is a separate copy here).
  REQUIRE(reports.size() >= 2);
  CHECK(reports.front().first == 0);
  CHECK(reports.back().first == reports.back().second);
  CHECK(reports.back().second == 1185376 - 14176);

  const auto bin = load({.path = t::stories260k_dir() / "stories260K.bin"});
  CHECK(bin->format == model_format::llama2c);
  CHECK(bin->name == "stories260K");
  CHECK(bin->config.max_position == 512);
  CHECK(bin->tok->vocab_size() == 512);
  CHECK(t::same_bytes(bin->weights.layers[4].wk, gguf->weights.layers[4].wk));
  CHECK(bin->tok->encode("Once upon a time", {}) == gguf->tok->encode("Once upon a time", {}));
  CHECK(gguf->tok->encode("Once upon a time", {}) == std::vector<token_id>{1, 403, 407, 261, 378});
}

TEST_CASE("load_model: a llama2.c tokenizer given explicitly or missing") {
  t::temp_dir dir;
  fs::copy_file(t::stories260k_dir() / "stories260K.bin", dir / "model.bin");
  auto missing = load_model({.path = dir / "model.bin"});
  CHECK(missing.error().code() == status_code::not_found);
  CHECK(missing.error().message().find("tok512.bin") != std::string::npos);
  const auto given = load({.path = dir / "model.bin", .tokenizer = t::stories260k_dir() / "tok512.bin"});
  CHECK(given->tok->vocab_size() == 512);
  CHECK(given->name == "model");
  fs::copy_file(t::stories260k_dir() / "tok512.bin", dir / "tokenizer.bin");
  CHECK(load({.path = dir / "model.bin"})->tok->vocab_size() == 512);
}

TEST_CASE("load_model: synthetic models in both formats, chat templates detected") {
  t::temp_dir dir;
  const auto folder = t::make_synthetic(dir / "tiny-llama", "tiny", synthetic_format::safetensors, 9);
  const auto file = t::make_synthetic(dir / "tiny-llama.gguf", "tiny", synthetic_format::gguf, 9);
  const auto hf = load({.path = folder});
  const auto gguf = load({.path = file});
  for (const auto* m : {hf.get(), gguf.get()}) {
    CHECK(m->name == "tiny-llama");
    CHECK(m->synthetic);
    CHECK(m->config.vocab_size == 512);
    CHECK(m->tok->vocab_size() == 512);
    // The model's own Jinja template (written in the llama-3 format), with its BOS.
    REQUIRE(m->chat_template.is_models_own());
    const chat_message hi{"user", " Hi "};
    CHECK(m->chat_template.render({.messages = {&hi, 1}}, {})->text ==
          "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
          "<|start_header_id|>assistant<|end_header_id|>\n\n");
    CHECK(m->tok->find_token("<|eot_id|>").has_value());
    CHECK(m->weights.layers.size() == 2);
  }
  CHECK(hf->format == model_format::hugging_face);
  CHECK(hf->config.rope == rope_layout::half_split);
  CHECK(gguf->config.rope == rope_layout::adjacent_pairs);
  CHECK(t::same_bytes(hf->weights.token_embedding, gguf->weights.token_embedding));
  // One tokenizer in two files: the same ids for the same text.
  const std::string text = "The function returns the value of the count, 42 times.\n";
  CHECK(hf->tok->encode(text, {}) == gguf->tok->encode(text, {}));
  CHECK(hf->tok->decode(hf->tok->encode(text, {})) == text);

  const auto qwen = load({.path = t::make_synthetic(dir / "q", "tiny-qwen2", synthetic_format::safetensors, 9)});
  const chat_message hi{"user", "Hi"};
  CHECK(qwen->chat_template.render({.messages = {&hi, 1}, .add_generation_prompt = false}, {})->text ==
        "<|im_start|>user\nHi<|im_end|>\n");
  CHECK(qwen->config.qkv_bias);
  CHECK(qwen->weights.layers[0].bq.present());
  CHECK(qwen->weights.lm_head.data == qwen->weights.token_embedding.data);

  // --chat-template NAME wins over the model's template.
  const auto chosen = load({.path = folder, .chat_template = chat_template_kind::chatml});
  CHECK(chosen->chat_template.spec().builtin == chat_template_kind::chatml);
}

TEST_CASE("load_model: the classifier is quantized on load only when asked; a tied embedding stays as stored") {
  t::temp_dir dir;
  const auto folder = t::make_synthetic(dir / "q", "tiny-qwen2", synthetic_format::safetensors, 9);
  for (const auto format : {edge::kernels::weight_format::int4, edge::kernels::weight_format::fp8_e4m3}) {
    CAPTURE(edge::kernels::to_string(format));
    const auto projections_only = load({.path = folder, .weight_dtype = format});
    CHECK(projections_only->weights.layers[0].wo.format == format);
    CHECK(projections_only->weights.lm_head.format == edge::kernels::weight_format::bf16);
    CHECK(projections_only->weights.lm_head.data == projections_only->weights.token_embedding.data);

    const auto with_classifier = load({.path = folder, .weight_dtype = format, .quantize_classifier = true});
    CHECK(with_classifier->weights.layers[0].wo.format == format);
    CHECK(with_classifier->weights.lm_head.format == format);
    CHECK(with_classifier->weights.lm_head.data != with_classifier->weights.token_embedding.data);
    CHECK(with_classifier->weights.token_embedding.type == edge::kernels::dtype::bf16);
  }
}

TEST_CASE("load_model: MoE experts quantized on load, in groups of --int4-group-size, routers left in float") {
  t::temp_dir dir;
  const auto folder = t::make_synthetic(dir / "moe", "tiny-qwen3-moe", synthetic_format::safetensors, 4);
  // Expert gate/up rows are 64 wide (hidden), down rows 32 (the expert width).
  const struct {
    std::int64_t asked, gate_up, down;
  } cases[] = {{128, 64, 32}, {64, 64, 32}, {32, 32, 32}};
  for (const auto& c : cases) {
    CAPTURE(c.asked);
    const auto m = load({.path = folder, .weight_dtype = edge::kernels::weight_format::int4, .int4_group_size = c.asked});
    REQUIRE(m->config.moe);
    const layer_weights& sparse = m->weights.layers[0];
    REQUIRE(sparse.experts.size() == 8);
    for (const expert_weights& e : sparse.experts) {
      CHECK(e.w_gate_up.present());  // converted, so stacked
      CHECK(e.w_gate_up.format == edge::kernels::weight_format::int4);
      CHECK(e.w_gate_up.group_size == c.gate_up);
      CHECK(e.w_down.group_size == c.down);
    }
    CHECK(sparse.router.format == edge::kernels::weight_format::bf16);
    CHECK(m->weights.layers[1].experts.empty());  // mlp_only_layers: dense
    CHECK(m->weights.layers[1].w_gate.group_size == c.gate_up);
  }
  const auto fp8 = load({.path = folder, .weight_dtype = edge::kernels::weight_format::fp8_e4m3});
  CHECK(fp8->weights.layers[2].experts[5].w_down.format == edge::kernels::weight_format::fp8_e4m3);
  CHECK(fp8->weights.layers[2].router.format == edge::kernels::weight_format::bf16);
  // bf16 as stored: used in place from the file, gate and up apart.
  const auto stored = load({.path = folder});
  CHECK(!stored->weights.layers[0].experts[0].w_gate_up.present());
  const weight_footprint f = footprint_of(stored->config, stored->weights);
  CHECK(f.routed_expert_bytes == 2 * 8 * 3 * 32 * 64 * 2);  // 2 MoE layers of 8 bf16 experts
  CHECK(f.active_bytes_per_token == f.total_bytes - f.routed_expert_bytes + f.routed_expert_bytes / 4);  // top 2 of 8
}

TEST_CASE("load_model: FP8 with 128x128 block scales (DeepSeek-V3's format) is decoded exactly; quantize makes INT4 of it") {
  t::temp_dir dir;
  // tiny-hd128: hidden 256 and MLP width 688, so matrices span several blocks both ways (the
  // last one partial).
  synthetic_options options;
  options.preset = "tiny-hd128";
  options.seed = 3;
  options.fp8_blocks = true;
  options.out = dir / "fp8";
  REQUIRE(write_synthetic_model(options).ok());
  const auto plain = load({.path = t::make_synthetic(dir / "f32", "tiny-hd128", synthetic_format::safetensors, 3,
                                        edge::kernels::dtype::f32),
                           .weight_dtype = edge::kernels::weight_format::f32});
  const auto fp8 = load({.path = dir / "fp8", .weight_dtype = edge::kernels::weight_format::f32});
  const weight_matrix& want = plain->weights.layers[1].w_down;  // [256, 688]
  const weight_matrix& got = fp8->weights.layers[1].w_down;
  REQUIRE(got.shape == want.shape);
  // Each block's scale is its amax / 448, so each value is within E4M3's half step of the original.
  for (std::int64_t br = 0; br < 2; ++br) {
    for (std::int64_t bc = 0; bc < 6; ++bc) {
      float amax = 0.0f;
      for (std::int64_t r = br * 128; r < (br + 1) * 128; ++r) {
        for (std::int64_t c = bc * 128; c < std::min<std::int64_t>((bc + 1) * 128, 688); ++c) {
          amax = std::max(amax, std::abs(t::element(want, r * 688 + c)));
        }
      }
      const float scale = amax / 448.0f;
      for (std::int64_t r = br * 128; r < (br + 1) * 128; r += 37) {
        for (std::int64_t c = bc * 128; c < std::min<std::int64_t>((bc + 1) * 128, 688); c += 11) {
          const float v = t::element(want, r * 688 + c);
          CHECK(std::abs(t::element(got, r * 688 + c) - v) <= std::abs(v) / 16.0f + scale / 512.0f);
        }
      }
    }
  }
  // The embedding and norms are bf16 as written, not FP8.
  CHECK(fp8->weights.token_embedding.type == edge::kernels::dtype::f32);
  // As stored (no --weight-dtype): bf16, since the kernels read FP8 per row only.
  const auto stored = load({.path = dir / "fp8"});
  CHECK(projection_format(stored->weights) == edge::kernels::weight_format::bf16);
  // A checkpoint whose config lost its weight_block_size is refused, naming the scales.
  auto config = t::read_text(dir / "fp8" / "config.json");
  const auto at = config.find("\"quantization_config\"");
  REQUIRE(at != std::string::npos);
  config.erase(at, config.find('}', at) + 3 - at);
  t::write_text(dir / "fp8" / "config.json", config);
  const auto unblocked = load_model({.path = dir / "fp8"});
  REQUIRE(!unblocked.ok());
  CHECK(unblocked.error().message().find("weight_scale_inv\" has block scales") != std::string::npos);
}

TEST_CASE("load_model: the chat template from tokenizer_config.json, chat_template.jinja or --chat-template") {
  t::temp_dir dir;
  const auto folder = t::make_synthetic(dir / "m", "tiny", synthetic_format::safetensors, 1);
  auto config = t::read_text(folder / "tokenizer_config.json");
  const auto key = config.find("\"chat_template\": ");
  REQUIRE(key != std::string::npos);
  const auto end = config.find(",\n", key);
  const std::string jinja = config.substr(key + 17, end - key - 17);
  const auto with_template = [&](const std::string& field) {
    t::write_text(folder / "tokenizer_config.json", config.substr(0, key) + field + config.substr(end));
  };
  const chat_message hi{"user", "Hi"};
  const std::string tools[] = {R"({"type": "function", "function": {"name": "f"}})"};

  // A list: "default" for chat, "tool_use" for requests with tools.
  with_template("\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T{{ tools | length }}\"}, "
                "{\"name\": \"default\", \"template\": " + jinja + "}]");
  const auto listed = load({.path = folder});
  CHECK(listed->chat_template.spec().jinja_tool_use == "T{{ tools | length }}");
  CHECK(listed->chat_template.render({.messages = {&hi, 1}}, {})->text.starts_with("<|begin_of_text|>"));
  CHECK(listed->chat_template.render({.messages = {&hi, 1}, .tools = tools}, {})->text == "T1");

  // Any template is rendered as it is written, with the special tokens tokenizer_config.json
  // names (a string, an AddedToken object, or null: none).
  with_template(R"("chat_template": "{{ bos_token }}|{{ messages[0].content }}|{{ eos_token }}")");
  CHECK(load({.path = folder})->chat_template.render({.messages = {&hi, 1}}, {})->text == "<|begin_of_text|>|Hi|<|eot_id|>");
  const std::string special = t::read_text(folder / "tokenizer_config.json");
  const auto bos = special.find("\"bos_token\": ");
  const auto pad = special.find("\"pad_token\": ");
  REQUIRE((bos != std::string::npos && pad != std::string::npos && bos < pad));
  t::write_text(folder / "tokenizer_config.json",
                special.substr(0, bos) + R"("bos_token": {"content": "<B>", "lstrip": false}, "eos_token": null,)" + "\n  " +
                    special.substr(pad));
  CHECK(load({.path = folder})->chat_template.render({.messages = {&hi, 1}}, {})->text == "<B>|Hi|");

  // chat_template.jinja wins over tokenizer_config.json, as in transformers.
  t::write_text(folder / "chat_template.jinja", "jinja file: {{ messages | length }}\n");
  const auto from_file = load({.path = folder});
  CHECK(from_file->chat_template.spec().origin == (folder / "chat_template.jinja").string());
  CHECK(from_file->chat_template.render({.messages = {&hi, 1}}, {})->text == "jinja file: 1");

  // --chat-template FILE, and the same template without loading weights (render-chat).
  t::write_text(dir / "mine.jinja", "mine: {{ messages[0]['content'] }}{% if add_generation_prompt %}>{% endif %}");
  const load_options mine{.path = folder, .chat_template_file = dir / "mine.jinja"};
  CHECK(load(mine)->chat_template.render({.messages = {&hi, 1}}, {})->text == "mine: Hi>");
  const auto without_weights = load_chat_template(mine);
  REQUIRE(without_weights.ok());
  CHECK(without_weights->render({.messages = {&hi, 1}, .add_generation_prompt = false}, {})->text == "mine: Hi");
  CHECK(load_model({.path = folder, .chat_template_file = dir / "missing.jinja"}).error().code() == status_code::not_found);

  // A template that does not parse stops the load, naming where.
  t::write_text(folder / "chat_template.jinja", "ok\n{% for m in messages %}{{ m.content }");
  const auto broken = load_model({.path = folder});
  REQUIRE(!broken.ok());
  CHECK(broken.error().message().find("chat_template.jinja: line 2, column ") != std::string::npos);
  // A built-in template named with --chat-template serves the model anyway.
  CHECK(load({.path = folder, .chat_template = chat_template_kind::llama3})->chat_template.spec().builtin ==
        chat_template_kind::llama3);
}

TEST_CASE("load_model: a tokenizer_config.json number that no 64-bit type holds is not read") {
  // Llama 3's files write model_max_length, 1e30, in digits.
  t::temp_dir dir;
  const auto folder = t::make_synthetic(dir / "m", "tiny", synthetic_format::safetensors, 1);
  const auto config = t::read_text(folder / "tokenizer_config.json");
  REQUIRE(config.starts_with("{"));
  t::write_text(folder / "tokenizer_config.json",
                "{\"model_max_length\": 1000000000000000019884624838656," + config.substr(1));
  const auto m = load({.path = folder});
  CHECK(m->chat_template.spec().jinja.find("<|start_header_id|>") != std::string::npos);
  CHECK(m->tok->bos_id().has_value());
}

TEST_CASE("load_model: errors name the file") {
  t::temp_dir dir;
  auto missing = load_model({.path = dir / "absent.gguf"});
  CHECK(missing.error().code() == status_code::not_found);
  CHECK(missing.error().message().find("absent.gguf") != std::string::npos);

  t::write_text(dir / "notes.txt", "hello, this is not a model at all, just some text.");
  auto text = load_model({.path = dir / "notes.txt"});
  CHECK(text.error().code() == status_code::invalid_argument);
  CHECK(text.error().message().find("notes.txt") != std::string::npos);

  fs::create_directories(dir / "empty");
  CHECK(load_model({.path = dir / "empty"}).error().message().find("config.json") != std::string::npos);

  auto bytes = t::read_bytes(t::stories260k_dir() / "stories260K.gguf");
  bytes.resize(bytes.size() / 2);
  t::write_bytes(dir / "half.gguf", bytes);
  auto half = load_model({.path = dir / "half.gguf"});
  CHECK(half.error().code() == status_code::data_loss);
  CHECK(half.error().message().find("half.gguf") != std::string::npos);

  const auto folder = t::make_synthetic(dir / "m", "tiny", synthetic_format::safetensors, 1);
  auto config = t::read_text(folder / "config.json");
  const auto at = config.find("\"intermediate_size\": 176");
  REQUIRE(at != std::string::npos);
  config.replace(at, 24, "\"intermediate_size\": 100");
  t::write_text(folder / "config.json", config);
  auto mismatch = load_model({.path = folder});
  CHECK(mismatch.error().code() == status_code::invalid_argument);
  CHECK(mismatch.error().message().find("model.layers.0.mlp.gate_proj.weight\" has shape [176, 64], expected [100, 64]") !=
        std::string::npos);
  CHECK(mismatch.error().message().find(folder.string()) != std::string::npos);
}
