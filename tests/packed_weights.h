// What the tests of models compiled with packed linear weights (bf16_test.cpp: WEIGHTS bf16,
// int8_test.cpp: WEIGHTS int8) share: the golden files, the optimized module the library was
// built from, one linear entry point run through the C ABI, the shipped number translator's
// held-out set, greedy ids in batches of a model's max batch.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "frontend/models.h"
#include "ir/interpreter.h"
#include "ir/ir.h"
#include "ir/parser.h"
#include "kiln/runtime.h"
#include "kiln/vocab.h"
#include "noise.h"
#include "pass_harness.h"
#include "passes/pipeline.h"
#include "runtime/plan.h"
#include "runtime/safetensors.h"
#include "tools/bridge.h"

namespace kiln::testing {

inline std::string golden_file(const std::string& f) {
  return std::string(KILN_TEST_DATA_DIR) + "/golden/" + f;
}

// The module as a library is built from it: the default pipeline's output.
inline ir::Module optimized_transformer(const std::string& config,
                                        const std::vector<std::string>& settings = {}) {
  ir::Module m = models::build_model("transformer", config, settings);
  passes::run_passes(m, passes::default_pipeline());
  return m;
}

inline double max_abs_diff(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double err = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i)
    err = std::max(err, std::abs(static_cast<double>(got[i]) - want[i]));
  return err;
}

// Entry point `entry` of `m` through the interpreter with `options` (its rounding of the
// linears: bf16_linear or int8_linear), the reference of a packed-weight library.
inline std::vector<ir::Tensor> interpret_entry(const ir::Module& m, const std::string& entry,
                                               const ir::WeightMap& weights,
                                               const std::vector<ir::Tensor>& inputs,
                                               const ir::InterpretOptions& options) {
  return ir::interpret(m, *m.find_function(entry), weights, inputs, options);
}

// The weights of `m` (those not derived at load) from `wm` written as a safetensors file
// named `name` in the test's temporary directory: f32, or bf16 with `as_bf16`, in which case
// `wm` is rounded to what the file holds (a bf16 checkpoint loads as it is). Returns its path.
inline std::string write_random_weights(const ir::Module& m, ir::WeightMap& wm,
                                        const std::string& name, bool as_bf16) {
  std::vector<rt::TensorData> tensors;
  for (const ir::Weight& w : m.weights) {
    if (w.derivation) continue;
    ir::Tensor& t = wm.at(w.name);
    if (as_bf16) {
      rt::TensorData d;
      d.name = w.name;
      d.dtype = rt::DType::bf16;
      d.shape = t.shape;
      d.data.resize(t.f.size() * 2);
      for (size_t i = 0; i < t.f.size(); ++i) {
        const uint16_t b = rt::f32_to_bf16(t.f[i]);
        t.f[i] = rt::bf16_to_f32(b);  // the interpreter sees what the file holds
        std::memcpy(d.data.data() + 2 * i, &b, 2);
      }
      tensors.push_back(std::move(d));
    } else {
      tensors.push_back(rt::make_f32(w.name, t.shape, t.f));
    }
  }
  const std::string path = ::testing::TempDir() + name + ".safetensors";
  rt::write_safetensors(path, tensors);
  return path;
}

// A model as a library is built from it: the optimized module, its weights (as the checkpoint
// holds them, derived ones materialized) and the checkpoint's path.
struct ModelFiles {
  ir::Module m;
  ir::WeightMap w;
  std::string path;
};

// The golden `config` (tests/golden) with its weights.
inline ModelFiles golden_model(const std::string& config) {
  ModelFiles f{optimized_transformer(config), {}, golden_file(config + ".weights.safetensors")};
  f.w = tools::load_weight_map(f.m, rt::SafeTensors::load(f.path));
  ir::materialize_weights(f.m, f.w);
  return f;
}

// The transformer `config` with `settings`, random weights (seed), written as the checkpoint
// `file` (write_random_weights: bf16 with `as_bf16`).
inline ModelFiles random_model(const std::string& config, const std::vector<std::string>& settings,
                               uint32_t seed, const std::string& file, bool as_bf16) {
  ModelFiles f{optimized_transformer(config, settings), {}, {}};
  ir::Module plain = models::build_model("transformer", config, settings);
  f.w = random_weights(plain, seed);
  f.path = write_random_weights(plain, f.w, file, as_bf16);
  ir::materialize_weights(f.m, f.w);
  return f;
}

