// load_model: recognises the format by content, binds the weights, attaches the tokenizer and
// the chat template, and reads the weight pages in ahead of the first request.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include "edge/backend/io/safetensors.h"
#include "edge/backend/model/formats.h"
#include "edge/backend/model/model.h"
#include "edge/backend/model_locator.h"
#include "edge/common/format.h"
#include "edge/common/json_fields.h"
#include "edge/common/log.h"
#include "edge/common/thread_pool.h"
#include "cpu_tile_weights.h"
#include "kernels/cpu/isa.h"

namespace edge::backend {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view gguf_magic = "GGUF";
// Progress is reported after each chunk of pages read in: fine enough for a smooth bar,
// coarse enough that the callback costs nothing.
constexpr std::uint64_t prefault_chunk_bytes = std::uint64_t{64} << 20;

result<std::string> read_text_file(const fs::path& path) {
  EDGE_ASSIGN_OR_RETURN(const auto mapping, mapped_file::open(path));
  const auto bytes = mapping->bytes();
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// Kernels read norms, biases and the embedding table through typed pointers; a tensor that a
// file placed at an address not aligned for its element type is copied into a buffer the model
// owns. (Weight matrices are realigned when they are bound: weight_conversion.h.)
void align_weights(model_weights& weights) {
  std::map<const std::byte*, const std::byte*> moved;
  const auto align = [&](tensor_view& view) {
    if (!view.present() || view.encoding != tensor_encoding::elements) return;
    if (reinterpret_cast<std::uintptr_t>(view.data) % kernels::dtype_size(view.type) == 0) return;
    auto [it, inserted] = moved.emplace(view.data, nullptr);
    if (inserted) {
      std::shared_ptr<std::byte[]> buffer(new std::byte[view.bytes()]);
      std::memcpy(buffer.get(), view.data, view.bytes());
      it->second = buffer.get();
      weights.storage.push_back(std::move(buffer));
    }
    view.data = it->second;
  };
  align(weights.token_embedding);
  align(weights.final_norm);
  for (auto& layer : weights.layers) {
    for (auto* view : {&layer.attn_norm, &layer.ffn_norm, &layer.bq, &layer.bk, &layer.bv}) align(*view);
  }
}

struct byte_range {
  const std::byte* data;
  std::uint64_t size;
};

std::vector<byte_range> ranges_of(std::span<const tensor_view> tensors) {
  std::vector<byte_range> ranges;
  ranges.reserve(tensors.size());
  for (const auto& t : tensors) {
    if (t.present()) ranges.push_back({t.data, t.bytes()});
  }
  return ranges;
}

// Touches every page of the tensors once, before any is used or converted, so that neither
// conversion nor the first request pays for reading the file, and reports progress as it goes.
void read_in(std::vector<byte_range> ranges, std::span<const std::shared_ptr<const mapped_file>> files,
             const load_options& options) {
  std::sort(ranges.begin(), ranges.end(), [](const byte_range& a, const byte_range& b) { return a.data < b.data; });
  ranges.erase(std::unique(ranges.begin(), ranges.end(),
                           [](const byte_range& a, const byte_range& b) { return a.data == b.data; }),
               ranges.end());
  std::uint64_t total = 0;
  for (const auto& r : ranges) total += r.size;

  static const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  std::uint64_t done = 0;
  std::uint8_t checksum = 0;
  if (options.progress) options.progress(0, total);
  for (const auto& r : ranges) {
    const auto* file = [&]() -> const mapped_file* {
      for (const auto& f : files) {
        const auto bytes = f->bytes();
        if (r.data >= bytes.data() && r.data < bytes.data() + bytes.size()) return f.get();
      }
      return nullptr;
    }();
    for (std::uint64_t offset = 0; offset < r.size; offset += prefault_chunk_bytes) {
      const std::uint64_t length = std::min(prefault_chunk_bytes, r.size - offset);
      if (file != nullptr) {
        file->advise_will_need(static_cast<std::size_t>(r.data + offset - file->bytes().data()),
                               static_cast<std::size_t>(length));
      }
      for (std::uint64_t at = 0; at < length; at += page) {
        checksum ^= std::to_integer<std::uint8_t>(*static_cast<const volatile std::byte*>(r.data + offset + at));
      }
      done += length;
      if (options.progress) options.progress(done, total);
    }
  }
  // A volatile store of what was read keeps the loop from being optimised away.
  volatile std::uint8_t sink = checksum;
  (void)sink;
}

// How the binders convert weights for this load: on a pool of every hardware thread, releasing
// the file pages of each projection they replace with a buffer of its own.
class weight_loading {
 public:
  weight_loading(const load_options& options, const std::vector<std::shared_ptr<const mapped_file>>& files)
      : pool_(std::max(1u, std::thread::hardware_concurrency()) - 1) {
    options_.target = options.weight_dtype;
    options_.int4_group_size = options.int4_group_size;
    options_.experts_only = options.quantize_experts_only;
    options_.classifier = options.quantize_classifier;
    options_.pool = pool_.size() > 0 ? &pool_ : nullptr;
    options_.on_converted = [&files](std::span<const std::byte> bytes) {
      for (const auto& f : files) {
        const auto mapped = f->bytes();
        if (bytes.data() >= mapped.data() && bytes.data() + bytes.size() <= mapped.data() + mapped.size()) {
          f->release(static_cast<std::size_t>(bytes.data() - mapped.data()), bytes.size());
        }
      }
    };
  }
  const weight_options& options() const { return options_; }

 private:
  thread_pool pool_;
  weight_options options_;
};

// A model's own chat template, as it ships it.
struct shipped_template {
  std::optional<std::string> jinja;
  std::string tool_use;  // "" when none
  std::string origin;
  // tokenizer_config.json's bos_token and eos_token ("" for null); nullopt when it does not say.
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
};

// A special token in tokenizer_config.json: a string, {"content": ...} (an AddedToken) or null.
result<std::optional<std::string>> special_token_field(const json_fields& fields, std::string_view key) {
  const auto value = fields.find(key);
  if (!value) {
    // Absent and null differ: null says the model has none.
    for (const auto [name, raw] : fields) {
      if (name == key) return std::optional<std::string>("");
    }
    return std::optional<std::string>{};
  }
  if (const auto text = value->as<std::string_view>(); text.ok()) return std::optional<std::string>(*text);
  EDGE_ASSIGN_OR_RETURN(const json_fields token, value->as<json_fields>("a string or an object with 'content'"));
  EDGE_ASSIGN_OR_RETURN(const std::string_view content, token.required<std::string_view>("content"));
  return std::optional<std::string>(content);
}

// tokenizer_config.json's "chat_template" (a string, or a list of {name, template} of which
// "default" is the chat template and "tool_use" the one for requests with tools), bos_token and
// eos_token.
status read_tokenizer_config(std::string_view config_text, shipped_template& out) {
  simdjson::dom::parser parser;
  EDGE_ASSIGN_OR_RETURN(const auto object,
                        parse_json_members(parser, config_text, "the file", {"chat_template", "bos_token", "eos_token"}));
  const json_fields fields(object);
  EDGE_ASSIGN_OR_RETURN(out.bos_token, special_token_field(fields, "bos_token"));
  EDGE_ASSIGN_OR_RETURN(out.eos_token, special_token_field(fields, "eos_token"));
  const auto value = fields.find("chat_template");
  if (!value) return {};
  if (const auto jinja = value->as<std::string_view>(); jinja.ok()) {
    out.jinja = std::string(*jinja);
    return {};
  }
  EDGE_ASSIGN_OR_RETURN(const json_array templates, value->as<json_array>("a string or a list of templates"));
  for (const json_value entry : templates) {
    EDGE_ASSIGN_OR_RETURN(const json_fields named, entry.as<json_fields>());
    EDGE_ASSIGN_OR_RETURN(const auto name, named.optional<std::string_view>("name"));
    if (name != "default" && name != "tool_use") continue;
    EDGE_ASSIGN_OR_RETURN(const std::string_view jinja, named.required<std::string_view>("template"));
    if (name == "default") {
      out.jinja = std::string(jinja);
    } else {
      out.tool_use = std::string(jinja);
    }
  }
  return {};
}

// A Hugging Face folder's template: tokenizer_config.json's, or chat_template.jinja's, which wins
// (transformers reads it over the config's, and newer folders keep the template there).
result<shipped_template> hf_chat_template(const fs::path& folder) {
  shipped_template shipped;
  std::error_code ec;
  const auto config_path = folder / "tokenizer_config.json";
  if (fs::exists(config_path, ec)) {
    EDGE_ASSIGN_OR_RETURN(const auto text, read_text_file(config_path));
    if (status read = read_tokenizer_config(text, shipped); !read.ok()) return read.with_context(config_path.string());
    if (shipped.jinja) shipped.origin = config_path.string();
  }
  const auto jinja_path = folder / "chat_template.jinja";
  if (fs::exists(jinja_path, ec)) {
    EDGE_ASSIGN_OR_RETURN(auto text, read_text_file(jinja_path));
    shipped.jinja = std::move(text);
    shipped.origin = jinja_path.string();
  }
  return shipped;
}

// A GGUF's template: tokenizer.chat_template, and tokenizer.chat_template.tool_use where
// llama.cpp's converter wrote the named variant.
shipped_template gguf_chat_template(const gguf_file& file, const std::string& source) {
  shipped_template shipped;
  if (const auto* value = file.find("tokenizer.chat_template"); value && value->as_string()) {
    shipped.jinja = std::string(*value->as_string());
    shipped.origin = edge::format("{} (tokenizer.chat_template)", source);
  }
  if (const auto* value = file.find("tokenizer.chat_template.tool_use"); value && value->as_string()) {
    shipped.tool_use = std::string(*value->as_string());
  }
  return shipped;
}

// --chat-template NAME, else --chat-template FILE, else the model's own Jinja template, else the
// plain built-in one. The template's bos_token and eos_token are tokenizer_config.json's, else
// the tokenizer's.
result<chat_template> choose_chat_template(const load_options& options, const shipped_template& shipped,
                                           const tokenizer* tok) {
  if (options.chat_template) return chat_template::builtin(*options.chat_template, "--chat-template");
  chat_template_spec spec;
  if (options.chat_template_file) {
    auto text = read_text_file(*options.chat_template_file);
    if (!text.ok()) return text.error().with_context("--chat-template");
    spec.jinja = std::move(text).value();
    spec.origin = edge::format("--chat-template {}", options.chat_template_file->string());
  } else if (shipped.jinja) {
    spec.jinja = *shipped.jinja;
    spec.jinja_tool_use = shipped.tool_use;
    spec.origin = shipped.origin;
  } else {
    return chat_template::builtin(chat_template_kind::plain, "the model ships no chat template");
  }
  if (shipped.bos_token) {
    spec.bos_token = *shipped.bos_token;
  } else if (tok && tok->bos_id()) {
    spec.bos_token = tok->token_text(*tok->bos_id());
  }
  if (shipped.eos_token) {
    spec.eos_token = *shipped.eos_token;
  } else if (tok && !tok->eos_ids().empty()) {
    spec.eos_token = tok->token_text(tok->eos_ids().front());
  }
  return chat_template::compile(std::move(spec));
}

status check_tokenizer(const model& m, const std::string& source) {
  if (m.tok->vocab_size() > m.config.vocab_size) {
    return invalid_argument(edge::format("{}: the tokenizer has {} tokens but the model only {} embeddings", source,
                                         m.tok->vocab_size(), m.config.vocab_size));
  }
  return {};
}

result<std::unique_ptr<model>> load_gguf_model(std::shared_ptr<const mapped_file> mapping,
                                               const load_options& options) {
  const std::string source = mapping->path().string();
  auto parsed = parse_gguf(mapping->bytes());
  if (!parsed.ok()) return parsed.error().with_context(source);
  gguf_file& file = *parsed;
  file.file = mapping;

  auto m = std::make_unique<model>();
  m->format = model_format::gguf;
  m->files.push_back(std::move(mapping));
  auto config = config_from_gguf(file);
  if (!config.ok()) return config.error().with_context(source);
  m->config = config->config;
  m->synthetic = config->synthetic;
  read_in(ranges_of(file.tensors), m->files, options);
  const weight_loading loading(options, m->files);
  auto weights = weights_from_gguf(file, m->config, loading.options());
  if (!weights.ok()) return weights.error().with_context(source);
  m->weights = std::move(weights).value();

  auto tok = tokenizer_from_gguf(file);
  if (!tok.ok()) return tok.error().with_context(source);
  m->tok = std::move(tok).value();
  EDGE_ASSIGN_OR_RETURN(m->chat_template, choose_chat_template(options, gguf_chat_template(file, source), m->tok.get()));
  EDGE_RETURN_IF_ERROR(check_tokenizer(*m, source));
  return m;
}

result<fs::path> find_llama2c_tokenizer(const fs::path& checkpoint, std::int64_t vocab_size) {
  const auto folder = checkpoint.parent_path();
  const fs::path candidates[] = {folder / "tokenizer.bin", folder / edge::format("tok{}.bin", vocab_size)};
  std::error_code ec;
  for (const auto& candidate : candidates) {
    if (fs::is_regular_file(candidate, ec)) return candidate;
  }
  return not_found(edge::format("no tokenizer for the llama2.c checkpoint {}: looked for {} and {}",
                                checkpoint.string(), candidates[0].string(), candidates[1].string()));
}

result<std::unique_ptr<model>> load_llama2c_model(std::shared_ptr<const mapped_file> mapping,
                                                  llama2c_checkpoint checkpoint, const load_options& options) {
  const std::string source = mapping->path().string();
  auto m = std::make_unique<model>();
  m->format = model_format::llama2c;
  m->config = checkpoint.config;
  const auto bytes = mapping->bytes();
  m->files.push_back(mapping);
  read_in({{bytes.data(), bytes.size()}}, m->files, options);
  if (options.weight_dtype) {
    // Recognition bound the weights in place; now they are converted, from memory.
    const weight_loading loading(options, m->files);
    auto converted = parse_llama2c(bytes, loading.options());
    if (!converted.ok()) return converted.error().with_context(source);
    checkpoint.weights = std::move(converted->weights);
  }
  m->weights = std::move(checkpoint.weights);

  fs::path tokenizer_path;
  if (options.tokenizer) {
    tokenizer_path = *options.tokenizer;
  } else {
    EDGE_ASSIGN_OR_RETURN(tokenizer_path, find_llama2c_tokenizer(mapping->path(), m->config.vocab_size));
  }
  auto tok = load_llama2c_tokenizer(tokenizer_path, m->config.vocab_size);
  if (!tok.ok()) return tok.error().with_context(tokenizer_path.string());
  m->tok = std::move(tok).value();
  EDGE_ASSIGN_OR_RETURN(m->chat_template, choose_chat_template(options, shipped_template{}, m->tok.get()));
  EDGE_RETURN_IF_ERROR(check_tokenizer(*m, source));
  return m;
}

struct found_tokenizer {
  std::unique_ptr<tokenizer> tok;
  shipped_template chat_template;  // from a tokenizer.gguf's metadata
};

// A folder's tokenizer.json; else, in a folder `edgeinfer quantize` wrote from a GGUF or llama2.c
// model, the vocabulary it kept as tokenizer.gguf (with the chat template) or tokenizer.bin.
result<found_tokenizer> hf_tokenizer(const fs::path& folder) {
  std::error_code ec;
  const auto json_path = folder / "tokenizer.json";
  const auto gguf_path = folder / "tokenizer.gguf";
  const auto llama2c_path = folder / "tokenizer.bin";
  found_tokenizer found;
  if (!fs::exists(json_path, ec) && fs::exists(gguf_path, ec)) {
    EDGE_ASSIGN_OR_RETURN(const auto file, load_gguf(gguf_path));
    auto tok = tokenizer_from_gguf(file);
    if (!tok.ok()) return tok.error().with_context(gguf_path.string());
    found.tok = std::move(tok).value();
    found.chat_template = gguf_chat_template(file, gguf_path.string());
    return found;
  }
  if (!fs::exists(json_path, ec) && fs::exists(llama2c_path, ec)) {
    auto tok = load_llama2c_tokenizer(llama2c_path, 0);
    if (!tok.ok()) return tok.error().with_context(llama2c_path.string());
    found.tok = std::move(tok).value();
    return found;
  }
  auto tok = load_hf_tokenizer(json_path);
  if (!tok.ok()) return tok.error().with_context(json_path.string());
  found.tok = std::move(tok).value();
  return found;
}

// A folder's template: that of the tokenizer.gguf `edgeinfer quantize` kept, else the Hugging
// Face files'.
result<shipped_template> folder_chat_template(const fs::path& folder, shipped_template from_gguf) {
  if (from_gguf.jinja) return from_gguf;
  return hf_chat_template(folder);
}

result<std::unique_ptr<model>> load_hf_model(const fs::path& folder, const load_options& options) {
  const auto config_path = folder / "config.json";
  EDGE_ASSIGN_OR_RETURN(const auto config_text, read_text_file(config_path));
  auto config = parse_hf_config(config_text);
  if (!config.ok()) return config.error().with_context(config_path.string());

  auto m = std::make_unique<model>();
  m->format = model_format::hugging_face;
  m->config = config->config;
  m->synthetic = config->synthetic;
  EDGE_ASSIGN_OR_RETURN(const auto tensors, load_safetensors_folder(folder, m->files));
  read_in(ranges_of(tensors), m->files, options);
  const weight_loading loading(options, m->files);
  weight_options binding = loading.options();
  binding.fp8_block_rows = config->fp8_block_rows;
  binding.fp8_block_cols = config->fp8_block_cols;
  if (config->fp8_block_rows > 0 && !options.weight_dtype) {
    logger{"model"}.info("{}: FP8 weights with {}×{} block scales are decoded on load and kept as bf16 (the matmul "
                         "kernels read FP8 with one scale per row); --weight-dtype int4 or fp8 quantizes them instead",
                         folder.string(), config->fp8_block_rows, config->fp8_block_cols);
  }
  auto weights = weights_from_hf(tensors, m->config, binding);
  if (!weights.ok()) return weights.error().with_context(folder.string());
  m->weights = std::move(weights).value();

  EDGE_ASSIGN_OR_RETURN(auto found, hf_tokenizer(folder));
  m->tok = std::move(found.tok);
  EDGE_ASSIGN_OR_RETURN(const shipped_template shipped, folder_chat_template(folder, std::move(found.chat_template)));
  EDGE_ASSIGN_OR_RETURN(m->chat_template, choose_chat_template(options, shipped, m->tok.get()));
  EDGE_RETURN_IF_ERROR(check_tokenizer(*m, folder.string()));
  return m;
}

result<std::unique_ptr<model>> load_by_content(const load_options& options) {
  const fs::path& path = options.path;
  std::error_code ec;
  if (!fs::exists(path, ec)) return not_found(edge::format("model {} does not exist", path.string()));
  if (fs::is_directory(path, ec)) {
    if (!fs::exists(path / "config.json", ec)) {
      return invalid_argument(
          edge::format("{} is a folder without config.json, not a Hugging Face model folder", path.string()));
    }
    return load_hf_model(path, options);
  }

  EDGE_ASSIGN_OR_RETURN(auto mapping, mapped_file::open(path));
  const auto bytes = mapping->bytes();
  if (bytes.size() >= gguf_magic.size() && std::memcmp(bytes.data(), gguf_magic.data(), gguf_magic.size()) == 0) {
    return load_gguf_model(std::move(mapping), options);
  }
  auto checkpoint = parse_llama2c(bytes);
  if (!checkpoint.ok()) {
    return invalid_argument(edge::format("{} is not a model edgeinfer reads: no GGUF magic, and {}", path.string(),
                                         checkpoint.error().message()));
  }
  return load_llama2c_model(std::move(mapping), std::move(checkpoint).value(), options);
}

}  // namespace

result<std::unique_ptr<model>> load_model(const load_options& options) {
  const auto started = std::chrono::steady_clock::now();
  EDGE_ASSIGN_OR_RETURN(auto m, load_by_content(options));
  logger{"model"}.info("chat template: {}", m->chat_template.describe());
  m->name = model_id_from_path(options.path);
  align_weights(m->weights);
  const cpu_tile_formats tile_formats{
      .integer = kernels::cpu::active_isa() >= kernels::cpu::isa::avx512_vnni && kernels::cpu::quantized_activations(),
      .floats = kernels::cpu::active_isa() >= kernels::cpu::isa::avx512,
      .fp8 = kernels::cpu::has_byte_permutes()};
  if (options.cpu_tiles && (tile_formats.integer || tile_formats.floats || tile_formats.fp8)) {
    const auto tiling = std::chrono::steady_clock::now();
    thread_pool pool(std::max(1u, std::thread::hardware_concurrency()) - 1);
    const tiled_weights tiled = tile_weights_for_cpu(*m, pool.size() > 0 ? &pool : nullptr, tile_formats);
    if (tiled.matrices > 0) {
      logger{"model"}.debug("{} matrices ({}) in CPU row tiles ({:.2f} s)", tiled.matrices, format_bytes(tiled.bytes),
                            std::chrono::duration<double>(std::chrono::steady_clock::now() - tiling).count());
    }
  }

  const auto elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  logger{"model"}.debug("loaded {} ({}, {} layers, hidden {}, vocab {}, {} weights{}) in {:.2f} s", m->name,
                        to_string(m->config.arch), m->config.num_layers, m->config.hidden_size, m->config.vocab_size,
                        kernels::to_string(projection_format(m->weights)), m->synthetic ? ", synthetic" : "", elapsed);
  return m;
}

result<chat_template> load_chat_template(const load_options& options) {
  const fs::path& path = options.path;
  std::error_code ec;
  if (!fs::exists(path, ec)) return not_found(edge::format("model {} does not exist", path.string()));
  // The tokenizer only names bos_token and eos_token where the template files do not.
  auto tok = load_model_tokenizer(path);
  const tokenizer* vocabulary = tok.ok() ? tok->get() : nullptr;
  shipped_template shipped;
  if (fs::is_directory(path, ec)) {
    shipped_template from_gguf;
    if (!fs::exists(path / "tokenizer.json", ec) && fs::exists(path / "tokenizer.gguf", ec)) {
      EDGE_ASSIGN_OR_RETURN(const auto file, load_gguf(path / "tokenizer.gguf"));
      from_gguf = gguf_chat_template(file, (path / "tokenizer.gguf").string());
    }
    EDGE_ASSIGN_OR_RETURN(shipped, folder_chat_template(path, std::move(from_gguf)));
  } else {
    EDGE_ASSIGN_OR_RETURN(const auto mapping, mapped_file::open(path));
    const auto bytes = mapping->bytes();
    if (bytes.size() >= gguf_magic.size() && std::memcmp(bytes.data(), gguf_magic.data(), gguf_magic.size()) == 0) {
      auto file = parse_gguf(bytes);
      if (!file.ok()) return file.error().with_context(path.string());
      shipped = gguf_chat_template(*file, path.string());
    }
  }
  return choose_chat_template(options, shipped, vocabulary);
}

}  // namespace edge::backend
