// Tests for the fused attention kernel (codegen/attention_kernel.cpp): the Halide pipeline is
// JIT-compiled for the host and for an AVX2 target and run on random data, with q, k and v as
// strided views into wider buffers (slices of merged projections), against the reference
// interpreter running a module with one `attention` op.
//
// Tolerance: 1e-5 absolute. Inputs are at most 2 in magnitude and the scale is 1/sqrt(dk), so
// scores stay within ±4·sqrt(dk); the kernel accumulates dot products (≤ 64 terms), row sums
// and the weighted sum of v (≤ 300 terms, weights in [0, 1] summing to 1) in float, each term
// adding a relative error of about one float epsilon (1.2e-7), and its exponential is within
// 2.2e-7 relative. An output is a convex combination of v (|v| ≤ 2), so its error stays far
// below 1e-5, while a wrong mask, block or weight moves it by ~1e-2; observed: ≤ 1.3e-6.
// Rows whose keys are all masked must be NaN in both (fill_inf) or the mean of v in both.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "codegen/halide_kernels.h"
#include "codegen/kernels.h"
#include "ir/interpreter.h"
#include "ir/ir.h"
#include "ir/verifier.h"
#include "jit_kernel.h"

namespace kiln::codegen {
namespace {

using jit::JitKernel;
using jit::kAvx2Target;
using jit::last_error;
using jit::target_named;
constexpr float kTolerance = 1e-5f;

// A [rows, width] matrix per batch, holding NaN outside the views cut from it, so that a read
// outside a view spoils the result.
struct Wide {
  int64_t batch = 0, rows = 0, width = 0;
  std::vector<float> data;

  Wide(int64_t batch, int64_t rows, int64_t width)
      : batch(batch),
        rows(rows),
        width(width),
        data(batch * rows * width, std::numeric_limits<float>::quiet_NaN()) {}

  // Fills columns [offset, offset + cols) with uniform noise in [-2, 2].
  void fill(int64_t offset, int64_t cols, std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    for (int64_t r = 0; r < batch * rows; ++r)
      for (int64_t c = 0; c < cols; ++c) data[r * width + offset + c] = u(rng);
  }

  // The Halide view (c, i, b) of columns [offset, offset + cols).
  Halide::Buffer<float> view(int64_t offset, int64_t cols) {
    halide_dimension_t dims[3] = {
        {0, static_cast<int32_t>(cols), 1},
        {0, static_cast<int32_t>(rows), static_cast<int32_t>(width)},
        {0, static_cast<int32_t>(batch), static_cast<int32_t>(rows * width)}};
    return Halide::Buffer<float>(data.data() + offset, 3, dims);
  }

