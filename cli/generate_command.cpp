// `edgeinfer generate`: one prompt through the model on the CPU or a CUDA GPU (--device), the
// completion streamed to stdout as it is produced. stdout carries the prompt and the completion and nothing else;
// loading progress and timings go to stderr.
#include <unistd.h>

#include <cstdio>
#include <limits>
#include <thread>

#include "chat_template_options.h"
#include "commands.h"
#include "edge/backend/model/model.h"
#include "edge/backend/runtime/cpu_executor.h"
#include "edge/backend/runtime/cuda_executor.h"
#include "edge/backend/engine/generator.h"
#include "edge/common/format.h"
#include "edge/common/thread_pool.h"
#include "progress.h"
#include "weight_options.h"

namespace edge::cli {
namespace {

// Prompt tokens one prefill step takes at most; longer prompts are prefilled in chunks.
constexpr std::int64_t prefill_step_tokens = 512;

config::schema generate_options() {
  config::schema s;
  s.add_path("model", std::nullopt, "Model: a GGUF file, a llama2.c checkpoint or a Hugging Face folder (required)");
  s.add_path("tokenizer", std::nullopt, "Tokenizer file for a llama2.c checkpoint (default: beside it)");
  s.add_string("prompt", std::nullopt, "The prompt text (required)");
  s.add_boolean("chat", false, "Send the prompt as a user message through the model's chat template");
  add_chat_template_option(s);
  s.add_integer("max-tokens", 128, 1, std::int64_t{1} << 24, "Most tokens to generate");
  s.add_number("temperature", 0.8, 0.0, 100.0, "Sampling temperature; 0 is greedy");
  s.add_number("top-p", 1.0, 0.0, 1.0, "Nucleus sampling: keep the most likely tokens up to this probability mass");
  s.add_integer("top-k", 0, 0, std::int64_t{1} << 24, "Keep only the k most likely tokens; 0 keeps all");
  s.add_number("min-p", 0.0, 0.0, 1.0, "Drop tokens less likely than this fraction of the most likely one");
  s.add_number("repetition-penalty", 1.0, 0.01, 100.0, "Above 1 discourages tokens already seen");
  s.add_integer("seed", -1, -1, std::numeric_limits<std::int64_t>::max(), "Random seed; -1 draws one");
  s.add_boolean("ignore-eos", false, "Keep generating past the end-of-sequence token");
  s.add_choice("kv-cache-dtype", "auto", {"auto", "fp8", "fp8_e4m3", "bf16", "f16", "f32"},
               "KV cache element type; fp8 is E4M3 with a scale per token and KV head; auto is the model's own "
               "dtype (f32, f16 or bf16)");
  s.add_integer("threads", 0, 0, 1024, "Compute threads; 0 means one per hardware thread");
  s.add_choice("weight-dtype", "auto", {"auto", "int4", "int8", "fp8", "bf16", "f16", "f32"},
               "Projection weights: int4 (groups of --int4-group-size), int8 (a scale per 32) or fp8 (a scale per row) "
               "quantized on load, or converted to bf16, f16 or f32; auto keeps them as stored");
  add_quantize_on_load_options(s);
  s.add_choice("device", "auto", {"auto", "cpu", "cuda"},
               "Where the model runs: cuda (the first GPU), cpu, or auto (cuda when a GPU is present)");
  s.add_number("gpu-memory-utilization", 0.9, 0.01, backend::max_gpu_memory_utilization,
               "With --device cuda: the share of the GPU's memory weights, buffers and KV cache may take");
  return s;
}

// Whether to run on CUDA: --device cuda insists (an error without a GPU), auto falls back to
// the CPU and says so.
result<bool> choose_cuda(const std::string& device) {
  if (device == "cpu") return false;
  std::string why;
  const bool available = backend::cuda_available(&why);
  if (device == "cuda") {
    if (!available) return failed_precondition(format("--device cuda: {}", why));
    return true;
  }
  if (!available) std::fprintf(stderr, "edgeinfer generate: --device auto: %s; running on the CPU\n", why.c_str());
  return available;
}

// The choices offered are exactly the names parse_kv_cache_dtype accepts.
kernels::dtype kv_dtype_for(const std::string& choice, const backend::model& m) {
  return backend::resolve_kv_cache_dtype(backend::parse_kv_cache_dtype(choice).value(), m);
}

result<std::unique_ptr<backend::model>> load_with_progress(backend::load_options options) {
  progress_bar bar("loading " + options.path.filename().string());
  options.progress = [&bar](std::uint64_t done, std::uint64_t total) { bar.update(done, total); };
  return backend::load_model(options);
}

result<std::vector<backend::token_id>> prompt_tokens(const backend::model& m, const std::string& prompt, bool chat) {
  const backend::tokenizer& tok = *m.tok;
  if (!chat) return tok.encode(prompt, {.add_bos = true, .parse_special = false});
  backend::chat_render_options options;
  if (auto bos = tok.bos_id()) options.bos_text = tok.token_text(*bos);
  if (!tok.eos_ids().empty()) options.eos_text = tok.token_text(tok.eos_ids().front());
  const backend::chat_message message{"user", prompt};
  // The prompt is the operator's, given on the command line: its special-token text is parsed.
  EDGE_ASSIGN_OR_RETURN(const backend::marked_text rendered, m.chat_template.render({.messages = {&message, 1}}, options));
  return tok.encode(rendered.text, {.add_bos = false, .parse_special = true});
}

void write_out(std::string_view text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

int run_generate(const config::values& settings) {
  if (!settings.has("model") || !settings.has("prompt")) {
    std::fprintf(stderr, "edgeinfer generate: --model and --prompt are required\n");
    return 2;
  }
  backend::load_options load;
  load.path = settings.string("model");
  if (settings.has("tokenizer")) load.tokenizer = settings.string("tokenizer");
  load.weight_dtype = kernels::parse_weight_format(settings.string("weight-dtype"));  // nullopt for auto
  apply_quantize_on_load(settings, load);
  apply_chat_template_choice(settings, load);
  const auto use_cuda = choose_cuda(settings.string("device"));
  if (!use_cuda.ok()) {
    std::fprintf(stderr, "edgeinfer generate: %s\n", use_cuda.error().message().c_str());
    return 1;
  }
  load.cpu_tiles = !*use_cuda;
  auto loaded = load_with_progress(load);
  if (!loaded.ok()) {
    std::fprintf(stderr, "edgeinfer generate: %s\n", loaded.error().message().c_str());
    return 1;
  }
  const backend::model& m = **loaded;

  backend::generate_request request;
  const std::string& prompt = settings.string("prompt");
  auto rendered = prompt_tokens(m, prompt, settings.boolean("chat"));
  if (!rendered.ok()) {
    std::fprintf(stderr, "edgeinfer generate: %s\n", rendered.error().message().c_str());
    return 1;
  }
  request.prompt = std::move(rendered).value();
  request.max_tokens = settings.integer("max-tokens");
  request.ignore_eos = settings.boolean("ignore-eos");
  request.sampling.temperature = static_cast<float>(settings.number("temperature"));
  request.sampling.top_p = static_cast<float>(settings.number("top-p"));
  request.sampling.top_k = static_cast<std::int32_t>(settings.integer("top-k"));
  request.sampling.min_p = static_cast<float>(settings.number("min-p"));
  request.sampling.repetition_penalty = static_cast<float>(settings.number("repetition-penalty"));
  if (settings.integer("seed") >= 0) request.sampling.seed = static_cast<std::uint64_t>(settings.integer("seed"));

  const auto prompt_length = static_cast<std::int64_t>(request.prompt.size());
  if (prompt_length >= m.config.max_position) {
    std::fprintf(stderr, "edgeinfer generate: the prompt has %lld tokens; the model's context is %lld\n",
                 static_cast<long long>(prompt_length), static_cast<long long>(m.config.max_position));
    return 1;
  }
  const std::int64_t positions = std::min(prompt_length + request.max_tokens, m.config.max_position);
  const auto layout = backend::kv_cache_layout::for_tokens(m.config, kv_dtype_for(settings.string("kv-cache-dtype"), m),
                                                           16, positions);

  std::size_t threads = static_cast<std::size_t>(settings.integer("threads"));
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  std::unique_ptr<backend::kv_cache> cache;
  std::unique_ptr<thread_pool> pool;
  std::unique_ptr<backend::executor> exec;
  std::string where;
  // At least a KV block: the scheduler prefills in whole blocks.
  const std::int64_t step_tokens = std::max(std::min(prompt_length, prefill_step_tokens), layout.block_size);
  if (*use_cuda) {
    // Room for this one sequence, plus the block CUDA-graph batches pad into.
    auto created = backend::cuda_executor::create(
        m, {.max_batch_tokens = step_tokens, .max_sequences = 1, .kv_dtype = layout.dtype, .block_size = layout.block_size,
            .gpu_memory_utilization = settings.number("gpu-memory-utilization"),
            .kv_cache_bytes = static_cast<std::size_t>(layout.num_blocks + 1) * layout.bytes_per_block()});
    if (!created.ok()) {
      std::fprintf(stderr, "edgeinfer generate: %s\n", created.error().message().c_str());
      return 1;
    }
    where = "CUDA: " + (*created)->describe();
    exec = std::move(*created);
  } else {
    auto created_cache = backend::kv_cache::create(layout);
    if (!created_cache.ok()) {
      std::fprintf(stderr, "edgeinfer generate: %s\n", created_cache.error().message().c_str());
      return 1;
    }
    cache = std::move(*created_cache);
    // The calling thread computes too, so the pool holds one worker fewer.
    if (threads > 1) pool = std::make_unique<thread_pool>(threads - 1);
    auto created = backend::cpu_executor::create(m, *cache, pool.get(), {.max_batch_tokens = step_tokens, .max_sequences = 1});
    if (!created.ok()) {
      std::fprintf(stderr, "edgeinfer generate: %s\n", created.error().message().c_str());
      return 1;
    }
    where = format("{} threads", threads);
    exec = std::move(*created);
  }

  write_out(prompt);
  backend::kv_block_pool blocks(layout.num_blocks);
  backend::generator gen(m, *exec, blocks);
  backend::generation_timing timing;
  auto outputs = gen.run({&request, 1}, [](std::size_t, std::string_view text) { write_out(text); }, &timing);
  if (::isatty(STDOUT_FILENO) == 1) write_out("\n");
  if (!outputs.ok()) {
    std::fprintf(stderr, "edgeinfer generate: %s\n", outputs.error().message().c_str());
    return 1;
  }
  const auto rate = [](std::int64_t tokens, double seconds) { return seconds > 0 ? tokens / seconds : 0.0; };
  std::fprintf(stderr, "%s\n",
               format("prompt: {} tokens, {:.1f} tok/s; generated: {} tokens, {:.1f} tok/s ({}, weights {}, "
                      "KV {})",
                      timing.prefill_tokens, rate(timing.prefill_tokens, timing.prefill_seconds),
                      outputs->front().tokens.size(), rate(timing.decode_tokens, timing.decode_seconds), where,
                      kernels::to_string(backend::projection_format(m.weights)), kernels::to_string(layout.dtype))
                   .c_str());
  return 0;
}

}  // namespace

command make_generate_command(CLI::App& app) {
  return command(app, "generate", "Generate a completion for one prompt on the CPU or a GPU, streamed to stdout",
                 generate_options(), run_generate);
}

}  // namespace edge::cli
