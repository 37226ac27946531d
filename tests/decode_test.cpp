// Incremental decoding and generation (issue 11):
//  - decode_step, fed one target token at a time with its key/value caches, computes the
//    logits forward computes at that position, within 1e-5, in the interpreter (golden and
//    random configs: odd sizes, source padding, batch > 1, hypotheses moved between rows
//    every step as beam search moves them) and in the compiled code;
//  - greedy and beam search over the compiled model give the ids and scores of the PyTorch
//    reference search (tests/golden/make_decode_golden.py);
//  - bad options and inputs are refused with clear errors, and the model stays usable;
//  - issue 25: a refused kiln_generate leaves a zeroed result (free accepts it, twice), only
//    -1 means the default start_id / end_id, and a NaN or +inf logit is an error naming the
//    step and the batch row, over random garbage, ids, tokens and rows.
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "compiled_wide.h"
#include "decode_odd.h"
#include "error_of.h"
#include "frontend/models.h"
#include "golden_checks.h"
#include "golden_small.h"
#include "golden_tiny.h"
#include "ir/interpreter.h"
#include "pass_harness.h"
#include "passes/pipeline.h"
#include "runtime/safetensors.h"
#include "step_runner.h"
#include "tools/bridge.h"

namespace kiln {
namespace {

using testing::compiled;
using ::testing::HasSubstr;
using testing::ids;
using testing::Runner;

// The bound for decode_step against forward at the same position.
constexpr double kStepTolerance = 1e-5;

std::string golden(const std::string& f) { return testing::golden_file(f); }

int64_t config(const ir::Module& m, const char* key) { return std::stoll(m.config.at(key)); }

Runner interpreter(const ir::Module& m, const ir::WeightMap& w) {
  return [&m, &w](const std::string& fn, const std::vector<ir::Tensor>& in) {
    return ir::interpret(m, *m.find_function(fn), w, in);
  };
}

// Random source ids [B,S] (sentence b > 0 padded at the end to a random length >= 1) and
// target ids [B,T] without pad_id (decoding never feeds padding).
std::pair<ir::Tensor, ir::Tensor> random_batch(const ir::Module& m, int64_t B, int64_t S, int64_t T,
                                               uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t pad = config(m, "pad_id");
  auto token = [&](int64_t vocab) {
    std::uniform_int_distribution<int64_t> u(0, vocab - 2);
    int64_t v = u(rng);
    return v >= pad ? v + 1 : v;
  };
  std::vector<int64_t> src(B * S), tgt(B * T);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = b == 0 ? S : std::uniform_int_distribution<int64_t>(1, S)(rng);
    for (int64_t s = 0; s < S; ++s) src[b * S + s] = s < len ? token(config(m, "src_vocab")) : pad;
    for (int64_t t = 0; t < T; ++t) tgt[b * T + t] = token(config(m, "tgt_vocab"));
  }
  return {ids({B, S}, src), ids({B, T}, tgt)};
}

// Feeds tgt one token per step through prepare and decode_step, moving the hypotheses to
// other rows every step when `shuffle` (as beam search does; their keys stay in the slots
// they were written to, found through the rows table), and returns the largest difference
// between a step's logits and forward's at that position. With `restricted`, every step runs
// decode_step_restricted instead, for random token ids (any number from 1 to the vocabulary,
// repeats allowed), and compares its logits with forward's of those ids.
double decode_vs_forward(const ir::Module& m, const Runner& run, const ir::Tensor& src,
                         const ir::Tensor& tgt, bool shuffle, uint32_t seed,
                         bool restricted = false) {
  const int64_t B = tgt.shape[0], T = tgt.shape[1], D = config(m, "d_model");
  const int64_t V = config(m, "tgt_vocab"), L = config(m, "dec_layers");
  const ir::Tensor logits = run("forward", {src, tgt})[0];
  const std::vector<ir::Tensor> mem = run("prepare", {src});
  std::vector<ir::Tensor> cache(2 * L, ir::Tensor::zeros(ir::DType::f32, {T, B, D}));
  std::vector<std::vector<int64_t>> slots(B);  // per sentence: the slot of each position
  std::vector<int64_t> order(B);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(seed);
  double worst = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (shuffle) std::shuffle(order.begin(), order.end(), rng);
    std::vector<int64_t> tok(B), rows(B * (t + 1)), src_row(B);
    for (int64_t r = 0; r < B; ++r) {
      const int64_t b = order[r];
      tok[r] = tgt.ints[b * T + t];
      for (int64_t j = 0; j < t; ++j) rows[r * (t + 1) + j] = slots[b][j];
      rows[r * (t + 1) + t] = r;
      src_row[r] = b;
    }
    std::vector<ir::Tensor> in = {ids({B, 1}, tok), ids({1}, {t}), ids({B, t + 1}, rows),
                                  ids({B}, src_row), src};
    in.insert(in.end(), mem.begin(), mem.end());
    in.insert(in.end(), cache.begin(), cache.end());
    std::vector<int64_t> vocab(static_cast<size_t>(V));  // the columns the step gives
    std::iota(vocab.begin(), vocab.end(), 0);
    if (restricted) {
      // Alternately few ids (fewer than a kernel's block of columns) and many.
      const int64_t R = t % 2 ? std::uniform_int_distribution<int64_t>(1, 5)(rng)
                              : std::uniform_int_distribution<int64_t>(V / 2, V)(rng);
      vocab.resize(static_cast<size_t>(R));
      for (int64_t& id : vocab) id = std::uniform_int_distribution<int64_t>(0, V - 1)(rng);
      in.push_back(ids({R}, vocab));
    }
    std::vector<ir::Tensor> out = run(restricted ? "decode_step_restricted" : "decode_step", in);
    const int64_t R = static_cast<int64_t>(vocab.size());
    EXPECT_EQ(out[0].shape, (std::vector<int64_t>{B, 1, R}));
    for (int64_t r = 0; r < B; ++r) {
      const int64_t b = order[r];
      slots[b].push_back(r);
      for (int64_t j = 0; j < R; ++j)
        worst = std::max(worst, std::abs(static_cast<double>(out[0].f[r * R + j]) -
                                         logits.f[(b * T + t) * V + vocab[j]]));
    }
    std::copy(out.begin() + 1, out.end(), cache.begin());
  }
  return worst;
}

