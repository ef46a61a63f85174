#include "edge/common/memory.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace edge {

void release_free_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace edge