  // The same columns as a dense interpreter tensor [batch, rows, cols].
  ir::Tensor tensor(int64_t offset, int64_t cols) const {
    std::vector<float> t;
    t.reserve(batch * rows * cols);
    for (int64_t r = 0; r < batch * rows; ++r)
      for (int64_t c = 0; c < cols; ++c) t.push_back(data[r * width + offset + c]);
    return ir::Tensor::from_f32({batch, rows, cols}, std::move(t));
  }
};

ir::TensorType type_of(ir::DType dtype, std::vector<int64_t> shape) {
  ir::TensorType t{dtype, {}};
  for (int64_t d : shape) t.shape.push_back(ir::Dim::constant(d));
  return t;
}

// The interpreter's result for `spec` on dense q, k, v (and masks, bias).
ir::Tensor interpret_attention(const AttentionKernel& spec, const std::vector<ir::Tensor>& in) {
  ir::Module m;
  m.name = "attention_test";
  ir::Function f;
  f.name = "f";
  std::vector<const char*> names = {"q", "k", "v"};
  if (spec.key_padding) names.push_back("mask");
  if (spec.query_padding) names.push_back("qmask");
  if (spec.bias) names.push_back("bias");
  std::vector<ir::ValueId> params;
  for (size_t i = 0; i < in.size(); ++i)
    params.push_back(f.add_param(names[i], type_of(in[i].dtype, in[i].shape)));
  ir::Attrs attrs{
      {"heads", spec.heads}, {"scale", spec.scale}, {"causal", int64_t{spec.causal ? 1 : 0}}};
  if (spec.fill_inf) attrs["fill_inf"] = int64_t{1};
  if (spec.query_padding) attrs["query_pad"] = int64_t{1};
  if (spec.kv_heads) attrs["kv_heads"] = spec.kv_heads;
  if (spec.bias) attrs["bias"] = int64_t{1};
  if (spec.window) attrs["window"] = spec.window;
  if (spec.softcap) attrs["softcap"] = spec.softcap;
  const ir::TensorType result =
      type_of(ir::DType::f32, {in[0].shape[0], in[0].shape[1], spec.heads * spec.dv});
  f.results.push_back(f.add_op(ir::OpKind::attention, params, result, attrs));
  m.functions.push_back(std::move(f));
  for (const ir::Diagnostic& d : ir::verify(m)) ADD_FAILURE() << ir::format_diagnostic(d);
  std::vector<ir::Tensor> out = ir::interpret(m, m.functions.at(0), {}, in);
  EXPECT_EQ(out.size(), 1u);
  return out.at(0);
}

// Key padding for batch row b: row 0 of a batch of several is all padded (its rows are a
// uniform average of v), odd rows keep a random prefix, other rows mask random keys.
std::vector<int64_t> padding_mask(int64_t batch, int64_t lk, std::mt19937& rng) {
  std::vector<int64_t> mask(batch * lk, 0);
  for (int64_t b = 0; b < batch; ++b) {
    if (b == 0 && batch > 1) {
      std::fill(mask.begin(), mask.begin() + lk, 1);
    } else if (b % 2 == 1 || batch == 1) {
      const int64_t len = std::uniform_int_distribution<int64_t>(1, lk)(rng);
      for (int64_t j = len; j < lk; ++j) mask[b * lk + j] = 1;
    } else {
      for (int64_t j = 0; j < lk; ++j) mask[b * lk + j] = rng() % 3 == 0;
    }
  }
  return mask;
}

// The shape of the score bias of `spec` for case (batch, lq, lk): bias_kind 1 is [B,H,Lq,Lk],
// 2 is [1,H,Lq,Lk] (T5), 3 is [1,H,1,Lk] (BLOOM's ALiBi).
std::vector<int64_t> bias_shape(int bias_kind, int64_t heads, int64_t batch, int64_t lq,
                                int64_t lk) {
  if (bias_kind == 1) return {batch, heads, lq, lk};
  if (bias_kind == 2) return {1, heads, lq, lk};
  return {1, heads, 1, lk};
}

// Runs `kernel` (built from `spec`) on random data of the given shape and compares it with
// the interpreter. q, k, v are views into one merged QKV buffer when they can be (self
// attention with dk == dv), else q into its own wider buffer and k, v into a merged KV one.
// Returns the largest absolute error (or infinity after a failure).
float check_case(const JitKernel& kernel, const AttentionKernel& spec, int64_t batch, int64_t lq,
                 int64_t lk, uint32_t seed, int bias_kind = 0) {
  SCOPED_TRACE(testing::Message() << "B=" << batch << " Lq=" << lq << " Lk=" << lk
                                  << " seed=" << seed);
  std::mt19937 rng(seed);
  const int64_t kv_heads = spec.kv_heads ? spec.kv_heads : spec.heads;
  const int64_t qd = spec.heads * spec.dk, vd = spec.heads * spec.dv;
  const int64_t kd = kv_heads * spec.dk, vkd = kv_heads * spec.dv;  // k and v widths
  const bool merged = lq == lk && spec.dk == spec.dv && kv_heads == spec.heads;
  Wide kv(batch, lk, 1 + kd + vkd + 2);  // NaN columns around k and v
  const int64_t k_off = 1, v_off = 1 + kd;
  Wide qw(batch, lq, qd + 5);
  int64_t q_off = 3;
  Wide* q_src = &qw;
  if (merged) {  // [q | k | v] with q in front of k: reuse the KV buffer's layout
    kv = Wide(batch, lk, 3 * qd + 1);
    q_off = 0;
    q_src = &kv;
  }
  const int64_t kk_off = merged ? qd : k_off, vv_off = merged ? 2 * qd : v_off;
  q_src->fill(q_off, qd, rng);
  kv.fill(kk_off, kd, rng);
  kv.fill(vv_off, vkd, rng);

  std::vector<ir::Tensor> in = {q_src->tensor(q_off, qd), kv.tensor(kk_off, kd),
                                kv.tensor(vv_off, vkd)};
  std::vector<uint8_t> mask_bytes;
  if (spec.key_padding) {
    std::vector<int64_t> mask = padding_mask(batch, lk, rng);
    mask_bytes.assign(mask.begin(), mask.end());
    in.push_back(ir::Tensor::from_ints(ir::DType::boolean, {batch, lk}, std::move(mask)));
  }
  // Query padding: odd batch rows pad a random suffix of the queries, even ones random
  // queries (about a quarter).
  std::vector<uint8_t> qmask_bytes;
  if (spec.query_padding) {
    std::vector<int64_t> qmask(batch * lq, 0);
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t len = std::uniform_int_distribution<int64_t>(0, lq)(rng);
      for (int64_t i = 0; i < lq; ++i) qmask[b * lq + i] = b % 2 == 1 ? i >= len : rng() % 4 == 0;
    }
    qmask_bytes.assign(qmask.begin(), qmask.end());
    in.push_back(ir::Tensor::from_ints(ir::DType::boolean, {batch, lq}, std::move(qmask)));
  }
  // Score bias: uniform in [-3, 3] (ALiBi and T5 biases are of this order).
  std::vector<float> bias_data;
  std::vector<int64_t> bshape;
  if (spec.bias) {
    bshape = bias_shape(bias_kind, spec.heads, batch, lq, lk);
    std::uniform_real_distribution<float> u(-3.0f, 3.0f);
    bias_data.resize(static_cast<size_t>(bshape[0] * bshape[1] * bshape[2] * bshape[3]));
    for (float& x : bias_data) x = u(rng);
    in.push_back(ir::Tensor::from_f32(bshape, bias_data));
  }
  const ir::Tensor want = interpret_attention(spec, in);