// The random configs: odd sizes (d_k 7, d_ff 13, vocabularies 17 and 19), one head, one
// decoder layer or three.
const std::vector<std::vector<std::string>> kRandomConfigs = {
    {"d_model=21", "heads=3", "d_ff=13", "src_vocab=17", "tgt_vocab=19", "enc_layers=1",
     "dec_layers=2", "pad_id=2", "max_len=12", "max_batch=3"},
    {"d_model=8", "heads=1", "d_ff=11", "src_vocab=9", "tgt_vocab=23", "enc_layers=2",
     "dec_layers=3", "pad_id=0", "max_len=9", "max_batch=4"},
};

TEST(DecodeStep, InterpreterMatchesForwardOnGoldenModels) {
  for (const char* name : {"tiny", "small"}) {
    ir::Module m = models::build_model("transformer", name);
    rt::SafeTensors file =
        rt::SafeTensors::load(golden(std::string(name) + ".weights.safetensors"));
    ir::WeightMap w = tools::load_weight_map(m, file);
    double worst = 0;
    for (auto [B, S, T] : {std::tuple{1, 7, 9}, {3, 11, 6}}) {
      auto [src, tgt] = random_batch(m, B, S, T, static_cast<uint32_t>(B * 100 + S));
      worst = std::max(worst, decode_vs_forward(m, interpreter(m, w), src, tgt, B > 1, 7));
    }
    std::printf("[ decode ] %s: interpreter decode_step vs forward: max abs error %.3g\n", name,
                worst);
    EXPECT_LE(worst, kStepTolerance) << name;
  }
}

TEST(DecodeStep, InterpreterMatchesForwardOnRandomConfigs) {
  for (size_t c = 0; c < kRandomConfigs.size(); ++c) {
    ir::Module m = models::build_model("transformer", "tiny", kRandomConfigs[c]);
    ir::WeightMap w = testing::random_weights(m, static_cast<uint32_t>(11 + c));
    double worst = 0;
    for (auto [B, S, T] : {std::tuple{1, 1, 1}, {3, 5, 7}, {2, 9, 9}}) {
      auto [src, tgt] = random_batch(m, B, S, T, static_cast<uint32_t>(c * 1000 + B * 10 + T));
      worst = std::max(worst, decode_vs_forward(m, interpreter(m, w), src, tgt, B > 1, 3));
    }
    std::printf("[ decode ] random config %zu: interpreter decode_step vs forward: %.3g\n", c,
                worst);
    EXPECT_LE(worst, kStepTolerance) << "config " << c;
  }
}

TEST(DecodeStep, CompiledMatchesCompiledForward) {
  ir::Module tiny = models::build_model("transformer", "tiny");
  ir::Module small = models::build_model("transformer", "small");
  kiln_models::golden_tiny tiny_model(golden("tiny.weights.safetensors").c_str());
  kiln_models::golden_small small_model(golden("small.weights.safetensors").c_str());
  const std::vector<std::string> wide_settings = {"d_model=64",    "heads=4",      "d_ff=160",
                                                  "tgt_vocab=128", "enc_layers=1", "dec_layers=1"};
  ir::Module wide = models::build_model("transformer", "tiny", wide_settings);
  ir::WeightMap ww = testing::random_weights(wide, 5);
  std::vector<rt::TensorData> tensors;
  for (const ir::Weight& w : wide.weights)
    if (!w.derivation)
      tensors.push_back(rt::make_f32(w.name, ww.at(w.name).shape, ww.at(w.name).f));
  const std::string path = ::testing::TempDir() + "decode_wide.safetensors";
  rt::write_safetensors(path, tensors);
  kiln_models::compiled_wide wide_model(path.c_str());
  ir::Module odd = models::build_model("transformer", "tiny", kRandomConfigs[0]);
  ir::WeightMap ow = testing::random_weights(odd, 17);
  tensors.clear();
  for (const ir::Weight& w : odd.weights)
    if (!w.derivation)
      tensors.push_back(rt::make_f32(w.name, ow.at(w.name).shape, ow.at(w.name).f));
  const std::string odd_path = ::testing::TempDir() + "decode_odd.safetensors";
  rt::write_safetensors(odd_path, tensors);
  kiln_models::decode_odd odd_model(odd_path.c_str());

  const std::vector<std::tuple<const char*, ir::Module*, kiln::Model*>> cases = {
      {"tiny", &tiny, &tiny_model},
      {"small", &small, &small_model},
      {"wide", &wide, &wide_model},
      {"odd", &odd, &odd_model}};
  for (const auto& [name, m, model] : cases) {
    double worst = 0;
    const int64_t max_len = config(*m, "max_len");
    for (auto [B, S, T] : {std::tuple{1, 1, 1}, {1, 7, 12}, {3, 13, 9}}) {
      S = std::min<int64_t>(S, max_len);
      auto [src, tgt] = random_batch(*m, B, S, T, static_cast<uint32_t>(B * 31 + T));
      worst = std::max(worst, decode_vs_forward(*m, compiled(*model, config(*m, "dec_layers")), src,
                                                tgt, B > 1, 5));
    }
    std::printf("[ decode ] %s: compiled decode_step vs compiled forward: max abs error %.3g\n",
                name, worst);
    EXPECT_LE(worst, kStepTolerance) << name;
  }
}

