// Models compiled with `kiln compile --weights bf16` (kiln_add_model ... WEIGHTS bf16).
//
// The tolerance. A bf16 library differs from the f32 one by the rounding of each linear's
// input and weight to bf16 (8 significant bits: a relative error of at most 2^-9 per
// operand, so up to 2^-8 of Σ|x·w| per GEMM output) before products summed in f32. Along a
// chain of G GEMMs (LayerNorms re-normalize, residuals add) that moves a result by about
// G·2^-8 of its scale (a LayerNorm can magnify it where Σ|x·w| exceeds the output: measured
// up to a quarter of G·2^-6 on the wide config's encoder): every model output must be within
// G·2^-6·max|f32 output| of the f32 result, G the number of linear ops in the entry point
// (kBf16PerGemm below). Every measured error is printed.
//
// That bound is loose; the kernels themselves are checked tightly: each bf16 linear alone
// against a double sum over the same bf16-rounded inputs (Bf16Kernels), and the models
// against the interpreter with InterpretOptions::bf16_linear (the f32 reference with every
// linear's inputs rounded to bf16, on the library's optimized IR). That last distance is
// printed, not asserted tightly: an input within an f32 ulp of a bf16 rounding boundary may
// round the other way in the kernel (a 2^-8 step of that element), and later roundings
// amplify it, so it ranges from 2e-7 to the size of the bf16 effect itself.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <immintrin.h>

#include "bf16_attentions.h"
#include "bf16_base.h"
#include "bf16_linears.h"
#include "bf16_numbers.h"
#include "bf16_numbers_f32act.h"
#include "bf16_odd.h"
#include "bf16_odd_f32act.h"
#include "bf16_small.h"
#include "bf16_tiny.h"
#include "bf16_tiny_f32act.h"
#include "bf16_wide.h"
#include "bf16auto_small.h"
#include "bf16fma_attentions.h"
#include "bf16fma_linears.h"
#include "bf16fma_odd.h"
#include "bf16fma_odd_f32act.h"
#include "bf16fma_small.h"
#include "f32_linears.h"
#include "f32_numbers.h"
#include "frontend/models.h"
#include "ir/interpreter.h"
#include "ir/parser.h"
#include "kiln/vocab.h"
#include "noise.h"
#include "packed_weights.h"
#include "pass_harness.h"
#include "passes/pipeline.h"
#include "runtime/bf16_products.h"
#include "runtime/plan.h"
#include "runtime/safetensors.h"
#include "scoped_env.h"
#include "step_runner.h"
#include "tools/bridge.h"

namespace kiln {
namespace {

// 4 × 2^-8: a GEMM output moves by up to 2^-8 of Σ|x·w|. Each attention with an even head
// size counts as two such products (QKᵀ, and the V product of the rounded probabilities).
constexpr double kBf16PerGemm = 0x1p-6;

// The bf16 products of `entry`: its linears, and two per attention computed in bf16.
int bf16_products(const ir::Module& m, const std::string& entry) {
  int n = 0;
  for (const ir::Op& op : m.find_function(entry)->ops) n += op.kind == ir::OpKind::linear;
  return n + 2 * testing::bf16_attention_ops(m, entry);
}

using testing::golden_file;
using testing::max_abs_diff;
using testing::optimized_transformer;

// The interpreter with every linear's and attention's inputs rounded to bf16, as the library
// rounds them.
ir::InterpretOptions bf16_rounding() {
  ir::InterpretOptions options;
  options.bf16_linear = true;
  options.bf16_attention = true;
  return options;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::abs(static_cast<double>(x)));
  return m;
}

// A golden batch through the bf16 library against PyTorch's f32 logits, within G·2^-6 of
// the largest |logit|; the distance to the bf16-rounding interpreter is printed.
// fma: a library compiled with --bf16-products fma, whose attention stays f32.
template <typename Model>
void expect_golden(Model& model, const std::string& config, const std::string& batch,
                   bool fma = false) {
  ir::InterpretOptions options = bf16_rounding();
  options.bf16_attention = !fma;
  const testing::GoldenForward g = testing::golden_forward(model, config, batch, options);
  ASSERT_EQ(g.got.shape, g.pytorch.shape);
  const int gemms = g.linears + (fma ? 0 : 2 * g.attentions_bf16);
  const double tolerance = gemms * kBf16PerGemm * max_abs(g.pytorch.data);
  const double vs_f32 = max_abs_diff(g.got.data, g.pytorch.data);
  std::printf(
      "[ bf16 ] %s: vs PyTorch f32 %.3g (tolerance %d bf16 products x 2^-6 x %.3g = %.3g); the "
      "bf16-rounding interpreter vs f32 %.3g, vs the library %.3g\n",
      batch.c_str(), vs_f32, gemms, max_abs(g.pytorch.data), tolerance,
      max_abs_diff(g.interpreted, g.pytorch.data), max_abs_diff(g.got.data, g.interpreted));
  EXPECT_LE(vs_f32, tolerance);
  EXPECT_GT(vs_f32, 0) << "nothing was rounded to bf16";
}

// Each kernel alone (tests/abi/linears.kir: N below, at and above multiples of 64, odd and
// even K, ReLU, no bias) against a double-precision sum over the bf16-rounded x and W: the
// inputs are the same on both sides, so only the f32 summation differs, by at most
// (K + 4)·2^-24·(Σ_k |x̂_k·ŵ_k| + |b|) (the f32 kernels' bound, linear_kernel_test.cpp).
// Both forms of the products: vdpbf16ps (bf16_linears) and FMAs (bf16fma_linears); and the f32
// kernels (f32_linears: nothing rounded, the same bound).
using CreateFn = kiln_model* (*)(const char*, char**);
void expect_linears_match_double_sums(CreateFn create, const char* label, bool bf16 = true) {
  uint32_t seed = 1;
  const testing::LinearsCheckpoint ck =
      testing::write_linears_noise(std::string(label) + ".safetensors", seed);
  char* error = nullptr;
  std::unique_ptr<kiln_model, void (*)(kiln_model*)> model(create(ck.path.c_str(), &error),
                                                           kiln_model_destroy);
  ASSERT_TRUE(model) << error;
  auto round = [bf16](float v) { return bf16 ? rt::bf16_to_f32(rt::f32_to_bf16(v)) : v; };
  int checked = 0;
  for (const testing::LinearCase& c : testing::linears_cases()) {
    const std::string name = c.name();
    std::vector<float> wr(ck.w.at(name).size());
    std::transform(ck.w.at(name).begin(), ck.w.at(name).end(), wr.begin(), round);
    for (int64_t M : testing::linears_rows(c.K)) {
      SCOPED_TRACE(name + " M=" + std::to_string(M));
      std::vector<float> x = testing::noise(static_cast<size_t>(M * c.K), seed++);
      std::vector<float> xr(x.size());
      std::transform(x.begin(), x.end(), xr.begin(), round);
      std::vector<float> y;
      ASSERT_EQ(testing::run_linear(model.get(), name, x, M, c.K, c.N, y), 0)
          << kiln_model_error(model.get());
      int failures = 0;
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < c.N; ++n) {
          double sum = 0, magnitude = c.bias ? std::abs(ck.b.at(name)[n]) : 0.0;
          for (int64_t k = 0; k < c.K; ++k) {
            const double p = static_cast<double>(xr[m * c.K + k]) * wr[n * c.K + k];
            sum += p;
            magnitude += std::abs(p);
          }
          float want = static_cast<float>(sum);
          if (c.bias) want += ck.b.at(name)[n];
          if (c.relu) want = std::max(want, 0.0f);
          const double tolerance = static_cast<double>(c.K + 4) * 0x1p-24 * magnitude;
          const float got = y[m * c.N + n];
          if (!(std::abs(static_cast<double>(got) - want) <= tolerance) && ++failures <= 5)
            ADD_FAILURE() << "out[" << m << "," << n << "] = " << got << ", want " << want << " ± "
                          << tolerance;
          ++checked;
        }
      ASSERT_EQ(failures, 0);
    }
  }
  std::printf("[ %s ] %s: %d kernel outputs within the f32 summation bound\n",
              bf16 ? "bf16" : "f32", label, checked);
}

