// Files and folders written so that an interrupted run never leaves a file that looks
// complete: each file is written under a temporary name beside its own and renamed into place
// only once all of it is written. And the tensors the checkpoint writers (GGUF, safetensors)
// take: what a file's header says about each, and a callback that produces its data as it is
// written, row by row if the caller likes, so that a model of any size is written in little
// memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "edge/backend/io/dtype_names.h"
#include "edge/common/status.h"

namespace edge::backend {

// A file written through a buffer under `path` + partial_suffix and renamed to `path` by
// commit(). Destroyed uncommitted (an error on the way, an exception), it removes the
// temporary file and leaves a file already at `path` as it was. One writer, one thread.
class atomic_file {
 public:
  static constexpr std::string_view partial_suffix = ".partial";

  // unavailable (resource_exhausted for a full disk) when the temporary file cannot be
  // created; its parent folder must exist.
  static result<atomic_file> create(const std::filesystem::path& path);

  ~atomic_file();
  atomic_file(atomic_file&& other) noexcept;
  atomic_file& operator=(atomic_file&&) = delete;
  atomic_file(const atomic_file&) = delete;
  atomic_file& operator=(const atomic_file&) = delete;

  // Bytes written so far.
  std::uint64_t position() const { return position_; }

  // Errors name the temporary file: resource_exhausted for a full disk, unavailable otherwise.
  status write(const void* data, std::size_t size);
  status write(std::string_view text) { return write(text.data(), text.size()); }
  // The value's bytes as they are in memory (the formats written are little-endian, as is
  // every machine edgeinfer builds for).
  template <class T>
    requires std::is_trivially_copyable_v<T>
  status write_scalar(T value) {
    return write(&value, sizeof(value));
  }
  // Zero bytes up to the next multiple of `alignment`.
  status pad_to(std::uint64_t alignment);

  // Writes what is buffered, closes the file and renames it into place, replacing a file of
  // that name. Called once; on failure the temporary file is removed.
  status commit();

 private:
  atomic_file(std::filesystem::path path, std::filesystem::path partial, int fd);

  status flush();
  status failure(std::string_view what) const;

  std::filesystem::path path_;
  std::filesystem::path partial_;  // empty once moved from or renamed into place
  int fd_;                         // -1 once closed
  std::vector<std::byte> buffer_;
  std::size_t used_ = 0;
  std::uint64_t position_ = 0;
};

// `text` as the whole of the file at `path`, written through an atomic_file.
status write_text_file(const std::filesystem::path& path, std::string_view text);

// Makes sure `folder` exists (creating it and its parents) and says whether it already holds
// anything. invalid_argument when it exists and is not a folder, unavailable when it cannot be
// created.
result<bool> output_folder_has_files(const std::filesystem::path& folder);

struct output_tensor {
  std::string name;
  stored_type type;
  std::vector<std::int64_t> shape;  // row-major, outermost dimension first (as tensor_view)
  // Writes exactly bytes() bytes; the writers check that it did.
  std::function<status(atomic_file&)> write;

  std::uint64_t elements() const {
    std::uint64_t n = 1;
    for (const auto d : shape) n *= static_cast<std::uint64_t>(d);
    return n;
  }
  std::uint64_t bytes() const { return encoded_bytes(type.encoding, type.type, elements()); }
};

// Runs `tensor.write`; internal_error naming the tensor when it wrote other than bytes() bytes
// (the header already promised that many).
status write_tensor_data(atomic_file& out, const output_tensor& tensor);

}  // namespace edge::backend
