#include "edge/backend/model/synthetic.h"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <memory>
#include <numbers>
#include <utility>
#include <vector>

#include "edge/backend/io/gguf.h"
#include "edge/common/format.h"
#include "edge/kernels/numerics.h"
#include "json_fields.h"
#include "hf_config_text.h"
#include "json_text.h"
#include "model_checks.h"
#include "splitmix64.h"
#include "synthetic_tokenizer.h"

namespace edge::backend {
namespace {

namespace fs = std::filesystem;

static_assert(std::endian::native == std::endian::little, "GGUF and safetensors are written as little-endian bytes");

// Uniform on [-w, w] has the standard deviation w / sqrt(3): this matches N(0, 0.02), the
// initialisation Llama-family models are trained from.
constexpr double weight_std = 0.02;
constexpr float weight_half_width = static_cast<float>(weight_std * std::numbers::sqrt3);
constexpr float norm_value = 1.0f;

constexpr std::size_t write_buffer_bytes = std::size_t{8} << 20;
// Progress is reported about this often (in bytes written).
constexpr std::uint64_t progress_step_bytes = std::uint64_t{32} << 20;

constexpr std::uint32_t gguf_version = 3;
constexpr std::uint64_t gguf_alignment = 32;  // the format's default; not written as general.alignment
constexpr std::size_t safetensors_header_alignment = 8;
constexpr std::string_view partial_suffix = ".partial";

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
    return table;
  }();
  return presets;
}

// ---- what is written --------------------------------------------------------------------------

enum class fill { random, ones, values };

struct planned_tensor {
  std::string identity;  // the Hugging Face name: the same values under either format's name
  std::string name;      // in the file
  std::vector<std::int64_t> shape;
  kernels::dtype type = kernels::dtype::f32;
  fill contents = fill::random;
  // GGUF llama Q/K: rows reordered within each of this many heads for adjacent-pair RoPE.
  std::int64_t permute_heads = 0;
  std::vector<float> values;  // fill::values

  std::uint64_t bytes() const {
    std::uint64_t n = kernels::dtype_size(type);
    for (const auto d : shape) n *= static_cast<std::uint64_t>(d);
    return n;
  }
};

std::vector<planned_tensor> plan_tensors(const model_config& c, synthetic_format format, kernels::dtype dtype) {
  const bool gguf = format == synthetic_format::gguf;
  // llama.cpp keeps one-dimensional tensors (norms, biases) in F32 whatever the file type.
  const kernels::dtype vector_type = gguf ? kernels::dtype::f32 : dtype;
  const std::int64_t q_width = c.num_heads * c.head_dim;
  const std::int64_t kv_width = c.num_kv_heads * c.head_dim;
  const bool permute_qk = gguf && c.arch == architecture::llama;

  std::vector<planned_tensor> plan;
  const auto add = [&](std::string identity, std::string gguf_name, std::vector<std::int64_t> shape, fill contents,
                       std::int64_t permute_heads = 0) {
    planned_tensor t;
    t.name = gguf ? std::move(gguf_name) : identity;
    t.identity = std::move(identity);
    t.type = shape.size() == 1 ? vector_type : dtype;
    t.shape = std::move(shape);
    t.contents = contents;
    t.permute_heads = permute_heads;
    plan.push_back(std::move(t));
  };

  if (gguf && c.rope_scaling) {
    planned_tensor t;
    t.identity = t.name = "rope_freqs.weight";
    t.shape = {c.head_dim / 2};
    t.contents = fill::values;
    t.values = llama3_rope_factors(*c.rope_scaling, c.rope_theta, c.head_dim);
    plan.push_back(std::move(t));
  }
  add("model.embed_tokens.weight", "token_embd.weight", {c.vocab_size, c.hidden_size}, fill::random);
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    const auto hf = edge::format("model.layers.{}.", i);
    const auto blk = edge::format("blk.{}.", i);
    add(hf + "input_layernorm.weight", blk + "attn_norm.weight", {c.hidden_size}, fill::ones);
    add(hf + "self_attn.q_proj.weight", blk + "attn_q.weight", {q_width, c.hidden_size}, fill::random,
        permute_qk ? c.num_heads : 0);
    add(hf + "self_attn.k_proj.weight", blk + "attn_k.weight", {kv_width, c.hidden_size}, fill::random,
        permute_qk ? c.num_kv_heads : 0);
    add(hf + "self_attn.v_proj.weight", blk + "attn_v.weight", {kv_width, c.hidden_size}, fill::random);
    if (c.qkv_bias) {
      add(hf + "self_attn.q_proj.bias", blk + "attn_q.bias", {q_width}, fill::random);
      add(hf + "self_attn.k_proj.bias", blk + "attn_k.bias", {kv_width}, fill::random);
      add(hf + "self_attn.v_proj.bias", blk + "attn_v.bias", {kv_width}, fill::random);
    }
    add(hf + "self_attn.o_proj.weight", blk + "attn_output.weight", {c.hidden_size, q_width}, fill::random);
    add(hf + "post_attention_layernorm.weight", blk + "ffn_norm.weight", {c.hidden_size}, fill::ones);
    add(hf + "mlp.gate_proj.weight", blk + "ffn_gate.weight", {c.intermediate_size, c.hidden_size}, fill::random);
    add(hf + "mlp.up_proj.weight", blk + "ffn_up.weight", {c.intermediate_size, c.hidden_size}, fill::random);
    add(hf + "mlp.down_proj.weight", blk + "ffn_down.weight", {c.hidden_size, c.intermediate_size}, fill::random);
  }
  add("model.norm.weight", "output_norm.weight", {c.hidden_size}, fill::ones);
  if (!c.tie_embeddings) add("lm_head.weight", "output.weight", {c.vocab_size, c.hidden_size}, fill::random);
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

