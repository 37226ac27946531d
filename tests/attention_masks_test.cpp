// Attention with the masks and fill values of the seed models, written in the DSL the way
// their users write PyTorch's `scores.masked_fill(mask == 0, fill)` (fill -1e9 or -inf):
//   src      (src != pad)[:, None, None, :]                             key padding
//   tgt      (tgt != pad)[:, None, None, :] & tril(ones(T, T)).bool()   key padding, causal
//   tgt_q    (tgt != pad)[:, None, :, None] & tril(ones(T, T)).bool()   query padding, causal
//   tgt_sub  (tgt != pad)[:, None, None, :] & tril(ones(T, T), uint8)[None]
//            (the uint8 mask as a cast of a bool, [1,T,T])              key padding, causal
//   sub      tril(ones(T, T), uint8)[None] alone, as select(tril, 1, 0) causal
//            (== 0 reshaped to [1,1,T,T], the rank nn::MultiHeadAttention takes)
//   cross    (src != pad)[:, None, None, :] on cross-attention          key padding
//   cross_nomask  cross-attention without a mask                        none
// through nn::MultiHeadAttention (its `fill`). Each function must fuse into one attention op
// with no softmax left, and the module compiled in process (tests/jit_model.h: the default
// pipeline, lowering, the Halide kernels, the runtime) must match the unfused module in the
// interpreter on a batch with an unpadded row, a row padded at the end, a row of padding
// only and a row padded at its first position: where every key of a row is masked (a row of
// padding; a padded query; with causal, a query before any unpadded key), -1e9 gives the
// mean of v over all keys and -inf gives NaN, in both.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "frontend/dsl.h"
#include "frontend/nn.h"
#include "ir/interpreter.h"
#include "ir/ir.h"
#include "jit_model.h"
#include "pass_harness.h"

