// GPU kernels against the reference interpreter, one suite over the device APIs kiln targets:
// Gpu/DeviceTest.*/<API> runs the entry points of tests/gpu/*.kir compiled for host-opencl (the
// gpu_* libraries: OpenCL, on pocl's CPU device in the suite) and for
// host-cuda-cuda_capability_86 (the cuda_* libraries: PTX for sm_86, the highest capability
// Halide 14 accepts, which the driver JIT-compiles for newer GPUs) on random inputs of odd sizes,
// and the residency of weights and arenas on the device. Without the API's device each of its
// tests skips, saying why ("no OpenCL device"; "skipped: no CUDA driver (the CUDA build runs on
// a GPU)"): GTEST_SKIP, which ctest reports as skipped, not passed. Beside the suite, each API's
// own checks: OpenCL's device tensors (kiln_model_run_device) and its error with no platform
// (NoDevice.IsAnErrorNotACrash, run alone by ctest with no OpenCL platform visible); the PTX in
// every CUDA kernel object, the error a call gives without a CUDA driver (through the C ABI and
// the C++ API: never a crash, and the model stays usable), and the base model on a CUDA device.
// This binary links no Halide (libHalide's LLVM 14 and pocl's LLVM 15 in one process crash).
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "HalideRuntime.h"
#include "cuda_attention.h"
#include "cuda_base.h"
#include "cuda_cache_write.h"
#include "cuda_device.h"
#include "cuda_general.h"
#include "cuda_linears.h"
#include "cuda_norms.h"
#include "cuda_step_attention.h"
#include "device_harness.h"
#include "gpu_attention.h"
#include "gpu_cache_write.h"
#include "gpu_general.h"
#include "gpu_linears.h"
#include "gpu_norms.h"
#include "gpu_step_attention.h"
#include "ir/interpreter.h"
#include "ir/parser.h"
#include "opencl_device.h"
#include "runtime/safetensors.h"

namespace kiln {
namespace {

using testing::create_model;
using testing::cuda_driver_present;
using testing::input_views;
using testing::max_error;
using testing::ModelPtr;
using testing::opencl_device_present;
using testing::random_inputs;
ir::Module read_module(const std::string& file) { return testing::read_gpu_kir(file); }

// Within the CPU kernels' tolerance (1e-5 on unit-scale data, tests/layernorm_kernel_test.cpp).
constexpr double kTolerance = 1e-5;

// A device API the GPU libraries are compiled for: its libraries of tests/gpu/*.kir (their
// NAME_create) and why its tests skip here ("" where its device is usable).
using CreateFn = decltype(&gpu_norms_create);
struct DeviceApi {
  const char* name;  // the instance's name: OpenCL, CUDA
  std::string (*skip_reason)();
  const char* prefix;  // of its libraries (gpu_norms, cuda_norms) and the files its tests write
  CreateFn norms, linears, attention, general, step_attention, cache_write;
};

// gtest prints a parameter by its name.
void PrintTo(const DeviceApi& api, std::ostream* os) { *os << api.name; }

const DeviceApi kOpenCL = {
    "OpenCL",
    [] { return std::string(opencl_device_present() ? "" : "no OpenCL device"); },
    "gpu",
    gpu_norms_create,
    gpu_linears_create,
    gpu_attention_create,
    gpu_general_create,
    gpu_step_attention_create,
    gpu_cache_write_create};

const DeviceApi kCuda = {"CUDA",
                         testing::cuda_skip_reason,
                         "cuda",
                         cuda_norms_create,
                         cuda_linears_create,
                         cuda_attention_create,
                         cuda_general_create,
                         cuda_step_attention_create,
                         cuda_cache_write_create};

// The suite: every test runs on each API's libraries and skips where its device is missing.
class DeviceTest : public ::testing::TestWithParam<DeviceApi> {
 protected:
  void SetUp() override {
    if (const std::string why = api().skip_reason(); !why.empty()) GTEST_SKIP() << why;
  }
  const DeviceApi& api() const { return GetParam(); }
  // tests/gpu/norms.kir: the default module of random_inputs and max_error below.
  const ir::Module& norms_module() const { return norms_module_; }
  ModelPtr norms() const { return create_model(api().norms); }
  // A file of this API's in the test folder (written by the test): "<prefix>_<name>".
  std::string file(const std::string& name) const {
    return std::string(KILN_GPU_TEST_DIR) + "/" + api().prefix + "_" + name;
  }
  // Random weights for tests/gpu/linears.kir, written to file(`name`).
  ir::WeightMap write_linear_weights(const ir::Module& m, uint32_t seed,
                                     const std::string& name) const {
    return testing::write_random_weights(m, seed, file(name));
  }
  ModelPtr linears(const std::string& name) const {
    return create_model(api().linears, file(name).c_str());
  }
  // testing::random_inputs and testing::max_error (device_harness.h) on norms.kir.
  std::vector<ir::Tensor> norms_inputs(const std::string& function,
                                       const std::map<std::string, int64_t>& sizes,
                                       uint32_t seed) const {
    return random_inputs(norms_module_, function, sizes, seed);
  }
  double norms_error(kiln_model* model, const std::string& function,
                     const std::vector<ir::Tensor>& inputs) const {
    return max_error(model, norms_module_, function, inputs);
  }

 private:
  const ir::Module norms_module_ = read_module("norms.kir");
};

INSTANTIATE_TEST_SUITE_P(Gpu, DeviceTest, ::testing::Values(kOpenCL, kCuda),
                         [](const ::testing::TestParamInfo<DeviceApi>& info) {
                           return std::string(info.param.name);
                         });

TEST_P(DeviceTest, LayerNormRows) {
  ModelPtr m = norms();
  ASSERT_NE(m, nullptr);
  for (int64_t rows : {1, 7, 33, 129}) {
    for (const char* f : {"norm7", "norm129", "rms129"})
      EXPECT_LE(norms_error(m.get(), f, norms_inputs(f, {{"R", rows}}, 3 + rows)), kTolerance)
          << f << " with " << rows << " rows";
  }
}

TEST_P(DeviceTest, AddLayerNormWithSumAndBroadcast) {
  ModelPtr m = norms();
  ASSERT_NE(m, nullptr);
  for (auto [b, s] : {std::pair<int64_t, int64_t>{1, 1}, {1, 7}, {3, 33}, {2, 5}}) {
    for (const char* f : {"residual", "positions", "rms_residual", "positions1"})
      EXPECT_LE(norms_error(m.get(), f, norms_inputs(f, {{"B", b}, {"S", s}}, 5 + b * s)),
                kTolerance)
          << f << " with B=" << b << " S=" << s;
  }
}

// Chains on the inputs of both former copies (seeds 3 + rows and 9 + rows); lookups at the
// sizes of both, exactly.
TEST_P(DeviceTest, ElementwiseAndGather) {
  ModelPtr m = norms();
  ASSERT_NE(m, nullptr);
  for (int64_t rows : {1, 7, 33, 129})
    for (int64_t seed : {3, 9})
      EXPECT_LE(
          norms_error(m.get(), "chain",
                      norms_inputs("chain", {{"R", rows}}, static_cast<uint32_t>(seed + rows))),
          kTolerance)
          << rows << " rows";
  for (auto [b, s, v] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1},
                         {3, 33, 9},
                         {2, 7, 4},
                         {1, 1, 9},
                         {1, 7, 9},
                         {2, 5, 9}})
    EXPECT_LE(
        norms_error(m.get(), "lookup", norms_inputs("lookup", {{"B", b}, {"S", s}, {"V", v}}, 13)),
        0.0)
        << "B=" << b << " S=" << s << " V=" << v;
}

// Linear kernels (register-tiled GEMM with the bias and activation fused) on weights
// written to a safetensors file, N packed in panels (64, 128) or not, odd K and N; up to 256
// rows (every count here) k256_n64_relu and k130_n70 split their reduction in parts (split-K).
TEST_P(DeviceTest, Linear) {
  const ir::Module m = read_module("linears.kir");
  const ir::WeightMap weights = write_linear_weights(m, 17, "linears.weights.safetensors");
  ModelPtr model = linears("linears.weights.safetensors");
  ASSERT_NE(model, nullptr);
  for (int64_t rows : {1, 7, 33, 129})
    for (const char* f :
         {"k7_n5", "k33_n70_relu", "k64_n64_gelu", "k129_n128", "k256_n64_relu", "k130_n70"})
      EXPECT_LE(
          max_error(model.get(), m, f, random_inputs(m, f, {{"M", rows}}, 21 + rows), weights),
          kTolerance)
          << f << " with " << rows << " rows";
}

// Two models of GPU libraries in one process share the runtime's device context: destroying
// one leaves the other running (the context is given back with the last GPU model).
TEST_P(DeviceTest, DestroyingOneModelLeavesAnotherRunning) {
  ModelPtr first = norms();
  ModelPtr second = norms();
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  EXPECT_LE(norms_error(first.get(), "norm7", norms_inputs("norm7", {{"R", 7}}, 31)), kTolerance);
  first.reset();
  EXPECT_LE(norms_error(second.get(), "norm129", norms_inputs("norm129", {{"R", 33}}, 37)),
            kTolerance);
  second.reset();
  ModelPtr third = norms();  // a fresh context after the last one was given back
  ASSERT_NE(third, nullptr);
  EXPECT_LE(norms_error(third.get(), "norm7", norms_inputs("norm7", {{"R", 1}}, 41)), kTolerance);
}

