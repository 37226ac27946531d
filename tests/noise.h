// noise: deterministic pseudo-random floats for tests that need data but no distribution.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kiln::testing {

// `count` floats in [-1, 1) from a linear congruential generator seeded with `seed`.
inline std::vector<float> noise(size_t count, uint32_t seed) {
  std::vector<float> out(count);
  uint32_t s = seed;
  for (float& v : out) {
    s = s * 1664525u + 1013904223u;
    v = static_cast<float>(s >> 8) / static_cast<float>(1 << 23) - 1.0f;
  }
  return out;
}

}  // namespace kiln::testing
