// Tests for the LayerNorm kernel (codegen/layernorm_kernel.cpp): the pipeline, JIT-compiled
// for the host and for AVX2, against the reference interpreter's `layernorm` and
// `add_layernorm` on random data, with strided input rows and any number of rows.
//
// Tolerance: the interpreter works in double and rounds once; the kernel sums in float.
// On unit-scale data the error must stay within 1e-5 (absolute) per output value.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "codegen/halide_kernels.h"
#include "codegen/kernels.h"
#include "ir/interpreter.h"
#include "ir/ir.h"
#include "jit_kernel.h"
#include "support/error.h"

namespace kiln {
namespace {

using jit::JitKernel;
using jit::kAvx2Target;
using jit::target_named;

// A [rows × d] matrix of random values in a Halide buffer (c, r) whose rows are `stride`
// floats apart (stride >= d), and the same values as an IR tensor. The padding is NaN,
// so a kernel reading it shows.
struct Matrix {
  Halide::Buffer<float> buffer;
  ir::Tensor tensor;
};

Matrix random_matrix(std::mt19937& rng, int64_t rows, int64_t d, int64_t stride, float lo,
                     float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Halide::Buffer<float> full(static_cast<int>(stride), static_cast<int>(rows));
  full.fill(std::nanf(""));
  Halide::Buffer<float> view(full.get()->cropped(0, 0, static_cast<int>(d)));
  std::vector<float> data(rows * d);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < d; ++c) {
      const float v = dist(rng);
      view(static_cast<int>(c), static_cast<int>(r)) = v;
      data[r * d + c] = v;
    }
  }
  return {view, ir::Tensor::from_f32({rows, d}, std::move(data))};
}

// A module whose function applies `layernorm` (x, gamma, beta) or `add_layernorm`
// (x, y, gamma, beta) to rows of length d, with the variant's attributes when set, and
// for add_layernorm also returns its add_layernorm_sum.
ir::Module layernorm_module(int64_t d, bool with_add, double eps, bool unbiased = false,
                            bool eps_outside = false) {
  ir::Module m;
  m.name = "test";
  m.symbols.push_back({"R", 4096});
  ir::Function f;
  f.name = "f";
  const ir::TensorType rows{ir::DType::f32, {ir::Dim::sym("R"), ir::Dim::constant(d)}};
  const ir::TensorType vec{ir::DType::f32, {ir::Dim::constant(d)}};
  std::vector<ir::ValueId> operands{f.add_param("x", rows)};
  if (with_add) operands.push_back(f.add_param("y", rows));
  operands.push_back(f.add_param("gamma", vec));
  operands.push_back(f.add_param("beta", vec));
  ir::Attrs attrs{{"eps", eps}};
  if (unbiased) attrs["unbiased"] = int64_t{1};
  if (eps_outside) attrs["eps_outside"] = int64_t{1};
  const ir::ValueId n =
      f.add_op(with_add ? ir::OpKind::add_layernorm : ir::OpKind::layernorm, operands, rows, attrs);
  f.results.push_back(n);
  if (with_add) f.results.push_back(f.add_op(ir::OpKind::add_layernorm_sum, {n}, rows));
  m.functions.push_back(std::move(f));
  return m;
}

// Runs the kernel and the interpreter on the same random data, `rows` rows of `d` values
// in [lo, hi); returns the largest absolute difference.
float max_error(const JitKernel& kernel, int64_t d, bool with_add, double eps, int64_t rows,
                float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  // Rows of x and y are views into wider matrices (different row strides).
  Matrix x = random_matrix(rng, rows, d, d + 3, lo, hi);
  Matrix y = random_matrix(rng, rows, d, d + 5, lo, hi);
  Matrix gamma = random_matrix(rng, 1, d, d, 0.5f, 1.5f);
  Matrix beta = random_matrix(rng, 1, d, d, -0.5f, 0.5f);
  Halide::Buffer<float> g(gamma.buffer.get()->sliced(1, 0));
  Halide::Buffer<float> b(beta.buffer.get()->sliced(1, 0));
  Halide::Buffer<float> out(static_cast<int>(d), static_cast<int>(rows));

  std::vector<Halide::Buffer<>> buffers{x.buffer};
  if (with_add) buffers.push_back(y.buffer);
  buffers.insert(buffers.end(), {g, b, out});
  EXPECT_EQ(kernel.run(buffers), 0);

  const ir::Module m = layernorm_module(d, with_add, eps);
  std::vector<ir::Tensor> inputs{x.tensor};
  if (with_add) inputs.push_back(y.tensor);
  inputs.push_back(ir::Tensor::from_f32({d}, gamma.tensor.f));
  inputs.push_back(ir::Tensor::from_f32({d}, beta.tensor.f));
  const ir::Tensor want = ir::interpret(m, m.functions[0], {}, inputs).at(0);

  float worst = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < d; ++c) {
      const float got = out(static_cast<int>(c), static_cast<int>(r));
      const float diff = std::fabs(got - want.f[r * d + c]);
      if (!(diff <= worst)) worst = diff;  // NaN sticks
    }
  }
  return worst;
}

