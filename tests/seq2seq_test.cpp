// An encoder–decoder written by a user (examples/models/t5.cpp: T5 v1.1-style, RMS norms,
// relative position bias, gated-GELU) generating through nn::add_seq2seq's entry points
// (frontend/seq2seq.h), against its PyTorch twin (examples/models/make_generate_golden.py):
// - forward, interpreted and compiled, within 1e-4 of the twin's logits;
// - every entry point fused (one attention op per attention, the decoder's in decode_step
//   cache_attention with the relative bias and memory_attention), and no lost-fusion note;
// - prepare + decode_step against forward at every position, interpreted and compiled, on a
//   batch of sources of different lengths (padded);
// - kiln_generate's greedy and beam search (4 beams, 4 hypotheses): the twin's ids with a KV
//   cache, source by source; `kiln generate` from sources;
// - the DSL's refusals (a cross-attention in a decoder-only model, a bias on one).
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "error_of.h"
#include "example_golden.h"
#include "frontend/seq2seq.h"
#include "ir/interpreter.h"
#include "ir/parser.h"
#include "kiln/runtime.h"
#include "passes/pipeline.h"
#include "runtime/safetensors.h"
#include "support/read_file.h"
#include "t5_small.h"
#include "tests/cli_run.h"
#include "tools/bridge.h"

namespace kiln {
namespace {

using testing::golden;
using testing::golden_row;
using ::testing::HasSubstr;
using testing::max_diff;
using testing::read;

class T5 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::vector<uint8_t> text = read_input_file(KILN_T5_KIR);
    module_ = new ir::Module(ir::parse_module(std::string(text.begin(), text.end())));
    const std::string w = golden("t5.weights.safetensors");
    weights_ = new ir::WeightMap(tools::load_weight_map(*module_, rt::SafeTensors::load(w)));
    model_ = new kiln_models::t5_small(w.c_str());
  }
  static void TearDownTestSuite() {
    delete model_;
    delete weights_;
    delete module_;
  }
  static const ir::Function& function(const std::string& f) {
    for (const ir::Function& fn : module_->functions)
      if (fn.name == f) return fn;
    throw std::runtime_error("no function " + f);
  }
  // Runs `f` interpreted or compiled; inputs in the function's parameter order, each named.
  static std::vector<ir::Tensor> run(const ir::Function& f, const std::vector<ir::Tensor>& in,
                                     bool compiled, size_t updated = 0) {
    if (!compiled) return ir::interpret(*module_, f, *weights_, in);
    std::vector<kiln::Input> ins;
    std::vector<kiln::Tensor<int64_t>> ints;
    std::vector<kiln::Tensor<float>> floats;
    ints.reserve(in.size());
    floats.reserve(in.size() + f.results.size());
    for (const ir::Tensor& t : in)
      if (t.dtype == ir::DType::f32)
        ins.push_back(floats.emplace_back(kiln::Tensor<float>{t.shape, t.f}));
      else
        ins.push_back(ints.emplace_back(kiln::Tensor<int64_t>{t.shape, t.ints}));
    // Outputs: fresh tensors, then the `updated` caches in place (the last inputs).
    std::vector<kiln::Output> outs;
    const size_t fresh = f.results.size() - updated, first_cache = floats.size() - updated;
    for (size_t i = 0; i < fresh; ++i) outs.push_back(floats.emplace_back());
    for (size_t i = 0; i < updated; ++i) outs.push_back(floats[first_cache + i]);
    model_->run(f.name.c_str(), ins, outs);
    std::vector<ir::Tensor> out;
    for (size_t i = 0; i < fresh; ++i)
      out.push_back(ir::Tensor::from_f32(floats[first_cache + updated + i].shape,
                                         floats[first_cache + updated + i].data));
    for (size_t i = 0; i < updated; ++i)
      out.push_back(
          ir::Tensor::from_f32(floats[first_cache + i].shape, floats[first_cache + i].data));
    return out;
  }

  static ir::Module* module_;
  static ir::WeightMap* weights_;
  static kiln_models::t5_small* model_;
};

ir::Module* T5::module_ = nullptr;
ir::WeightMap* T5::weights_ = nullptr;
kiln_models::t5_small* T5::model_ = nullptr;

