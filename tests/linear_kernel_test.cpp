// Tests for the linear kernel (codegen/linear_kernel.cpp): the Halide pipeline is
// JIT-compiled for the host and for AVX2 and compared with the reference interpreter's
// `linear` op on random data, over row counts that exercise every tail of the schedule
// (fewer rows than a register block, partial blocks and tiles, several tiles), odd and
// realistic (K, N), with and without bias, with each activation, with the weight dense or packed in
// panels (as the runtime lays it out, rt::lay_out_linear_weight), and x given as a
// strided view.
//
// Tolerance: the kernel sums K float products in its own order (with FMAs); the
// interpreter sums in double and rounds once, then adds the bias in float. Whatever the
// order, float summation of K terms is off by at most γ_K·S, S = Σ_k |x_k·w_k| (γ_K =
// K·u/(1 − K·u), u = 2⁻²⁴; an FMA only removes roundings), and each of the two final
// roundings (of the sum, after + bias) adds u·(S + |bias|). So every element must satisfy
//   |kernel − reference| ≤ (K + 4)·u·(S + |bias_n|),
// a bound that always holds for a correct kernel (ReLU is 1-Lipschitz) and is far below
// the size of one missing or doubled product term for the K tested here.
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "codegen/halide_kernels.h"
#include "codegen/kernels.h"
#include "ir/interpreter.h"
#include "ir/ir.h"
#include "jit_kernel.h"
#include "noise.h"
#include "runtime/plan.h"

