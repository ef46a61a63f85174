// Shared by the model-format tests: reading files, and writing small GGUF and safetensors
// files byte by byte (independently of the writers in backend/src/io, so that a bug there cannot
// hide the same bug in the parsers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "edge/backend/io/tensor_view.h"
#include "edge/kernels/numerics.h"

namespace edge::testing {

inline std::vector<std::byte> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  if (!chars.empty()) std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline void write_text(const std::filesystem::path& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
}

// Little-endian bytes appended one value at a time.
class byte_writer {
 public:
  template <class T>
  byte_writer& put(T value) {
    const auto* p = reinterpret_cast<const std::byte*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(value));
    return *this;
  }
  byte_writer& raw(std::string_view text) {
    const auto* p = reinterpret_cast<const std::byte*>(text.data());
    bytes_.insert(bytes_.end(), p, p + text.size());
    return *this;
  }
  byte_writer& raw(std::span<const std::byte> data) {
    bytes_.insert(bytes_.end(), data.begin(), data.end());
    return *this;
  }
  // A GGUF string: uint64 length, then the bytes.
  byte_writer& str(std::string_view text) { return put<std::uint64_t>(text.size()).raw(text); }
  byte_writer& pad_to(std::size_t alignment) {
    while (bytes_.size() % alignment != 0) bytes_.push_back(std::byte{0});
    return *this;
  }
  std::size_t size() const { return bytes_.size(); }
  std::vector<std::byte>& bytes() { return bytes_; }

 private:
  std::vector<std::byte> bytes_;
};

// GGUF metadata value types (the file format's numbers).
enum gguf_type : std::uint32_t {
  gguf_u8 = 0, gguf_i8 = 1, gguf_u16 = 2, gguf_i16 = 3, gguf_u32 = 4, gguf_i32 = 5, gguf_f32 = 6,
  gguf_bool = 7, gguf_string = 8, gguf_array = 9, gguf_u64 = 10, gguf_i64 = 11, gguf_f64 = 12,
};
constexpr std::uint32_t ggml_f32 = 0, ggml_f16 = 1, ggml_q4_0 = 2, ggml_bf16 = 30;

struct test_tensor {
  std::string name;
  std::vector<std::uint64_t> ne;  // ggml order: contiguous dimension first
  std::uint32_t type = ggml_f32;
  std::vector<std::byte> data;
};

inline std::vector<std::byte> f32_bytes(const std::vector<float>& values) {
  std::vector<std::byte> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// A complete GGUF: `metadata` writes `kv_count` key/value pairs; the tensors' data follow at
// offsets aligned to `alignment`.
template <class Metadata>
std::vector<std::byte> make_gguf(std::uint64_t kv_count, Metadata&& metadata, const std::vector<test_tensor>& tensors,
                                 std::size_t alignment = 32, std::uint32_t version = 3) {
  byte_writer out;
  out.raw("GGUF").put<std::uint32_t>(version).put<std::uint64_t>(tensors.size()).put<std::uint64_t>(kv_count);
  metadata(out);
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    out.str(t.name).put<std::uint32_t>(static_cast<std::uint32_t>(t.ne.size()));
    for (auto d : t.ne) out.put<std::uint64_t>(d);
    out.put<std::uint32_t>(t.type).put<std::uint64_t>(offset);
    offset += (t.data.size() + alignment - 1) / alignment * alignment;
  }
  out.pad_to(alignment);
  for (const auto& t : tensors) out.raw(t.data).pad_to(alignment);
  return std::move(out.bytes());
}

// A safetensors file from its JSON header and data section.
inline std::vector<std::byte> make_safetensors(std::string_view header, std::span<const std::byte> data) {
  byte_writer out;
  out.put<std::uint64_t>(header.size()).raw(header).raw(data);
  return std::move(out.bytes());
}

// Element i of a tensor as float, whatever its dtype.
inline float element(const backend::tensor_view& t, std::int64_t i) {
  switch (t.type) {
    case kernels::dtype::f32: {
      float v;
      std::memcpy(&v, t.data + i * 4, 4);
      return v;
    }
    case kernels::dtype::f16: {
      std::uint16_t v;
      std::memcpy(&v, t.data + i * 2, 2);
      return kernels::fp16_to_float(v);
    }
    case kernels::dtype::bf16: {
      std::uint16_t v;
      std::memcpy(&v, t.data + i * 2, 2);
      return kernels::bf16_to_float(v);
    }
    case kernels::dtype::fp8_e4m3: {
      std::uint8_t v;
      std::memcpy(&v, t.data + i, 1);
      return kernels::fp8_e4m3_to_float(v);
    }
  }
  return 0.0f;
}

inline bool same_bytes(const backend::tensor_view& a, const backend::tensor_view& b) {
  return a.type == b.type && a.shape == b.shape && a.present() && b.present() &&
         std::memcmp(a.data, b.data, a.bytes()) == 0;
}

}  // namespace edge::testing
