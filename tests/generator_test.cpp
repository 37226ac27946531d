// The generator program of a user's model (frontend/generator.h): options, configs and
// --set overrides, and errors naming what is wrong.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/cli_run.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;
using testing::run_cli;

std::string toy() { return std::string(KILN_BINARY_DIR) + "/tests/toy_generator"; }

TEST(Generator, ListsTheModelAndItsConfigs) {
  auto r = run_cli(toy() + " --list");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output,
            "toy: mean-pooled embeddings and a linear layer\n"
            "  config small: classes=3 dim=6 max_len=9 vocab=11\n"
            "  config wide: classes=5 dim=16 max_len=9 vocab=11\n");
}

TEST(Generator, WritesTheIrOfTheChosenConfigWithOverrides) {
  auto r = run_cli(toy() + " --config wide --set classes=7 --set=max_len=13 -o -",
                   {.join_stderr = false});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("module @toy {"));
  EXPECT_THAT(r.output, HasSubstr("symbol S max 13"));
  EXPECT_THAT(r.output, HasSubstr("weight @head.weight : f32[7,16]"));
  // The IR is what `kiln` reads: it verifies and runs through the pipeline.
  const std::string kir = std::string(KILN_BINARY_DIR) + "/tests/toy_small.kir";
  auto written = run_cli(toy() + " --config small -o " + kir);
  ASSERT_EQ(written.status, 0) << written.output;
  auto opt = run_cli("%kiln inspect " + kir + " --ops");
  ASSERT_EQ(opt.status, 0) << opt.output;
  EXPECT_THAT(opt.output, HasSubstr("forward reduce_mean 1"));
}

TEST(Generator, ErrorsNameTheConfigOrKey) {
  auto r = run_cli(toy() + " --config huge");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output, HasSubstr("error: model 'toy' has no config 'huge' (known: small, wide)"));
  r = run_cli(toy() + " --config small --set heads=4");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output, HasSubstr("error: unknown config key 'heads' for model 'toy' (keys: "
                                  "classes, dim, max_len, vocab)"));
  r = run_cli(toy() + " --config small --set dim=six");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output, HasSubstr("config key 'dim' needs an integer, got 'six'"));
  // Two configs and neither is 'base': the generator asks for one.
  r = run_cli(toy());
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output, HasSubstr("model 'toy' has 2 configs and none is 'base': choose one with "
                                  "--config (known: small, wide)"));
  r = run_cli(toy() + " --frobnicate");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output, HasSubstr("unknown argument '--frobnicate'"));
  // An error of the model's own DSL code reaches the user as a message, not a crash.
  r = run_cli(toy() + " --config small --set dim=0");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output, HasSubstr("weight 'emb.weight' has a dim of size 0"));
}

}  // namespace
}  // namespace kiln
