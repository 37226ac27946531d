// Decoder-only models written by a user (examples/models/llama.cpp: RMSNorm, rotary, grouped-
// query attention, SwiGLU; examples/models/gpt2.cpp: learned positions, Conv1D weights, a tied
// head) generating through nn::add_causal_lm's entry points (frontend/causal_lm.h), against
// their PyTorch twins (examples/models/make_generate_golden.py):
// - forward, interpreted and compiled, within 1e-4 of the twin's logits;
// - prefill + decode_step against forward at every position, interpreted and compiled, on a
//   batch of left-padded prompts;
// - kiln_generate's greedy search and beam search (4 beams, 4 hypotheses) on a batch of prompts
//   of different lengths: the twin's ids with a KV cache, prompt by prompt;
// - sampling: reproducible by seed, token frequencies over many draws against the softmax
//   (with temperature, top-k and top-p), top-p's cut, stop ids and streaming.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "error_of.h"
#include "example_golden.h"
#include "frontend/causal_lm.h"
#include "frontend/nn.h"
#include "gpt2_small.h"
#include "ir/interpreter.h"
#include "ir/parser.h"
#include "kiln/runtime.h"
#include "llama_small.h"
#include "passes/pipeline.h"
#include "runtime/safetensors.h"
#include "support/read_file.h"
#include "tests/cli_run.h"
#include "tools/bridge.h"

namespace kiln {
namespace {

using testing::golden;
using testing::golden_row;
using ::testing::HasSubstr;
using testing::max_diff;
using testing::read;

// One example model: its IR (what its generator wrote), weights, compiled library, vocabulary.
struct Example {
  std::string name;
  ir::Module module;
  ir::WeightMap weights;
  kiln::Model* compiled = nullptr;  // a static of its generated class
  int64_t vocab = 0;

