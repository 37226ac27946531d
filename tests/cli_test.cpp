// The `kiln` CLI end to end: help, emit | inspect, run with the interpreter, and clear
// one-line errors (non-zero exit) for bad models, keys, files and token ids.
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <string>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kiln/runtime.h"
#include "runtime/cpu_features.h"
#include "runtime/safetensors.h"
#include "tests/cli_run.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

struct Result {
  int status;
  std::string output;  // stdout and stderr
};

std::string golden(const std::string& f) {
  return std::string(KILN_TEST_DATA_DIR) + "/golden/" + f;
}

// Runs kiln with `args` (words separated by spaces; the tests' paths hold none).
Result run(const std::string& args, const testing::CliOptions& options = {}) {
  const testing::CliResult r = testing::run_cli("%kiln " + args, options);
  return {r.status, r.output};
}

// `kiln FIRST | kiln SECOND`: SECOND reads what FIRST wrote to its standard output.
Result pipe(const std::string& first, const std::string& second) {
  const testing::CliResult a = testing::run_cli("%kiln " + first, {.join_stderr = false});
  if (a.status != 0) return {a.status, a.output + a.errors};
  return run(second, {.input = a.output});
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kiln_cli_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& f) const { return (dir_ / f).string(); }
  std::filesystem::path dir_;
};

TEST_F(CliTest, HelpForEveryCommand) {
  Result r = run("--help");
  EXPECT_EQ(r.status, 0);
  EXPECT_THAT(r.output, HasSubstr("usage: kiln <command>"));
  for (const char* cmd : {"emit", "inspect", "run", "opt", "compile", "translate"}) {
    Result c = run(std::string(cmd) + " --help");
    EXPECT_EQ(c.status, 0) << cmd;
    EXPECT_THAT(c.output, StartsWith(std::string("usage: kiln ") + cmd)) << cmd;
  }
  Result bad = run("frobnicate");
  EXPECT_EQ(bad.status, 1);
  EXPECT_EQ(bad.output, "kiln: error: unknown command 'frobnicate' (see 'kiln --help')\n");
}

// Issue 24: every option is declared once (CLI11, tools/cli.cpp and tools/kiln.cpp). Numbers
// are read whole, and a bad one is one error line naming the option and the value (std::stod
// took "1e-4junk" as 1e-4); CLI11's own errors are kiln's error line too.
TEST_F(CliTest, OptionValuesAreStrict) {
  const std::string interpret = "run m.kir --weights w.safetensors --inputs i.safetensors";
  const std::string compiled = "run --compiled out --weights w.safetensors --inputs i.safetensors";
  const std::string translate = "translate --compiled out --weights w.safetensors";
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {interpret + " --atol 1e-4junk", "run: --atol must be a number, got '1e-4junk'"},
      {interpret + " --atol nan", "run: --atol must be a number, got 'nan'"},
      {compiled + " --threads 2x", "run: --threads must be a whole number >= 1, got '2x'"},
      {translate + " --beam 2x",
       "translate: --beam must be a whole number in [0, 2147483647], got '2x'"},
      {translate + " --max-len 4294967296",
       "translate: --max-len must be a whole number in [0, 2147483647], got '4294967296'"},
      {translate + " --length-penalty 0.6.1",
       "translate: --length-penalty must be a number, got '0.6.1'"},
      {translate + " --seed -3",
       "translate: --seed must be a whole number in [0, 9223372036854775807], got '-3'"},
      {translate + " --bogus 3",
       "translate: unknown option '--bogus' (see 'kiln translate --help')"},
      {"translate --weights w.safetensors",
       "translate: --compiled is required (see 'kiln translate --help')"},
      {interpret + " --repeat 2", "run: --repeat needs --compiled DIR"},
      {"emit transformer --config", "emit: option '--config' needs a value"},
  };
  for (const Case& c : cases) {
    Result r = run(c.args);
    EXPECT_EQ(r.status, 1) << c.args;
    EXPECT_EQ(r.output, "kiln: error: " + c.message + "\n") << c.args;
  }
}

// Issue 24: kiln translate's options are bound to a kiln_search_options that
// kiln_search_options_init filled, so its help shows the C ABI's defaults; kiln --version is
// the CMake project's version.
TEST_F(CliTest, HelpShowsTheSearchDefaultsAndVersion) {
  kiln_search_options defaults;
  kiln_search_options_init(&defaults);
  Result help = run("translate --help");
  EXPECT_EQ(help.status, 0);
  EXPECT_THAT(help.output, StartsWith("usage: kiln translate --compiled DIR"));
  EXPECT_THAT(help.output, ::testing::ContainsRegex("\n  --beam N +beam size [^\n]*\\(default: " +
                                                    std::to_string(defaults.beam_size) + "\\)\n"));
  EXPECT_THAT(help.output,
              ::testing::ContainsRegex("\n  --max-len N +[^(]*\\(default: " +
                                       std::to_string(defaults.max_decoding_length) + "\\)\n"));
  EXPECT_THAT(help.output, HasSubstr("0: the model's max_len"));
  Result version = run("--version");
  EXPECT_EQ(version.status, 0);
  EXPECT_EQ(version.output, "kiln " KILN_VERSION "\n");
}

TEST_F(CliTest, EmitBaseIntoInspect) {
  Result r = pipe("emit transformer --config base", "inspect -");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("weights: 260 tensors, 93,324,544 parameters"));
  EXPECT_THAT(r.output, HasSubstr("entry point forward(%src: i64[B,S], %tgt: i64[B,T]) -> "
                                  "(%logits: f32[B,T,32000])"));
  EXPECT_THAT(r.output, HasSubstr("entry point encode(%src: i64[B,S]) -> (%memory: f32[B,S,512])"));
  Result ops = pipe("emit transformer --config base", "inspect - --ops");
  ASSERT_EQ(ops.status, 0) << ops.output;
  // 18 attention blocks, each with one softmax, in forward; 6 in encode.
  EXPECT_THAT(ops.output, HasSubstr("forward softmax 18\n"));
  EXPECT_THAT(ops.output, HasSubstr("encode softmax 6\n"));
  // 30 sublayer norms + 2 final norms in forward.
  EXPECT_THAT(ops.output, HasSubstr("forward layernorm 32\n"));
}