// The HF row that lands at `row` of a GGUF Q/K matrix: llama.cpp's converter interleaves the two
// halves of each head, so HF row h*d + i*(d/2) + j goes to row h*d + 2*j + i.
std::int64_t permuted_source_row(std::int64_t row, std::int64_t rows_per_head) {
  const std::int64_t head = row / rows_per_head;
  const std::int64_t within = row % rows_per_head;
  const std::int64_t pair = within / 2;
  const std::int64_t half = within % 2;
  return head * rows_per_head + half * (rows_per_head / 2) + pair;
}

// Each row's values come from its own stream, keyed by seed, tensor and row: rows can be made
// in any order (the GGUF permutation) and every format gets the same numbers.
void fill_row(const planned_tensor& t, std::uint64_t seed_hash, std::int64_t row, std::span<float> out) {
  switch (t.contents) {
    case fill::ones: std::fill(out.begin(), out.end(), norm_value); return;
    case fill::values: std::copy(t.values.begin(), t.values.end(), out.begin()); return;
    case fill::random: break;
  }
  std::uint64_t mixer = seed_hash ^ fnv1a(t.identity);
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
  progress_meter(const synthetic_options& options, std::uint64_t total) : callback_(options.progress), total_(total) {
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
  std::uint64_t total_;
  std::uint64_t done_ = 0;
  std::uint64_t next_report_ = progress_step_bytes;
};

// A file written through a buffer under a temporary name and renamed into place by commit(),
// so that an interrupted run never leaves a file that looks complete.
class output_file {
 public:
  static result<std::unique_ptr<output_file>> create(const fs::path& path) {
    fs::path partial = path;
    partial += partial_suffix;
    constexpr mode_t readable_by_all = 0644;
    const int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, readable_by_all);
    if (fd < 0) return unavailable(edge::format("cannot create {}: {}", partial.string(), std::strerror(errno)));
    return std::unique_ptr<output_file>(new output_file(path, std::move(partial), fd));
  }

  ~output_file() {
    if (fd_ >= 0) {
      ::close(fd_);
      std::error_code ec;
      fs::remove(partial_, ec);
    }
  }
  output_file(const output_file&) = delete;
  output_file& operator=(const output_file&) = delete;

  std::uint64_t position() const { return position_; }

  status write(const void* data, std::size_t size) {
    const auto* bytes = static_cast<const std::byte*>(data);
    position_ += size;
    while (size > 0) {
      const std::size_t n = std::min(size, buffer_.size() - used_);
      std::memcpy(buffer_.data() + used_, bytes, n);
      used_ += n;
      bytes += n;
      size -= n;
      if (used_ == buffer_.size()) EDGE_RETURN_IF_ERROR(flush());
    }
    return {};
  }
  status write(std::string_view text) { return write(text.data(), text.size()); }
  template <class T>
  status write_scalar(T value) {
    return write(&value, sizeof(value));
  }

  // Zero bytes up to the next multiple of `alignment`.
  status pad_to(std::uint64_t alignment) {
    static constexpr std::byte zeros[gguf_alignment] = {};
    while (position_ % alignment != 0) {
      const auto n = std::min<std::uint64_t>(alignment - position_ % alignment, sizeof(zeros));
      EDGE_RETURN_IF_ERROR(write(zeros, static_cast<std::size_t>(n)));
    }
    return {};
  }

  status commit() {
    EDGE_RETURN_IF_ERROR(flush());
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) return failure("close");
    std::error_code ec;
    fs::rename(partial_, path_, ec);
    if (ec) return unavailable(edge::format("cannot rename {} to {}: {}", partial_.string(), path_.string(), ec.message()));
    return {};
  }

 private:
  output_file(fs::path path, fs::path partial, int fd)
      : path_(std::move(path)), partial_(std::move(partial)), fd_(fd), buffer_(write_buffer_bytes) {}

  status flush() {
    std::size_t written = 0;
    while (written < used_) {
      const auto n = ::write(fd_, buffer_.data() + written, used_ - written);
      if (n < 0) {
        if (errno == EINTR) continue;
        return failure("write");
      }
      written += static_cast<std::size_t>(n);
    }
    used_ = 0;
    return {};
  }

  status failure(std::string_view what) const {
    const int error = errno;
    std::string message = edge::format("cannot {} {}: {}", what, partial_.string(), std::strerror(error));
    return error == ENOSPC ? resource_exhausted(std::move(message)) : unavailable(std::move(message));
  }

  fs::path path_;
  fs::path partial_;
  int fd_;
  std::vector<std::byte> buffer_;
  std::size_t used_ = 0;
  std::uint64_t position_ = 0;
};

