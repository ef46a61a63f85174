// Shared by unit tests: where the real-model fixtures are, and temporary folders.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace edge::testing {

// ${EDGE_TEST_MODELS:-<source>/../shared/models}. Throws when it does not exist, so a test
// that needs a fixture fails saying so instead of passing vacuously.
inline std::filesystem::path test_models_dir() {
  std::filesystem::path dir;
  if (const char* env = std::getenv("EDGE_TEST_MODELS"); env && *env) {
    dir = env;
  } else {
    dir = std::filesystem::path(EDGE_SOURCE_DIR) / ".." / "shared" / "models";
  }
  if (!std::filesystem::is_directory(dir)) {
    throw std::runtime_error("test models not found at " + dir.string() + " (set EDGE_TEST_MODELS)");
  }
  return dir;
}

inline std::filesystem::path stories260k_dir() { return test_models_dir() / "stories260K"; }

// A loopback port nobody listens on now (for a server a test starts; another process may take it
// before the server binds, so a starter retries).
inline std::uint16_t free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("cannot find a free loopback port");
  }
  ::close(fd);
  return ntohs(address.sin_port);
}

// A fresh folder under the system temp dir, removed with everything in it on destruction.
class temp_dir {
 public:
  temp_dir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("edge_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

}  // namespace edge::testing