TEST_F(CliTest, EmitErrorsNameTheProblem) {
  Result r = run("emit transformer --set d_model=500");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output, "kiln: error: config 'd_model' = 500 is not divisible by 'heads' = 8\n");
  r = run("emit transformer --set colour=blue");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output,
              StartsWith("kiln: error: unknown config key 'colour' for model 'transformer'"));
  r = run("emit transformer --bogus");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output, HasSubstr("emit: unknown option '--bogus'"));
}

TEST_F(CliTest, EmitWritesFileAndSetOverrides) {
  Result r = run("emit transformer --config tiny --set max_len=64 -o " + path("t.kir"));
  ASSERT_EQ(r.status, 0) << r.output;
  Result i = run("inspect " + path("t.kir"));
  EXPECT_THAT(i.output, HasSubstr("symbols: B<=4 S<=64 T<=64"));
}

TEST_F(CliTest, RunMatchesGoldenAndWritesOutputs) {
  ASSERT_EQ(run("emit transformer --config tiny -o " + path("tiny.kir")).status, 0);
  Result r = run("run " + path("tiny.kir") + " --weights " + golden("tiny.weights.safetensors") +
                 " --inputs " + golden("tiny_b1.inputs.safetensors") + " --expect " +
                 golden("tiny_b1.expected.safetensors") + " -o " + path("out.safetensors"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("logits: max abs error"));
  EXPECT_THAT(r.output, HasSubstr("match"));
  rt::SafeTensors out = rt::SafeTensors::load(path("out.safetensors"));
  EXPECT_EQ(out.at("logits").shape, (std::vector<int64_t>{3, 6, 41}));

  Result e =
      run("run " + path("tiny.kir") + " --function encode --weights " +
          golden("tiny.weights.safetensors") + " --inputs " + golden("tiny_b1.inputs.safetensors") +
          " --expect " + golden("tiny_b1.expected.safetensors"));
  ASSERT_EQ(e.status, 0) << e.output;
  EXPECT_THAT(e.output, HasSubstr("memory: max abs error"));
}

TEST_F(CliTest, RunRejectsOutOfRangeTokenIds) {
  ASSERT_EQ(run("emit transformer --config tiny -o " + path("tiny.kir")).status, 0);
  for (int64_t bad : {37, 1000000, -1}) {
    std::vector<int64_t> src = {5, 6, bad, 0}, tgt = {3, 4, 0};
    rt::write_safetensors(path("bad.safetensors"),
                          {rt::make_i64("src", {1, 4}, src), rt::make_i64("tgt", {1, 3}, tgt)});
    Result r = run("run " + path("tiny.kir") + " --weights " + golden("tiny.weights.safetensors") +
                   " --inputs " + path("bad.safetensors"));
    EXPECT_EQ(r.status, 1) << bad;
    EXPECT_EQ(r.output, "kiln: error: token id " + std::to_string(bad) +
                            " at 'src'[0,2] is out of range [0, 37)\n");
  }
}

TEST_F(CliTest, RunRejectsTooLongInputs) {
  ASSERT_EQ(run("emit transformer --config tiny -o " + path("tiny.kir")).status, 0);
  std::vector<int64_t> src(41, 3), tgt = {3};
  rt::write_safetensors(path("long.safetensors"),
                        {rt::make_i64("src", {1, 41}, src), rt::make_i64("tgt", {1, 1}, tgt)});
  Result r = run("run " + path("tiny.kir") + " --weights " + golden("tiny.weights.safetensors") +
                 " --inputs " + path("long.safetensors"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output,
              HasSubstr("input 'src' has shape [1,41]: dim 1 (S) is 41, above its maximum 40"));
}

TEST_F(CliTest, RunReportsWeightMismatchesByName) {
  ASSERT_EQ(run("emit transformer --config small -o " + path("small.kir")).status, 0);
  // tiny's weights for the small model: every shape differs; names of missing ones listed.
  Result r = run("run " + path("small.kir") + " --weights " + golden("tiny.weights.safetensors") +
                 " --inputs " + golden("small_b1.inputs.safetensors"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output, HasSubstr("do not match the model"));
  EXPECT_THAT(r.output, HasSubstr("tensor 'src_embed.weight' has shape [37,24], expected [53,20]"));
  EXPECT_THAT(r.output,
              HasSubstr("missing tensor 'decoder.layers.2.norm3.bias' (expected F32 [20])"));
}

TEST_F(CliTest, BadIrTextIsLocated) {
  FILE* f = fopen(path("bad.kir").c_str(), "w");
  fputs(
      "module @m {\n  symbol B max 4\n  func @f(%x: f32[B]) -> (f32[B]) {\n"
      "    %0 = relu(%x) : f33[B]\n    return %0\n  }\n}\n",
      f);
  fclose(f);
  Result r = run("inspect " + path("bad.kir"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output,
              StartsWith("kiln: error: " + path("bad.kir") + ":4:21: error: unknown dtype 'f33'"));
}

// Issue acceptance: the compiled golden models through `kiln run --compiled`.
TEST_F(CliTest, CompileSharedAndRunCompiledMatchesGolden) {
  ASSERT_EQ(run("emit transformer --config small -o " + path("small.kir")).status, 0);
  Result c = run("compile " + path("small.kir") + " --emit=static,shared,ir --name small -o " +
                 path("out"));
  ASSERT_EQ(c.status, 0) << c.output;
  EXPECT_THAT(c.output, HasSubstr("kiln compile: [1/"));  // progress per kernel
  EXPECT_THAT(c.output, HasSubstr("kernels in"));
  for (const char* f : {"libsmall.a", "libsmall.so", "small.h", "small.kir"})
    EXPECT_TRUE(std::filesystem::exists(path("out/") + f)) << f;
  for (const char* fn : {"forward", "encode"}) {
    Result r = run("run --compiled " + path("out") + " --function " + fn + " --weights " +
                   golden("small.weights.safetensors") + " --inputs " +
                   golden("small_b1.inputs.safetensors") + " --expect " +
                   golden("small_b1.expected.safetensors"));
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr("(match <= 0.0001)")) << fn;
  }
  // Run-time input checks come from the compiled library too.
  std::vector<int64_t> src = {5, 53, 2}, tgt = {3};
  rt::write_safetensors(path("bad.safetensors"),
                        {rt::make_i64("src", {1, 3}, src), rt::make_i64("tgt", {1, 1}, tgt)});
  Result bad = run("run --compiled " + path("out") + " --weights " +
                   golden("small.weights.safetensors") + " --inputs " + path("bad.safetensors"));
  EXPECT_EQ(bad.status, 1);
  EXPECT_EQ(bad.output, "kiln: error: token id 53 at 'src'[0,1] is out of range [0, 53)\n");
  // --repeat and --profile: the runs and every kernel call are counted.
  const std::string compiled_run = "run --compiled " + path("out") + " --weights " +
                                   golden("small.weights.safetensors") + " --inputs " +
                                   golden("small_b1.inputs.safetensors");
  Result prof = run(compiled_run + " --function encode --repeat 3 --profile");
  EXPECT_EQ(prof.status, 0) << prof.output;
  EXPECT_THAT(prof.output, HasSubstr("kiln profile: 'encode' ran 3 time(s)"));
  EXPECT_THAT(prof.output, HasSubstr("ms per call"));
  // small has one encoder layer: 3 runs call its merged q/k/v projection (N = 3·20) 3 times.
  EXPECT_THAT(prof.output, ::testing::ContainsRegex("small_kiln_linear_k20_n60 +3 "));
  EXPECT_EQ(run(compiled_run + " --repeat 0").output,
            "kiln: error: run: --repeat must be a whole number >= 1, got '0'\n");
  EXPECT_EQ(run(compiled_run + " --threads two").output,
            "kiln: error: run: --threads must be a whole number >= 1, got 'two'\n");
  EXPECT_EQ(run("run " + path("small.kir") + " --weights " + golden("small.weights.safetensors") +
                " --inputs " + golden("small_b1.inputs.safetensors") + " --profile")
                .output,
            "kiln: error: run: --profile needs --compiled DIR\n");

  // kiln translate: beam search from the CLI gives the reference search's ids
  // (tests/golden/small_decode.safetensors, case beam_c: start 2, end 21).
  const std::string translate = "translate --compiled " + path("out") + " --weights " +
                                golden("small.weights.safetensors") + " --inputs " +
                                golden("small_decode.safetensors");
  Result t = run(translate +
                 " --beam 3 --num-hypotheses 2 --max-len 10 --min-len 1 --length-penalty 0.6 "
                 "--start-id 2 --end-id 21 -o " +
                 path("beam.safetensors"));
  ASSERT_EQ(t.status, 0) << t.output;
  rt::SafeTensors got = rt::SafeTensors::load(path("beam.safetensors"));
  rt::SafeTensors want = rt::SafeTensors::load(golden("small_decode.safetensors"));
  EXPECT_EQ(got.to_i64(got.at("ids")), want.to_i64(want.at("beam_c.ids")));
  EXPECT_EQ(got.to_i64(got.at("lengths")), want.to_i64(want.at("beam_c.lengths")));
  // Printed without -o; bad options name the problem.
  Result printed = run(translate + " --max-len 3 --start-id 2 --end-id 21");
  EXPECT_EQ(printed.status, 0) << printed.output;
  EXPECT_THAT(printed.output, HasSubstr("sentence 2 hypothesis 0: score "));
  EXPECT_EQ(run(translate + " --beam 0").output,
            "kiln: error: beam_size is 0; it must be at least 1\n");
  EXPECT_EQ(run(translate + " --beam 5").output,
            "kiln: error: beam_size 5 is above the compiled maximum 4 (max_beam)\n");
  EXPECT_EQ(run(translate + " --max-len 49").output,
            "kiln: error: max_decoding_length 49 is above the model's max_len 48\n");
  EXPECT_EQ(
      run(translate + " --beam two").output,
      "kiln: error: translate: --beam must be a whole number in [0, 2147483647], got 'two'\n");
  EXPECT_EQ(run("translate --compiled " + path("out") + " --weights " +
                golden("small.weights.safetensors"))
                .output,
            "kiln: error: translate: give either --inputs IN.safetensors or --src-vocab and "
            "--tgt-vocab\n");
}

// A GPT-style block (tests/e2e/gpt_block.kir: pre-norm, causal mask bool[1,1,T,T] or'ed
// with key padding, GELU MLP, tied output projection): the default pipeline leaves no
// softmax, no layernorm and no separate residual add or GELU, and the compiled code matches
// the interpreter on a padded batch.
TEST_F(CliTest, GptBlockFusesAndCompiledMatchesInterpreter) {
  const std::string kir = std::string(KILN_TEST_DATA_DIR) + "/e2e/gpt_block.kir";
  ASSERT_EQ(run("opt " + kir + " -o " + path("opt.kir")).status, 0);
  Result ops = run("inspect " + path("opt.kir") + " --ops");
  ASSERT_EQ(ops.status, 0) << ops.output;
  EXPECT_THAT(ops.output, HasSubstr("forward attention 1\n"));
  // ln_1 and ln_2 (their sums are also the residuals) and ln_f.
  EXPECT_THAT(ops.output, HasSubstr("forward add_layernorm 3\n"));
  EXPECT_THAT(ops.output, HasSubstr("forward add_layernorm_sum 2\n"));
  for (const char* unfused : {"softmax", " layernorm", " add ", "gelu", "matmul", "select"})
    EXPECT_THAT(ops.output, Not(HasSubstr(std::string("forward ") + unfused))) << ops.output;
  Result text = run("opt " + kir);
  EXPECT_THAT(text.output, HasSubstr("{act = \"gelu\"}"));
  EXPECT_THAT(text.output, HasSubstr("{causal = 1, heads = 2, scale = 0.35355339059327373}"));

  // Random weights and a padded batch: the second row ends in two padding ids.
  struct Named {
    const char* name;
    std::vector<int64_t> shape;
  };
  const std::vector<Named> weights = {{"wte.weight", {16, 16}},
                                      {"wpe.weight", {8, 16}},
                                      {"h.0.ln_1.weight", {16}},
                                      {"h.0.ln_1.bias", {16}},
                                      {"h.0.attn.q.weight", {16, 16}},
                                      {"h.0.attn.q.bias", {16}},
                                      {"h.0.attn.k.weight", {16, 16}},
                                      {"h.0.attn.k.bias", {16}},
                                      {"h.0.attn.v.weight", {16, 16}},
                                      {"h.0.attn.v.bias", {16}},
                                      {"h.0.attn.proj.weight", {16, 16}},
                                      {"h.0.attn.proj.bias", {16}},
                                      {"h.0.ln_2.weight", {16}},
                                      {"h.0.ln_2.bias", {16}},
                                      {"h.0.mlp.fc.weight", {32, 16}},
                                      {"h.0.mlp.fc.bias", {32}},
                                      {"h.0.mlp.proj.weight", {16, 32}},
                                      {"h.0.mlp.proj.bias", {16}},
                                      {"ln_f.weight", {16}},
                                      {"ln_f.bias", {16}}};
  std::vector<rt::TensorData> tensors;
  uint32_t seed = 1;
  for (const Named& w : weights) {
    int64_t n = 1;
    for (int64_t d : w.shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) {  // deterministic values in [-1, 1)
      seed = seed * 1664525u + 1013904223u;
      x = static_cast<float>(seed >> 8) / static_cast<float>(1 << 23) - 1.0f;
    }
    tensors.push_back(rt::make_f32(w.name, w.shape, v));
  }
  rt::write_safetensors(path("w.safetensors"), tensors);
  rt::write_safetensors(
      path("in.safetensors"),
      {rt::make_i64("ids", {2, 7}, {5, 3, 9, 1, 12, 4, 7, 2, 8, 15, 6, 11, 0, 0})});
  Result ref = run("run " + kir + " --weights " + path("w.safetensors") + " --inputs " +
                   path("in.safetensors") + " -o " + path("ref.safetensors"));
  ASSERT_EQ(ref.status, 0) << ref.output;
  Result c = run("compile " + kir + " --emit=shared --name gpt -o " + path("out"));
  ASSERT_EQ(c.status, 0) << c.output;
  Result r =
      run("run --compiled " + path("out") + " --weights " + path("w.safetensors") + " --inputs " +
          path("in.safetensors") + " --expect " + path("ref.safetensors") + " --atol 1e-5");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("(match <= 1e-05)")) << r.output;
  std::printf("%s", r.output.c_str());  // the error, for the record
}

// Issue 26: a Mixtral-style sparse MoE block (tests/passes/pipeline/moe.kir: 4 experts,
// top-2) compiled as a shared library runs through `kiln run --compiled` like the
// interpreter, and its profile counts the expert rows: 2 per token (7 tokens: 14), never
// more than tokens · experts.
TEST_F(CliTest, SparseMoeCompiledMatchesInterpreterAndProfilesItsExperts) {
  const std::string kir = std::string(KILN_TEST_DATA_DIR) + "/passes/pipeline/moe.kir";
  std::vector<rt::TensorData> tensors;
  uint32_t seed = 7;
  auto values = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) {  // deterministic values in [-1, 1)
      seed = seed * 1664525u + 1013904223u;
      x = static_cast<float>(seed >> 8) / static_cast<float>(1 << 23) - 1.0f;
    }
    return v;
  };
  tensors.push_back(rt::make_f32("block_sparse_moe.gate.weight", {4, 8}, values(32)));
  for (int e = 0; e < 4; ++e)
    for (const char* w : {"w1", "w2", "w3"}) {
      const std::vector<int64_t> shape =
          std::string(w) == "w2" ? std::vector<int64_t>{8, 6} : std::vector<int64_t>{6, 8};
      tensors.push_back(rt::make_f32(fmt::format("block_sparse_moe.experts.{}.{}.weight", e, w),
                                     shape, values(48)));
    }
  rt::write_safetensors(path("moe_w.safetensors"), tensors);
  rt::write_safetensors(path("moe_in.safetensors"), {rt::make_f32("x", {7, 8}, values(56))});
  Result ref = run("run " + kir + " --weights " + path("moe_w.safetensors") + " --inputs " +
                   path("moe_in.safetensors") + " -o " + path("moe_ref.safetensors"));
  ASSERT_EQ(ref.status, 0) << ref.output;
  Result c = run("compile " + kir + " --emit=shared --name moe -o " + path("moe_out"));
  ASSERT_EQ(c.status, 0) << c.output;
  Result r = run("run --compiled " + path("moe_out") + " --weights " + path("moe_w.safetensors") +
                 " --inputs " + path("moe_in.safetensors") + " --expect " +
                 path("moe_ref.safetensors") + " --atol 1e-5 --profile");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("(match <= 1e-05)")) << r.output;
  EXPECT_THAT(r.output,
              ::testing::ContainsRegex("kiln profile: builtin 'forward: moe_ffn %[0-9]+' ran 1 "
                                       "time\\(s\\), [0-9.]+ ms per run, [1-4] experts run over "
                                       "14 expert rows"))
      << r.output;
  std::printf("%s", r.output.c_str());  // the error and the profile, for the record
}

