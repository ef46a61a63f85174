// write_gguf and gguf_metadata_writer (edge/backend/io/gguf.h).
#include "edge/backend/io/gguf.h"

#include <bit>
#include <type_traits>

#include "edge/common/format.h"

namespace edge::backend {
namespace {

static_assert(std::endian::native == std::endian::little, "GGUF is written as the little-endian bytes in memory");

constexpr std::string_view gguf_magic_bytes = "GGUF";
constexpr std::uint32_t written_version = 3;

// The type a value of the reader's widened variant is written as.
gguf_value_type written_type(const gguf_value& v) {
  return std::visit(
      [](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::uint64_t>) return gguf_value_type::u64;
        if constexpr (std::is_same_v<T, std::int64_t>) return gguf_value_type::i64;
        if constexpr (std::is_same_v<T, double>) return gguf_value_type::f64;
        if constexpr (std::is_same_v<T, bool>) return gguf_value_type::boolean;
        if constexpr (std::is_same_v<T, std::string>) return gguf_value_type::string;
        if constexpr (std::is_same_v<T, gguf_array>) return gguf_value_type::array;
      },
      v.value);
}

}  // namespace

void gguf_metadata_writer::add_u32(std::string_view key, std::uint32_t value) {
  begin(key, gguf_value_type::u32);
  put(value);
}

void gguf_metadata_writer::add_u64(std::string_view key, std::uint64_t value) {
  begin(key, gguf_value_type::u64);
  put(value);
}

void gguf_metadata_writer::add_f32(std::string_view key, float value) {
  begin(key, gguf_value_type::f32);
  put(value);
}

void gguf_metadata_writer::add_bool(std::string_view key, bool value) {
  begin(key, gguf_value_type::boolean);
  put(static_cast<std::uint8_t>(value ? 1 : 0));
}

void gguf_metadata_writer::add_string(std::string_view key, std::string_view value) {
  begin(key, gguf_value_type::string);
  put_string(value);
}

void gguf_metadata_writer::add_strings(std::string_view key, std::span<const std::string> values) {
  begin(key, gguf_value_type::array);
  put(static_cast<std::uint32_t>(gguf_value_type::string));
  put(static_cast<std::uint64_t>(values.size()));
  for (const auto& value : values) put_string(value);
}

void gguf_metadata_writer::add_i32s(std::string_view key, std::span<const std::int32_t> values) {
  begin(key, gguf_value_type::array);
  put(static_cast<std::uint32_t>(gguf_value_type::i32));
  put(static_cast<std::uint64_t>(values.size()));
  for (const auto value : values) put(value);
}

void gguf_metadata_writer::add(std::string_view key, const gguf_value& value) {
  begin(key, written_type(value));
  put_value(value);
}

void gguf_metadata_writer::put_string(std::string_view text) {
  put(static_cast<std::uint64_t>(text.size()));
  bytes_.append(text);
}

void gguf_metadata_writer::put_value(const gguf_value& v) {
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>) {
          put(static_cast<std::uint8_t>(x ? 1 : 0));
        } else if constexpr (std::is_same_v<T, std::string>) {
          put_string(x);
        } else if constexpr (std::is_same_v<T, gguf_array>) {
          const gguf_value_type element = x.empty() ? gguf_value_type::i64 : written_type(x.front());
          put(static_cast<std::uint32_t>(element));
          put(static_cast<std::uint64_t>(x.size()));
          for (const auto& item : x) put_value(item);
        } else {
          put(x);
        }
      },
      v.value);
}

void gguf_metadata_writer::begin(std::string_view key, gguf_value_type type) {
  ++count_;
  put_string(key);
  put(static_cast<std::uint32_t>(type));
}

status write_gguf(const std::filesystem::path& path, const gguf_metadata_writer& metadata,
                  std::span<const output_tensor> tensors) {
  std::vector<std::uint32_t> types;  // [tensors]: ggml's numbers
  types.reserve(tensors.size());
  for (const auto& t : tensors) {
    const auto number = ggml_type_of(t.type);
    if (!number) {
      return invalid_argument(
          edge::format("tensor \"{}\": GGUF has no tensor type for {}", t.name, stored_type_name(t.type)));
    }
    types.push_back(static_cast<std::uint32_t>(*number));
  }

  EDGE_ASSIGN_OR_RETURN(auto out, atomic_file::create(path));
  EDGE_RETURN_IF_ERROR(out.write(gguf_magic_bytes));
  EDGE_RETURN_IF_ERROR(out.write_scalar(written_version));
  EDGE_RETURN_IF_ERROR(out.write_scalar(static_cast<std::uint64_t>(tensors.size())));
  EDGE_RETURN_IF_ERROR(out.write_scalar(metadata.count()));
  EDGE_RETURN_IF_ERROR(out.write(metadata.bytes()));
  std::uint64_t offset = 0;  // in the data section
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    EDGE_RETURN_IF_ERROR(out.write_scalar(static_cast<std::uint64_t>(t.name.size())));
    EDGE_RETURN_IF_ERROR(out.write(t.name));
    EDGE_RETURN_IF_ERROR(out.write_scalar(static_cast<std::uint32_t>(t.shape.size())));
    // ggml lists the contiguous dimension first.
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) {
      EDGE_RETURN_IF_ERROR(out.write_scalar(static_cast<std::uint64_t>(*it)));
    }
    EDGE_RETURN_IF_ERROR(out.write_scalar(types[i]));
    EDGE_RETURN_IF_ERROR(out.write_scalar(offset));
    offset += (t.bytes() + gguf_default_alignment - 1) / gguf_default_alignment * gguf_default_alignment;
  }
  EDGE_RETURN_IF_ERROR(out.pad_to(gguf_default_alignment));
  for (const auto& t : tensors) {
    EDGE_RETURN_IF_ERROR(write_tensor_data(out, t));
    EDGE_RETURN_IF_ERROR(out.pad_to(gguf_default_alignment));
  }
  return out.commit();
}

}  // namespace edge::backend
