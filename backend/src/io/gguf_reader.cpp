// parse_gguf and load_gguf (edge/backend/io/gguf.h).
#include "edge/backend/io/gguf.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string_view>

#include "edge/common/format.h"

namespace edge::backend {
namespace {

static_assert(std::endian::native == std::endian::little, "GGUF is read by reinterpreting little-endian bytes");

constexpr std::uint32_t gguf_magic = 0x4655'4747;  // "GGUF" read as a little-endian uint32
constexpr std::uint32_t min_version = 2;           // v1 used 32-bit counts; nothing writes it any more
constexpr std::uint32_t max_version = 3;
// Larger alignments are legal but no writer uses them; beyond this a value is corruption.
constexpr std::uint64_t max_alignment = std::uint64_t{1} << 30;
constexpr std::uint32_t max_tensor_dims = 4;  // GGML_MAX_DIMS
// Nested arrays recurse; a corrupt file must not be able to exhaust the stack.
constexpr int max_array_depth = 16;
// Array elements in all the metadata: real files hold about a million (vocabularies of 256k
// tokens with scores, types and merges); each costs a gguf_value, 40 bytes, however small it
// is in the file, so a corrupt file is stopped long before it can exhaust memory.
constexpr std::uint64_t max_array_elements = std::uint64_t{1} << 24;

constexpr std::uint32_t value_type_count = 13;  // u8 .. f64

// The fewest bytes one value of a type occupies: a count that needs more than the bytes left
// is rejected before anything is allocated for it.
constexpr std::uint64_t min_encoded_size(gguf_value_type type) {
  switch (type) {
    case gguf_value_type::u8:
    case gguf_value_type::i8:
    case gguf_value_type::boolean: return 1;
    case gguf_value_type::u16:
    case gguf_value_type::i16: return 2;
    case gguf_value_type::u32:
    case gguf_value_type::i32:
    case gguf_value_type::f32: return 4;
    case gguf_value_type::u64:
    case gguf_value_type::i64:
    case gguf_value_type::f64:
    case gguf_value_type::string: return 8;     // the length alone
    case gguf_value_type::array: return 4 + 8;  // element type and count
  }
  return 1;
}

// Tensor infos: name length, n_dims, at least one dimension, type, offset.
constexpr std::uint64_t min_tensor_info_size = 8 + 4 + 8 + 4 + 8;
// A key/value pair: key length, value type, and at least one byte of value.
constexpr std::uint64_t min_kv_size = 8 + 4 + 1;

// Bounds-checked little-endian reads from the front of the unread bytes. Every failure is
// data_loss naming the offset; callers add what was being read.
class cursor {
 public:
  explicit cursor(std::span<const std::byte> bytes) : bytes_(bytes) {}

  std::uint64_t offset() const { return offset_; }
  std::uint64_t remaining() const { return bytes_.size() - offset_; }

  // Counts `count` more array elements against max_array_elements.
  status take_array_elements(std::uint64_t count) {
    if (count > array_elements_left_) {
      return invalid_argument(edge::format("the metadata arrays hold more than {} elements", max_array_elements));
    }
    array_elements_left_ -= count;
    return {};
  }