// decode_step_restricted (nn::add_seq2seq, vocabulary restriction): each step's logits of
// random token ids, few and many, equal forward's of those ids, in the interpreter and in the
// compiled code (the f32 libraries run linear_rows on the generator's packed weight:
// restrict-vocabulary's rewrite, checked in passes_test).
TEST(DecodeStep, RestrictedStepGivesTheLogitsOfItsIds) {
  for (size_t c = 0; c < kRandomConfigs.size(); ++c) {
    ir::Module m = models::build_model("transformer", "tiny", kRandomConfigs[c]);
    ir::WeightMap w = testing::random_weights(m, static_cast<uint32_t>(31 + c));
    auto [src, tgt] = random_batch(m, 3, 5, 7, static_cast<uint32_t>(c + 3));
    const double worst = decode_vs_forward(m, interpreter(m, w), src, tgt, true, 3, true);
    std::printf("[ decode ] random config %zu: interpreter restricted step vs forward: %.3g\n", c,
                worst);
    EXPECT_LE(worst, kStepTolerance) << "config " << c;
    // The same after the default pipeline, whose restrict-vocabulary makes it a linear_rows.
    ir::Module opt = testing::after_passes(m, passes::default_pipeline());
    int rows_ops = 0;
    for (const ir::Op& op : opt.find_function("decode_step_restricted")->ops)
      rows_ops += op.kind == ir::OpKind::linear_rows;
    EXPECT_EQ(rows_ops, 1);
    ir::materialize_weights(opt, w);  // merge-projections' concatenated weights
    const double opt_worst = decode_vs_forward(opt, interpreter(opt, w), src, tgt, true, 3, true);
    EXPECT_LE(opt_worst, kStepTolerance) << "config " << c << ", optimized";
  }
  kiln_models::golden_small small_model(golden("small.weights.safetensors").c_str());
  const std::vector<std::string> wide_settings = {"d_model=64",    "heads=4",      "d_ff=160",
                                                  "tgt_vocab=128", "enc_layers=1", "dec_layers=1"};
  ir::Module small = models::build_model("transformer", "small");
  ir::Module wide = models::build_model("transformer", "tiny", wide_settings);
  ir::WeightMap ww = testing::random_weights(wide, 5);
  std::vector<rt::TensorData> tensors;
  for (const ir::Weight& wt : wide.weights)
    if (!wt.derivation)
      tensors.push_back(rt::make_f32(wt.name, ww.at(wt.name).shape, ww.at(wt.name).f));
  const std::string path = ::testing::TempDir() + "restricted_wide.safetensors";
  rt::write_safetensors(path, tensors);
  kiln_models::compiled_wide wide_model(path.c_str());
  for (const auto& [name, m, model] :
       std::vector<std::tuple<const char*, ir::Module*, kiln::Model*>>{
           {"small", &small, &small_model}, {"wide", &wide, &wide_model}}) {
    double worst = 0;
    for (auto [B, S, T] : {std::tuple{1, 7, 6}, {3, 13, 9}}) {
      auto [src, tgt] = random_batch(*m, B, S, T, static_cast<uint32_t>(B * 7 + T));
      worst = std::max(worst, decode_vs_forward(*m, compiled(*model, config(*m, "dec_layers")), src,
                                                tgt, B > 1, 9, true));
    }
    std::printf("[ decode ] %s: compiled restricted step vs compiled forward: %.3g\n", name, worst);
    EXPECT_LE(worst, kStepTolerance) << name;
  }
}

using testing::expect_reference_search;

TEST(Generate, GreedyAndBeamMatchTheReferenceSearch) {
  kiln_models::golden_tiny tiny(golden("tiny.weights.safetensors").c_str());
  expect_reference_search(tiny, "tiny");
  kiln_models::golden_small small(golden("small.weights.safetensors").c_str());
  expect_reference_search(small, "small");
}

std::string error_of(const std::function<void()>& fn) {
  return testing::error_of<std::exception>(fn);
}