TEST(Bf16Kernels, MatchADoubleSumOfRoundedInputs) {
  expect_linears_match_double_sums(bf16_linears_create, "bf16_linears");
}

// The f32 linear kernels as a model library has them (with AVX-512 those of 4 to 63 rows and of
// 64 to 191 that 6 does not divide prefetch the next weight panel, codegen/linear_kernel.cpp), on
// the same rows.
TEST(F32Kernels, MatchADoubleSum) {
  expect_linears_match_double_sums(f32_linears_create, "f32_linears", false);
}

// The same kernels compiled with --bf16-products fma: the weights' pairs widened to f32, the
// products on FMAs (LinearKernel::bf16_fma), the same bound.
TEST(Bf16FmaKernels, MatchADoubleSumOfRoundedInputs) {
  expect_linears_match_double_sums(bf16fma_linears_create, "bf16fma_linears");
}

// The fused attention alone (tests/abi/attentions.kir, compiled with bf16 weights): with an
// even head size both products run in bf16 (AttentionKernel::bf16), with an odd one in f32.
// The library gets the same q, k and v as the interpreter, so against the interpreter that
// rounds as it does (bf16_attention) only the f32 sums' order differs, and a rare probability
// whose f32 exponential lies within a few ulp of a bf16 rounding boundary may round the other
// way there (its weight moves by 2^-8 of itself). Asserted, over all outputs of each entry:
// the mean |library - rounding interpreter| below 1e-5 of the largest |v|, the largest below
// 2^-8 of it, and (even head size) the mean |library - f32 interpreter| at least 10 times the
// first: the rounding happened. An odd head size is f32 on both sides.
// fma: the library compiled with --bf16-products fma, whose attention is f32 at every head size.
void expect_attention(CreateFn create, bool fma) {
  std::ifstream kir(std::string(KILN_TEST_DATA_DIR) + "/abi/attentions.kir");
  std::stringstream text;
  text << kir.rdbuf();
  const ir::Module m = ir::parse_and_verify(text.str(), "attentions.kir");
  const std::string empty = ::testing::TempDir() + "bf16_attentions.safetensors";
  rt::write_safetensors(empty, {});
  char* error = nullptr;
  std::unique_ptr<kiln_model, void (*)(kiln_model*)> model(create(empty.c_str(), &error),
                                                           kiln_model_destroy);
  ASSERT_TRUE(model) << error;
  uint32_t seed = 11;
  ir::InterpretOptions rounding = bf16_rounding();
  rounding.bf16_attention = !fma;
  for (const auto& [entry, width, even] :
       {std::tuple<std::string, int64_t, bool>{"h4_d16", 64, true},
        {"h4_d16_causal_pad", 64, true},
        {"h3_d7", 21, false}}) {
    const bool padded = entry.find("pad") != std::string::npos;
    double worst = 0, sum_rounded = 0, sum_f32 = 0, largest_v = 0;
    size_t count = 0;
    // 17 sequences: the kernel's task per sequence (attention_kernel.cpp, kBatchTasks).
    for (int64_t batch : {1, 3, 17})
      for (int64_t len : {1, 5, 32, 33, 70}) {
        if (batch == 17 && len != 33) continue;
        SCOPED_TRACE(entry + " B=" + std::to_string(batch) + " L=" + std::to_string(len));
        const std::vector<int64_t> shape = {batch, len, width};
        const size_t n = static_cast<size_t>(batch * len * width);
        std::vector<float> q = testing::noise(n, seed++), k = testing::noise(n, seed++),
                           v = testing::noise(n, seed++);
        for (float& x : q) x *= 4;  // scores of a few units: peaked and flat rows
        // Row 1 of the batch: its last len/4 keys padded; row 2: its first len/2, so that with
        // causal its first rows have every key masked (the average of v).
        std::vector<int64_t> pad(static_cast<size_t>(batch * len), 0);
        for (int64_t b = 1; b < batch; ++b)
          for (int64_t j = 0; j < len; ++j)
            pad[static_cast<size_t>(b * len + j)] = b == 1 ? j >= len - len / 4 : j < len / 2;
        std::vector<ir::Tensor> inputs = {ir::Tensor::from_f32(shape, q),
                                          ir::Tensor::from_f32(shape, k),
                                          ir::Tensor::from_f32(shape, v)};
        if (padded) inputs.push_back(ir::Tensor::from_ints(ir::DType::boolean, {batch, len}, pad));
        const std::vector<float> f32 = testing::interpret_entry(m, entry, {}, inputs, {})[0].f;
        const std::vector<float> rounded =
            testing::interpret_entry(m, entry, {}, inputs, rounding)[0].f;
        std::vector<kiln_tensor> in(inputs.size());
        std::vector<std::vector<uint8_t>> pad_bytes(1);
        for (size_t i = 0; i < in.size(); ++i) {
          in[i].rank = 3;
          for (int d = 0; d < 3; ++d) in[i].shape[d] = shape[static_cast<size_t>(d)];
          in[i].dtype = KILN_F32;
        }
        in[0].data = q.data(), in[1].data = k.data(), in[2].data = v.data();
        for (int i = 0; i < 3; ++i) in[static_cast<size_t>(i)].capacity = n * 4;
        if (padded) {
          pad_bytes[0].assign(pad.begin(), pad.end());
          in[3].rank = 2;
          in[3].dtype = KILN_BOOL;
          in[3].data = pad_bytes[0].data();
          in[3].capacity = pad_bytes[0].size();
        }
        std::vector<float> got(n, NAN);
        kiln_tensor out{};
        out.dtype = KILN_F32;
        out.rank = 3;
        for (int d = 0; d < 3; ++d) out.shape[d] = shape[static_cast<size_t>(d)];
        out.data = got.data();
        out.capacity = n * 4;
        ASSERT_EQ(kiln_model_run(model.get(), entry.c_str(), in.data(), in.size(), &out, 1), 0)
            << kiln_model_error(model.get());
        for (size_t i = 0; i < n; ++i) {
          const double d = std::abs(static_cast<double>(got[i]) - rounded[i]);
          worst = std::max(worst, d);
          sum_rounded += d;
          sum_f32 += std::abs(static_cast<double>(got[i]) - f32[i]);
        }
        count += n;
        largest_v = std::max(largest_v, max_abs(v));
      }
    const double mean_rounded = sum_rounded / static_cast<double>(count),
                 mean_f32 = sum_f32 / static_cast<double>(count);
    std::printf(
        "[ bf16 ] attention %s%s: vs the bf16-rounding interpreter mean %.3g, largest %.3g; vs "
        "the f32 interpreter mean %.3g (largest |v| %.3g)\n",
        entry.c_str(), fma ? " (fma: f32)" : "", mean_rounded, worst, mean_f32, largest_v);
    EXPECT_LE(mean_rounded, 1e-5 * largest_v) << entry;
    EXPECT_LE(worst, 0x1p-8 * largest_v) << entry;
    if (fma) {
      EXPECT_LE(mean_f32, 1e-5 * largest_v) << entry << ": attention stays f32 with fma";
      EXPECT_LE(worst, 1e-4 * largest_v) << entry << ": attention stays f32 with fma";
    } else if (even) {
      EXPECT_GE(mean_f32, 10 * mean_rounded) << entry << ": the products were not rounded";
    } else {
      EXPECT_LE(mean_f32, 1e-5 * largest_v) << entry << ": an odd head size stays f32";
    }
  }
}