status write_tensor_data(output_file& out, const planned_tensor& t, std::uint64_t seed_hash, progress_meter& progress) {
  const std::int64_t rows = t.shape.size() == 1 ? 1 : t.shape.front();
  const std::int64_t cols = t.shape.back();
  std::vector<float> row(static_cast<std::size_t>(cols));  // [cols]
  std::vector<std::byte> encoded(static_cast<std::size_t>(cols) * kernels::dtype_size(t.type));
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t source = t.permute_heads > 0 ? permuted_source_row(r, rows / t.permute_heads) : r;
    fill_row(t, seed_hash, source, row);
    encode(row, t.type, encoded.data());
    EDGE_RETURN_IF_ERROR(out.write(encoded.data(), encoded.size()));
    progress.add(encoded.size());
  }
  return {};
}

std::uint64_t total_bytes(const std::vector<planned_tensor>& plan) {
  std::uint64_t total = 0;
  for (const auto& t : plan) total += t.bytes();
  return total;
}

std::uint64_t seed_hash_of(std::uint64_t seed) {
  std::uint64_t state = seed;
  return splitmix64(state);
}

std::string_view safetensors_dtype(kernels::dtype type) {
  switch (type) {
    case kernels::dtype::f32: return "F32";
    case kernels::dtype::f16: return "F16";
    case kernels::dtype::bf16: return "BF16";
    case kernels::dtype::fp8_e4m3: break;  // refused by write_synthetic_model
  }
  return "F32";
}