TEST(Generate, BadOptionsAndInputsAreRefusedAndTheModelStaysUsable) {
  kiln_models::golden_tiny model(golden("tiny.weights.safetensors").c_str());
  kiln::Tensor<int64_t> src{{2, 4}, {3, 4, 5, 6, 7, 8, 0, 0}};
  kiln::SearchOptions ok;
  ok.beam_size = 2;
  ok.max_decoding_length = 6;
  ok.start_id = 1;
  ok.end_id = 2;
  const auto before = model.generate(src, ok);

  auto with = [&](auto change) {
    kiln::SearchOptions o = ok;
    change(o);
    return o;
  };
  kiln::Tensor<int64_t> bad_id{{2, 4}, {3, 4, 5, 6, 7, 37, 0, 0}};
  EXPECT_THAT(error_of([&] { model.generate(bad_id, ok); }),
              HasSubstr("token id 37 at 'src'[1,1] is out of range [0, 37)"));
  EXPECT_THAT(error_of([&] { model.generate(src, with([](auto& o) { o.beam_size = 0; })); }),
              HasSubstr("beam_size is 0"));
  EXPECT_THAT(error_of([&] { model.generate(src, with([](auto& o) { o.beam_size = 5; })); }),
              HasSubstr("beam_size 5 is above the compiled maximum 4"));
  EXPECT_THAT(
      error_of([&] { model.generate(src, with([](auto& o) { o.max_decoding_length = 41; })); }),
      HasSubstr("max_decoding_length 41 is above the model's max_len 40"));
  EXPECT_THAT(error_of([&] {
                model.generate(kiln::Tensor<int64_t>{{0, 4}, {}}, ok);
              }),
              HasSubstr("empty batch"));
  EXPECT_THAT(error_of([&] { model.generate(src, with([](auto& o) { o.num_hypotheses = 3; })); }),
              HasSubstr("num_hypotheses is 3"));
  EXPECT_THAT(error_of([&] { model.generate(src, with([](auto& o) { o.end_id = 41; })); }),
              HasSubstr("end_id 41 is out of range [0, 41)"));
  EXPECT_THAT(error_of([&] {
                model.generate(src, with([](auto& o) {
                                 o.sampling_top_k = 3;
                                 o.beam_size = 2;
                               }));
              }),
              HasSubstr("needs beam_size 1"));
  kiln::Tensor<int64_t> too_many{{5, 1}, {3, 3, 3, 3, 3}};
  EXPECT_THAT(error_of([&] { model.generate(too_many, ok); }),
              HasSubstr("5 sentences in one call; the model's maximum is 4 (max_batch)"));

  const auto after = model.generate(src, ok);
  ASSERT_EQ(after.size(), before.size());
  for (size_t b = 0; b < after.size(); ++b) {
    EXPECT_EQ(after[b][0].ids, before[b][0].ids);
    EXPECT_EQ(after[b][0].score, before[b][0].score);
  }
}

// kiln_search_options carries its size (set by kiln_search_options_init): options from a
// caller built against an older kiln/runtime.h (no struct_size: its first bytes are
// beam_size and num_hypotheses) or never initialized are refused with the sizes named, and
// the model stays usable.
TEST(Generate, OptionsOfAnotherHeaderAreRefused) {
  kiln_models::golden_tiny model(golden("tiny.weights.safetensors").c_str());
  kiln::Tensor<int64_t> src{{1, 4}, {3, 4, 5, 6}};
  kiln_tensor in;
  std::memset(&in, 0, sizeof in);
  in.dtype = KILN_I64;
  in.rank = 2;
  in.shape[0] = 1;
  in.shape[1] = 4;
  in.data = src.data.data();
  in.capacity = src.data.size() * sizeof(int64_t);

  kiln_search_options o;
  kiln_search_options_init(&o);
  EXPECT_EQ(o.struct_size, sizeof(kiln_search_options));
  EXPECT_EQ(kiln::SearchOptions().struct_size, sizeof(kiln_search_options));
  o.max_decoding_length = 6;
  o.start_id = 1;
  o.end_id = 2;
  kiln_generation g;
  ASSERT_EQ(kiln_generate(model.get(), &in, &o, &g), 0) << kiln_model_error(model.get());
  const std::vector<int64_t> before(g.ids, g.ids + g.lengths[0]);
  kiln_generation_free(&g);

  // kiln_search_options as kiln/runtime.h declared it before struct_size, set as its
  // kiln_search_options_init did.
  struct OlderOptions {
    int32_t beam_size = 1, num_hypotheses = 1, max_decoding_length = 6, min_decoding_length = 0;
    float length_penalty = 0;
    int64_t start_id = 1, end_id = 2;
    int32_t sampling_top_k = 1;
    float sampling_temperature = 1;
    uint64_t seed = 0;
    kiln_token_callback on_token = nullptr;
    void* user_data = nullptr;
  } older;
  EXPECT_NE(
      kiln_generate(model.get(), &in, reinterpret_cast<const kiln_search_options*>(&older), &g), 0);
  EXPECT_THAT(kiln_model_error(model.get()),
              HasSubstr(fmt::format("kiln_generate: options.struct_size is {}, this runtime's "
                                    "kiln_search_options has {} bytes: initialize the options "
                                    "with kiln_search_options_init",
                                    (uint64_t{1} << 32) + 1, sizeof(kiln_search_options))));

  kiln_search_options uninitialized = o;
  uninitialized.struct_size = 0;
  EXPECT_NE(kiln_generate(model.get(), &in, &uninitialized, &g), 0);
  EXPECT_THAT(kiln_model_error(model.get()), HasSubstr("options.struct_size is 0,"));
  kiln_search_options larger = o;
  larger.struct_size = sizeof(kiln_search_options) + 8;
  EXPECT_NE(kiln_generate(model.get(), &in, &larger, &g), 0);
  EXPECT_THAT(
      kiln_model_error(model.get()),
      HasSubstr(fmt::format("options.struct_size is {},", sizeof(kiln_search_options) + 8)));

  ASSERT_EQ(kiln_generate(model.get(), &in, &o, &g), 0) << kiln_model_error(model.get());
  EXPECT_EQ(std::vector<int64_t>(g.ids, g.ids + g.lengths[0]), before);
  kiln_generation_free(&g);
}

