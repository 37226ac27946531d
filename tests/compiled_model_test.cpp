// The golden models compiled by `kiln compile` (through kiln_add_model) and linked as an
// application would: outputs match PyTorch's and the interpreter's, bad inputs and bad
// weights get clear errors.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "compiled_wide.h"
#include "error_of.h"
#include "frontend/models.h"
#include "golden_checks.h"
#include "golden_small.h"
#include "golden_tiny.h"
#include "pass_harness.h"
#include "runtime/kernel_memory.h"
#include "runtime/safetensors.h"
#include "tools/bridge.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

using testing::expect_golden;
using testing::kGoldenTolerance;

std::string golden(const std::string& f) { return testing::golden_file(f); }

TEST(CompiledGolden, TinyMatchesPyTorch) {
  kiln_models::golden_tiny model(golden("tiny.weights.safetensors").c_str());
  expect_golden(model, "tiny_b1", "compiled");
  expect_golden(model, "tiny_b2", "compiled");
}

TEST(CompiledGolden, SmallMatchesPyTorch) {
  kiln_models::golden_small model(golden("small.weights.safetensors").c_str());
  expect_golden(model, "small_b1", "compiled");
}

// The whole compiled model against the interpreter on random ids, lengths 1, 7, 33 and
// the maximum, with padding, batch 1 and 3; every kernel kind is on this path.
TEST(CompiledVsInterpreter, RandomBatchesAndLengths) {
  ir::Module m = models::build_model("transformer", "tiny");
  rt::SafeTensors weights = rt::SafeTensors::load(golden("tiny.weights.safetensors"));
  ir::WeightMap wm = tools::load_weight_map(m, weights);
  kiln_models::golden_tiny model(golden("tiny.weights.safetensors").c_str());
  const ir::Function& fwd = *m.find_function("forward");
  double worst = 0;
  for (int64_t batch : {1, 3})
    for (int64_t len : {1, 7, 33, 40})
      for (bool padding : {false, true}) {
        std::map<std::string, int64_t> sizes = {
            {"B", batch}, {"S", len}, {"T", len == 40 ? 5 : len}};
        auto inputs =
            testing::random_inputs(m, fwd, sizes, static_cast<uint32_t>(len * 10 + batch), padding);
        std::vector<ir::Tensor> want = ir::interpret(m, fwd, wm, inputs);
        kiln::Tensor<int64_t> src{inputs[0].shape, inputs[0].ints},
            tgt{inputs[1].shape, inputs[1].ints};
        kiln::Tensor<float> got = model.forward(src, tgt);
        ASSERT_EQ(got.shape, want[0].shape);
        for (size_t i = 0; i < got.data.size(); ++i)
          worst = std::max(worst, std::abs(static_cast<double>(got.data[i]) - want[0].f[i]));
      }
  std::printf("[ compiled ] vs interpreter: max abs error %.3g\n", worst);
  EXPECT_LE(worst, kGoldenTolerance);
}

// The settings of tests/CMakeLists.txt's compiled_wide.
const std::vector<std::string> kWideSettings = {"d_model=64",    "heads=4",      "d_ff=160",
                                                "tgt_vocab=128", "enc_layers=1", "dec_layers=1"};

