#include "weight_conversion.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <optional>

#include "edge/common/format.h"
#include "edge/common/thread_pool.h"
#include "edge/kernels/numerics.h"
#include "kernels/cpu/load.h"
#include "kernels/quantize/quantize.h"

namespace edge::backend {
namespace {

using kernels::weight_format;
using source_kind = matrix_source::kind;

// Rows converted per task: enough work to amortise the hand-off, and a float scratch of a few
// megabytes at most.
constexpr std::int64_t rows_per_task = 32;
// compressed-tensors packs eight 4-bit values into each int32.
constexpr std::int64_t nibbles_per_word = 8;
constexpr std::int64_t word_bytes = 4;
// The largest |q| of each GGUF block type, for the f16 range check.
constexpr float q4_0_max_magnitude = 8.0f;
constexpr float q8_0_max_magnitude = 128.0f;
// The largest code of the K-quants with a min (Q6_K's largest |q - 32| is its offset).
constexpr float q4_k_max_code = 15.0f;
constexpr float q5_k_max_code = 31.0f;

template <class T>
T read_scalar(const std::byte* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

// Element `index` of a float tensor (scales), widened exactly.
float float_at(const tensor_view& t, std::int64_t index) {
  return kernels::cpu::dispatch_dtype(t.type, [&]<kernels::dtype T>() {
    return kernels::cpu::load_as_float<T>(t.data, index);
  });
}

std::int64_t block_bytes(source_kind stored) {
  return stored == source_kind::ggml_q4_0 ? ggml_block_traits::q4_0_bytes : ggml_block_traits::q8_0_bytes;
}

// The weight format a K-quant source is, block for block; nullopt for the other kinds.
std::optional<weight_format> k_quant_of(source_kind stored) {
  switch (stored) {
    case source_kind::ggml_q4_k: return weight_format::q4_k;
    case source_kind::ggml_q5_k: return weight_format::q5_k;
    case source_kind::ggml_q6_k: return weight_format::q6_k;
    case source_kind::elements:
    case source_kind::fp8:
    case source_kind::fp8_block:
    case source_kind::packed_int4:
    case source_kind::ggml_q4_0:
    case source_kind::ggml_q8_0: return std::nullopt;
  }
  return std::nullopt;
}

std::int64_t packed_words_per_row(std::int64_t cols) { return (cols + nibbles_per_word - 1) / nibbles_per_word; }

// Row r of a source, decoded exactly to float: each value is one product (q × scale, rounded
// once), as the format's reference implementation computes it.
void decode_row(const matrix_source& s, std::int64_t r, float* out) {
  const std::int64_t cols = s.cols;
  switch (s.stored) {
    case source_kind::elements: {
      const auto element_bytes = static_cast<std::int64_t>(kernels::dtype_size(s.values.type));
      kernels::cpu::convert_to_float(s.values.type, s.values.data + r * cols * element_bytes, cols, out);
      return;
    }
    case source_kind::fp8: {
      const float scale = float_at(s.scales, s.scales.elements() == 1 ? 0 : r);
      const auto* codes = reinterpret_cast<const std::uint8_t*>(s.values.data) + r * cols;
      for (std::int64_t i = 0; i < cols; ++i) out[i] = kernels::fp8_e4m3_to_float(codes[i]) * scale;
      return;
    }
    case source_kind::fp8_block: {
      const std::int64_t blocks_across = (cols + s.group_size - 1) / s.group_size;
      const std::int64_t block_row = r / s.block_rows;
      const auto* codes = reinterpret_cast<const std::uint8_t*>(s.values.data) + r * cols;
      for (std::int64_t i = 0; i < cols; ++i) {
        out[i] = kernels::fp8_e4m3_to_float(codes[i]) * float_at(s.scales, block_row * blocks_across + i / s.group_size);
      }
      return;
    }
    case source_kind::packed_int4: {
      const std::byte* words = s.values.data + r * packed_words_per_row(cols) * word_bytes;
      const std::int64_t groups = cols / s.group_size;
      for (std::int64_t i = 0; i < cols; ++i) {
        const auto word = read_scalar<std::uint32_t>(words + i / nibbles_per_word * word_bytes);
        const auto code = static_cast<int>((word >> (kernels::int4_traits::nibble_bits * (i % nibbles_per_word))) &
                                           kernels::int4_traits::nibble_mask);
        out[i] = static_cast<float>(code - kernels::int4_traits::code_offset) *
                 float_at(s.scales, r * groups + i / s.group_size);
      }
      return;
    }
    case source_kind::ggml_q4_0:
    case source_kind::ggml_q8_0: {
      const std::int64_t blocks = cols / ggml_block_traits::elements;
      const std::int64_t size = block_bytes(s.stored);
      for (std::int64_t b = 0; b < blocks; ++b) {
        const std::byte* block = s.values.data + (r * blocks + b) * size;
        const float d = kernels::fp16_to_float(read_scalar<std::uint16_t>(block));
        const auto* qs = reinterpret_cast<const std::uint8_t*>(block + ggml_block_traits::scale_bytes);
        float* y = out + b * ggml_block_traits::elements;
        if (s.stored == source_kind::ggml_q8_0) {
          for (std::int64_t j = 0; j < ggml_block_traits::elements; ++j) {
            y[j] = static_cast<float>(static_cast<std::int8_t>(qs[j])) * d;
          }
        } else {
          constexpr std::int64_t half = ggml_block_traits::elements / 2;
          for (std::int64_t j = 0; j < half; ++j) {
            y[j] = static_cast<float>((qs[j] & kernels::int4_traits::nibble_mask) - kernels::int4_traits::code_offset) * d;
            y[j + half] = static_cast<float>((qs[j] >> kernels::int4_traits::nibble_bits) -
                                             kernels::int4_traits::code_offset) * d;
          }
        }
      }
      return;
    }
    case source_kind::ggml_q4_k:
    case source_kind::ggml_q5_k:
    case source_kind::ggml_q6_k: {
      const weight_format format = *k_quant_of(s.stored);
      const std::int64_t size = kernels::kquant_block_bytes(format);
      const std::int64_t blocks = cols / kernels::kquant_traits::block_elements;
      const auto* row = reinterpret_cast<const std::uint8_t*>(s.values.data) + r * blocks * size;
      for (std::int64_t b = 0; b < blocks; ++b) {
        kernels::kquant_dequantize_block(format, row + b * size, out + b * kernels::kquant_traits::block_elements);
      }
      return;
    }
  }
}

// The largest magnitude of a K-quant block's values, from its scales alone (an upper bound).
float k_quant_bound(weight_format format, const std::uint8_t* block) {
  using kernels::kquant_traits;
  if (format == weight_format::q6_k) {
    int max_scale = 0;
    for (int j = 0; j < kquant_traits::q6_k_sub_blocks; ++j) {
      max_scale = std::max(max_scale, std::abs(kernels::q6_k_scale(block, j)));
    }
    return std::fabs(kernels::kquant_half(block + kquant_traits::q6_k_d_at)) * static_cast<float>(max_scale) *
           static_cast<float>(kquant_traits::q6_k_offset);
  }
  int max_scale = 0, max_min = 0;
  for (int j = 0; j < kquant_traits::q4_k_sub_blocks; ++j) {
    const kernels::kquant_scale_min sm = kernels::q4_k_scale_min(block, j);
    max_scale = std::max(max_scale, sm.scale);
    max_min = std::max(max_min, sm.min);
  }
  const float max_q = format == weight_format::q4_k ? q4_k_max_code : q5_k_max_code;
  return std::fabs(kernels::kquant_half(block)) * static_cast<float>(max_scale) * max_q +
         std::fabs(kernels::kquant_half(block + kquant_traits::dmin_at)) * static_cast<float>(max_min);
}

// Whether every value of a Q4_0 / Q8_0 / K-quant tensor fits f16's range: |q| × max |d| (for
// the K-quants, a bound from each block's scales).
bool fits_fp16(const matrix_source& s) {
  if (const auto format = k_quant_of(s.stored)) {
    const std::int64_t blocks = s.rows * (s.cols / kernels::kquant_traits::block_elements);
    const std::int64_t size = kernels::kquant_block_bytes(*format);
    const auto* data = reinterpret_cast<const std::uint8_t*>(s.values.data);
    float bound = 0.0f;
    for (std::int64_t b = 0; b < blocks; ++b) bound = std::max(bound, k_quant_bound(*format, data + b * size));
    return bound <= kernels::fp16_traits::max;
  }
  const std::int64_t blocks = s.rows * (s.cols / ggml_block_traits::elements);
  const std::int64_t size = block_bytes(s.stored);
  float max_scale = 0.0f;
  for (std::int64_t b = 0; b < blocks; ++b) {
    max_scale = std::max(max_scale, std::fabs(kernels::fp16_to_float(read_scalar<std::uint16_t>(s.values.data + b * size))));
  }
  const float max_q = s.stored == source_kind::ggml_q4_0 ? q4_0_max_magnitude : q8_0_max_magnitude;
  return max_scale * max_q <= kernels::fp16_traits::max;
}

// Calls body(begin, end) over row ranges of at most rows_per_task, on the pool when there is one.
template <class Body>
void for_row_ranges(thread_pool* pool, std::int64_t rows, const Body& body) {
  if (pool == nullptr) {
    for (std::int64_t begin = 0; begin < rows; begin += rows_per_task) body(begin, std::min(rows, begin + rows_per_task));
    return;
  }
  pool->parallel_for(0, static_cast<std::size_t>(rows), static_cast<std::size_t>(rows_per_task),
                     [&](std::size_t begin, std::size_t end) {
                       body(static_cast<std::int64_t>(begin), static_cast<std::int64_t>(end));
                     });
}

// Encodes float rows [count, cols] as rows [first, first + count) of a plain-element buffer.
void encode_elements(const float* rows, std::int64_t count, std::int64_t cols, kernels::dtype type, std::byte* out,
                     std::int64_t first) {
  kernels::cpu::dispatch_dtype(type, [&]<kernels::dtype T>() {
    for (std::int64_t i = 0; i < count * cols; ++i) kernels::cpu::store_from_float<T>(out, first * cols + i, rows[i]);
  });
}

bool aligned_for(const std::byte* data, kernels::dtype type) {
  return reinterpret_cast<std::uintptr_t>(data) % kernels::dtype_size(type) == 0;
}

}  // namespace

result<matrix_source> matrix_source_of(const tensor_view& tensor, std::int64_t rows, std::int64_t cols) {
  matrix_source source;
  source.name = tensor.name;
  source.rows = rows;
  source.cols = cols;
  source.values = tensor;
  switch (tensor.encoding) {
    case tensor_encoding::elements:
      if (tensor.type == kernels::dtype::fp8_e4m3) {
        return invalid_argument(edge::format("tensor \"{}\" is F8_E4M3 without a weight_scale", tensor.name));
      }
      source.stored = source_kind::elements;
      break;
    case tensor_encoding::ggml_q4_0: source.stored = source_kind::ggml_q4_0; break;
    case tensor_encoding::ggml_q8_0: source.stored = source_kind::ggml_q8_0; break;
    case tensor_encoding::ggml_q4_k: source.stored = source_kind::ggml_q4_k; break;
    case tensor_encoding::ggml_q5_k: source.stored = source_kind::ggml_q5_k; break;
    case tensor_encoding::ggml_q6_k: source.stored = source_kind::ggml_q6_k; break;
    case tensor_encoding::int32:
    case tensor_encoding::int64:
      return invalid_argument(edge::format("tensor \"{}\" is {}, not a weight matrix", tensor.name, type_name(tensor)));
  }
  EDGE_RETURN_IF_ERROR(check_shape(tensor, {rows, cols}));
  return source;
}

weight_format native_format(const matrix_source& source) {
  switch (source.stored) {
    case source_kind::elements: return kernels::weight_format_of(source.values.type);
    case source_kind::fp8: return weight_format::fp8_e4m3;
    case source_kind::fp8_block: return weight_format::bf16;
    case source_kind::packed_int4:
    case source_kind::ggml_q4_0: return weight_format::int4;
    case source_kind::ggml_q8_0: return weight_format::int8;
    case source_kind::ggml_q4_k:
    case source_kind::ggml_q5_k:
    case source_kind::ggml_q6_k: return *k_quant_of(source.stored);
  }
  return weight_format::f32;
}

std::byte* weight_converter::allocate(std::uint64_t bytes) {
  // new[] aligns to 16 bytes, which keeps every INT4 row 16-byte aligned (rows are whole
  // 16-byte chunks).
  std::shared_ptr<std::byte[]> buffer(new std::byte[std::max<std::uint64_t>(bytes, 1)]);
  std::byte* data = buffer.get();
  storage_.push_back(std::move(buffer));
  return data;
}

result<weight_matrix> weight_converter::matrix(const matrix_source& s, matrix_role role) {
  weight_format target = native_format(s);
  const bool quantizable = role == matrix_role::expert || (role == matrix_role::projection && !options_.experts_only) ||
                           (role == matrix_role::classifier && options_.classifier);
  if (options_.target && (quantizable || !kernels::is_quantized(*options_.target))) {
    target = *options_.target;
  }
  // INT8 rows are whole groups of 32; a matrix whose rows are not keeps its own format.
  if (target == weight_format::int8 && s.cols % kernels::int8_traits::group_size != 0) target = native_format(s);
  EDGE_ASSIGN_OR_RETURN(weight_matrix m, encode(s, target));
  if ((role == matrix_role::projection || role == matrix_role::expert) && options_.on_converted) {
    const bool values_in_place = m.data == s.values.data;
    if (!values_in_place) options_.on_converted({s.values.data, s.values.bytes()});
    if (s.scales.present()) options_.on_converted({s.scales.data, s.scales.bytes()});
  }
  return m;
}

result<weight_matrix> weight_converter::computed(std::string name, std::span<const float> values, std::int64_t rows,
                                                 std::int64_t cols, const weight_matrix& like) {
  const tensor_view t{.name = name,
                      .type = kernels::dtype::f32,
                      .shape = {rows, cols},
                      .data = reinterpret_cast<const std::byte*>(values.data())};
  EDGE_ASSIGN_OR_RETURN(const matrix_source source, matrix_source_of(t, rows, cols));
  // Follows `like`: quantized where it was, as stored where it was left so.
  const bool quantized = options_.target && like.format == *options_.target;
  weight_format target = quantized ? *options_.target : like.format;
  // A K-quant, which only files hold, as bf16; so too INT8 for rows that are not whole groups
  // of 32 (a small model's transposed kv_b_proj), as matrix() leaves such rows unquantized.
  if (kernels::is_k_quant(target)) target = weight_format::bf16;
  if (target == weight_format::int8 && cols % kernels::int8_traits::group_size != 0) target = weight_format::bf16;
  EDGE_ASSIGN_OR_RETURN(weight_matrix m, encode(source, target));
  if (m.data == t.data) {
    // f32 kept as it is would point into the caller's vector: copy it into storage of ours.
    std::byte* copy = allocate(static_cast<std::uint64_t>(values.size_bytes()));
    std::memcpy(copy, values.data(), values.size_bytes());
    m.data = copy;
  }
  return m;
}

std::vector<float> weight_converter::decode(const matrix_source& source, std::int64_t first, std::int64_t count) {
  std::vector<float> out(static_cast<std::size_t>(count * source.cols));  // [count, cols]
  for (std::int64_t r = 0; r < count; ++r) decode_row(source, first + r, out.data() + r * source.cols);
  return out;
}

result<weight_matrix> weight_converter::encode(const matrix_source& s, weight_format target) {
  const weight_format native = native_format(s);
  weight_matrix m{.name = s.name, .shape = {s.rows, s.cols}, .format = target};
  const std::int64_t rows = s.rows;
  const std::int64_t cols = s.cols;

  const auto new_scales = [&](std::int64_t count) {
    auto* scales = reinterpret_cast<float*>(allocate(static_cast<std::uint64_t>(count) * sizeof(float)));
    m.scales = scales;
    return scales;
  };

  if (target == native && s.stored == source_kind::elements && aligned_for(s.values.data, s.values.type)) {
    m.data = s.values.data;
    return m;
  }
  if (target == native && k_quant_of(s.stored)) {
    // The kernels read the file's blocks as they are, at any alignment.
    m.data = s.values.data;
    return m;
  }
  if (kernels::is_k_quant(target)) {
    return invalid_argument(edge::format("{}: weights are not converted to {}", s.name, kernels::to_string(target)));
  }
  if (target == native && s.stored == source_kind::fp8) {
    m.data = s.values.data;
    float* scales = new_scales(rows);
    for (std::int64_t r = 0; r < rows; ++r) scales[r] = float_at(s.scales, s.scales.elements() == 1 ? 0 : r);
  } else if (target == native && s.stored == source_kind::ggml_q4_0) {
    // Q4_0's nibbles are already in INT4's order: the 16 bytes of a block are a chunk.
    m.group_size = ggml_block_traits::elements;
    const std::int64_t blocks = cols / ggml_block_traits::elements;
    const std::int64_t row_bytes = kernels::int4_row_bytes(cols);
    std::byte* values = allocate(static_cast<std::uint64_t>(rows * row_bytes));
    float* scales = new_scales(rows * blocks);
    m.data = values;
    for_row_ranges(options_.pool, rows, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t r = begin; r < end; ++r) {
        for (std::int64_t b = 0; b < blocks; ++b) {
          const std::byte* block = s.values.data + (r * blocks + b) * ggml_block_traits::q4_0_bytes;
          scales[r * blocks + b] = kernels::fp16_to_float(read_scalar<std::uint16_t>(block));
          std::memcpy(values + r * row_bytes + b * kernels::int4_traits::chunk_bytes, block + ggml_block_traits::scale_bytes,
                      kernels::int4_traits::chunk_bytes);
        }
      }
    });
  } else if (target == native && s.stored == source_kind::ggml_q8_0) {
    // A Q8_0 block is an f16 scale and 32 codes: the codes stay as they are, the scale widens.
    m.group_size = kernels::int8_traits::group_size;
    const std::int64_t blocks = cols / ggml_block_traits::elements;
    std::byte* values = allocate(static_cast<std::uint64_t>(rows * cols));
    float* scales = new_scales(rows * blocks);
    m.data = values;
    for_row_ranges(options_.pool, rows, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t r = begin; r < end; ++r) {
        for (std::int64_t b = 0; b < blocks; ++b) {
          const std::byte* block = s.values.data + (r * blocks + b) * ggml_block_traits::q8_0_bytes;
          scales[r * blocks + b] = kernels::fp16_to_float(read_scalar<std::uint16_t>(block));
          std::memcpy(values + (r * blocks + b) * ggml_block_traits::elements, block + ggml_block_traits::scale_bytes,
                      ggml_block_traits::elements);
        }
      }
    });
  } else if (target == native && s.stored == source_kind::packed_int4) {
    // Same codes, other nibble order; groups that are not a power of two dividing cols are
    // split into the largest that is (each new group lies inside one stored group).
    const std::int64_t common = std::gcd(s.group_size, cols);
    m.group_size = common & -common;
    const std::int64_t groups = cols / m.group_size;
    const std::int64_t stored_groups = cols / s.group_size;
    const std::int64_t row_bytes = kernels::int4_row_bytes(cols);
    const std::int64_t words = packed_words_per_row(cols);
    auto* values = reinterpret_cast<std::uint8_t*>(allocate(static_cast<std::uint64_t>(rows * row_bytes)));
    float* scales = new_scales(rows * groups);
    m.data = reinterpret_cast<const std::byte*>(values);
    for_row_ranges(options_.pool, rows, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t r = begin; r < end; ++r) {
        const std::byte* packed = s.values.data + r * words * word_bytes;
        const auto code_of = [&](std::int64_t i) {
          if (i >= cols) return kernels::int4_traits::code_offset;  // padding: q = 0
          const auto word = read_scalar<std::uint32_t>(packed + i / nibbles_per_word * word_bytes);
          return static_cast<int>((word >> (kernels::int4_traits::nibble_bits * (i % nibbles_per_word))) &
                                  kernels::int4_traits::nibble_mask);
        };
        std::uint8_t* row = values + r * row_bytes;
        for (std::int64_t c = 0; c * kernels::int4_traits::chunk_elements < cols; ++c) {
          const std::int64_t first = c * kernels::int4_traits::chunk_elements;
          for (std::int64_t j = 0; j < kernels::int4_traits::half_chunk; ++j) {
            row[c * kernels::int4_traits::chunk_bytes + j] = static_cast<std::uint8_t>(
                code_of(first + j) |
                (code_of(first + kernels::int4_traits::half_chunk + j) << kernels::int4_traits::nibble_bits));
          }
        }
        for (std::int64_t g = 0; g < groups; ++g) {
          scales[r * groups + g] = float_at(s.scales, r * stored_groups + g * m.group_size / s.group_size);
        }
      }
    });
  } else {
    // Decode exactly to float, encode in the target format.
    if (target == weight_format::int4) m.group_size = kernels::int4_group_size_for(cols, options_.int4_group_size);
    if (target == weight_format::int8) m.group_size = kernels::int8_traits::group_size;
    std::byte* values = allocate(static_cast<std::uint64_t>(kernels::weight_values_bytes(target, rows, cols)));
    const std::int64_t scale_count = kernels::weight_scale_count(target, rows, cols, m.group_size);
    float* scales = scale_count > 0 ? new_scales(scale_count) : nullptr;
    m.data = values;
    status failure;
    std::mutex failure_mutex;
    for_row_ranges(options_.pool, rows, [&](std::int64_t begin, std::int64_t end) {
      std::vector<float> decoded(static_cast<std::size_t>((end - begin) * cols));  // [end - begin, cols]
      for (std::int64_t r = begin; r < end; ++r) decode_row(s, r, decoded.data() + (r - begin) * cols);
      if (kernels::is_quantized(target)) {
        const std::int64_t scales_per_row = scale_count / rows;
        const status done = kernels::run_quantize(
            {.x = decoded.data(), .rows = end - begin, .k = cols, .x_stride = cols, .format = target,
             .group_size = m.group_size, .values = values + kernels::weight_values_bytes(target, begin, cols),
             .scales = scales + begin * scales_per_row},
            {});
        if (!done.ok()) {
          const std::lock_guard lock(failure_mutex);
          failure = done;
        }
      } else {
        encode_elements(decoded.data(), end - begin, cols, *kernels::element_dtype(target), values, begin);
      }
    });
    if (!failure.ok()) return failure.with_context(s.name);
  }
  return m;
}