// Issue 24: kiln compile calls its toolchain from argv lists, never through a shell, so an
// output directory whose name holds a space, both quotes and a `$` works: the library is
// written (static, shared, IR) and `kiln run --compiled` runs it. Kernels compile two at
// a time (-j 2); -j 0 is an error.
TEST_F(CliTest, CompileIntoDirectoryWithSpaceQuotesAndDollar) {
  ASSERT_EQ(run("emit transformer --config tiny -o " + path("tiny.kir")).status, 0);
  const std::string out = path("out dir 'single' \"double\" $HOME $(false) `false`");
  const testing::CliResult c =
      testing::run_argv({"%kiln", "compile", path("tiny.kir"), "--emit=static,shared,ir", "--name",
                         "tiny", "-j", "2", "-o", out});
  ASSERT_EQ(c.status, 0) << c.output;
  EXPECT_THAT(c.output, HasSubstr("kiln compile: [1/"));
  for (const char* f : {"libtiny.a", "libtiny.so", "tiny.h", "tiny.kir"})
    EXPECT_TRUE(std::filesystem::exists(out + "/" + f)) << f;
  // Nothing else was created beside it (a word of the name taken for a path).
  std::set<std::string> entries;
  for (const auto& e : std::filesystem::directory_iterator(dir_))
    entries.insert(e.path().filename().string());
  EXPECT_EQ(entries,
            (std::set<std::string>{"tiny.kir", std::filesystem::path(out).filename().string()}));
  const testing::CliResult r = testing::run_argv(
      {"%kiln", "run", "--compiled", out, "--function", "forward", "--weights",
       golden("tiny.weights.safetensors"), "--inputs", golden("tiny_b1.inputs.safetensors"),
       "--expect", golden("tiny_b1.expected.safetensors")});
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("(match <= 0.0001)"));
  EXPECT_EQ(run("compile " + path("tiny.kir") + " -j 0 -o " + path("zero")).output,
            "kiln: error: compile: -j must be a whole number >= 1, got '0'\n");
}