  template <class T>
  result<T> read() {
    if (remaining() < sizeof(T)) return truncated(sizeof(T));
    T value;
    std::memcpy(&value, bytes_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return value;
  }

  result<std::string> read_string() {
    EDGE_ASSIGN_OR_RETURN(const auto length, read<std::uint64_t>());
    if (length > remaining()) {
      return data_loss(edge::format("a string of {} bytes at offset {} runs past the end ({} bytes left)", length,
                                    offset_ - sizeof(std::uint64_t), remaining()));
    }
    std::string text(reinterpret_cast<const char*>(bytes_.data() + offset_), static_cast<std::size_t>(length));
    offset_ += length;
    return text;
  }

  // A count of items that each take at least `min_item_size` bytes.
  result<std::uint64_t> read_count(std::uint64_t min_item_size, std::string_view items) {
    EDGE_ASSIGN_OR_RETURN(const auto count, read<std::uint64_t>());
    if (count > remaining() / min_item_size) {
      return data_loss(edge::format("{} {} cannot fit in the {} bytes left after offset {}", count, items,
                                    remaining(), offset_));
    }
    return count;
  }

 private:
  status truncated(std::size_t wanted) const {
    return data_loss(edge::format("the file ends at offset {} where {} more bytes were expected", bytes_.size(),
                                  wanted - remaining()));
  }

  std::span<const std::byte> bytes_;
  std::uint64_t offset_ = 0;
  std::uint64_t array_elements_left_ = max_array_elements;
};

// Values are read into their final place (a map entry, an array slot): moving a freshly built
// variant through result<> makes GCC's -Wmaybe-uninitialized misfire under the sanitizers.
status read_value(cursor& in, gguf_value_type type, int depth, gguf_value& out);

template <class Stored, class Encoded>
status read_scalar(cursor& in, gguf_value& out) {
  EDGE_ASSIGN_OR_RETURN(const auto encoded, in.read<Encoded>());
  out.value = static_cast<Stored>(encoded);
  return {};
}

result<gguf_value_type> read_value_type(cursor& in) {
  const auto at = in.offset();
  EDGE_ASSIGN_OR_RETURN(const auto raw, in.read<std::uint32_t>());
  if (raw >= value_type_count) {
    return invalid_argument(edge::format("unknown metadata value type {} at offset {}", raw, at));
  }
  return static_cast<gguf_value_type>(raw);
}

status read_array(cursor& in, int depth, gguf_value& out) {
  if (depth >= max_array_depth) {
    return invalid_argument(edge::format("arrays nested deeper than {} levels", max_array_depth));
  }
  EDGE_ASSIGN_OR_RETURN(const auto element_type, read_value_type(in));
  EDGE_ASSIGN_OR_RETURN(const auto count, in.read_count(min_encoded_size(element_type), "array elements"));
  EDGE_RETURN_IF_ERROR(in.take_array_elements(count));
  auto& elements = out.value.emplace<gguf_array>();
  elements.resize(static_cast<std::size_t>(count));
  for (std::uint64_t i = 0; i < count; ++i) {
    const status read = read_value(in, element_type, depth + 1, elements[static_cast<std::size_t>(i)]);
    if (!read.ok()) return read.with_context(edge::format("array element {}", i));
  }
  return {};
}

status read_value(cursor& in, gguf_value_type type, int depth, gguf_value& out) {
  switch (type) {
    case gguf_value_type::u8: return read_scalar<std::uint64_t, std::uint8_t>(in, out);
    case gguf_value_type::i8: return read_scalar<std::int64_t, std::int8_t>(in, out);
    case gguf_value_type::u16: return read_scalar<std::uint64_t, std::uint16_t>(in, out);
    case gguf_value_type::i16: return read_scalar<std::int64_t, std::int16_t>(in, out);
    case gguf_value_type::u32: return read_scalar<std::uint64_t, std::uint32_t>(in, out);
    case gguf_value_type::i32: return read_scalar<std::int64_t, std::int32_t>(in, out);
    case gguf_value_type::u64: return read_scalar<std::uint64_t, std::uint64_t>(in, out);
    case gguf_value_type::i64: return read_scalar<std::int64_t, std::int64_t>(in, out);
    case gguf_value_type::f32: return read_scalar<double, float>(in, out);
    case gguf_value_type::f64: return read_scalar<double, double>(in, out);
    case gguf_value_type::boolean: {
      const auto at = in.offset();
      EDGE_ASSIGN_OR_RETURN(const auto raw, in.read<std::uint8_t>());
      if (raw > 1) return invalid_argument(edge::format("boolean value {} at offset {} is neither 0 nor 1", raw, at));
      out.value = raw == 1;
      return {};
    }
    case gguf_value_type::string: {
      EDGE_ASSIGN_OR_RETURN(auto text, in.read_string());
      out.value = std::move(text);
      return {};
    }
    case gguf_value_type::array: return read_array(in, depth, out);
  }
  return invalid_argument("unknown metadata value type");
}

struct raw_tensor_info {
  std::string name;
  std::vector<std::int64_t> shape;  // ours: outermost first
  std::uint64_t elements = 1;
  kernels::dtype type = kernels::dtype::f32;
  tensor_encoding encoding = tensor_encoding::elements;
  std::uint64_t offset = 0;  // from the start of the data section
};

result<raw_tensor_info> read_tensor_info(cursor& in, std::uint64_t index) {
  raw_tensor_info info;
  auto name = in.read_string();
  if (!name.ok()) return name.error().with_context(edge::format("name of tensor {}", index));
  info.name = std::move(name).value();
  const auto fail = [&](status failure) { return failure.with_context(edge::format("tensor \"{}\"", info.name)); };

  auto n_dims = in.read<std::uint32_t>();
  if (!n_dims.ok()) return fail(n_dims.error());
  if (*n_dims == 0 || *n_dims > max_tensor_dims) {
    return fail(invalid_argument(edge::format("{} dimensions (1 to {} allowed)", *n_dims, max_tensor_dims)));
  }
  // ggml lists the contiguous dimension first; our shapes list it last. The product of the
  // non-zero dimensions must fit an int64, so that no partial product overflows either (an
  // empty tensor's other dimensions could otherwise be anything).
  info.shape.resize(*n_dims);
  std::uint64_t nonzero_product = 1;
  for (std::uint32_t i = 0; i < *n_dims; ++i) {
    auto dim = in.read<std::uint64_t>();
    if (!dim.ok()) return fail(dim.error());
    if (*dim != 0 && (__builtin_mul_overflow(nonzero_product, *dim, &nonzero_product) ||
                      nonzero_product > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))) {
      return fail(invalid_argument(edge::format("dimension {} = {} makes the element count overflow", i, *dim)));
    }
    info.elements *= *dim;
    info.shape[*n_dims - 1 - i] = static_cast<std::int64_t>(*dim);
  }

