// The runtime's builtin steps (see builtins.h).
#include "runtime/builtins.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "runtime/thread_pool.h"
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

// y[0, n) += a · x[0, n), unrolled so that the compiler's straight-line vectorizer packs it.
inline void axpy(float* y, float a, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    y[i] += a * x[i];
    y[i + 1] += a * x[i + 1];
    y[i + 2] += a * x[i + 2];
    y[i + 3] += a * x[i + 3];
    y[i + 4] += a * x[i + 4];
    y[i + 5] += a * x[i + 5];
    y[i + 6] += a * x[i + 6];
    y[i + 7] += a * x[i + 7];
  }
  for (; i < n; ++i) y[i] += a * x[i];
}

constexpr int64_t kRowBlock = 8;    // rows of one task
constexpr int64_t kColBlock = 256;  // output columns of one task

// One expert's rows: the gathered inputs xe [n, d], the hidden h [n, f], the outputs y [n, d].
struct ExpertJob {
  int64_t n = 0, d = 0, f = 0;
  const float* xe = nullptr;
  const float *w1t = nullptr, *w3t = nullptr, *w2t = nullptr;  // [d, f], [d, f], [f, d]
  int64_t w1_stride = 0, w3_stride = 0, w2_stride = 0;         // between their rows
  float* h = nullptr;
  float* y = nullptr;
  int64_t col_blocks = 0;
};

// Task i of the up phase: rows [rb·8, +8) and hidden columns [cb·256, +256):
// h = silu(x·w1ᵀ) · (x·w3ᵀ).
int up_task(void*, int index, uint8_t* closure) {
  const ExpertJob& j = *reinterpret_cast<const ExpertJob*>(closure);
  const int64_t rb = index / j.col_blocks, cb = index % j.col_blocks;
  const int64_t r0 = rb * kRowBlock, r1 = std::min(j.n, r0 + kRowBlock);
  const int64_t c0 = cb * kColBlock, c1 = std::min(j.f, c0 + kColBlock), w = c1 - c0;
  float a[kRowBlock * kColBlock], b[kRowBlock * kColBlock];
  std::fill(a, a + (r1 - r0) * w, 0.0f);
  std::fill(b, b + (r1 - r0) * w, 0.0f);
  for (int64_t k = 0; k < j.d; ++k) {
    const float* w1 = j.w1t + k * j.w1_stride + c0;
    const float* w3 = j.w3t + k * j.w3_stride + c0;
    for (int64_t r = r0; r < r1; ++r) {
      const float xv = j.xe[r * j.d + k];
      axpy(a + (r - r0) * w, xv, w1, w);
      axpy(b + (r - r0) * w, xv, w3, w);
    }
  }
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = 0; c < w; ++c) {
      const float g = a[(r - r0) * w + c];
      const float silu = static_cast<float>(g / (1.0 + std::exp(-static_cast<double>(g))));
      j.h[r * j.f + c0 + c] = silu * b[(r - r0) * w + c];
    }
  return 0;
}

// Task i of the down phase: rows [rb·8, +8) and output columns [cb·256, +256): y = h·w2ᵀ.
int down_task(void*, int index, uint8_t* closure) {
  const ExpertJob& j = *reinterpret_cast<const ExpertJob*>(closure);
  const int64_t blocks = (j.d + kColBlock - 1) / kColBlock;
  const int64_t rb = index / blocks, cb = index % blocks;
  const int64_t r0 = rb * kRowBlock, r1 = std::min(j.n, r0 + kRowBlock);
  const int64_t c0 = cb * kColBlock, c1 = std::min(j.d, c0 + kColBlock), w = c1 - c0;
  for (int64_t r = r0; r < r1; ++r) std::fill(j.y + r * j.d + c0, j.y + r * j.d + c1, 0.0f);
  for (int64_t k = 0; k < j.f; ++k) {
    const float* w2 = j.w2t + k * j.w2_stride + c0;
    for (int64_t r = r0; r < r1; ++r) axpy(j.y + r * j.d + c0, j.h[r * j.f + k], w2, w);
  }
  return 0;
}