TEST(Bf16Attention, BothProductsRoundAsTheInterpreterSays) {
  expect_attention(bf16_attentions_create, /*fma=*/false);
}

// --bf16-products fma: attention in f32, as the f32 interpreter computes it.
TEST(Bf16FmaAttention, StaysF32) { expect_attention(bf16fma_attentions_create, /*fma=*/true); }

// Subnormals. AVX512-BF16 reads a bf16 subnormal as zero (vdpbf16ps) and converts an f32
// subnormal to a zero of its sign (vcvtne2ps2bf16); kiln rounds to bf16 as that conversion does
// everywhere (weights at load, inputs in the kernels, the interpreter's bf16_linear), so a
// bf16 subnormal never reaches the kernels and the interpreter agrees with the library.

// The conversion as Intel's pseudo-code for vcvtne2ps2bf16 states it, written out here.
uint16_t hardware_bf16(uint32_t bits) {
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  if ((bits & 0x7f800000u) == 0) return static_cast<uint16_t>((bits >> 16) & 0x8000u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

std::vector<int64_t> static_shape(const ir::Weight& w) {
  std::vector<int64_t> shape;
  for (const ir::Dim& d : w.type.shape) shape.push_back(d.value);
  return shape;
}

float float_of(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The instruction itself on `bits` (a multiple of 32 of them).
__attribute__((target("avx512f,avx512bf16"))) std::vector<uint16_t> converted_by_the_cpu(
    const std::vector<uint32_t>& bits) {
  std::vector<uint16_t> out(bits.size());
  for (size_t i = 0; i + 32 <= bits.size(); i += 32) {
    const __m512 lo = _mm512_castsi512_ps(_mm512_loadu_si512(bits.data() + i));
    const __m512 hi = _mm512_castsi512_ps(_mm512_loadu_si512(bits.data() + i + 16));
    const __m512bh r = _mm512_cvtne2ps_pbh(hi, lo);
    std::memcpy(out.data() + i, &r, 64);
  }
  return out;
}

// A generated family of f32 bit patterns over every class: random words; f32 subnormals (a
// random mantissa), those just below 2^-126 that round up to it; the f32 images of bf16
// subnormals, with and without low bits; both zeros, the smallest normal, ties; the largest
// finite values (rounding to infinity), infinities and NaNs; every one with either sign.
std::vector<uint32_t> bit_patterns(uint32_t seed, size_t per_class, bool finite_only) {
  std::mt19937 rng(seed);
  std::vector<uint32_t> out;
  for (size_t i = 0; i < per_class; ++i) {
    const uint32_t sign = (rng() & 1u) << 31;
    out.push_back(rng());
    out.push_back(sign | (1u + rng() % 0x7fffffu));       // f32 subnormal
    out.push_back(sign | (0x7f8000u + rng() % 0x8000u));  // rounds up to 2^-126
    out.push_back(sign | ((1u + rng() % 0x7fu) << 16));   // a bf16 subnormal
    out.push_back(sign | ((1u + rng() % 0x7fu) << 16) | (rng() & 0xffffu));
    out.push_back(sign | (rng() % 0x7f000000u + 0x800000u));                              // normal
    out.push_back(sign | (((rng() % 0x7f00000u + 0x80000u) << 4) & ~0xffffu) | 0x8000u);  // ties
  }
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint32_t v :
         {0u, 1u, 0x7fffffu, 0x7f8000u, 0x7f7fffu, 0x800000u, 0x10000u, 0x7f0000u, 0x7f7f7fffu,
          0x7f7f8000u, 0x7f7fffffu, 0x7f800000u, 0x7f800001u, 0x7fc00000u, 0x7fffffffu})
      out.push_back(sign | v);
  if (finite_only)  // nothing that is or rounds to infinity or NaN
    out.erase(std::remove_if(out.begin(), out.end(),
                             [](uint32_t b) { return (b & 0x7fffffffu) >= 0x7f7f8000u; }),
              out.end());
  while (out.size() % 32) out.push_back(0);
  return out;
}

bool same_value(float got, float want) {
  return std::isnan(want) ? std::isnan(got) : got == want;  // ±0 alike (a bias of 0 is added)
}

// rt::f32_to_bf16 (the weights' conversion at load) is the hardware's conversion on every
// class, bit for bit, and so is the CPU (where it has AVX512-BF16). Through the bf16 library's
// linears with one weight of 1 per output (K 1, 20 and 21: the kernels' own rounding; K 64:
// vcvtne2ps2bf16) and through the interpreter's bf16_linear on the same weights, each output
// is its input so converted.
TEST(Bf16Subnormals, RoundingIsTheHardwaresEverywhere) {
  const std::vector<uint32_t> all = bit_patterns(7, 400, false);
  size_t mismatches = 0;
  for (uint32_t b : all)
    if (rt::f32_to_bf16(float_of(b)) != hardware_bf16(b) && ++mismatches <= 5)
      ADD_FAILURE() << "f32_to_bf16(0x" << std::hex << b << ") = 0x" << rt::f32_to_bf16(float_of(b))
                    << ", the hardware gives 0x" << hardware_bf16(b);
  EXPECT_EQ(mismatches, 0u);
  if (__builtin_cpu_supports("avx512bf16")) {
    const std::vector<uint16_t> cpu = converted_by_the_cpu(all);
    for (size_t i = 0; i < all.size(); ++i)
      ASSERT_EQ(cpu[i], hardware_bf16(all[i])) << std::hex << "0x" << all[i];
  }

  struct Entry {
    std::string name;
    int64_t K, N;
    bool relu;
  };
  const std::vector<Entry> entries = {{"k1_n17", 1, 17, false},
                                      {"k20_n36", 20, 36, true},
                                      {"k21_n29", 21, 29, false},
                                      {"k64_n64", 64, 64, false}};
  const ir::Module m = testing::linears_module();
  // Output n reads input n % K with weight 1; every other weight and bias is 0.
  ir::WeightMap wm;
  std::vector<rt::TensorData> tensors;
  for (const ir::Weight& w : m.weights) {
    ir::Tensor t = ir::Tensor::zeros(ir::DType::f32, static_shape(w));
    if (t.shape.size() == 2)
      for (int64_t n = 0; n < t.shape[0]; ++n) t.f[n * t.shape[1] + n % t.shape[1]] = 1.f;
    tensors.push_back(rt::make_f32(w.name, t.shape, t.f));
    wm[w.name] = std::move(t);
  }
  const std::string path = ::testing::TempDir() + "bf16_identity.safetensors";
  rt::write_safetensors(path, tensors);
  char* error = nullptr;
  std::unique_ptr<kiln_model, void (*)(kiln_model*)> model(
      bf16_linears_create(path.c_str(), &error), kiln_model_destroy);
  ASSERT_TRUE(model) << error;
  const ir::InterpretOptions options = bf16_rounding();
  size_t checked = 0;
  for (const Entry& e : entries) {
    // K 1 takes infinities and NaNs too; a longer row would multiply them by the zeros.
    const std::vector<uint32_t> pats = bit_patterns(100 + static_cast<uint32_t>(e.K), 60, e.K > 1);
    for (size_t first = 0; first < pats.size(); first += static_cast<size_t>(200 * e.K)) {
      const int64_t M =
          std::min<int64_t>(200, (static_cast<int64_t>(pats.size() - first) + e.K - 1) / e.K);
      std::vector<float> x(static_cast<size_t>(M * e.K), 0.f);
      for (size_t i = 0; i < x.size() && first + i < pats.size(); ++i)
        x[i] = float_of(pats[first + i]);
      std::vector<float> y(static_cast<size_t>(M * e.N), 12345.f);
      kiln_tensor in{}, out{};
      in.dtype = out.dtype = KILN_F32;
      in.rank = out.rank = 2;
      in.shape[0] = out.shape[0] = M;
      in.shape[1] = e.K;
      out.shape[1] = e.N;
      in.data = x.data();
      in.capacity = x.size() * 4;
      out.data = y.data();
      out.capacity = y.size() * 4;
      ASSERT_EQ(kiln_model_run(model.get(), e.name.c_str(), &in, 1, &out, 1), 0)
          << kiln_model_error(model.get());
      const std::vector<ir::Tensor> interpreted = ir::interpret(
          m, *m.find_function(e.name), wm, {ir::Tensor::from_f32({M, e.K}, x)}, options);
      size_t failures = 0;
      for (int64_t r = 0; r < M; ++r)
        for (int64_t n = 0; n < e.N; ++n) {
          uint32_t bits;
          const float xv = x[r * e.K + n % e.K];
          std::memcpy(&bits, &xv, 4);
          float want = rt::bf16_to_f32(hardware_bf16(bits));
          if (e.relu && !std::isnan(want)) want = std::max(want, 0.f);
          const float got = y[r * e.N + n], ref = interpreted[0].f[r * e.N + n];
          if ((!same_value(got, want) || !same_value(ref, want)) && ++failures <= 5)
            ADD_FAILURE() << e.name << ": input 0x" << std::hex << bits << std::dec << " gives "
                          << got << " (library), " << ref << " (interpreter), want " << want;
          ++checked;
        }
      ASSERT_EQ(failures, 0u);
    }
  }
  std::printf(
      "[ bf16 ] %zu bit patterns rounded as the hardware does; %zu outputs of the library "
      "and the interpreter each equal to their input so rounded\n",
      all.size(), checked);
}

// A generated family of checkpoints (f32 and bf16 files) whose weights are bf16 or f32
// subnormals of either sign, whole rows of them or mixed with small normals, on inputs of
// magnitude 2^118..2^126 (so a subnormal weight's product, 2^-15..2^-1, would show): every
// linear of the bf16 library equals the interpreter's bf16_linear within the f32 summation
// bound, and an output whose weights are all subnormal is exactly its bias (flushed: 0·x).
TEST(Bf16Subnormals, SubnormalWeightsGiveTheInterpretersResults) {
  const ir::Module m = testing::linears_module();
  const ir::InterpretOptions options = bf16_rounding();
  size_t checked = 0, flushed_rows = 0;
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::mt19937 rng(seed);
    const bool bf16_file = seed % 2 == 0;
    auto subnormal = [&] {  // an f32 subnormal, or a bf16 one (its low bits 0)
      const uint32_t sign = (rng() & 1u) << 31;
      uint32_t bits = sign | (1u + rng() % 0x7fffffu);
      if (bf16_file || rng() % 2) bits = sign | ((1u + rng() % 0x7fu) << 16);
      return float_of(bits);
    };
    std::vector<rt::TensorData> tensors;
    ir::WeightMap wm;
    std::map<std::string, std::vector<bool>> all_subnormal;  // per weight, per row
    for (const ir::Weight& w : m.weights) {
      const std::vector<int64_t> shape = static_shape(w);
      std::vector<float> v(static_cast<size_t>(shape[0] * (shape.size() == 2 ? shape[1] : 1)));
      if (shape.size() == 2) {
        std::vector<bool>& rows = all_subnormal[w.name];
        for (int64_t n = 0; n < shape[0]; ++n) {
          rows.push_back(rng() % 3 == 0);
          for (int64_t k = 0; k < shape[1]; ++k) {
            float& x = v[static_cast<size_t>(n * shape[1] + k)];
            x = rows.back() || rng() % 2 ? subnormal()
                                         : std::ldexp(1.f + (rng() % 1000) / 1000.f,
                                                      -126 + static_cast<int>(rng() % 8)) *
                                               (rng() % 2 ? 1.f : -1.f);
          }
        }
      } else {
        v = testing::noise(v.size(), seed * 100 + static_cast<uint32_t>(v.size()));
      }
      if (bf16_file) {  // the interpreter sees what the file holds
        for (float& x : v)
          x = rt::bf16_to_f32(static_cast<uint16_t>(std::bit_cast<uint32_t>(x) >> 16));
      }
      wm[w.name] = ir::Tensor::from_f32(shape, v);
      if (bf16_file) {
        rt::TensorData d;
        d.name = w.name;
        d.dtype = rt::DType::bf16;
        d.shape = shape;
        d.data.resize(v.size() * 2);
        for (size_t i = 0; i < v.size(); ++i) {
          uint32_t bits;
          std::memcpy(&bits, &v[i], 4);
          const uint16_t top = static_cast<uint16_t>(bits >> 16);  // as it is, subnormal or not
          std::memcpy(d.data.data() + 2 * i, &top, 2);
        }
        tensors.push_back(std::move(d));
      } else {
        tensors.push_back(rt::make_f32(w.name, shape, v));
      }
    }
    const std::string path =
        ::testing::TempDir() + "bf16_subnormal_" + std::to_string(seed) + ".safetensors";
    rt::write_safetensors(path, tensors);
    char* error = nullptr;
    std::unique_ptr<kiln_model, void (*)(kiln_model*)> model(
        bf16_linears_create(path.c_str(), &error), kiln_model_destroy);
    ASSERT_TRUE(model) << error;
    for (const ir::Function& f : m.functions) {
      SCOPED_TRACE(f.name + " seed " + std::to_string(seed));
      const std::string wname = "w_" + f.name;
      const ir::Tensor& w = wm.at(wname);
      const int64_t N = w.shape[0], K = w.shape[1];
      const ir::Tensor* bias = wm.count("b_" + f.name) ? &wm.at("b_" + f.name) : nullptr;
      const int64_t M = 1 + static_cast<int64_t>(rng() % 9);
      std::vector<float> x(static_cast<size_t>(M * K));
      for (float& v : x)
        v = std::ldexp(1.f + (rng() % 1000) / 1000.f, 118 + static_cast<int>(rng() % 8)) *
            (rng() % 2 ? 1.f : -1.f);
      std::vector<float> y;
      ASSERT_EQ(testing::run_linear(model.get(), f.name, x, M, K, N, y), 0)
          << kiln_model_error(model.get());
      const std::vector<ir::Tensor> want =
          ir::interpret(m, f, wm, {ir::Tensor::from_f32({M, K}, x)}, options);
      const bool relu =
          f.name == "k7_n5" || f.name == "k20_n36" || f.name == "k64_n200" || f.name == "k512_n130";
      size_t failures = 0;
      for (int64_t r = 0; r < M; ++r)
        for (int64_t n = 0; n < N; ++n) {
          double magnitude = bias ? std::abs(bias->f[n]) : 0.0;
          for (int64_t k = 0; k < K; ++k)
            magnitude +=
                std::abs(static_cast<double>(rt::bf16_to_f32(rt::f32_to_bf16(x[r * K + k]))) *
                         rt::bf16_to_f32(rt::f32_to_bf16(w.f[n * K + k])));
          const double tolerance = static_cast<double>(K + 4) * 0x1p-24 * magnitude;
          const float got = y[r * N + n], ref = want[0].f[r * N + n];
          if (!(std::abs(static_cast<double>(got) - ref) <= tolerance) && ++failures <= 5)
            ADD_FAILURE() << "out[" << r << "," << n << "] = " << got << ", the interpreter " << ref
                          << " ± " << tolerance;
          if (all_subnormal[wname][static_cast<size_t>(n)]) {
            float b = bias ? bias->f[n] : 0.f;
            if (relu) b = std::max(b, 0.f);
            if (got != b && ++failures <= 5)
              ADD_FAILURE() << "out[" << r << "," << n << "] = " << got
                            << " from subnormal weights only, want the bias " << b;
            flushed_rows += r == 0;
          }
          ++checked;
        }
      ASSERT_EQ(failures, 0u);
    }
  }
  std::printf(
      "[ bf16 ] %zu outputs of subnormal-weight checkpoints equal to the interpreter (%zu "
      "outputs of subnormal weights only: their bias)\n",
      checked, flushed_rows);
  EXPECT_GE(flushed_rows, 100u);
}

TEST(Bf16Golden, TinyMatchesTheBf16Reference) {
  kiln_models::bf16_tiny model(golden_file("tiny.weights.safetensors").c_str());
  expect_golden(model, "tiny", "tiny_b1");
  expect_golden(model, "tiny", "tiny_b2");
}

TEST(Bf16Golden, SmallMatchesTheBf16Reference) {
  kiln_models::bf16_small model(golden_file("small.weights.safetensors").c_str());
  expect_golden(model, "small", "small_b1");
}

// --bf16-products fma: the same linears' rounding, attention in f32.
TEST(Bf16FmaGolden, SmallMatchesTheBf16Reference) {
  kiln_models::bf16fma_small model(golden_file("small.weights.safetensors").c_str());
  expect_golden(model, "small", "small_b1", /*fma=*/true);
}

// --bf16-products auto (bf16auto_small): the library holds both forms of the products and runs
// the one chosen when the model is created: KILN_BF16_PRODUCTS where set, else the faster on
// this CPU (runtime/bf16_products.h). Each form's logits are exactly those of the library built
// with that form alone (the same kernels: bf16_small, bf16fma_small), the config names the
// form, and the profile its kernels; another value of the variable is refused at create.
TEST(Bf16Auto, RunsTheFormChosenAtLoad) {
  const std::string weights = golden_file("small.weights.safetensors");
  kiln_models::bf16_small dot_only(weights.c_str());
  kiln_models::bf16fma_small fma_only(weights.c_str());
  const int64_t vocab = std::min(std::stoll(kiln_model_config(dot_only.get(), "src_vocab")),
                                 std::stoll(kiln_model_config(dot_only.get(), "tgt_vocab")));
  std::vector<int64_t> ids(2 * 9);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = 3 + static_cast<int64_t>(i * 7) % (vocab - 3);
  const Tensor<int64_t> src{{2, 9}, ids},
      tgt{{2, 9}, std::vector<int64_t>(ids.rbegin(), ids.rend())};
  const Tensor<float> want_dot = dot_only.forward(src, tgt), want_fma = fma_only.forward(src, tgt);
  ASSERT_NE(want_dot.data, want_fma.data) << "the two forms should round attention differently";
  testing::ScopedEnv products("KILN_BF16_PRODUCTS");
  for (const std::string form : {"dot", "fma", ""}) {
    SCOPED_TRACE("KILN_BF16_PRODUCTS=" + form);
    products.set(form);
    const std::string expected = form.empty() ? rt::bf16_products_for_this_cpu() : form;
    kiln_models::bf16auto_small model(weights.c_str());
    EXPECT_EQ(std::string(kiln_model_config(model.get(), "bf16_products")), expected);
    model.set_profiling(true);
    const Tensor<float> got = model.forward(src, tgt);
    EXPECT_EQ(got.shape, want_dot.shape);
    EXPECT_TRUE(got.data == (expected == "fma" ? want_fma.data : want_dot.data));
    const std::string profile = model.profile();
    EXPECT_EQ(profile.find("_bf16fma ") != std::string::npos, expected == "fma") << profile;
    EXPECT_EQ(profile.find("_bf16 ") != std::string::npos, expected == "dot") << profile;
  }
  products.set("amx");
  char* error = nullptr;
  kiln_model* refused = bf16auto_small_create(weights.c_str(), &error);
  EXPECT_EQ(refused, nullptr);
  ASSERT_NE(error, nullptr);
  EXPECT_THAT(std::string(error),
              ::testing::HasSubstr("KILN_BF16_PRODUCTS is 'amx': use dot or fma (or leave it "
                                   "unset to measure the CPU)"));
  kiln_free_error(error);
  // The single-form libraries name their form too.
  EXPECT_STREQ(kiln_model_config(dot_only.get(), "bf16_products"), "dot");
  EXPECT_STREQ(kiln_model_config(fma_only.get(), "bf16_products"), "fma");
}

// Forward and encode against the f32 interpreter on random ids, lengths `lengths`, batches
// 1 and 3, with padding, within G·2^-6 of the largest |value| (the bf16-rounding
// interpreter's distance printed beside, unless `skip_rounded`).
template <typename Model>
void expect_random(const std::string& label, const std::vector<std::string>& settings,
                   const std::string& config, uint32_t seed, bool bf16_file,
                   const std::vector<int64_t>& lengths, bool skip_rounded = false) {
  const testing::ModelFiles random =
      testing::random_model(config, settings, seed, label, bf16_file);
  const ir::Module& m = random.m;
  const ir::WeightMap& wm = random.w;
  Model model(random.path.c_str());
  for (const char* entry : {"forward", "encode"}) {
    const ir::Function& f = *m.find_function(entry);
    double worst = 0, largest = 0, rounded_worst = 0;
    std::vector<std::pair<std::vector<float>, std::vector<float>>> runs;  // got, f32
    for (int64_t batch : {1, 3})
      for (int64_t len : lengths) {
        std::map<std::string, int64_t> sizes = {{"B", batch}, {"S", len}, {"T", len}};
        auto inputs = testing::random_inputs(m, f, sizes, seed + static_cast<uint32_t>(len), true);
        std::vector<ir::Tensor> want = ir::interpret(m, f, wm, inputs);
        Tensor<int64_t> src{inputs[0].shape, inputs[0].ints};
        Tensor<float> got =
            f.name == "forward"
                ? model.forward(src, Tensor<int64_t>{inputs[1].shape, inputs[1].ints})
                : model.encode(src);
        ASSERT_EQ(got.shape, want[0].shape);
        worst = std::max(worst, max_abs_diff(got.data, want[0].f));
        largest = std::max(largest, max_abs(want[0].f));
        if (!skip_rounded)
          rounded_worst = std::max(
              rounded_worst,
              max_abs_diff(got.data,
                           testing::interpret_entry(m, entry, wm, inputs, bf16_rounding())[0].f));
      }
    const int gemms = bf16_products(m, entry);
    const double tolerance = gemms * kBf16PerGemm * largest;
    std::printf(
        "[ bf16 ] %s %s (%s checkpoint): vs f32 interpreter %.3g (tolerance %d bf16 products x "
        "2^-6 x "
        "%.3g = %.3g)",
        label.c_str(), entry, bf16_file ? "bf16" : "f32", worst, gemms, largest, tolerance);
    if (!skip_rounded) std::printf("; vs the bf16-rounding interpreter %.3g", rounded_worst);
    std::printf("\n");
    EXPECT_LE(worst, tolerance) << entry;
    EXPECT_GT(worst, 0) << "nothing was rounded to bf16";
  }
}

// Widths that are multiples of 64 (packed panels, no padding) beside d_ff 160 (padded to 192).
TEST(Bf16Random, WideModel) {
  expect_random<kiln_models::bf16_wide>(
      "wide",
      {"d_model=64", "heads=4", "d_ff=160", "tgt_vocab=128", "enc_layers=1", "dec_layers=1"},
      "tiny", 5, false, {1, 7, 33});
}

// Odd K (21, 13): the padding pair of K; a bf16 checkpoint loaded as it is.
TEST(Bf16Random, OddSizesFromABf16Checkpoint) {
  expect_random<kiln_models::bf16_odd>("odd", testing::kOddSettings, "tiny", 9, true, {1, 7, 12});
}

// The base model (d_model 512, d_ff 2048, vocabularies of 32000), random weights.
TEST(Bf16Random, BaseModel) {
  expect_random<kiln_models::bf16_base>("base", {"enc_layers=2", "dec_layers=2"}, "base", 3, false,
                                        {1, 7}, true);
}

// The shipped number translator: greedy ids of the bf16 library are those of the f32 one
// on the whole held-out set.
// decode_step_restricted with bf16 weights: linear_rows reads the generator's packed bf16
// weight with the library's form of the products (vdpbf16ps in bf16_tiny and bf16_odd, FMAs in
// bf16fma_odd), so its logits are, bit for bit, the full step's at its ids: few ids, every id
// shuffled, and as many random ids as the vocabulary (repeats; in the odd models' 150, three
// blocks of 64 columns, the last partly past R; K 21, the padding pair), over three steps with
// hypotheses moved between rows. The bf16-rounding interpreter's linear_rows likewise against
// its linear.
TEST(Bf16Restricted, StepGivesTheFullStepsLogitsAtItsIds) {
  const testing::ModelFiles tiny = testing::golden_model("tiny");
  kiln_models::bf16_tiny tiny_dot(tiny.path.c_str());
  const testing::ModelFiles odd =
      testing::random_model("tiny", testing::kOddSettings, 19, "bf16_odd_rows", true);
  kiln_models::bf16_odd odd_dot(odd.path.c_str());
  kiln_models::bf16fma_odd odd_fma(odd.path.c_str());

  struct Case {
    const char* name;
    const testing::ModelFiles* files;
    Model* model;
    bool fma;
  };
  for (const Case& c :
       {Case{"tiny, dot", &tiny, &tiny_dot, false}, Case{"odd, dot", &odd, &odd_dot, false},
        Case{"odd, fma", &odd, &odd_fma, true}}) {
    EXPECT_STREQ(kiln_model_config(c.model->get(), "bf16_products"), c.fma ? "fma" : "dot");
    const ir::Module& m = c.files->m;
    ir::InterpretOptions rounding = bf16_rounding();
    rounding.bf16_attention = !c.fma;
    const testing::Runner library =
        testing::compiled(*c.model, std::stoll(m.config.at("dec_layers")));
    const testing::Runner interpreter = [&](const std::string& fn,
                                            const std::vector<ir::Tensor>& in) {
      return testing::interpret_entry(m, fn, c.files->w, in, rounding);
    };
    testing::expect_restricted_steps_equal_full(
        m, {{"library", &library}, {"bf16 interpreter", &interpreter}}, "bf16", c.name);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(Bf16Numbers, GreedyIdsMatchF32) {
  const std::string weights = testing::numbers_file("numbers.weights.safetensors");
  const testing::HeldOut heldout = testing::numbers_heldout();
  ASSERT_GE(heldout.sources.size(), 100u);
  kiln_models::f32_numbers f32(weights.c_str());
  kiln_models::bf16_numbers bf16(weights.c_str());
  const int64_t max_batch = kiln_models::f32_numbers::max_B;
  const auto max_length = static_cast<int32_t>(kiln_models::f32_numbers::max_T);
  const auto a = testing::greedy_ids(f32, heldout, max_batch, max_length);
  const auto b = testing::greedy_ids(bf16, heldout, max_batch, max_length);
  ASSERT_EQ(a.size(), heldout.sources.size());
  ASSERT_EQ(b.size(), a.size());
  size_t same = 0, tokens = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    same += a[i] == b[i];
    tokens += a[i].size();
  }
  std::printf(
      "[ bf16 ] numbers: %zu of %zu held-out sentences with identical greedy ids (%zu "
      "tokens)\n",
      same, a.size(), tokens);
  EXPECT_EQ(same, a.size());
}

// Activations stored in bf16 (the default; LowerOptions::bf16_activations): where only bf16
// kernels read an activation (the FFN's hidden layer, attention's q, k, v and its output), the
// kernel that computes it writes it rounded to bf16 and its readers skip their own rounding.
// The numbers are the same as with every activation in f32 (the *_f32act libraries,
// BF16_ACTIVATIONS off), bit for bit: forward and encode of the golden tiny model (bf16
// attention: its q, k, v and output in bf16), of the odd model (odd K: the padding pair of a
// bf16 input; d_model 21, so attention stays f32 and only the FFN's hidden layer is bf16), in
// both forms of the products, and the number translator's greedy decoding (the decoder step's
// FFN). Each library's profile shows which kernels read or write bf16 (_xb, _ob, _b...).
template <typename On, typename Off>
void expect_same_numbers(const std::string& label, const std::string& weights,
                         const std::vector<std::pair<Tensor<int64_t>, Tensor<int64_t>>>& batches,
                         const std::vector<std::string>& bf16_kernels) {
  On on(weights.c_str());
  Off off(weights.c_str());
  on.set_profiling(true);
  off.set_profiling(true);
  size_t values = 0;
  for (const auto& [src, tgt] : batches) {
    const Tensor<float> a = on.forward(src, tgt), b = off.forward(src, tgt);
    ASSERT_EQ(a.shape, b.shape);
    EXPECT_TRUE(a.data == b.data) << label << " forward: max |diff| "
                                  << max_abs_diff(a.data, b.data);
    const Tensor<float> ea = on.encode(src), eb = off.encode(src);
    EXPECT_TRUE(ea.data == eb.data)
        << label << " encode: max |diff| " << max_abs_diff(ea.data, eb.data);
    values += a.data.size() + ea.data.size();
  }
  const std::string with = on.profile(), without = off.profile();
  for (const std::string& k : bf16_kernels) {
    EXPECT_NE(with.find(k + " "), std::string::npos) << k << " not in\n" << with;
    EXPECT_EQ(without.find(k + " "), std::string::npos) << k << " in\n" << without;
  }
  std::printf("[ bf16 ] %s: %zu outputs with bf16 activations equal to f32 activations'\n",
              label.c_str(), values);
}

TEST(Bf16Activations, SameNumbersAsF32Activations) {
  std::vector<std::pair<Tensor<int64_t>, Tensor<int64_t>>> golden;
  for (const char* batch : {"tiny_b1", "tiny_b2"}) {
    const std::string inputs = golden_file(std::string(batch) + ".inputs.safetensors");
    golden.emplace_back(kiln::read_tensor<int64_t>(inputs, "src"),
                        kiln::read_tensor<int64_t>(inputs, "tgt"));
  }
  // tiny: d_model 32 in 4 heads (dk 8): the merged QKV projection writes bf16 that attention
  // reads (self and cross), attention writes bf16 for the output projection, the FFN's first
  // linear for its second.
  expect_same_numbers<kiln_models::bf16_tiny, kiln_models::bf16_tiny_f32act>(
      "tiny", golden_file("tiny.weights.safetensors"), golden,
      {"_p64_bf16_ob", "_bf16_xb", "_bf16_bqkvo"});
  const testing::ModelFiles odd =
      testing::random_model("tiny", testing::kOddSettings, 11, "odd_activations", false);
  std::vector<std::pair<Tensor<int64_t>, Tensor<int64_t>>> ids;
  for (int64_t batch : {1, 3})
    for (int64_t len : {1, 7, 12}) {
      std::vector<int64_t> v(static_cast<size_t>(batch * len));
      for (size_t i = 0; i < v.size(); ++i) v[i] = 3 + static_cast<int64_t>(i * 5 + len) % 14;
      ids.emplace_back(Tensor<int64_t>{{batch, len}, v},
                       Tensor<int64_t>{{batch, len}, std::vector<int64_t>(v.rbegin(), v.rend())});
    }
  // Odd: linear names end in their K and N, so only the FFN's pair is matched (d_ff 13: the
  // second linear's odd K reads a bf16 input padded with a zero pair).
  expect_same_numbers<kiln_models::bf16_odd, kiln_models::bf16_odd_f32act>(
      "odd", odd.path, ids, {"_k21_n13_relu_p64_bf16_ob", "_k13_n21_p64_bf16_xb"});
  expect_same_numbers<kiln_models::bf16fma_odd, kiln_models::bf16fma_odd_f32act>(
      "odd, FMA form", odd.path, ids, {"_k21_n13_relu_p64_bf16fma_ob", "_k13_n21_p64_bf16fma_xb"});
  // numbers: N a multiple of 64 (192, 256, 64), where the linears round their bf16 output with
  // vcvtne2ps2bf16, and K >= 32, where the f32act readers round their input with it too.
  std::vector<std::pair<Tensor<int64_t>, Tensor<int64_t>>> numbers;
  for (int64_t batch : {1, 5})
    for (int64_t len : {3, 29}) {
      std::vector<int64_t> src(static_cast<size_t>(batch * len)), tgt(src.size());
      for (size_t i = 0; i < src.size(); ++i) {
        src[i] = 3 + static_cast<int64_t>(i * 7 + len) % 21;
        tgt[i] = 3 + static_cast<int64_t>(i * 5 + len) % 10;
      }
      numbers.emplace_back(Tensor<int64_t>{{batch, len}, src}, Tensor<int64_t>{{batch, len}, tgt});
    }
  expect_same_numbers<kiln_models::bf16_numbers, kiln_models::bf16_numbers_f32act>(
      "numbers", testing::numbers_file("numbers.weights.safetensors"), numbers,
      {"_k64_n192_p64_bf16_ob", "_k64_n256_relu_p64_bf16_ob", "_k256_n64_p64_bf16_xb",
       "_bf16_bqkvo"});
}

TEST(Bf16Activations, NumbersGreedyIdsAsF32Activations) {
  const std::string weights = testing::numbers_file("numbers.weights.safetensors");
  const testing::HeldOut heldout = testing::numbers_heldout();
  ASSERT_GE(heldout.sources.size(), 100u);
  kiln_models::bf16_numbers on(weights.c_str());
  kiln_models::bf16_numbers_f32act off(weights.c_str());
  on.set_profiling(true);
  off.set_profiling(true);
  const int64_t max_batch = kiln_models::bf16_numbers::max_B;
  const auto max_length = static_cast<int32_t>(kiln_models::bf16_numbers::max_T);
  const auto a = testing::greedy_ids(on, heldout, max_batch, max_length);
  const auto b = testing::greedy_ids(off, heldout, max_batch, max_length);
  ASSERT_EQ(a.size(), heldout.sources.size());
  EXPECT_TRUE(a == b);
  // The decoder step's FFN: its first linear writes bf16, its second reads it.
  const std::string with = on.profile(), without = off.profile();
  for (const char* k : {"_k64_n256_relu_p64_bf16_ob ", "_k256_n64_p64_bf16_xb "}) {
    EXPECT_NE(with.find(k), std::string::npos) << k << " not in\n" << with;
    EXPECT_EQ(without.find(k), std::string::npos) << k << " in\n" << without;
  }
  size_t tokens = 0;
  for (const auto& s : a) tokens += s.size();
  std::printf(
      "[ bf16 ] numbers: greedy ids with bf16 activations equal to f32 activations' (%zu "
      "sentences, %zu tokens)\n",
      a.size(), tokens);
}

}  // namespace
}  // namespace kiln
