// safetensors: an 8-byte little-endian header length, a JSON header naming each tensor's
// dtype, shape and byte range, then the data. Sharded checkpoints list their files in
// model.safetensors.index.json. The reader of Hugging Face folders' weights, and the writer of
// `edgeinfer make-model`'s and `edgeinfer quantize`'s.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "edge/backend/io/mapped_file.h"
#include "edge/backend/io/output_files.h"
#include "edge/backend/io/tensor_view.h"
#include "edge/common/status.h"

namespace edge::backend {

// The weights of a folder in one file, or the index of its shards.
constexpr std::string_view safetensors_single_file = "model.safetensors";
constexpr std::string_view safetensors_index_file = "model.safetensors.index.json";

struct safetensors_file {
  std::vector<tensor_view> tensors;  // data points into the bytes parsed
  std::map<std::string, std::string> metadata;  // the header's "__metadata__"
};

// Validates every tensor's dtype, shape and range against the buffer. Only the dtypes
// edgeinfer reads (parse_safetensors_dtype in dtype_names.h) are accepted; others are
// invalid_argument naming the tensor.
result<safetensors_file> parse_safetensors(std::span<const std::byte> bytes);

// All tensors of a Hugging Face folder: model.safetensors, or every shard listed by
// model.safetensors.index.json. The mappings are appended to `keep_alive`.
result<std::vector<tensor_view>> load_safetensors_folder(
    const std::filesystem::path& folder, std::vector<std::shared_ptr<const mapped_file>>& keep_alive);

// A header's "__metadata__" entries, in order, after the "format": "pt" every file gets.
using safetensors_metadata = std::vector<std::pair<std::string, std::string>>;

// Writes `tensors`, in order, into `folder` (which must exist) as model.safetensors, or, when
// they pass `max_shard_bytes`, as shards model-00001-of-0000N.safetensors listed by
// model.safetensors.index.json: a new shard begins whenever the next tensor would pass the limit
// (a tensor larger than the limit has a shard of its own). Every file's header carries
// `metadata` and starts the data 8-byte aligned; every file is written through an atomic_file.
// invalid_argument naming a tensor of a type safetensors cannot hold (GGUF's block encodings),
// before anything is written.
status write_safetensors_weights(const std::filesystem::path& folder, std::span<const output_tensor> tensors,
                                 const safetensors_metadata& metadata, std::uint64_t max_shard_bytes);

}  // namespace edge::backend
