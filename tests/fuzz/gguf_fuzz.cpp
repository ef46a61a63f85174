// libFuzzer harness: parse_gguf on arbitrary bytes returns a value or a status; it never
// crashes, hangs, allocates without bound or hands out a tensor view outside the input.
#include <cstddef>
#include <cstdint>
#include <span>

#include "edge/backend/io/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto bytes = std::span(reinterpret_cast<const std::byte*>(data), size);
  const auto parsed = edge::backend::parse_gguf(bytes);
  if (!parsed.ok()) return 0;
  // Reading each view's first and last byte lets AddressSanitizer catch a view past the input.
  std::byte sink{0};
  for (const auto& tensor : parsed->tensors) {
    if (tensor.bytes() == 0) continue;
    sink ^= tensor.data[0];
    sink ^= tensor.data[tensor.bytes() - 1];
  }
  volatile std::byte keep = sink;
  (void)keep;
  return 0;
}
