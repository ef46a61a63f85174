// GGUF v2/v3 (the llama.cpp file format): metadata key/values and tensor descriptors, parsed
// from a memory-mapped file and validated so that a truncated or corrupt file is an error,
// never an out-of-bounds read; and the writer of GGUF v3 files (`edgeinfer make-model`'s models,
// `edgeinfer quantize`'s tokenizer.gguf).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "edge/backend/io/dtype_names.h"
#include "edge/backend/io/mapped_file.h"
#include "edge/backend/io/output_files.h"
#include "edge/backend/io/tensor_view.h"
#include "edge/common/status.h"

namespace edge::backend {

// The format's default alignment of tensor data, which every file edgeinfer writes uses (so it
// writes no general.alignment).
constexpr std::uint64_t gguf_default_alignment = 32;

// Metadata value types (the numbering is the file format's).
enum class gguf_value_type : std::uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};

struct gguf_value;
using gguf_array = std::vector<gguf_value>;

// One metadata value. Integers of every width are widened; arrays keep their element values.
struct gguf_value {
  std::variant<std::uint64_t, std::int64_t, double, bool, std::string, gguf_array> value;

  const std::string* as_string() const { return std::get_if<std::string>(&value); }
  const gguf_array* as_array() const { return std::get_if<gguf_array>(&value); }
  // Any integer type (and an integral float) as int64; nullopt otherwise.
  std::optional<std::int64_t> as_int() const;
  std::optional<double> as_number() const;
  std::optional<bool> as_bool() const;
};

struct gguf_file {
  std::uint32_t version = 0;
  std::uint64_t alignment = gguf_default_alignment;  // general.alignment, or the format's default
  std::uint64_t data_offset = 0;  // where the tensor data section starts in the file
  std::map<std::string, gguf_value, std::less<>> metadata;
  std::vector<tensor_view> tensors;  // data points into `file`
  std::shared_ptr<const mapped_file> file;

  const gguf_value* find(std::string_view key) const;
  const tensor_view* find_tensor(std::string_view name) const;
};

// Tensor types are the ggml_type numbers (dtype_names.h); others are rejected by name
// ("unsupported tensor type Q4_1 (3) for tensor ..."). Q4_0 and Q8_0 tensors must have rows
// of whole 32-element blocks, Q4_K / Q5_K / Q6_K rows of whole 256-element super-blocks;
// load_model repacks or converts them, or uses the K-quants as they are (model.h).
//
// Parses a GGUF held in `bytes` (a mapping of the whole file). data_loss for truncation, counts
// that cannot fit in the bytes left, or tensor data outside the data section; invalid_argument
// for a bad magic/version/value type/tensor type, a duplicate key or tensor name, a misaligned
// tensor offset or a bad general.alignment (default 32). Tensor shapes are row-major, ggml's
// dimension order reversed. Integers of every width are widened in `metadata`.
result<gguf_file> parse_gguf(std::span<const std::byte> bytes);
// The same for a file, which it maps; errors name the path.
result<gguf_file> load_gguf(const std::filesystem::path& path);

// Metadata for write_gguf, serialised as keys are added, in that order (the caller keeps keys
// unique).
class gguf_metadata_writer {
 public:
  void add_u32(std::string_view key, std::uint32_t value);
  void add_u64(std::string_view key, std::uint64_t value);
  void add_f32(std::string_view key, float value);
  void add_bool(std::string_view key, bool value);
  void add_string(std::string_view key, std::string_view value);
  void add_strings(std::string_view key, std::span<const std::string> values);
  void add_i32s(std::string_view key, std::span<const std::int32_t> values);
  // A value as parse_gguf holds it, in the types it widened to: integers as u64 / i64, numbers
  // as f64. An array's elements are written as its first element's type; an empty array is of
  // i64.
  void add(std::string_view key, const gguf_value& value);

  std::uint64_t count() const { return count_; }
  std::string_view bytes() const { return bytes_; }

 private:
  template <class T>
  void put(T value) {
    bytes_.append(reinterpret_cast<const char*>(&value), sizeof(value));
  }
  void put_string(std::string_view text);
  void put_value(const gguf_value& value);
  void begin(std::string_view key, gguf_value_type type);

  std::string bytes_;
  std::uint64_t count_ = 0;
};

// A GGUF v3 file at `path`, written through an atomic_file: the metadata, each tensor's info
// (ggml's dimension order, data offsets aligned to gguf_default_alignment), then each tensor's
// data, padded to the alignment. invalid_argument naming a tensor whose type GGUF has no
// number for (FP8, compressed-tensors' integers), before anything is written.
status write_gguf(const std::filesystem::path& path, const gguf_metadata_writer& metadata,
                  std::span<const output_tensor> tensors);

}  // namespace edge::backend
