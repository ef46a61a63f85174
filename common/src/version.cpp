#include "edge/common/version.h"

namespace edge {

std::string_view version_string() { return EDGE_VERSION_STRING; }
std::string_view git_commit() { return EDGE_GIT_COMMIT; }
bool cuda_compiled() { return EDGE_WITH_CUDA != 0; }

}  // namespace edge
