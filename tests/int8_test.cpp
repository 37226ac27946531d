// Models compiled with `kiln compile --weights int8` (kiln_add_model ... WEIGHTS int8).
//
// What int8 changes. Every linear with a load-time weight quantizes its weight per output row
// and each row of its input at run time (support/int8.h: q = round(v · 127 / max|row|), scale
// max|row| / 127), sums q_x · q_w exactly in int32 and scales back in f32. The kernels are
// checked tightly: each int8 linear alone against a double sum over the same quantized inputs
// (the dequantized values), within the f32 bound of the scaling (Int8Kernels), and the
// interpreter's int8_linear gives the same numbers.
//
// The models' bound, derived. Quantizing a row moves each element by at most half a step,
// max|row| / 254, so one output of a linear moves by at most
//   (max|x| · Σ_k |w_k| + max|w| · Σ_k |x_k|) / 254 + K · max|x| · max|w| / 254²,
// which for rows of comparable magnitudes is about 2/254 ≈ 2^-7 of K · max|x| · max|w|, the
// largest value the output could take. Real rows are far from that worst case (errors of
// random sign add as √K, and an output is rarely near K · max|x| · max|w|), and LayerNorm
// re-scales after each sublayer; a chain of G linears then moves the logits by about
// G · 2^-7 of the largest |logit| at worst. The acceptance caps the bound at 2% of
// the logits' range, which is the tighter of the two for every model here (G ≥ 13), so that
// is what the tests assert (kInt8OfRange); every measured error is printed beside it, and
// the distance to the int8-quantizing interpreter is printed (not asserted: an input within
// an f32 ulp of a quantization boundary may round the other way in the kernel, a step that
// later layers carry on).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "f32_numbers.h"
#include "frontend/models.h"
#include "int8_linears.h"
#include "int8_numbers.h"
#include "int8_odd.h"
#include "int8_small.h"
#include "int8_tiny.h"
#include "ir/interpreter.h"
#include "ir/parser.h"
#include "kiln/vocab.h"
#include "noise.h"
#include "packed_weights.h"
#include "pass_harness.h"
#include "runtime/bf16_products.h"
#include "runtime/cpu_features.h"
#include "runtime/plan.h"
#include "runtime/safetensors.h"
#include "scoped_env.h"
#include "step_runner.h"
#include "support/int8.h"
#include "tools/bridge.h"