// Issue 24: SIGINT during kiln compile kills the kernel compiles it started, removes what
// it wrote (the staging directory and the output directory it created) and ends kiln by
// the signal itself.
TEST_F(CliTest, InterruptedCompileCleansUpAndDiesOfTheSignal) {
  ASSERT_EQ(run("emit transformer --config base -o " + path("base.kir")).status, 0);
  const std::string out = path("interrupted");
  // timeout sends SIGINT after 3 s (the base model's kernels take far longer) and, with
  // --preserve-status, exits as kiln did: 128 + SIGINT for a death by the signal.
  const testing::CliResult r =
      testing::run_argv({"timeout", "--preserve-status", "-s", "INT", "3", testing::kiln_binary(),
                         "compile", path("base.kir"), "-j", "2", "-o", out});
  EXPECT_EQ(r.status, 128 + SIGINT) << r.output;
  EXPECT_THAT(r.output, Not(HasSubstr("kiln: error")));
  EXPECT_FALSE(std::filesystem::exists(out));
  // No compile of this output directory is left running (kiln's forked children keep its
  // argv, which names the directory).
  for (const auto& proc : std::filesystem::directory_iterator("/proc")) {
    std::ifstream in(proc.path() / "cmdline", std::ios::binary);
    const std::string cmdline(std::istreambuf_iterator<char>(in), {});
    EXPECT_EQ(cmdline.find(out), std::string::npos) << "still running: " << proc.path();
  }
}