// Linear weights packed in 64-column panels at load time (q/k/v, output, generator) next to
// dense ones (the FFN's 160), on random weights: forward and encode against the interpreter.
TEST(CompiledVsInterpreter, PackedWeights) {
  ir::Module m = models::build_model("transformer", "tiny", kWideSettings);
  ir::WeightMap wm = testing::random_weights(m, 5);
  std::vector<rt::TensorData> tensors;
  for (const ir::Weight& w : m.weights) {
    if (w.derivation) continue;  // built by the runtime from the plain ones
    const ir::Tensor& t = wm.at(w.name);
    tensors.push_back(rt::make_f32(w.name, t.shape, t.f));
  }
  const std::string path = ::testing::TempDir() + "compiled_wide.safetensors";
  rt::write_safetensors(path, tensors);
  kiln_models::compiled_wide model(path.c_str());
  double worst = 0;
  for (const char* entry : {"forward", "encode"}) {
    const ir::Function& f = *m.find_function(entry);
    for (int64_t batch : {1, 3})
      for (int64_t len : {1, 7, 33})
        for (bool padding : {false, true}) {
          std::map<std::string, int64_t> sizes = {{"B", batch}, {"S", len}, {"T", len}};
          auto inputs =
              testing::random_inputs(m, f, sizes, static_cast<uint32_t>(len + batch), padding);
          std::vector<ir::Tensor> want = ir::interpret(m, f, wm, inputs);
          kiln::Tensor<int64_t> src{inputs[0].shape, inputs[0].ints};
          kiln::Tensor<float> got;
          if (f.name == "forward")
            got = model.forward(src, kiln::Tensor<int64_t>{inputs[1].shape, inputs[1].ints});
          else
            got = model.encode(src);
          ASSERT_EQ(got.shape, want[0].shape);
          for (size_t i = 0; i < got.data.size(); ++i)
            worst = std::max(worst, std::abs(static_cast<double>(got.data[i]) - want[0].f[i]));
        }
  }
  std::printf("[ compiled ] packed weights vs interpreter: max abs error %.3g\n", worst);
  EXPECT_LE(worst, kGoldenTolerance);
}

std::string error_of(const std::function<void()>& fn) {
  return testing::error_of<std::exception>(fn);
}

TEST(CompiledInputs, BadIdsLengthsAndBatchesAreRejected) {
  kiln_models::golden_tiny model(golden("tiny.weights.safetensors").c_str());
  kiln::Tensor<int64_t> tgt{{1, 2}, {3, 4}};
  EXPECT_EQ(error_of([&] {
              model.forward(kiln::Tensor<int64_t>{{1, 3}, {5, 37, 2}}, tgt);
            }),
            "token id 37 at 'src'[0,1] is out of range [0, 37)");
  EXPECT_EQ(error_of([&] {
              model.forward(kiln::Tensor<int64_t>{{1, 3}, {5, 6, -1}}, tgt);
            }),
            "token id -1 at 'src'[0,2] is out of range [0, 37)");
  EXPECT_EQ(error_of([&] {
              model.forward(kiln::Tensor<int64_t>{{1, 41}, std::vector<int64_t>(41, 3)}, tgt);
            }),
            "input 'src' has shape [1,41]: dim 1 (S) is 41, above its maximum 40");
  EXPECT_EQ(error_of([&] {
              model.forward(kiln::Tensor<int64_t>{{5, 1}, {1, 2, 3, 4, 5}},
                            kiln::Tensor<int64_t>{{5, 1}, {1, 2, 3, 4, 5}});
            }),
            "input 'src' has shape [5,1]: dim 0 (B) is 5, above its maximum 4");
  EXPECT_EQ(error_of([&] {
              model.forward(kiln::Tensor<int64_t>{{2, 3}, {1, 2, 3, 4, 5, 6}}, tgt);
            }),
            "input 'tgt' has shape [1,2]: dim 0 (B) is 1, but B is 2 in an earlier input");
  EXPECT_THAT(error_of([&] {
                model.forward(kiln::Tensor<float>{{1, 2}, {1, 2}}, tgt);
              }),
              HasSubstr("input 'src' is f32, expected i64 or i32"));
  // int32 ids are accepted and give the same result as int64.
  kiln::Tensor<int32_t> src32{{1, 3}, {5, 6, 7}};
  kiln::Tensor<int64_t> src64{{1, 3}, {5, 6, 7}};
  EXPECT_EQ(model.forward(src32, tgt).data, model.forward(src64, tgt).data);
}