// Fused attention, every variant (tests/gpu/attention.kir), at lengths 1, 7, 33 and 129 and batches
// of 1 and 3, with random key and query padding (each position padded with probability 1/2, so rows
// whose keys are all masked are common); batch row 0's keys all padded in the fill_inf cases (NaN
// rows, as the interpreter's).
TEST_P(DeviceTest, Attention) {
  const ir::Module m = read_module("attention.kir");
  ModelPtr model = create_model(api().attention);
  ASSERT_NE(model, nullptr);
  const int64_t lengths[] = {1, 7, 33, 129};
  uint32_t seed = 31;
  for (const char* f : {"self_kpad", "causal_kpad", "causal", "qpad", "fill_inf", "fill_inf_kpad",
                        "cross", "wide", "gqa_bias_window", "mqa_bias"}) {
    const bool fill_inf = std::string(f).rfind("fill_inf", 0) == 0;
    int nan_values = 0;
    for (int64_t b : {1, 3})
      for (int64_t s : lengths)
        for (int64_t t : lengths) {
          if (t != s && std::string(f) != "qpad" && std::string(f) != "cross") continue;
          std::vector<ir::Tensor> inputs =
              random_inputs(m, f, {{"B", b}, {"S", s}, {"T", t}, {"V", 2}}, ++seed);
          if (fill_inf)  // batch row 0: every key padded
            for (int64_t j = 0; j < s; ++j) inputs[3].ints[static_cast<size_t>(j)] = 1;
          const ir::Tensor want = ir::interpret(m, *m.find_function(f), {}, inputs)[0];
          for (float x : want.f) nan_values += std::isnan(x) ? 1 : 0;
          EXPECT_LE(max_error(model.get(), m, f, inputs), kTolerance)
              << f << " with B=" << b << " S=" << s << " T=" << t;
        }
    if (fill_inf) EXPECT_GT(nan_values, 0) << f << ": no NaN rows tested";
  }
}

// The general kernels (tests/gpu/general.kir): softmax over the last, a middle and the first
// axis and of a rank-1 tensor, every reduction (f32 and i64, over one axis, several axes, all
// axes and none), argmax over each axis, and matmuls (batched, broadcasting, transposed, with
// bias and activation), and concat, slice and reshape on sizes such as R+1. Rows and columns of
// 1, 7, 33 and 129, and rows of 300 (longer than a block's 256 threads).
class DeviceGeneralTest : public DeviceTest {
 protected:
  void SetUp() override {
    DeviceTest::SetUp();
    if (IsSkipped()) return;
    model_ = create_model(api().general);
    ASSERT_NE(model_, nullptr);
  }
  // Every size of kSizes for `function`, with the inputs changed by `edit` (if any).
  void check(const char* function, void (*edit)(std::vector<ir::Tensor>&) = nullptr) {
    uint32_t seed = 50;
    for (const auto& sizes : kSizes) {
      std::vector<ir::Tensor> inputs = random_inputs(module_, function, sizes, ++seed);
      if (edit) edit(inputs);
      std::string at;
      for (const auto& [name, value] : sizes) at += " " + name + "=" + std::to_string(value);
      EXPECT_LE(max_error(model_.get(), module_, function, inputs), kTolerance)
          << function << " with" << at;
    }
  }
  static inline const std::vector<std::map<std::string, int64_t>> kSizes = {
      {{"B", 1}, {"R", 1}, {"C", 1}, {"V", 1000}},
      {{"B", 3}, {"R", 7}, {"C", 33}, {"V", 1000}},
      {{"B", 2}, {"R", 33}, {"C", 7}, {"V", 1000}},
      {{"B", 1}, {"R", 129}, {"C", 129}, {"V", 1000}},
      {{"B", 3}, {"R", 1}, {"C", 129}, {"V", 1000}},
      {{"B", 2}, {"R", 129}, {"C", 1}, {"V", 1000}},
      {{"B", 2}, {"R", 7}, {"C", 300}, {"V", 1000}},
      {{"B", 3}, {"R", 129}, {"C", 300}, {"V", 1000}}};
  const ir::Module module_ = read_module("general.kir");
  ModelPtr model_;
};

INSTANTIATE_TEST_SUITE_P(Gpu, DeviceGeneralTest, ::testing::Values(kOpenCL, kCuda),
                         [](const ::testing::TestParamInfo<DeviceApi>& info) {
                           return std::string(info.param.name);
                         });

// Values in steps of 1/4 (so that rows have ties), and two NaNs in the first row of the first
// input where it has three or more values.
void ties_and_nans(std::vector<ir::Tensor>& inputs) {
  std::vector<float>& x = inputs[0].f;
  for (float& v : x) v = std::round(v * 4) / 4;
  if (x.size() >= 3) {
    x[1] = NAN;
    x[2] = NAN;
  }
}

TEST_P(DeviceGeneralTest, Softmax) {
  check("softmax");
  check("softmax", ties_and_nans);
}

TEST_P(DeviceGeneralTest, Reductions) {
  check("reduce");
  check("reduce", ties_and_nans);
  check("reduce_i64");
}

TEST_P(DeviceGeneralTest, Argmax) {
  check("argmax", [](std::vector<ir::Tensor>& inputs) {
    for (float& v : inputs[0].f) v = std::round(v * 4) / 4;  // ties
  });
  check("argmax", ties_and_nans);
}

// topk with ties (i64 values from {0, 1, 2}) and NaNs; scatter_add with indices in range and
// repeated (rows adding into one element in order).
TEST_P(DeviceGeneralTest, TopkAndScatterAdd) {
  check("topk", [](std::vector<ir::Tensor>& inputs) {
    ties_and_nans(inputs);
    for (float& v : inputs[1].f) v = std::round(v * 2) / 2;
    for (int64_t& v : inputs[2].ints) v = (v % 3 + 3) % 3;
  });
  check("scatter", [](std::vector<ir::Tensor>& inputs) {
    // Indices into C = inputs[0]'s last dim (and inputs[3]'s first, inputs[6]'s only).
    const int64_t c = inputs[6].shape[0];
    for (int k : {1, 4, 7})
      for (int64_t& v : inputs[static_cast<size_t>(k)].ints) v = (v % c + c) % c;
  });
}

TEST_P(DeviceGeneralTest, Matmul) {
  check("matmul");
  check("linear");
}

// Concat along a symbolic axis, slice and reshape of R+1 (general.kir's @symbolic).
TEST_P(DeviceGeneralTest, SymbolicSizes) { check("symbolic"); }

// Single-query decoding attention (tests/gpu/step_attention.kir) at 1, 7, 33 and 129 keys (cache
// positions or source keys) and 1, 4 and 9 hypotheses: cache_attention reads random slots of the
// cache through the row table (grouped-query and windowed forms with skipped keys too, and a
// score bias);
// memory_attention reads random sentences with random key padding, sentence 0 wholly padded and
// read by hypothesis 0 (its output: the uniform average of v).
TEST_P(DeviceTest, StepAttention) {
  const ir::Module m = read_module("step_attention.kir");
  ModelPtr model = create_model(api().step_attention);
  ASSERT_NE(model, nullptr);
  constexpr int64_t kSlots = 5, kSentences = 3;
  uint32_t seed = 101;
  for (int64_t keys : {1, 7, 33, 129})
    for (int64_t n : {1, 4, 9}) {
      const int64_t positions = std::min<int64_t>(keys + 2, 129);  // cache rows: T >= P
      std::mt19937 rng(++seed);
      for (const char* f :
           {"cache", "cache_dv", "cache_wide", "cache_gqa", "cache_window", "cache_bias"}) {
        std::vector<ir::Tensor> inputs = random_inputs(
            m, f, {{"N", n}, {"P", keys}, {"T", positions}, {"C", kSlots}, {"V", 2}}, ++seed);
        std::uniform_int_distribution<int64_t> slot(0, kSlots - 1);
        for (int64_t& r : inputs[3].ints) r = slot(rng);
        // Grouped-query and windowed forms: each row's first keys skipped (-1, a left-padded
        // prompt), never its last.
        if (std::string(f) == "cache_gqa" || std::string(f) == "cache_window")
          for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < (keys - 1) * i / std::max<int64_t>(n, 1); ++j)
              inputs[3].ints[static_cast<size_t>(i * keys + j)] = -1;
        EXPECT_LE(max_error(model.get(), m, f, inputs), kTolerance)
            << f << " with N=" << n << " P=" << keys << " T=" << positions;
      }
      for (const char* f : {"memory", "memory_dv"}) {
        std::vector<ir::Tensor> inputs =
            random_inputs(m, f, {{"N", n}, {"B", kSentences}, {"S", keys}, {"V", 2}}, ++seed);
        std::uniform_int_distribution<int64_t> sentence(0, kSentences - 1);
        for (int64_t& r : inputs[3].ints) r = sentence(rng);
        inputs[3].ints[0] = 0;
        for (int64_t j = 0; j < keys; ++j) inputs[4].ints[static_cast<size_t>(j)] = 1;
        EXPECT_LE(max_error(model.get(), m, f, inputs), kTolerance)
            << f << " with N=" << n << " S=" << keys;
      }
    }
}

