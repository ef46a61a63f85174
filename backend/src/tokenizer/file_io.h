// Whole-file reads for tokenizer files (small enough to hold in memory: tokenizer.json is at
// most tens of MiB).
#pragma once

#include <filesystem>
#include <string>

#include "edge/common/status.h"

namespace edge::backend::detail {

// not_found for a missing file; unavailable when it cannot be read.
result<std::string> read_whole_file(const std::filesystem::path& path);

// Up to `count` bytes from the start of a file (fewer when the file is shorter).
result<std::string> read_file_prefix(const std::filesystem::path& path, std::size_t count);

}  // namespace edge::backend::detail
