#include "edge/common/memory.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
// The sanitizer's allocator replaces glibc's, and keeps freed blocks in a quarantine that
// malloc_trim does not reach: this empties it and returns its free memory to the system
// (<sanitizer/allocator_interface.h>, which GCC does not install).
extern "C" void __sanitizer_purge_allocator();  // NOLINT: the runtime's name
#endif

namespace edge {

void release_free_memory() {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_purge_allocator();
#elif defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace edge