std::string torch_dtype(kernels::dtype type) {
  switch (type) {
    case kernels::dtype::f32: return "float32";
    case kernels::dtype::f16: return "float16";
    case kernels::dtype::bf16: return "bfloat16";
    case kernels::dtype::fp8_e4m3: break;  // refused by write_synthetic_model
  }
  return "float32";
}

special_token_style style_of(const model_config& config) {
  return config.arch == architecture::qwen2 ? special_token_style::chatml : special_token_style::llama3;
}

// ---- safetensors folder -------------------------------------------------------------------------

constexpr std::string_view single_file_name = "model.safetensors";
constexpr std::string_view index_file_name = "model.safetensors.index.json";

std::string shard_name(std::size_t index, std::size_t count) {
  constexpr int digits = 5;
  const auto padded = [](std::size_t n) {
    std::string text = std::to_string(n);
    return std::string(text.size() < digits ? digits - text.size() : 0, '0') + text;
  };
  return "model-" + padded(index + 1) + "-of-" + padded(count) + ".safetensors";
}

std::string safetensors_header(std::span<const planned_tensor* const> tensors, const synthetic_options& options) {
  std::string header = "{\"__metadata__\": {\"format\": \"pt\", \"edgeinfer_synthetic\": \"true\", "
                       "\"edgeinfer_preset\": " +
                       json_string(options.preset) + ", \"edgeinfer_seed\": \"" + std::to_string(options.seed) + "\"}";
  std::uint64_t offset = 0;
  for (const auto* t : tensors) {
    header += ", ";
    append_json_string(header, t->name);
    header += ": {\"dtype\": \"" + std::string(safetensors_dtype(t->type)) + "\", \"shape\": [";
    for (std::size_t i = 0; i < t->shape.size(); ++i) header += (i ? ", " : "") + std::to_string(t->shape[i]);
    header += "], \"data_offsets\": [" + std::to_string(offset) + ", " + std::to_string(offset + t->bytes()) + "]}";
    offset += t->bytes();
  }
  header += '}';
  // Spaces up to a multiple of 8 put the data at an aligned offset (8-byte length + header).
  header.append((safetensors_header_alignment - header.size() % safetensors_header_alignment) %
                    safetensors_header_alignment,
                ' ');
  return header;
}

std::string hf_config_json(const synthetic_preset& preset, const synthetic_options& options,
                           const synthetic_vocab& vocab) {
  const model_config& c = preset.config;
  const bool qwen = c.arch == architecture::qwen2;
  std::string out = "{\n";
  out += hf_config_shape_fields(c);
  out += std::string("  \"tie_word_embeddings\": ") + (c.tie_embeddings ? "true" : "false") + ",\n";
  out += "  \"hidden_act\": \"silu\",\n";
  if (qwen) {
    out += "  \"use_sliding_window\": false,\n";
  } else {
    out += "  \"attention_bias\": false,\n  \"mlp_bias\": false,\n";
  }
  if (vocab.bos_id) out += "  \"bos_token_id\": " + std::to_string(*vocab.bos_id) + ",\n";
  out += "  \"eos_token_id\": " + std::to_string(vocab.eos_id) + ",\n";
  out += "  \"torch_dtype\": \"" + torch_dtype(options.dtype) + "\",\n";
  out += "  \"edgeinfer_synthetic\": true,\n";
  out += "  \"edgeinfer_preset\": " + json_string(preset.name) + ",\n";
  out += "  \"edgeinfer_seed\": " + std::to_string(options.seed) + "\n}\n";
  return out;
}

status write_text_file(const fs::path& path, std::string_view text) {
  EDGE_ASSIGN_OR_RETURN(auto file, output_file::create(path));
  EDGE_RETURN_IF_ERROR(file->write(text));
  return file->commit();
}