  const ir::Function& function(const std::string& f) const {
    for (const ir::Function& fn : module.functions)
      if (fn.name == f) return fn;
    throw std::runtime_error("no function " + f);
  }
};

Example& example(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Example>> loaded;
  std::unique_ptr<Example>& e = loaded[name];
  if (e) return *e;
  e = std::make_unique<Example>();
  e->name = name;
  const std::vector<uint8_t> text =
      read_input_file(name == "llama" ? KILN_LLAMA_KIR : KILN_GPT2_KIR);
  e->module = ir::parse_module(std::string(text.begin(), text.end()));
  const std::string w = golden(name + ".weights.safetensors");
  e->weights = tools::load_weight_map(e->module, rt::SafeTensors::load(w));
  if (name == "llama") {
    static kiln_models::llama_small llama(w.c_str());
    e->compiled = &llama;
  } else {
    static kiln_models::gpt2_small gpt2(w.c_str());
    e->compiled = &gpt2;
  }
  e->vocab = std::stoll(e->module.config.at("vocab"));
  return *e;
}

class CausalLM : public ::testing::TestWithParam<std::string> {
 protected:
  Example& ex() { return example(GetParam()); }
  kiln::Model& model() { return *ex().compiled; }
  const ir::Module& module() { return ex().module; }
  const ir::WeightMap& weights() { return ex().weights; }
  const ir::Function& function(const std::string& f) { return ex().function(f); }
  std::string file(const std::string& kind) { return GetParam() + "." + kind + ".safetensors"; }
};

// The prompts of the golden file: rows of ids, -1 padded.
std::vector<std::vector<int64_t>> prompts(const std::string& name) {
  const ir::Tensor p = read(name + ".generate.safetensors", "prompts");
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(p.shape[0]));
  for (int64_t b = 0; b < p.shape[0]; ++b)
    for (int64_t j = 0; j < p.shape[1]; ++j)
      if (p.ints[b * p.shape[1] + j] >= 0) out[b].push_back(p.ints[b * p.shape[1] + j]);
  return out;
}

kiln::Tensor<int64_t> prompt_tensor(const std::vector<std::vector<int64_t>>& rows) {
  size_t width = 0;
  for (const auto& r : rows) width = std::max(width, r.size());
  kiln::Tensor<int64_t> t;
  t.shape = {static_cast<int64_t>(rows.size()), static_cast<int64_t>(width)};
  t.data.assign(rows.size() * width, -1);
  for (size_t b = 0; b < rows.size(); ++b)
    std::copy(rows[b].begin(), rows[b].end(), t.data.begin() + static_cast<int64_t>(b * width));
  return t;
}

TEST_P(CausalLM, ForwardMatchesTheTwinInterpretedAndCompiled) {
  const ir::Tensor ids = read(file("inputs"), "ids");
  const ir::Tensor want = read(file("expected"), "logits");
  const ir::Tensor got = ir::interpret(module(), function("forward"), weights(), {ids})[0];
  EXPECT_LE(max_diff(got.f, want.f), 1e-4) << "interpreted";
  kiln::Tensor<int64_t> in{ids.shape, ids.ints};
  kiln::Tensor<float> logits;
  model().run("forward", {in}, {logits});
  EXPECT_LE(max_diff(logits.data, want.f), 1e-4) << "compiled";
}

// Written the way Hugging Face writes them, the models come out of the default pipeline fully
// fused, in every entry point: one attention per layer (forward, prefill: the fused attention
// op, rotary and the grouped-query repeat folded in; decode_step: cache_attention), every
// GEMM a linear (Conv1D's [in, out] weights too), every norm after a residual sum one
// add_layernorm (RMSNorm: its rms form), no matmul, softmax or reduce_mean left, and no
// lost-fusion note.
TEST_P(CausalLM, EveryEntryPointIsFused) {
  ir::Module m = module();
  const std::vector<passes::LostFusion> notes = passes::run_passes(m, passes::default_pipeline());
  for (const passes::LostFusion& n : notes)
    ADD_FAILURE() << "note: " << n.function << " " << n.value << ": " << n.what << ": " << n.reason;
  const int64_t layers = 2;
  // The norms: llama's first input_layernorm reads the embeddings alone; gpt2's first ln_1
  // reads the sum of token and position embeddings.
  const int64_t plain_norms = GetParam() == "llama" ? 1 : 0;
  const int64_t fused_norms = GetParam() == "llama" ? 4 : 5;
  for (const ir::Function& f : m.functions) {
    std::map<std::string, int64_t> count;
    for (const ir::Op& op : f.ops) ++count[std::string(ir::op_name(op.kind))];
    const bool step = f.name == "decode_step";
    EXPECT_EQ(count[step ? "cache_attention" : "attention"], layers) << f.name;
    for (const char* gone : {"matmul", "softmax", "reduce_mean", "rsqrt", "sqrt"})
      EXPECT_EQ(count[gone], 0) << f.name << ": " << gone;
    EXPECT_EQ(count["layernorm"], plain_norms) << f.name;
    EXPECT_EQ(count["add_layernorm"], fused_norms) << f.name;
    EXPECT_GE(count["linear"], 4 * layers + 1) << f.name;
  }
}

// prefill over left-padded prompts, then decode_step one token at a time, against forward on
// each prompt alone at every position; interpreted and compiled.
TEST_P(CausalLM, PrefillAndStepsMatchForward) {
  const std::vector<std::vector<int64_t>> p = prompts(GetParam());
  const int64_t batch = static_cast<int64_t>(p.size());
  int64_t L = 0;
  for (const auto& r : p) L = std::max<int64_t>(L, static_cast<int64_t>(r.size()));
  const int64_t steps = 4, T = L + steps, V = ex().vocab;
  std::mt19937 rng(5);
  std::vector<std::vector<int64_t>> seqs = p;  // each prompt and its fed tokens
  for (auto& s : seqs)
    for (int64_t i = 0; i < steps; ++i)
      s.push_back(std::uniform_int_distribution<int64_t>(3, V - 1)(rng));
  // The reference: forward on each sequence alone.
  std::vector<ir::Tensor> want;
  for (const auto& s : seqs)
    want.push_back(ir::interpret(
        module(), function("forward"), weights(),
        {ir::Tensor::from_ints(ir::DType::i64, {1, static_cast<int64_t>(s.size())}, s)})[0]);
  auto want_row = [&](int64_t b, int64_t pos) {  // logits of sequence b after position pos
    const ir::Tensor& w = want[static_cast<size_t>(b)];
    return std::vector<float>(w.f.begin() + pos * V, w.f.begin() + (pos + 1) * V);
  };
  std::vector<int64_t> ids(static_cast<size_t>(batch * L), 0), start(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    start[b] = L - static_cast<int64_t>(p[b].size());
    std::copy(p[b].begin(), p[b].end(), ids.begin() + b * L + start[b]);
  }
  const ir::Function& prefill = function("prefill");
  const ir::Function& step = function("decode_step");
  int layers = 0;
  for (ir::ValueId v : step.params)
    if (step.values[v].name.rfind("cache_", 0) == 0) ++layers;
  for (bool compiled : {false, true}) {
    std::vector<ir::Tensor> caches;
    for (ir::ValueId v : step.params)
      if (step.values[v].name.rfind("cache_", 0) == 0)
        caches.push_back(
            ir::Tensor::zeros(ir::DType::f32, {T, batch, step.type(v).shape[2].value}));
    auto run = [&](const ir::Function& f, std::vector<ir::Tensor> in) {
      for (const ir::Tensor& c : caches) in.push_back(c);
      std::vector<ir::Tensor> out;
      if (!compiled) {
        out = ir::interpret(module(), f, weights(), in);
      } else {
        std::vector<kiln::Input> ins;
        std::vector<kiln::Tensor<int64_t>> ints;
        std::vector<kiln::Tensor<float>> floats;
        ints.reserve(in.size());
        floats.reserve(in.size());
        for (const ir::Tensor& t : in)
          if (t.dtype == ir::DType::f32)
            ins.push_back(floats.emplace_back(kiln::Tensor<float>{t.shape, t.f}));
          else
            ins.push_back(ints.emplace_back(kiln::Tensor<int64_t>{t.shape, t.ints}));
        kiln::Tensor<float> logits;
        std::vector<kiln::Output> outs = {logits};
        // The caches are updated in place: the same tensors as output.
        for (size_t i = 0; i < caches.size(); ++i)
          outs.push_back(floats[floats.size() - caches.size() + i]);
        model().run(f.name.c_str(), ins, outs);
        out.push_back(ir::Tensor::from_f32(logits.shape, logits.data));
        for (size_t i = 0; i < caches.size(); ++i)
          out.push_back(ir::Tensor::from_f32(caches[i].shape,
                                             floats[floats.size() - caches.size() + i].data));
      }
      for (size_t i = 0; i < caches.size(); ++i) caches[i] = out[1 + i];
      return out[0];
    };
    const ir::Tensor first = run(prefill, {ir::Tensor::from_ints(ir::DType::i64, {batch, L}, ids),
                                           ir::Tensor::from_ints(ir::DType::i64, {batch}, start)});
    for (int64_t b = 0; b < batch; ++b)
      EXPECT_LE(max_diff({first.f.begin() + b * V, first.f.begin() + (b + 1) * V},
                         want_row(b, static_cast<int64_t>(p[b].size()) - 1)),
                1e-4)
          << (compiled ? "compiled" : "interpreted") << " prefill, prompt " << b;
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t pos = L + s, P = pos + 1;
      std::vector<int64_t> tok(static_cast<size_t>(batch)), rows(static_cast<size_t>(batch * P));
      for (int64_t b = 0; b < batch; ++b) {
        tok[b] = seqs[b][p[b].size() + static_cast<size_t>(s)];
        for (int64_t j = 0; j < P; ++j) rows[b * P + j] = j < start[b] ? -1 : b;
      }
      const ir::Tensor logits = run(step, {ir::Tensor::from_ints(ir::DType::i64, {batch, 1}, tok),
                                           ir::Tensor::from_ints(ir::DType::i64, {1}, {pos}),
                                           ir::Tensor::from_ints(ir::DType::i64, {batch, P}, rows),
                                           ir::Tensor::from_ints(ir::DType::i64, {batch}, start)});
      for (int64_t b = 0; b < batch; ++b)
        EXPECT_LE(max_diff({logits.f.begin() + b * V, logits.f.begin() + (b + 1) * V},
                           want_row(b, static_cast<int64_t>(p[b].size()) + s)),
                  1e-4)
            << (compiled ? "compiled" : "interpreted") << " step " << s << ", prompt " << b;
    }
    (void)layers;
  }
}

std::vector<std::vector<int64_t>> first_hypotheses(
    const std::vector<std::vector<kiln::Hypothesis>>& out) {
  std::vector<std::vector<int64_t>> ids;
  for (const auto& h : out) ids.push_back(h.at(0).ids);
  return ids;
}

