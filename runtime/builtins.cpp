// The runtime's builtin steps (see builtins.h).
#include "runtime/builtins.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include <fmt/format.h>

#include "support/error.h"

namespace kiln::rt {

void cache_write(const StepDesc& step, const std::vector<const uint8_t*>& param_data,
                 const uint8_t* arena_data, const std::vector<uint8_t*>& result_data,
                 const std::vector<int64_t>& result_bytes, const std::vector<int64_t>& syms) {
  const bool at_pos = step.args.size() == 3;
  const BufferDesc &x = step.args[0], &cache = step.args.back();
  KILN_ASSERT(x.storage != Storage::result && (!at_pos || step.args[1].storage == Storage::param) &&
                  cache.storage == Storage::result && cache.byte_offset == 0,
              fmt::format("step '{}': a cache_write's buffers are misplaced", step.op));
  const int64_t d = x.extents[0].eval(syms), len = x.extents[1].eval(syms),
                n = x.extents[2].eval(syms);
  const int64_t c = cache.extents[1].eval(syms), t = cache.extents[2].eval(syms);
  int64_t at = 0;
  if (at_pos) {
    const BufferDesc& pos = step.args[1];
    at = *reinterpret_cast<const int64_t*>(param_data[pos.index] + pos.elem_offset.eval(syms) * 8);
  }
  KILN_ASSERT(d == cache.extents[0].eval(syms) && n <= c && at >= 0 && at + len <= t,
              fmt::format("step '{}': cache_write out of bounds", step.op));
  const int64_t x_pos = x.strides[1].eval(syms), x_row = x.strides[2].eval(syms),
                c_slot = cache.strides[1].eval(syms), c_pos = cache.strides[2].eval(syms);
  KILN_ASSERT(((at + len - 1) * c_pos + (c - 1) * c_slot + d) * 4 <= result_bytes[cache.index],
              fmt::format("step '{}': cache_write outside the cache", step.op));
  const uint8_t* src_base = nullptr;
  switch (x.storage) {
    case Storage::param:
      src_base = param_data[x.index];
      break;
    case Storage::arena:
      src_base = arena_data;
      break;
    default:
      fail("step '{}': a cache_write reads from unsupported storage", step.op);
  }
  const float* src =
      reinterpret_cast<const float*>(src_base + x.byte_offset) + x.elem_offset.eval(syms);
  float* dst = reinterpret_cast<float*>(result_data[cache.index]);
  for (int64_t l = 0; l < len; ++l)
    for (int64_t r = 0; r < n; ++r)
      std::memcpy(dst + (at + l) * c_pos + r * c_slot, src + r * x_row + l * x_pos,
                  static_cast<size_t>(d) * sizeof(float));
}

namespace {

// y[0, n) += a · x[0, n).
void axpy(float* y, float a, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

template <typename T>
T* at(const halide_buffer_t& b, int64_t i0, int64_t i1) {
  return reinterpret_cast<T*>(b.host) + i0 * b.dim[0].stride + i1 * b.dim[1].stride;
}

// A dense 2-D f32 buffer (inner, rows) over `data`.
struct Matrix {
  Matrix(float* data, int64_t inner, int64_t rows) {
    dims[0] = halide_dimension_t(0, static_cast<int32_t>(inner), 1);
    dims[1] = halide_dimension_t(0, static_cast<int32_t>(rows), static_cast<int32_t>(inner));
    buf.host = reinterpret_cast<uint8_t*>(data);
    buf.type = halide_type_t(halide_type_float, 32);
    buf.dimensions = 2;
    buf.dim = dims;
  }
  halide_dimension_t dims[2];
  halide_buffer_t buf{};
};

}  // namespace

MoeWork moe_ffn(const StepDesc& step, std::vector<halide_buffer_t>& bufs,
                const std::function<void(int32_t, void**)>& call) {
  const size_t n_args = bufs.size();
  KILN_ASSERT(n_args >= 7 && (n_args - 4) % 3 == 0 && step.calls.size() == 3,
              fmt::format("step '{}': moe_ffn has {} buffers", step.op, n_args));
  const int64_t experts = static_cast<int64_t>((n_args - 4) / 3);
  const halide_buffer_t &x = bufs[0], &ids = bufs[1], &gates = bufs[2], &out = bufs.back();
  const int64_t d = x.dim[0].extent, rows = x.dim[1].extent, k = ids.dim[0].extent;
  KILN_ASSERT(ids.dim[1].extent == rows && gates.dim[0].extent == k &&
                  gates.dim[1].extent == rows && out.dim[0].extent == d &&
                  out.dim[1].extent == rows && x.dim[0].stride == 1 && out.dim[0].stride == 1,
              fmt::format("step '{}': moe_ffn buffers do not agree", step.op));
  // The hidden size: the weights as stored hold 3 · D · F floats per expert.
  int64_t w_elems = 1;
  for (int i = 0; i < bufs[3].dimensions; ++i) w_elems *= bufs[3].dim[i].extent;
  const int64_t f = w_elems / std::max<int64_t>(d, 1);
  // The (row, slot) pairs of each expert, in row order.
  std::vector<std::vector<int64_t>> routed(static_cast<size_t>(experts));
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t s = 0; s < k; ++s) {
      const int64_t e = *at<const int64_t>(ids, s, t);
      if (e < 0 || e >= experts)
        fail("step '{}': expert id {} of row {} is out of range [0, {})", step.op, e, t, experts);
      routed[static_cast<size_t>(e)].push_back(t * k + s);
    }
  for (int64_t t = 0; t < rows; ++t)
    std::fill(at<float>(out, 0, t), at<float>(out, 0, t) + d, 0.0f);
  MoeWork work;
  std::vector<float> xe, a, b, y;
  for (int64_t e = 0; e < experts; ++e) {
    const std::vector<int64_t>& pairs = routed[static_cast<size_t>(e)];
    if (pairs.empty()) continue;  // no row chose it: none of its kernels runs
    const int64_t n = static_cast<int64_t>(pairs.size());
    ++work.experts_run;
    work.expert_rows += n;
    xe.resize(static_cast<size_t>(n * d));
    a.resize(static_cast<size_t>(n * f));
    b.resize(static_cast<size_t>(n * f));
    y.resize(static_cast<size_t>(n * d));
    for (int64_t i = 0; i < n; ++i) {
      const float* src = at<const float>(x, 0, pairs[i] / k);
      std::copy(src, src + d, xe.begin() + i * d);
    }
    Matrix xm(xe.data(), d, n), am(a.data(), f, n), bm(b.data(), f, n), ym(y.data(), d, n);
    // a = silu(xe·w1ᵀ), b = xe·w3ᵀ, h = a ⊙ b (in a), y = h·w2ᵀ.
    void* up_silu[] = {&xm.buf, &bufs[static_cast<size_t>(3 + 3 * e)], &am.buf};
    call(step.calls[0], up_silu);
    void* up[] = {&xm.buf, &bufs[static_cast<size_t>(4 + 3 * e)], &bm.buf};
    call(step.calls[1], up);
    for (int64_t i = 0; i < n * f; ++i) a[static_cast<size_t>(i)] *= b[static_cast<size_t>(i)];
    void* down[] = {&am.buf, &bufs[static_cast<size_t>(5 + 3 * e)], &ym.buf};
    call(step.calls[2], down);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = pairs[i] / k, s = pairs[i] % k;
      axpy(at<float>(out, 0, t), *at<const float>(gates, s, t), y.data() + i * d, d);
    }
  }
  return work;
}

}  // namespace kiln::rt
