// `edgeinfer make-model`: writes a synthetic model (seeded random weights at a real model's
// shapes, a byte-level BPE tokenizer of its vocabulary size) as a Hugging Face safetensors
// folder or one GGUF file, marked as synthetic. For load and speed tests where real weights are
// too big to ship; see backend/include/edge/backend/model/synthetic.h.
#include <chrono>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "commands.h"
#include "edge/backend/model/synthetic.h"
#include "edge/common/format.h"
#include "edge/common/log.h"
#include "progress.h"

namespace edge::cli {
namespace {

// Hugging Face's own shard limit when it saves a model.
constexpr std::string_view default_shard_size = "5GB";
constexpr std::int64_t min_shard_bytes = 1 << 20;

config::schema make_model_options() {
  std::vector<std::string> presets;
  std::string preset_help = "Model shapes to copy:";
  for (const auto& preset : backend::synthetic_presets()) {
    presets.push_back(preset.name);
    preset_help += "\n  " + preset.name + ": " + preset.description;
  }
  config::schema s;
  s.add_choice("preset", "tiny", presets, preset_help);
  s.add_choice("format", "safetensors", {"safetensors", "gguf"},
               "safetensors: a Hugging Face folder (config.json, model.safetensors, tokenizer.json); gguf: one file");
  s.add_integer("seed", 0, 0, std::numeric_limits<std::int64_t>::max(),
                "Seed of the random weights; the same seed writes the same bytes");
  s.add_path("out", std::nullopt, "Folder (safetensors) or file (gguf) to write (required)");
  s.add_choice("dtype", "bf16", {"bf16", "f16", "f32", "fp8-block"},
               "Element type of the weights; fp8-block: the projections and experts as FP8 E4M3 with a scale per "
               "128x128 block (DeepSeek-V3's FP8 format, safetensors only), the rest bf16. For INT4 checkpoints, "
               "run `edgeinfer quantize` on the result");
  s.add_integer("layers", 0, 0, std::numeric_limits<std::int64_t>::max(),
                "Write only the preset's first N layers, each at its real shape (0: all), so that the large "
                "presets fit a small machine");
  s.add_integer("experts", 0, 0, std::numeric_limits<std::int64_t>::max(),
                "Mixture-of-Experts presets: write only the first N routed experts of each sparse layer, each at its "
                "real shape, with the same experts per token (0: all); a token reads the same bytes, a batch shares "
                "fewer distinct experts");
  s.add_integer("context-length", 0, 0, std::numeric_limits<std::int64_t>::max(),
                "The context length the model declares instead of the preset's (0: the preset's), e.g. a long one "
                "for a small preset in long-session serving benchmarks");
  s.add_bytes("max-shard-size", std::string(default_shard_size), min_shard_bytes,
              std::numeric_limits<std::int64_t>::max(),
              "safetensors: split the weights into shards of at most this size, listed by model.safetensors.index.json");
  return s;
}

int run_make_model(const config::values& settings) {
  const logger log{"make-model"};
  const auto out = settings.optional_string("out");
  if (!out || out->empty()) {
    std::fprintf(stderr, "edgeinfer make-model: --out is required (a folder for safetensors, a file for gguf)\n");
    return 2;
  }

  backend::synthetic_options options;
  options.preset = settings.string("preset");
  options.format = *backend::parse_synthetic_format(settings.string("format"));
  options.seed = static_cast<std::uint64_t>(settings.integer("seed"));
  options.fp8_blocks = settings.string("dtype") == "fp8-block";
  options.dtype = options.fp8_blocks ? kernels::dtype::bf16 : *kernels::parse_dtype(settings.string("dtype"));
  options.out = *out;
  options.max_shard_bytes = settings.bytes("max-shard-size");
  options.layers = settings.integer("layers");
  options.experts = settings.integer("experts");
  options.context_length = settings.integer("context-length");

  const auto started = std::chrono::steady_clock::now();
  std::uint64_t weight_bytes = 0;
  result<std::filesystem::path> written = [&] {
    progress_bar bar("writing " + options.out.filename().string());
    options.progress = [&](std::uint64_t done, std::uint64_t total) {
      weight_bytes = total;
      bar.update(done, total);
    };
    return backend::write_synthetic_model(options);
  }();
  if (!written.ok()) {
    log.error("{}", written.error().message());
    return 1;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  log.info("wrote {} (synthetic {} weights, seed {}, {} of weights) to {} in {:.1f} s", options.preset,
           options.fp8_blocks ? "fp8-block" : kernels::to_string(options.dtype), options.seed, format_bytes(weight_bytes), written->string(), seconds);
  return 0;
}

}  // namespace

command make_make_model_command(CLI::App& app) {
  return command(app, "make-model",
                 "Write a synthetic model: seeded random weights at a real model's shapes, marked as synthetic",
                 make_model_options(), run_make_model);
}

}  // namespace edge::cli