TEST_F(CliTest, CompileErrorsNameTheProblem) {
  // What the interpreter runs but compiled code does not (i32 tensors): the op and its line.
  FILE* f = fopen(path("i32.kir").c_str(), "w");
  fputs(
      "module @m {\n  symbol B max 4\n  func @f(%x: i64[B,8]) -> (i64[B,8]) {\n"
      "    %c = cast(%x) : i32[B,8]\n    %y = cast(%c) : i64[B,8]\n    return %y\n  }\n}\n",
      f);
  fclose(f);
  Result r = run("compile " + path("i32.kir") + " -o " + path("out"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output, HasSubstr("line 4: function 'f': cast %c takes or makes an i32 tensor; "
                                  "compiled code supports f32, i64 and bool"));
  ASSERT_EQ(run("emit transformer --config tiny -o " + path("tiny.kir")).status, 0);
  Result t =
      run("compile " + path("tiny.kir") + " --target x86-64-linux-nonsense -o " + path("out"));
  EXPECT_EQ(t.status, 1);
  EXPECT_THAT(t.output, HasSubstr("invalid target 'x86-64-linux-nonsense'"));
  Result n = run("compile " + path("tiny.kir") + " --name 9lives -o " + path("out"));
  EXPECT_EQ(n.status, 1);
  EXPECT_THAT(n.output, HasSubstr("library name '9lives' is not a C identifier"));
}

// --weights: bf16 needs an AVX-512 target; anything but f32 and bf16 is refused by name.
TEST_F(CliTest, Bf16WeightsNeedAnAvx512Target) {
  ASSERT_EQ(run("emit transformer --config tiny -o " + path("tiny16.kir")).status, 0);
  Result avx2 = run("compile " + path("tiny16.kir") +
                    " --weights bf16 --target x86-64-linux-avx-avx2-fma-sse41 -o " + path("o16"));
  EXPECT_EQ(avx2.status, 1);
  EXPECT_THAT(avx2.output, HasSubstr("kiln: error: bf16 weights need an x86-64 target with "
                                     "AVX-512 (avx512_skylake or higher)"));
  EXPECT_THAT(avx2.output, HasSubstr("has no avx512_skylake"));
  Result fp8 = run("compile " + path("tiny16.kir") + " --weights fp8 -o " + path("o16"));
  EXPECT_EQ(fp8.status, 1);
  EXPECT_THAT(fp8.output, HasSubstr("unknown weight type 'fp8' (use f32, bf16 or int8)"));
  Result products = run("compile " + path("tiny16.kir") +
                        " --weights bf16 --bf16-products amx -o " + path("o16"));
  EXPECT_NE(products.status, 0);
  EXPECT_THAT(products.output, HasSubstr("--bf16-products amx not in {auto,dot,fma}"));
}

// --bf16-products auto (the default) builds both forms of the products into the library (its
// archive has the _bf16 kernels and the _bf16fma ones), which runs the faster one on the CPU it
// loads on (bf16_test's Bf16Auto); kiln compile says so and what this CPU would run, by the
// rates it measured. dot or fma builds that form only.
TEST_F(CliTest, Bf16ProductsAutoBuildsBothForms) {
  ASSERT_EQ(run("emit transformer --config tiny -o " + path("tinyp.kir")).status, 0);
  Result r = run("compile " + path("tinyp.kir") + " --weights bf16 --name p -o " + path("op"));
  ASSERT_EQ(r.status, 0) << r.output;
  const std::regex line(
      R"(bf16 products: both forms, vdpbf16ps and f32 FMAs \(attention in f32\), the library )"
      R"(runs the faster one on the CPU it loads on \(auto; this CPU does ([0-9.]+) bf16 )"
      R"(products per ns with vdpbf16ps, ([0-9.]+) with FMAs: it would run (the FMA form|vdpbf16ps))");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, line)) << r.output;
  EXPECT_EQ(m[3].str() == "the FMA form", std::stod(m[2].str()) > 1.1 * std::stod(m[1].str()))
      << m[0].str();
  EXPECT_THAT(r.output, HasSubstr("(both forms of the bf16 products)"));
  // The archive's symbol table names every kernel.
  auto archive = [&](const std::string& dir, const std::string& name) {
    std::ifstream in(path(dir) + "/lib" + name + ".a", std::ios::binary);
    return std::string{std::istreambuf_iterator<char>(in), {}};
  };
  const std::string both = archive("op", "p");
  ASSERT_FALSE(both.empty());
  EXPECT_NE(both.find("_bf16fma_argv"), std::string::npos);
  EXPECT_NE(both.find("_bf16_argv"), std::string::npos);
  Result dot = run("compile " + path("tinyp.kir") +
                   " --weights bf16 --bf16-products dot --name d -o " + path("od"));
  ASSERT_EQ(dot.status, 0) << dot.output;
  EXPECT_THAT(dot.output, HasSubstr("bf16 products: vdpbf16ps (--bf16-products dot)"));
  const std::string one = archive("od", "d");
  ASSERT_FALSE(one.empty());
  EXPECT_EQ(one.find("_bf16fma_argv"), std::string::npos);
  EXPECT_NE(one.find("_bf16_argv"), std::string::npos);
}