struct Params {
  std::string target;
  int64_t d;
  bool with_add;
};

class LayerNormKernelTest : public ::testing::TestWithParam<Params> {};

TEST_P(LayerNormKernelTest, MatchesInterpreter) {
  const Params& p = GetParam();
  const Halide::Target target = target_named(p.target);
  const double eps = 1e-5;
  const codegen::LayerNormKernel spec{p.d, eps, p.with_add};
  const JitKernel kernel(codegen::build_layernorm(spec, target), target);
  for (int64_t rows : {1, 7, 33, 129}) {
    SCOPED_TRACE(testing::Message() << "rows " << rows);
    // Unit-scale data, centred and off-centre.
    EXPECT_LE(max_error(kernel, p.d, p.with_add, eps, rows, -1.0f, 1.0f, 7 + rows), 1e-5f);
    EXPECT_LE(max_error(kernel, p.d, p.with_add, eps, rows, 0.0f, 2.0f, 11 + rows), 1e-5f);
  }
}

// A large mean and a small spread: the statistics of the row shifted by its first value
// keep the error as small as on centred data, where E[x²] - mean² would lose every digit
// and a plain float mean would cost about ulp(100) / spread.
TEST_P(LayerNormKernelTest, LargeMeanSmallSpread) {
  const Params& p = GetParam();
  const Halide::Target target = target_named(p.target);
  const codegen::LayerNormKernel spec{p.d, 1e-5, p.with_add};
  const JitKernel kernel(codegen::build_layernorm(spec, target), target);
  EXPECT_LE(max_error(kernel, p.d, p.with_add, 1e-5, 33, 99.0f, 101.0f, 3), 1e-5f);
}

// Rows too few in an input: Halide's bounds checks reject the call instead of reading
// past the buffer.
TEST_P(LayerNormKernelTest, RejectsShortInput) {
  const Params& p = GetParam();
  const Halide::Target target = target_named(p.target);
  const codegen::LayerNormKernel spec{p.d, 1e-5, p.with_add};
  const JitKernel kernel(codegen::build_layernorm(spec, target), target);
  const int d = static_cast<int>(p.d);
  Halide::Buffer<float> x(d, 3), y(d, 3), g(d), b(d), out(d, 4);
  std::vector<Halide::Buffer<>> buffers{x};
  if (p.with_add) buffers.push_back(y);
  buffers.insert(buffers.end(), {g, b, out});
  EXPECT_NE(kernel.run(buffers), 0);
}

std::vector<Params> all_params() {
  std::vector<Params> params;
  for (const char* target : {"host", kAvx2Target})
    for (int64_t d : {7, 24, 512})
      for (bool with_add : {false, true}) params.push_back({target, d, with_add});
  return params;
}

INSTANTIATE_TEST_SUITE_P(All, LayerNormKernelTest, ::testing::ValuesIn(all_params()),
                         [](const ::testing::TestParamInfo<Params>& param_info) {
                           const Params& p = param_info.param;
                           return std::string(p.target == "host" ? "host" : "avx2") + "_d" +
                                  std::to_string(p.d) + (p.with_add ? "_add" : "");
                         });