// Device residency: a GPU library keeps its weights, tables and arena on the device and
// copies only inputs in and outputs back per run. The classic bug is a stale device copy:
// new values in the same host buffers must be used by the next run.

// New values in the same host input buffers, run after run (weights reused from the device),
// at changing sizes; every output checked against the interpreter.
TEST_P(DeviceTest, ResidentManyRunsWithChangingInputs) {
  const ir::Module lin = read_module("linears.kir");
  const ir::WeightMap weights = write_linear_weights(lin, 51, "resident.safetensors");
  ModelPtr linears_model = linears("resident.safetensors");
  ModelPtr norms_model = norms();
  ASSERT_NE(linears_model, nullptr);
  ASSERT_NE(norms_model, nullptr);
  for (int64_t rows : {33, 129, 7}) {
    // One set of host buffers per size, refilled in place before each run.
    std::vector<ir::Tensor> x = random_inputs(lin, "k129_n128", {{"M", rows}}, 1);
    std::vector<ir::Tensor> chain = norms_inputs("chain", {{"R", rows}}, 1);
    const float* x_data = x[0].f.data();
    for (uint32_t run = 0; run < 6; ++run) {
      const std::vector<ir::Tensor> fresh =
          random_inputs(lin, "k129_n128", {{"M", rows}}, 100 + run);
      std::copy(fresh[0].f.begin(), fresh[0].f.end(), x[0].f.begin());
      ASSERT_EQ(x[0].f.data(), x_data);  // the same host buffer, new values
      EXPECT_LE(max_error(linears_model.get(), lin, "k129_n128", x, weights), kTolerance)
          << rows << " rows, run " << run;
      const std::vector<ir::Tensor> fresh_chain = norms_inputs("chain", {{"R", rows}}, 200 + run);
      for (size_t i = 0; i < chain.size(); ++i)
        std::copy(fresh_chain[i].f.begin(), fresh_chain[i].f.end(), chain[i].f.begin());
      EXPECT_LE(norms_error(norms_model.get(), "chain", chain), kTolerance)
          << rows << " rows, run " << run;
    }
  }
}

// Two models of one library with different weights, and a model of another library, run
// alternately: each keeps its own weights on the device.
TEST_P(DeviceTest, ResidentModelsRunAlternately) {
  const ir::Module lin = read_module("linears.kir");
  const ir::WeightMap first_weights = write_linear_weights(lin, 61, "resident_a.safetensors");
  const ir::WeightMap second_weights = write_linear_weights(lin, 62, "resident_b.safetensors");
  ModelPtr first = linears("resident_a.safetensors");
  ModelPtr second = linears("resident_b.safetensors");
  ModelPtr norms_model = norms();
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  ASSERT_NE(norms_model, nullptr);
  uint32_t seed = 300;
  for (int round = 0; round < 3; ++round)
    for (const char* f :
         {"k7_n5", "k33_n70_relu", "k64_n64_gelu", "k129_n128", "k256_n64_relu", "k130_n70"}) {
      const int64_t rows = round == 1 ? 129 : 33;
      const std::vector<ir::Tensor> x = random_inputs(lin, f, {{"M", rows}}, ++seed);
      EXPECT_LE(max_error(first.get(), lin, f, x, first_weights), kTolerance) << f;
      EXPECT_LE(max_error(second.get(), lin, f, x, second_weights), kTolerance) << f;
      EXPECT_LE(norms_error(norms_model.get(), "positions",
                            norms_inputs("positions", {{"B", 2}, {"S", rows % 40}}, ++seed)),
                kTolerance)
          << f;
    }
}

// Two threads on one model: each call has its own arena (and its device memory).
TEST_P(DeviceTest, ResidentConcurrentCallsOnOneModel) {
  ModelPtr norms_model = norms();
  ASSERT_NE(norms_model, nullptr);
  std::vector<double> worst(2, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      for (uint32_t run = 0; run < 8; ++run) {
        const int64_t rows = t == 0 ? 33 : 129;
        worst[static_cast<size_t>(t)] =
            std::max(worst[static_cast<size_t>(t)],
                     norms_error(norms_model.get(), "chain",
                                 norms_inputs("chain", {{"R", rows}}, 400 + run + t)));
      }
    });
  for (std::thread& th : threads) th.join();
  EXPECT_LE(worst[0], kTolerance);
  EXPECT_LE(worst[1], kTolerance);
}

// A cache_write runs on the host between kernels: its row comes from the device (the
// arena), the cache (updated in place, kept by the caller across runs) goes back, and the
// kernel after it and the outputs see the new values. Checked against the interpreter run
// after run, with N and the position changing.
TEST_P(DeviceTest, ResidentCacheWriteBetweenKernels) {
  const ir::Module m = read_module("cache_write.kir");
  const ir::Function& f = *m.find_function("step");
  ModelPtr model = create_model(api().cache_write);
  ASSERT_NE(model, nullptr);
  const int64_t T = 6, C = 4, D = 8;
  std::mt19937 rng(71);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> cache(static_cast<size_t>(T * C * D));
  for (float& v : cache) v = u(rng);
  for (int run = 0; run < 12; ++run) {
    const int64_t n = 1 + run % 4;
    int64_t pos = (run * 5) % T;
    std::vector<float> x(static_cast<size_t>(n * D));
    for (float& v : x) v = u(rng);
    const std::vector<ir::Tensor> want = ir::interpret(
        m, f, {},
        {ir::Tensor::from_f32({n, 1, D}, x), ir::Tensor::from_ints(ir::DType::i64, {1}, {pos}),
         ir::Tensor::from_f32({T, C, D}, cache)});
    std::vector<float> w(x.size(), 1e30f);
    kiln_tensor in[3] = {};
    in[0].dtype = KILN_F32;
    in[0].rank = 3;
    in[0].shape[0] = n;
    in[0].shape[1] = 1;
    in[0].shape[2] = D;
    in[0].data = x.data();
    in[0].capacity = x.size() * 4;
    in[1].dtype = KILN_I64;
    in[1].rank = 1;
    in[1].shape[0] = 1;
    in[1].data = &pos;
    in[1].capacity = 8;
    in[2].dtype = KILN_F32;
    in[2].rank = 3;
    in[2].shape[0] = T;
    in[2].shape[1] = C;
    in[2].shape[2] = D;
    in[2].data = cache.data();
    in[2].capacity = cache.size() * 4;
    kiln_tensor out[2] = {in[0], in[2]};
    out[0].data = w.data();
    out[0].capacity = w.size() * 4;
    ASSERT_EQ(kiln_model_run(model.get(), "step", in, 3, out, 2), 0)
        << kiln_model_error(model.get());
    double worst = 0;
    for (size_t e = 0; e < w.size(); ++e)
      worst = std::max(worst, static_cast<double>(std::fabs(w[e] - want[0].f[e])));
    EXPECT_LE(worst, kTolerance) << "run " << run;
    EXPECT_EQ(cache, want[1].f) << "run " << run;
  }
}

// OpenCL's own checks: device tensors and the error with no platform, on the gpu_* libraries.

#define SKIP_WITHOUT_OPENCL()                                         \
  do {                                                                \
    if (!opencl_device_present()) GTEST_SKIP() << "no OpenCL device"; \
  } while (0)

const ir::Module& reference_module() {
  static const ir::Module m = read_module("norms.kir");
  return m;
}

// testing::random_inputs and testing::max_error (device_harness.h), on norms.kir by default.
std::vector<ir::Tensor> random_inputs(const std::string& function,
                                      const std::map<std::string, int64_t>& sizes, uint32_t seed,
                                      const ir::Module& m = reference_module()) {
  return testing::random_inputs(m, function, sizes, seed);
}

ModelPtr create_model() { return create_model(gpu_norms_create); }

// Random weights for tests/gpu/linears.kir, written to `file` (in the test folder).
ir::WeightMap write_linear_weights(const ir::Module& m, uint32_t seed, const std::string& file) {
  return testing::write_random_weights(m, seed, std::string(KILN_GPU_TEST_DIR) + "/" + file);
}

ModelPtr create_linears(const std::string& file) {
  return create_model(gpu_linears_create, (std::string(KILN_GPU_TEST_DIR) + "/" + file).c_str());
}

// Run by ctest with OCL_ICD_VENDORS naming an empty folder: no platform, so the call
// fails with the OpenCL runtime's message (the model's device memory cannot be allocated)
// and leaves the model usable for the next call.
TEST(NoDevice, IsAnErrorNotACrash) {
  if (opencl_device_present()) GTEST_SKIP() << "an OpenCL device is present";
  ModelPtr m = create_model();
  ASSERT_NE(m, nullptr);
  const std::vector<ir::Tensor> inputs = random_inputs("norm7", {{"R", 2}}, 1);
  std::vector<float> out(14);
  kiln_tensor in[3] = {};
  for (int i = 0; i < 3; ++i) {
    in[i].dtype = KILN_F32;
    in[i].rank = static_cast<int32_t>(inputs[i].shape.size());
    for (size_t d = 0; d < inputs[i].shape.size(); ++d) in[i].shape[d] = inputs[i].shape[d];
    in[i].data = const_cast<float*>(inputs[i].f.data());
    in[i].capacity = inputs[i].f.size() * 4;
  }
  kiln_tensor o{};
  o.dtype = KILN_F32;
  o.rank = 2;
  o.shape[0] = 2;
  o.shape[1] = 7;
  o.data = out.data();
  o.capacity = out.size() * 4;
  for (int attempt = 0; attempt < 2; ++attempt) {
    EXPECT_NE(kiln_model_run(m.get(), "norm7", in, 3, &o, 1), 0);
    const std::string error = kiln_model_error(m.get());
    EXPECT_NE(error.find("entry point 'norm7' cannot run on the device"), std::string::npos)
        << error;
    EXPECT_NE(error.find("failed with status"), std::string::npos) << error;
    EXPECT_NE(error.find("OpenCL"), std::string::npos) << error;
  }
}

