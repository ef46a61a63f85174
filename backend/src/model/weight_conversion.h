// From weights as a file stores them to what the model keeps: used in place where the stored
// form is what the kernels read, else converted into a buffer of model_weights::storage
// (repacked exactly, or decoded exactly to float and encoded in the target format), in
// parallel over rows.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "edge/backend/model/formats.h"
#include "edge/backend/model/tensor.h"
#include "edge/common/status.h"

namespace edge::backend {

// A weight matrix [rows, cols] as a file stores it.
struct matrix_source {
  enum class kind {
    elements,     // values: F32 / F16 / BF16 [rows, cols]
    fp8,          // values: F8_E4M3 [rows, cols]; scales: one per row, or one for the whole matrix
    fp8_block,    // values: F8_E4M3 [rows, cols]; scales (weight_scale_inv, multiplied): one per block of
                  // block_rows × group_size, [ceil(rows / block_rows), ceil(cols / group_size)] (DeepSeek-V3's
                  // FP8 releases, 128 × 128)
    packed_int4,  // values: int32 [rows, ceil(cols / 8)], element 8w + i in bits 4i..4i+3 of word w
                  // as q + 8 (compressed-tensors' pack-quantized); scales: [rows, cols / group_size]
    ggml_q4_0,    // values: GGUF Q4_0 blocks
    ggml_q8_0,    // values: GGUF Q8_0 blocks
    ggml_q4_k,    // values: GGUF Q4_K super-blocks (the weight format q4_k)
    ggml_q5_k,    // values: GGUF Q5_K super-blocks (q5_k)
    ggml_q6_k,    // values: GGUF Q6_K super-blocks (q6_k)
  };
  kind stored = kind::elements;
  std::string name;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  tensor_view values;
  tensor_view scales;           // fp8, packed_int4: F32 / F16 / BF16 elements
  std::int64_t group_size = 0;  // packed_int4: elements per scale; fp8_block: columns per block
  std::int64_t block_rows = 0;  // fp8_block: rows per block

  std::uint64_t bytes() const { return values.bytes() + (scales.present() ? scales.bytes() : 0); }
};

// A single tensor as a matrix source: float elements, Q4_0, Q8_0 or a K-quant (checked against
// [rows, cols]). invalid_argument for other tensors.
result<matrix_source> matrix_source_of(const tensor_view& tensor, std::int64_t rows, std::int64_t cols);

// The format a source becomes when nothing else is asked: plain elements as they are, FP8 and
// INT4 as they are, Q4_0 → int4 (groups of 32), Q8_0 → f16 (f32 when a value is beyond f16's
// range), Q4_K / Q5_K / Q6_K → q4_k / q5_k / q6_k (the file's blocks, used in place), FP8 with
// block scales → bf16 (the matmul kernels read FP8 with one scale per row; a block-scaled matrix
// is decoded exactly and rounded once).
kernels::weight_format native_format(const matrix_source& source);

// Projections (routed and shared experts' included) take the requested format, or with
// weight_options::experts_only the routed experts alone (expert) do; the classifier (unless
// weight_options::classifier) and MoE routers only a float one (bf16 / f16 / f32), keeping their
// native format when int4 or fp8 is asked: the router's choice is what quantization must not move.
enum class matrix_role { projection, expert, classifier, router };

class weight_converter {
 public:
  // Buffers are appended to `storage`; options.on_converted hears of each projection source a
  // conversion replaced.
  weight_converter(const weight_options& options, std::vector<std::shared_ptr<const std::byte[]>>& storage)
      : options_(options), storage_(storage) {}

  result<weight_matrix> matrix(const matrix_source& source, matrix_role role);

  // A projection computed on load from another (the absorbed-query matrix of latent attention,
  // from kv_b_proj): `values` [rows, cols] encoded as `like` was, in the requested format or, as
  // stored, in the format `like` has (bf16 where that is a K-quant, which edgeinfer does not
  // encode).
  result<weight_matrix> computed(std::string name, std::span<const float> values, std::int64_t rows, std::int64_t cols,
                                 const weight_matrix& like);

  // Rows [first, first + count) of a source decoded exactly to float ([count, source.cols]).
  static std::vector<float> decode(const matrix_source& source, std::int64_t first, std::int64_t count);

  // Stacks matrices of one format, group size and width into one [sum of rows, cols] matrix,
  // their rows in order (fused Q/K/V, fused gate/up), and makes each part a view of its rows,
  // dropping the parts' own buffers. Only matrices this converter made: weights used in place
  // from a file stay separate rather than be copied out of their (shared, reclaimable) pages,
  // and the executors run them as they are (the CUDA executor stacks them as it uploads).
  // Absent, with the parts as they were, when they cannot be stacked.
  weight_matrix stack(std::string name, std::span<weight_matrix* const> parts);

  // The token embedding table, for the embedding kernel (elements only): F32/F16/BF16/F8 stay as
  // they are unless a float weight dtype is asked; Q4_0, Q8_0 and K-quant tables are decoded
  // exactly and become f16 (f32 when a value is beyond f16's range).
  result<tensor_view> embedding(const tensor_view& table);

 private:
  std::byte* allocate(std::uint64_t bytes);
  result<weight_matrix> encode(const matrix_source& source, kernels::weight_format target);
  // Whether `data` is the start of a storage buffer of ours; drop() frees it.
  bool owns(const void* data) const;
  void drop(const void* data);

  const weight_options& options_;
  std::vector<std::shared_ptr<const std::byte[]>>& storage_;
};

}  // namespace edge::backend
