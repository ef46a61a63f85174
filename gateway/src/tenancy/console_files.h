// The admin console's files (gateway/console/), built into the binary by
// cmake/EdgeEmbedFiles.cmake so that the gateway serves them without reading the disk.
#pragma once

#include <span>
#include <string_view>

namespace edge::gateway::console {

struct embedded_file {
  std::string_view name;   // as in gateway/console/: "index.html", "console.js", ...
  std::string_view bytes;
};

std::span<const embedded_file> embedded_files();

}  // namespace edge::gateway::console