// With the sum as a second output (pre-norm add_layernorm + add_layernorm_sum): the sum is
// exactly x + y in float, and the normalized rows match the interpreter's add_layernorm; also
// with the normalized rows written over x, as the memory plan may place them.
TEST(LayerNormKernelSumTest, WritesTheSumToo) {
  for (const char* target_name : {"host", kAvx2Target}) {
    const Halide::Target target = target_named(target_name);
    for (int64_t d : {7, 24, 512}) {
      SCOPED_TRACE(testing::Message() << target_name << " d " << d);
      const codegen::LayerNormKernel spec{d, 1e-5, true, true};
      const JitKernel kernel(codegen::build_layernorm(spec, target), target);
      const ir::Module m = layernorm_module(d, true, 1e-5);
      for (int64_t rows : {1, 7, 33}) {
        for (bool in_place : {false, true}) {
          std::mt19937 rng(static_cast<uint32_t>(5 + rows + d));
          Matrix x = random_matrix(rng, rows, d, d, -1.0f, 1.0f);
          Matrix y = random_matrix(rng, rows, d, d + 5, -1.0f, 1.0f);
          Matrix gamma = random_matrix(rng, 1, d, d, 0.5f, 1.5f);
          Matrix beta = random_matrix(rng, 1, d, d, -0.5f, 0.5f);
          Halide::Buffer<float> g(gamma.buffer.get()->sliced(1, 0));
          Halide::Buffer<float> b(beta.buffer.get()->sliced(1, 0));
          Halide::Buffer<float> sum(static_cast<int>(d), static_cast<int>(rows));
          Halide::Buffer<float> out =
              in_place ? x.buffer
                       : Halide::Buffer<float>(static_cast<int>(d), static_cast<int>(rows));
          ASSERT_EQ(kernel.run({x.buffer, y.buffer, g, b, out, sum}), 0);
          const ir::Tensor want =
              ir::interpret(m, m.functions[0], {},
                            {x.tensor, y.tensor, ir::Tensor::from_f32({d}, gamma.tensor.f),
                             ir::Tensor::from_f32({d}, beta.tensor.f)})
                  .at(0);
          float worst = 0;
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < d; ++c) {
              const int ci = static_cast<int>(c), ri = static_cast<int>(r);
              ASSERT_EQ(sum(ci, ri), x.tensor.f[r * d + c] + y.tensor.f[r * d + c]);
              const float diff = std::fabs(out(ci, ri) - want.f[r * d + c]);
              if (!(diff <= worst)) worst = diff;
            }
          EXPECT_LE(worst, 1e-5f) << "rows " << rows << (in_place ? " in place" : "");
        }
      }
    }
  }
  jit::expect_compiles_ahead_of_time(codegen::LayerNormKernel{512, 1e-5, true, true});
}

// y broadcast over x's leading dims (learned positions [T,d] added to embeddings [B,T,d]):
// x's row b·T + t adds y's row t; with and without the sum output.
TEST(LayerNormKernelSumTest, BroadcastY) {
  const int64_t d = 24, T = 5, B = 3;
  ir::Module m;
  m.name = "test";
  m.symbols = {{"B", 8}, {"T", 8}};
  ir::Function f;
  f.name = "f";
  const ir::Dim cd = ir::Dim::constant(d);
  const ir::TensorType xt{ir::DType::f32, {ir::Dim::sym("B"), ir::Dim::sym("T"), cd}};
  const ir::TensorType yt{ir::DType::f32, {ir::Dim::sym("T"), cd}};
  const ir::TensorType vec{ir::DType::f32, {cd}};
  std::vector<ir::ValueId> operands{f.add_param("x", xt), f.add_param("y", yt),
                                    f.add_param("gamma", vec), f.add_param("beta", vec)};
  const ir::ValueId n = f.add_op(ir::OpKind::add_layernorm, operands, xt, {{"eps", 1e-5}});
  f.results = {n, f.add_op(ir::OpKind::add_layernorm_sum, {n}, xt)};
  m.functions.push_back(std::move(f));
  for (const char* target_name : {"host", kAvx2Target}) {
    const Halide::Target target = target_named(target_name);
    for (bool with_sum : {false, true}) {
      SCOPED_TRACE(testing::Message() << target_name << (with_sum ? " with sum" : ""));
      const codegen::LayerNormKernel spec{d, 1e-5, true, with_sum, true};
      const JitKernel kernel(codegen::build_layernorm(spec, target), target);
      std::mt19937 rng(17);
      Matrix x = random_matrix(rng, B * T, d, d + 3, -1.0f, 1.0f);
      Matrix y = random_matrix(rng, T, d, d, -1.0f, 1.0f);
      Matrix gamma = random_matrix(rng, 1, d, d, 0.5f, 1.5f);
      Matrix beta = random_matrix(rng, 1, d, d, -0.5f, 0.5f);
      Halide::Buffer<float> g(gamma.buffer.get()->sliced(1, 0));
      Halide::Buffer<float> b(beta.buffer.get()->sliced(1, 0));
      Halide::Buffer<float> out(static_cast<int>(d), static_cast<int>(B * T));
      Halide::Buffer<float> sum(static_cast<int>(d), static_cast<int>(B * T));
      std::vector<Halide::Buffer<>> buffers{x.buffer, y.buffer, g, b, out};
      if (with_sum) buffers.push_back(sum);
      ASSERT_EQ(kernel.run(buffers), 0);
      const std::vector<ir::Tensor> want = ir::interpret(
          m, m.functions[0], {},
          {ir::Tensor::from_f32({B, T, d}, x.tensor.f), ir::Tensor::from_f32({T, d}, y.tensor.f),
           ir::Tensor::from_f32({d}, gamma.tensor.f), ir::Tensor::from_f32({d}, beta.tensor.f)});
      float worst = 0;
      for (int64_t r = 0; r < B * T; ++r)
        for (int64_t c = 0; c < d; ++c) {
          const int ci = static_cast<int>(c), ri = static_cast<int>(r);
          if (with_sum) ASSERT_EQ(sum(ci, ri), want[1].f[r * d + c]) << "row " << r;
          const float diff = std::fabs(out(ci, ri) - want[0].f[r * d + c]);
          if (!(diff <= worst)) worst = diff;
        }
      EXPECT_LE(worst, 1e-5f);
    }
  }
}

