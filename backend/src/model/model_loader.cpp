// load_model: recognises the format by content, binds the weights, attaches the tokenizer and
// the chat template, and reads the weight pages in ahead of the first request.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>

#include "edge/backend/model/formats.h"
#include "edge/backend/model/model.h"
#include "edge/backend/model/safetensors.h"
#include "edge/backend/model_locator.h"
#include "edge/common/format.h"
#include "edge/common/log.h"
#include "json_fields.h"

namespace edge::backend {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view gguf_magic = "GGUF";
// Progress is reported after each chunk of pages read in: fine enough for a smooth bar,
// coarse enough that the callback costs nothing.
constexpr std::uint64_t prefault_chunk_bytes = std::uint64_t{64} << 20;

// Every weight view, the tied classifier included (it is the same view as the embedding).
template <class Weights, class Fn>
void for_each_weight(Weights& weights, Fn&& fn) {
  fn(weights.token_embedding);
  fn(weights.final_norm);
  fn(weights.lm_head);
  for (auto& layer : weights.layers) {
    for (auto* view : {&layer.attn_norm, &layer.wq, &layer.wk, &layer.wv, &layer.wo, &layer.bq, &layer.bk,
                       &layer.bv, &layer.ffn_norm, &layer.w_gate, &layer.w_up, &layer.w_down}) {
      fn(*view);
    }
  }
}

result<std::string> read_text_file(const fs::path& path) {
  EDGE_ASSIGN_OR_RETURN(const auto mapping, mapped_file::open(path));
  const auto bytes = mapping->bytes();
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// Kernels read weights through typed pointers; a tensor that a file placed at an address not
// aligned for its element type is copied into a buffer the model owns.
void align_weights(model& m) {
  std::map<const std::byte*, const std::byte*> moved;
  for_each_weight(m.weights, [&](tensor_view& view) {
    if (!view.present()) return;
    if (reinterpret_cast<std::uintptr_t>(view.data) % kernels::dtype_size(view.type) == 0) return;
    auto [it, inserted] = moved.emplace(view.data, nullptr);
    if (inserted) {
      auto& buffer = m.owned_buffers.emplace_back(view.bytes());
      std::memcpy(buffer.data(), view.data, view.bytes());
      it->second = buffer.data();
    }
    view.data = it->second;
  });
}

// Touches every page of every weight once, so that the first request does not pay for reading
// the file, and reports progress as it goes.
void read_in_weights(const model& m, const load_options& options) {
  struct range {
    const std::byte* data;
    std::uint64_t size;
  };
  std::vector<range> ranges;
  for_each_weight(m.weights, [&](const tensor_view& view) {
    if (view.present()) ranges.push_back({view.data, view.bytes()});
  });
  std::sort(ranges.begin(), ranges.end(), [](const range& a, const range& b) { return a.data < b.data; });
  ranges.erase(std::unique(ranges.begin(), ranges.end(), [](const range& a, const range& b) { return a.data == b.data; }),
               ranges.end());
  std::uint64_t total = 0;
  for (const auto& r : ranges) total += r.size;

  static const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  std::uint64_t done = 0;
  std::uint8_t checksum = 0;
  if (options.progress) options.progress(0, total);
  for (const auto& r : ranges) {
    const auto* file = [&]() -> const mapped_file* {
      for (const auto& f : m.files) {
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

chat_template_kind choose_chat_template(const load_options& options, const std::optional<std::string>& jinja,
                                        const std::string& source) {
  if (options.chat_template) return *options.chat_template;
  if (!jinja) return chat_template_kind::plain;
  if (const auto detected = detect_chat_template(*jinja)) return *detected;
  logger{"model"}.warn("the chat template in {} is not one edgeinfer recognises; using the plain template "
                       "(choose one with --chat-template)",
                       source);
  return chat_template_kind::plain;
}

// tokenizer_config.json's "chat_template": a string, or a list of {name, template} of which the
// one named "default" is the chat template. Newer folders keep it in chat_template.jinja.
result<std::optional<std::string>> hf_chat_template(const fs::path& folder) {
  std::error_code ec;
  const auto config_path = folder / "tokenizer_config.json";
  if (fs::exists(config_path, ec)) {
    EDGE_ASSIGN_OR_RETURN(const auto text, read_text_file(config_path));
    simdjson::dom::parser parser;
    auto object = parse_json_object(parser, text);
    if (!object.ok()) return object.error().with_context(config_path.string());
    const json_fields fields(*object);
    if (const auto element = fields.find("chat_template")) {
      std::string_view jinja;
      if (element->get_string().get(jinja) == simdjson::SUCCESS) return std::optional<std::string>(jinja);
      simdjson::dom::array templates;
      if (element->get_array().get(templates) == simdjson::SUCCESS) {
        for (auto entry : templates) {
          std::string_view name;
          if (entry["name"].get_string().get(name) == simdjson::SUCCESS && name == "default" &&
              entry["template"].get_string().get(jinja) == simdjson::SUCCESS) {
            return std::optional<std::string>(jinja);
          }
        }
        return std::optional<std::string>{};
      }
      return invalid_argument(edge::format("{}: \"chat_template\" must be a string or a list of templates",
                                           config_path.string()));
    }
  }
  const auto jinja_path = folder / "chat_template.jinja";
  if (fs::exists(jinja_path, ec)) {
    EDGE_ASSIGN_OR_RETURN(auto text, read_text_file(jinja_path));
    return std::optional<std::string>(std::move(text));
  }
  return std::optional<std::string>{};
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
  auto weights = weights_from_gguf(file, m->config);
  if (!weights.ok()) return weights.error().with_context(source);
  m->weights = std::move(weights).value();

  auto tok = tokenizer_from_gguf(file);
  if (!tok.ok()) return tok.error().with_context(source);
  m->tok = std::move(tok).value();
  std::optional<std::string> jinja;
  if (const auto* value = file.find("tokenizer.chat_template"); value && value->as_string()) {
    jinja = *value->as_string();
  }
  m->chat_template = choose_chat_template(options, jinja, source);
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
  m->weights = std::move(checkpoint.weights);

  fs::path tokenizer_path;
  if (options.tokenizer) {
    tokenizer_path = *options.tokenizer;
  } else {
    EDGE_ASSIGN_OR_RETURN(tokenizer_path, find_llama2c_tokenizer(mapping->path(), m->config.vocab_size));
  }
  m->files.push_back(std::move(mapping));
  auto tok = load_llama2c_tokenizer(tokenizer_path, m->config.vocab_size);
  if (!tok.ok()) return tok.error().with_context(tokenizer_path.string());
  m->tok = std::move(tok).value();
  m->chat_template = options.chat_template.value_or(chat_template_kind::plain);
  EDGE_RETURN_IF_ERROR(check_tokenizer(*m, source));
  return m;
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
  auto weights = weights_from_hf(tensors, m->config);
  if (!weights.ok()) return weights.error().with_context(folder.string());
  m->weights = std::move(weights).value();

  const auto tokenizer_path = folder / "tokenizer.json";
  auto tok = load_hf_tokenizer(tokenizer_path);
  if (!tok.ok()) return tok.error().with_context(tokenizer_path.string());
  m->tok = std::move(tok).value();
  EDGE_ASSIGN_OR_RETURN(const auto jinja, hf_chat_template(folder));
  m->chat_template = choose_chat_template(options, jinja, folder.string());
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
  m->name = model_id_from_path(options.path);
  align_weights(*m);
  read_in_weights(*m, options);

  const auto elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  logger{"model"}.debug("loaded {} ({}, {} layers, hidden {}, vocab {}{}) in {:.2f} s", m->name,
                        to_string(m->config.arch), m->config.num_layers, m->config.hidden_size, m->config.vocab_size,
                        m->synthetic ? ", synthetic weights" : "", elapsed);
  return m;
}

}  // namespace edge::backend