  Halide::Buffer<float> q = q_src->view(q_off, qd), k = kv.view(kk_off, kd);
  Halide::Buffer<float> v = kv.view(vv_off, vkd);
  Halide::Buffer<float> bias;
  if (spec.bias)
    bias = Halide::Buffer<float>(bias_data.data(), static_cast<int>(bshape[3]),
                                 static_cast<int>(bshape[2]), static_cast<int>(bshape[1]),
                                 static_cast<int>(bshape[0]));
  Halide::Buffer<uint8_t> mask(mask_bytes.data(), static_cast<int>(lk), static_cast<int>(batch));
  Halide::Buffer<uint8_t> qmask(qmask_bytes.data(), static_cast<int>(lq), static_cast<int>(batch));
  Halide::Buffer<float> out(static_cast<int>(vd), static_cast<int>(lq), static_cast<int>(batch));
  std::vector<halide_buffer_t*> args = {q.raw_buffer(), k.raw_buffer(), v.raw_buffer()};
  if (spec.key_padding) args.push_back(mask.raw_buffer());
  if (spec.query_padding) args.push_back(qmask.raw_buffer());
  if (spec.bias) args.push_back(bias.raw_buffer());
  args.push_back(out.raw_buffer());
  const int status = kernel(args);
  EXPECT_EQ(status, 0);
  if (status != 0) return std::numeric_limits<float>::infinity();

  float max_err = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < lq; ++i)
      for (int64_t c = 0; c < vd; ++c) {
        const float got = out(c, i, b), expect = want.f[(b * lq + i) * vd + c];
        if (std::isnan(expect) && std::isnan(got)) continue;  // a fully masked row, -inf
        const float err = std::fabs(got - expect);
        if (!(err <= kTolerance)) {  // also catches NaN
          ADD_FAILURE() << "out[" << b << "," << i << "," << c << "] = " << got << ", interpreter "
                        << expect;
          return std::numeric_limits<float>::infinity();
        }
        max_err = std::max(max_err, err);
      }
  return max_err;
}

struct SpecCase {
  int64_t heads, dk, dv;
  bool causal, key_padding;
  bool fill_inf = false, query_padding = false;
  // Issue 26: grouped-query heads, a score bias (its shape: bias_shape), a sliding window,
  // soft-capping.
  int64_t kv_heads = 0;
  int bias_kind = 0;
  int64_t window = 0;
  double softcap = 0;
};

class AttentionKernelTest : public testing::TestWithParam<std::tuple<SpecCase, std::string>> {};