template <typename T>
T* at(const halide_buffer_t& b, int64_t i0, int64_t i1) {
  return reinterpret_cast<T*>(b.host) + i0 * b.dim[0].stride + i1 * b.dim[1].stride;
}

}  // namespace

MoeWork moe_ffn(const StepDesc& step, const std::vector<halide_buffer_t>& bufs) {
  const size_t n_args = bufs.size();
  KILN_ASSERT(n_args >= 7 && (n_args - 4) % 3 == 0,
              fmt::format("step '{}': moe_ffn has {} buffers", step.op, n_args));
  const int64_t experts = static_cast<int64_t>((n_args - 4) / 3);
  const halide_buffer_t &x = bufs[0], &ids = bufs[1], &gates = bufs[2], &out = bufs.back();
  const int64_t d = x.dim[0].extent, rows = x.dim[1].extent, k = ids.dim[0].extent;
  const int64_t f = bufs[3].dim[0].extent;
  KILN_ASSERT(ids.dim[1].extent == rows && gates.dim[0].extent == k &&
                  gates.dim[1].extent == rows && out.dim[0].extent == d &&
                  out.dim[1].extent == rows && x.dim[0].stride == 1 && out.dim[0].stride == 1,
              fmt::format("step '{}': moe_ffn buffers do not agree", step.op));
  for (int64_t e = 0; e < experts; ++e)
    for (int j = 0; j < 3; ++j) {
      const halide_buffer_t& w = bufs[static_cast<size_t>(3 + 3 * e + j)];
      const int64_t want0 = j == 2 ? d : f, want1 = j == 2 ? f : d;
      KILN_ASSERT(w.dim[0].extent == want0 && w.dim[1].extent == want1 && w.dim[0].stride == 1,
                  fmt::format("step '{}': moe_ffn weight {} of expert {} has the wrong shape",
                              step.op, j, e));
    }
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
  std::vector<float> xe, h, y;
  for (int64_t e = 0; e < experts; ++e) {
    const std::vector<int64_t>& pairs = routed[static_cast<size_t>(e)];
    if (pairs.empty()) continue;  // no row chose it: nothing of it runs
    const int64_t n = static_cast<int64_t>(pairs.size());
    ++work.experts_run;
    work.expert_rows += n;
    xe.resize(static_cast<size_t>(n * d));
    h.resize(static_cast<size_t>(n * f));
    y.resize(static_cast<size_t>(n * d));
    for (int64_t i = 0; i < n; ++i) {
      const float* src = at<const float>(x, 0, pairs[i] / k);
      std::copy(src, src + d, xe.begin() + i * d);
    }
    ExpertJob job;
    job.n = n;
    job.d = d;
    job.f = f;
    job.xe = xe.data();
    const halide_buffer_t &w1 = bufs[3 + 3 * e], &w3 = bufs[4 + 3 * e], &w2 = bufs[5 + 3 * e];
    job.w1t = reinterpret_cast<const float*>(w1.host);
    job.w3t = reinterpret_cast<const float*>(w3.host);
    job.w2t = reinterpret_cast<const float*>(w2.host);
    job.w1_stride = w1.dim[1].stride;
    job.w3_stride = w3.dim[1].stride;
    job.w2_stride = w2.dim[1].stride;
    job.h = h.data();
    job.y = y.data();
    job.col_blocks = (f + kColBlock - 1) / kColBlock;
    const int64_t row_blocks = (n + kRowBlock - 1) / kRowBlock;
    pool_par_for(nullptr, up_task, 0, static_cast<int>(row_blocks * job.col_blocks),
                 reinterpret_cast<uint8_t*>(&job));
    pool_par_for(nullptr, down_task, 0,
                 static_cast<int>(row_blocks * ((d + kColBlock - 1) / kColBlock)),
                 reinterpret_cast<uint8_t*>(&job));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = pairs[i] / k, s = pairs[i] % k;
      const float g = *at<const float>(gates, s, t);
      axpy(at<float>(out, 0, t), g, y.data() + i * d, d);
    }
  }
  return work;
}

}  // namespace kiln::rt