TEST_F(T5, ForwardMatchesTheTwinInterpretedAndCompiled) {
  const ir::Tensor src = read("t5.inputs.safetensors", "src");
  const ir::Tensor tgt = read("t5.inputs.safetensors", "tgt");
  const ir::Tensor want = read("t5.expected.safetensors", "logits");
  for (bool compiled : {false, true})
    EXPECT_LE(max_diff(run(function("forward"), {src, tgt}, compiled)[0].f, want.f), 1e-4)
        << (compiled ? "compiled" : "interpreted");
}

// After the default pipeline: forward has one attention op per attention (2 encoder
// self-attentions with the bidirectional bias and padding, 2 decoder self-attentions with the
// causal bias, 2 cross-attentions); prepare keeps only the encoder and the memory's projections
// (the rest of the decoder was dead); decode_step has a cache_attention (with the bias) and a
// memory_attention per layer. No matmul, softmax or unfused norm anywhere, no note.
TEST_F(T5, EveryEntryPointIsFused) {
  ir::Module m = *module_;
  const std::vector<passes::LostFusion> notes = passes::run_passes(m, passes::default_pipeline());
  for (const passes::LostFusion& n : notes)
    ADD_FAILURE() << "note: " << n.function << " " << n.value << ": " << n.what << ": " << n.reason;
  std::map<std::string, std::map<std::string, int64_t>> count;
  for (const ir::Function& f : m.functions)
    for (const ir::Op& op : f.ops) ++count[f.name][std::string(ir::op_name(op.kind))];
  EXPECT_EQ(count["forward"]["attention"], 6);
  EXPECT_EQ(count["encode"]["attention"], 2);
  EXPECT_EQ(count["prepare"]["attention"], 2);
  EXPECT_EQ(count["decode_step"]["cache_attention"], 2);
  EXPECT_EQ(count["decode_step"]["memory_attention"], 2);
  EXPECT_EQ(count["decode_step"]["attention"], 0);
  // decode_step_restricted: the same step, its head a linear_rows (restrict-vocabulary).
  EXPECT_EQ(count["decode_step_restricted"]["cache_attention"], 2);
  EXPECT_EQ(count["decode_step_restricted"]["memory_attention"], 2);
  EXPECT_EQ(count["decode_step_restricted"]["linear_rows"], 1);
  EXPECT_EQ(count["decode_step_restricted"]["take_along_axis"], 0);
  EXPECT_EQ(count["decode_step_restricted"]["linear"] + 1, count["decode_step"]["linear"]);
  int64_t biased = 0;
  for (const ir::Function& f : m.functions)
    for (const ir::Op& op : f.ops)
      if (op.kind == ir::OpKind::cache_attention) biased += op.operands.size() == 5;
  EXPECT_EQ(biased, 4) << "the decoder's relative bias reaches cache_attention in both steps";
  for (const auto& [fname, c] : count) {
    for (const char* gone : {"matmul", "softmax", "reduce_mean", "rsqrt", "layernorm_unfused"})
      EXPECT_EQ(c.count(gone) ? c.at(gone) : 0, 0) << fname << ": " << gone;
  }
  // prepare reads the encoder and the cross-attentions' key and value projections only: the
  // rest of the decoder, run for them, was dead code.
  for (const ir::Function& f : m.functions) {
    if (f.name != "prepare") continue;
    for (const ir::Op& op : f.ops) {
      if (op.kind != ir::OpKind::weight) continue;
      const std::string name = std::get<std::string>(op.attrs.at("name"));
      if (name.find("decoder.") != std::string::npos)
        EXPECT_THAT(name, ::testing::ContainsRegex("EncDecAttention\\.(k|v|k_v)\\.weight$"))
            << "prepare reads " << name;
    }
  }
}

