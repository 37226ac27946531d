// int8 quantization as kiln's int8 linear kernels do it (codegen/kernels.h,
// LinearKernel::int8), shared by the kernels' weight packing (runtime/plan.cpp), the
// interpreter's reference (InterpretOptions::int8_linear) and the tests, so all three
// round the same way. All in f32, in the order written here, so the kernel and the
// references agree bit for bit; rounding is to nearest, ties to even (Halide's `round`,
// std::nearbyint).
//
// Weights, symmetric per output row: row r of n values becomes q_i = round(r_i · 127 / max|r|)
// in [-127, 127], with the scale s = max|r| · (1/127), so r_i ≈ s · q_i (s8, as vpdpbusd's
// second operand). A row of zeros has scale 0 and q = 0.
//
// Inputs, asymmetric per row at run time (u8, vpdpbusd's first operand): with lo = min(r, 0)
// and hi = max(r, 0), the step s = (hi − lo) · (1/255), z = round(−lo · 255 / (hi − lo)) in
// [0, 255] and u_i = clamp(round(r_i · 255 / (hi − lo)) + z, 0, 255), so r_i ≈ s · (u_i − z).
// A row of one sign uses all 256 levels (twice the resolution of a symmetric s8 row: the
// input of the second FFN linear, after ReLU, is such a row); a row of zeros has s = 0.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace kiln::int8 {

// The largest reduction the int32 accumulator holds exactly: 127 · 255 · K < 2^31 (the
// kernel sums u8 times s8 products, then subtracts zero · Σ q_w).
inline constexpr int64_t kMaxK = 65536;

inline float inverse_scale(float absmax) { return absmax > 0.0f ? 127.0f / absmax : 0.0f; }
inline float scale(float absmax) { return absmax * (1.0f / 127.0f); }
inline int8_t quantize(float v, float inverse) {
  const float q = std::nearbyint(v * inverse);
  return static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f));
}
// max |v_i| over a row (NaN is not a value it meets: weights are checked finite).
inline float absmax(const float* v, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(v[i]));
  return m;
}

// An input row's quantization: u = clamp(round(v · inverse) + zero, 0, 255), v ≈ step · (u − zero).
struct InputRow {
  float step = 0.0f, inverse = 0.0f, zero = 0.0f;  // zero: an integer in [0, 255]
};
// A row with a NaN or an infinity gets step NaN (its outputs are NaN, as an f32 linear's are
// for a NaN; an infinity would otherwise make the step infinite and the zero point NaN), inverse
// and zero 0.
inline InputRow input_row(const float* v, int64_t n) {
  float lo = 0.0f, hi = 0.0f;
  bool bad = false;
  for (int64_t i = 0; i < n; ++i) {
    lo = std::min(lo, v[i]);
    hi = std::max(hi, v[i]);
    bad |= !std::isfinite(v[i]);
  }
  InputRow q;
  if (bad) {
    q.step = std::numeric_limits<float>::quiet_NaN();
    return q;
  }
  const float width = hi - lo;
  q.step = width * (1.0f / 255.0f);
  q.inverse = width > 0.0f ? 255.0f / width : 0.0f;
  q.zero = std::nearbyint(-lo * q.inverse);
  return q;
}
inline uint8_t quantize_input(float v, const InputRow& q) {
  const float u = std::nearbyint(v * q.inverse) + q.zero;
  return static_cast<uint8_t>(u > 0.0f ? (u < 255.0f ? u : 255.0f) : 0.0f);  // NaN: 0
}

}  // namespace kiln::int8
