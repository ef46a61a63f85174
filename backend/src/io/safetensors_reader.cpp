// parse_safetensors and load_safetensors_folder (edge/backend/io/safetensors.h).
#include "edge/backend/io/safetensors.h"

#include <bit>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <string_view>

#include "edge/backend/io/dtype_names.h"
#include "edge/common/format.h"
#include "edge/common/json_fields.h"

namespace edge::backend {
namespace {

static_assert(std::endian::native == std::endian::little, "the safetensors header length is little-endian");

constexpr std::size_t header_length_size = 8;
// The reference implementation refuses headers over 100 MB; a larger length is corruption.
constexpr std::uint64_t max_header_size = 100'000'000;
constexpr std::string_view metadata_key = "__metadata__";

// `fields`: a tensor's entry, read as a document of its own (the caller names the tensor).
result<tensor_view> parse_tensor(std::string_view name, const json_fields& fields, std::span<const std::byte> data) {
  EDGE_ASSIGN_OR_RETURN(const std::string_view dtype_name, fields.required<std::string_view>("dtype"));
  const auto stored = parse_safetensors_dtype(dtype_name);
  if (!stored) {
    return invalid_argument(edge::format(
        "{} dtype {}", is_other_safetensors_dtype(dtype_name) ? "unsupported" : "unknown", dtype_name));
  }

  EDGE_ASSIGN_OR_RETURN(const json_array shape_json, fields.required<json_array>("shape"));
  tensor_view view;
  view.name = std::string(name);
  view.type = stored->type;
  view.encoding = stored->encoding;
  // The product of the non-zero dimensions must fit an int64, so that no partial product of
  // tensor_view::elements() overflows, even for an empty tensor.
  std::uint64_t elements = 1;
  std::uint64_t nonzero_product = 1;
  for (const json_value dim_json : shape_json) {
    EDGE_ASSIGN_OR_RETURN(const std::uint64_t dim, dim_json.as<std::uint64_t>());
    if (dim != 0 && (__builtin_mul_overflow(nonzero_product, dim, &nonzero_product) ||
                     nonzero_product > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))) {
      return invalid_argument("shape has too many elements");
    }
    elements *= dim;
    view.shape.push_back(static_cast<std::int64_t>(dim));
  }

  constexpr std::string_view offsets_expected = "a [begin, end] pair";
  EDGE_ASSIGN_OR_RETURN(const json_value offsets_value, fields.required("data_offsets"));
  EDGE_ASSIGN_OR_RETURN(const json_array offsets_json, offsets_value.as<json_array>(offsets_expected));
  if (offsets_json.size() != 2) return offsets_value.must_be(offsets_expected);
  std::uint64_t range[2] = {};  // [begin, end) relative to the data section
  std::size_t next = 0;
  for (const json_value offset_json : offsets_json) {
    EDGE_ASSIGN_OR_RETURN(range[next], offset_json.as<std::uint64_t>());
    ++next;
  }
  const auto [begin, end] = range;
  if (begin > end || end > data.size()) {
    return data_loss(edge::format("data_offsets [{}, {}) lie outside the {}-byte data section", begin, end,
                                  data.size()));
  }
  // No readable type takes more than 8 bytes per element: bounding that product keeps
  // encoded_bytes from overflowing.
  constexpr std::uint64_t max_bytes_per_element = 8;
  std::uint64_t bound = 0;
  if (__builtin_mul_overflow(elements, max_bytes_per_element, &bound) ||
      encoded_bytes(view.encoding, view.type, elements) != end - begin) {
    return invalid_argument(edge::format("data_offsets [{}, {}) hold {} bytes but {} elements of {} need {}", begin,
                                         end, end - begin, elements, dtype_name,
                                         encoded_bytes(view.encoding, view.type, elements)));
  }
  view.data = data.data() + begin;
  return view;
}

result<std::map<std::string, std::string>> parse_metadata(const json_value& entry) {
  EDGE_ASSIGN_OR_RETURN(const json_fields fields, entry.as<json_fields>());
  std::map<std::string, std::string> metadata;
  for (const auto [key, value] : fields) {
    EDGE_ASSIGN_OR_RETURN(const std::string_view text, value.as<std::string_view>());
    metadata.insert_or_assign(std::string(key), std::string(text));
  }
  return metadata;
}

result<std::string> read_small_file(const std::filesystem::path& path) {
  EDGE_ASSIGN_OR_RETURN(const auto mapping, mapped_file::open(path));
  const auto bytes = mapping->bytes();
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// The shard file names of an index, each checked to name a file inside the folder.
result<std::map<std::string, std::string>> parse_weight_map(std::string_view json) {
  simdjson::dom::parser parser;
  EDGE_ASSIGN_OR_RETURN(const auto index, parse_json_object(parser, json));
  const json_fields index_fields(index);
  EDGE_ASSIGN_OR_RETURN(const json_fields weight_map, index_fields.required<json_fields>("weight_map"));
  std::map<std::string, std::string> shard_of;
  for (const auto [tensor, value] : weight_map) {
    EDGE_ASSIGN_OR_RETURN(const std::string_view shard, value.as<std::string_view>("a file name"));
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string_view::npos) {
      return invalid_argument(edge::format("weight_map entry \"{}\" names \"{}\", not a file in the folder",
                                           tensor, shard));
    }
    if (!shard_of.emplace(std::string(tensor), std::string(shard)).second) {
      return invalid_argument(edge::format("weight_map lists \"{}\" twice", tensor));
    }
  }
  return shard_of;
}

result<std::vector<tensor_view>> map_and_parse(const std::filesystem::path& path,
                                               std::vector<std::shared_ptr<const mapped_file>>& keep_alive) {
  EDGE_ASSIGN_OR_RETURN(auto mapping, mapped_file::open(path));
  auto parsed = parse_safetensors(mapping->bytes());
  if (!parsed.ok()) return parsed.error().with_context(path.string());
  keep_alive.push_back(std::move(mapping));
  return std::move(parsed->tensors);
}

}  // namespace