// prepare, then decode_step one target token at a time (each hypothesis in its own slot),
// against forward's logits at that position; interpreted and compiled, sources of different
// lengths padded in one batch.
TEST_F(T5, StepsMatchForward) {
  const ir::Tensor src = read("t5.inputs.safetensors", "src");
  const ir::Tensor tgt = read("t5.inputs.safetensors", "tgt");
  const int64_t batch = tgt.shape[0], T = tgt.shape[1];
  const ir::Tensor want = run(function("forward"), {src, tgt}, false)[0];
  const int64_t V = want.shape[2];
  const ir::Function& step = function("decode_step");
  for (bool compiled : {false, true}) {
    const std::vector<ir::Tensor> mem = run(function("prepare"), {src}, compiled);
    ASSERT_EQ(mem.size(), 4u);
    std::vector<ir::Tensor> caches;
    for (ir::ValueId v : step.params)
      if (step.values[v].name.rfind("cache_", 0) == 0)
        caches.push_back(
            ir::Tensor::zeros(ir::DType::f32, {T, batch, step.type(v).shape[2].value}));
    ASSERT_EQ(caches.size(), 4u);
    std::vector<int64_t> src_row(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) src_row[b] = b;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int64_t> tok(static_cast<size_t>(batch)),
          rows(static_cast<size_t>(batch * (t + 1)));
      for (int64_t b = 0; b < batch; ++b) {
        tok[b] = tgt.ints[b * T + t];
        for (int64_t j = 0; j <= t; ++j) rows[b * (t + 1) + j] = b;
      }
      std::vector<ir::Tensor> in = {ir::Tensor::from_ints(ir::DType::i64, {batch, 1}, tok),
                                    ir::Tensor::from_ints(ir::DType::i64, {1}, {t}),
                                    ir::Tensor::from_ints(ir::DType::i64, {batch, t + 1}, rows),
                                    ir::Tensor::from_ints(ir::DType::i64, {batch}, src_row), src};
      in.insert(in.end(), mem.begin(), mem.end());
      in.insert(in.end(), caches.begin(), caches.end());
      const std::vector<ir::Tensor> out = run(step, in, compiled, caches.size());
      for (size_t i = 0; i < caches.size(); ++i) caches[i] = out[1 + i];
      for (int64_t b = 0; b < batch; ++b)
        EXPECT_LE(
            max_diff({out[0].f.begin() + b * V, out[0].f.begin() + (b + 1) * V},
                     {want.f.begin() + (b * T + t) * V, want.f.begin() + (b * T + t + 1) * V}),
            1e-4)
            << (compiled ? "compiled" : "interpreted") << " step " << t << ", sentence " << b;
    }
  }
}

// kiln_generate on the padded batch of sources against the twin's searches, source by source.
TEST_F(T5, GreedyAndBeamMatchTheTwinsSearchWithAKVCache) {
  const ir::Tensor src = read("t5.generate.safetensors", "prompts");
  const ir::Tensor greedy = read("t5.generate.safetensors", "greedy");
  const ir::Tensor beam = read("t5.generate.safetensors", "beam");
  const ir::Tensor scores = read("t5.generate.safetensors", "beam_scores");
  const kiln::Tensor<int64_t> in{src.shape, src.ints};
  kiln::SearchOptions o;
  o.max_decoding_length = 32;
  const auto g = model_->generate(in, o);
  ASSERT_EQ(g.size(), 3u);
  for (int64_t b = 0; b < 3; ++b)
    EXPECT_EQ(g[b].at(0).ids, golden_row(greedy, b)) << "greedy " << b;
  o.beam_size = 4;
  o.num_hypotheses = 4;
  const auto bs = model_->generate(in, o);
  ASSERT_EQ(bs.size(), 3u);
  for (int64_t b = 0; b < 3; ++b) {
    ASSERT_EQ(bs[b].size(), 4u);
    for (int64_t h = 0; h < 4; ++h) {
      EXPECT_EQ(bs[b][h].ids, golden_row(beam, b * 4 + h)) << "beam " << b << " " << h;
      EXPECT_NEAR(bs[b][h].score, scores.f[b * 4 + h], 1e-4) << "beam " << b << " " << h;
    }
  }
}

// kiln_generator_* on an encoder–decoder: decode_step has one position for every row, so a
// source joins only once none is running (runtime/generate.cpp, "Joining"); the batches it
// runs one after another give each source what kiln_generate gives the batch.
TEST_F(T5, AGeneratorRunsSourcesOnlyWhenNoneIsRunning) {
  const ir::Tensor src = read("t5.generate.safetensors", "prompts");
  const ir::Tensor greedy = read("t5.generate.safetensors", "greedy");
  kiln::SearchOptions o;
  o.max_decoding_length = 32;
  kiln_model* m = model_->get();
  kiln_generator* g = kiln_generator_create(m, &o);
  ASSERT_NE(g, nullptr) << kiln_model_error(m);
  auto row = [&](int64_t b) {
    kiln_tensor v{};
    v.name = "src";
    v.dtype = KILN_I64;
    v.rank = 2;
    v.shape[0] = 1;
    v.shape[1] = src.shape[1];
    v.data = const_cast<int64_t*>(src.ints.data() + b * src.shape[1]);
    v.capacity = static_cast<size_t>(src.shape[1]) * sizeof(int64_t);
    return v;
  };
  int64_t id = -1;
  for (int64_t b = 0; b < 3; ++b) {
    const kiln_tensor v = row(b);
    ASSERT_EQ(kiln_generator_add(g, &v, 0, &id), 0) << kiln_model_error(m);
    EXPECT_EQ(id, b);
    ASSERT_EQ(kiln_generator_step(g), 1) << kiln_model_error(m);
    const kiln_tensor next = row((b + 1) % 3);
    EXPECT_EQ(kiln_generator_add(g, &next, 0, &id), 1);  // not while one runs
    while (kiln_generator_step(g) > 0) {
    }
    int64_t done = -1;
    ASSERT_EQ(kiln_generator_finished(g, &done, 1), 1);
    EXPECT_EQ(done, b);
    kiln_generation r;
    ASSERT_EQ(kiln_generator_take(g, b, &r), 0) << kiln_model_error(m);
    EXPECT_EQ(std::vector<int64_t>(r.ids, r.ids + r.lengths[0]), golden_row(greedy, b))
        << "source " << b;
    kiln_generation_free(&r);
  }
  kiln_generator_free(g);
}

