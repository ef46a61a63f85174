// GGUF v2/v3 (the llama.cpp file format): metadata key/values and tensor descriptors, parsed
// from a memory-mapped file and validated so that a truncated or corrupt file is an error,
// never an out-of-bounds read.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "edge/backend/model/mapped_file.h"
#include "edge/backend/model/tensor.h"
#include "edge/common/status.h"

namespace edge::backend {

// GGUF's ggml tensor types that edgeinfer reads (the numbering is the file format's).
enum class ggml_type : std::uint32_t { f32 = 0, f16 = 1, bf16 = 30 };

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
  std::map<std::string, gguf_value, std::less<>> metadata;
  std::vector<tensor_view> tensors;  // data points into `file`
  std::shared_ptr<const mapped_file> file;

  const gguf_value* find(std::string_view key) const;
  const tensor_view* find_tensor(std::string_view name) const;
};

// Parses a GGUF held in `bytes` (a mapping of the whole file). data_loss for truncation or
// offsets outside the file, invalid_argument for a bad magic/version/type.
result<gguf_file> parse_gguf(std::span<const std::byte> bytes);
result<gguf_file> load_gguf(const std::filesystem::path& path);

}  // namespace edge::backend