TEST_P(CausalLM, GreedyAndBeamMatchTheTwinsSearchWithAKVCache) {
  const kiln::Tensor<int64_t> in = prompt_tensor(prompts(GetParam()));
  const ir::Tensor greedy = read(file("generate"), "greedy");
  const ir::Tensor beam = read(file("generate"), "beam");
  const ir::Tensor beam_scores = read(file("generate"), "beam_scores");
  kiln::SearchOptions o;
  o.max_decoding_length = 32;
  const auto g = model().generate(in, o);
  ASSERT_EQ(g.size(), 3u);
  for (int64_t b = 0; b < 3; ++b) EXPECT_EQ(g[b][0].ids, golden_row(greedy, b)) << "prompt " << b;
  o.beam_size = 4;
  o.num_hypotheses = 4;
  const auto bs = model().generate(in, o);
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t h = 0; h < 4; ++h) {
      EXPECT_EQ(bs[b][h].ids, golden_row(beam, b * 4 + h)) << "prompt " << b << " hypothesis " << h;
      EXPECT_NEAR(bs[b][h].score, beam_scores.f[b * 4 + h], 1e-4);
    }
}

TEST_P(CausalLM, SamplingIsReproducibleBySeedAndStreams) {
  const kiln::Tensor<int64_t> in = prompt_tensor(prompts(GetParam()));
  kiln::SearchOptions o;
  o.sampling_top_k = 0;
  o.max_decoding_length = 20;
  o.seed = 11;
  const auto a = first_hypotheses(model().generate(in, o));
  const auto b = first_hypotheses(model().generate(in, o));
  EXPECT_EQ(a, b);
  o.seed = 12;
  const auto c = first_hypotheses(model().generate(in, o));
  EXPECT_NE(a, c);
  // Streaming (one prompt): the callback sees exactly the returned tokens, in order.
  kiln::Tensor<int64_t> one = prompt_tensor({prompts(GetParam())[0]});
  std::vector<int64_t> streamed;
  o.on_token = [](void* user, int64_t sentence, int64_t, int64_t token) {
    EXPECT_EQ(sentence, 0);
    static_cast<std::vector<int64_t>*>(user)->push_back(token);
  };
  o.user_data = &streamed;
  const auto s = model().generate(one, o);
  EXPECT_EQ(streamed, s[0][0].ids);
}

// The first token drawn from the prompt, many times, against softmax(logits / T) cut to the
// top k and then the top-p nucleus: every token outside never drawn, every frequency within 5
// standard deviations of its probability.
void expect_distribution(kiln::Model& model, const ir::Module& module, const ir::WeightMap& weights,
                         const std::vector<int64_t>& prompt, int64_t V, int32_t top_k, float top_p,
                         float temperature) {
  // The prefill logits of the prompt alone (forward's last position).
  const ir::Tensor full = ir::interpret(
      module, module.functions.at(0), weights,
      {ir::Tensor::from_ints(ir::DType::i64, {1, static_cast<int64_t>(prompt.size())}, prompt)})[0];
  std::vector<double> logit(full.f.end() - V, full.f.end());
  std::vector<int64_t> order(static_cast<size_t>(V));
  for (int64_t v = 0; v < V; ++v) order[v] = v;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return logit[x] > logit[y]; });
  const int64_t k = top_k > 0 ? top_k : V;
  std::vector<double> p(static_cast<size_t>(V), 0.0);
  double total = 0;
  for (int64_t r = 0; r < k; ++r)
    total += std::exp((logit[order[r]] - logit[order[0]]) / temperature);
  double kept = 0;
  for (int64_t r = 0; r < k && kept < top_p; ++r) {
    const double q = std::exp((logit[order[r]] - logit[order[0]]) / temperature) / total;
    p[order[r]] = q;
    kept += q;
  }
  for (double& q : p) q /= kept;
  // Draws: batches of 3 copies of the prompt, one new token each, seeds 0, 1, ...
  const kiln::Tensor<int64_t> in = prompt_tensor({prompt, prompt, prompt});
  kiln::SearchOptions o;
  o.sampling_top_k = top_k;
  o.sampling_top_p = top_p;
  o.sampling_temperature = temperature;
  o.max_decoding_length = 1;
  std::vector<int64_t> count(static_cast<size_t>(V), 0);
  const int64_t eos = std::stoll(module.config.at("eos_id"));
  for (uint64_t seed = 0; seed < 1000; ++seed) {
    o.seed = seed;
    for (const auto& h : model.generate(in, o)) {
      ASSERT_LE(h[0].ids.size(), 1u);
      ++count[h[0].ids.empty() ? eos : h[0].ids[0]];  // the end token leaves no id
    }
  }
  for (int64_t v = 0; v < V; ++v) {
    const double freq = static_cast<double>(count[v]) / 3000.0;
    if (p[v] == 0) {
      EXPECT_EQ(count[v], 0) << "token " << v << " is outside top-k " << top_k << " / top-p "
                             << top_p;
      continue;
    }
    const double sd = std::sqrt(p[v] * (1 - p[v]) / 3000.0);
    EXPECT_NEAR(freq, p[v], 5 * sd + 1e-3) << "token " << v << " (top-k " << top_k << ", top-p "
                                           << top_p << ", T " << temperature << ")";
  }
}

TEST_P(CausalLM, SampledTokensFollowTheSoftmax) {
  ASSERT_EQ(function("forward").name, module().functions.at(0).name);
  const std::vector<int64_t> prompt = prompts(GetParam())[0];
  for (auto [k, p, t] : {std::tuple{0, 1.0f, 1.0f}, {5, 1.0f, 0.7f}, {0, 0.8f, 1.3f}})
    expect_distribution(model(), module(), weights(), prompt, ex().vocab, k, p, t);
}

TEST_P(CausalLM, TinyTopPIsGreedyAndStopIdsEndHypotheses) {
  const kiln::Tensor<int64_t> in = prompt_tensor(prompts(GetParam()));
  const ir::Tensor greedy = read(file("generate"), "greedy");
  kiln::SearchOptions o;
  o.max_decoding_length = 32;
  o.sampling_top_k = 0;
  o.sampling_top_p = 1e-6f;
  for (uint64_t seed : {1u, 2u, 3u}) {
    o.seed = seed;
    const auto got = first_hypotheses(model().generate(in, o));
    for (int64_t b = 0; b < 3; ++b) EXPECT_EQ(got[b], golden_row(greedy, b)) << "seed " << seed;
  }
  // Stop ids: each greedy continuation ends at its first stop id, which is not returned.
  kiln::SearchOptions s;
  s.max_decoding_length = 32;
  std::vector<int64_t> stops = {golden_row(greedy, 0).at(3), golden_row(greedy, 2).at(6)};
  s.stop_ids = stops.data();
  s.num_stop_ids = 2;
  const auto got = first_hypotheses(model().generate(in, s));
  for (int64_t b = 0; b < 3; ++b) {
    std::vector<int64_t> want = golden_row(greedy, b);
    auto at = std::find_first_of(want.begin(), want.end(), stops.begin(), stops.end());
    want.erase(at, want.end());
    EXPECT_EQ(got[b], want) << "prompt " << b;
  }
}