// `kiln generate` from sources (token ids, padded with the model's pad id): the twin's greedy ids.
TEST(GenerateCli, GeneratesFromSourcesWithAnEncoderDecoder) {
  const ir::Tensor src = read("t5.generate.safetensors", "prompts");
  const ir::Tensor greedy = read("t5.generate.safetensors", "greedy");
  std::vector<std::string> argv = {"%kiln",      "generate",
                                   "--compiled", KILN_GENERATE_T5_DIR,
                                   "--weights",  golden("t5.weights.safetensors"),
                                   "--max-len",  "32"};
  std::string want;
  for (int64_t b = 0; b < src.shape[0]; ++b) {
    std::vector<int64_t> row;
    for (int64_t j = 0; j < src.shape[1] && src.ints[b * src.shape[1] + j] != 0; ++j)
      row.push_back(src.ints[b * src.shape[1] + j]);
    argv.push_back(fmt::format("{}", fmt::join(row, " ")));
    want += fmt::format("{}\n", fmt::join(golden_row(greedy, b), " "));
  }
  const testing::CliResult r = testing::run_argv(argv);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output, want);
}

// The refusals, at the user's line.
TEST(Seq2SeqDsl, CrossAttentionNeedsAnEncoderAndTakesNoBias) {
  using dsl::Tensor;
  auto decoder_only = [] {
    dsl::ModelBuilder mb("m");
    nn::add_causal_lm(
        mb, {.vocab = 8, .max_len = 4},
        [](nn::Decoding& ctx, Tensor ids) {
          dsl::FunctionBuilder& f = *ids.builder();
          Tensor x = dsl::gather(f.weight("e", {8, 4}), ids);
          x = ctx.attention(x, x, x, {.heads = 2});
          return ctx.cross_attention(
              x, [](Tensor m) { return m; }, [](Tensor m) { return m; }, {.heads = 2});
        },
        [](Tensor h) {
          return dsl::matmul(h, h.builder()->weight("w", {4, 8}));
        });
  };
  EXPECT_THAT(testing::error_of(decoder_only),
              HasSubstr("ctx.cross_attention() is for encoder–decoder models (nn::add_seq2seq)"));
  auto biased = [] {
    dsl::ModelBuilder mb("m");
    nn::add_seq2seq(
        mb, {.vocab = 8, .max_len = 4, .max_src_len = 4},
        [](Tensor src) {
          return dsl::gather(src.builder()->weight("e", {8, 4}), src);
        },
        [](nn::Decoding& ctx, Tensor ids) {
          dsl::FunctionBuilder& f = *ids.builder();
          Tensor x = dsl::gather(f.weight("e", {8, 4}), ids);
          x = ctx.attention(x, x, x, {.heads = 2});
          nn::AttentionSpec spec{.heads = 2};
          const dsl::Dim one = dsl::Dim::constant(1);
          spec.bias =
              dsl::cast(dsl::iota(f, dsl::DType::i64, {one, dsl::Dim::constant(2), one, one}, 1),
                        dsl::DType::f32);
          return ctx.cross_attention(
              x, [](Tensor m) { return m; }, [](Tensor m) { return m; }, spec);
        },
        [](Tensor h) {
          return dsl::matmul(h, h.builder()->weight("w", {4, 8}));
        });
  };
  EXPECT_THAT(testing::error_of(biased), HasSubstr("bias (set) unset"));
}

}  // namespace
}  // namespace kiln