bool is_earlier_output(const fs::path& folder) {
  const auto mapping = mapped_file::open(folder / "config.json");
  if (!mapping.ok()) return false;
  const auto bytes = (*mapping)->bytes();
  simdjson::dom::parser parser;
  const auto object = parse_json_object(parser, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  if (!object.ok()) return false;
  const auto marker = json_fields(*object).optional_bool("edgeinfer_synthetic");
  return marker.ok() && marker->value_or(false);
}

// An empty (or new) folder, or an earlier make-model output whose files are removed first so
// that no stale shard survives next to the new ones.
status prepare_folder(const fs::path& folder) {
  std::error_code ec;
  if (!fs::exists(folder, ec)) {
    fs::create_directories(folder, ec);
    if (ec) return unavailable(edge::format("cannot create {}: {}", folder.string(), ec.message()));
    return {};
  }
  if (!fs::is_directory(folder, ec)) return invalid_argument(edge::format("{} exists and is not a folder", folder.string()));
  if (fs::is_empty(folder, ec)) return {};
  if (!is_earlier_output(folder)) {
    return failed_precondition(edge::format(
        "{} is not empty and not an earlier make-model output; choose a new folder", folder.string()));
  }
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    const auto name = entry.path().filename().string();
    const bool ours = name == "config.json" || name == "tokenizer.json" || name == "tokenizer_config.json" ||
                      name.ends_with(".safetensors") || name == index_file_name || name.ends_with(partial_suffix);
    if (ours) fs::remove(entry.path(), ec);
  }
  return {};
}

status write_safetensors_folder(const synthetic_preset& preset, const synthetic_options& options,
                                const synthetic_vocab& vocab) {
  const fs::path& folder = options.out;
  EDGE_RETURN_IF_ERROR(prepare_folder(folder));
  const auto plan = plan_tensors(preset.config, synthetic_format::safetensors, options.dtype);

  // Tensors in order, a new shard whenever the next one would pass the limit.
  std::vector<std::vector<const planned_tensor*>> shards(1);
  std::uint64_t shard_bytes = 0;
  for (const auto& t : plan) {
    if (!shards.back().empty() && shard_bytes + t.bytes() > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(&t);
    shard_bytes += t.bytes();
  }

  EDGE_RETURN_IF_ERROR(write_text_file(folder / "tokenizer.json", tokenizer_json(vocab)));
  EDGE_RETURN_IF_ERROR(write_text_file(folder / "tokenizer_config.json", tokenizer_config_json(vocab)));

  const std::uint64_t seed_hash = seed_hash_of(options.seed);
  progress_meter progress(options, total_bytes(plan));
  std::string weight_map;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const std::string file_name = shards.size() == 1 ? std::string(single_file_name) : shard_name(s, shards.size());
    const std::string header = safetensors_header(shards[s], options);
    EDGE_ASSIGN_OR_RETURN(auto out, output_file::create(folder / file_name));
    EDGE_RETURN_IF_ERROR(out->write_scalar(static_cast<std::uint64_t>(header.size())));
    EDGE_RETURN_IF_ERROR(out->write(header));
    for (const auto* t : shards[s]) {
      EDGE_RETURN_IF_ERROR(write_tensor_data(*out, *t, seed_hash, progress));
      weight_map += weight_map.empty() ? "\n    " : ",\n    ";
      weight_map += json_string(t->name) + ": " + json_string(file_name);
    }
    EDGE_RETURN_IF_ERROR(out->commit());
  }
  if (shards.size() > 1) {
    const std::string index = "{\n  \"metadata\": {\"total_size\": " + std::to_string(total_bytes(plan)) +
                              "},\n  \"weight_map\": {" + weight_map + "\n  }\n}\n";
    EDGE_RETURN_IF_ERROR(write_text_file(folder / index_file_name, index));
  }
  // Last, so that a folder is only loadable once everything else is in place.
  return write_text_file(folder / "config.json", hf_config_json(preset, options, vocab));
}

// ---- GGUF -------------------------------------------------------------------------------------

enum class gguf_type : std::uint32_t { u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8, array = 9, u64 = 10 };

// GGUF metadata, serialised as it is added.
class gguf_metadata {
 public:
  std::uint64_t count() const { return count_; }
  const std::string& bytes() const { return bytes_; }