TEST_P(CausalLM, BadPromptsAndOptionsAreRefused) {
  auto error = [&](std::vector<int64_t> data, std::vector<int64_t> shape,
                   const kiln::SearchOptions& o = {}) {
    kiln::Tensor<int64_t> in{std::move(shape), std::move(data)};
    return testing::error_of<std::exception>([&] { model().generate(in, o); });
  };
  EXPECT_THAT(error({5, -1, 7}, {1, 3}),
              HasSubstr("prompt 0 has token 7 at position 2 after its -1 padding"));
  EXPECT_THAT(error({5, 6, -1, -1}, {2, 2}), HasSubstr("prompt 1 is empty"));
  EXPECT_THAT(error({5, 99}, {1, 2}),
              HasSubstr(fmt::format("prompt 0 has token id 99 at position 1, out of range [0, {})",
                                    ex().vocab)));
  kiln::SearchOptions o;
  o.max_decoding_length = 47;
  EXPECT_THAT(error({5, 6}, {1, 2}, o), HasSubstr("max_decoding_length 47 and the longest prompt's "
                                                  "2 tokens exceed the model's max_len 48"));
  kiln::SearchOptions p;
  p.sampling_top_k = 0;
  p.sampling_top_p = 0;
  EXPECT_THAT(error({5}, {1, 1}, p), HasSubstr("sampling_top_p is 0; it must be in (0, 1]"));
  std::vector<int64_t> stops = {ex().vocab};
  kiln::SearchOptions q;
  q.stop_ids = stops.data();
  q.num_stop_ids = 1;
  EXPECT_THAT(
      error({5}, {1, 1}, q),
      HasSubstr(fmt::format("stop_ids[0] is {0}; it must be a token id in [0, {0})", ex().vocab)));
  EXPECT_THAT(error({5, 6, 7, 8}, {4, 1}),
              HasSubstr("4 prompts in one call; the model's maximum is 3"));
  // The model stays usable.
  kiln::SearchOptions ok;
  ok.max_decoding_length = 3;
  EXPECT_EQ(model().generate(kiln::Tensor<int64_t>{{1, 1}, {5}}, ok).size(), 1u);
}

// Continuous batching (kiln_generator_*, runtime/generate.cpp "Joining"): a kiln_tensor of
// prompts, -1 padded, over `t`'s data.
kiln_tensor prompt_view(kiln::Tensor<int64_t>& t) {
  kiln_tensor v{};
  v.name = "src";
  v.dtype = KILN_I64;
  v.rank = 2;
  v.shape[0] = t.shape[0];
  v.shape[1] = t.shape[1];
  v.data = t.data.data();
  v.capacity = t.data.size() * sizeof(int64_t);
  return v;
}

// The finished sentences of `g` taken into `out` (by id), as kiln::Hypothesis lists.
void take_finished(kiln_model* m, kiln_generator* g,
                   std::map<int64_t, std::vector<kiln::Hypothesis>>& out) {
  int64_t ids[8];
  for (int64_t n; (n = kiln_generator_finished(g, ids, 8)) > 0;)
    for (int64_t k = 0; k < n; ++k) {
      kiln_generation r;
      ASSERT_EQ(kiln_generator_take(g, ids[k], &r), 0) << kiln_model_error(m);
      ASSERT_EQ(r.batch, 1);
      std::vector<kiln::Hypothesis>& hyps = out[ids[k]];
      for (int64_t h = 0; h < r.hypotheses; ++h) {
        const int64_t* t = r.ids + h * r.max_length;
        hyps.push_back({{t, t + r.lengths[h]}, r.scores[h]});
      }
      kiln_generation_free(&r);
    }
}

TEST_P(CausalLM, SentencesThatJoinARunningBatchGetWhatTheyGetAlone) {
  std::vector<std::vector<int64_t>> rows = prompts(GetParam());
  ASSERT_EQ(rows.size(), 3u);
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    return a.size() < b.size();  // a prompt joins once the batch's time reaches its length
  });
  for (int beam : {1, 3}) {
    SCOPED_TRACE(fmt::format("beam {}", beam));
    kiln::SearchOptions o;
    o.max_decoding_length = 12;
    o.min_decoding_length = 12;  // no end token before: the batch runs while the others join
    o.beam_size = beam;
    o.num_hypotheses = beam;
    std::vector<std::vector<kiln::Hypothesis>> alone;
    for (const auto& r : rows) alone.push_back(model().generate(prompt_tensor({r}), o).at(0));
    // Streamed tokens, by sentence (greedy only).
    std::map<int64_t, std::vector<int64_t>> streamed;
    if (beam == 1) {
      o.on_token = [](void* user, int64_t sentence, int64_t, int64_t token) {
        (*static_cast<std::map<int64_t, std::vector<int64_t>>*>(user))[sentence].push_back(token);
      };
      o.user_data = &streamed;
    }
    kiln_model* m = model().get();
    kiln_generator* g = kiln_generator_create(m, &o);
    ASSERT_NE(g, nullptr) << kiln_model_error(m);
    std::map<int64_t, std::vector<kiln::Hypothesis>> got;
    // The shortest prompt starts alone (at time 1); each other joins once the batch's time
    // reaches its length (5, then 9), while the batch runs.
    int64_t id = -1, steps = 0, alive = 0;
    std::vector<int64_t> joined_at;
    for (size_t k = 0; k < rows.size(); ++k) {
      kiln::Tensor<int64_t> t = prompt_tensor({rows[k]});
      const kiln_tensor v = prompt_view(t);
      for (int rc; (rc = kiln_generator_add(g, &v, 0, &id)) != 0; ++steps) {
        ASSERT_EQ(rc, 1) << kiln_model_error(m);
        alive = kiln_generator_step(g);
        ASSERT_GT(alive, 0) << kiln_model_error(m);
        take_finished(m, g, got);
      }
      EXPECT_EQ(id, static_cast<int64_t>(k));
      EXPECT_EQ(alive, static_cast<int64_t>(k)) << "prompt " << k << " joined a running batch";
      joined_at.push_back(steps);
      ++alive;
    }
    EXPECT_EQ(joined_at, (std::vector<int64_t>{0, 4, 8}));
    while (alive > 0) {
      alive = kiln_generator_step(g);
      ASSERT_GE(alive, 0) << kiln_model_error(m);
      take_finished(m, g, got);
    }
    kiln_generator_free(g);
    ASSERT_EQ(got.size(), rows.size());
    for (size_t k = 0; k < rows.size(); ++k) {
      ASSERT_EQ(got[k].size(), alone[k].size()) << "prompt " << k;
      for (size_t h = 0; h < alone[k].size(); ++h) {
        EXPECT_EQ(got[k][h].ids, alone[k][h].ids) << "prompt " << k << " hypothesis " << h;
        EXPECT_NEAR(got[k][h].score, alone[k][h].score, 1e-4) << "prompt " << k;
      }
      if (beam == 1) EXPECT_EQ(streamed[k], alone[k][0].ids) << "prompt " << k;
    }
  }
}