// The odd models' config (tests/CMakeLists.txt's KILN_ODD_SETTINGS: int8_odd, bf16_odd,
// bf16fma_odd): K and N not multiples of 4 or 64, a vocabulary of three blocks of 64 columns.
inline const std::vector<std::string> kOddSettings = {
    "d_model=21",   "heads=3",      "d_ff=13",  "src_vocab=17", "tgt_vocab=150",
    "enc_layers=1", "dec_layers=2", "pad_id=2", "max_len=12",   "max_batch=3"};

// A golden batch (tests/golden: `config`'s weights, `batch`'s inputs and PyTorch's f32 logits)
// through a library's forward, and through the interpreter with `options` (its rounding of
// the linears) on the module the library was built from.
struct GoldenForward {
  Tensor<float> got, pytorch;
  std::vector<float> interpreted;
  int linears = 0;          // linear ops in forward
  int attentions_bf16 = 0;  // attention ops in forward that a bf16 library computes in bf16
};

// The attention ops of `entry` with an even head size (AttentionKernel::bf16 with bf16 weights:
// two more bf16 products each).
inline int bf16_attention_ops(const ir::Module& m, const std::string& entry) {
  const ir::Function& f = *m.find_function(entry);
  int n = 0;
  for (const ir::Op& op : f.ops)
    n += op.kind == ir::OpKind::attention &&
         f.type(op.operands[0]).shape[2].value / op.int_attr("heads") % 2 == 0;
  return n;
}
template <typename Model>
GoldenForward golden_forward(Model& model, const std::string& config, const std::string& batch,
                             const ir::InterpretOptions& options) {
  const ModelFiles golden = golden_model(config);
  const ir::Module& m = golden.m;
  const ir::WeightMap& wm = golden.w;
  const auto src = read_tensor<int64_t>(golden_file(batch + ".inputs.safetensors"), "src");
  const auto tgt = read_tensor<int64_t>(golden_file(batch + ".inputs.safetensors"), "tgt");
  GoldenForward r;
  r.pytorch = read_tensor<float>(golden_file(batch + ".expected.safetensors"), "logits");
  r.interpreted = interpret_entry(m, "forward", wm,
                                  {ir::Tensor::from_ints(ir::DType::i64, src.shape, src.data),
                                   ir::Tensor::from_ints(ir::DType::i64, tgt.shape, tgt.data)},
                                  options)[0]
                      .f;
  r.got = model.forward(src, tgt);
  for (const ir::Op& op : m.find_function("forward")->ops)
    r.linears += op.kind == ir::OpKind::linear;
  r.attentions_bf16 = bf16_attention_ops(m, "forward");
  return r;
}

// tests/abi/linears.kir, whose entry points are one linear each: N below, at and above
// multiples of 64, K odd and even (1, 7, 20, 21, 33, 64, 512, 2048), ReLU, no bias.
struct LinearCase {
  int64_t K, N;
  bool relu, bias;
  std::string name() const { return "k" + std::to_string(K) + "_n" + std::to_string(N); }
};
inline const std::vector<LinearCase>& linears_cases() {
  static const std::vector<LinearCase> cases = {{1, 17, false, true},    {7, 5, true, false},
                                                {20, 36, true, true},    {21, 29, false, true},
                                                {64, 64, false, true},   {64, 200, true, true},
                                                {33, 1, false, true},    {512, 512, false, true},
                                                {512, 130, true, false}, {2048, 128, false, true}};
  return cases;
}

// The rows each case runs with: the register blocks' remainders and the tile shapes up to 200
// rows (4-row blocks below 64 rows, from 16 rows two parallel tiles of half the rows with
// fewer than 16 panels, and, where 6 does not divide the rows, below kSmallBlockRows: 64, 128,
// 129; 6-row blocks: 96, 200) and, for reductions of 512 and more (the bf16 and int8 kernels'
// parallel tiles of rows from 512 rows on where K ≥ 1024 or the panels are small,
// schedule_packed_linear), 512 and 777 rows too.
inline std::vector<int64_t> linears_rows(int64_t K) {
  std::vector<int64_t> rows = {1, 2, 3, 4, 5, 7, 16, 33, 63, 64, 96, 128, 129, 200};
  if (K >= 512) rows.insert(rows.end(), {512, 777});
  return rows;
}

inline ir::Module linears_module() {
  std::ifstream kir(std::string(KILN_TEST_DATA_DIR) + "/abi/linears.kir");
  std::stringstream text;
  text << kir.rdbuf();
  return ir::parse_and_verify(text.str(), "linears.kir");
}

