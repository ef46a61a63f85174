// A read-only memory mapping of a whole file. Weights are used in place from the mapping, so a
// model's tensors stay valid exactly as long as the mapped_file that holds them.
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>
#include <span>

#include "edge/common/status.h"

namespace edge::backend {

class mapped_file {
 public:
  // not_found when the file does not exist; invalid_argument when it is not a regular file.
  static result<std::shared_ptr<const mapped_file>> open(const std::filesystem::path& path);

  ~mapped_file();
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  const std::filesystem::path& path() const { return path_; }

  // Asks the kernel to start reading [offset, offset + length) in ahead of use (advice only).
  void advise_will_need(std::size_t offset, std::size_t length) const;
  // Drops the whole pages inside [offset, offset + length) from the process (bytes converted
  // into a buffer of their own and not needed any more); touching them again reads the file.
  void release(std::size_t offset, std::size_t length) const;

 private:
  mapped_file(std::filesystem::path path, const std::byte* data, std::size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  std::filesystem::path path_;
  const std::byte* data_;
  std::size_t size_;
};

}  // namespace edge::backend