// Device tensors (kiln_model_run_device): inputs and outputs are halide_buffer_ts on the
// model's OpenCL device, allocated by the test with halide_device_malloc on
// kiln_model_device_interface.

// A row-major device tensor with host memory of its own (for the test to fill and read):
// the device allocation is freed when destroyed.
class DeviceBuffer {
 public:
  DeviceBuffer(const kiln_model* model, int32_t dtype, std::vector<int64_t> shape)
      : dtype_(dtype), shape_(std::move(shape)) {
    int64_t n = 1, stride = 1;
    for (int64_t d : shape_) n *= d;
    dims_.resize(shape_.size());
    for (size_t d = shape_.size(); d-- > 0;) {
      dims_[shape_.size() - 1 - d] =
          halide_dimension_t(0, static_cast<int32_t>(shape_[d]), static_cast<int32_t>(stride));
      stride *= shape_[d];
    }
    host_.assign(static_cast<size_t>(n) * kiln_dtype_size(dtype), 0);
    buf_.host = host_.data();
    buf_.type = dtype == KILN_F32   ? halide_type_t(halide_type_float, 32)
                : dtype == KILN_I64 ? halide_type_t(halide_type_int, 64)
                                    : halide_type_t(halide_type_uint, 8);
    buf_.dimensions = static_cast<int32_t>(dims_.size());
    buf_.dim = dims_.data();
    status_ = halide_device_malloc(nullptr, &buf_, kiln_model_device_interface(model));
  }
  ~DeviceBuffer() {
    if (buf_.device) halide_device_free(nullptr, &buf_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  int malloc_status() const { return status_; }
  halide_buffer_t* buffer() { return &buf_; }
  std::vector<uint8_t>& host() { return host_; }
  // Copies `bytes` (the tensor's) to the host memory and then to the device.
  int upload(const void* bytes) {
    std::memcpy(host_.data(), bytes, host_.size());
    buf_.set_host_dirty(true);
    return halide_copy_to_device(nullptr, &buf_, buf_.device_interface);
  }
  // The tensor as kiln_model_run_device takes it.
  kiln_tensor tensor() {
    kiln_tensor t{};
    t.dtype = dtype_;
    t.rank = static_cast<int32_t>(shape_.size());
    for (size_t d = 0; d < shape_.size(); ++d) t.shape[d] = shape_[d];
    t.data = &buf_;
    return t;
  }

 private:
  int32_t dtype_;
  std::vector<int64_t> shape_;
  std::vector<halide_dimension_t> dims_;
  std::vector<uint8_t> host_;
  halide_buffer_t buf_{};
  int status_ = -1;
};

// The host tensor of `t` (f32, i64 or bool) as kiln_model_run takes it; bools in `bytes`.
kiln_tensor host_tensor(const ir::Tensor& t, std::vector<uint8_t>* bytes) {
  kiln_tensor k{};
  k.rank = static_cast<int32_t>(t.shape.size());
  for (size_t d = 0; d < t.shape.size(); ++d) k.shape[d] = t.shape[d];
  if (t.dtype == ir::DType::f32) {
    k.dtype = KILN_F32;
    k.data = const_cast<float*>(t.f.data());
    k.capacity = t.f.size() * 4;
  } else if (t.dtype == ir::DType::boolean) {
    k.dtype = KILN_BOOL;
    bytes->clear();
    for (int64_t x : t.ints) bytes->push_back(x != 0 ? 1 : 0);
    k.data = bytes->data();
    k.capacity = bytes->size();
  } else {
    k.dtype = KILN_I64;
    k.data = const_cast<int64_t*>(t.ints.data());
    k.capacity = t.ints.size() * 8;
  }
  return k;
}

// The f32 outputs of `function` through the host path (kiln_model_run), as raw bytes.
std::vector<std::vector<uint8_t>> run_host(kiln_model* model, const std::string& function,
                                           const std::vector<ir::Tensor>& inputs) {
  std::vector<std::vector<uint8_t>> bools(inputs.size());
  std::vector<kiln_tensor> in;
  for (size_t i = 0; i < inputs.size(); ++i) in.push_back(host_tensor(inputs[i], &bools[i]));
  std::vector<kiln_tensor> out(
      static_cast<size_t>(kiln_model_num_outputs(model, function.c_str())));
  EXPECT_EQ(kiln_model_output_shapes(model, function.c_str(), in.data(), in.size(), out.data(),
                                     out.size()),
            0)
      << kiln_model_error(model);
  std::vector<std::vector<uint8_t>> data(out.size());
  for (size_t r = 0; r < out.size(); ++r) {
    int64_t n = 1;
    for (int32_t d = 0; d < out[r].rank; ++d) n *= out[r].shape[d];
    data[r].assign(static_cast<size_t>(n) * kiln_dtype_size(out[r].dtype), 0xAB);
    out[r].data = data[r].data();
    out[r].capacity = data[r].size();
  }
  EXPECT_EQ(kiln_model_run(model, function.c_str(), in.data(), in.size(), out.data(), out.size()),
            0)
      << kiln_model_error(model);
  return data;
}

// Device input buffers for `inputs` (uploaded) and device output buffers of the shapes
// kiln_model_output_shapes_device gives, their host memory filled with 0xCD.
struct DeviceCall {
  std::vector<std::unique_ptr<DeviceBuffer>> in, out;
  std::vector<kiln_tensor> in_tensors, out_tensors;
};

DeviceCall make_device_call(kiln_model* model, const std::string& function,
                            const std::vector<ir::Tensor>& inputs) {
  DeviceCall c;
  for (const ir::Tensor& t : inputs) {
    std::vector<uint8_t> bools;
    const kiln_tensor host = host_tensor(t, &bools);
    auto& b = c.in.emplace_back(std::make_unique<DeviceBuffer>(
        model, host.dtype, std::vector<int64_t>(host.shape, host.shape + host.rank)));
    EXPECT_EQ(b->malloc_status(), 0);
    EXPECT_EQ(b->upload(host.data), 0);
    c.in_tensors.push_back(b->tensor());
  }
  c.out_tensors.resize(static_cast<size_t>(kiln_model_num_outputs(model, function.c_str())));
  EXPECT_EQ(kiln_model_output_shapes_device(model, function.c_str(), c.in_tensors.data(),
                                            c.in_tensors.size(), c.out_tensors.data(),
                                            c.out_tensors.size()),
            0)
      << kiln_model_error(model);
  for (kiln_tensor& o : c.out_tensors) {
    auto& b = c.out.emplace_back(std::make_unique<DeviceBuffer>(
        model, o.dtype, std::vector<int64_t>(o.shape, o.shape + o.rank)));
    EXPECT_EQ(b->malloc_status(), 0);
    std::fill(b->host().begin(), b->host().end(), 0xCD);
    o = b->tensor();
  }
  return c;
}

// Runs `c` on the device; checks that the outputs stayed there (host memory untouched,
// device_dirty) until copied back, and returns them.
std::vector<std::vector<uint8_t>> run_device(kiln_model* model, const std::string& function,
                                             DeviceCall& c) {
  for (auto& b : c.out) std::fill(b->host().begin(), b->host().end(), 0xCD);
  EXPECT_EQ(kiln_model_run_device(model, function.c_str(), c.in_tensors.data(), c.in_tensors.size(),
                                  c.out_tensors.data(), c.out_tensors.size()),
            0)
      << kiln_model_error(model);
  std::vector<std::vector<uint8_t>> data;
  for (auto& b : c.out) {
    EXPECT_TRUE(b->buffer()->device_dirty()) << function;
    EXPECT_TRUE(
        std::all_of(b->host().begin(), b->host().end(), [](uint8_t v) { return v == 0xCD; }))
        << function << ": an output came to the host before it was asked for";
    EXPECT_EQ(halide_copy_to_host(nullptr, b->buffer()), 0);
    EXPECT_FALSE(b->buffer()->device_dirty());
    data.push_back(b->host());
  }
  return data;
}

// The f32 outputs of the interpreter as raw bytes' floats, against `got` within kTolerance.
double device_error(const ir::Module& m, const std::string& function,
                    const std::vector<ir::Tensor>& inputs,
                    const std::vector<std::vector<uint8_t>>& got,
                    const ir::WeightMap& weights = {}) {
  const std::vector<ir::Tensor> want =
      ir::interpret(m, *m.find_function(function), weights, inputs);
  EXPECT_EQ(want.size(), got.size());
  double worst = 0;
  for (size_t r = 0; r < want.size() && r < got.size(); ++r) {
    EXPECT_EQ(got[r].size(), want[r].f.size() * 4);
    std::vector<float> f(got[r].size() / 4);
    std::memcpy(f.data(), got[r].data(), f.size() * 4);
    for (size_t e = 0; e < f.size() && e < want[r].f.size(); ++e) {
      const double ref = want[r].f[e];
      const double err = std::fabs(f[e] - ref) / std::max(1.0, std::fabs(ref));
      if (!(err <= worst)) worst = std::isnan(err) ? INFINITY : err;
    }
  }
  return worst;
}

// Every linear of tests/gpu/linears.kir with device inputs and outputs gives the host
// path's bytes exactly, and the interpreter's values; outputs stay on the device until
// copied back.
TEST(GpuOpenCL, DeviceTensorsMatchTheHostPath) {
  SKIP_WITHOUT_OPENCL();
  const ir::Module lin = read_module("linears.kir");
  const ir::WeightMap weights = write_linear_weights(lin, 81, "gpu_device_tensors.safetensors");
  ModelPtr model = create_linears("gpu_device_tensors.safetensors");
  ASSERT_NE(model, nullptr);
  ASSERT_NE(kiln_model_device_interface(model.get()), nullptr);
  for (int64_t rows : {1, 33, 129})
    for (const char* f :
         {"k7_n5", "k33_n70_relu", "k64_n64_gelu", "k129_n128", "k256_n64_relu", "k130_n70"}) {
      const std::vector<ir::Tensor> x = random_inputs(f, {{"M", rows}}, 90 + rows, lin);
      DeviceCall call = make_device_call(model.get(), f, x);
      const std::vector<std::vector<uint8_t>> got = run_device(model.get(), f, call);
      EXPECT_EQ(got, run_host(model.get(), f, x)) << f << " with " << rows << " rows";
      EXPECT_LE(device_error(lin, f, x, got, weights), kTolerance) << f << " with " << rows;
    }
}

// The same device buffers run after run with new values written into them (no stale
// device copy), two outputs (residual), ids on the device (lookup), and a buffer size
// change between runs; each run against the host path (bit-identical) and the interpreter.
TEST(GpuOpenCL, DeviceTensorsRepeatedRunsWithChangedInputs) {
  SKIP_WITHOUT_OPENCL();
  ModelPtr model = create_model();
  ASSERT_NE(model, nullptr);
  for (auto [b, s] : {std::pair<int64_t, int64_t>{2, 7}, {3, 33}}) {
    const std::map<std::string, int64_t> sizes = {{"B", b}, {"S", s}, {"V", 9}};
    DeviceCall residual =
        make_device_call(model.get(), "residual", random_inputs("residual", sizes, 500));
    DeviceCall lookup =
        make_device_call(model.get(), "lookup", random_inputs("lookup", sizes, 500));
    for (uint32_t run = 0; run < 4; ++run) {
      for (auto [f, call] :
           {std::pair<const char*, DeviceCall*>{"residual", &residual}, {"lookup", &lookup}}) {
        const std::vector<ir::Tensor> x = random_inputs(f, sizes, 600 + run);
        for (size_t i = 0; i < x.size(); ++i) {
          std::vector<uint8_t> bools;
          ASSERT_EQ(call->in[i]->upload(host_tensor(x[i], &bools).data), 0);
        }
        const std::vector<std::vector<uint8_t>> got = run_device(model.get(), f, *call);
        EXPECT_EQ(got, run_host(model.get(), f, x)) << f << " run " << run;
        EXPECT_LE(device_error(reference_module(), f, x, got), kTolerance) << f << " run " << run;
      }
    }
  }
}

// What kiln_model_run_device refuses, each with an error naming it, and nothing written.
TEST(GpuOpenCL, DeviceTensorsErrors) {
  SKIP_WITHOUT_OPENCL();
  ModelPtr model = create_model();
  ASSERT_NE(model, nullptr);
  kiln_model* m = model.get();
  const std::map<std::string, int64_t> sizes = {{"B", 2}, {"S", 5}, {"V", 9}};
  DeviceCall call = make_device_call(m, "lookup", random_inputs("lookup", sizes, 700));
  for (auto& b : call.out) {
    std::fill(b->host().begin(), b->host().end(), 0x11);
    b->buffer()->set_host_dirty(true);
    ASSERT_EQ(halide_copy_to_device(nullptr, b->buffer(), b->buffer()->device_interface), 0);
  }
  auto refused = [&](std::vector<kiln_tensor> in, std::vector<kiln_tensor> out,
                     const char* function = "lookup") -> std::string {
    EXPECT_NE(kiln_model_run_device(m, function, in.data(), in.size(), out.data(), out.size()), 0);
    return kiln_model_error(m);
  };
  using ::testing::HasSubstr;
  // A host-only buffer (no device allocation).
  std::vector<int64_t> ids_host(10, 1);
  halide_dimension_t ids_dims[2] = {halide_dimension_t(0, 5, 1), halide_dimension_t(0, 2, 5)};
  halide_buffer_t host_only{};
  host_only.host = reinterpret_cast<uint8_t*>(ids_host.data());
  host_only.type = halide_type_t(halide_type_int, 64);
  host_only.dimensions = 2;
  host_only.dim = ids_dims;
  kiln_tensor host_ids = call.in_tensors[1];
  host_ids.data = &host_only;
  EXPECT_THAT(refused({call.in_tensors[0], host_ids}, call.out_tensors),
              HasSubstr("input 1 is a host-only buffer"));
  // The kiln_tensor's shape is not the buffer's.
  kiln_tensor wrong = call.in_tensors[1];
  wrong.shape[1] = 4;
  EXPECT_THAT(refused({call.in_tensors[0], wrong}, call.out_tensors),
              HasSubstr("input 1 has shape [2,4], its buffer shape [2,5]"));
  // Dtypes: i32 ids and a buffer of another element type.
  wrong = call.in_tensors[1];
  wrong.dtype = KILN_I32;
  EXPECT_THAT(refused({call.in_tensors[0], wrong}, call.out_tensors), HasSubstr("input 1 is i32"));
  wrong = call.in_tensors[0];
  wrong.dtype = KILN_I64;
  EXPECT_THAT(refused({wrong, call.in_tensors[1]}, call.out_tensors),
              HasSubstr("input 0 is i64, its buffer holds float32 elements"));
  // A buffer whose shape is its tensor's, but not the entry point's (the table has 9 rows).
  DeviceBuffer wide(m, KILN_F32, {9, 128});
  ASSERT_EQ(wide.malloc_status(), 0);
  EXPECT_THAT(refused({wide.tensor(), call.in_tensors[1]}, call.out_tensors),
              HasSubstr("input 'table' has shape [9,128]: dim 1 is 128, expected 129"));
  kiln_tensor named = wide.tensor();
  named.name = "table";
  EXPECT_THAT(refused({named, call.in_tensors[1]}, call.out_tensors), HasSubstr("expected 129"));
  // An output of the wrong shape.
  DeviceBuffer small_out(m, KILN_F32, {2, 4, 129});
  ASSERT_EQ(small_out.malloc_status(), 0);
  EXPECT_THAT(refused(call.in_tensors, {small_out.tensor()}),
              HasSubstr("output 'e' has shape [2,4,129], expected [2,5,129]"));
  // Newer data on the host than on the device.
  call.in[1]->buffer()->set_host_dirty(true);
  EXPECT_THAT(refused(call.in_tensors, call.out_tensors), HasSubstr("input 1 has newer data"));
  call.in[1]->buffer()->set_host_dirty(false);
  // No buffer at all.
  wrong = call.in_tensors[0];
  wrong.data = nullptr;
  EXPECT_THAT(refused({wrong, call.in_tensors[1]}, call.out_tensors),
              HasSubstr("input 0 has no buffer"));
  // Nothing was written to the output by any refused call.
  for (auto& b : call.out) {
    std::fill(b->host().begin(), b->host().end(), 0);
    b->buffer()->set_device_dirty(true);
    ASSERT_EQ(halide_copy_to_host(nullptr, b->buffer()), 0);
    EXPECT_TRUE(
        std::all_of(b->host().begin(), b->host().end(), [](uint8_t v) { return v == 0x11; }));
  }
  // Bools are read from the device to check their values: a key padding mask (attention,
  // bit-identical to the host path), then one holding 2.
  const ir::Module att = read_module("attention.kir");
  ModelPtr attention = testing::create_model(gpu_attention_create);
  ASSERT_NE(attention, nullptr);
  const std::vector<ir::Tensor> x =
      random_inputs("self_kpad", {{"B", 3}, {"S", 33}, {"V", 2}}, 710, att);
  DeviceCall masked = make_device_call(attention.get(), "self_kpad", x);
  const std::vector<std::vector<uint8_t>> got = run_device(attention.get(), "self_kpad", masked);
  EXPECT_EQ(got, run_host(attention.get(), "self_kpad", x));
  EXPECT_LE(device_error(att, "self_kpad", x, got), kTolerance);
  std::vector<uint8_t> mask(3 * 33, 0);
  mask[40] = 2;
  ASSERT_EQ(masked.in[3]->upload(mask.data()), 0);
  EXPECT_NE(kiln_model_run_device(attention.get(), "self_kpad", masked.in_tensors.data(), 4,
                                  masked.out_tensors.data(), 1),
            0);
  EXPECT_THAT(std::string(kiln_model_error(attention.get())),
              HasSubstr("input 'pad' holds 2 at element 40; bool elements must be 0 or 1"));
  // An entry point that writes a cache on the host between kernels.
  ModelPtr cache = testing::create_model(gpu_cache_write_create);
  ASSERT_NE(cache, nullptr);
  EXPECT_NE(kiln_model_run_device(cache.get(), "step", nullptr, 0, nullptr, 0), 0);
  EXPECT_THAT(std::string(kiln_model_error(cache.get())),
              HasSubstr("entry point 'step' writes a cache on the host between its kernels"));
}

// A device tensor `offset` floats into `pool`'s allocation (a 1-D device crop of it, as an
// application makes one with halide_device_crop), seen as a dense f32 tensor of `shape`, or
// with `crop` false the pool's own device handle seen so. The crop is released when
// destroyed.
class PoolView {
 public:
  PoolView(DeviceBuffer& pool, int64_t offset, std::vector<int64_t> shape, const char* name,
           bool crop = true)
      : shape_(std::move(shape)), name_(name) {
    int64_t n = 1;
    for (int64_t d : shape_) n *= d;
    line_dim_ = halide_dimension_t(static_cast<int32_t>(offset), static_cast<int32_t>(n), 1);
    line_.type = halide_type_t(halide_type_float, 32);
    line_.dimensions = 1;
    line_.dim = &line_dim_;
    if (crop) {
      status_ = halide_device_crop(nullptr, pool.buffer(), &line_);
    } else {
      status_ = 0;
      line_.device = pool.buffer()->device;
      line_.device_interface = pool.buffer()->device_interface;
    }
    cropped_ = crop && status_ == 0;
    int64_t stride = 1;
    for (size_t d = shape_.size(); d-- > 0;) {
      dims_.insert(dims_.end(), halide_dimension_t(0, static_cast<int32_t>(shape_[d]),
                                                   static_cast<int32_t>(stride)));
      stride *= shape_[d];
    }
    view_.device = line_.device;
    view_.device_interface = line_.device_interface;
    view_.type = line_.type;
    view_.dimensions = static_cast<int32_t>(dims_.size());
    view_.dim = dims_.data();
  }
  ~PoolView() {
    if (cropped_) halide_device_release_crop(nullptr, &line_);
  }
  PoolView(const PoolView&) = delete;
  PoolView& operator=(const PoolView&) = delete;
  int status() const { return status_; }
  kiln_tensor tensor() {
    kiln_tensor t{};
    t.name = name_;
    t.dtype = KILN_F32;
    t.rank = static_cast<int32_t>(shape_.size());
    for (size_t d = 0; d < shape_.size(); ++d) t.shape[d] = shape_[d];
    t.data = &view_;
    return t;
  }

 private:
  std::vector<int64_t> shape_;
  const char* name_;
  halide_dimension_t line_dim_{};
  halide_buffer_t line_{}, view_{};
  std::vector<halide_dimension_t> dims_;
  int status_ = -1;
  bool cropped_ = false;
};

// `pool`'s device memory, copied to its host memory.
std::vector<uint8_t> pool_bytes(DeviceBuffer& pool) {
  pool.buffer()->set_device_dirty(true);
  EXPECT_EQ(halide_copy_to_host(nullptr, pool.buffer()), 0);
  return pool.host();
}

// A generated family of placements of residual's inputs (x, y, g, b) and outputs (n, s) at
// random offsets in one device allocation (crops of it, as the application makes them),
// random batches and lengths: where an output shares a byte of the allocation with an input or
// the other output, the call is refused naming the first such pair (the outputs in order, each
// against the inputs, then the earlier output) and the bytes they share, and the allocation is
// unchanged; otherwise (inputs may overlap each other) the call runs, its outputs are the host
// path's bytes for the inputs the allocation holds, and no other byte changed.
TEST(GpuOpenCL, DeviceTensorsSharingAnAllocationAreRefused) {
  SKIP_WITHOUT_OPENCL();
  ModelPtr model = create_model();
  ASSERT_NE(model, nullptr);
  kiln_model* m = model.get();
  std::mt19937 rng(2525);
  int refused = 0, ran = 0, partial = 0;
  for (int sample = 0; sample < 60; ++sample) {
    SCOPED_TRACE("sample " + std::to_string(sample));
    const int64_t B = 1 + rng() % 3, S = 1 + rng() % 4, row = B * S * 129;
    const std::vector<int64_t> big = {B, S, 129}, small = {129};
    struct Place {
      const char* name;
      int64_t floats, at;
    };
    std::vector<Place> places = {{"x", row, 0}, {"y", row, 0}, {"g", 129, 0},
                                 {"b", 129, 0}, {"n", row, 0}, {"s", row, 0}};
    int64_t total = 0;
    for (const Place& p : places) total += p.floats;
    const int64_t pool_floats = total * 3;
    // A quarter of the samples put an output exactly on an input or the other output.
    for (Place& p : places) p.at = static_cast<int64_t>(rng() % (pool_floats - p.floats + 1));
    if (rng() % 4 == 0) places[4 + rng() % 2].at = places[rng() % 2].at;
    std::vector<float> values(static_cast<size_t>(pool_floats));
    for (float& v : values) v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 250.f;
    DeviceBuffer pool(m, KILN_F32, {pool_floats});
    ASSERT_EQ(pool.malloc_status(), 0);
    ASSERT_EQ(pool.upload(values.data()), 0);
    std::vector<std::unique_ptr<PoolView>> views;
    for (const Place& p : places) {
      const bool vector = views.size() == 2 || views.size() == 3;  // g and b
      views.push_back(std::make_unique<PoolView>(pool, p.at, vector ? small : big, p.name));
      ASSERT_EQ(views.back()->status(), 0);
    }
    std::vector<kiln_tensor> in, out;
    for (size_t i = 0; i < 4; ++i) in.push_back(views[i]->tensor());
    for (size_t i = 4; i < 6; ++i) out.push_back(views[i]->tensor());
    auto overlap = [&](size_t a, size_t b) {
      return places[a].at < places[b].at + places[b].floats &&
             places[b].at < places[a].at + places[a].floats;
    };
    std::string want;
    for (size_t r = 4; r < 6 && want.empty(); ++r)
      for (size_t o = 0; o < r && want.empty(); ++o)
        if (overlap(r, o)) {
          const int64_t lo = std::max(places[r].at, places[o].at),
                        hi = std::min(places[r].at + places[r].floats,
                                      places[o].at + places[o].floats);
          auto bytes = [](int64_t from, int64_t to) {
            return "[" + std::to_string(from * 4) + ", " + std::to_string(to * 4) + ")";
          };
          want = std::string("output '") + places[r].name + "' overlaps " +
                 (o < 4 ? "input" : "output") + " '" + places[o].name + "' (its bytes " +
                 bytes(lo - places[r].at, hi - places[r].at) + " are bytes " +
                 bytes(lo - places[o].at, hi - places[o].at) + " of '" + places[o].name +
                 "'): an output must not share memory with an input or another output (a cache "
                 "updated in place is the one exception)";
          partial += hi - lo < places[r].floats;
        }
    const int status =
        kiln_model_run_device(m, "residual", in.data(), in.size(), out.data(), out.size());
    const std::vector<uint8_t> after = pool_bytes(pool);
    std::vector<uint8_t> before(values.size() * 4);
    std::memcpy(before.data(), values.data(), before.size());
    if (!want.empty()) {
      EXPECT_NE(status, 0);
      EXPECT_EQ(std::string(kiln_model_error(m)), want);
      EXPECT_EQ(after, before) << "a refused call wrote to the device";
      ++refused;
      continue;
    }
    ASSERT_EQ(status, 0) << kiln_model_error(m);
    ++ran;
    std::vector<ir::Tensor> x;
    for (size_t i = 0; i < 4; ++i) {
      const Place& p = places[i];
      x.push_back(ir::Tensor::from_f32(
          i >= 2 ? small : big,
          std::vector<float>(values.begin() + p.at, values.begin() + p.at + p.floats)));
    }
    const std::vector<std::vector<uint8_t>> host = run_host(m, "residual", x);
    std::vector<uint8_t> expected = before;
    for (size_t r = 0; r < 2; ++r)
      std::copy(host[r].begin(), host[r].end(), expected.begin() + places[4 + r].at * 4);
    EXPECT_EQ(after, expected) << "the outputs, or bytes beside them";
  }
  std::printf("[ alias ] device: %d placements refused (%d partial overlaps), %d ran\n", refused,
              partial, ran);
  EXPECT_GE(refused, 20);
  EXPECT_GE(partial, 10);
  EXPECT_GE(ran, 5);
}

// A generated family of device tensors whose shape claims more than their allocation holds
// from their start (an allocation of random size, the tensor at a random crop offset or the
// allocation's own handle): an input (norm129's x or g) or the output (y) that would be read or
// written past the allocation's end is refused naming its bytes and the allocation's, and
// writes nothing; one that fits runs and gives the host path's result.
TEST(GpuOpenCL, DeviceTensorsBeyondTheirAllocationAreRefused) {
  SKIP_WITHOUT_OPENCL();
  ModelPtr model = create_model();
  ASSERT_NE(model, nullptr);
  kiln_model* m = model.get();
  std::mt19937 rng(2526);
  int refused = 0, ran = 0;
  for (int sample = 0; sample < 60; ++sample) {
    SCOPED_TRACE("sample " + std::to_string(sample));
    const int64_t R = 1 + rng() % 6;
    const std::vector<ir::Tensor> x = random_inputs("norm129", {{"R", R}}, 3000 + sample);
    const size_t bad = rng() % 3;  // 0: x, 1: g, 2: y
    const char* names[] = {"x", "g", "b", "y"};
    const std::vector<std::vector<int64_t>> shapes = {{R, 129}, {129}, {129}, {R, 129}};
    const size_t which = bad == 0 ? 0 : bad == 1 ? 1 : 3;
    const int64_t need = which == 1 ? 129 : R * 129;
    const int64_t floats = 1 + static_cast<int64_t>(rng() % (2 * need));
    const bool crop = rng() % 4 != 0;
    const int64_t offset = crop ? static_cast<int64_t>(rng() % floats) : 0;
    std::vector<std::unique_ptr<DeviceBuffer>> own;  // each tensor's allocation
    std::vector<std::unique_ptr<PoolView>> views;
    std::vector<kiln_tensor> tensors;
    for (size_t i = 0; i < 4; ++i) {
      const bool this_one = i == which;
      int64_t n = 1;
      for (int64_t d : shapes[i]) n *= d;
      own.push_back(
          std::make_unique<DeviceBuffer>(m, KILN_F32, std::vector<int64_t>{this_one ? floats : n}));
      ASSERT_EQ(own.back()->malloc_status(), 0);
      std::vector<float> fill(static_cast<size_t>(this_one ? floats : n), 0.5f);
      if (i < 3) {
        const std::vector<float>& v = x[i].f;
        if (this_one)
          std::copy(v.begin(), v.begin() + std::min<int64_t>(n, floats - offset),
                    fill.begin() + offset);
        else
          fill = v;
      }
      ASSERT_EQ(own.back()->upload(fill.data()), 0);
      views.push_back(std::make_unique<PoolView>(*own.back(), this_one ? offset : 0, shapes[i],
                                                 names[i], this_one ? crop : true));
      ASSERT_EQ(views.back()->status(), 0);
      tensors.push_back(views.back()->tensor());
    }
    const std::vector<uint8_t> before = pool_bytes(*own[which]), y_before = pool_bytes(*own[3]);
    const int status = kiln_model_run_device(m, "norm129", tensors.data(), 3, &tensors[3], 1);
    const int64_t room = (floats - offset) * 4;
    if (need * 4 > room) {
      std::string shape = "[" + std::to_string(shapes[which][0]);
      if (shapes[which].size() == 2) shape += "," + std::to_string(shapes[which][1]);
      shape += "]";
      EXPECT_NE(status, 0);
      EXPECT_EQ(std::string(kiln_model_error(m)),
                std::string(which == 3 ? "output '" : "input '") + names[which] + "' of shape " +
                    shape + " needs " + std::to_string(need * 4) +
                    " bytes of f32, its device allocation holds " + std::to_string(room) +
                    " from the buffer's start");
      EXPECT_EQ(pool_bytes(*own[which]), before);
      EXPECT_EQ(pool_bytes(*own[3]), y_before) << "a refused call wrote its output";
      ++refused;
      continue;
    }
    ASSERT_EQ(status, 0) << kiln_model_error(m);
    ++ran;
    const std::vector<uint8_t> y = pool_bytes(*own[3]);
    const std::vector<std::vector<uint8_t>> host = run_host(m, "norm129", x);
    const int64_t y_at = which == 3 ? offset * 4 : 0;
    EXPECT_EQ(std::vector<uint8_t>(y.begin() + y_at, y.begin() + y_at + R * 129 * 4), host[0]);
  }
  std::printf("[ alias ] device: %d tensors beyond their allocation refused, %d that fit ran\n",
              refused, ran);
  EXPECT_GE(refused, 20);
  EXPECT_GE(ran, 10);
}

// The C++ API: kiln::Model's device_interface, device_output_shapes and run_device, against
// the host path; a host-only buffer throws with the runtime's message.
TEST(GpuOpenCL, DeviceTensorsCppApi) {
  SKIP_WITHOUT_OPENCL();
  char* error = nullptr;
  kiln::Model model(checked_model(gpu_norms_create(nullptr, &error), error));
  ASSERT_NE(model.device_interface(), nullptr);
  const std::vector<ir::Tensor> x = random_inputs("norm129", {{"R", 33}}, 800);
  DeviceCall call = make_device_call(model.get(), "norm129", x);
  std::vector<DeviceTensor> in;
  for (auto& b : call.in) in.push_back({b->buffer(), KILN_F32, {}});
  in[0].shape = {33, 129};
  in[1].shape = in[2].shape = {129};
  const std::vector<DeviceTensor> shapes = model.device_output_shapes("norm129", in);
  ASSERT_EQ(shapes.size(), 1u);
  EXPECT_EQ(shapes[0].shape, (std::vector<int64_t>{33, 129}));
  EXPECT_EQ(shapes[0].dtype, KILN_F32);
  DeviceTensor out = shapes[0];
  out.buffer = call.out[0]->buffer();
  std::fill(call.out[0]->host().begin(), call.out[0]->host().end(), 0xCD);
  model.run_device("norm129", in, {out});
  EXPECT_TRUE(out.buffer->device_dirty());
  ASSERT_EQ(halide_copy_to_host(nullptr, out.buffer), 0);
  EXPECT_EQ(std::vector<std::vector<uint8_t>>{call.out[0]->host()},
            run_host(model.get(), "norm129", x));
  EXPECT_LE(device_error(reference_module(), "norm129", x, {call.out[0]->host()}), kTolerance);
  halide_buffer_t host_only = *call.in[0]->buffer();
  host_only.device = 0;
  host_only.device_interface = nullptr;
  in[0].buffer = &host_only;
  try {
    model.run_device("norm129", in, {out});
    ADD_FAILURE() << "a host-only buffer ran";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr("input 0 is a host-only buffer"));
  }
}

// CUDA's own checks, on the cuda_* libraries: the PTX in their kernel objects, the error a
// call gives without a driver, and the base model (every entry point compiled for CUDA).

#define SKIP_WITHOUT_CUDA()                                                                     \
  do {                                                                                          \
    if (const std::string why = testing::cuda_skip_reason(); !why.empty()) GTEST_SKIP() << why; \
  } while (0)

// The members of a static library (the System V / GNU `ar` format, with its table of long
// names), by name.
std::vector<std::pair<std::string, std::string>> archive_members(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream all;
  all << in.rdbuf();
  const std::string data = all.str();
  if (data.compare(0, 8, "!<arch>\n") != 0) throw std::runtime_error(path + " is not an archive");
  std::vector<std::pair<std::string, std::string>> members;
  std::string long_names;
  for (size_t pos = 8; pos + 60 <= data.size();) {
    const std::string header = data.substr(pos, 60);
    std::string name = header.substr(0, 16);
    const size_t size = std::stoull(header.substr(48, 10));
    if (pos + 60 + size > data.size()) throw std::runtime_error(path + ": a truncated member");
    std::string body = data.substr(pos + 60, size);
    pos += 60 + size + (size % 2);
    name.erase(name.find_last_not_of(' ') + 1);
    if (name == "/" || name == "/SYM64/") continue;  // the symbol table
    if (name == "//") {
      long_names = body;
      continue;
    }
    if (name.size() > 1 && name[0] == '/') {  // "/offset" into the long names
      const size_t offset = std::stoull(name.substr(1));
      name = long_names.substr(offset, long_names.find('\n', offset) - offset);
    }
    if (!name.empty() && name.back() == '/') name.pop_back();
    members.emplace_back(name, std::move(body));
  }
  return members;
}

size_t count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + 1))
    ++n;
  return n;
}