// Random arrivals, as a server sees them: 0 to 3 prompts of 1 to 5 ids before each step, each
// with its own max_decoding_length (4 to 24). The generator's count of live sentences is the
// added less the finished, nothing running always takes a prompt, and every sentence finishes
// with the ids it gets alone.
TEST_P(CausalLM, AGeneratorUnderRandomArrivalsFinishesEverySentenceAsAlone) {
  kiln_model* m = model().get();
  kiln::SearchOptions o;
  // Stop ids, so that sentences end at any step, their first token included.
  std::vector<int64_t> stops;
  for (int64_t id = 3; id < ex().vocab; id += 4) stops.push_back(id);
  o.stop_ids = stops.data();
  o.num_stop_ids = static_cast<int32_t>(stops.size());
  kiln_generator* g = kiln_generator_create(m, &o);
  ASSERT_NE(g, nullptr) << kiln_model_error(m);
  std::mt19937 rng(3);
  std::map<int64_t, std::pair<std::vector<int64_t>, int32_t>> added;  // id -> prompt, length
  std::map<int64_t, std::vector<kiln::Hypothesis>> got;
  int64_t live = 0, joined = 0, waited = 0;
  for (int round = 0; round < 300 || live > 0; ++round) {
    for (int k = round < 300 ? static_cast<int>(rng() % 4) : 0; k > 0; --k) {
      std::vector<int64_t> prompt(1 + rng() % 5);
      for (int64_t& id : prompt) id = 3 + static_cast<int64_t>(rng() % (ex().vocab - 3));
      const int32_t length = static_cast<int32_t>(4 + rng() % 21);
      kiln::Tensor<int64_t> t = prompt_tensor({prompt});
      const kiln_tensor v = prompt_view(t);
      int64_t id = -1;
      const int rc = kiln_generator_add(g, &v, length, &id);
      ASSERT_GE(rc, 0) << kiln_model_error(m);
      ASSERT_TRUE(rc == 0 || live > 0) << "nothing runs, yet the prompt was refused";
      if (rc == 0) {
        joined += live > 0;
        added[id] = {prompt, length};
        ++live;
      } else {
        ++waited;
      }
      const size_t before = got.size();
      take_finished(m, g, got);
      live -= static_cast<int64_t>(got.size() - before);
    }
    const int64_t alive = kiln_generator_step(g);
    ASSERT_GE(alive, 0) << kiln_model_error(m);
    const size_t before = got.size();
    take_finished(m, g, got);
    live -= static_cast<int64_t>(got.size() - before);
    ASSERT_EQ(alive, live) << "round " << round;
  }
  kiln_generator_free(g);
  EXPECT_GT(joined, 20);
  EXPECT_GT(waited, 0);
  ASSERT_EQ(got.size(), added.size());
  int64_t at_first = 0;  // sentences that ended with their first token
  for (const auto& [id, hyps] : got) at_first += hyps.at(0).ids.empty();
  EXPECT_GT(at_first, 0);
  for (const auto& [id, job] : added) {
    kiln::SearchOptions alone = o;
    alone.max_decoding_length = job.second;
    EXPECT_EQ(got[id].at(0).ids,
              model().generate(prompt_tensor({job.first}), alone).at(0).at(0).ids)
        << "sentence " << id;
  }
}

// kiln_generator_cancel: a sentence whose client is gone leaves the batch at once, finished
// with what it had (nothing); the others go on as alone.
TEST_P(CausalLM, ACancelledSentenceLeavesTheBatch) {
  kiln_model* m = model().get();
  kiln::SearchOptions o;
  o.max_decoding_length = 20;
  o.min_decoding_length = 20;
  kiln_generator* g = kiln_generator_create(m, &o);
  ASSERT_NE(g, nullptr) << kiln_model_error(m);
  int64_t id = -1;
  for (std::vector<int64_t> prompt : {std::vector<int64_t>{5, 6}, std::vector<int64_t>{7}}) {
    kiln::Tensor<int64_t> t = prompt_tensor({prompt});
    const kiln_tensor v = prompt_view(t);
    ASSERT_EQ(kiln_generator_add(g, &v, 0, &id), 0) << kiln_model_error(m);
  }
  ASSERT_EQ(kiln_generator_step(g), 2);
  EXPECT_EQ(kiln_generator_cancel(g, 1), 0) << kiln_model_error(m);
  EXPECT_EQ(kiln_generator_cancel(g, 1), 0);  // finished: left as it is
  int64_t ids[2];
  ASSERT_EQ(kiln_generator_finished(g, ids, 2), 1);
  EXPECT_EQ(ids[0], 1);
  kiln_generation r;
  ASSERT_EQ(kiln_generator_take(g, 1, &r), 0) << kiln_model_error(m);
  EXPECT_EQ(r.lengths[0], 0);  // no hypothesis finished
  kiln_generation_free(&r);
  EXPECT_EQ(kiln_generator_cancel(g, 7), -1);
  EXPECT_THAT(kiln_model_error(m), HasSubstr("no sentence 7"));
  int64_t steps = 1, alive = 0;
  do {
    alive = kiln_generator_step(g);
    ++steps;
  } while (alive == 1);
  EXPECT_EQ(alive, 0) << kiln_model_error(m);
  EXPECT_EQ(steps, 19);  // sentence 0's tokens but the prefill's
  ASSERT_EQ(kiln_generator_finished(g, ids, 2), 1);
  ASSERT_EQ(kiln_generator_take(g, 0, &r), 0) << kiln_model_error(m);
  const std::vector<int64_t> got(r.ids, r.ids + r.lengths[0]);
  kiln_generation_free(&r);
  EXPECT_EQ(got, model().generate(prompt_tensor({{5, 6}}), o).at(0).at(0).ids);
  kiln_generator_free(g);
}

