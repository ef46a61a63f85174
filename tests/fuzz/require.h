// How a harness states a promise of the code it fuzzes: a broken one aborts, which libFuzzer
// reports as a crash and saves the input that broke it. The line of the broken promise is
// printed first: the harness's code is inlined, so the stack trace does not name it. (clang 14
// has no std::source_location with libstdc++; the builtins give the caller's file and line.)
#pragma once

#include <cstdio>
#include <cstdlib>

namespace edge::fuzz {

inline void require(bool condition, const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) {
  if (!condition) {
    std::fprintf(stderr, "broken promise: %s:%u\n", file, line);
    std::abort();
  }
}

}  // namespace edge::fuzz