// The variants (kernels.h: unbiased variance, eps outside the square root, and both, the
// Annotated Transformer's `alpha * (x - mean) / (x.std(-1) + eps) + beta`), as layernorm,
// add_layernorm and add_layernorm with its sum, against the interpreter with the same
// attributes (interpreter_test checks that against the PyTorch formula in double). With
// eps = 0.25 each flag changes the output by several percent, so the kernel must honour it:
// it is also compared with the default variant's reference, which it must miss. D = 2 is
// the smallest unbiased row (divides by 1); AVX2 runs the vector and tail shapes only.
struct VariantParams {
  std::string target;
  int64_t d;
  bool unbiased, eps_outside;
};

class LayerNormVariantTest : public ::testing::TestWithParam<VariantParams> {};

TEST_P(LayerNormVariantTest, MatchesInterpreter) {
  const VariantParams& p = GetParam();
  const Halide::Target target = target_named(p.target);
  const int64_t d = p.d;
  for (int kind = 0; kind < 3; ++kind) {  // layernorm, add_layernorm, with the sum
    const bool with_add = kind > 0, with_sum = kind == 2;
    // A kernel per case (eps is compiled in): a large eps on the plain and fused kernels, a
    // model's eps on the kernel with the sum.
    for (double eps : {with_sum ? 1e-6 : 0.25}) {
      SCOPED_TRACE(testing::Message() << "eps " << eps << " kind " << kind);
      codegen::LayerNormKernel spec{d, eps, with_add, with_sum};
      spec.unbiased = p.unbiased;
      spec.eps_outside = p.eps_outside;
      const JitKernel kernel(codegen::build_layernorm(spec, target), target);
      const ir::Module m = layernorm_module(d, with_add, eps, p.unbiased, p.eps_outside);
      const ir::Module plain = layernorm_module(d, with_add, eps);
      for (int64_t rows : {1, 7, 33}) {
        std::mt19937 rng(static_cast<uint32_t>(31 + rows + d + kind));
        Matrix x = random_matrix(rng, rows, d, d + 3, -1.0f, 1.0f);
        Matrix y = random_matrix(rng, rows, d, d + 5, 0.0f, 2.0f);
        Matrix gamma = random_matrix(rng, 1, d, d, 0.5f, 1.5f);
        Matrix beta = random_matrix(rng, 1, d, d, -0.5f, 0.5f);
        Halide::Buffer<float> g(gamma.buffer.get()->sliced(1, 0));
        Halide::Buffer<float> b(beta.buffer.get()->sliced(1, 0));
        Halide::Buffer<float> out(static_cast<int>(d), static_cast<int>(rows));
        Halide::Buffer<float> sum(static_cast<int>(d), static_cast<int>(rows));
        std::vector<Halide::Buffer<>> buffers{x.buffer};
        if (with_add) buffers.push_back(y.buffer);
        buffers.insert(buffers.end(), {g, b, out});
        if (with_sum) buffers.push_back(sum);
        ASSERT_EQ(kernel.run(buffers), 0);
        std::vector<ir::Tensor> inputs{x.tensor};
        if (with_add) inputs.push_back(y.tensor);
        inputs.push_back(ir::Tensor::from_f32({d}, gamma.tensor.f));
        inputs.push_back(ir::Tensor::from_f32({d}, beta.tensor.f));
        const std::vector<ir::Tensor> want = ir::interpret(m, m.functions[0], {}, inputs);
        const ir::Tensor other = ir::interpret(plain, plain.functions[0], {}, inputs).at(0);
        float worst = 0, from_default = 0;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < d; ++c) {
            const int ci = static_cast<int>(c), ri = static_cast<int>(r);
            if (with_sum) ASSERT_EQ(sum(ci, ri), want[1].f[r * d + c]) << "row " << r;
            const float diff = std::fabs(out(ci, ri) - want[0].f[r * d + c]);
            if (!(diff <= worst)) worst = diff;  // NaN sticks
            from_default = std::max(from_default, std::fabs(out(ci, ri) - other.f[r * d + c]));
          }
        EXPECT_LE(worst, 1e-5f) << "rows " << rows;
        if (eps == 0.25 && d > 2) EXPECT_GT(from_default, 1e-3f) << "rows " << rows;
      }
    }
  }
}

