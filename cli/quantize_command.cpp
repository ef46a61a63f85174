// `edgeinfer quantize`: loads a model with its projections quantized to INT4 or FP8 (exactly as
// `--weight-dtype` does on load) and writes it as a compressed-tensors Hugging Face folder, which
// then loads without re-quantizing (backend/include/edge/backend/model/quantized_checkpoint.h).
#include <chrono>
#include <cstdio>
#include <limits>
#include <string>

#include "commands.h"
#include "edge/backend/model/model.h"
#include "edge/backend/model/quantized_checkpoint.h"
#include "edge/common/format.h"
#include "edge/common/log.h"
#include "progress.h"
#include "weight_options.h"

namespace edge::cli {
namespace {

// Hugging Face's own shard limit when it saves a model.
constexpr std::string_view default_shard_size = "5GB";
constexpr std::int64_t min_shard_bytes = 1 << 20;

config::schema quantize_options() {
  config::schema s;
  s.add_path("model", std::nullopt, "Model to quantize: a GGUF file, a llama2.c checkpoint or a Hugging Face folder (required)");
  s.add_path("tokenizer", std::nullopt, "Tokenizer file for a llama2.c checkpoint (default: beside it)");
  s.add_choice("weight-dtype", "int4", {"int4", "fp8"},
               "int4: symmetric, a scale per group of --int4-group-size inputs per row (pack-quantized W4A16); fp8: E4M3, a scale "
               "per row (float-quantized W8A16)");
  add_quantize_on_load_options(s);
  s.add_path("out", std::nullopt, "Folder to write: new or empty (required)");
  s.add_bytes("max-shard-size", std::string(default_shard_size), min_shard_bytes,
              std::numeric_limits<std::int64_t>::max(),
              "Split the weights into shards of at most this size, listed by model.safetensors.index.json");
  return s;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int run_quantize(const config::values& settings) {
  const logger log{"quantize"};
  const auto out = settings.optional_string("out");
  if (!settings.has("model") || !out || out->empty()) {
    std::fprintf(stderr, "edgeinfer quantize: --model and --out are required\n");
    return 2;
  }
  backend::load_options load;
  load.path = settings.string("model");
  if (settings.has("tokenizer")) load.tokenizer = settings.string("tokenizer");
  load.weight_dtype = kernels::parse_weight_format(settings.string("weight-dtype"));
  apply_quantize_on_load(settings, load);

  const auto started = std::chrono::steady_clock::now();
  auto loaded = [&] {
    progress_bar bar("quantizing " + load.path.filename().string());
    load.progress = [&bar](std::uint64_t done, std::uint64_t total) { bar.update(done, total); };
    auto m = backend::load_model(load);
    load.progress = nullptr;
    return m;
  }();
  if (!loaded.ok()) {
    log.error("{}", loaded.error().message());
    return 1;
  }
  const backend::model& m = **loaded;
  log.info("loaded {} with {} projections ({:.1f} s)", m.name, kernels::to_string(backend::projection_format(m.weights)),
           seconds_since(started));

  backend::quantized_checkpoint_options options{.source = load, .out = *out,
                                                .max_shard_bytes = settings.bytes("max-shard-size")};
  std::uint64_t bytes = 0;
  const auto writing = std::chrono::steady_clock::now();
  auto written = [&] {
    progress_bar bar("writing " + options.out.filename().string());
    options.progress = [&](std::uint64_t done, std::uint64_t total) {
      bytes = total;
      bar.update(done, total);
    };
    return backend::write_quantized_checkpoint(m, options);
  }();
  if (!written.ok()) {
    log.error("{}", written.error().message());
    return 1;
  }
  // The published comparison (an FP8 release against its INT4 one): the files read against
  // the tensors written.
  std::uint64_t source_bytes = 0;
  for (const auto& file : m.files) source_bytes += file->bytes().size();
  log.info("wrote {} ({} weights, compressed-tensors, {} of tensors, from {} of weight files: {:.2f}x) to {} in "
           "{:.1f} s",
           m.name, settings.string("weight-dtype"), format_bytes(bytes), format_bytes(source_bytes),
           source_bytes > 0 ? static_cast<double>(bytes) / static_cast<double>(source_bytes) : 0.0,
           written->string(), seconds_since(writing));
  return 0;
}

}  // namespace

command make_quantize_command(CLI::App& app) {
  return command(app, "quantize",
                 "Quantize a model's weights to INT4 or FP8 and write them as a compressed-tensors checkpoint",
                 quantize_options(), run_quantize);
}

}  // namespace edge::cli