result<safetensors_file> parse_safetensors(std::span<const std::byte> bytes) {
  if (bytes.size() < header_length_size) {
    return data_loss(edge::format("a safetensors file needs at least {} bytes, this one has {}", header_length_size,
                                  bytes.size()));
  }
  std::uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), header_length_size);
  if (header_size > bytes.size() - header_length_size) {
    return data_loss(edge::format("the header length {} runs past the end of the {}-byte file", header_size,
                                  bytes.size()));
  }
  if (header_size > max_header_size) {
    return invalid_argument(edge::format("the header length {} is over the {}-byte limit", header_size,
                                         max_header_size));
  }
  const auto header = std::string_view(reinterpret_cast<const char*>(bytes.data() + header_length_size),
                                       static_cast<std::size_t>(header_size));
  const auto data = bytes.subspan(header_length_size + static_cast<std::size_t>(header_size));

  simdjson::dom::parser parser;
  EDGE_ASSIGN_OR_RETURN(const auto entries, parse_json_object(parser, header, "the header"));

  safetensors_file file;
  std::set<std::string_view> seen;
  for (const auto [name, value] : json_fields(entries)) {
    if (!seen.insert(name).second) {
      return invalid_argument(edge::format("the header names \"{}\" twice", name));
    }
    if (name == metadata_key) {
      EDGE_ASSIGN_OR_RETURN(file.metadata, parse_metadata(value));
      continue;
    }
    EDGE_ASSIGN_OR_RETURN(const json_fields entry, value.as<json_fields>());
    auto tensor = parse_tensor(name, json_fields(entry.object()), data);
    if (!tensor.ok()) return tensor.error().with_context(edge::format("tensor \"{}\"", name));
    file.tensors.push_back(std::move(tensor).value());
  }
  return file;
}

result<std::vector<tensor_view>> load_safetensors_folder(const std::filesystem::path& folder,
                                                         std::vector<std::shared_ptr<const mapped_file>>& keep_alive) {
  const auto index_path = folder / safetensors_index_file;
  std::error_code ec;
  if (!std::filesystem::exists(index_path, ec)) {
    const auto single_path = folder / safetensors_single_file;
    if (!std::filesystem::exists(single_path, ec)) {
      return not_found(edge::format("{} holds neither {} nor {}", folder.string(), safetensors_single_file,
                                    safetensors_index_file));
    }
    return map_and_parse(single_path, keep_alive);
  }

  EDGE_ASSIGN_OR_RETURN(const auto index_text, read_small_file(index_path));
  auto shard_of = parse_weight_map(index_text);
  if (!shard_of.ok()) return shard_of.error().with_context(index_path.string());

  std::set<std::string> shards;
  for (const auto& [name, shard] : *shard_of) shards.insert(shard);

  std::vector<tensor_view> tensors;
  std::map<std::string, std::string, std::less<>> found_in;  // tensor name -> shard
  for (const auto& shard : shards) {
    EDGE_ASSIGN_OR_RETURN(auto shard_tensors, map_and_parse(folder / shard, keep_alive));
    for (auto& tensor : shard_tensors) {
      const auto [it, inserted] = found_in.emplace(tensor.name, shard);
      if (!inserted) {
        return invalid_argument(edge::format("{}: tensor \"{}\" is in both {} and {}", folder.string(), tensor.name,
                                             it->second, shard));
      }
      tensors.push_back(std::move(tensor));
    }
  }
  for (const auto& [name, shard] : *shard_of) {
    const auto it = found_in.find(name);
    if (it == found_in.end() || it->second != shard) {
      return data_loss(edge::format("{}: the index puts tensor \"{}\" in {}, which does not hold it",
                                    index_path.string(), name, shard));
    }
  }
  return tensors;
}

}  // namespace edge::backend
