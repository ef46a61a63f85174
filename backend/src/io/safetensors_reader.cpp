// parse_safetensors and load_safetensors_folder (edge/backend/io/safetensors.h).
#include "edge/backend/io/safetensors.h"

#include <simdjson.h>

#include <bit>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <string_view>

#include "edge/backend/io/dtype_names.h"
#include "edge/common/format.h"

namespace edge::backend {
namespace {

static_assert(std::endian::native == std::endian::little, "the safetensors header length is little-endian");

constexpr std::size_t header_length_size = 8;
// The reference implementation refuses headers over 100 MB; a larger length is corruption.
constexpr std::uint64_t max_header_size = 100'000'000;
constexpr std::string_view metadata_key = "__metadata__";

result<std::uint64_t> read_unsigned(simdjson::dom::element element, std::string_view what) {
  std::uint64_t value = 0;
  if (element.get_uint64().get(value) != simdjson::SUCCESS) {
    return invalid_argument(edge::format("{} must be a non-negative integer", what));
  }
  return value;
}

result<tensor_view> parse_tensor(std::string_view name, simdjson::dom::element entry,
                                 std::span<const std::byte> data) {
  simdjson::dom::object fields;
  if (entry.get_object().get(fields) != simdjson::SUCCESS) return invalid_argument("is not a JSON object");

  std::string_view dtype_name;
  if (fields["dtype"].get_string().get(dtype_name) != simdjson::SUCCESS) {
    return invalid_argument("has no \"dtype\" string");
  }
  const auto stored = parse_safetensors_dtype(dtype_name);
  if (!stored) {
    return invalid_argument(edge::format(
        "{} dtype {}", is_other_safetensors_dtype(dtype_name) ? "unsupported" : "unknown", dtype_name));
  }

  simdjson::dom::array shape_json;
  if (fields["shape"].get_array().get(shape_json) != simdjson::SUCCESS) {
    return invalid_argument("has no \"shape\" array");
  }
  tensor_view view;
  view.name = std::string(name);
  view.type = stored->type;
  view.encoding = stored->encoding;
  // The product of the non-zero dimensions must fit an int64, so that no partial product of
  // tensor_view::elements() overflows, even for an empty tensor.
  std::uint64_t elements = 1;
  std::uint64_t nonzero_product = 1;
  for (auto dim_json : shape_json) {
    EDGE_ASSIGN_OR_RETURN(const auto dim, read_unsigned(dim_json, "a shape dimension"));
    if (dim != 0 && (__builtin_mul_overflow(nonzero_product, dim, &nonzero_product) ||
                     nonzero_product > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))) {
      return invalid_argument("shape has too many elements");
    }
    elements *= dim;
    view.shape.push_back(static_cast<std::int64_t>(dim));
  }

  simdjson::dom::array offsets_json;
  if (fields["data_offsets"].get_array().get(offsets_json) != simdjson::SUCCESS || offsets_json.size() != 2) {
    return invalid_argument("has no \"data_offsets\" pair");
  }
  std::uint64_t range[2] = {};  // [begin, end) relative to the data section
  std::size_t next = 0;
  for (auto offset_json : offsets_json) {
    EDGE_ASSIGN_OR_RETURN(range[next], read_unsigned(offset_json, "data_offsets"));
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

result<std::map<std::string, std::string>> parse_metadata(simdjson::dom::element entry) {
  simdjson::dom::object fields;
  if (entry.get_object().get(fields) != simdjson::SUCCESS) {
    return invalid_argument("\"__metadata__\" is not a JSON object");
  }
  std::map<std::string, std::string> metadata;
  for (auto field : fields) {
    std::string_view text;
    if (field.value.get_string().get(text) != simdjson::SUCCESS) {
      return invalid_argument(edge::format("\"__metadata__\" value of \"{}\" is not a string", field.key));
    }
    metadata.insert_or_assign(std::string(field.key), std::string(text));
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
  simdjson::dom::element document;
  if (auto error = parser.parse(simdjson::padded_string(json)).get(document); error != simdjson::SUCCESS) {
    return invalid_argument(edge::format("invalid JSON: {}", simdjson::error_message(error)));
  }
  simdjson::dom::object weight_map;
  if (document["weight_map"].get_object().get(weight_map) != simdjson::SUCCESS) {
    return invalid_argument("no \"weight_map\" object");
  }
  std::map<std::string, std::string> shard_of;
  for (auto field : weight_map) {
    std::string_view shard;
    if (field.value.get_string().get(shard) != simdjson::SUCCESS) {
      return invalid_argument(edge::format("weight_map entry \"{}\" is not a file name", field.key));
    }
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string_view::npos) {
      return invalid_argument(edge::format("weight_map entry \"{}\" names \"{}\", not a file in the folder",
                                           field.key, shard));
    }
    if (!shard_of.emplace(std::string(field.key), std::string(shard)).second) {
      return invalid_argument(edge::format("weight_map lists \"{}\" twice", field.key));
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
  simdjson::dom::element document;
  if (auto error = parser.parse(simdjson::padded_string(header)).get(document); error != simdjson::SUCCESS) {
    return invalid_argument(edge::format("the header is not valid JSON: {}", simdjson::error_message(error)));
  }
  simdjson::dom::object entries;
  if (document.get_object().get(entries) != simdjson::SUCCESS) {
    return invalid_argument("the header is not a JSON object");
  }

  safetensors_file file;
  std::set<std::string_view> seen;
  for (auto entry : entries) {
    if (!seen.insert(entry.key).second) {
      return invalid_argument(edge::format("the header names \"{}\" twice", entry.key));
    }
    if (entry.key == metadata_key) {
      EDGE_ASSIGN_OR_RETURN(file.metadata, parse_metadata(entry.value));
      continue;
    }
    auto tensor = parse_tensor(entry.key, entry.value, data);
    if (!tensor.ok()) return tensor.error().with_context(edge::format("tensor \"{}\"", entry.key));
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