// Every (B, Lq, Lk) of B ∈ {1, 3}, Lq, Lk ∈ {1, 7, 33, 129}: self attention (Lq = Lk) and
// cross attention (Lq ≠ Lk; with causal, the op's definition j > i still applies). Then
// lengths just past the blocks' boundaries (rows in blocks of 12 and tiles of 6, keys in blocks
// of 32 with AVX-512 and 16 with AVX2) and several key blocks per row.
TEST_P(AttentionKernelTest, MatchesInterpreter) {
  const auto& [c, target] = GetParam();
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.dk));
  AttentionKernel spec{c.heads,       c.dk,  c.dv,       c.causal,
                       c.key_padding, scale, c.fill_inf, c.query_padding};
  spec.kv_heads = c.kv_heads;
  spec.bias = c.bias_kind != 0;
  spec.window = c.window;
  spec.softcap = c.softcap;
  const JitKernel kernel(build_attention(spec, target_named(target)), target_named(target));
  uint32_t seed = 1;
  float max_err = 0;
  for (int64_t batch : {1, 3})
    for (int64_t lq : {1, 7, 33, 129})
      for (int64_t lk : {1, 7, 33, 129})
        max_err = std::max(max_err, check_case(kernel, spec, batch, lq, lk, seed++, c.bias_kind));
  for (int64_t l : {12, 13, 31, 32, 65, 200})
    max_err = std::max(max_err, check_case(kernel, spec, 2, l, l, seed++, c.bias_kind));
  // From 16 sequences on, one task per sequence (every head): attention_kernel.cpp.
  max_err = std::max(max_err, check_case(kernel, spec, 16, 33, 40, seed++, c.bias_kind));
  max_err = std::max(max_err, check_case(kernel, spec, 17, 7, 70, seed++, c.bias_kind));
  max_err = std::max(max_err, check_case(kernel, spec, 1, 17, 300, seed++, c.bias_kind));
  max_err = std::max(max_err, check_case(kernel, spec, 1, 300, 17, seed++, c.bias_kind));
  char text[32];
  std::snprintf(text, sizeof text, "%.2g", max_err);
  RecordProperty("max_abs_error", text);
}

std::string case_name(const testing::TestParamInfo<AttentionKernelTest::ParamType>& info) {
  const auto& [c, target] = info.param;
  return "h" + std::to_string(c.heads) + "_dk" + std::to_string(c.dk) + "_dv" +
         std::to_string(c.dv) + (c.causal ? "_causal" : "") + (c.key_padding ? "_pad" : "") +
         (c.query_padding ? "_qpad" : "") + (c.fill_inf ? "_inf" : "") +
         (c.kv_heads ? "_kv" + std::to_string(c.kv_heads) : "") +
         (c.bias_kind ? "_bias" + std::to_string(c.bias_kind) : "") +
         (c.window ? "_w" + std::to_string(c.window) : "") + (c.softcap ? "_cap" : "") +
         (target == "host" ? "_host" : "_avx2");
}

// Heads 1..4 with dk, dv 4..16 (odd, unequal), and the base model's head size 64, whose V
// product takes two passes of two vectors with AVX-512. Then the -inf fill (fully masked rows
// are NaN) and query padding (padded queries: the mean of v, or NaN), each with and without
// causal and key padding.
const SpecCase kSpecs[] = {
    {1, 4, 4, false, false},
    {2, 8, 8, false, true},
    {3, 5, 7, false, true},
    {4, 16, 16, true, false},
    {2, 12, 6, true, true},
    {4, 16, 16, true, true},
    {2, 64, 64, true, true},
    {3, 5, 7, false, true, /*fill_inf=*/true},
    {2, 12, 6, true, true, /*fill_inf=*/true},
    {2, 8, 8, false, false, /*fill_inf=*/false, /*query_padding=*/true},
    {2, 12, 6, true, false, /*fill_inf=*/false, /*query_padding=*/true},
    {4, 16, 16, true, true, /*fill_inf=*/false, /*query_padding=*/true},
    {3, 5, 7, false, false, /*fill_inf=*/true, /*query_padding=*/true},
    {2, 12, 6, true, true, /*fill_inf=*/true, /*query_padding=*/true},
    // Grouped-query (4 heads over 2 kv heads; 6 over 3) and multi-query (1 kv head), score
    // biases of the three shapes, sliding windows (1: the diagonal only; 5; 40: wider than some
    // rows), soft-capping, and all of them together with padding.
    {4, 8, 8, true, false, false, false, /*kv_heads=*/2},
    {6, 5, 7, false, true, false, false, /*kv_heads=*/3},
    {4, 16, 16, true, true, false, false, /*kv_heads=*/1},
    {2, 8, 8, false, false, false, false, 0, /*bias_kind=*/1},
    {3, 5, 7, false, true, false, false, 0, /*bias_kind=*/2},
    {4, 16, 16, true, false, false, false, 0, /*bias_kind=*/3},
    {2, 8, 8, true, false, false, false, 0, 0, /*window=*/1},
    {2, 12, 6, true, true, false, false, 0, 0, /*window=*/5},
    {4, 8, 8, true, false, true, false, 2, 0, /*window=*/40},
    {2, 8, 8, false, false, false, false, 0, 0, 0, /*softcap=*/2.5},
    {4, 16, 16, true, true, false, true, /*kv_heads=*/2, /*bias_kind=*/2, /*window=*/7,
     /*softcap=*/3.0},
    {4, 8, 8, true, false, true, true, /*kv_heads=*/2, /*bias_kind=*/1, /*window=*/3},
};