// kiln_generate keeps its buffers (caches, encoder memory, logits) in the model between calls
// (runtime/model.h, BufferCache): a call's results never depend on the calls before it,
// of other batch sizes, beams and lengths, nor on calls running at the same time on other
// threads. Each call is compared with the same call on a model that ran nothing before.
TEST(Generate, KeptBuffersNeverChangeAResult) {
  struct Call {
    int64_t batch;
    int32_t beam, length;
  };
  const std::vector<Call> calls = {{3, 4, 12}, {1, 1, 20}, {2, 2, 6}, {3, 4, 12}, {3, 3, 9}};
  std::mt19937 rng(7);
  std::vector<kiln::Tensor<int64_t>> sources;
  std::vector<kiln::SearchOptions> options;
  for (const Call& c : calls) {
    kiln::Tensor<int64_t> src{{c.batch, 5}, {}};
    for (int64_t i = 0; i < c.batch * 5; ++i)
      src.data.push_back(3 + static_cast<int64_t>(rng() % 6));
    sources.push_back(src);
    kiln::SearchOptions o;
    o.beam_size = c.beam;
    o.num_hypotheses = c.beam;
    o.max_decoding_length = c.length;
    o.start_id = 1;
    o.end_id = 2;
    options.push_back(o);
  }
  const std::string weights = golden("small.weights.safetensors");
  std::vector<std::vector<std::vector<kiln::Hypothesis>>> fresh;
  for (size_t i = 0; i < calls.size(); ++i) {
    kiln_models::golden_small model(weights.c_str());
    fresh.push_back(model.generate(sources[i], options[i]));
  }
  auto expect_fresh = [&](const std::vector<std::vector<kiln::Hypothesis>>& got, size_t i) {
    ASSERT_EQ(got.size(), fresh[i].size()) << i;
    for (size_t b = 0; b < got.size(); ++b) {
      ASSERT_EQ(got[b].size(), fresh[i][b].size()) << i << " " << b;
      for (size_t h = 0; h < got[b].size(); ++h) {
        EXPECT_EQ(got[b][h].ids, fresh[i][b][h].ids) << "call " << i << " row " << b;
        EXPECT_EQ(got[b][h].score, fresh[i][b][h].score) << "call " << i << " row " << b;
      }
    }
  };
  kiln_models::golden_small model(weights.c_str());
  for (int round = 0; round < 2; ++round)
    for (size_t i = 0; i < calls.size(); ++i)
      expect_fresh(model.generate(sources[i], options[i]), i);
  // Two threads, each going through the calls from another end, 3 times.
  std::vector<std::vector<std::vector<std::vector<kiln::Hypothesis>>>> got(2);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      for (int r = 0; r < 3; ++r)
        for (size_t k = 0; k < calls.size(); ++k) {
          const size_t i = t == 0 ? k : calls.size() - 1 - k;
          got[t].push_back(model.generate(sources[i], options[i]));
        }
    });
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < 2; ++t)
    for (size_t n = 0; n < got[t].size(); ++n) {
      const size_t k = n % calls.size();
      expect_fresh(got[t][n], t == 0 ? k : calls.size() - 1 - k);
    }
}