TEST_P(CausalLM, AGeneratorRefusesWhatCannotJoinAndBadInput) {
  kiln_model* m = model().get();
  kiln::SearchOptions o;
  o.max_decoding_length = 40;  // no end token before: every sentence runs 40 tokens
  o.min_decoding_length = 40;
  kiln_generator* g = kiln_generator_create(m, &o);
  ASSERT_NE(g, nullptr) << kiln_model_error(m);
  auto add = [&](std::vector<int64_t> prompt) {
    kiln::Tensor<int64_t> t = prompt_tensor({std::move(prompt)});
    const kiln_tensor v = prompt_view(t);
    int64_t id = -1;
    const int rc = kiln_generator_add(g, &v, 0, &id);
    return rc == 0 ? id : rc == 1 ? -2 : -1;  // its id, -2: not now, -1: an error
  };
  ASSERT_EQ(add({5, 6}), 0);             // at times 0-1; the batch's time is 2
  ASSERT_EQ(kiln_generator_step(g), 1);  // time 3
  // Not yet: a prompt longer than the batch's time so far.
  EXPECT_EQ(add({5, 6, 7, 8}), -2);
  EXPECT_STREQ(kiln_model_error(m), "");
  // Bad input is an error, not a wait, and the generator goes on: the next prompt joins.
  EXPECT_EQ(add({5, ex().vocab}), -1);
  EXPECT_THAT(kiln_model_error(m), HasSubstr("out of range"));
  EXPECT_EQ(add({5, 6, 7}), 1);  // at times 0-2; its 39 steps end at time 41 of 48
  // Unfinished or unknown sentences are not taken.
  kiln_generation r;
  EXPECT_EQ(kiln_generator_take(g, 0, &r), -1);
  EXPECT_THAT(kiln_model_error(m), HasSubstr("sentence 0 is not finished"));
  EXPECT_EQ(kiln_generator_take(g, 7, &r), -1);
  EXPECT_THAT(kiln_model_error(m), HasSubstr("no sentence 7"));
  // From time 10 on, 40 tokens would pass the cache's 48 times: a prompt waits.
  for (int s = 0; s < 7; ++s) ASSERT_EQ(kiln_generator_step(g), 2);
  EXPECT_EQ(add({5}), -2);
  // Once no sentence runs, it starts a new batch.
  int64_t steps = 8;
  do {
    ++steps;
  } while (kiln_generator_step(g) > 0);
  EXPECT_EQ(steps, 40);  // sentence 1 joined after one step; its tokens but the first: 39
  EXPECT_EQ(add({5, 6, 7, 8}), 2);
  int64_t ids[4];
  ASSERT_EQ(kiln_generator_finished(g, ids, 4), 2);
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 1);
  ASSERT_EQ(kiln_generator_take(g, 1, &r), 0) << kiln_model_error(m);
  EXPECT_EQ(r.lengths[0], 40);
  kiln_generation_free(&r);
  EXPECT_EQ(kiln_generator_take(g, 1, &r), -1);
  EXPECT_THAT(kiln_model_error(m), HasSubstr("sentence 1 was taken already"));
  kiln_generator_free(g);
  // Bad options: no generator.
  kiln::SearchOptions bad;
  bad.beam_size = 9;
  EXPECT_EQ(kiln_generator_create(m, &bad), nullptr);
  EXPECT_THAT(kiln_model_error(m), HasSubstr("beam_size 9 is above the compiled maximum 4"));
}

// `kiln generate` on the llama example's shared library: greedy ids of prompts of different
// lengths as the twin's (one line per prompt), beam hypotheses with scores, stop ids, sampling
// by seed, streaming; and its errors.
// Vocabulary restriction (kiln_search_options.vocabulary) is an encoder–decoder's: a
// decoder-only model refuses it, in kiln_generate, kiln_generator_create and kiln translate
// --vocab-map, saying so.
TEST_P(CausalLM, VocabularyRestrictionIsRefused) {
  const std::vector<int64_t> allowed = {3, 4, 5};
  kiln::SearchOptions o;
  o.vocabulary = allowed.data();
  o.num_vocabulary = 3;
  const std::string why =
      "vocabulary restriction is for encoder–decoder models (their decode_step_restricted); "
      "this is a decoder-only model (generation = causal_lm)";
  kiln::Tensor<int64_t> in{{1, 2}, {5, 6}};
  EXPECT_EQ(testing::error_of<std::exception>([&] { model().generate(in, o); }), why);
  EXPECT_EQ(kiln_generator_create(model().get(), &o), nullptr);
  EXPECT_EQ(kiln_model_error(model().get()), why);
}

TEST(GenerateCli, TranslateRefusesAVocabularyMapForADecoderOnlyModel) {
  const std::string vmap = ::testing::TempDir() + "decoder_only.vmap";
  {
    std::ofstream out(vmap);
    out << "3\t4 5\n";
  }
  const std::string src = ::testing::TempDir() + "decoder_only_src.safetensors";
  rt::write_safetensors(src, {rt::make_i64("src", {1, 2}, {5, 6})});
  const testing::CliResult r = testing::run_argv(
      {"%kiln", "translate", "--compiled", KILN_GENERATE_MODEL_DIR, "--weights",
       golden("llama.weights.safetensors"), "--inputs", src, "--vocab-map", vmap});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output, fmt::format("kiln: error: translate: --vocab-map restricts an "
                                  "encoder–decoder's target vocabulary; '{}' is a decoder-only "
                                  "model (vocabulary restriction is for encoder–decoder models)\n",
                                  KILN_GENERATE_MODEL_DIR));
}

