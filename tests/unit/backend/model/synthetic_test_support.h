// Writing a make-model checkpoint for a test, shared by the model tests.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "edge/backend/model/synthetic.h"

namespace edge::testing {

// Writes `preset` to `out` (a folder, or a .gguf file) and returns the path written.
inline std::filesystem::path make_synthetic(const std::filesystem::path& out, std::string preset,
                                            backend::synthetic_format format, std::uint64_t seed,
                                            kernels::dtype dtype = kernels::dtype::bf16,
                                            std::uint64_t max_shard_bytes = 5'000'000'000) {
  backend::synthetic_options options;
  options.preset = std::move(preset);
  options.format = format;
  options.seed = seed;
  options.dtype = dtype;
  options.out = out;
  options.max_shard_bytes = max_shard_bytes;
  auto written = backend::write_synthetic_model(options);
  REQUIRE_MESSAGE(written.ok(), written.error().to_string());
  return *written;
}

}  // namespace edge::testing