// Each kernel's object (<model>_kiln_*.o: one Halide pipeline per kernel) embeds one PTX
// module for sm_86 with at least one entry; the glue and Halide's runtime none.
TEST(CudaBuild, EveryKernelObjectCarriesPtxForSm86) {
  for (const std::string model : {"cuda_norms", "cuda_linears", "cuda_attention", "cuda_general",
                                  "cuda_step_attention", "cuda_base"}) {
    const std::string path =
        std::string(KILN_GPU_TEST_DIR) + "/" + model + ".kiln/lib" + model + ".a";
    const auto members = archive_members(path);
    int kernels = 0;
    bool runtime = false, glue = false;
    for (const auto& [name, body] : members) {
      if (name.rfind(model + "_kiln_", 0) == 0) {
        ++kernels;
        EXPECT_EQ(count(body, ".target sm_86"), 1u) << path << ": " << name;
        EXPECT_GE(count(body, ".entry "), 1u) << path << ": " << name;
        EXPECT_EQ(count(body, ".target sm_"), 1u) << path << ": " << name << ": another target";
      } else {
        runtime |= name == "halide_runtime.o";
        glue |= name == model + "_glue.o";
        EXPECT_EQ(count(body, ".target sm_"), 0u) << path << ": " << name;
      }
    }
    EXPECT_GE(kernels, 4) << path;
    EXPECT_TRUE(runtime) << path << ": no halide_runtime.o";
    EXPECT_TRUE(glue) << path << ": no glue";
  }
}