namespace kiln::codegen {
namespace {

using ir::Dim;
using ir::DType;
using ir::Function;
using ir::Module;
using ir::OpKind;
using ir::Tensor;
using ir::TensorType;
using ir::ValueId;

using jit::kAvx2Target;

using kiln::testing::noise;

// The kernel for `spec` compiled in process for `target`, called like the AOT function:
// buffers in kernels.h's argument order, the output last.
class JitLinear : public jit::JitKernel {
 public:
  JitLinear(const LinearKernel& spec, const std::string& target)
      : jit::JitKernel(build_linear(spec, jit::target_named(target)), jit::target_named(target)) {}
};

// One test problem: x [rows..., K] (product of rows = M), W [N, K], b [N].
struct Problem {
  int64_t K = 0, N = 0, panel = 0;
  std::vector<int64_t> rows;  // leading dims of x
  std::string act = "none";
  bool has_bias = true;
  int64_t x_stride = 0;  // row stride of x in the kernel's view; 0: dense (K)
  uint32_t seed = 1;
  std::vector<std::pair<int64_t, float>> specials;  // x elements set to NaN or ±inf
};

int64_t row_count(const Problem& p) {
  int64_t m = 1;
  for (int64_t d : p.rows) m *= d;
  return m;
}

// The interpreter's result of `linear(x, W[, b]){act}` in a one-op module.
Tensor reference(const Problem& p, const Tensor& x, const Tensor& w, const Tensor& b) {
  auto f32 = [](const std::vector<int64_t>& shape) {
    TensorType t{DType::f32, {}};
    for (int64_t d : shape) t.shape.push_back(Dim::constant(d));
    return t;
  };
  Module m;
  m.name = "linear_test";
  m.declare_weight("W", f32({p.N, p.K}));
  if (p.has_bias) m.declare_weight("b", f32({p.N}));
  Function f;
  f.name = "f";
  ValueId xv = f.add_param("x", f32(x.shape));
  std::vector<ValueId> operands = {
      xv, f.add_op(OpKind::weight, {}, f32({p.N, p.K}), {{"name", std::string("W")}})};
  if (p.has_bias)
    operands.push_back(f.add_op(OpKind::weight, {}, f32({p.N}), {{"name", std::string("b")}}));
  std::vector<int64_t> out_shape = p.rows;
  out_shape.push_back(p.N);
  f.results.push_back(f.add_op(OpKind::linear, operands, f32(out_shape), {{"act", p.act}}));
  m.functions.push_back(std::move(f));
  ir::WeightMap weights = {{"W", w}};
  if (p.has_bias) weights.emplace("b", b);
  std::vector<Tensor> out = ir::interpret(m, m.functions[0], weights, {x});
  EXPECT_EQ(out.size(), 1u);
  return out.at(0);
}

// Runs `kernel` on random data for `p` and checks every element against the interpreter.
void check(const JitLinear& kernel, const Problem& p) {
  const int64_t M = row_count(p), K = p.K, N = p.N;
  const int64_t stride = p.x_stride ? p.x_stride : K;
  ASSERT_GE(stride, K);
  std::vector<int64_t> x_shape = p.rows;
  x_shape.push_back(K);
  Tensor x = Tensor::from_f32(x_shape, noise(M * K, p.seed));
  for (const auto& [index, value] : p.specials) x.f[index] = value;
  Tensor w = Tensor::from_f32({N, K}, noise(N * K, p.seed + 1));
  Tensor b = Tensor::from_f32({N}, noise(N, p.seed + 2));
  Tensor ref = reference(p, x, w, b);

  // x as a (k, m) view with row stride `stride`, padding filled with NaN so that reading
  // it would show; wt = W laid out as the runtime does; out (n, m) prefilled with NaN.
  std::vector<float> x_data(stride * M, NAN);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) x_data[m * stride + k] = x.f[m * K + k];
  std::vector<float> wt_data(K * N);
  rt::lay_out_linear_weight(w.f.data(), N, K, p.panel, wt_data.data());
  std::vector<float> out_data(N * M, NAN);
  halide_dimension_t x_dims[] = {{0, static_cast<int32_t>(K), 1},
                                 {0, static_cast<int32_t>(M), static_cast<int32_t>(stride)}};
  const auto i32 = [](int64_t v) { return static_cast<int32_t>(v); };
  halide_dimension_t wt_dims[] = {{0, i32(N), 1}, {0, i32(K), i32(N)}, {}};
  if (p.panel) {
    wt_dims[0] = {0, i32(p.panel), 1};
    wt_dims[1] = {0, i32(K), i32(p.panel)};
    wt_dims[2] = {0, i32(N / p.panel), i32(K * p.panel)};
  }
  halide_dimension_t b_dims[] = {{0, static_cast<int32_t>(N), 1}};
  halide_dimension_t out_dims[] = {{0, static_cast<int32_t>(N), 1},
                                   {0, static_cast<int32_t>(M), static_cast<int32_t>(N)}};
  Halide::Runtime::Buffer<float> xb(x_data.data(), 2, x_dims);
  Halide::Runtime::Buffer<float> wtb(wt_data.data(), p.panel ? 3 : 2, wt_dims);
  Halide::Runtime::Buffer<float> bb(b.f.data(), 1, b_dims);
  Halide::Runtime::Buffer<float> ob(out_data.data(), 2, out_dims);
  std::vector<halide_buffer_t*> buffers = {xb.raw_buffer(), wtb.raw_buffer()};
  if (p.has_bias) buffers.push_back(bb.raw_buffer());
  buffers.push_back(ob.raw_buffer());
  ASSERT_EQ(kernel(buffers), 0);

  constexpr double kUnit = 1.0 / (1 << 24);
  int failures = 0;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double magnitude = p.has_bias ? std::fabs(b.f[n]) : 0.0;
      for (int64_t k = 0; k < K; ++k)
        magnitude += std::fabs(static_cast<double>(x.f[m * K + k]) * w.f[n * K + k]);
      const float got = out_data[m * N + n], want = ref.f[m * N + n];
      double tolerance = static_cast<double>(K + 4) * kUnit * magnitude;
      // The smooth activations: Lipschitz constant below 1.2 (gelu's slope peaks at 1.13),
      // and the kernel's f32 function off by a few ulp of its value or of its argument.
      if (p.act != "none" && p.act != "relu")
        tolerance = 1.2 * tolerance + 8 * kUnit * (std::fabs(want) + magnitude);
      if (!std::isfinite(want)) {  // NaN stays NaN and an infinity stays itself
        if (!(std::isnan(got) && std::isnan(want)) && got != want && ++failures <= 5)
          ADD_FAILURE() << "M=" << M << " out(n=" << n << ", m=" << m << ") = " << got << ", want "
                        << want;
        continue;
      }
      if (!(std::fabs(static_cast<double>(got) - want) <= tolerance) && ++failures <= 5)
        ADD_FAILURE() << "M=" << M << " out(n=" << n << ", m=" << m << ") = " << got << ", want "
                      << want << " ± " << tolerance;
    }
  }
  EXPECT_EQ(failures, 0) << "elements off for M=" << M;
}

