#include "file_io.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "edge/common/format.h"

namespace edge::backend::detail {
namespace {

result<std::string> read_up_to(const std::filesystem::path& path, std::size_t limit) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return not_found(format("{} does not exist", path.string()));
  if (std::filesystem::is_directory(path, ec)) return invalid_argument(format("{} is a folder", path.string()));
  std::ifstream in(path, std::ios::binary);
  if (!in) return unavailable(format("cannot open {}: {}", path.string(), std::strerror(errno)));
  std::string bytes;
  char buffer[64 * 1024];
  while (bytes.size() < limit && in) {
    const std::size_t want = std::min(sizeof buffer, limit - bytes.size());
    in.read(buffer, static_cast<std::streamsize>(want));
    bytes.append(buffer, static_cast<std::size_t>(in.gcount()));
  }
  if (in.bad()) return unavailable(format("cannot read {}", path.string()));
  return bytes;
}

}  // namespace

result<std::string> read_whole_file(const std::filesystem::path& path) {
  return read_up_to(path, std::string::npos);
}

result<std::string> read_file_prefix(const std::filesystem::path& path, std::size_t count) {
  return read_up_to(path, count);
}

}  // namespace edge::backend::detail
