// llama2.c checkpoints (Karpathy's run.c "legacy" version 0 export).
#include <array>
#include <cstring>
#include <limits>

#include "edge/backend/model/formats.h"
#include "edge/common/format.h"
#include "model_checks.h"
#include "weight_binding.h"

namespace edge::backend {
namespace {

constexpr std::size_t header_fields = 7;  // dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
constexpr std::size_t header_size = header_fields * sizeof(std::int32_t);
// llama2.c trains with these and writes neither to the file.
constexpr double llama2c_rope_theta = 10000.0;
constexpr double llama2c_rms_norm_eps = 1e-5;

// The name of slab i of an array of `count` slabs: "<name>", or "<name>.<i>" when there are several.
std::string slab_name(std::string_view name, std::int64_t count, std::int64_t i) {
  return count == 1 ? std::string(name) : edge::format("{}.{}", name, i);
}

// Hands out consecutive F32 arrays of the file as tensor views.
class slab_reader {
 public:
  explicit slab_reader(std::span<const std::byte> bytes) : bytes_(bytes), offset_(header_size) {}

  // One array of `count` slabs of `shape`, appended to `out` as views named by slab_name.
  void take(std::string_view name, std::int64_t count, const std::vector<std::int64_t>& shape,
            std::vector<tensor_view>& out) {
    for (std::int64_t i = 0; i < count; ++i) {
      tensor_view view;
      view.name = slab_name(name, count, i);
      view.type = kernels::dtype::f32;
      view.shape = shape;
      view.data = bytes_.data() + offset_;
      offset_ += view.bytes();
      out.push_back(std::move(view));
    }
  }
  void skip(std::uint64_t floats) { offset_ += floats * sizeof(float); }

 private:
  std::span<const std::byte> bytes_;
  std::uint64_t offset_;
};

}  // namespace

result<llama2c_checkpoint> parse_llama2c(std::span<const std::byte> bytes, const weight_options& options) {
  if (bytes.size() < header_size) {
    return invalid_argument(edge::format("{} bytes are too few for a llama2.c checkpoint header", bytes.size()));
  }
  std::array<std::int32_t, header_fields> header{};
  std::memcpy(header.data(), bytes.data(), header_size);
  const auto [dim, hidden_dim, n_layers, n_heads, n_kv_heads, signed_vocab, seq_len] = header;

  llama2c_checkpoint checkpoint;
  model_config& config = checkpoint.config;
  config.arch = architecture::llama;
  config.rope = rope_layout::adjacent_pairs;
  config.rope_theta = llama2c_rope_theta;
  config.rms_norm_eps = llama2c_rms_norm_eps;
  config.hidden_size = dim;
  config.intermediate_size = hidden_dim;
  config.num_layers = n_layers;
  config.num_heads = n_heads;
  config.num_kv_heads = n_kv_heads;
  // A negative vocabulary size is how the export marks a classifier of its own.
  config.tie_embeddings = signed_vocab > 0;
  config.vocab_size = signed_vocab == std::numeric_limits<std::int32_t>::min() ? 0 : std::abs(signed_vocab);
  config.max_position = seq_len;
  config.head_dim = n_heads > 0 ? dim / n_heads : 0;
  if (n_heads > 0 && dim % n_heads != 0) {
    return invalid_argument(edge::format("not a llama2.c checkpoint: dim {} is not a multiple of n_heads {}", dim,
                                         n_heads));
  }
  if (auto checked = check_config(config); !checked.ok()) {
    return checked.with_context("not a llama2.c checkpoint: implausible header");
  }

  // Every count below is a product of two or three checked sizes, far from overflowing.
  const std::int64_t layers = config.num_layers;
  const std::int64_t vocab = config.vocab_size;
  const std::int64_t width = config.hidden_size;
  const std::int64_t ffn = config.intermediate_size;
  const std::int64_t q_dim = config.num_heads * config.head_dim;
  const std::int64_t kv_dim = config.num_kv_heads * config.head_dim;
  const std::int64_t freq_floats = config.max_position * config.head_dim / 2;  // freq_cis_real [seq_len, head_dim/2]
  const std::int64_t layer_floats = 2 * width + 2 * q_dim * width + 2 * kv_dim * width + 3 * width * ffn;
  const std::int64_t floats = vocab * width + layers * layer_floats + width + 2 * freq_floats +
                              (config.tie_embeddings ? 0 : vocab * width);
  const std::uint64_t expected = header_size + static_cast<std::uint64_t>(floats) * sizeof(float);
  if (bytes.size() != expected) {
    return invalid_argument(edge::format(
        "not a llama2.c checkpoint: its header (dim {}, hidden {}, layers {}, heads {}/{}, vocab {}, seq_len {}) "
        "implies {} bytes, the file has {}",
        dim, hidden_dim, n_layers, n_heads, n_kv_heads, signed_vocab, seq_len, expected, bytes.size()));
  }

  slab_reader in(bytes);
  std::vector<tensor_view> tensors;
  in.take("token_embedding", 1, {vocab, width}, tensors);
  in.take("rms_att", layers, {width}, tensors);
  in.take("wq", layers, {q_dim, width}, tensors);
  in.take("wk", layers, {kv_dim, width}, tensors);
  in.take("wv", layers, {kv_dim, width}, tensors);
  in.take("wo", layers, {width, q_dim}, tensors);
  in.take("rms_ffn", layers, {width}, tensors);
  in.take("w1", layers, {ffn, width}, tensors);
  in.take("w2", layers, {width, ffn}, tensors);
  in.take("w3", layers, {ffn, width}, tensors);
  in.take("rms_final", 1, {width}, tensors);
  // The precomputed RoPE tables are redundant with theta; the runtime computes its own.
  in.skip(static_cast<std::uint64_t>(2 * freq_floats));
  if (!config.tie_embeddings) in.take("wcls", 1, {vocab, width}, tensors);

  tensor_names names;
  names.token_embedding = "token_embedding";
  names.final_norm = "rms_final";
  names.lm_head = "wcls";
  names.layer = [layers](std::int64_t i) {
    layer_tensor_names layer;
    layer.attn_norm = slab_name("rms_att", layers, i);
    layer.wq = slab_name("wq", layers, i);
    layer.wk = slab_name("wk", layers, i);
    layer.wv = slab_name("wv", layers, i);
    layer.wo = slab_name("wo", layers, i);
    layer.ffn_norm = slab_name("rms_ffn", layers, i);
    layer.w_gate = slab_name("w1", layers, i);
    layer.w_up = slab_name("w3", layers, i);
    layer.w_down = slab_name("w2", layers, i);
    return layer;
  };
  EDGE_ASSIGN_OR_RETURN(checkpoint.weights, bind_weights(tensor_index(tensors), config, names, options));
  return checkpoint;
}

}  // namespace edge::backend
