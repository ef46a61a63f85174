// Giving freed memory back to the operating system.
#pragma once

namespace edge {

// Returns the allocator's free pages to the operating system (glibc's malloc_trim), so that the
// peak of one large piece of work (a whole answer of many log probabilities) does not stay in
// the process's resident memory afterwards. It walks every arena under its lock: for the end of
// rare large work, not for every request. Under AddressSanitizer, its allocator's quarantine is
// emptied and its free memory returned instead. A no-op where the C library has no such call.
void release_free_memory();

}  // namespace edge