TEST(GenerateCli, PrintsTheTwinsIdsAndRefusesBadPrompts) {
  const std::vector<std::vector<int64_t>> p = prompts("llama");
  const ir::Tensor greedy = read("llama.generate.safetensors", "greedy");
  const std::string w = golden("llama.weights.safetensors");
  std::vector<std::string> argv = {"%kiln",     "generate", "--compiled", KILN_GENERATE_MODEL_DIR,
                                   "--weights", w,          "--max-len",  "32"};
  for (const auto& prompt : p) argv.push_back(fmt::format("{}", fmt::join(prompt, " ")));
  testing::CliResult r = testing::run_argv(argv);
  ASSERT_EQ(r.status, 0) << r.output;
  std::string want;
  for (int64_t b = 0; b < 3; ++b)
    want += fmt::format("{}\n", fmt::join(golden_row(greedy, b), " "));
  EXPECT_EQ(r.output, want);
  // Standard input, one prompt per line, and a stop id: the line ends before it.
  const std::vector<int64_t> g0 = golden_row(greedy, 0);
  testing::CliOptions in;
  in.input = fmt::format("{}\n", fmt::join(p[0], " "));
  r = testing::run_argv({"%kiln", "generate", "--compiled", KILN_GENERATE_MODEL_DIR, "--weights", w,
                         "--max-len", "32", "--stop-id", std::to_string(g0.at(4))},
                        in);
  ASSERT_EQ(r.status, 0) << r.output;
  std::vector<int64_t> cut(g0.begin(), std::find(g0.begin(), g0.end(), g0.at(4)));
  EXPECT_EQ(r.output, fmt::format("{}\n", fmt::join(cut, " ")));
  // Sampling: the same seed prints the same, streamed or not.
  auto sample = [&](const char* seed, bool stream) {
    std::vector<std::string> a = {"%kiln",
                                  "generate",
                                  "--compiled",
                                  KILN_GENERATE_MODEL_DIR,
                                  "--weights",
                                  w,
                                  "--sampling-topk",
                                  "0",
                                  "--top-p",
                                  "0.9",
                                  "--seed",
                                  seed,
                                  "--max-len",
                                  "12",
                                  fmt::format("{}", fmt::join(p[2], " "))};
    if (stream) a.push_back("--stream");
    testing::CliResult s = testing::run_argv(a, {.join_stderr = false});
    EXPECT_EQ(s.status, 0) << s.errors;
    std::string out = s.output;
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    return out;
  };
  EXPECT_EQ(sample("7", false), sample("7", false));
  EXPECT_EQ(sample("7", false), sample("7", true));
  // Errors name the prompt.
  r = testing::run_argv(
      {"%kiln", "generate", "--compiled", KILN_GENERATE_MODEL_DIR, "--weights", w, "3 4", "5 x"});
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output, HasSubstr("kiln: error: generate: prompt 2: 'x' is not a token id"));
  r = testing::run_argv(
      {"%kiln", "generate", "--compiled", KILN_GENERATE_MODEL_DIR, "--weights", w, "3 4 999"});
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output,
              HasSubstr("kiln: error: generate: prompt 1: token id 999 is out of range [0, 61) "
                        "(the model's vocab): '3 4 999'"));
}

// `kiln generate --tokenizer`: text prompts and text output through a tokenizer
// (tokenizers/tokenizer.h), here a character vocabulary of the llama example's 61 tokens
// (token i is the character 33 + i): the same ids as the id prompts give, as text, streamed
// or not.
TEST(GenerateCli, TokenizerTakesTextPromptsAndPrintsText) {
  const std::vector<std::vector<int64_t>> p = prompts("llama");
  const ir::Tensor greedy = read("llama.generate.safetensors", "greedy");
  const std::string w = golden("llama.weights.safetensors");
  const std::string vocab = ::testing::TempDir() + "kiln_llama_chars.txt";
  {
    std::ofstream out(vocab);
    for (int i = 0; i < 61; ++i) out << static_cast<char>(33 + i) << "\n";
  }
  auto text = [](const std::vector<int64_t>& ids) {
    std::string t;
    for (int64_t id : ids) t += static_cast<char>(33 + id);
    return t;
  };
  const std::vector<int64_t> g0 = golden_row(greedy, 0);
  testing::CliResult r =
      testing::run_argv({"%kiln", "generate", "--compiled", KILN_GENERATE_MODEL_DIR, "--weights", w,
                         "--max-len", "32", "--tokenizer", vocab, text(p[0])});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output, text(g0) + "\n");
  r = testing::run_argv({"%kiln", "generate", "--compiled", KILN_GENERATE_MODEL_DIR, "--weights", w,
                         "--max-len", "32", "--tokenizer", vocab, "--stream", text(p[0])});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output, text(g0) + "\n");
  // Text the tokenizer cannot encode is an error naming the prompt.
  r = testing::run_argv({"%kiln", "generate", "--compiled", KILN_GENERATE_MODEL_DIR, "--weights", w,
                         "--tokenizer", vocab, "a b"});
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output, HasSubstr("kiln: error: generate: prompt 1: character"));
}

