// SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", 2014):
// a 64-bit state advanced by a Weyl constant and mixed by a finaliser. Fast, well distributed,
// and trivially seeded from any 64-bit value, which is all synthetic weights and vocabularies
// need. The constants are the published algorithm's.
#pragma once

#include <cstdint>

namespace edge {

inline std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e37'79b9'7f4a'7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58'476d'1ce4'e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d0'49bb'1331'11ebull;
  return z ^ (z >> 31);
}

}  // namespace edge
