// Facts about this build, for --version, logs and edgeinfer_build_info.
#pragma once

#include <string_view>

namespace edge {

std::string_view version_string();  // "0.1.0"
std::string_view git_commit();      // short hash the build was configured from, or "unknown"
bool cuda_compiled();               // whether the CUDA code was built (EDGE_CUDA)

}  // namespace edge
