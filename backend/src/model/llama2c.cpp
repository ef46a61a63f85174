// llama2.c checkpoints (Karpathy's run.c "legacy" version 0 export).
#include <array>
#include <cstring>
#include <limits>

#include "edge/backend/model/formats.h"
#include "edge/common/format.h"
#include "model_checks.h"

namespace edge::backend {
namespace {

constexpr std::size_t header_fields = 7;  // dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
constexpr std::size_t header_size = header_fields * sizeof(std::int32_t);
// llama2.c trains with these and writes neither to the file.
constexpr double llama2c_rope_theta = 10000.0;
constexpr double llama2c_rms_norm_eps = 1e-5;

// Hands out consecutive F32 arrays of the file as tensor views.
class slab_reader {
 public:
  explicit slab_reader(std::span<const std::byte> bytes) : bytes_(bytes), offset_(header_size) {}

  // One array of `count` slabs of `shape`, as `count` views named "<name>" or "<name>.<i>".
  std::vector<tensor_view> take(std::string_view name, std::int64_t count, std::vector<std::int64_t> shape) {
    std::vector<tensor_view> views;
    views.reserve(static_cast<std::size_t>(count));
    for (std::int64_t i = 0; i < count; ++i) {
      tensor_view view;
      view.name = count == 1 ? std::string(name) : edge::format("{}.{}", name, i);
      view.type = kernels::dtype::f32;
      view.shape = shape;
      view.data = bytes_.data() + offset_;
      offset_ += view.bytes();
      views.push_back(std::move(view));
    }
    return views;
  }
  void skip(std::uint64_t floats) { offset_ += floats * sizeof(float); }

 private:
  std::span<const std::byte> bytes_;
  std::uint64_t offset_;
};

}  // namespace

result<llama2c_checkpoint> parse_llama2c(std::span<const std::byte> bytes) {
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
  model_weights& w = checkpoint.weights;
  w.token_embedding = in.take("token_embedding", 1, {vocab, width}).front();
  const auto rms_att = in.take("rms_att", layers, {width});
  const auto wq = in.take("wq", layers, {q_dim, width});
  const auto wk = in.take("wk", layers, {kv_dim, width});
  const auto wv = in.take("wv", layers, {kv_dim, width});
  const auto wo = in.take("wo", layers, {width, q_dim});
  const auto rms_ffn = in.take("rms_ffn", layers, {width});
  const auto w1 = in.take("w1", layers, {ffn, width});
  const auto w2 = in.take("w2", layers, {width, ffn});
  const auto w3 = in.take("w3", layers, {ffn, width});
  w.final_norm = in.take("rms_final", 1, {width}).front();
  // The precomputed RoPE tables are redundant with theta; the runtime computes its own.
  in.skip(static_cast<std::uint64_t>(2 * freq_floats));
  w.lm_head = config.tie_embeddings ? w.token_embedding : in.take("wcls", 1, {vocab, width}).front();

  w.layers.resize(static_cast<std::size_t>(layers));
  for (std::size_t i = 0; i < w.layers.size(); ++i) {
    auto& layer = w.layers[i];
    layer.attn_norm = rms_att[i];
    layer.wq = wq[i];
    layer.wk = wk[i];
    layer.wv = wv[i];
    layer.wo = wo[i];
    layer.ffn_norm = rms_ffn[i];
    layer.w_gate = w1[i];
    layer.w_up = w3[i];
    layer.w_down = w2[i];
  }
  return checkpoint;
}

}  // namespace edge::backend
