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
#include "gpu_golden_small.h"
#include "gpu_golden_tiny.h"
#include "gpu_odd.h"
#include "ir/interpreter.h"
#include "opencl_device.h"
#include "pass_harness.h"
#include "runtime/safetensors.h"

namespace kiln {
namespace {

// As for the CPU build (compiled_model_test.cpp): f32 kernels summing in another order than
// PyTorch, whose f32-vs-f64 noise on these models is ~2e-6.
constexpr double kGoldenTolerance = 1e-4;
// Scores of the reference search (float64 there, f32 logits here), as decode_test.cpp.
constexpr double kScoreTolerance = 1e-4;

#define SKIP_WITHOUT_OPENCL()                      \
  do {                                             \
    if (!testing::opencl_device_present())         \
      GTEST_SKIP() << "no OpenCL device (install " \
                      "pocl-opencl-icd)";          \
  } while (0)

std::string golden(const std::string& f) {
  return std::string(KILN_TEST_DATA_DIR) + "/golden/" + f;
}

double max_diff(const kiln::Tensor<float>& got, const std::vector<float>& want,
                const std::vector<int64_t>& want_shape) {
  EXPECT_EQ(got.shape, want_shape);
  if (got.data.size() != want.size()) return INFINITY;
  double err = 0;
  for (size_t i = 0; i < want.size(); ++i)
    err = std::max(err, std::abs(static_cast<double>(got.data[i]) - want[i]));
  return err;
}

template <typename Model>
void expect_golden(Model& model, const std::string& batch) {
  auto src = kiln::read_tensor<int64_t>(golden(batch + ".inputs.safetensors"), "src");
  auto tgt = kiln::read_tensor<int64_t>(golden(batch + ".inputs.safetensors"), "tgt");
  auto logits = kiln::read_tensor<float>(golden(batch + ".expected.safetensors"), "logits");
  auto memory = kiln::read_tensor<float>(golden(batch + ".expected.safetensors"), "memory");
  const double e_fwd = max_diff(model.forward(src, tgt), logits.data, logits.shape);
  const double e_enc = max_diff(model.encode(src), memory.data, memory.shape);
  EXPECT_LE(e_fwd, kGoldenTolerance) << batch;
  EXPECT_LE(e_enc, kGoldenTolerance) << batch;
  std::printf("[ opencl ] %s: forward max abs error %.3g, encode max abs error %.3g\n",
              batch.c_str(), e_fwd, e_enc);
}

TEST(GpuModels, TinyMatchesPyTorch) {
  SKIP_WITHOUT_OPENCL();
  kiln_models::gpu_golden_tiny model(golden("tiny.weights.safetensors").c_str());
  expect_golden(model, "tiny_b1");
  expect_golden(model, "tiny_b2");
}

TEST(GpuModels, SmallMatchesPyTorch) {
  SKIP_WITHOUT_OPENCL();
  kiln_models::gpu_golden_small model(golden("small.weights.safetensors").c_str());
  expect_golden(model, "small_b1");
}

// Greedy and beam search, every decoder step on the GPU: the ids and scores of the PyTorch
// reference search of tests/golden/<name>_decode.safetensors (see make_decode_golden.py).
void expect_reference_search(kiln::Model& model, const std::string& name) {
  rt::SafeTensors file = rt::SafeTensors::load(golden(name + "_decode.safetensors"));
  const auto& meta = file.metadata();
  auto src_info = file.at("src");
  kiln::Tensor<int64_t> src{src_info.shape, file.to_i64(src_info)};
  std::stringstream cases(meta.at("cases"));
  std::string c;
  int checked = 0;
  while (std::getline(cases, c, ',')) {
    kiln::SearchOptions o;
    o.beam_size = std::stoi(meta.at(c + ".beam_size"));
    o.num_hypotheses = std::stoi(meta.at(c + ".num_hypotheses"));
    o.max_decoding_length = std::stoi(meta.at(c + ".max_decoding_length"));
    o.min_decoding_length = std::stoi(meta.at(c + ".min_decoding_length"));
    o.length_penalty = std::stof(meta.at(c + ".length_penalty"));
    o.start_id = std::stoll(meta.at("start_id"));
    o.end_id = std::stoll(meta.at("end_id"));
    const std::vector<int64_t> want_ids = file.to_i64(file.at(c + ".ids"));
    const std::vector<int64_t> want_len = file.to_i64(file.at(c + ".lengths"));
    const std::vector<float> want_scores = file.to_f32(file.at(c + ".scores"));
    const auto got = model.generate(src, o);
    ASSERT_EQ(static_cast<int64_t>(got.size()), src.shape[0]) << c;
    const int64_t H = o.num_hypotheses, L = o.max_decoding_length;
    for (int64_t b = 0; b < src.shape[0]; ++b) {
      ASSERT_EQ(static_cast<int64_t>(got[b].size()), H) << c;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t at = b * H + h;
        std::vector<int64_t> want(want_ids.begin() + at * L,
                                  want_ids.begin() + at * L + want_len[at]);
        EXPECT_EQ(got[b][h].ids, want) << name << " " << c << " sentence " << b << " hyp " << h;
        EXPECT_NEAR(got[b][h].score, want_scores[at], kScoreTolerance)
            << name << " " << c << " sentence " << b << " hyp " << h;
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, 4) << "cases in " << name << "_decode.safetensors";
  std::printf("[ opencl ] %s: %d search cases as the PyTorch reference\n", name.c_str(), checked);
}

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
          const double e = max_diff(got, want[0].f, want[0].shape);
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
