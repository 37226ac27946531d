// Whole compiled models on the GPU through OpenCL on pocl (issue 14): the golden models and
// a random config with odd sizes compiled with kiln_add_model(... TARGET host-opencl) and
// linked as an application links them:
//  - tiny and small: forward and encode against PyTorch's golden outputs (1e-4), and greedy
//    and beam search (decode_step's cache and memory attention on the GPU) against the
//    PyTorch reference search;
//  - the odd config (d_k 7, d_ff 13, odd vocabularies, pad id 2) on random weights: forward
//    and encode against the reference interpreter on padded batches of lengths 1, 7 and the
//    maximum.
// This binary links no libHalide (its LLVM 14 and pocl's LLVM 15 crash in one process).
// Without an OpenCL device every test skips, saying so (ctest reports it as skipped).
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "frontend/models.h"
#include "golden_checks.h"
#include "gpu_golden_small.h"
#include "gpu_golden_tiny.h"
#include "gpu_odd.h"
#include "ir/interpreter.h"
#include "opencl_device.h"
#include "pass_harness.h"
#include "runtime/safetensors.h"

namespace kiln {
namespace {

using testing::expect_golden;
using testing::expect_reference_search;
using testing::kGoldenTolerance;

#define SKIP_WITHOUT_OPENCL()                      \
  do {                                             \
    if (!testing::opencl_device_present())         \
      GTEST_SKIP() << "no OpenCL device (install " \
                      "pocl-opencl-icd)";          \
  } while (0)

std::string golden(const std::string& f) { return testing::golden_file(f); }

TEST(GpuModels, TinyMatchesPyTorch) {
  SKIP_WITHOUT_OPENCL();
  kiln_models::gpu_golden_tiny model(golden("tiny.weights.safetensors").c_str());
  expect_golden(model, "tiny_b1", "opencl");
  expect_golden(model, "tiny_b2", "opencl");
}

TEST(GpuModels, SmallMatchesPyTorch) {
  SKIP_WITHOUT_OPENCL();
  kiln_models::gpu_golden_small model(golden("small.weights.safetensors").c_str());
  expect_golden(model, "small_b1", "opencl");
}

// Greedy and beam search, every decoder step on the GPU: the ids and scores of the PyTorch
// reference search (tests/golden/<name>_decode.safetensors).
TEST(GpuModels, GreedyAndBeamMatchTheReferenceSearch) {
  SKIP_WITHOUT_OPENCL();
  kiln_models::gpu_golden_tiny tiny(golden("tiny.weights.safetensors").c_str());
  expect_reference_search(tiny, "tiny");
  kiln_models::gpu_golden_small small(golden("small.weights.safetensors").c_str());
  expect_reference_search(small, "small");
}

// tests/CMakeLists.txt's gpu_odd settings (decode_odd's).
const std::vector<std::string> kOddSettings = {
    "d_model=21",   "heads=3",      "d_ff=13",  "src_vocab=17", "tgt_vocab=19",
    "enc_layers=1", "dec_layers=2", "pad_id=2", "max_len=12",   "max_batch=3"};

TEST(GpuModels, OddConfigMatchesInterpreter) {
  SKIP_WITHOUT_OPENCL();
  ir::Module m = models::build_model("transformer", "tiny", kOddSettings);
  ir::WeightMap wm = testing::random_weights(m, 23);
  std::vector<rt::TensorData> tensors;
  for (const ir::Weight& w : m.weights)
    if (!w.derivation)
      tensors.push_back(rt::make_f32(w.name, wm.at(w.name).shape, wm.at(w.name).f));
  const std::string path = ::testing::TempDir() + "gpu_odd.safetensors";
  rt::write_safetensors(path, tensors);
  kiln_models::gpu_odd model(path.c_str());
  double worst = 0;
  int runs = 0;
  for (const char* entry : {"forward", "encode"}) {
    const ir::Function& f = *m.find_function(entry);
    for (int64_t batch : {1, 3})
      for (int64_t len : {1, 7, 12})
        for (bool padding : {false, true}) {
          std::map<std::string, int64_t> sizes = {
              {"B", batch}, {"S", len}, {"T", len == 12 ? 5 : len}};
          auto inputs =
              testing::random_inputs(m, f, sizes, static_cast<uint32_t>(len * 7 + batch), padding);
          const std::vector<ir::Tensor> want = ir::interpret(m, f, wm, inputs);
          kiln::Tensor<int64_t> src{inputs[0].shape, inputs[0].ints};
          const kiln::Tensor<float> got =
              f.name == "forward"
                  ? model.forward(src, kiln::Tensor<int64_t>{inputs[1].shape, inputs[1].ints})
                  : model.encode(src);
          const double e =
              testing::max_abs_diff(got, kiln::Tensor<float>{want[0].shape, want[0].f});
          EXPECT_LE(e, kGoldenTolerance)
              << entry << " B=" << batch << " len=" << len << (padding ? " padded" : "");
          worst = std::max(worst, e);
          ++runs;
        }
  }
  std::printf("[ opencl ] odd config, %d runs vs interpreter: max abs error %.3g\n", runs, worst);
}

}  // namespace
}  // namespace kiln