// --weights int8 needs an AVX-512 target too (its kernels use AVX512-VNNI), a CPU with VNNI
// (at compile time for `host`, at load for the library), and is for the CPU.
TEST_F(CliTest, Int8WeightsNeedAnAvx512Target) {
  ASSERT_EQ(run("emit transformer --config tiny -o " + path("tiny8.kir")).status, 0);
  Result avx2 = run("compile " + path("tiny8.kir") +
                    " --weights int8 --target x86-64-linux-avx-avx2-fma-sse41 -o " + path("o8"));
  EXPECT_EQ(avx2.status, 1);
  EXPECT_THAT(avx2.output, HasSubstr("kiln: error: int8 weights need an x86-64 target with "
                                     "AVX-512 (avx512_skylake or higher) on a CPU with "
                                     "AVX512-VNNI; target 'x86-64-linux-avx-avx2-fma-sse41' "
                                     "has no avx512_skylake"));
  Result gpu =
      run("compile " + path("tiny8.kir") + " --weights int8 --target host-opencl -o " + path("o8"));
  EXPECT_EQ(gpu.status, 1);
  EXPECT_THAT(gpu.output, HasSubstr("int8 weights are for the CPU (AVX512-VNNI); target "
                                    "'host-opencl' runs kernels on the GPU"));
  // A reduction longer than the int32 sums hold exactly (127 · 255 · K < 2^31) is refused.
  std::ofstream(path("long.kir"))
      << "module @m {\n  symbol M max 4\n  weight @w : f32[8,70000]\n"
         "  func @f(%x: f32[M,70000]) -> (f32[M,8]) {\n"
         "    %w = weight() {name = \"w\"} : f32[8,70000]\n"
         "    %y = linear(%x, %w) {act = \"none\"} : f32[M,8]\n    return %y\n  }\n}\n";
  Result long_k = run("compile " + path("long.kir") + " --weights int8 -o " + path("o8"));
  EXPECT_EQ(long_k.status, 1);
  EXPECT_THAT(long_k.output, HasSubstr(": K = 70000 is more than int8 weights allow (65536: "
                                       "the int32 sums must be exact)"));
  // On a CPU without AVX512-VNNI (KILN_CPU_LACKS hides it from this machine's CPUID): `host`
  // is refused at compile time, and a library compiled on a CPU with it is refused at load,
  // naming the feature, never run into SIGILL.
  if (!rt::missing_cpu_features("x86-64-linux-avx512_vnni").empty())
    GTEST_SKIP() << "this CPU has no AVX512-VNNI: the int8 library cannot be built here";
  const std::vector<std::string> no_vnni = {"KILN_CPU_LACKS=AVX512-VNNI"};
  Result host =
      run("compile " + path("tiny8.kir") + " --weights int8 -o " + path("o8"), {.env = no_vnni});
  EXPECT_EQ(host.status, 1);
  EXPECT_THAT(host.output, HasSubstr("int8 weights need AVX512-VNNI, which this CPU lacks "
                                     "(avx512_vnni (AVX512-VNNI))"));
  // Its attention in both forms by default (--bf16-products auto): bf16 products (vdpbf16ps)
  // and f32; the library needs AVX512-VNNI only, and runs f32 attention on a CPU without
  // AVX512-BF16 (Int8Auto in int8_test). dot alone is refused on such a CPU.
  const std::vector<std::string> no_bf16 = {"KILN_CPU_LACKS=AVX512-BF16"};
  Result dot =
      run("compile " + path("tiny8.kir") + " --weights int8 --bf16-products dot -o " + path("o8"),
          {.env = no_bf16});
  EXPECT_EQ(dot.status, 1);
  EXPECT_THAT(dot.output, HasSubstr("int8 weights with --bf16-products dot run attention on "
                                    "AVX512-BF16, which this CPU lacks; use --bf16-products auto "
                                    "or fma (attention in f32)"));
  Result built = run("compile " + path("tiny8.kir") +
                     " --weights int8 --emit=shared --name tiny8 -o " + path("lib8"));
  ASSERT_EQ(built.status, 0) << built.output;
  EXPECT_THAT(built.output, HasSubstr("int8 attention: both forms, bf16 products on vdpbf16ps and "
                                      "f32"));
  const std::string run_lib = "run --compiled " + path("lib8") + " --weights " +
                              golden("tiny.weights.safetensors") + " --inputs " +
                              golden("tiny_b1.inputs.safetensors") + " -o " + path("out8.st");
  Result loads = run(run_lib);
  EXPECT_EQ(loads.status, 0) << loads.output;
  // The form each CPU runs: its profile names the attention kernel (bf16: "_bf16").
  Result dot_form = run(run_lib + " --profile", {.env = {"KILN_BF16_PRODUCTS=dot"}});
  Result without_bf16 = run(run_lib + " --profile", {.env = no_bf16});
  if (rt::missing_cpu_features("x86-64-linux-avx512_bf16").empty()) {
    EXPECT_EQ(dot_form.status, 0) << dot_form.output;
    EXPECT_THAT(dot_form.output, HasSubstr("_bf16 "));
  }
  EXPECT_EQ(without_bf16.status, 0) << without_bf16.output;
  EXPECT_THAT(without_bf16.output, HasSubstr("kiln_attention_"));
  EXPECT_THAT(without_bf16.output, Not(HasSubstr("_bf16 ")));
  Result forced = run(run_lib, {.env = {"KILN_CPU_LACKS=AVX512-BF16", "KILN_BF16_PRODUCTS=dot"}});
  EXPECT_EQ(forced.status, 1);
  EXPECT_THAT(forced.output, HasSubstr("KILN_BF16_PRODUCTS is 'dot', but this CPU has no "
                                       "AVX512-BF16"));
  Result refused = run(run_lib, {.env = no_vnni});
  EXPECT_EQ(refused.status, 1);
  // On Intel Sapphire/Emerald Rapids the host target also has avx512_sapphirerapids, which
  // needs VNNI too: the list names it first.
  EXPECT_THAT(refused.output, HasSubstr("but this CPU lacks "));
  EXPECT_THAT(refused.output, HasSubstr("avx512_vnni (AVX512-VNNI); compile it again"));
}