// A checkpoint of noise for every linears_cases() weight (w_NAME [N, K]) and bias (b_NAME [N]),
// seeds from `seed` on (left at the next unused one), written as `file` in the test's
// temporary directory.
struct LinearsCheckpoint {
  std::map<std::string, std::vector<float>> w, b;  // by case name
  ir::WeightMap weights;                           // the same, for the interpreter
  std::string path;
};
inline LinearsCheckpoint write_linears_noise(const std::string& file, uint32_t& seed) {
  LinearsCheckpoint c;
  std::vector<rt::TensorData> tensors;
  for (const LinearCase& lc : linears_cases()) {
    const std::string name = lc.name();
    c.w[name] = noise(static_cast<size_t>(lc.N * lc.K), seed++);
    tensors.push_back(rt::make_f32("w_" + name, {lc.N, lc.K}, c.w[name]));
    c.weights["w_" + name] = ir::Tensor::from_f32({lc.N, lc.K}, c.w[name]);
    if (lc.bias) {
      c.b[name] = noise(static_cast<size_t>(lc.N), seed++);
      tensors.push_back(rt::make_f32("b_" + name, {lc.N}, c.b[name]));
      c.weights["b_" + name] = ir::Tensor::from_f32({lc.N}, c.b[name]);
    }
  }
  c.path = ::testing::TempDir() + file;
  rt::write_safetensors(c.path, tensors);
  return c;
}

// Entry point `name` of a library of linears (tests/abi/linears.kir): x [M, K] in, y [M, N]
// out (NaN before the call). Returns kiln_model_run's status.
inline int run_linear(kiln_model* model, const std::string& name, std::vector<float>& x, int64_t M,
                      int64_t K, int64_t N, std::vector<float>& y) {
  y.assign(static_cast<size_t>(M * N), NAN);
  kiln_tensor in{}, out{};
  in.dtype = out.dtype = KILN_F32;
  in.rank = out.rank = 2;
  in.shape[0] = out.shape[0] = M;
  in.shape[1] = K;
  out.shape[1] = N;
  in.data = x.data();
  in.capacity = x.size() * 4;
  out.data = y.data();
  out.capacity = y.size() * 4;
  return kiln_model_run(model, name.c_str(), &in, 1, &out, 1);
}

// The shipped number translator's held-out set (examples/numbers/heldout.tsv): source
// sentences encoded, and the expected translations.
struct HeldOut {
  std::vector<std::vector<int64_t>> sources;
  std::vector<std::string> targets;
  int64_t pad = 0;
};
inline HeldOut numbers_heldout() {
  const std::string dir = std::string(KILN_TEST_DATA_DIR) + "/../examples/numbers/";
  const Vocabulary src_vocab = Vocabulary::load(dir + "vocab.src.txt");
  HeldOut h;
  std::ifstream in(dir + "heldout.tsv");
  for (std::string line; std::getline(in, line);) {
    const size_t tab = line.find('\t');
    h.sources.push_back(src_vocab.encode(line.substr(0, tab)));
    h.targets.push_back(tab == std::string::npos ? "" : line.substr(tab + 1));
  }
  h.pad = src_vocab.id("<pad>");
  return h;
}
inline std::string numbers_file(const std::string& f) {
  return std::string(KILN_TEST_DATA_DIR) + "/../examples/numbers/" + f;
}

// The greedy ids of every sentence through `model` (a generated class), in batches of at most
// `max_batch`, each padded to its longest sentence.
template <typename Model>
std::vector<std::vector<int64_t>> greedy_ids(Model& model, const HeldOut& h, int64_t max_batch,
                                             int32_t max_length) {
  SearchOptions options;
  options.max_decoding_length = max_length;
  std::vector<std::vector<int64_t>> ids;
  const size_t per = static_cast<size_t>(max_batch);
  for (size_t first = 0; first < h.sources.size(); first += per) {
    const size_t n = std::min(per, h.sources.size() - first);
    size_t length = 1;
    for (size_t i = 0; i < n; ++i) length = std::max(length, h.sources[first + i].size());
    Tensor<int64_t> src{{static_cast<int64_t>(n), static_cast<int64_t>(length)},
                        std::vector<int64_t>(n * length, h.pad)};
    for (size_t i = 0; i < n; ++i)
      std::copy(h.sources[first + i].begin(), h.sources[first + i].end(),
                src.data.begin() + static_cast<int64_t>(i * length));
    auto out = model.generate(src, options);
    for (auto& hyps : out) ids.push_back(std::move(hyps[0].ids));
  }
  return ids;
}

}  // namespace kiln::testing
