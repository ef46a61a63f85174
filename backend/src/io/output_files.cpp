#include "edge/backend/io/output_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "edge/common/format.h"

namespace edge::backend {
namespace {

namespace fs = std::filesystem;

// Large enough that writing a multi-gigabyte checkpoint costs few system calls.
constexpr std::size_t write_buffer_bytes = std::size_t{8} << 20;

}  // namespace

result<atomic_file> atomic_file::create(const fs::path& path) {
  fs::path partial = path;
  partial += partial_suffix;
  constexpr mode_t readable_by_all = 0644;
  const int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, readable_by_all);
  if (fd < 0) {
    const int error = errno;
    std::string message = edge::format("cannot create {}: {}", partial.string(), std::strerror(error));
    return error == ENOSPC ? resource_exhausted(std::move(message)) : unavailable(std::move(message));
  }
  return atomic_file(path, std::move(partial), fd);
}

atomic_file::atomic_file(fs::path path, fs::path partial, int fd)
    : path_(std::move(path)), partial_(std::move(partial)), fd_(fd), buffer_(write_buffer_bytes) {}

atomic_file::atomic_file(atomic_file&& other) noexcept
    : path_(std::move(other.path_)),
      partial_(std::exchange(other.partial_, {})),
      fd_(std::exchange(other.fd_, -1)),
      buffer_(std::move(other.buffer_)),
      used_(std::exchange(other.used_, 0)),
      position_(std::exchange(other.position_, 0)) {}

atomic_file::~atomic_file() {
  if (fd_ >= 0) ::close(fd_);
  if (!partial_.empty()) {
    std::error_code ec;
    fs::remove(partial_, ec);
  }
}

status atomic_file::write(const void* data, std::size_t size) {
  const auto* bytes = static_cast<const std::byte*>(data);
  position_ += size;
  while (size > 0) {
    const std::size_t n = std::min(size, buffer_.size() - used_);
    std::memcpy(buffer_.data() + used_, bytes, n);
    used_ += n;
    bytes += n;
    size -= n;
    if (used_ == buffer_.size()) EDGE_RETURN_IF_ERROR(flush());
  }
  return {};
}

status atomic_file::pad_to(std::uint64_t alignment) {
  static constexpr std::byte zeros[64] = {};
  while (position_ % alignment != 0) {
    const auto n = std::min<std::uint64_t>(alignment - position_ % alignment, sizeof(zeros));
    EDGE_RETURN_IF_ERROR(write(zeros, static_cast<std::size_t>(n)));
  }
  return {};
}

status atomic_file::commit() {
  EDGE_RETURN_IF_ERROR(flush());
  if (::close(std::exchange(fd_, -1)) != 0) return failure("close");
  std::error_code ec;
  fs::rename(partial_, path_, ec);
  if (ec) return unavailable(edge::format("cannot rename {} to {}: {}", partial_.string(), path_.string(), ec.message()));
  partial_.clear();
  return {};
}

status atomic_file::flush() {
  std::size_t written = 0;
  while (written < used_) {
    const auto n = ::write(fd_, buffer_.data() + written, used_ - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      return failure("write");
    }
    written += static_cast<std::size_t>(n);
  }
  used_ = 0;
  return {};
}

status atomic_file::failure(std::string_view what) const {
  const int error = errno;
  std::string message = edge::format("cannot {} {}: {}", what, partial_.string(), std::strerror(error));
  return error == ENOSPC ? resource_exhausted(std::move(message)) : unavailable(std::move(message));
}

status write_text_file(const fs::path& path, std::string_view text) {
  EDGE_ASSIGN_OR_RETURN(auto file, atomic_file::create(path));
  EDGE_RETURN_IF_ERROR(file.write(text));
  return file.commit();
}

status write_tensor_data(atomic_file& out, const output_tensor& tensor) {
  const std::uint64_t start = out.position();
  EDGE_RETURN_IF_ERROR(tensor.write(out));
  const std::uint64_t written = out.position() - start;
  if (written != tensor.bytes()) {
    return internal_error(edge::format("tensor \"{}\": {} bytes of data written where its header says {}", tensor.name,
                                       written, tensor.bytes()));
  }
  return {};
}

result<bool> output_folder_has_files(const fs::path& folder) {
  std::error_code ec;
  if (!fs::exists(folder, ec)) {
    fs::create_directories(folder, ec);
    if (ec) return unavailable(edge::format("cannot create {}: {}", folder.string(), ec.message()));
    return false;
  }
  if (!fs::is_directory(folder, ec)) return invalid_argument(edge::format("{} exists and is not a folder", folder.string()));
  return !fs::is_empty(folder, ec);
}

}  // namespace edge::backend
