// The decoding ops of today's decoder-only models (ir/ops.def): cache_write of a whole prompt
// (no position), and cache_attention with grouped-query heads (kv_heads), skipped keys (a row
// of -1: a left-padded prompt's padding), a sliding window and a score bias. The interpreter is
// checked against the plain op on equivalent inputs (heads repeated, keys dropped), and the
// compiled kernels (tests/jit_model.h: the default pipeline, lowering, Halide JIT, the runtime)
// against the interpreter at odd sizes.
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "codegen/lower.h"
#include "error_of.h"
#include "ir/interpreter.h"
#include "ir/parser.h"
#include "jit_model.h"
#include "passes/pipeline.h"

namespace kiln {
namespace {

constexpr char kModule[] = R"(
module @cache_ops {
  symbol N max 9
  symbol P max 40
  symbol T max 40
  symbol C max 9
  symbol L max 40
  # 4 query heads of 6 over 2 key/value heads (grouped-query attention).
  func @gqa(%q: f32[N,1,24], %k: f32[T,C,12], %v: f32[T,C,14], %rows: i64[N,P]) -> (f32[N,1,28]) {
    %out = cache_attention(%q, %k, %v, %rows) {heads = 4, kv_heads = 2, scale = 0.41} : f32[N,1,28]
    return %out
  }
  # 3 heads over one key/value head (multi-query), a window of 5 keys.
  func @mqa_window(%q: f32[N,1,15], %k: f32[T,C,5], %v: f32[T,C,5], %rows: i64[N,P]) -> (f32[N,1,15]) {
    %out = cache_attention(%q, %k, %v, %rows) {heads = 3, kv_heads = 1, scale = 0.45, window = 5} : f32[N,1,15]
    return %out
  }
  # A score bias per hypothesis and head (T5's relative buckets), and one shared by every
  # hypothesis and head (broadcast), with a window.
  func @biased(%q: f32[N,1,24], %k: f32[T,C,12], %v: f32[T,C,14], %rows: i64[N,P], %b: f32[N,4,1,P]) -> (f32[N,1,28]) {
    %out = cache_attention(%q, %k, %v, %rows, %b) {heads = 4, kv_heads = 2, scale = 0.41} : f32[N,1,28]
    return %out
  }
  func @biased_shared(%q: f32[N,1,15], %k: f32[T,C,5], %v: f32[T,C,5], %rows: i64[N,P], %b: f32[1,1,1,P]) -> (f32[N,1,15]) {
    %out = cache_attention(%q, %k, %v, %rows, %b) {heads = 3, kv_heads = 1, scale = 0.45, window = 5} : f32[N,1,15]
    return %out
  }
  # The plain op, for the equivalences below.
  func @plain(%q: f32[N,1,24], %k: f32[T,C,24], %v: f32[T,C,28], %rows: i64[N,P]) -> (f32[N,1,28]) {
    %out = cache_attention(%q, %k, %v, %rows) {heads = 4, scale = 0.41} : f32[N,1,28]
    return %out
  }
  # A prompt pass's write: rows 0..L-1 of every slot n < N.
  func @prompt(%x: f32[N,L,7], %cache: f32[T,C,7]) -> (f32[T,C,7]) {
    %y = neg(%x) : f32[N,L,7]
    %c = cache_write(%cache, %y) : f32[T,C,7]
    return %c
  }
}
)";

const ir::Function& function_of(const ir::Module& m, const std::string& name) {
  for (const ir::Function& f : m.functions)
    if (f.name == name) return f;
  throw std::runtime_error("no function " + name);
}

ir::Tensor normal(std::vector<int64_t> shape, std::mt19937& rng) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> data(static_cast<size_t>(n));
  for (float& x : data) x = d(rng);
  return ir::Tensor::from_f32(std::move(shape), std::move(data));
}

