// The sinusoidal position table of "Attention Is All You Need", one definition for the
// reference interpreter (the `sinusoid_table` op) and the runtime (plan tables):
//   table[pos, 2i]   = sin(pos / 10000^(2i / dim))
//   table[pos, 2i+1] = cos(pos / 10000^(2i / dim))
// computed in double and rounded to float, as the PyTorch reference does.
#pragma once

#include <cmath>
#include <cstdint>

namespace kiln {

// Writes the rows × dim table, row-major, to `out`.
inline void fill_sinusoid_table(int64_t rows, int64_t dim, float* out) {
  for (int64_t pos = 0; pos < rows; ++pos) {
    for (int64_t c = 0; c < dim; ++c) {
      const int64_t two_i = c - c % 2;  // 2i for both columns 2i and 2i+1
      const double angle = static_cast<double>(pos) /
                           std::pow(10000.0, static_cast<double>(two_i) / static_cast<double>(dim));
      out[pos * dim + c] = static_cast<float>(c % 2 == 0 ? std::sin(angle) : std::cos(angle));
    }
  }
}

}  // namespace kiln