// Without a driver: creating the model succeeds (nothing touches the device before a kernel
// runs), and every call returns a non-zero status with a message naming the missing driver;
// a second call says the same (the model stays usable).
TEST(CudaNoDriver, RunIsAnErrorNamingTheDriver) {
  if (cuda_driver_present()) GTEST_SKIP() << "a CUDA driver is present";
  const ir::Module m = read_module("norms.kir");
  ModelPtr model = create_model(cuda_norms_create);
  ASSERT_NE(model, nullptr);
  const std::vector<ir::Tensor> inputs = random_inputs(m, "norm7", {{"R", 2}}, 1);
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<kiln_tensor> in = input_views(inputs, &bytes);
  std::vector<float> out(14, 0.5f);
  kiln_tensor o{};
  o.dtype = KILN_F32;
  o.rank = 2;
  o.shape[0] = 2;
  o.shape[1] = 7;
  o.data = out.data();
  o.capacity = out.size() * 4;
  for (int attempt = 0; attempt < 2; ++attempt) {
    EXPECT_NE(kiln_model_run(model.get(), "norm7", in.data(), in.size(), &o, 1), 0);
    const std::string error = kiln_model_error(model.get());
    EXPECT_NE(error.find("no CUDA driver (libcuda.so.1 not found: libcuda.so.1"), std::string::npos)
        << error;  // dlerror's text after it
    EXPECT_NE(error.find("failed with status"), std::string::npos) << error;
  }
  // The other libraries (and entry points with several kernels) say the same.
  ModelPtr attention = create_model(cuda_attention_create);
  ASSERT_NE(attention, nullptr);
  const ir::Module am = read_module("attention.kir");
  const std::vector<ir::Tensor> ain =
      random_inputs(am, "causal", {{"B", 1}, {"S", 3}, {"T", 3}, {"V", 2}}, 2);
  std::vector<kiln_tensor> av = input_views(ain, &bytes);
  kiln_tensor ao[1] = {};
  ASSERT_EQ(kiln_model_output_shapes(attention.get(), "causal", av.data(), av.size(), ao, 1), 0)
      << kiln_model_error(attention.get());
  std::vector<float> aout(static_cast<size_t>(ao[0].shape[0] * ao[0].shape[1] * ao[0].shape[2]));
  ao[0].data = aout.data();
  ao[0].capacity = aout.size() * 4;
  EXPECT_NE(kiln_model_run(attention.get(), "causal", av.data(), av.size(), ao, 1), 0);
  EXPECT_NE(std::string(kiln_model_error(attention.get())).find("no CUDA driver"),
            std::string::npos)
      << kiln_model_error(attention.get());
}