namespace kiln {
namespace {

using dsl::Dim;
using dsl::DType;
using dsl::Tensor;

constexpr int64_t kDModel = 16, kHeads = 2, kPadId = 0;

// Tolerance of compiled outputs against the unfused interpreter, relative to the output's
// scale (max(1, max |want|)): the projections and the attention kernel accumulate in f32
// over at most a few dozen terms (about 1e-6 of the scale each, see
// attention_kernel_test.cpp and linear_kernel_test.cpp), while a wrong mask or a wrong fully
// masked row moves outputs by ~1e-1. NaN must be NaN in both, exactly where.
constexpr double kTolerance = 1e-4;

// What fuse-attention must make of a function: one attention op with these attributes and
// operands (q, k, v [, key_pad] [, query_pad]).
struct Expected {
  std::string function;
  bool causal = false, key_pad = false, query_pad = false;
};

const std::vector<Expected> kExpected = {
    {"src", false, true, false},           {"tgt", true, true, false},
    {"tgt_q", true, false, true},          {"tgt_sub", true, true, false},
    {"sub", true, false, false},           {"cross", false, true, false},
    {"cross_nomask", false, false, false},
};

// The keep masks of the seeds, built from ids [B,L] with pad_id.
Tensor keep(Tensor ids) { return dsl::ne(ids, dsl::scalar(ids, kPadId)); }
// tril(ones(L, L)).bool(): key j <= query i.
Tensor tril(dsl::FunctionBuilder& f, const Dim& L) {
  return dsl::le(dsl::iota(f, DType::i64, {L, L}, 1), dsl::iota(f, DType::i64, {L, L}, 0));
}

// One module per fill: every layout above as a function of ids src [B,S], tgt [B,T] and
// inputs xs [B,S,d], xt [B,T,d]; each returns attention(xt or xs, ...) with its own weights.
ir::Module build(double fill) {
  dsl::ModelBuilder mb(std::isinf(fill) ? "masks_inf" : "masks_1e9");
  mb.set_config("pad_id", std::to_string(kPadId));
  const Dim B = mb.symbol("B", 4), S = mb.symbol("S", 40), T = mb.symbol("T", 40);
  const Dim one = Dim::constant(1);
  for (const Expected& e : kExpected) {
    dsl::FunctionBuilder& f = mb.function(e.function);
    Tensor src = f.input("src", DType::i64, {B, S});
    Tensor tgt = f.input("tgt", DType::i64, {B, T});
    Tensor xs = f.input("xs", DType::f32, {B, S, Dim::constant(kDModel)});
    Tensor xt = f.input("xt", DType::f32, {B, T, Dim::constant(kDModel)});
    const nn::MultiHeadAttention attn{
        .prefix = e.function + ".attn", .d_model = kDModel, .heads = kHeads, .fill = fill};
    auto masked = [](Tensor keep_mask) {  // mask == 0
      return dsl::eq(keep_mask, dsl::scalar(keep_mask, 0));
    };
    Tensor src_mask = dsl::reshape(keep(src), {B, one, one, S});
    Tensor y;
    if (e.function == "src") {
      y = attn(xs, xs, masked(src_mask));
    } else if (e.function == "tgt") {
      Tensor tgt_mask = dsl::logical_and(dsl::reshape(keep(tgt), {B, one, one, T}),
                                         dsl::reshape(tril(f, T), {one, one, T, T}));
      y = attn(xt, xt, masked(tgt_mask));
    } else if (e.function == "tgt_q") {
      Tensor tgt_mask = dsl::logical_and(dsl::reshape(keep(tgt), {B, one, T, one}),
                                         dsl::reshape(tril(f, T), {one, one, T, T}));
      y = attn(xt, xt, masked(tgt_mask));
    } else if (e.function == "tgt_sub") {
      Tensor sub = dsl::reshape(dsl::cast(tril(f, T), DType::i32), {one, T, T});
      Tensor tgt_mask = dsl::logical_and(dsl::reshape(keep(tgt), {B, one, one, T}),
                                         dsl::ne(sub, dsl::scalar(sub, 0)));
      y = attn(xt, xt, masked(tgt_mask));
    } else if (e.function == "sub") {
      Tensor tri = tril(f, T);
      Tensor sub = dsl::reshape(
          dsl::select(tri, dsl::scalar(tri, 1, DType::i32), dsl::scalar(tri, 0, DType::i32)),
          {one, T, T});
      // nn::MultiHeadAttention takes rank-4 masks: [1,T,T] == 0 reshaped to [1,1,T,T].
      y = attn(xt, xt, dsl::reshape(masked(sub), {one, one, T, T}));
    } else if (e.function == "cross") {
      y = attn(xt, xs, masked(src_mask));
    } else {
      y = attn(xt, xs, Tensor());
    }
    f.output(y, "y");
  }
  return mb.finish();
}

// Ids [B,L] for B = 4: row 0 unpadded, row 1 padded after 3 tokens, row 2 all padding, row
// 3 padded at position 0 and at odd positions (a causal row 0 then has no key).
ir::Tensor ids(int64_t length) {
  std::vector<int64_t> data;
  for (int64_t b = 0; b < 4; ++b)
    for (int64_t j = 0; j < length; ++j) {
      const bool pad = (b == 1 && j >= 3) || b == 2 || (b == 3 && (j == 0 || j % 2 == 1));
      data.push_back(pad ? kPadId : 1 + (b * 7 + j * 3) % 9);
    }
  return ir::Tensor::from_ints(ir::DType::i64, {4, length}, std::move(data));
}

// Whether function `e` of `fused` (after fuse-attention) has one attention op as expected
// and no softmax.
void expect_fused(const ir::Module& fused, const Expected& e, bool fill_inf) {
  SCOPED_TRACE(e.function);
  const ir::Function& f = testing::function(fused, e.function);
  EXPECT_EQ(testing::count_ops(f, ir::OpKind::softmax), 0);
  ASSERT_EQ(testing::count_ops(f, ir::OpKind::attention), 1);
  for (const ir::Op& op : f.ops) {
    if (op.kind != ir::OpKind::attention) continue;
    auto flag = [&](const char* name) { return op.has_attr(name) && op.int_attr(name) == 1; };
    EXPECT_EQ(flag("causal"), e.causal);
    EXPECT_EQ(flag("query_pad"), e.query_pad);
    // -inf needs fill_inf where padding may mask a whole row; causal alone keeps the diagonal.
    EXPECT_EQ(flag("fill_inf"), fill_inf && (e.key_pad || e.query_pad));
    EXPECT_EQ(op.operands.size(), 3u + e.key_pad + e.query_pad);
  }
}

// The worst error of `got` against `want` relative to want's scale; +inf when NaN is not NaN
// in both or the shapes differ. Counts want's NaN values in *nans.
double relative_error(const ir::Tensor& got, const ir::Tensor& want, int64_t* nans) {
  if (got.shape != want.shape || got.dtype != want.dtype) return INFINITY;
  double scale = 1.0, err = 0.0;
  for (float w : want.f) {
    if (std::isnan(w))
      ++*nans;
    else
      scale = std::max(scale, std::abs(static_cast<double>(w)));
  }
  for (size_t i = 0; i < want.f.size(); ++i) {
    const double g = got.f[i], w = want.f[i];
    if (std::isnan(g) != std::isnan(w)) return INFINITY;
    if (!std::isnan(w)) err = std::max(err, std::abs(g - w));
  }
  return err / scale;
}

class AttentionMasks : public ::testing::TestWithParam<bool> {};  // param: fill is -inf

TEST_P(AttentionMasks, FuseCompileAndMatchUnfused) {
  const bool fill_inf = GetParam();
  const double fill = fill_inf ? -std::numeric_limits<double>::infinity() : -1e9;
  const ir::Module m = build(fill);
  const ir::Module fused = testing::after_passes(m, {"fuse-attention"});
  for (const Expected& e : kExpected) expect_fused(fused, e, fill_inf);

  const ir::WeightMap weights = testing::random_weights(m, 3);
  jit::JitModel model(m, weights,
                      ::testing::TempDir() + "kiln_attention_masks_" + m.name + ".safetensors");
  for (const Expected& e : kExpected) expect_fused(model.module(), e, fill_inf);

  // Lengths (S, T): one row block and key block; several row and key blocks (rows in blocks
  // of 12, keys in blocks of 16 or 32); and Lq != Lk for cross-attention.
  const std::vector<std::pair<int64_t, int64_t>> lengths = {{5, 5}, {7, 9}, {35, 33}};
  double worst = 0;
  uint32_t seed = 1;
  for (const Expected& e : kExpected) {
    const ir::Function& f = testing::function(m, e.function);
    const ir::Function& ff = testing::function(fused, e.function);
    int64_t nans = 0;
    for (const auto& [s, t] : lengths) {
      SCOPED_TRACE(e.function + " S=" + std::to_string(s) + " T=" + std::to_string(t));
      std::vector<ir::Tensor> inputs = {ids(s), ids(t)};
      for (int64_t len : {s, t}) {
        std::vector<float> x(static_cast<size_t>(4 * len * kDModel));
        std::mt19937 rng(seed++);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        for (float& v : x) v = normal(rng);
        inputs.push_back(ir::Tensor::from_f32({4, len, kDModel}, std::move(x)));
      }
      const std::vector<ir::Tensor> want = ir::interpret(m, f, weights, inputs);
      const std::vector<ir::Tensor> fused_got = ir::interpret(fused, ff, weights, inputs);
      const std::vector<ir::Tensor> got = model.run(e.function, inputs);
      ASSERT_EQ(want.size(), 1u);
      ASSERT_EQ(fused_got.size(), 1u);
      ASSERT_EQ(got.size(), 1u);
      int64_t fused_nans = 0;
      const double fused_err = relative_error(fused_got[0], want[0], &fused_nans);
      EXPECT_LE(fused_err, 1e-5) << "fused op in the interpreter";
      const double err = relative_error(got[0], want[0], &nans);
      EXPECT_LE(err, kTolerance) << "compiled";
      worst = std::max({worst, err, fused_err});
    }
    // Which layouts have rows with every key masked: padding rows (rows 2; row 3's first
    // query with causal), padded queries. They are NaN exactly with -inf.
    const bool whole_rows_masked = e.key_pad || e.query_pad;
    EXPECT_EQ(nans > 0, fill_inf && whole_rows_masked) << e.function << ": " << nans << " NaN";
  }
  std::printf("[ masks ] fill %g: max relative error %.3g\n", fill, worst);
}

INSTANTIATE_TEST_SUITE_P(Fills, AttentionMasks, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "inf" : "minus_1e9");
                         });

}  // namespace
}  // namespace kiln
