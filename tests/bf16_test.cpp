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
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "bf16_base.h"
#include "bf16_linears.h"
#include "bf16_numbers.h"
#include "bf16_odd.h"
#include "bf16_small.h"
#include "bf16_tiny.h"
#include "bf16_wide.h"
#include "f32_numbers.h"
#include "frontend/models.h"
#include "ir/interpreter.h"
#include "kiln/vocab.h"
#include "noise.h"
#include "pass_harness.h"
#include "passes/pipeline.h"
#include "runtime/plan.h"
#include "runtime/safetensors.h"
#include "tools/bridge.h"

namespace kiln {
namespace {

constexpr double kBf16PerGemm = 0x1p-6;  // 4 × 2^-8: a GEMM output moves by up to 2^-8 of Σ|x·w|

int linear_ops(const ir::Module& m, const std::string& entry) {
  int n = 0;
  for (const ir::Op& op : m.find_function(entry)->ops) n += op.kind == ir::OpKind::linear;
  return n;
}

std::string golden(const std::string& f) {
  return std::string(KILN_TEST_DATA_DIR) + "/golden/" + f;
}

// The module as the library was built from it: the default pipeline's output.
ir::Module optimized(const std::string& config, const std::vector<std::string>& settings = {}) {
  ir::Module m = models::build_model("transformer", config, settings);
  passes::run_passes(m, passes::default_pipeline());
  return m;
}

std::vector<ir::Tensor> run_bf16_reference(const ir::Module& m, const std::string& entry,
                                           const ir::WeightMap& weights,
                                           const std::vector<ir::Tensor>& inputs) {
  ir::InterpretOptions options;
  options.bf16_linear = true;
  return ir::interpret(m, *m.find_function(entry), weights, inputs, options);
}

double max_diff(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double err = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i)
    err = std::max(err, std::abs(static_cast<double>(got[i]) - want[i]));
  return err;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::abs(static_cast<double>(x)));
  return m;
}

// A golden batch through the bf16 library against PyTorch's f32 logits, within G·2^-6 of
// the largest |logit|; the distance to the bf16-rounding interpreter is printed.
template <typename Model>
void expect_golden(Model& model, const std::string& config, const std::string& batch) {
  const ir::Module m = optimized(config);
  rt::SafeTensors weights = rt::SafeTensors::load(golden(config + ".weights.safetensors"));
  ir::WeightMap wm = tools::load_weight_map(m, weights);
  ir::materialize_weights(m, wm);
  auto src = read_tensor<int64_t>(golden(batch + ".inputs.safetensors"), "src");
  auto tgt = read_tensor<int64_t>(golden(batch + ".inputs.safetensors"), "tgt");
  auto logits = read_tensor<float>(golden(batch + ".expected.safetensors"), "logits");
  const std::vector<ir::Tensor> rounded =
      run_bf16_reference(m, "forward", wm,
                         {ir::Tensor::from_ints(ir::DType::i64, src.shape, src.data),
                          ir::Tensor::from_ints(ir::DType::i64, tgt.shape, tgt.data)});
  const Tensor<float> got = model.forward(src, tgt);
  ASSERT_EQ(got.shape, logits.shape);
  const int gemms = linear_ops(m, "forward");
  const double tolerance = gemms * kBf16PerGemm * max_abs(logits.data);
  const double vs_f32 = max_diff(got.data, logits.data);
  std::printf(
      "[ bf16 ] %s: vs PyTorch f32 %.3g (tolerance %d GEMMs x 2^-6 x %.3g = %.3g); the "
      "bf16-rounding interpreter vs f32 %.3g, vs the library %.3g\n",
      batch.c_str(), vs_f32, gemms, max_abs(logits.data), tolerance,
      max_diff(rounded[0].f, logits.data), max_diff(got.data, rounded[0].f));
  EXPECT_LE(vs_f32, tolerance);
  EXPECT_GT(vs_f32, 0) << "nothing was rounded to bf16";
}