// The generated C++ class: the call throws std::runtime_error with the same message.
TEST(CudaNoDriver, CppApiThrowsNamingTheDriver) {
  if (cuda_driver_present()) GTEST_SKIP() << "a CUDA driver is present";
  kiln_models::cuda_norms model(nullptr);
  kiln::Tensor<float> x{{3, 7}, std::vector<float>(21, 0.25f)};
  kiln::Tensor<float> g{{7}, std::vector<float>(7, 1.0f)};
  kiln::Tensor<float> b{{7}, std::vector<float>(7, 0.0f)};
  std::string message;
  try {
    model.norm7(x, g, b);
  } catch (const std::runtime_error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("no CUDA driver (libcuda.so.1 not found"), std::string::npos)
      << "message: '" << message << "'";
}

// The base model (MODEL transformer CONFIG base) compiled for CUDA: its weights, random and
// small (uniform in ±0.05, so the model is well conditioned and f32 rounding stays small),
// written to the build folder (~373 MB) by each test that uses them: the plain ones (the
// runtime derives the rest).
const ir::Module& base_module() {
  static const ir::Module m = [] {
    std::ifstream in(KILN_CUDA_BASE_KIR);
    std::stringstream text;
    text << in.rdbuf();
    return ir::parse_and_verify(text.str(), KILN_CUDA_BASE_KIR);
  }();
  return m;
}