// A row table [n, p] of random slots < c, with `skipped` of each row's leading keys -1 (a
// left-padded prompt), never the last key.
ir::Tensor row_table(int64_t n, int64_t p, int64_t c, std::mt19937& rng, bool skip) {
  std::vector<int64_t> rows(static_cast<size_t>(n * p));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t skipped = skip ? std::uniform_int_distribution<int64_t>(0, p - 1)(rng) : 0;
    for (int64_t j = 0; j < p; ++j)
      rows[i * p + j] = j < skipped ? -1 : std::uniform_int_distribution<int64_t>(0, c - 1)(rng);
  }
  return ir::Tensor::from_ints(ir::DType::i64, {n, p}, std::move(rows));
}

// k [T, C, G·d] with each of its G heads repeated `rep` times: [T, C, G·rep·d].
ir::Tensor repeat_heads(const ir::Tensor& k, int64_t groups, int64_t rep) {
  const int64_t t = k.shape[0], c = k.shape[1], d = k.shape[2] / groups;
  std::vector<float> out;
  for (int64_t r = 0; r < t * c; ++r)
    for (int64_t h = 0; h < groups * rep; ++h)
      for (int64_t e = 0; e < d; ++e) out.push_back(k.f[r * groups * d + (h / rep) * d + e]);
  return ir::Tensor::from_f32({t, c, groups * rep * d}, std::move(out));
}

double max_diff(const ir::Tensor& a, const ir::Tensor& b) {
  EXPECT_EQ(a.shape, b.shape);
  double worst = 0;
  for (size_t i = 0; i < std::min(a.f.size(), b.f.size()); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(a.f[i]) - b.f[i]));
  return worst;
}

// Grouped-query attention is the plain op over K/V heads repeated; a key whose row is -1
// contributes nothing: each query row equals the plain op over its other keys alone.
TEST(CacheOps, InterpreterGroupedQueryAndSkippedKeysMatchThePlainOp) {
  const ir::Module m = ir::parse_module(kModule);
  std::mt19937 rng(7);
  for (int64_t p : {1, 7, 33}) {
    const int64_t n = 4, t = p + 2, c = 5;
    ir::Tensor q = normal({n, 1, 24}, rng), k = normal({t, c, 12}, rng),
               v = normal({t, c, 14}, rng);
    ir::Tensor rows = row_table(n, p, c, rng, /*skip=*/true);
    const ir::Tensor got = ir::interpret(m, function_of(m, "gqa"), {}, {q, k, v, rows})[0];
    const ir::Tensor kr = repeat_heads(k, 2, 2), vr = repeat_heads(v, 2, 2);
    for (int64_t i = 0; i < n; ++i) {
      // Row i alone, over its keys that are not skipped.
      std::vector<int64_t> kept;
      for (int64_t j = 0; j < p; ++j)
        if (rows.ints[i * p + j] != -1) kept.push_back(j);
      // The plain op reads key j at cache position j: move the kept keys to positions 0..
      std::vector<float> kf, vf;
      std::vector<int64_t> slots;
      for (size_t r = 0; r < kept.size(); ++r) {
        const int64_t src = kept[r] * c + rows.ints[i * p + kept[r]];
        kf.insert(kf.end(), kr.f.begin() + src * 24, kr.f.begin() + (src + 1) * 24);
        vf.insert(vf.end(), vr.f.begin() + src * 28, vr.f.begin() + (src + 1) * 28);
        slots.push_back(0);
      }
      const int64_t kn = static_cast<int64_t>(kept.size());
      ir::Tensor qi = ir::Tensor::from_f32(
          {1, 1, 24}, std::vector<float>(q.f.begin() + i * 24, q.f.begin() + (i + 1) * 24));
      const ir::Tensor want = ir::interpret(
          m, function_of(m, "plain"), {},
          {qi, ir::Tensor::from_f32({kn, 1, 24}, kf), ir::Tensor::from_f32({kn, 1, 28}, vf),
           ir::Tensor::from_ints(ir::DType::i64, {1, kn}, slots)})[0];
      const ir::Tensor got_i = ir::Tensor::from_f32(
          {1, 1, 28}, std::vector<float>(got.f.begin() + i * 28, got.f.begin() + (i + 1) * 28));
      EXPECT_LE(max_diff(got_i, want), 1e-6) << "P=" << p << " row " << i;
    }
  }
}