// Each kernel alone (tests/abi/linears.kir: N below, at and above multiples of 64, odd and
// even K, ReLU, no bias) against a double-precision sum over the bf16-rounded x and W: the
// inputs are the same on both sides, so only the f32 summation differs, by at most
// (K + 4)·2^-24·(Σ_k |x̂_k·ŵ_k| + |b|) (the f32 kernels' bound, linear_kernel_test.cpp).
TEST(Bf16Kernels, MatchADoubleSumOfRoundedInputs) {
  struct Case {
    int64_t K, N;
    bool relu, bias;
  };
  const std::vector<Case> cases = {{1, 17, false, true},    {7, 5, true, false},
                                   {20, 36, true, true},    {21, 29, false, true},
                                   {64, 64, false, true},   {64, 200, true, true},
                                   {33, 1, false, true},    {512, 512, false, true},
                                   {512, 130, true, false}, {2048, 128, false, true}};
  std::vector<rt::TensorData> tensors;
  std::map<std::string, std::vector<float>> w, b;
  uint32_t seed = 1;
  for (const Case& c : cases) {
    const std::string name = "k" + std::to_string(c.K) + "_n" + std::to_string(c.N);
    w[name] = testing::noise(static_cast<size_t>(c.N * c.K), seed++);
    tensors.push_back(rt::make_f32("w_" + name, {c.N, c.K}, w[name]));
    if (c.bias) {
      b[name] = testing::noise(static_cast<size_t>(c.N), seed++);
      tensors.push_back(rt::make_f32("b_" + name, {c.N}, b[name]));
    }
  }
  const std::string path = ::testing::TempDir() + "bf16_linears.safetensors";
  rt::write_safetensors(path, tensors);
  char* error = nullptr;
  std::unique_ptr<kiln_model, void (*)(kiln_model*)> model(
      bf16_linears_create(path.c_str(), &error), kiln_model_destroy);
  ASSERT_TRUE(model) << error;
  auto round = [](float v) { return rt::bf16_to_f32(rt::f32_to_bf16(v)); };
  int checked = 0;
  for (const Case& c : cases) {
    const std::string name = "k" + std::to_string(c.K) + "_n" + std::to_string(c.N);
    std::vector<float> wr(w[name].size());
    std::transform(w[name].begin(), w[name].end(), wr.begin(), round);
    for (int64_t M : {1, 2, 3, 4, 5, 7, 33, 63, 64, 129, 200}) {
      SCOPED_TRACE(name + " M=" + std::to_string(M));
      std::vector<float> x = testing::noise(static_cast<size_t>(M * c.K), seed++);
      std::vector<float> xr(x.size());
      std::transform(x.begin(), x.end(), xr.begin(), round);
      std::vector<float> y(static_cast<size_t>(M * c.N), NAN);
      kiln_tensor in{}, out{};
      in.name = "x";
      in.dtype = KILN_F32;
      in.rank = 2;
      in.shape[0] = M;
      in.shape[1] = c.K;
      in.data = x.data();
      in.capacity = x.size() * 4;
      out.dtype = KILN_F32;
      out.rank = 2;
      out.shape[0] = M;
      out.shape[1] = c.N;
      out.data = y.data();
      out.capacity = y.size() * 4;
      ASSERT_EQ(kiln_model_run(model.get(), name.c_str(), &in, 1, &out, 1), 0)
          << kiln_model_error(model.get());
      int failures = 0;
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < c.N; ++n) {
          double sum = 0, magnitude = c.bias ? std::abs(b[name][n]) : 0.0;
          for (int64_t k = 0; k < c.K; ++k) {
            const double p = static_cast<double>(xr[m * c.K + k]) * wr[n * c.K + k];
            sum += p;
            magnitude += std::abs(p);
          }
          float want = static_cast<float>(sum);
          if (c.bias) want += b[name][n];
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
  std::printf("[ bf16 ] %d kernel outputs within the f32 summation bound\n", checked);
}

TEST(Bf16Golden, TinyMatchesTheBf16Reference) {
  kiln_models::bf16_tiny model(golden("tiny.weights.safetensors").c_str());
  expect_golden(model, "tiny", "tiny_b1");
  expect_golden(model, "tiny", "tiny_b2");
}

TEST(Bf16Golden, SmallMatchesTheBf16Reference) {
  kiln_models::bf16_small model(golden("small.weights.safetensors").c_str());
  expect_golden(model, "small", "small_b1");
}

// Random weights written as a safetensors file (f32, or bf16 with `as_bf16`: a bf16
// checkpoint loads as it is, and then the rounding of the weights is exact).
std::string write_random_weights(const ir::Module& m, ir::WeightMap& wm, const std::string& name,
                                 bool as_bf16) {
  std::vector<rt::TensorData> tensors;
  for (const ir::Weight& w : m.weights) {
    if (w.derivation) continue;
    ir::Tensor& t = wm.at(w.name);
    if (as_bf16) {
      rt::TensorData d;
      d.name = w.name;
      d.dtype = rt::DType::bf16;
      d.shape = t.shape;
      d.data.resize(t.f.size() * 2);
      for (size_t i = 0; i < t.f.size(); ++i) {
        const uint16_t b = rt::f32_to_bf16(t.f[i]);
        t.f[i] = rt::bf16_to_f32(b);  // the interpreter sees what the file holds
        std::memcpy(d.data.data() + 2 * i, &b, 2);
      }
      tensors.push_back(std::move(d));
    } else {
      tensors.push_back(rt::make_f32(w.name, t.shape, t.f));
    }
  }
  const std::string path = ::testing::TempDir() + name + ".safetensors";
  rt::write_safetensors(path, tensors);
  return path;
}

// Forward and encode against the f32 interpreter on random ids, lengths `lengths`, batches
// 1 and 3, with padding, within G·2^-6 of the largest |value| (the bf16-rounding
// interpreter's distance printed beside, unless `skip_rounded`).
template <typename Model>
void expect_random(const std::string& label, const std::vector<std::string>& settings,
                   const std::string& config, uint32_t seed, bool bf16_file,
                   const std::vector<int64_t>& lengths, bool skip_rounded = false) {
  ir::Module m = optimized(config, settings);
  ir::Module plain = models::build_model("transformer", config, settings);
  ir::WeightMap wm = testing::random_weights(plain, seed);
  const std::string path = write_random_weights(plain, wm, label, bf16_file);
  ir::materialize_weights(m, wm);
  Model model(path.c_str());
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
        worst = std::max(worst, max_diff(got.data, want[0].f));
        largest = std::max(largest, max_abs(want[0].f));
        if (!skip_rounded)
          rounded_worst = std::max(
              rounded_worst, max_diff(got.data, run_bf16_reference(m, entry, wm, inputs)[0].f));
      }
    const int gemms = linear_ops(m, entry);
    const double tolerance = gemms * kBf16PerGemm * largest;
    std::printf(
        "[ bf16 ] %s %s (%s checkpoint): vs f32 interpreter %.3g (tolerance %d GEMMs x 2^-6 x "
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
  expect_random<kiln_models::bf16_odd>(
      "odd",
      {"d_model=21", "heads=3", "d_ff=13", "src_vocab=17", "tgt_vocab=19", "enc_layers=1",
       "dec_layers=2", "pad_id=2", "max_len=12", "max_batch=3"},
      "tiny", 9, true, {1, 7, 12});
}

// The base model (d_model 512, d_ff 2048, vocabularies of 32000), random weights.
TEST(Bf16Random, BaseModel) {
  expect_random<kiln_models::bf16_base>("base", {"enc_layers=2", "dec_layers=2"}, "base", 3, false,
                                        {1, 7}, true);
}

// The shipped number translator: greedy ids of the bf16 library are those of the f32 one
// on the whole held-out set.
TEST(Bf16Numbers, GreedyIdsMatchF32) {
  const std::string dir = std::string(KILN_TEST_DATA_DIR) + "/../examples/numbers/";
  const std::string weights = dir + "numbers.weights.safetensors";
  const Vocabulary src_vocab = Vocabulary::load(dir + "vocab.src.txt");
  kiln_models::f32_numbers f32(weights.c_str());
  kiln_models::bf16_numbers bf16(weights.c_str());
  std::ifstream in(dir + "heldout.tsv");
  std::vector<std::vector<int64_t>> sentences;
  for (std::string line; std::getline(in, line);)
    sentences.push_back(src_vocab.encode(line.substr(0, line.find('\t'))));
  ASSERT_GE(sentences.size(), 100u);
  const int64_t pad = src_vocab.id("<pad>");
  SearchOptions options;
  options.max_decoding_length = static_cast<int32_t>(kiln_models::f32_numbers::max_T);
  size_t same = 0, tokens = 0;
  const size_t per = static_cast<size_t>(kiln_models::f32_numbers::max_B);
  for (size_t first = 0; first < sentences.size(); first += per) {
    const size_t n = std::min(per, sentences.size() - first);
    size_t length = 1;
    for (size_t i = 0; i < n; ++i) length = std::max(length, sentences[first + i].size());
    Tensor<int64_t> src{{static_cast<int64_t>(n), static_cast<int64_t>(length)},
                        std::vector<int64_t>(n * length, pad)};
    for (size_t i = 0; i < n; ++i)
      std::copy(sentences[first + i].begin(), sentences[first + i].end(),
                src.data.begin() + static_cast<int64_t>(i * length));
    auto a = f32.generate(src, options), b = bf16.generate(src, options);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      same += a[i][0].ids == b[i][0].ids;
      tokens += a[i][0].ids.size();
    }
  }
  std::printf(
      "[ bf16 ] numbers: %zu of %zu held-out sentences with identical greedy ids (%zu "
      "tokens)\n",
      same, sentences.size(), tokens);
  EXPECT_EQ(same, sentences.size());
}

}  // namespace
}  // namespace kiln