// Inputs and outputs named like C++ keywords still give a header that compiles (kiln
// compile builds it with the glue); entry points that cannot be methods of the generated
// class are refused up front, by name.
TEST_F(CliTest, CompileHandlesNamesThatAreNotCppFriendly) {
  auto write = [&](const std::string& file, const std::string& func) {
    FILE* f = fopen(path(file).c_str(), "w");
    fputs(
        ("module @m {\n  symbol B max 4\n  func @" + func +
         "(%class: f32[B,8]) -> (f32[B,8]) {\n    %new = relu(%class) : f32[B,8]\n    return %new\n"
         "  }\n}\n")
            .c_str(),
        f);
    fclose(f);
  };
  write("keywords.kir", "f");
  Result ok = run("compile " + path("keywords.kir") + " --name m -o " + path("kw"));
  ASSERT_EQ(ok.status, 0) << ok.output;
  EXPECT_THAT(ok.output, HasSubstr("glue code and header"));
  std::ifstream header(path("kw/m.h"));
  std::string text((std::istreambuf_iterator<char>(header)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("void f(const kiln::Input& input0, kiln::Tensor<float>& output0)"));
  EXPECT_THAT(text,
              HasSubstr("f(class: f32[B,8]) -> (new: f32[B,8])"));  // the real names, in comments
  for (const char* bad : {"run", "m", "max_B"}) {
    write("bad.kir", bad);
    Result r = run("compile " + path("bad.kir") + " --name m -o " + path("bad"));
    EXPECT_EQ(r.status, 1);
    EXPECT_THAT(r.output, HasSubstr(std::string("entry point '") + bad +
                                    "' clashes with a member of the generated class m"));
    EXPECT_THAT(r.output, Not(HasSubstr("kernel")));  // refused before compiling kernels
  }
}

// `kiln opt` output is byte-identical across runs.
TEST_F(CliTest, OptIsDeterministic) {
  Result a = pipe("emit transformer --config base", "opt -");
  Result b = pipe("emit transformer --config base", "opt -");
  ASSERT_EQ(a.status, 0);
  EXPECT_EQ(a.output, b.output);
  EXPECT_THAT(a.output, HasSubstr("attention("));
}

// Issue 10: an attribute of the wrong type is a located verifier error (exit 1), not an
// internal error in the interpreter or codegen (it was exit 134).
TEST_F(CliTest, WrongAttributeTypeIsLocatedError) {
  std::ofstream(path("causal.kir"))
      << "module @m {\n  symbol B max 2\n  symbol S max 4\n"
         "  func @f(%q: f32[B,S,8]) -> (f32[B,S,8]) {\n"
         "    %o = attention(%q, %q, %q) {causal = \"yes\", heads = 2, scale = 0.5} : "
         "f32[B,S,8]\n    return %o\n  }\n}\n";
  const std::string expected = "kiln: error: " + path("causal.kir") +
                               ":5:5: error: [V10] attention: attribute 'causal' must be an "
                               "integer, got string \"yes\"\n";
  Result c = run("compile " + path("causal.kir") + " -o " + path("out"));
  EXPECT_EQ(c.status, 1);
  EXPECT_EQ(c.output, expected);
  Result r =
      run("run " + path("causal.kir") + " --function f --weights " +
          golden("tiny.weights.safetensors") + " --inputs " + golden("tiny_b1.inputs.safetensors"));
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output, expected);
  Result o = run("opt " + path("causal.kir"));
  EXPECT_EQ(o.status, 1);
  EXPECT_EQ(o.output, expected);
}