// `kiln run --compiled` runs one decode_step (its caches updated in place: the runtime says
// which output updates which input, kiln_model_output_updates): logits and caches as the C++
// API's run of the same step.
TEST(GenerateCli, RunCompiledRunsAStep) {
  Example& ex = example("llama");
  const int64_t n = 2, T = 6, width = 2 * 8;  // kv_heads 2 of head size 8
  std::vector<rt::TensorData> in;
  in.push_back(rt::make_i64("tok", {n, 1}, {7, 9}));
  in.push_back(rt::make_i64("pos", {1}, {2}));
  in.push_back(rt::make_i64("rows", {n, 3}, {0, 0, 0, -1, 1, 1}));
  in.push_back(rt::make_i64("start", {n}, {0, 1}));
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<kiln::Tensor<float>> caches;
  const ir::Function& step = ex.function("decode_step");
  for (ir::ValueId v : step.params) {
    const std::string& name = step.values[v].name;
    if (name.rfind("cache_", 0) != 0) continue;
    ASSERT_EQ(step.type(v).shape[2].value, width) << name;
    kiln::Tensor<float> c{{T, n, width}, {}};
    for (int64_t i = 0; i < c.numel(); ++i) c.data.push_back(normal(rng));
    in.push_back(rt::make_f32(name, c.shape, c.data));
    caches.push_back(std::move(c));
  }
  const std::string inputs = ::testing::TempDir() + "kiln_step_inputs.safetensors";
  const std::string outputs = ::testing::TempDir() + "kiln_step_outputs.safetensors";
  rt::write_safetensors(inputs, in);
  testing::CliResult r = testing::run_argv(
      {"%kiln", "run", "--compiled", KILN_GENERATE_MODEL_DIR, "--function", "decode_step",
       "--weights", golden("llama.weights.safetensors"), "--inputs", inputs, "-o", outputs});
  ASSERT_EQ(r.status, 0) << r.output;
  // The same step through the C++ API.
  kiln::Tensor<int64_t> tok{{n, 1}, {7, 9}}, pos{{1}, {2}}, rows{{n, 3}, {0, 0, 0, -1, 1, 1}},
      start{{n}, {0, 1}};
  kiln::Tensor<float> logits;
  std::vector<kiln::Input> ins = {tok, pos, rows, start};
  std::vector<kiln::Output> outs = {logits};
  for (auto& c : caches) {
    ins.push_back(c);
    outs.push_back(c);
  }
  ex.compiled->run("decode_step", ins, outs);
  rt::SafeTensors got = rt::SafeTensors::load(outputs);
  const rt::TensorInfo* l = got.find("logits");
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(max_diff(got.to_f32(*l), logits.data), 0.0);
  size_t i = 0;
  for (ir::ValueId v : step.params) {
    const std::string& name = step.values[v].name;
    if (name.rfind("cache_", 0) != 0) continue;
    const rt::TensorInfo* c = got.find(name + "_out");
    ASSERT_NE(c, nullptr) << name;
    EXPECT_EQ(max_diff(got.to_f32(*c), caches[i++].data), 0.0) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Examples, CausalLM, ::testing::Values("llama", "gpt2"));

// A score bias from the context's positions (ALiBi, nn::alibi_bias) is the same bias in every
// entry point: a one-layer model's prefill over left-padded prompts and its decode steps give
// forward's logits of each prompt alone (interpreted), and after the default pipeline the bias
// reaches the fused attention and cache_attention.
TEST(DecodingBias, AlibiPrefillAndStepsMatchForward) {
  using dsl::Tensor;
  constexpr int64_t V = 11, D = 8, H = 2;
  dsl::ModelBuilder mb("alibi");
  nn::add_causal_lm(
      mb, {.vocab = V, .max_len = 12, .max_batch = 2},
      [&](nn::Decoding& ctx, Tensor ids) {
        dsl::FunctionBuilder& f = *ids.builder();
        Tensor x = dsl::gather(f.weight("embed", {V, D}), ids);
        auto lin = [&](const char* name, Tensor t) {
          return dsl::matmul(t, dsl::transpose(f.weight(name, {D, D}), {1, 0}));
        };
        nn::AttentionSpec spec{.heads = H};
        spec.bias = nn::alibi_bias(ctx.positions(), ctx.key_positions(), H);
        return x + lin("o", ctx.attention(lin("q", x), lin("k", x), lin("v", x), spec));
      },
      [&](Tensor h) {
        return dsl::matmul(h, dsl::transpose(h.builder()->weight("head", {V, D}), {1, 0}));
      });
  const ir::Module m = mb.finish();
  std::mt19937 rng(8);
  std::normal_distribution<float> normal(0.0f, 0.7f);
  ir::WeightMap w;
  for (const auto& [name, shape] :
       std::vector<std::pair<std::string, std::vector<int64_t>>>{{"embed", {V, D}},
                                                                 {"q", {D, D}},
                                                                 {"k", {D, D}},
                                                                 {"v", {D, D}},
                                                                 {"o", {D, D}},
                                                                 {"head", {V, D}}}) {
    std::vector<float> data(static_cast<size_t>(shape[0] * shape[1]));
    for (float& x : data) x = normal(rng);
    w[name] = ir::Tensor::from_f32(shape, std::move(data));
  }
  auto fn = [&](const std::string& name) -> const ir::Function& {
    for (const ir::Function& f : m.functions)
      if (f.name == name) return f;
    throw std::runtime_error("no function " + name);
  };
  const std::vector<std::vector<int64_t>> seqs = {{3, 5, 7, 2, 9, 1}, {4, 8, 6, 10, 1, 2, 3}};
  const std::vector<int64_t> prompt_len = {2, 5};
  const int64_t L = 5, steps = 2;
  std::vector<int64_t> ids(2 * L, 0), start = {L - 2, 0};
  for (int64_t b = 0; b < 2; ++b)
    std::copy(seqs[b].begin(), seqs[b].begin() + prompt_len[b], ids.begin() + b * L + start[b]);
  std::vector<ir::Tensor> caches(2, ir::Tensor::zeros(ir::DType::f32, {L + steps, 2, D}));
  auto check = [&](const ir::Tensor& logits, int64_t b, int64_t pos, const std::string& what) {
    const std::vector<int64_t>& s = seqs[b];
    const ir::Tensor want = ir::interpret(
        m, fn("forward"), w,
        {ir::Tensor::from_ints(ir::DType::i64, {1, pos + 1}, {s.begin(), s.begin() + pos + 1})})[0];
    const std::vector<float> got(logits.f.begin() + b * V, logits.f.begin() + (b + 1) * V);
    EXPECT_LE(max_diff(got, {want.f.end() - V, want.f.end()}), 1e-5) << what << ", sequence " << b;
  };
  std::vector<ir::Tensor> in = {ir::Tensor::from_ints(ir::DType::i64, {2, L}, ids),
                                ir::Tensor::from_ints(ir::DType::i64, {2}, start), caches[0],
                                caches[1]};
  std::vector<ir::Tensor> out = ir::interpret(m, fn("prefill"), w, in);
  for (int64_t b = 0; b < 2; ++b) check(out[0], b, prompt_len[b] - 1, "prefill");
  caches = {out[1], out[2]};
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t pos = L + s, P = pos + 1;
    std::vector<int64_t> tok(2), rows(static_cast<size_t>(2 * P));
    for (int64_t b = 0; b < 2; ++b) {
      tok[b] = seqs[b][prompt_len[b] + s];
      for (int64_t j = 0; j < P; ++j) rows[b * P + j] = j < start[b] ? -1 : b;
    }
    out = ir::interpret(m, fn("decode_step"), w,
                        {ir::Tensor::from_ints(ir::DType::i64, {2, 1}, tok),
                         ir::Tensor::from_ints(ir::DType::i64, {1}, {pos}),
                         ir::Tensor::from_ints(ir::DType::i64, {2, P}, rows),
                         ir::Tensor::from_ints(ir::DType::i64, {2}, start), caches[0], caches[1]});
    for (int64_t b = 0; b < 2; ++b) check(out[0], b, prompt_len[b] + s, fmt::format("step {}", s));
    caches = {out[1], out[2]};
  }
  ir::Module fused = m;
  passes::run_passes(fused, passes::default_pipeline());
  for (const ir::Function& f : fused.functions) {
    int64_t biased = 0;
    for (const ir::Op& op : f.ops)
      biased += (op.kind == ir::OpKind::attention && op.has_attr("bias")) ||
                (op.kind == ir::OpKind::cache_attention && op.operands.size() == 5);
    EXPECT_EQ(biased, 1) << f.name;
  }
}

}  // namespace
}  // namespace kiln