// Issue 24: max_decoding_length 0, kiln_search_options_init's default (the one definition
// of the search defaults), is the model's max_len: the same as giving max_len itself.
TEST(Generate, MaxDecodingLengthZeroIsTheModelsMaxLen) {
  kiln_search_options defaults;
  kiln_search_options_init(&defaults);
  EXPECT_EQ(defaults.max_decoding_length, 0);
  kiln_models::golden_tiny model(golden("tiny.weights.safetensors").c_str());
  const int32_t max_len = static_cast<int32_t>(kiln_models::golden_tiny::max_T);
  ASSERT_EQ(max_len, 40);
  kiln::Tensor<int64_t> src{{2, 4}, {3, 4, 5, 6, 7, 8, 0, 0}};
  kiln::SearchOptions o;  // max_decoding_length 0
  o.beam_size = 2;
  o.start_id = 1;
  o.end_id = 2;
  o.min_decoding_length = max_len;  // no end token before max_len: every hypothesis is full
  const auto by_default = model.generate(src, o);
  kiln::SearchOptions explicit_len = o;
  explicit_len.max_decoding_length = max_len;
  const auto given = model.generate(src, explicit_len);
  ASSERT_EQ(by_default.size(), 2u);
  ASSERT_EQ(given.size(), by_default.size());
  for (size_t b = 0; b < by_default.size(); ++b) {
    EXPECT_EQ(by_default[b][0].ids.size(), static_cast<size_t>(max_len)) << b;
    EXPECT_EQ(by_default[b][0].ids, given[b][0].ids) << b;
    EXPECT_EQ(by_default[b][0].score, given[b][0].score) << b;
  }
  // Checked against the resolved length; negative lengths are still refused.
  kiln::SearchOptions too_long = o;
  too_long.min_decoding_length = max_len + 1;
  EXPECT_THAT(error_of([&] { model.generate(src, too_long); }),
              HasSubstr("min_decoding_length is 41; it must be between 0 and "
                        "max_decoding_length 40"));
  kiln::SearchOptions negative = o;
  negative.max_decoding_length = -1;
  EXPECT_THAT(error_of([&] { model.generate(src, negative); }),
              HasSubstr("max_decoding_length is -1; it must be at least 1 (or 0: the model's "
                        "max_len)"));
}

TEST(DecodeStep, BadIndicesAndCachesAreRefused) {
  kiln_models::golden_tiny model(golden("tiny.weights.safetensors").c_str());
  const int64_t D = 24;
  kiln::Tensor<int64_t> src{{1, 3}, {3, 4, 5}};
  auto mem = model.prepare(src);
  kiln::Tensor<int64_t> tok{{1, 1}, {1}}, pos{{1}, {0}}, rows{{1, 1}, {0}}, src_row{{1}, {0}};
  std::vector<kiln::Tensor<float>> cache(4,
                                         kiln::Tensor<float>{{4, 1, D}, std::vector<float>(4 * D)});
  kiln::Tensor<float> logits;
  auto step = [&](const kiln::Tensor<int64_t>& p, const kiln::Tensor<int64_t>& r,
                  const kiln::Tensor<int64_t>& sr, bool same_buffers) {
    std::vector<kiln::Tensor<float>> other = cache;
    auto& out = same_buffers ? cache : other;
    model.run("decode_step",
              {tok, p, r, sr, src, std::get<0>(mem), std::get<1>(mem), std::get<2>(mem),
               std::get<3>(mem), cache[0], cache[1], cache[2], cache[3]},
              {logits, out[0], out[1], out[2], out[3]});
  };
  EXPECT_THAT(error_of([&] {
                step(kiln::Tensor<int64_t>{{1}, {4}}, rows, src_row, true);
              }),
              HasSubstr("position 4 at 'pos'[0] is out of range [0, 4)"));
  EXPECT_THAT(error_of([&] {
                step(pos, kiln::Tensor<int64_t>{{1, 1}, {1}}, src_row, true);
              }),
              HasSubstr("cache slot 1 at 'rows'[0,0] is out of range [-1, 1)"));
  EXPECT_THAT(error_of([&] {
                step(pos, rows, kiln::Tensor<int64_t>{{1}, {1}}, true);
              }),
              HasSubstr("source row 1 at 'src_row'[0] is out of range [0, 1)"));
  EXPECT_THAT(error_of([&] {
                step(pos, kiln::Tensor<int64_t>{{1, 5}, {0, 0, 0, 0, 0}}, src_row, true);
              }),
              HasSubstr("positions of 'rows' must fit in the cache (5 > 4)"));
  EXPECT_THAT(error_of([&] { step(pos, rows, src_row, false); }),
              HasSubstr("output 'cache_k0_out' updates input 'cache_k0' in place"));
  step(pos, rows, src_row, true);  // and a good call works
  EXPECT_EQ(logits.shape, (std::vector<int64_t>{1, 1, 41}));
  // decode_step_restricted's ids: each a token of the target vocabulary (41), and at least one.
  auto restricted = [&](const kiln::Tensor<int64_t>& vocab) {
    model.run("decode_step_restricted",
              {tok, pos, rows, src_row, src, std::get<0>(mem), std::get<1>(mem), std::get<2>(mem),
               std::get<3>(mem), cache[0], cache[1], cache[2], cache[3], vocab},
              {logits, cache[0], cache[1], cache[2], cache[3]});
  };
  EXPECT_THAT(error_of([&] {
                restricted(kiln::Tensor<int64_t>{{3}, {0, 41, 2}});
              }),
              HasSubstr("token id 41 at 'vocab'[1] is out of range [0, 41)"));
  EXPECT_THAT(error_of([&] {
                restricted(kiln::Tensor<int64_t>{{2}, {-1, 3}});
              }),
              HasSubstr("token id -1 at 'vocab'[0] is out of range [0, 41)"));
  EXPECT_THAT(error_of([&] { restricted(kiln::Tensor<int64_t>{{0}, {}}); }), HasSubstr("'vocab'"));
  restricted(kiln::Tensor<int64_t>{{2}, {40, 7}});
  EXPECT_EQ(logits.shape, (std::vector<int64_t>{1, 1, 2}));
}