std::vector<VariantParams> variant_params() {
  std::vector<VariantParams> params;
  for (const char* target : {"host", kAvx2Target})
    for (int64_t d : {2, 7, 512})
      for (int v = 1; v < 4; ++v)
        if (d > 2 || target == std::string("host"))
          params.push_back({target, d, (v & 1) != 0, (v & 2) != 0});
  return params;
}

INSTANTIATE_TEST_SUITE_P(All, LayerNormVariantTest, ::testing::ValuesIn(variant_params()),
                         [](const ::testing::TestParamInfo<VariantParams>& param_info) {
                           const VariantParams& p = param_info.param;
                           return std::string(p.target == "host" ? "host" : "avx2") + "_d" +
                                  std::to_string(p.d) + (p.unbiased ? "_unbiased" : "") +
                                  (p.eps_outside ? "_epsout" : "");
                         });

// RMSNorm (rms: no mean, no beta; arguments x [, y], gamma, out [, sum]) as layernorm,
// add_layernorm, add_layernorm with its sum and with a broadcast y (rows of y repeated over
// x's rows, ViT's [1, N, D] positions), against the interpreter's layernorm {rms = 1} on odd
// sizes (D 1, 7, 33, 512; 1, 7, 33 rows), off-centre data included (a mean the kernel must
// not subtract), and compared with a plain layernorm's output, which it must miss.
TEST(RmsNormKernelTest, MatchesInterpreter) {
  for (const char* target_name : {"host", kAvx2Target}) {
    const Halide::Target target = target_named(target_name);
    for (int64_t d : {1, 7, 33, 512}) {
      for (int kind = 0; kind < 4; ++kind) {  // rmsnorm, add, add with the sum, broadcast y
        const bool with_add = kind > 0, with_sum = kind >= 2, bcast = kind == 3;
        SCOPED_TRACE(testing::Message() << target_name << " d " << d << " kind " << kind);
        codegen::LayerNormKernel spec{d, 1e-6, with_add, with_sum, bcast};
        spec.rms = true;
        const JitKernel kernel(codegen::build_layernorm(spec, target), target);
        for (int64_t rows : {1, 7, 33}) {
          const int64_t y_rows = bcast ? 1 : rows;  // broadcast: one row of y for all
          ir::Module m;
          m.name = "test";
          ir::Function f;
          f.name = "f";
          const ir::Dim cd = ir::Dim::constant(d);
          const ir::TensorType xt{ir::DType::f32, {ir::Dim::constant(rows), cd}};
          const ir::TensorType yt{ir::DType::f32, {ir::Dim::constant(y_rows), cd}};
          std::vector<ir::ValueId> operands{f.add_param("x", xt)};
          if (with_add) operands.push_back(f.add_param("y", bcast ? yt : xt));
          operands.push_back(f.add_param("gamma", ir::TensorType{ir::DType::f32, {cd}}));
          const ir::Attrs attrs{{"eps", 1e-6}, {"rms", int64_t{1}}};
          const ir::ValueId n = f.add_op(
              with_add ? ir::OpKind::add_layernorm : ir::OpKind::layernorm, operands, xt, attrs);
          f.results = {n};
          if (with_add) f.results.push_back(f.add_op(ir::OpKind::add_layernorm_sum, {n}, xt));
          m.functions.push_back(std::move(f));

          std::mt19937 rng(static_cast<uint32_t>(41 + rows + d + kind));
          Matrix x = random_matrix(rng, rows, d, d + 3, -1.0f, 1.0f);
          Matrix y = random_matrix(rng, y_rows, d, d + 5, 0.0f, 2.0f);
          Matrix gamma = random_matrix(rng, 1, d, d, 0.5f, 1.5f);
          Halide::Buffer<float> g(gamma.buffer.get()->sliced(1, 0));
          Halide::Buffer<float> out(static_cast<int>(d), static_cast<int>(rows));
          Halide::Buffer<float> sum(static_cast<int>(d), static_cast<int>(rows));
          std::vector<Halide::Buffer<>> buffers{x.buffer};
          if (with_add) buffers.push_back(y.buffer);
          buffers.insert(buffers.end(), {g, out});
          if (with_sum) buffers.push_back(sum);
          ASSERT_EQ(kernel.run(buffers), 0);
          std::vector<ir::Tensor> inputs{x.tensor};
          if (with_add) inputs.push_back(y.tensor);
          inputs.push_back(ir::Tensor::from_f32({d}, gamma.tensor.f));
          const std::vector<ir::Tensor> want = ir::interpret(m, m.functions[0], {}, inputs);
          float worst = 0;
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < d; ++c) {
              const int ci = static_cast<int>(c), ri = static_cast<int>(r);
              if (with_sum) ASSERT_EQ(sum(ci, ri), want[1].f[r * d + c]) << "row " << r;
              const float diff = std::fabs(out(ci, ri) - want[0].f[r * d + c]);
              if (!(diff <= worst)) worst = diff;  // NaN sticks
            }
          EXPECT_LE(worst, 1e-5f) << "rows " << rows;
        }
      }
    }
  }
}