// A window of W keys is the same op with the keys before P - W skipped (-1).
TEST(CacheOps, InterpreterWindowSkipsTheOlderKeys) {
  const ir::Module m = ir::parse_module(kModule);
  ir::Module unwindowed = m;
  for (ir::Function& f : unwindowed.functions)
    for (ir::Op& op : f.ops) op.attrs.erase("window");
  std::mt19937 rng(8);
  for (int64_t p : {1, 5, 6, 17}) {
    const int64_t n = 3, t = p, c = 4;
    ir::Tensor q = normal({n, 1, 15}, rng), k = normal({t, c, 5}, rng), v = normal({t, c, 5}, rng);
    ir::Tensor rows = row_table(n, p, c, rng, /*skip=*/false);
    ir::Tensor cut = rows;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < p - 5; ++j) cut.ints[i * p + j] = -1;
    const ir::Tensor got = ir::interpret(m, function_of(m, "mqa_window"), {}, {q, k, v, rows})[0];
    const ir::Tensor want =
        ir::interpret(unwindowed, function_of(unwindowed, "mqa_window"), {}, {q, k, v, cut})[0];
    EXPECT_LE(max_diff(got, want), 0.0) << "P=" << p;
  }
}

// The prompt's rows land at [l, n] and the rest of the cache keeps its values.
TEST(CacheOps, InterpreterPromptWriteFillsTheFirstRowsOfEachSlot) {
  const ir::Module m = ir::parse_module(kModule);
  std::mt19937 rng(9);
  const int64_t n = 2, l = 3, t = 5, c = 4;
  ir::Tensor x = normal({n, l, 7}, rng), cache = normal({t, c, 7}, rng);
  const ir::Tensor got = ir::interpret(m, function_of(m, "prompt"), {}, {x, cache})[0];
  for (int64_t p = 0; p < t; ++p)
    for (int64_t s = 0; s < c; ++s)
      for (int64_t e = 0; e < 7; ++e) {
        const float want =
            p < l && s < n ? -x.f[(s * l + p) * 7 + e] : cache.f[(p * c + s) * 7 + e];
        ASSERT_EQ(got.f[(p * c + s) * 7 + e], want) << p << "," << s << "," << e;
      }
}

TEST(CacheOps, TypeRulesNameTheMismatch) {
  const std::string bad_groups = R"(
module @m {
  symbol N max 2
  symbol P max 4
  symbol T max 4
  symbol C max 2
  func @f(%q: f32[N,1,12], %k: f32[T,C,6], %v: f32[T,C,6], %rows: i64[N,P]) -> (f32[N,1,12]) {
    %out = cache_attention(%q, %k, %v, %rows) {heads = 4, kv_heads = 3, scale = 1.0} : f32[N,1,12]
    return %out
  }
})";
  EXPECT_THAT(testing::error_of([&] { ir::parse_and_verify(bad_groups); }),
              ::testing::HasSubstr("kv_heads = 3 does not divide heads = 4"));
  const std::string long_prompt = R"(
module @m {
  symbol N max 2
  symbol L max 9
  symbol T max 4
  symbol C max 2
  func @f(%x: f32[N,L,3], %cache: f32[T,C,3]) -> (f32[T,C,3]) {
    %c = cache_write(%cache, %x) : f32[T,C,3]
    return %c
  }
})";
  EXPECT_THAT(testing::error_of([&] { ir::parse_and_verify(long_prompt); }),
              ::testing::HasSubstr("has up to 9 positions, more than the cache f32[T,C,3] holds"));
  const std::string bad_bias = R"(