  void add_u32(std::string_view key, std::int64_t value) {
    begin(key, gguf_type::u32);
    put(static_cast<std::uint32_t>(value));
  }
  void add_u64(std::string_view key, std::uint64_t value) {
    begin(key, gguf_type::u64);
    put(value);
  }
  void add_f32(std::string_view key, double value) {
    begin(key, gguf_type::f32);
    put(static_cast<float>(value));
  }
  void add_bool(std::string_view key, bool value) {
    begin(key, gguf_type::boolean);
    put(static_cast<std::uint8_t>(value ? 1 : 0));
  }
  void add_string(std::string_view key, std::string_view value) {
    begin(key, gguf_type::string);
    put_string(value);
  }
  void add_strings(std::string_view key, const std::vector<std::string>& values) {
    begin(key, gguf_type::array);
    put(static_cast<std::uint32_t>(gguf_type::string));
    put(static_cast<std::uint64_t>(values.size()));
    for (const auto& value : values) put_string(value);
  }
  void add_i32s(std::string_view key, const std::vector<std::int32_t>& values) {
    begin(key, gguf_type::array);
    put(static_cast<std::uint32_t>(gguf_type::i32));
    put(static_cast<std::uint64_t>(values.size()));
    for (const auto value : values) put(value);
  }

 private:
  template <class T>
  void put(T value) {
    bytes_.append(reinterpret_cast<const char*>(&value), sizeof(value));
  }
  void put_string(std::string_view text) {
    put(static_cast<std::uint64_t>(text.size()));
    bytes_.append(text);
  }
  void begin(std::string_view key, gguf_type type) {
    ++count_;
    put_string(key);
    put(static_cast<std::uint32_t>(type));
  }

  std::string bytes_;
  std::uint64_t count_ = 0;
};

std::uint32_t ggml_type_of(kernels::dtype type) {
  switch (type) {
    case kernels::dtype::f32: return static_cast<std::uint32_t>(ggml_type::f32);
    case kernels::dtype::f16: return static_cast<std::uint32_t>(ggml_type::f16);
    case kernels::dtype::bf16: return static_cast<std::uint32_t>(ggml_type::bf16);
    case kernels::dtype::fp8_e4m3: break;  // refused by write_synthetic_model
  }
  return 0;
}

// llama.cpp's general.file_type: what most of the weights are.
std::uint32_t gguf_file_type(kernels::dtype type) {
  constexpr std::uint32_t all_f32 = 0;
  constexpr std::uint32_t mostly_f16 = 1;
  constexpr std::uint32_t mostly_bf16 = 32;
  switch (type) {
    case kernels::dtype::f32: return all_f32;
    case kernels::dtype::f16: return mostly_f16;
    case kernels::dtype::bf16: return mostly_bf16;
    case kernels::dtype::fp8_e4m3: break;  // refused by write_synthetic_model
  }
  return all_f32;
}

gguf_metadata gguf_keys(const synthetic_preset& preset, const synthetic_options& options, const synthetic_vocab& vocab) {
  constexpr std::int32_t token_type_normal = 1;
  constexpr std::int32_t token_type_control = 3;
  const model_config& c = preset.config;
  const std::string arch(to_string(c.arch));
  gguf_metadata keys;
  keys.add_string("general.architecture", arch);
  keys.add_string("general.name", preset.name + "-synthetic");
  keys.add_u32("general.file_type", gguf_file_type(options.dtype));
  keys.add_u32(arch + ".vocab_size", c.vocab_size);
  keys.add_u32(arch + ".context_length", c.max_position);
  keys.add_u32(arch + ".embedding_length", c.hidden_size);
  keys.add_u32(arch + ".block_count", c.num_layers);
  keys.add_u32(arch + ".feed_forward_length", c.intermediate_size);
  keys.add_u32(arch + ".attention.head_count", c.num_heads);
  keys.add_u32(arch + ".attention.head_count_kv", c.num_kv_heads);
  keys.add_u32(arch + ".attention.key_length", c.head_dim);
  keys.add_u32(arch + ".attention.value_length", c.head_dim);
  keys.add_u32(arch + ".rope.dimension_count", c.head_dim);
  keys.add_f32(arch + ".rope.freq_base", c.rope_theta);
  keys.add_f32(arch + ".attention.layer_norm_rms_epsilon", c.rms_norm_eps);
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
  keys.add_u32("tokenizer.ggml.bos_token_id", vocab.bos_id.value_or(vocab.pad_id));
  keys.add_u32("tokenizer.ggml.eos_token_id", vocab.eos_id);
  keys.add_u32("tokenizer.ggml.padding_token_id", vocab.pad_id);
  keys.add_bool("tokenizer.ggml.add_bos_token", vocab.add_bos);
  keys.add_string("tokenizer.chat_template", vocab.chat_template);
  return keys;
}