// The out-parameter entry points give the returned results, and reuse the caller's storage.
TEST(CompiledOutputs, IntoCallerTensorsReusesStorage) {
  kiln_models::golden_tiny model(golden("tiny.weights.safetensors").c_str());
  auto ids = [](int64_t batch, int64_t len) {
    kiln::Tensor<int64_t> t{{batch, len}, {}};
    for (int64_t i = 0; i < batch * len; ++i) t.data.push_back(1 + (i * 7) % 30);
    return t;
  };
  kiln::Tensor<float> logits, memory;
  model.forward(ids(4, 40), ids(4, 40), logits);  // the maxima: the largest result
  EXPECT_EQ(logits.shape, (std::vector<int64_t>{4, 40, 41}));
  EXPECT_EQ(logits.data, model.forward(ids(4, 40), ids(4, 40)).data);
  const float* storage = logits.data.data();
  for (int64_t len : {1, 17, 40}) {
    model.forward(ids(2, len), ids(2, len), logits);
    kiln::Tensor<float> want = model.forward(ids(2, len), ids(2, len));
    EXPECT_EQ(logits.shape, want.shape);
    EXPECT_EQ(logits.data, want.data);
    EXPECT_EQ(logits.data.data(), storage) << "reallocated at length " << len;
  }
  model.encode(ids(3, 9), memory);
  EXPECT_EQ(memory.shape, (std::vector<int64_t>{3, 9, 24}));
  EXPECT_EQ(memory.data, model.encode(ids(3, 9)).data);
  // Through the untyped call: the number of outputs is checked.
  EXPECT_EQ(error_of([&] {
              model.run("encode", {ids(1, 3)}, {&memory, &logits});
            }),
            "kiln: entry point 'encode' has 1 output(s), 2 given");
}

// Profiling counts the runs and each kernel's calls while on, and nothing after.
TEST(CompiledProfile, CountsRunsAndKernelCalls) {
  kiln_models::golden_tiny model(golden("tiny.weights.safetensors").c_str());
  kiln::Tensor<int64_t> src{{1, 3}, {5, 6, 7}};
  EXPECT_EQ(model.profile(), "");
  model.set_profiling(true);
  model.encode(src);
  model.encode(src);
  model.set_profiling(false);
  model.encode(src);
  const std::string report = model.profile();
  EXPECT_THAT(report, HasSubstr("kiln profile: 'encode' ran 2 time(s)")) << report;
  // tiny has two encoder layers, each with one merged q/k/v projection (N = 3·24).
  EXPECT_THAT(report, ::testing::ContainsRegex("kiln_linear_k24_n72 +4 ")) << report;
  EXPECT_THAT(report, Not(HasSubstr("forward")));
  // Turning it on again starts from zero.
  model.set_profiling(true);
  model.forward(src, kiln::Tensor<int64_t>{{1, 2}, {3, 4}});
  EXPECT_THAT(model.profile(), HasSubstr("'forward' ran 1 time(s)"));
  EXPECT_THAT(model.profile(), Not(HasSubstr("'encode'")));
}

// The kernels' scratch memory (runtime/kernel_memory.h, installed by kiln_model_create): on
// one thread, a call like the one before it takes every block from the ones that call freed,
// none from the system.
TEST(CompiledScratch, ASecondCallTakesNoNewBlocks) {
  kiln_models::golden_tiny model(golden("tiny.weights.safetensors").c_str());
  kiln::Tensor<int64_t> ids{{4, 40}, {}};
  for (int64_t i = 0; i < 4 * 40; ++i) ids.data.push_back(1 + (i * 7) % 30);
  model.set_num_threads(1);
  model.forward(ids, ids);
  const kiln::rt::KernelMemoryStats before = kiln::rt::kernel_memory_stats();
  model.forward(ids, ids);
  const kiln::rt::KernelMemoryStats after = kiln::rt::kernel_memory_stats();
  model.set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  EXPECT_GT(after.reused, before.reused);
  EXPECT_EQ(after.allocated, before.allocated);
  std::printf("[ scratch ] second call: %llu blocks reused, %llu new\n",
              static_cast<unsigned long long>(after.reused - before.reused),
              static_cast<unsigned long long>(after.allocated - before.allocated));
}

TEST(CompiledWeights, MismatchedCheckpointIsReportedByName) {
  std::string msg =
      error_of([] { kiln_models::golden_tiny model(golden("small.weights.safetensors").c_str()); });
  EXPECT_THAT(msg, HasSubstr("tensor 'src_embed.weight' has shape [53,20], expected [37,24]"));
  EXPECT_THAT(msg, HasSubstr("unexpected tensor 'decoder.layers.2.norm3.bias'"));
  EXPECT_THAT(error_of([] { kiln_models::golden_tiny model("/nonexistent.safetensors"); }),
              HasSubstr("/nonexistent.safetensors"));
}

}  // namespace
}  // namespace kiln