module @m {
  symbol N max 2
  symbol P max 4
  symbol T max 4
  symbol C max 2
  func @f(%q: f32[N,1,12], %k: f32[T,C,12], %v: f32[T,C,12], %rows: i64[N,P], %b: f32[1,4,1,4]) -> (f32[N,1,12]) {
    %out = cache_attention(%q, %k, %v, %rows, %b) {heads = 4, scale = 1.0} : f32[N,1,12]
    return %out
  }
})";
  EXPECT_THAT(testing::error_of([&] { ir::parse_and_verify(bad_bias); }),
              ::testing::HasSubstr("score bias f32[1,4,1,4] must be f32[1 or N, 1 or 4, 1, P]"));
}

// A score bias: -1e9 on a key is that key skipped (its row -1), and a bias equal across the keys
// of a row changes nothing (the softmax is shift-invariant), while a bias on one key does.
TEST(CacheOps, InterpreterBiasIsAddedToTheScores) {
  const ir::Module m = ir::parse_module(kModule);
  std::mt19937 rng(12);
  const int64_t n = 3, p = 7, t = 8, c = 4;
  const ir::Tensor q = normal({n, 1, 24}, rng), k = normal({t, c, 12}, rng),
                   v = normal({t, c, 14}, rng), rows = row_table(n, p, c, rng, false);
  auto run = [&](const ir::Tensor& r, const ir::Tensor& b) {
    return ir::interpret(m, function_of(m, "biased"), {}, {q, k, v, r, b})[0];
  };
  auto bias = [&](auto value) {
    std::vector<float> b(static_cast<size_t>(n * 4 * p));
    for (int64_t i = 0; i < n * 4 * p; ++i) b[i] = value(i / (4 * p), (i / p) % 4, i % p);
    return ir::Tensor::from_f32({n, 4, 1, p}, std::move(b));
  };
  const ir::Tensor zero = bias([](int64_t, int64_t, int64_t) { return 0.0f; });
  const ir::Tensor plain = run(rows, zero);
  // Constant per (row, head): the same output.
  EXPECT_LE(
      max_diff(run(rows, bias([](int64_t i, int64_t h, int64_t) { return 3.0f * i - h; })), plain),
      1e-5);
  // -1e9 on key 2 of every row and head: key 2 skipped.
  ir::Tensor cut = rows;
  for (int64_t i = 0; i < n; ++i) cut.ints[i * p + 2] = -1;
  const ir::Tensor dropped =
      run(rows, bias([](int64_t, int64_t, int64_t j) { return j == 2 ? -1e9f : 0.0f; }));
  EXPECT_LE(max_diff(dropped, run(cut, zero)), 1e-5);
  EXPECT_GT(max_diff(dropped, plain), 1e-3);
}