ir::WeightMap base_weights(std::string* path) {
  const ir::Module& m = base_module();
  std::mt19937 rng(2017);
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  ir::WeightMap weights;
  for (const ir::Weight& w : m.weights) {
    if (w.derivation) continue;
    std::vector<int64_t> shape;
    for (const ir::Dim& d : w.type.shape) shape.push_back(d.value);
    std::vector<float> v(static_cast<size_t>(ir::static_numel(w.type)));
    for (float& x : v) x = u(rng);
    weights[w.name] = ir::Tensor::from_f32(shape, std::move(v));
  }
  *path = std::string(KILN_GPU_TEST_DIR) + "/cuda_base.weights.safetensors";
  std::vector<rt::TensorData> tensors;
  for (const auto& [name, t] : weights) tensors.push_back(rt::make_f32(name, t.shape, t.f));
  rt::write_safetensors(*path, tensors);
  ir::materialize_weights(m, weights);
  return weights;
}

// Ids in [1, vocab): no padding.
kiln::Tensor<int64_t> ids(int64_t batch, int64_t len, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> u(1, vocab - 1);
  kiln::Tensor<int64_t> t{{batch, len}, std::vector<int64_t>(static_cast<size_t>(batch * len))};
  for (int64_t& x : t.data) x = u(rng);
  return t;
}

// Without a driver, the base model loads (weights checked and laid out on the host) and its
// forward and encode fail naming the driver, through the C++ API and the C ABI.
TEST(CudaNoDriver, BaseModelForwardIsAnErrorNamingTheDriver) {
  if (cuda_driver_present()) GTEST_SKIP() << "a CUDA driver is present";
  std::string path;
  (void)base_weights(&path);
  kiln_models::cuda_base model(path.c_str());
  const kiln::Tensor<int64_t> src = ids(1, 5, 32000, 1), tgt = ids(1, 4, 32000, 2);
  for (const char* entry : {"forward", "encode"}) {
    std::string message;
    try {
      if (std::string(entry) == "forward")
        (void)model.forward(src, tgt);
      else
        (void)model.encode(src);
    } catch (const std::runtime_error& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("no CUDA driver (libcuda.so.1 not found"), std::string::npos)
        << entry << ": '" << message << "'";
  }
  kiln_tensor in[2] = {};
  for (int i = 0; i < 2; ++i) {
    const kiln::Tensor<int64_t>& t = i == 0 ? src : tgt;
    in[i].dtype = KILN_I64;
    in[i].rank = 2;
    in[i].shape[0] = t.shape[0];
    in[i].shape[1] = t.shape[1];
    in[i].data = const_cast<int64_t*>(t.data.data());
    in[i].capacity = t.data.size() * 8;
  }
  std::vector<float> logits(4 * 32000);
  kiln_tensor out{};
  out.dtype = KILN_F32;
  out.rank = 3;
  out.shape[0] = 1;
  out.shape[1] = 4;
  out.shape[2] = 32000;
  out.data = logits.data();
  out.capacity = logits.size() * 4;
  EXPECT_NE(kiln_model_run(model.get(), "forward", in, 2, &out, 1), 0);
  EXPECT_NE(std::string(kiln_model_error(model.get())).find("no CUDA driver"), std::string::npos)
      << kiln_model_error(model.get());
}

// With a device: the base model's forward and encode against the interpreter on random
// weights, batches 1 and 2, lengths 1, 7 and 33.
TEST(CudaRun, BaseModelAgainstInterpreter) {
  SKIP_WITHOUT_CUDA();
  std::string path;
  const ir::WeightMap weights = base_weights(&path);
  const ir::Module& m = base_module();
  kiln_models::cuda_base model(path.c_str());
  double worst = 0;
  for (int64_t batch : {1, 2})
    for (int64_t len : {1, 7, 33}) {
      const kiln::Tensor<int64_t> src = ids(batch, len, 32000, static_cast<uint32_t>(len));
      const kiln::Tensor<int64_t> tgt = ids(batch, len, 32000, static_cast<uint32_t>(len + 99));
      const std::vector<ir::Tensor> inputs = {
          ir::Tensor::from_ints(ir::DType::i64, src.shape, src.data),
          ir::Tensor::from_ints(ir::DType::i64, tgt.shape, tgt.data)};
      for (const char* entry : {"forward", "encode"}) {
        const bool fwd = std::string(entry) == "forward";
        const std::vector<ir::Tensor> want = ir::interpret(
            m, *m.find_function(entry), weights, fwd ? inputs : std::vector<ir::Tensor>{inputs[0]});
        const kiln::Tensor<float> got = fwd ? model.forward(src, tgt) : model.encode(src);
        ASSERT_EQ(got.shape, want[0].shape) << entry;
        for (size_t i = 0; i < got.data.size(); ++i)
          worst = std::max(worst, std::fabs(got.data[i] - want[0].f[i]) /
                                      std::max(1.0, std::fabs(static_cast<double>(want[0].f[i]))));
      }
    }
  std::printf("[ cuda ] base model vs interpreter: max error %.3g\n", worst);
  EXPECT_LE(worst, 1e-4);
}

}  // namespace
}  // namespace kiln