TEST(Generate, SamplingIsReproducibleBySeedAndGreedyStreams) {
  kiln_models::golden_tiny model(golden("tiny.weights.safetensors").c_str());
  kiln::Tensor<int64_t> src{{3, 5}, {3, 4, 5, 6, 7, 8, 9, 10, 0, 0, 11, 12, 0, 0, 0}};
  kiln::SearchOptions o;
  o.max_decoding_length = 10;
  o.start_id = 1;
  o.end_id = 2;
  o.sampling_top_k = 0;
  o.seed = 42;
  const auto a = model.generate(src, o), b = model.generate(src, o);
  o.seed = 43;
  const auto c = model.generate(src, o);
  bool differs = false;
  for (size_t s = 0; s < a.size(); ++s) {
    EXPECT_EQ(a[s][0].ids, b[s][0].ids);
    EXPECT_EQ(a[s][0].score, b[s][0].score);
    differs = differs || a[s][0].ids != c[s][0].ids;
    for (int64_t id : a[s][0].ids) EXPECT_TRUE(id >= 0 && id < 41 && id != 2);
  }
  EXPECT_TRUE(differs) << "seeds 42 and 43 sampled the same 3 sentences of up to 10 tokens";

  // Greedy with a callback: the streamed tokens are the returned ones, in order.
  std::vector<std::vector<int64_t>> streamed(3);
  kiln::SearchOptions g;
  g.max_decoding_length = 10;
  g.start_id = 1;
  g.end_id = 2;
  g.user_data = &streamed;
  g.on_token = [](void* user, int64_t sentence, int64_t, int64_t token) {
    (*static_cast<std::vector<std::vector<int64_t>>*>(user))[sentence].push_back(token);
  };
  const auto greedy = model.generate(src, g);
  for (size_t s = 0; s < greedy.size(); ++s) EXPECT_EQ(streamed[s], greedy[s][0].ids);
}

// Issue 25: kiln_generate zeroes its result first, so a refused call (any reason, a NULL
// model included) leaves a struct that kiln_generation_free accepts, whatever garbage the
// caller left in it; free is a no-op on a zeroed struct and the second time.
TEST(Generate, RefusedCallsLeaveAResultThatFreeAccepts) {
  kiln_models::golden_tiny model(golden("tiny.weights.safetensors").c_str());
  std::vector<int64_t> ids = {3, 4, 5, 6, 7, 8, 0, 0};
  kiln_tensor in;
  std::memset(&in, 0, sizeof in);
  in.dtype = KILN_I64;
  in.rank = 2;
  in.shape[0] = 2;
  in.shape[1] = 4;
  in.data = ids.data();
  in.capacity = ids.size() * sizeof(int64_t);
  kiln_search_options ok;
  kiln_search_options_init(&ok);
  ok.max_decoding_length = 5;
  std::mt19937_64 rng(25);
  const auto zero_result = [](const kiln_generation& g) {
    return g.batch == 0 && g.hypotheses == 0 && g.max_length == 0 && !g.ids && !g.lengths &&
           !g.scores;
  };
  for (int trial = 0; trial < 60; ++trial) {
    kiln_generation g;
    for (size_t i = 0; i < sizeof g; ++i)  // what an uninitialized struct may hold
      reinterpret_cast<unsigned char*>(&g)[i] = static_cast<unsigned char>(rng() | 1);
    kiln_search_options o = ok;
    kiln_tensor src = in;
    kiln_model* m = model.get();
    const kiln_tensor* src_arg = &src;
    const kiln_search_options* o_arg = &o;
    switch (trial % 7) {
      case 0:
        m = nullptr;
        break;
      case 1:
        src_arg = nullptr;
        break;
      case 2:
        o_arg = nullptr;
        break;
      case 3:
        o.struct_size = static_cast<size_t>(rng() % 1000) + sizeof o + 1;
        break;
      case 4:
        o.beam_size = -static_cast<int32_t>(rng() % 100);
        break;
      case 5:
        o.start_id = -2 - static_cast<int64_t>(rng() % 1000);
        break;
      default:
        src.rank = 3;
        break;
    }
    EXPECT_NE(kiln_generate(m, src_arg, o_arg, &g), 0) << trial;
    ASSERT_TRUE(zero_result(g)) << "trial " << trial << ": the result was left as it was";
    kiln_generation_free(&g);
    kiln_generation_free(&g);
    EXPECT_TRUE(zero_result(g));
  }
  kiln_generation_free(nullptr);
  kiln_generation g;
  ASSERT_EQ(kiln_generate(model.get(), &in, &ok, &g), 0) << kiln_model_error(model.get());
  EXPECT_EQ(g.batch, 2);
  kiln_generation_free(&g);
  EXPECT_TRUE(zero_result(g));
  kiln_generation_free(&g);  // a second free frees nothing
}