// (target, K, N, act, has_bias, panel)
using Shape = std::tuple<std::string, int64_t, int64_t, std::string, bool, int64_t>;

class LinearKernelShapeTest : public ::testing::TestWithParam<Shape> {};

TEST_P(LinearKernelShapeTest, MatchesInterpreter) {
  const auto& [target, K, N, act, has_bias, panel] = GetParam();
  const JitLinear kernel(LinearKernel{K, N, act, has_bias, panel}, target);
  uint32_t seed = 1;
  // Every register-block schedule: 1-row blocks (M < 4), 4-row blocks (M < 64, and on AVX-512
  // below kSmallBlockRows where 6 does not divide M: 64, 128, 129), 6-row (96; ManyTiles' 256
  // on; on AVX2 from 64 on).
  for (int64_t M : {1, 2, 3, 4, 5, 6, 7, 32, 33, 63, 64, 96, 128, 129}) {
    SCOPED_TRACE("M=" + std::to_string(M));
    check(kernel, Problem{K, N, panel, {M}, act, has_bias, 0, seed += 3});
  }
  // Leading dims [B, L] like the model's activations, and x as a view of a wider tensor.
  check(kernel, Problem{K, N, panel, {3, 11}, act, has_bias, 0, seed += 3});
  check(kernel, Problem{K, N, panel, {33}, act, has_bias, K + 5, seed += 3});
}

std::string shape_name(const ::testing::TestParamInfo<Shape>& info) {
  const auto& [target, K, N, act, has_bias, panel] = info.param;
  return (target == "host" ? std::string("host") : std::string("avx2")) + "_K" + std::to_string(K) +
         "_N" + std::to_string(N) + (act == "none" ? "" : "_" + act) + (has_bias ? "" : "_nobias") +
         (panel ? "_p" + std::to_string(panel) : "");
}

INSTANTIATE_TEST_SUITE_P(
    OddShapes, LinearKernelShapeTest,
    ::testing::Values(
        Shape{"host", 24, 40, "none", true, 0}, Shape{"host", 20, 36, "relu", true, 0},
        Shape{"host", 7, 5, "none", false, 0}, Shape{"host", 9, 3, "relu", false, 0},
        Shape{"host", 1, 17, "none", true, 0}, Shape{"host", 5, 1, "relu", true, 0},
        Shape{"host", 16, 48, "relu", false, 0}, Shape{"host", 64, 200, "relu", true, 0},
        Shape{kAvx2Target, 24, 40, "none", true, 0}, Shape{kAvx2Target, 20, 36, "relu", true, 0},
        Shape{kAvx2Target, 7, 5, "none", false, 0}, Shape{kAvx2Target, 64, 200, "relu", false, 0},
        // Packed weights: one panel, several, K not a multiple of the unroll; with AVX-512,
        // tasks of 2 panels (8 panels) and of 4 (16) that prefetch the next (M 4 to 191).
        Shape{"host", 24, 64, "none", true, 64}, Shape{"host", 7, 192, "relu", false, 64},
        Shape{"host", 20, 512, "none", true, 64}, Shape{"host", 7, 1024, "relu", false, 64},
        Shape{kAvx2Target, 9, 128, "relu", true, 64}),
    shape_name);

