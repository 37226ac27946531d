// The default pipeline end to end: the fused graph of the base Transformer has the
// expected shape, the golden models keep their outputs, and the output is deterministic.
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "frontend/models.h"
#include "ir/printer.h"
#include "pass_harness.h"
#include "passes/pipeline.h"
#include "tools/bridge.h"

namespace kiln {
namespace {

std::map<std::string, int> histogram(const ir::Function& f) {
  std::map<std::string, int> h;
  for (const ir::Op& op : f.ops) ++h[ir::op_name(op.kind)];
  return h;
}

ir::Module optimized(const std::string& config) {
  return testing::after_passes(models::build_model("transformer", config),
                               passes::default_pipeline());
}

TEST(DefaultPipeline, BaseForwardIsFullyFused) {
  ir::Module m = optimized("base");
  std::map<std::string, int> h = histogram(*m.find_function("forward"));
  EXPECT_EQ(h["attention"], 18);  // 6 encoder self, 6 decoder self, 6 cross
  EXPECT_EQ(h["add_layernorm"], 30);
  EXPECT_EQ(h["layernorm"], 2);  // encoder.norm and decoder.norm
  EXPECT_EQ(h.count("softmax"), 0u);
  EXPECT_EQ(h.count("transpose"), 0u);
  EXPECT_EQ(h.count("matmul"), 0u);
  EXPECT_EQ(h["linear"], 67);  // 6·(qkv, o, w_1, w_2) + 6·(qkv, q, kv, o, w_1, w_2) + generator
  std::map<std::string, int> e = histogram(*m.find_function("encode"));
  EXPECT_EQ(e["attention"], 6);
  EXPECT_EQ(e["add_layernorm"], 12);
  EXPECT_EQ(e["layernorm"], 1);
}

struct Golden {
  const char* config;
  const char* batch;
};

class DefaultPipelineGolden : public ::testing::TestWithParam<Golden> {};

// Optimized vs unoptimized within 1e-5 (the fused ops round like their unfused graphs;
// only the attention scale multiplies instead of dividing, 1 ulp), and vs PyTorch within 1e-4.
TEST_P(DefaultPipelineGolden, KeepsOutputs) {
  const Golden& g = GetParam();
  auto path = [](const std::string& f) { return std::string(KILN_TEST_DATA_DIR) + "/golden/" + f; };
  ir::Module plain = models::build_model("transformer", g.config);
  ir::Module opt = optimized(g.config);
  rt::SafeTensors weights =
      rt::SafeTensors::load(path(std::string(g.config) + ".weights.safetensors"));
  rt::SafeTensors inputs =
      rt::SafeTensors::load(path(std::string(g.batch) + ".inputs.safetensors"));
  rt::SafeTensors expected =
      rt::SafeTensors::load(path(std::string(g.batch) + ".expected.safetensors"));
  ir::WeightMap w_plain = tools::load_weight_map(plain, weights);
  ir::WeightMap w_opt = tools::load_weight_map(opt, weights);
  for (const char* fn : {"forward", "encode"}) {
    const ir::Function& fp = *plain.find_function(fn);
    const ir::Function& fo = *opt.find_function(fn);
    auto a = ir::interpret(plain, fp, w_plain, tools::load_inputs(fp, inputs));
    auto b = ir::interpret(opt, fo, w_opt, tools::load_inputs(fo, inputs));
    double vs_plain = testing::max_abs_diff(a, b);
    const rt::TensorInfo& t = expected.at(std::string(fn) == "forward" ? "logits" : "memory");
    std::vector<float> want = expected.to_f32(t);
    double vs_torch = 0;
    for (size_t i = 0; i < want.size(); ++i)
      vs_torch = std::max(vs_torch, std::abs(static_cast<double>(b[0].f[i]) - want[i]));
    EXPECT_LE(vs_plain, 1e-5) << fn;
    EXPECT_LE(vs_torch, 1e-4) << fn;
    std::printf("[ pipeline ] %s %s: optimized vs unoptimized %.3g, vs PyTorch %.3g\n", g.batch, fn,
                vs_plain, vs_torch);
  }
}

INSTANTIATE_TEST_SUITE_P(Batches, DefaultPipelineGolden,
                         ::testing::Values(Golden{"tiny", "tiny_b1"}, Golden{"tiny", "tiny_b2"},
                                           Golden{"small", "small_b1"}),
                         [](const auto& info) { return std::string(info.param.batch); });

// Odd lengths and padding through the whole pipeline (every pass together).
TEST(DefaultPipeline, DifferentialOnOddLengths) {
  ir::Module plain = models::build_model("transformer", "tiny");
  double d = testing::max_difference(plain, optimized("tiny"), {1, 7, 33});
  EXPECT_LE(d, 1e-5);
}

TEST(DefaultPipeline, IsDeterministic) {
  std::string first = ir::print_module(optimized("base"));
  for (int i = 0; i < 2; ++i) EXPECT_EQ(ir::print_module(optimized("base")), first);
  // And the result is a fixed point: running the pipeline again changes nothing.
  ir::Module again = testing::after_passes(optimized("tiny"), passes::default_pipeline());
  EXPECT_EQ(ir::print_module(again), ir::print_module(optimized("tiny")));
}

}  // namespace
}  // namespace kiln