  auto type = in.read<std::uint32_t>();
  if (!type.ok()) return fail(type.error());
  const auto stored = parse_ggml_type(*type);
  if (!stored) {
    const auto type_name = ggml_type_name(*type);
    if (type_name.empty()) {
      return invalid_argument(edge::format("unknown tensor type {} for tensor \"{}\"", *type, info.name));
    }
    return invalid_argument(
        edge::format("unsupported tensor type {} ({}) for tensor \"{}\"", type_name, *type, info.name));
  }
  info.type = stored->type;
  info.encoding = stored->encoding;
  // Block types quantize whole blocks along the contiguous dimension.
  if (const std::int64_t block = block_elements(info.encoding); info.shape.back() % block != 0) {
    return fail(invalid_argument(edge::format("{} rows of {} elements are not whole blocks of {}",
                                              ggml_type_name(*type), info.shape.back(), block)));
  }

  auto offset = in.read<std::uint64_t>();
  if (!offset.ok()) return fail(offset.error());
  info.offset = *offset;
  return info;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

}  // namespace

std::optional<std::int64_t> gguf_value::as_int() const {
  if (const auto* u = std::get_if<std::uint64_t>(&value)) {
    if (*u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
    return static_cast<std::int64_t>(*u);
  }
  if (const auto* i = std::get_if<std::int64_t>(&value)) return *i;
  if (const auto* d = std::get_if<double>(&value)) {
    // 2^63, exactly; the range test is written so that NaN fails it.
    constexpr double limit = -static_cast<double>(std::numeric_limits<std::int64_t>::min());
    if (!(*d >= -limit && *d < limit) || std::trunc(*d) != *d) return std::nullopt;
    return static_cast<std::int64_t>(*d);
  }
  return std::nullopt;
}

std::optional<double> gguf_value::as_number() const {
  if (const auto* u = std::get_if<std::uint64_t>(&value)) return static_cast<double>(*u);
  if (const auto* i = std::get_if<std::int64_t>(&value)) return static_cast<double>(*i);
  if (const auto* d = std::get_if<double>(&value)) return *d;
  return std::nullopt;
}

std::optional<bool> gguf_value::as_bool() const {
  if (const auto* b = std::get_if<bool>(&value)) return *b;
  return std::nullopt;
}

const gguf_value* gguf_file::find(std::string_view key) const {
  const auto it = metadata.find(key);
  return it == metadata.end() ? nullptr : &it->second;
}

const tensor_view* gguf_file::find_tensor(std::string_view name) const {
  for (const auto& tensor : tensors) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

result<gguf_file> parse_gguf(std::span<const std::byte> bytes) {
  cursor in(bytes);
  gguf_file file;

  const auto magic = in.read<std::uint32_t>();
  if (!magic.ok() || *magic != gguf_magic) return invalid_argument("not a GGUF file (no \"GGUF\" magic)");
  EDGE_ASSIGN_OR_RETURN(file.version, in.read<std::uint32_t>());
  if (file.version < min_version || file.version > max_version) {
    if (__builtin_bswap32(file.version) >= min_version && __builtin_bswap32(file.version) <= max_version) {
      return invalid_argument("big-endian GGUF files are not supported");
    }
    return invalid_argument(
        edge::format("GGUF version {} is not supported (versions {} to {} are)", file.version, min_version, max_version));
  }

  auto tensor_count = in.read_count(min_tensor_info_size, "tensor infos");
  if (!tensor_count.ok()) return tensor_count.error().with_context("tensor count");
  auto kv_count = in.read_count(min_kv_size, "metadata entries");
  if (!kv_count.ok()) return kv_count.error().with_context("metadata count");

  for (std::uint64_t i = 0; i < *kv_count; ++i) {
    auto key = in.read_string();
    if (!key.ok()) return key.error().with_context(edge::format("metadata entry {}", i));
    const auto fail = [&](const status& failure) {
      return failure.with_context(edge::format("metadata \"{}\"", *key));
    };
    auto type = read_value_type(in);
    if (!type.ok()) return fail(type.error());
    const auto [slot, inserted] = file.metadata.try_emplace(*key);
    if (!inserted) return fail(invalid_argument("duplicate metadata key"));
    if (status read = read_value(in, *type, 0, slot->second); !read.ok()) return fail(read);
  }

  std::uint64_t alignment = gguf_default_alignment;
  if (const auto* value = file.find("general.alignment")) {
    const auto given = value->as_int();
    if (!given || *given <= 0 || static_cast<std::uint64_t>(*given) > max_alignment ||
        !std::has_single_bit(static_cast<std::uint64_t>(*given))) {
      return invalid_argument("general.alignment must be a power of two");
    }
    alignment = static_cast<std::uint64_t>(*given);
  }

  std::vector<raw_tensor_info> infos;
  infos.reserve(static_cast<std::size_t>(*tensor_count));
  std::set<std::string, std::less<>> names;
  for (std::uint64_t i = 0; i < *tensor_count; ++i) {
    auto info = read_tensor_info(in, i);
    if (!info.ok()) return info.error();
    if (!names.insert(info->name).second) {
      return invalid_argument(edge::format("duplicate tensor name \"{}\"", info->name));
    }
    infos.push_back(std::move(info).value());
  }

  // The data section starts at the next multiple of the alignment after the tensor infos.
  const std::uint64_t infos_end = in.offset();
  const std::uint64_t data_start = infos_end + (alignment - infos_end % alignment) % alignment;
  const std::uint64_t data_size = data_start <= bytes.size() ? bytes.size() - data_start : 0;
  if (data_start > bytes.size() && !infos.empty()) {
    return data_loss(edge::format("the tensor data section would start at offset {}, past the end of the {}-byte file",
                                  data_start, bytes.size()));
  }

  file.alignment = alignment;
  file.data_offset = data_start;
  file.tensors.reserve(infos.size());
  for (auto& info : infos) {
    if (info.offset % alignment != 0) {
      return invalid_argument(edge::format("tensor \"{}\": data offset {} is not a multiple of the alignment {}",
                                           info.name, info.offset, alignment));
    }
    tensor_view view;
    view.type = info.type;
    view.encoding = info.encoding;
    // No encoding takes more than 8 bytes per element, so bounding that product keeps
    // encoded_bytes from overflowing.
    constexpr std::uint64_t max_bytes_per_element = 8;
    std::uint64_t bound = 0;
    std::uint64_t end = 0;
    const bool sized = !__builtin_mul_overflow(info.elements, max_bytes_per_element, &bound);
    const std::uint64_t size = sized ? encoded_bytes(info.encoding, info.type, info.elements) : 0;
    if (!sized || __builtin_add_overflow(info.offset, size, &end) || end > data_size) {
      return data_loss(edge::format("tensor \"{}\" ({} {}) at data offset {} runs past the end of the {}-byte data section",
                                    info.name, type_name(view), shape_text(info.shape), info.offset, data_size));
    }
    view.name = std::move(info.name);
    view.shape = std::move(info.shape);
    view.data = bytes.data() + data_start + info.offset;
    file.tensors.push_back(std::move(view));
  }
  return file;
}

result<gguf_file> load_gguf(const std::filesystem::path& path) {
  EDGE_ASSIGN_OR_RETURN(auto mapping, mapped_file::open(path));
  auto parsed = parse_gguf(mapping->bytes());
  if (!parsed.ok()) return parsed.error().with_context(path.string());
  parsed->file = std::move(mapping);
  return parsed;
}

}  // namespace edge::backend
