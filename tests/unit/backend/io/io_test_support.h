// Tensors for the writer tests whose data can be checked after reading back.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "edge/backend/io/output_files.h"

namespace edge::testing {

// n bytes counting up (mod 256) from `start`.
inline std::vector<std::byte> counting_bytes(std::size_t n, int start) {
  std::vector<std::byte> bytes(n);
  for (std::size_t i = 0; i < n; ++i) bytes[i] = static_cast<std::byte>(start + static_cast<int>(i));
  return bytes;
}

// A tensor whose data is given.
inline backend::output_tensor tensor_of(std::string name, backend::stored_type type, std::vector<std::int64_t> shape,
                                        std::vector<std::byte> data) {
  return {.name = std::move(name), .type = type, .shape = std::move(shape),
          .write = [data = std::move(data)](backend::atomic_file& out) { return out.write(data.data(), data.size()); }};
}

// A tensor whose data is counting_bytes(its size, start).
inline backend::output_tensor counting_tensor(std::string name, backend::stored_type type,
                                              std::vector<std::int64_t> shape, int start) {
  const backend::output_tensor sized{.type = type, .shape = shape};
  return tensor_of(std::move(name), type, std::move(shape), counting_bytes(sized.bytes(), start));
}

}  // namespace edge::testing