INSTANTIATE_TEST_SUITE_P(Specs, AttentionKernelTest,
                         testing::Combine(testing::ValuesIn(kSpecs),
                                          testing::Values(std::string("host"),
                                                          std::string(kAvx2Target))),
                         case_name);

// Buffers whose shapes disagree are rejected by the pipeline's checks, not read out of
// bounds.
TEST(AttentionKernelErrors, MismatchedShapesFail) {
  const AttentionKernel spec{2, 4, 4, false, true, 0.5};
  const JitKernel kernel(build_attention(spec, host_target()), host_target());
  Halide::Buffer<float> q(8, 5, 2), k(8, 6, 2), v(8, 6, 2), out(8, 5, 2);
  Halide::Buffer<uint8_t> mask(6, 2);
  q.fill(0.5f);
  k.fill(0.5f);
  v.fill(0.5f);
  mask.fill(0);
  EXPECT_EQ(
      kernel({q.raw_buffer(), k.raw_buffer(), v.raw_buffer(), mask.raw_buffer(), out.raw_buffer()}),
      0);
  Halide::Buffer<float> short_v(8, 5, 2), wide_q(12, 5, 2);
  Halide::Buffer<uint8_t> short_mask(5, 2);
  EXPECT_NE(kernel({q.raw_buffer(), k.raw_buffer(), short_v.raw_buffer(), mask.raw_buffer(),
                    out.raw_buffer()}),
            0);
  EXPECT_NE(last_error().find("v"), std::string::npos) << last_error();
  EXPECT_NE(kernel({wide_q.raw_buffer(), k.raw_buffer(), v.raw_buffer(), mask.raw_buffer(),
                    out.raw_buffer()}),
            0);
  EXPECT_NE(last_error().find("q"), std::string::npos) << last_error();
  EXPECT_NE(kernel({q.raw_buffer(), k.raw_buffer(), v.raw_buffer(), short_mask.raw_buffer(),
                    out.raw_buffer()}),
            0);
  EXPECT_NE(last_error().find("mask"), std::string::npos) << last_error();
}

// The kernel compiles ahead of time, without the runtime, for both targets.
TEST(AttentionKernelAot, CompilesToObject) {
  jit::expect_compiles_ahead_of_time(AttentionKernel{8, 64, 64, true, true, 0.125});
  jit::expect_compiles_ahead_of_time(AttentionKernel{8, 64, 64, true, true, 0.125, true, true});
}

// Each variant has its own kernel name; the default ones keep theirs.
TEST(AttentionKernelNames, VariantsDiffer) {
  const AttentionKernel plain{8, 64, 64, true, true, 0.125};
  EXPECT_EQ(kernel_name(plain), "kiln_attention_h8_dk64_dv64_causal_kpad_s3fc0000000000000");
  AttentionKernel inf = plain, qpad = plain, both = plain;
  inf.fill_inf = true;
  qpad.query_padding = true;
  both.fill_inf = both.query_padding = true;
  EXPECT_EQ(kernel_name(inf), "kiln_attention_h8_dk64_dv64_causal_kpad_inf_s3fc0000000000000");
  EXPECT_EQ(kernel_name(qpad), "kiln_attention_h8_dk64_dv64_causal_kpad_qpad_s3fc0000000000000");
  EXPECT_EQ(kernel_name(both),
            "kiln_attention_h8_dk64_dv64_causal_kpad_qpad_inf_s3fc0000000000000");
}

}  // namespace
}  // namespace kiln::codegen