bool weight_converter::owns(const void* data) const {
  return std::any_of(storage_.begin(), storage_.end(), [data](const auto& buffer) { return buffer.get() == data; });
}

void weight_converter::drop(const void* data) {
  std::erase_if(storage_, [data](const auto& buffer) { return buffer.get() == data; });
}

weight_matrix weight_converter::stack(std::string name, std::span<weight_matrix* const> parts) {
  const std::vector<const weight_matrix*> views(parts.begin(), parts.end());
  if (!same_layout(views)) return {};
  if (!std::all_of(parts.begin(), parts.end(), [&](const weight_matrix* p) { return owns(p->data); })) return {};
  const weight_matrix& first = *parts.front();
  const std::int64_t cols = first.cols();
  std::int64_t rows = 0;
  for (const weight_matrix* p : parts) rows += p->rows();
  weight_matrix fused{.name = std::move(name), .shape = {rows, cols}, .format = first.format,
                      .group_size = first.group_size};
  std::byte* values = allocate(static_cast<std::uint64_t>(kernels::weight_values_bytes(fused.format, rows, cols)));
  const std::int64_t scale_count = kernels::weight_scale_count(fused.format, rows, cols, fused.group_size);
  auto* scales = scale_count > 0 ? reinterpret_cast<float*>(allocate(static_cast<std::uint64_t>(scale_count) * sizeof(float)))
                                 : nullptr;
  fused.data = values;
  fused.scales = scales;
  std::int64_t row = 0;
  for (weight_matrix* p : parts) {
    const auto value_offset = kernels::weight_values_bytes(fused.format, row, cols);
    std::memcpy(values + value_offset, p->data, static_cast<std::size_t>(kernels::weight_values_bytes(p->format, p->rows(), cols)));
    drop(p->data);
    p->data = values + value_offset;
    if (scales != nullptr) {
      float* at = scales + kernels::weight_scale_count(fused.format, row, cols, fused.group_size);
      std::memcpy(at, p->scales,
                  static_cast<std::size_t>(kernels::weight_scale_count(p->format, p->rows(), cols, p->group_size)) *
                      sizeof(float));
      drop(p->scales);
      p->scales = at;
    }
    row += p->rows();
  }
  return fused;
}