// Every activation epilogue, dense and packed, on both targets.
INSTANTIATE_TEST_SUITE_P(Activations, LinearKernelShapeTest,
                         ::testing::Values(Shape{"host", 20, 36, "gelu", true, 0},
                                           Shape{"host", 24, 64, "gelu_tanh", true, 64},
                                           Shape{kAvx2Target, 9, 128, "silu", true, 64},
                                           Shape{"host", 7, 5, "sigmoid", false, 0},
                                           Shape{"host", 16, 48, "tanh", true, 0},
                                           Shape{kAvx2Target, 20, 36, "gelu", false, 0}),
                         shape_name);

// The model's shape class: whole register blocks along n, K a multiple of the unroll,
// weights packed as the runtime packs them for these N (and dense once).
INSTANTIATE_TEST_SUITE_P(Realistic, LinearKernelShapeTest,
                         ::testing::Values(Shape{"host", 512, 512, "none", true, 64},
                                           Shape{"host", 512, 512, "relu", true, 64},
                                           Shape{kAvx2Target, 512, 512, "relu", true, 64},
                                           Shape{"host", 512, 512, "relu", true, 0}),
                         shape_name);

// Several m tiles (balanced: 1031 rows are 2 tiles, 2100 are 3), several n tiles and blocks.
TEST(LinearKernelTest, ManyTiles) {
  for (const char* target : {"host", kAvx2Target}) {
    SCOPED_TRACE(target);
    for (int64_t panel : {0, 64}) {
      SCOPED_TRACE("panel " + std::to_string(panel));
      const JitLinear kernel(LinearKernel{64, 320, "relu", true, panel}, target);
      check(kernel, Problem{64, 320, panel, {1031}, "relu", true, 0, 11});
      check(kernel, Problem{64, 320, panel, {256}, "relu", true, 70, 12});
      check(kernel, Problem{64, 320, panel, {2100}, "relu", true, 0, 13});
    }
  }
}

// NaN and infinities in x propagate as in the interpreter (and PyTorch), ReLU included:
// relu(NaN) is NaN, not 0 (x86's max of NaN and 0 may return 0).
TEST(LinearKernelTest, NanAndInfinityPropagate) {
  for (const char* target : {"host", kAvx2Target}) {
    for (const char* act : {"none", "relu", "gelu"}) {
      SCOPED_TRACE(std::string(target) + " " + act);
      const JitLinear kernel(LinearKernel{16, 64, act, true, 0}, target);
      Problem p{16, 64, 0, {5}, act, true, 0, 21};
      p.specials = {{3, NAN}, {16 + 2, INFINITY}, {32 + 7, -INFINITY}, {64 + 1, NAN}};
      check(kernel, p);
    }
  }
}

// The kernel takes its arguments in kernels.h's order: x, wt, bias (only with a bias).
TEST(LinearKernelTest, Arguments) {
  const Halide::Target host = host_target();
  KernelPipeline with_bias = build_linear(LinearKernel{8, 16, "none", true}, host);
  ASSERT_EQ(with_bias.args.size(), 3u);
  EXPECT_EQ(with_bias.args[0].name, "x");
  EXPECT_EQ(with_bias.args[1].name, "wt");
  EXPECT_EQ(with_bias.args[2].name, "bias");
  KernelPipeline no_bias = build_linear(LinearKernel{8, 16, "relu", false}, host);
  ASSERT_EQ(no_bias.args.size(), 2u);
  EXPECT_EQ(no_bias.args[1].name, "wt");
  for (const Halide::Argument& a : with_bias.args) EXPECT_TRUE(a.is_input());
  EXPECT_EQ(with_bias.args[1].dimensions, 2);
  // Packed weights are the 3-D (j, k, panel) buffer.
  KernelPipeline packed = build_linear(LinearKernel{8, 128, "none", true, 64}, host);
  ASSERT_EQ(packed.args.size(), 3u);
  EXPECT_EQ(packed.args[1].dimensions, 3);
}

// The model's shapes compile ahead of time (as kiln's compiler does) for both targets.
TEST(LinearKernelTest, CompilesAheadOfTime) {
  jit::expect_compiles_ahead_of_time(LinearKernel{512, 1536, "relu", true, 64});
}

}  // namespace
}  // namespace kiln::codegen