status write_gguf_file(const synthetic_preset& preset, const synthetic_options& options, const synthetic_vocab& vocab) {
  std::error_code ec;
  if (fs::is_directory(options.out, ec)) {
    return invalid_argument(edge::format("{} is a folder; a GGUF model is one file (e.g. {}/{}.gguf)",
                                         options.out.string(), options.out.string(), preset.name));
  }
  if (options.out.has_parent_path()) fs::create_directories(options.out.parent_path(), ec);

  const auto plan = plan_tensors(preset.config, synthetic_format::gguf, options.dtype);
  const auto keys = gguf_keys(preset, options, vocab);

  EDGE_ASSIGN_OR_RETURN(auto out, output_file::create(options.out));
  EDGE_RETURN_IF_ERROR(out->write("GGUF"));
  EDGE_RETURN_IF_ERROR(out->write_scalar(gguf_version));
  EDGE_RETURN_IF_ERROR(out->write_scalar(static_cast<std::uint64_t>(plan.size())));
  EDGE_RETURN_IF_ERROR(out->write_scalar(keys.count()));
  EDGE_RETURN_IF_ERROR(out->write(keys.bytes()));
  std::uint64_t offset = 0;
  for (const auto& t : plan) {
    EDGE_RETURN_IF_ERROR(out->write_scalar(static_cast<std::uint64_t>(t.name.size())));
    EDGE_RETURN_IF_ERROR(out->write(t.name));
    EDGE_RETURN_IF_ERROR(out->write_scalar(static_cast<std::uint32_t>(t.shape.size())));
    // ggml lists the contiguous dimension first.
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) {
      EDGE_RETURN_IF_ERROR(out->write_scalar(static_cast<std::uint64_t>(*it)));
    }
    EDGE_RETURN_IF_ERROR(out->write_scalar(ggml_type_of(t.type)));
    EDGE_RETURN_IF_ERROR(out->write_scalar(offset));
    offset += (t.bytes() + gguf_alignment - 1) / gguf_alignment * gguf_alignment;
  }
  EDGE_RETURN_IF_ERROR(out->pad_to(gguf_alignment));

  const std::uint64_t seed_hash = seed_hash_of(options.seed);
  progress_meter progress(options, total_bytes(plan));
  for (const auto& t : plan) {
    EDGE_RETURN_IF_ERROR(write_tensor_data(*out, t, seed_hash, progress));
    EDGE_RETURN_IF_ERROR(out->pad_to(gguf_alignment));
  }
  return out->commit();
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
  if (options.dtype == kernels::dtype::fp8_e4m3) {
    return invalid_argument("synthetic weights are f32, f16 or bf16; quantize them afterwards");
  }

  const auto vocab = make_synthetic_vocab(style_of(preset->config), preset->config.vocab_size,
                                          preset->special_tokens, preset->config.max_position);
  const status written = options.format == synthetic_format::gguf ? write_gguf_file(*preset, options, vocab)
                                                                  : write_safetensors_folder(*preset, options, vocab);
  if (!written.ok()) return written.with_context(edge::format("writing {}", options.out.string()));
  return options.out;
}

}  // namespace edge::backend