result<tensor_view> weight_converter::embedding(const tensor_view& table) {
  std::optional<kernels::dtype> wanted;
  if (options_.target && !kernels::is_quantized(*options_.target)) wanted = kernels::element_dtype(*options_.target);
  if (table.encoding == tensor_encoding::elements && (!wanted || *wanted == table.type)) return table;
  if (table.encoding == tensor_encoding::elements && table.type == kernels::dtype::fp8_e4m3) return table;

  EDGE_ASSIGN_OR_RETURN(const auto source, matrix_source_of(table, table.rows(), table.cols()));
  if (!wanted) wanted = fits_fp16(source) ? kernels::dtype::f16 : kernels::dtype::f32;
  tensor_view converted = table;
  converted.type = *wanted;
  converted.encoding = tensor_encoding::elements;
  std::byte* values = allocate(converted.bytes());
  converted.data = values;
  for_row_ranges(options_.pool, source.rows, [&](std::int64_t begin, std::int64_t end) {
    std::vector<float> decoded(static_cast<std::size_t>((end - begin) * source.cols));  // [end - begin, cols]
    for (std::int64_t r = begin; r < end; ++r) decode_row(source, r, decoded.data() + (r - begin) * source.cols);
    encode_elements(decoded.data(), end - begin, source.cols, *wanted, values, begin);
  });
  return converted;
}

}  // namespace edge::backend
