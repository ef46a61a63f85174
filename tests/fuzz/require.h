// How a harness states a promise of the code it fuzzes: a broken one aborts, which libFuzzer
// reports as a crash and saves the input that broke it.
#pragma once

#include <cstdlib>

namespace edge::fuzz {

inline void require(bool condition) {
  if (!condition) std::abort();
}

}  // namespace edge::fuzz