namespace kiln {
namespace {

constexpr double kInt8OfRange = 0.02;  // the models' bound: 2% of the logits' range

using testing::golden_file;
using testing::max_abs_diff;
using testing::optimized_transformer;

// The interpreter with every linear quantized as the library quantizes it, and attention
// rounded to bf16 where the library runs it so (bf16_attention; its config key bf16_products
// names the form it runs: libraries compiled with the default --bf16-products auto hold both).
ir::InterpretOptions int8_rounding(bool bf16_attention = false) {
  ir::InterpretOptions options;
  options.int8_linear = true;
  options.bf16_attention = bf16_attention;
  return options;
}
bool runs_bf16_attention(kiln_model* model) {
  return std::string(kiln_model_config(model, "bf16_products")) == "dot";
}

double range_of(const std::vector<float>& v) {
  if (v.empty()) return 0;
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return static_cast<double>(*hi) - *lo;
}

// A weight row quantized as the kernels do it, dequantized: s · q per element.
std::vector<double> dequantized_weight(const float* v, int64_t n) {
  const float absmax = int8::absmax(v, n), inverse = int8::inverse_scale(absmax);
  const double s = int8::scale(absmax);
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = s * int8::quantize(v[i], inverse);
  return out;
}

// An input row quantized as the kernels do it (u8 with a zero point), dequantized: s · (u − z).
std::vector<double> dequantized_input(const float* v, int64_t n) {
  const int8::InputRow q = int8::input_row(v, n);
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    out[static_cast<size_t>(i)] =
        static_cast<double>(q.step) * (int8::quantize_input(v[i], q) - static_cast<double>(q.zero));
  return out;
}

// The kernels of tests/abi/linears.kir: among them K not a multiple of 4 (1, 7, 21, 33) and a
// long reduction (2048).
using testing::LinearCase;
using testing::linears_cases;

// Each kernel alone against a double-precision sum over the dequantized x and W (the same
// quantized values on both sides: the int32 sum is exact, only its conversion and the two
// scale products round, each by 2^-24 relative), within 4 · 2^-24 · (Σ_k |x̂_k · ŵ_k| + |b|);
// and the interpreter's int8_linear on the same inputs within the same bound. Rows of x are
// of different magnitudes (scales), one of them all zero.
TEST(Int8Kernels, MatchADoubleSumOfQuantizedInputs) {
  uint32_t seed = 1;
  const testing::LinearsCheckpoint ck =
      testing::write_linears_noise("int8_linears.safetensors", seed);
  char* error = nullptr;
  std::unique_ptr<kiln_model, void (*)(kiln_model*)> model(
      int8_linears_create(ck.path.c_str(), &error), kiln_model_destroy);
  ASSERT_TRUE(model) << error;
  const ir::Module m = testing::linears_module();
  const ir::InterpretOptions options = int8_rounding();
  int checked = 0;
  for (const LinearCase& c : linears_cases()) {
    const std::string name = c.name();
    std::vector<std::vector<double>> wq;
    for (int64_t n = 0; n < c.N; ++n)
      wq.push_back(dequantized_weight(&ck.w.at(name)[n * c.K], c.K));
    for (int64_t M : testing::linears_rows(c.K)) {
      SCOPED_TRACE(name + " M=" + std::to_string(M));
      std::vector<float> x = testing::noise(static_cast<size_t>(M * c.K), seed++);
      // Row scales from 2^-6 to 2^6; rows of one sign (as after a ReLU: every 4th row from
      // row 1) and shifted ones (from row 3), whose zero point is not the middle; row 2 all zero.
      for (int64_t r = 0; r < M; ++r)
        for (int64_t k = 0; k < c.K; ++k) {
          float& v = x[r * c.K + k];
          if (r % 4 == 1) v = std::abs(v);
          if (r % 4 == 3) v += 0.75f;
          v *= r == 2 ? 0.0f : std::ldexp(1.0f, static_cast<int>(r % 13) - 6);
        }
      std::vector<float> y;
      ASSERT_EQ(testing::run_linear(model.get(), name, x, M, c.K, c.N, y), 0)
          << kiln_model_error(model.get());
      const std::vector<ir::Tensor> interpreted = ir::interpret(
          m, *m.find_function(name), ck.weights, {ir::Tensor::from_f32({M, c.K}, x)}, options);
      int failures = 0;
      for (int64_t r = 0; r < M; ++r) {
        const std::vector<double> xq = dequantized_input(&x[r * c.K], c.K);
        for (int64_t n = 0; n < c.N; ++n) {
          double sum = 0, magnitude = c.bias ? std::abs(ck.b.at(name)[n]) : 0.0;
          for (int64_t k = 0; k < c.K; ++k) {
            const double p = xq[static_cast<size_t>(k)] * wq[static_cast<size_t>(n)][k];
            sum += p;
            magnitude += std::abs(p);
          }
          double want = sum + (c.bias ? ck.b.at(name)[n] : 0.0);
          if (c.relu) want = std::max(want, 0.0);
          const double tolerance = 4 * 0x1p-24 * magnitude;
          for (const float got : {y[r * c.N + n], interpreted[0].f[r * c.N + n]})
            if (!(std::abs(static_cast<double>(got) - want) <= tolerance) && ++failures <= 5)
              ADD_FAILURE() << "out[" << r << "," << n << "] = " << got << " (library "
                            << y[r * c.N + n] << ", interpreter " << interpreted[0].f[r * c.N + n]
                            << "), want " << want << " ± " << tolerance;
          if (r == 2 && y[r * c.N + n] != static_cast<float>(c.relu ? std::max(want, 0.0) : want))
            ADD_FAILURE() << "a zero row gives its bias exactly: out[2," << n
                          << "] = " << y[r * c.N + n];
          ++checked;
        }
      }
      ASSERT_EQ(failures, 0);
    }
  }
  std::printf("[ int8 ] %d kernel outputs (and the interpreter's) within 4 f32 roundings\n",
              checked);
}

// A NaN or an infinity in a row of the input makes that row's outputs NaN (support/int8.h:
// its step is NaN), in the library and in the interpreter, where the row's range alone would
// drop a NaN and give finite numbers; the other rows are the numbers they are without it.
TEST(Int8Kernels, NonFiniteInputRowGivesNanOutputs) {
  uint32_t seed = 7;
  const testing::LinearsCheckpoint ck =
      testing::write_linears_noise("int8_linears_nan.safetensors", seed);
  char* error = nullptr;
  std::unique_ptr<kiln_model, void (*)(kiln_model*)> model(
      int8_linears_create(ck.path.c_str(), &error), kiln_model_destroy);
  ASSERT_TRUE(model) << error;
  const ir::Module m = testing::linears_module();
  for (const LinearCase& c : linears_cases()) {
    const std::string name = c.name();
    for (int64_t M : {3, 33}) {
      for (int64_t at : {int64_t{0}, c.K / 2, c.K - 1})
        for (float bad : {NAN, INFINITY, -INFINITY}) {
          SCOPED_TRACE(name + " M=" + std::to_string(M) + " " + std::to_string(bad) +
                       " at column " + std::to_string(at));
          std::vector<float> x = testing::noise(static_cast<size_t>(M * c.K), seed++);
          std::vector<float> clean_y, y;
          ASSERT_EQ(testing::run_linear(model.get(), name, x, M, c.K, c.N, clean_y), 0);
          x[static_cast<size_t>(c.K + at)] = bad;  // row 1
          ASSERT_EQ(testing::run_linear(model.get(), name, x, M, c.K, c.N, y), 0);
          const std::vector<ir::Tensor> interpreted =
              ir::interpret(m, *m.find_function(name), ck.weights,
                            {ir::Tensor::from_f32({M, c.K}, x)}, int8_rounding());
          for (int64_t r = 0; r < M; ++r)
            for (int64_t n = 0; n < c.N; ++n) {
              const size_t i = static_cast<size_t>(r * c.N + n);
              if (r == 1) {  // NaN (ReLU may turn it into 0, as for f32)
                ASSERT_TRUE(std::isnan(y[i]) || (c.relu && y[i] == 0.0f))
                    << "out[1," << n << "] = " << y[i];
                ASSERT_TRUE(std::isnan(interpreted[0].f[i]) ||
                            (c.relu && interpreted[0].f[i] == 0.0f))
                    << "interpreter out[1," << n << "] = " << interpreted[0].f[i];
              } else {
                ASSERT_EQ(y[i], clean_y[i]) << "out[" << r << "," << n << "]";
              }
            }
        }
    }
  }
}

// A weight row with a NaN or an infinity cannot be quantized (its largest magnitude is the
// scale): loading refuses it, naming the weight and the row.
TEST(Int8Kernels, NonFiniteWeightsAreRefusedAtLoad) {
  std::vector<rt::TensorData> tensors;
  for (const LinearCase& c : linears_cases()) {
    std::vector<float> v = testing::noise(static_cast<size_t>(c.N * c.K), 3);
    if (c.name() == "k20_n36") v[5 * 20 + 7] = INFINITY;
    tensors.push_back(rt::make_f32("w_" + c.name(), {c.N, c.K}, v));
    if (c.bias)
      tensors.push_back(rt::make_f32("b_" + c.name(), {c.N}, std::vector<float>(c.N, 0.f)));
  }
  const std::string path = ::testing::TempDir() + "int8_infinite.safetensors";
  rt::write_safetensors(path, tensors);
  char* error = nullptr;
  kiln_model* model = int8_linears_create(path.c_str(), &error);
  EXPECT_EQ(model, nullptr);
  ASSERT_NE(error, nullptr);
  const std::string message = error;
  kiln_free_error(error);
  EXPECT_NE(message.find("weight 'w_k20_n36'"), std::string::npos) << message;
  EXPECT_NE(message.find("row 5 has a value that is not finite"), std::string::npos) << message;
}

// A golden batch through the int8 library against PyTorch's f32 logits, within 2% of their
// range; the distance to the int8-quantizing interpreter is printed.
template <typename Model>
void expect_golden(Model& model, const std::string& config, const std::string& batch,
                   std::vector<float>* logits = nullptr) {
  const ir::InterpretOptions options = int8_rounding(runs_bf16_attention(model.get()));
  const testing::GoldenForward g = testing::golden_forward(model, config, batch, options);
  ASSERT_EQ(g.got.shape, g.pytorch.shape);
  const double range = range_of(g.pytorch.data), tolerance = kInt8OfRange * range;
  const double vs_f32 = max_abs_diff(g.got.data, g.pytorch.data);
  std::printf(
      "[ int8 ] %s: vs PyTorch f32 %.3g = %.2f%% of the logits' range %.3g (tolerance 2%% = "
      "%.3g); the int8 interpreter vs f32 %.3g, vs the library %.3g\n",
      batch.c_str(), vs_f32, 100 * vs_f32 / range, range, tolerance,
      max_abs_diff(g.interpreted, g.pytorch.data), max_abs_diff(g.got.data, g.interpreted));
  EXPECT_LE(vs_f32, tolerance);
  EXPECT_GT(vs_f32, 0) << "nothing was quantized";
  if (logits) *logits = g.got.data;
}

TEST(Int8Golden, TinyWithinTwoPercentOfTheRange) {
  kiln_models::int8_tiny model(golden_file("tiny.weights.safetensors").c_str());
  expect_golden(model, "tiny", "tiny_b1");
  expect_golden(model, "tiny", "tiny_b2");
}

TEST(Int8Golden, SmallWithinTwoPercentOfTheRange) {
  kiln_models::int8_small model(golden_file("small.weights.safetensors").c_str());
  expect_golden(model, "small", "small_b1");
}

// Attention in an int8 library (compiled with the default --bf16-products auto): both forms, its
// two products in bf16 (vdpbf16ps) or in f32, the linears int8 in both; the runtime runs the one
// chosen when the model is created (KILN_BF16_PRODUCTS where set, else bf16 where the CPU has
// AVX512-BF16 and does more products per ns with it than with FMAs; without AVX512-BF16 always
// f32, and dot is refused there: runtime/bf16_products.h). Each form: the config names it, the
// profile shows its attention kernel, the logits within the models' bound of PyTorch's; the two
// forms' logits differ (attention's rounding).
TEST(Int8Auto, AttentionRunsInTheFormChosenAtLoad) {
  const std::string weights = golden_file("small.weights.safetensors");
  testing::ScopedEnv products("KILN_BF16_PRODUCTS");
  std::map<std::string, std::vector<float>> logits;
  for (const std::string form : {"dot", "fma", ""}) {
    SCOPED_TRACE("KILN_BF16_PRODUCTS=" + form);
    products.set(form);
    const std::string expected = form.empty() ? rt::bf16_products_for_this_cpu() : form;
    if (expected == "dot" && !rt::missing_cpu_features("x86-64-linux-avx512_bf16").empty()) {
      char* error = nullptr;
      EXPECT_EQ(int8_small_create(weights.c_str(), &error), nullptr);
      kiln_free_error(error);
      continue;
    }
    kiln_models::int8_small model(weights.c_str());
    EXPECT_EQ(std::string(kiln_model_config(model.get(), "bf16_products")), expected);
    model.set_profiling(true);
    expect_golden(model, "small", "small_b1", &logits[form]);
    const std::string profile = model.profile();
    EXPECT_NE(profile.find("_int8 "), std::string::npos) << profile;
    EXPECT_EQ(profile.find("_bf16 ") != std::string::npos, expected == "dot") << profile;
    if (form.empty()) EXPECT_TRUE(logits[form] == logits[expected]) << "auto ran " << expected;
  }
  if (logits.count("dot") && logits.count("fma"))
    EXPECT_NE(logits["dot"], logits["fma"]) << "the two forms should round attention differently";
  // Where neither the rates nor the variable can pick dot: a CPU without AVX512-BF16.
  EXPECT_STREQ(rt::choose_bf16_products(rt::Bf16ProductRates{}), "fma");
  EXPECT_STREQ(rt::choose_bf16_products(rt::Bf16ProductRates{250, 130}), "dot");
  EXPECT_STREQ(rt::choose_bf16_products(rt::Bf16ProductRates{110, 130}), "fma");
}

// The odd model with random weights (seed), written as a bf16 checkpoint named `file`.
testing::ModelFiles odd_model(uint32_t seed, const std::string& file) {
  return testing::random_model("tiny", testing::kOddSettings, seed, file, true);
}

// Odd sizes (d_model 21, d_ff 13, tgt_vocab 150: K and N not multiples of 4 or 64), forward and
// encode on random ids with padding, from a bf16 checkpoint, against the f32 interpreter within 2%
// of the outputs' range.
TEST(Int8Random, OddSizesFromABf16Checkpoint) {
  const testing::ModelFiles odd = odd_model(9, "int8_odd");
  const ir::Module& m = odd.m;
  const ir::WeightMap& wm = odd.w;
  kiln_models::int8_odd model(odd.path.c_str());
  for (const char* entry : {"forward", "encode"}) {
    const ir::Function& f = *m.find_function(entry);
    double worst = 0, range = 0, quantized_worst = 0;
    for (int64_t batch : {1, 3})
      for (int64_t len : {1, 7, 12}) {
        std::map<std::string, int64_t> sizes = {{"B", batch}, {"S", len}, {"T", len}};
        auto inputs = testing::random_inputs(m, f, sizes, 9 + static_cast<uint32_t>(len), true);
        std::vector<ir::Tensor> want = ir::interpret(m, f, wm, inputs);
        Tensor<int64_t> src{inputs[0].shape, inputs[0].ints};
        Tensor<float> got =
            f.name == "forward"
                ? model.forward(src, Tensor<int64_t>{inputs[1].shape, inputs[1].ints})
                : model.encode(src);
        ASSERT_EQ(got.shape, want[0].shape);
        worst = std::max(worst, max_abs_diff(got.data, want[0].f));
        range = std::max(range, range_of(want[0].f));
        quantized_worst =
            std::max(quantized_worst,
                     max_abs_diff(got.data, testing::interpret_entry(
                                                m, entry, wm, inputs,
                                                int8_rounding(runs_bf16_attention(model.get())))[0]
                                                .f));
      }
    std::printf(
        "[ int8 ] odd %s (bf16 checkpoint): vs the f32 interpreter %.3g (tolerance 2%% of %.3g "
        "= %.3g); vs the int8 interpreter %.3g\n",
        entry, worst, range, kInt8OfRange * range, quantized_worst);
    EXPECT_LE(worst, kInt8OfRange * range) << entry;
    EXPECT_GT(worst, 0) << "nothing was quantized";
  }
}

// decode_step_restricted with int8 weights: linear_rows reads the generator's packed int8
// weight, so its logits are, bit for bit, the full step's int8 logits at its ids (the same
// quantized rows, the same int32 sums, scaled in the same order): few ids (fewer than a block
// of 64 columns), every id shuffled, and as many random ids as the vocabulary (repeats; in the
// odd model's 150, three blocks of columns, the last one partly past R), over three steps with
// hypotheses moved between rows.
// The int8 interpreter's linear_rows likewise against its linear.
TEST(Int8Restricted, StepGivesTheFullStepsLogitsAtItsIds) {
  const testing::ModelFiles tiny = testing::golden_model("tiny");
  kiln_models::int8_tiny tiny_library(tiny.path.c_str());
  const testing::ModelFiles odd = odd_model(19, "int8_odd_rows");
  kiln_models::int8_odd odd_library(odd.path.c_str());

  const std::vector<std::tuple<const char*, const ir::Module*, const ir::WeightMap*, Model*>>
      cases = {{"tiny", &tiny.m, &tiny.w, &tiny_library}, {"odd", &odd.m, &odd.w, &odd_library}};
  for (const auto& [name, m, w, model] : cases) {
    const testing::Runner library =
        testing::compiled(*model, std::stoll(m->config.at("dec_layers")));
    const testing::Runner interpreter = [&](const std::string& fn,
                                            const std::vector<ir::Tensor>& in) {
      return testing::interpret_entry(*m, fn, *w, in, int8_rounding());
    };
    testing::expect_restricted_steps_equal_full(
        *m, {{"library", &library}, {"int8 interpreter", &interpreter}}, "int8", name);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// The shipped number translator through int8: exact match on the held-out set (at least
// 99%), and how many sentences' greedy ids differ from the f32 library's.
TEST(Int8Numbers, HeldOutExactMatchAndIdsAgainstF32) {
  const std::string weights = testing::numbers_file("numbers.weights.safetensors");
  const Vocabulary tgt_vocab = Vocabulary::load(testing::numbers_file("vocab.tgt.txt"));
  const testing::HeldOut heldout = testing::numbers_heldout();
  ASSERT_GE(heldout.sources.size(), 100u);
  kiln_models::f32_numbers f32(weights.c_str());
  kiln_models::int8_numbers int8(weights.c_str());
  const int64_t max_batch = kiln_models::f32_numbers::max_B;
  const auto max_length = static_cast<int32_t>(kiln_models::f32_numbers::max_T);
  const auto a = testing::greedy_ids(f32, heldout, max_batch, max_length);
  const auto q = testing::greedy_ids(int8, heldout, max_batch, max_length);
  ASSERT_EQ(a.size(), heldout.sources.size());
  ASSERT_EQ(q.size(), heldout.sources.size());
  size_t correct = 0, correct_f32 = 0, same_ids = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    same_ids += a[i] == q[i];
    correct += tgt_vocab.decode(q[i]) == heldout.targets[i];
    correct_f32 += tgt_vocab.decode(a[i]) == heldout.targets[i];
  }
  std::printf(
      "[ int8 ] numbers: held-out exact match %zu of %zu through int8 (f32: %zu); %zu "
      "sentences' greedy ids differ from f32's\n",
      correct, q.size(), correct_f32, q.size() - same_ids);
  EXPECT_GE(correct * 100, q.size() * 99);
}

}  // namespace
}  // namespace kiln