// Each variant is its own kernel: names differ wherever a flag does, and the default
// variant keeps the name it always had (equal kernels share one function by name).
TEST(LayerNormKernelNames, EncodeTheVariant) {
  std::set<std::string> names;
  for (bool with_add : {false, true})
    for (int v = 0; v < 4; ++v) {
      codegen::LayerNormKernel k{512, 1e-6, with_add, with_add};
      k.unbiased = (v & 1) != 0;
      k.eps_outside = (v & 2) != 0;
      EXPECT_TRUE(names.insert(codegen::kernel_name(k)).second) << codegen::kernel_name(k);
    }
  EXPECT_EQ(codegen::kernel_name(codegen::LayerNormKernel{512, 1e-5, true}),
            "kiln_add_layernorm_d512_e3ee4f8b588e368f1");
  codegen::LayerNormKernel annotated{512, 1e-6, true, false, true};
  annotated.unbiased = annotated.eps_outside = true;
  EXPECT_EQ(codegen::kernel_name(annotated),
            "kiln_add_layernorm_bcast_unbiased_epsout_d512_e3eb0c6f7a0b5ed8d");
  codegen::LayerNormKernel rms{512, 1e-6, true, true};
  rms.rms = true;
  EXPECT_EQ(codegen::kernel_name(rms), "kiln_add_sum_rmsnorm_d512_e3eb0c6f7a0b5ed8d");
}

// The AOT path: the kernel compiles to an object (without the runtime) for both targets.
TEST(LayerNormKernelAotTest, CompilesToObject) {
  for (bool with_add : {false, true})
    jit::expect_compiles_ahead_of_time(codegen::LayerNormKernel{512, 1e-5, with_add});
  codegen::LayerNormKernel annotated{512, 1e-6, true, true};
  annotated.unbiased = annotated.eps_outside = true;
  jit::expect_compiles_ahead_of_time(annotated);
  codegen::LayerNormKernel rms{512, 1e-6, true, true, true};
  rms.rms = true;
  jit::expect_compiles_ahead_of_time(rms);
}

}  // namespace
}  // namespace kiln