// Issue 10: files that are not files. A directory or a device given as the IR, the
// weights or the inputs is a `kiln: error:` naming it (it was basic_filebuf::underflow and
// std::bad_alloc, exit 70).
TEST_F(CliTest, DirectoriesAndDevicesAreNotFiles) {
  ASSERT_EQ(run("emit transformer --config tiny -o " + path("tiny.kir")).status, 0);
  const std::string dir = dir_.string();
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {"inspect " + dir, "'" + dir + "' is a directory"},
      {"inspect /dev/zero", "'/dev/zero' is not a regular file"},
      {"compile /dev/null -o " + path("out"), "'/dev/null' is not a regular file"},
      {"run " + path("tiny.kir") + " --weights /dev/zero --inputs " +
           golden("tiny_b1.inputs.safetensors"),
       "safetensors file '/dev/zero' is not a regular file"},
      {"run " + path("tiny.kir") + " --weights " + golden("tiny.weights.safetensors") +
           " --inputs " + dir,
       "safetensors file '" + dir + "' is a directory"},
  };
  for (const Case& c : cases) {
    Result r = run(c.args);
    EXPECT_EQ(r.status, 1) << c.args;
    EXPECT_EQ(r.output, "kiln: error: " + c.message + "\n") << c.args;
  }
  // A pipe is still read (process substitution, `-`).
  std::ifstream kir(path("tiny.kir"), std::ios::binary);
  Result piped = run("inspect -", {.input = std::string(std::istreambuf_iterator<char>(kir), {})});
  EXPECT_EQ(piped.status, 0) << piped.output;
}

// Issue 10: a 64 GiB constant verifies, then the interpreter refuses it before allocating.
TEST_F(CliTest, HugeConstantIsRefusedByTheInterpreter) {
  std::ofstream(path("huge.kir")) << "module @m {\n  func @f() -> (f32[4096,4096,1024]) {\n"
                                     "    %c = constant() {value = 1.0} : f32[4096,4096,1024]\n"
                                     "    return %c\n  }\n}\n";
  rt::write_safetensors(path("none.safetensors"), {});
  Result r = run("run " + path("huge.kir") + " --function f --weights " + path("none.safetensors") +
                 " --inputs " + path("none.safetensors"));
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output,
            "kiln: error: line 3: function 'f', op 0 (%c = constant): its result "
            "f32[4096,4096,1024] of shape [4096,4096,1024] needs more than 4294967296 bytes, the "
            "interpreter's limit per tensor\n");
}

// Issue 10: an absurd layer count is refused before the IR is built (it ran out of memory).
TEST_F(CliTest, AbsurdLayerCountIsRefused) {
  Result r = run("emit transformer --config tiny --set enc_layers=100000000");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output,
            "kiln: error: config 'enc_layers' is 100000000, above the limit of 1000 layers\n");
}

// Issue 10: absurd sizes are refused before anything large is allocated. kiln emit checks
// the config's largest tensors (naming the keys; the product may overflow 64 bits), and
// kiln compile the arena of each function (naming it and the op that does not fit), where
// the compiled model used to fail only when it was created.
TEST_F(CliTest, AbsurdSizesAreRefused) {
  Result e =
      run("emit transformer --config tiny --set max_batch=1000000000000 -o " + path("huge.kir"));
  EXPECT_EQ(e.status, 1);
  EXPECT_EQ(e.output,
            "kiln: error: config 'max_batch' * 'max_len' * 'tgt_vocab' = 1000000000000 * 40 * 41 "
            "values of 4 bytes: a tensor above the limit of 1099511627776 bytes\n");
  EXPECT_FALSE(std::filesystem::exists(path("huge.kir")));
  Result o = run("emit transformer --config tiny --set max_batch=4611686018427387904");
  EXPECT_EQ(o.status, 1);
  EXPECT_THAT(o.output, StartsWith("kiln: error: config 'max_batch' * 'max_len' * 'tgt_vocab' = "
                                   "4611686018427387904 * 40 * 41 values of 4 bytes"));

  {
    std::ofstream f(path("arena.kir"));
    f << R"(module @m {
  symbol B max 1000000000
  func @f(%x: f32[B,256]) -> (f32[B,256]) {
    %a = exp(%x) : f32[B,256]
    %b = sqrt(%x) : f32[B,256]
    %c = add(%a, %b) : f32[B,256]
    return %c
  }
}
)";
  }
  Result c = run("compile " + path("arena.kir") + " -o " + path("out"));
  EXPECT_EQ(c.status, 1);
  EXPECT_EQ(c.output,
            "kiln: error: line 5: function 'f': the arena would need more than 1099511627776 "
            "bytes at the symbols' maxima (%b (sqrt) of 1024000000000 bytes at offset "
            "1024000000000)\n");
  EXPECT_FALSE(std::filesystem::exists(path("out")));
}

}  // namespace
}  // namespace kiln
