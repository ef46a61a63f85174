// write_safetensors_weights (edge/backend/io/safetensors.h).
#include "edge/backend/io/safetensors.h"

#include <bit>
#include <string>
#include <vector>

#include "edge/common/format.h"
#include "edge/common/json_text.h"

namespace edge::backend {
namespace {

namespace fs = std::filesystem;

static_assert(std::endian::native == std::endian::little, "the safetensors header length is little-endian");

// The data section of a file starts at a multiple of this (8-byte length + header).
constexpr std::size_t header_alignment = 8;

std::string shard_name(std::size_t index, std::size_t count) {
  constexpr std::size_t digits = 5;
  const auto padded = [](std::size_t n) {
    std::string text = std::to_string(n);
    return std::string(text.size() < digits ? digits - text.size() : 0, '0') + text;
  };
  return "model-" + padded(index + 1) + "-of-" + padded(count) + ".safetensors";
}

std::string header_of(std::span<const output_tensor* const> tensors, const safetensors_metadata& metadata) {
  // transformers loads a file with torch only when its format is "pt".
  std::string header = "{\"__metadata__\": {\"format\": \"pt\"";
  for (const auto& [key, value] : metadata) {
    header += ", ";
    append_json_string(header, key);
    header += ": ";
    append_json_string(header, value);
  }
  header += '}';
  std::uint64_t offset = 0;
  for (const auto* t : tensors) {
    header += ", ";
    append_json_string(header, t->name);
    header += ": {\"dtype\": \"" + std::string(safetensors_dtype_name(t->type)) + "\", \"shape\": [";
    for (std::size_t i = 0; i < t->shape.size(); ++i) header += (i ? ", " : "") + std::to_string(t->shape[i]);
    header += "], \"data_offsets\": [" + std::to_string(offset) + ", " + std::to_string(offset + t->bytes()) + "]}";
    offset += t->bytes();
  }
  header += '}';
  // Spaces (which JSON ignores) put the data at an aligned offset.
  header.append((header_alignment - header.size() % header_alignment) % header_alignment, ' ');
  return header;
}

}  // namespace

status write_safetensors_weights(const fs::path& folder, std::span<const output_tensor> tensors,
                                 const safetensors_metadata& metadata, std::uint64_t max_shard_bytes) {
  for (const auto& t : tensors) {
    if (safetensors_dtype_name(t.type).empty()) {
      return invalid_argument(edge::format("tensor \"{}\": safetensors has no dtype for {}", t.name,
                                           stored_type_name(t.type)));
    }
  }

  // Tensors in order, a new shard whenever the next one would pass the limit.
  std::vector<std::vector<const output_tensor*>> shards(1);
  std::uint64_t shard_bytes = 0;
  std::uint64_t total_bytes = 0;
  for (const auto& t : tensors) {
    if (!shards.back().empty() && shard_bytes + t.bytes() > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(&t);
    shard_bytes += t.bytes();
    total_bytes += t.bytes();
  }

  std::string weight_map;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const std::string file_name =
        shards.size() == 1 ? std::string(safetensors_single_file) : shard_name(s, shards.size());
    const std::string header = header_of(shards[s], metadata);
    EDGE_ASSIGN_OR_RETURN(auto out, atomic_file::create(folder / file_name));
    EDGE_RETURN_IF_ERROR(out.write_scalar(static_cast<std::uint64_t>(header.size())));
    EDGE_RETURN_IF_ERROR(out.write(header));
    for (const auto* t : shards[s]) {
      EDGE_RETURN_IF_ERROR(write_tensor_data(out, *t));
      weight_map += weight_map.empty() ? "\n    " : ",\n    ";
      weight_map += json_string(t->name) + ": " + json_string(file_name);
    }
    EDGE_RETURN_IF_ERROR(out.commit());
  }
  if (shards.size() == 1) return {};
  const std::string index = "{\n  \"metadata\": {\"total_size\": " + std::to_string(total_bytes) +
                            "},\n  \"weight_map\": {" + weight_map + "\n  }\n}\n";
  return write_text_file(folder / safetensors_index_file, index);
}

}  // namespace edge::backend
