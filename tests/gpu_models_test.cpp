// Whole compiled models on the GPU, linked as an application links them: the golden models
// and a random config with odd sizes compiled with kiln_add_model(... TARGET host-opencl)
// (gpu_*: OpenCL, run on pocl in the suite) and (... TARGET host-cuda-cuda_capability_86)
// (cuda_*: run where a CUDA device is, bench/run_gpu.sh's GPU machine), one typed suite:
//  - tiny and small: forward and encode against PyTorch's golden outputs (1e-4), and greedy
//    and beam search (decode_step's cache and memory attention on the GPU) against the
//    PyTorch reference search;
//  - the odd config (d_k 7, d_ff 13, odd vocabularies, pad id 2) on random weights: forward
//    and encode against the reference interpreter on padded batches of lengths 1, 7 and the
//    maximum.
// This binary links no libHalide (its LLVM 14 and pocl's LLVM 15 crash in one process).
// Without an API's device its tests skip, saying so (ctest reports them as skipped).
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include "cuda_device.h"
#include "cuda_golden_small.h"
#include "cuda_golden_tiny.h"
#include "cuda_odd.h"
#include "frontend/models.h"
#include "golden_checks.h"
#include "golden_tiny.h"
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

// A device API's libraries of the three models, its label in the printed errors, and why
// its tests skip here ("" where its device is usable).
struct OpenCL {
  using Tiny = kiln_models::gpu_golden_tiny;
  using Small = kiln_models::gpu_golden_small;
  using Odd = kiln_models::gpu_odd;
  static constexpr const char* kLabel = "opencl";
  static std::string skip_reason() {
    return testing::opencl_device_present() ? "" : "no OpenCL device (install pocl-opencl-icd)";
  }
};
struct Cuda {
  using Tiny = kiln_models::cuda_golden_tiny;
  using Small = kiln_models::cuda_golden_small;
  using Odd = kiln_models::cuda_odd;
  static constexpr const char* kLabel = "cuda";
  static std::string skip_reason() { return testing::cuda_skip_reason(); }
};

template <typename Api>
class GpuModels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = Api::skip_reason(); !why.empty()) GTEST_SKIP() << why;
  }
};

struct ApiNames {
  template <typename Api>
  static std::string GetName(int) {
    return std::is_same_v<Api, OpenCL> ? "OpenCL" : "CUDA";
  }
};
using Apis = ::testing::Types<OpenCL, Cuda>;
TYPED_TEST_SUITE(GpuModels, Apis, ApiNames);

std::string golden(const std::string& f) { return testing::golden_file(f); }

TYPED_TEST(GpuModels, TinyMatchesPyTorch) {
  typename TypeParam::Tiny model(golden("tiny.weights.safetensors").c_str());
  expect_golden(model, "tiny_b1", TypeParam::kLabel);
  expect_golden(model, "tiny_b2", TypeParam::kLabel);
}

TYPED_TEST(GpuModels, SmallMatchesPyTorch) {
  typename TypeParam::Small model(golden("small.weights.safetensors").c_str());
  expect_golden(model, "small_b1", TypeParam::kLabel);
}

// Greedy and beam search, every decoder step on the GPU: the ids and scores of the PyTorch
// reference search (tests/golden/<name>_decode.safetensors).
TYPED_TEST(GpuModels, GreedyAndBeamMatchTheReferenceSearch) {
  typename TypeParam::Tiny tiny(golden("tiny.weights.safetensors").c_str());
  expect_reference_search(tiny, "tiny");
  typename TypeParam::Small small(golden("small.weights.safetensors").c_str());
  expect_reference_search(small, "small");
}

// Vocabulary restriction on the GPU (decode_step_restricted's linear_rows: the general matmul
// reading the ids' rows of the generator): the CPU library's restricted search, ids and scores,
// over a subset of the vocabulary that changes the result (asserted), greedy and beam 4.
TYPED_TEST(GpuModels, RestrictedSearchMatchesTheCpu) {
  typename TypeParam::Tiny gpu(golden("tiny.weights.safetensors").c_str());
  kiln_models::golden_tiny cpu(golden("tiny.weights.safetensors").c_str());
  kiln::Tensor<int64_t> src{{3, 5}, {3, 4, 5, 6, 7, 8, 9, 10, 0, 0, 11, 12, 0, 0, 0}};
  std::vector<int64_t> allowed;
  for (int64_t v = 0; v < 41; v += v % 3 == 0 ? 2 : 1) allowed.push_back(v);  // 28 of 41
  for (int32_t beam : {1, 4}) {
    kiln::SearchOptions o;
    o.beam_size = beam;
    o.max_decoding_length = 10;
    o.start_id = 1;
    o.end_id = 2;
    auto ids_of = [](const std::vector<std::vector<kiln::Hypothesis>>& g) {
      std::vector<std::vector<int64_t>> ids;
      for (const auto& sentence : g)
        for (const kiln::Hypothesis& h : sentence) ids.push_back(h.ids);
      return ids;
    };
    const auto full = cpu.generate(src, o);
    o.vocabulary = allowed.data();
    o.num_vocabulary = static_cast<int32_t>(allowed.size());
    const auto want = cpu.generate(src, o), got = gpu.generate(src, o);
    EXPECT_NE(ids_of(want), ids_of(full)) << "beam " << beam << ": the subset changes the search";
    EXPECT_EQ(ids_of(got), ids_of(want)) << "beam " << beam;
    ASSERT_EQ(got.size(), want.size());
    for (size_t b = 0; b < got.size(); ++b)
      for (size_t h = 0; h < got[b].size() && h < want[b].size(); ++h)
        EXPECT_NEAR(got[b][h].score, want[b][h].score, 1e-4) << "beam " << beam << ", " << b;
  }
}

// tests/CMakeLists.txt's gpu_odd and cuda_odd settings (decode_odd's).
const std::vector<std::string> kOddSettings = {
    "d_model=21",   "heads=3",      "d_ff=13",  "src_vocab=17", "tgt_vocab=19",
    "enc_layers=1", "dec_layers=2", "pad_id=2", "max_len=12",   "max_batch=3"};

TYPED_TEST(GpuModels, OddConfigMatchesInterpreter) {
  ir::Module m = models::build_model("transformer", "tiny", kOddSettings);
  ir::WeightMap wm = testing::random_weights(m, 23);
  std::vector<rt::TensorData> tensors;
  for (const ir::Weight& w : m.weights)
    if (!w.derivation)
      tensors.push_back(rt::make_f32(w.name, wm.at(w.name).shape, wm.at(w.name).f));
  const std::string path = ::testing::TempDir() + TypeParam::kLabel + "_odd.safetensors";
  rt::write_safetensors(path, tensors);
  typename TypeParam::Odd model(path.c_str());
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
  std::printf("[ %s ] odd config, %d runs vs interpreter: max abs error %.3g\n", TypeParam::kLabel,
              runs, worst);
}

}  // namespace
}  // namespace kiln