// Compiled (host CPU) against the interpreter: 1, 7 and 33 keys, 1, 4 and 9 hypotheses, with
// skipped keys. (The prompt write, which updates its cache in place, runs compiled in
// causal_lm_tests: every prefill there is checked against forward.)
TEST(CacheOps, CompiledMatchesTheInterpreter) {
  const ir::Module m = ir::parse_module(kModule);
  jit::JitModel model(m, {}, ::testing::TempDir() + "kiln_cache_ops.safetensors");
  std::mt19937 rng(10);
  for (int64_t p : {1, 7, 33})
    for (int64_t n : {1, 4, 9}) {
      const int64_t t = p + 1, c = 9;
      for (const char* f : {"gqa", "mqa_window"}) {
        const int64_t qd = f[0] == 'g' ? 24 : 15, kd = f[0] == 'g' ? 12 : 5,
                      vd = f[0] == 'g' ? 14 : 5;
        std::vector<ir::Tensor> in = {normal({n, 1, qd}, rng), normal({t, c, kd}, rng),
                                      normal({t, c, vd}, rng), row_table(n, p, c, rng, true)};
        const ir::Tensor want = ir::interpret(m, function_of(m, f), {}, in)[0];
        const ir::Tensor got = model.run(f, in)[0];
        EXPECT_LE(max_diff(got, want), 2e-5) << f << " P=" << p << " N=" << n;
        // The same with a score bias: per hypothesis and head, or one for all (broadcast).
        const std::string biased = f[0] == 'g' ? "biased" : "biased_shared";
        in.push_back(f[0] == 'g' ? normal({n, 4, 1, p}, rng) : normal({1, 1, 1, p}, rng));
        const ir::Tensor want_b = ir::interpret(m, function_of(m, biased), {}, in)[0];
        if (p > 1)  // over one key the softmax is 1 whatever the bias
          EXPECT_GT(max_diff(want_b, want), 1e-4) << biased << ": the bias changes nothing";
        EXPECT_LE(max_diff(model.run(biased, in)[0], want_b), 2e-5)
            << biased << " P=" << p << " N=" << n;
      }
    }
}

// Every layer's cache_attention reads the one row table: its id limit is recorded once, not
// once per layer (a 24-layer decoder's plan would otherwise exceed the format's 16 limits per
// tensor and fail to load: "compiled plan has a bad count 24").
TEST(CacheOps, ManyLayersShareOneRowLimit) {
  std::string text = R"(
module @deep {
  symbol N max 4
  symbol P max 8
  symbol T max 8
  symbol C max 4
  func @step(%q: f32[N,1,8], %k: f32[T,C,4], %v: f32[T,C,4], %rows: i64[N,P]) -> (f32[N,1,8]) {
    %x0 = neg(%q) : f32[N,1,8]
)";
  for (int l = 0; l < 24; ++l)
    text += fmt::format(
        "    %x{} = cache_attention(%x{}, %k, %v, %rows) {{heads = 2, kv_heads = 1, scale = 0.5}} "
        ": f32[N,1,8]\n",
        l + 1, l);
  text += "    return %x24\n  }\n}\n";
  ir::Module m = ir::parse_and_verify(text);
  passes::run_passes(m, passes::default_pipeline());
  const codegen::LoweredModel lowered = codegen::lower_module(m);
  ASSERT_EQ(lowered.plan.functions.size(), 1u);
  EXPECT_EQ(lowered.plan.functions[0].params.at(3).id_limits.size(), 1u);
  // And the plan loads: compiled, the 24 layers match the interpreter.
  jit::JitModel model(m, {}, ::testing::TempDir() + "kiln_cache_ops_deep.safetensors");
  std::mt19937 rng(12);
  std::vector<ir::Tensor> in = {normal({3, 1, 8}, rng), normal({5, 4, 4}, rng),
                                normal({5, 4, 4}, rng), row_table(3, 5, 4, rng, true)};
  EXPECT_LE(max_diff(model.run("step", in)[0], ir::interpret(m, m.functions[0], {}, in)[0]), 1e-5);
}

// A row table entry below -1 is refused before any kernel runs, naming the input.
TEST(CacheOps, RowsBelowMinusOneAreRefused) {
  const ir::Module m = ir::parse_module(kModule);
  jit::JitModel model(m, {}, ::testing::TempDir() + "kiln_cache_ops_bad.safetensors");
  std::mt19937 rng(11);
  std::vector<ir::Tensor> in = {normal({2, 1, 24}, rng), normal({4, 3, 12}, rng),
                                normal({4, 3, 14}, rng), row_table(2, 3, 3, rng, false)};
  in[3].ints[4] = -2;
  EXPECT_THAT(testing::error_of([&] { model.run("gqa", in); }),
              ::testing::HasSubstr("cache slot -2 at 'rows'[1,1] is out of range [-1, 3)"));
}

}  // namespace
}  // namespace kiln
