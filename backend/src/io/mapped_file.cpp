#include "edge/backend/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "edge/common/format.h"

namespace edge::backend {
namespace {

// Closes a descriptor on every path out of open(); the mapping outlives it.
class fd_guard {
 public:
  explicit fd_guard(int fd) : fd_(fd) {}
  ~fd_guard() {
    if (fd_ >= 0) ::close(fd_);
  }
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

status errno_status(const std::filesystem::path& path, std::string_view what, int error) {
  std::string message = edge::format("cannot {} {}: {}", what, path.string(), std::strerror(error));
  switch (error) {
    case ENOENT:
    case ENOTDIR: return not_found(std::move(message));
    case EACCES:
    case EPERM: return {status_code::permission_denied, std::move(message)};
    case ENOMEM: return resource_exhausted(std::move(message));
    default: return unavailable(std::move(message));
  }
}

}  // namespace

result<std::shared_ptr<const mapped_file>> mapped_file::open(const std::filesystem::path& path) {
  fd_guard fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return errno_status(path, "open", errno);

  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) return errno_status(path, "stat", errno);
  if (!S_ISREG(info.st_mode)) return invalid_argument(edge::format("{} is not a regular file", path.string()));
  if (static_cast<std::uint64_t>(info.st_size) > std::numeric_limits<std::size_t>::max()) {
    return out_of_range(edge::format("{} is too large to map", path.string()));
  }
  const auto size = static_cast<std::size_t>(info.st_size);

  // mmap rejects a zero length; an empty file is a valid (if useless) mapping of nothing.
  const std::byte* data = nullptr;
  if (size > 0) {
    // MAP_PRIVATE: nobody else's later writes to the file can change weights under a running
    // model through this mapping's pages once they are faulted in (and we never write).
    void* address = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
    if (address == MAP_FAILED) return errno_status(path, "map", errno);
    data = static_cast<const std::byte*>(address);
  }
  return std::shared_ptr<const mapped_file>(new mapped_file(path, data, size));
}

mapped_file::~mapped_file() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
}

void mapped_file::advise_will_need(std::size_t offset, std::size_t length) const {
  if (data_ == nullptr || offset >= size_) return;
  length = std::min(length, size_ - offset);
  // madvise needs a page-aligned start; the mapping itself starts on a page boundary.
  static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t aligned_offset = offset - offset % page;
  // Advice only: a failure changes nothing but speed.
  (void)::madvise(const_cast<std::byte*>(data_) + aligned_offset, length + (offset - aligned_offset),
                  MADV_WILLNEED);
}

void mapped_file::release(std::size_t offset, std::size_t length) const {
  if (data_ == nullptr || offset >= size_) return;
  length = std::min(length, size_ - offset);
  static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  // Only pages wholly inside the range: its neighbours may still be in use.
  const std::size_t begin = (offset + page - 1) / page * page;
  const std::size_t end = (offset + length) / page * page;
  // A private read-only file mapping refills dropped pages from the file, so this is advice too.
  if (begin < end) (void)::madvise(const_cast<std::byte*>(data_) + begin, end - begin, MADV_DONTNEED);
}

}  // namespace edge::backend
