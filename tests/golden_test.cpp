// End-to-end: the DSL's Transformer, run by the reference interpreter on the golden
// weights and batches, matches the PyTorch reference outputs (tests/golden/).
#include <cmath>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "frontend/models.h"
#include "ir/interpreter.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "tools/bridge.h"

namespace kiln {
namespace {

// PyTorch f32 vs f64 differs by ~2e-6 on these models (tests/golden/README.md); the
// interpreter accumulates in double, so 1e-4 leaves a wide margin and still catches any
// semantic slip (a wrong mask or scale moves logits by 1e-2 or more).
constexpr double kTolerance = 1e-4;

std::string golden(const std::string& file) {
  return std::string(KILN_TEST_DATA_DIR) + "/golden/" + file;
}

double max_abs_diff(const ir::Tensor& got, const rt::SafeTensors& file, const std::string& name) {
  const rt::TensorInfo& t = file.at(name);
  EXPECT_EQ(got.shape, t.shape) << name;
  std::vector<float> want = file.to_f32(t);
  EXPECT_EQ(got.f.size(), want.size());
  double err = 0;
  for (size_t i = 0; i < want.size() && i < got.f.size(); ++i)
    err = std::max(err, std::abs(static_cast<double>(got.f[i]) - want[i]));
  return err;
}

struct GoldenCase {
  const char* config;
  const char* batch;
};

class GoldenTest : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(GoldenTest, InterpreterMatchesPyTorch) {
  const GoldenCase& c = GetParam();
  // Through the text form too: what the interpreter runs is what `kiln emit` prints.
  ir::Module built = models::build_model("transformer", c.config);
  ir::Module m = ir::parse_and_verify(ir::print_module(built));

  rt::SafeTensors weights =
      rt::SafeTensors::load(golden(std::string(c.config) + ".weights.safetensors"));
  // The registry's config is the script's (but for the decoding settings, which the
  // checkpoint does not fix, and what nn::add_seq2seq derives for kiln_generate).
  for (const auto& [key, value] : m.config) {
    if (key == "max_beam" || key == "bos_id" || key == "eos_id" || key == "generation" ||
        key == "cache_widths")
      continue;
    ASSERT_TRUE(weights.metadata().count(key)) << key;
    EXPECT_EQ(weights.metadata().at(key), value) << key;
  }
  ir::WeightMap wm = tools::load_weight_map(m, weights);
  rt::SafeTensors inputs =
      rt::SafeTensors::load(golden(std::string(c.batch) + ".inputs.safetensors"));
  rt::SafeTensors expected =
      rt::SafeTensors::load(golden(std::string(c.batch) + ".expected.safetensors"));

  const ir::Function* forward = m.find_function("forward");
  ASSERT_NE(forward, nullptr);
  auto logits = ir::interpret(m, *forward, wm, tools::load_inputs(*forward, inputs));
  double logits_err = max_abs_diff(logits.at(0), expected, "logits");
  EXPECT_LE(logits_err, kTolerance);

  const ir::Function* encode = m.find_function("encode");
  ASSERT_NE(encode, nullptr);
  auto memory = ir::interpret(m, *encode, wm, tools::load_inputs(*encode, inputs));
  double memory_err = max_abs_diff(memory.at(0), expected, "memory");
  EXPECT_LE(memory_err, kTolerance);

  std::printf("[ golden   ] %s: forward max abs error %.3g, encode max abs error %.3g\n", c.batch,
              logits_err, memory_err);
  RecordProperty("logits_max_abs_error", std::to_string(logits_err));
  RecordProperty("memory_max_abs_error", std::to_string(memory_err));
}

INSTANTIATE_TEST_SUITE_P(Batches, GoldenTest,
                         ::testing::Values(GoldenCase{"tiny", "tiny_b1"},
                                           GoldenCase{"tiny", "tiny_b2"},
                                           GoldenCase{"small", "small_b1"}),
                         [](const auto& info) { return std::string(info.param.batch); });

// A different mask or scale must move the output well past the tolerance: the test
// above can fail.
TEST(GoldenSensitivity, WrongPadIdIsDetected) {
  ir::Module m = models::build_model("transformer", "tiny", {"pad_id=5"});
  rt::SafeTensors weights = rt::SafeTensors::load(golden("tiny.weights.safetensors"));
  ir::WeightMap wm = tools::load_weight_map(m, weights);
  rt::SafeTensors inputs = rt::SafeTensors::load(golden("tiny_b1.inputs.safetensors"));
  rt::SafeTensors expected = rt::SafeTensors::load(golden("tiny_b1.expected.safetensors"));
  const ir::Function* forward = m.find_function("forward");
  auto logits = ir::interpret(m, *forward, wm, tools::load_inputs(*forward, inputs));
  EXPECT_GT(max_abs_diff(logits.at(0), expected, "logits"), 100 * kTolerance);
}

}  // namespace
}  // namespace kiln