// Issue 25: only -1 means "the model's bos_id / eos_id"; any other negative id, INT64_MIN
// included, is refused naming the option and the value.
TEST(Generate, OnlyMinusOneMeansTheModelsStartAndEndId) {
  kiln_models::golden_tiny model(golden("tiny.weights.safetensors").c_str());
  kiln::Tensor<int64_t> src{{2, 4}, {3, 4, 5, 6, 7, 8, 0, 0}};
  kiln::SearchOptions by_default;
  by_default.max_decoding_length = 8;
  kiln::SearchOptions given = by_default;
  given.start_id = 1;  // tiny's bos_id and eos_id
  given.end_id = 2;
  const auto a = model.generate(src, by_default), b = model.generate(src, given);
  for (size_t s = 0; s < a.size(); ++s) EXPECT_EQ(a[s][0].ids, b[s][0].ids);
  std::mt19937_64 rng(4);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t id = trial < 2   ? std::numeric_limits<int64_t>::min() + trial
                       : trial < 4 ? -2
                                   : -2 - static_cast<int64_t>(rng() >> (rng() % 63));
    kiln::SearchOptions o = by_default;
    const bool start = trial % 2 == 0;
    (start ? o.start_id : o.end_id) = id;
    EXPECT_EQ(error_of([&] { model.generate(src, o); }),
              fmt::format("{} is {}; it must be a token id, or -1 for the model's {}",
                          start ? "start_id" : "end_id", id, start ? "bos_id" : "eos_id"));
  }
}

// Issue 25: a NaN or +inf logit (here from weights) is an error naming the step and the batch
// row, never a result; -inf logits are tokens that cannot be chosen, unless all are.
TEST(Generate, NonFiniteLogitsAreRefusedNamingTheRowAndStep) {
  const rt::SafeTensors tiny = rt::SafeTensors::load(golden("tiny.weights.safetensors"));
  const std::string path = ::testing::TempDir() + "decode_nonfinite.safetensors";
  auto model_with = [&](const std::string& name,
                        const std::function<void(std::vector<float>&)>& f) {
    std::vector<rt::TensorData> out;
    for (const rt::TensorInfo& t : tiny.tensors()) {
      std::vector<float> v = tiny.to_f32(t);
      if (t.name == name) f(v);
      out.push_back(rt::make_f32(t.name, t.shape, v));
    }
    rt::write_safetensors(path, out, tiny.metadata());
    return std::make_unique<kiln_models::golden_tiny>(path.c_str());
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::string why = " (the model's weights or its input hold NaN or infinity)";
  std::mt19937 rng(52);
  auto random_src = [&](int64_t batch, int64_t length) {
    kiln::Tensor<int64_t> src{{batch, length}, std::vector<int64_t>(batch * length)};
    for (int64_t& x : src.data) x = std::uniform_int_distribution<int64_t>(3, 20)(rng);
    return src;
  };
  for (int trial = 0; trial < 12; ++trial) {
    const int64_t v = std::uniform_int_distribution<int64_t>(0, 40)(rng);
    const float value = trial % 2 ? inf : nan;
    auto model = model_with("generator.bias", [&](std::vector<float>& b) { b[v] = value; });
    kiln::SearchOptions o;
    o.max_decoding_length = 6;
    if (trial % 3 == 1) o.beam_size = 3;
    if (trial % 3 == 2) o.sampling_top_k = 0;
    const kiln::Tensor<int64_t> src =
        random_src(std::uniform_int_distribution<int64_t>(1, 4)(rng), 5);
    EXPECT_EQ(error_of([&] { model->generate(src, o); }),
              fmt::format("non-finite logit at step 0 of batch row 0: token {} has logit {}{}", v,
                          value, why));
  }
  {  // every logit -inf
    auto model = model_with("generator.bias", [&](std::vector<float>& b) {
      for (float& x : b) x = -inf;
    });
    EXPECT_EQ(error_of([&] { model->generate(random_src(2, 3), kiln::SearchOptions()); }),
              "non-finite logits at step 0 of batch row 0: every token has logit -inf" + why);
  }
  {  // one token's logit -inf: never chosen, the others as they were
    const int64_t v = 7;
    auto model = model_with("generator.bias", [&](std::vector<float>& b) { b[v] = -inf; });
    kiln::SearchOptions o;
    o.max_decoding_length = 12;
    o.beam_size = 2;
    for (const auto& hyps : model->generate(random_src(3, 6), o))
      for (int64_t id : hyps[0].ids) EXPECT_NE(id, v);
  }
  // NaN in the source embedding of a token only sentence k holds: row k, step 0.
  for (int trial = 0; trial < 8; ++trial) {
    const int64_t u = 30 + trial % 7;  // random_src never draws it
    auto model = model_with("src_embed.weight", [&](std::vector<float>& e) {
      for (int d = 0; d < 24; ++d) e[u * 24 + d] = nan;
    });
    const int64_t batch = std::uniform_int_distribution<int64_t>(1, 4)(rng);
    const int64_t k = std::uniform_int_distribution<int64_t>(0, batch - 1)(rng);
    kiln::Tensor<int64_t> src = random_src(batch, 6);
    src.data[k * 6 + std::uniform_int_distribution<int64_t>(0, 5)(rng)] = u;
    kiln::SearchOptions o;
    o.max_decoding_length = 4;
    o.beam_size = 1 + trial % 2;
    EXPECT_EQ(
        error_of([&] { model->generate(src, o); }),
        fmt::format("non-finite logit at step 0 of batch row {}: token 0 has logit nan{}", k, why));
  }
}

}  // namespace
}  // namespace kiln
