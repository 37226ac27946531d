// Every verified graph compiles: graphs that only the general path of codegen takes
// (reductions over any axes, standalone softmax and argmax, transposes, concats, slices
// and reshapes of strided views, matmuls, results that are views, parameters or weights),
// compiled in process (tests/jit_model.h: the default pipeline, lowering, Halide JIT, the
// runtime) and compared with the interpreter. The issue's failing graphs are here, a
// property test over random verified graphs, and the layernorm variants end to end.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "frontend/dsl.h"
#include "frontend/nn.h"
#include "ir/interpreter.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "jit_kernel.h"
#include "jit_model.h"
#include "pass_harness.h"
#include "passes/pipeline.h"
#include "passes/plan_memory.h"
#include "random_graph.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

// Tolerance of compiled f32 outputs against the interpreter, relative to the output's
// scale: |got - want| <= kTolerance * max(1, max |want|) per output. The general kernels
// compute as the interpreter does (reductions and softmax in double, rounded once); the
// fast kernels (linear, layernorm) and the general matmul accumulate in f32 over at most
// a few dozen terms, a relative error of ~1e-6 of the output's scale, which the graphs'
// few further ops amplify at most ~10x. 1e-4 keeps a wide margin; integer and bool outputs
// must match exactly.
constexpr double kTolerance = 1e-4;

// The worst error of `got` against `want`, relative to the scale above; +inf on a shape,
// dtype or integer mismatch.
double relative_error(const ir::Tensor& got, const ir::Tensor& want) {
  if (got.dtype != want.dtype || got.shape != want.shape) return INFINITY;
  if (want.dtype != ir::DType::f32) return got.ints == want.ints ? 0.0 : INFINITY;
  double scale = 1.0, err = 0.0;
  for (float w : want.f) scale = std::max(scale, std::abs(static_cast<double>(w)));
  for (size_t i = 0; i < got.f.size(); ++i) {
    const double g = got.f[i], w = want.f[i];
    if (std::isnan(g) != std::isnan(w)) return INFINITY;
    if (!std::isnan(w)) err = std::max(err, std::abs(g - w));
  }
  return err / scale;
}

std::string weights_file(const std::string& name) {
  return ::testing::TempDir() + "kiln_general_" + name + ".safetensors";
}

// Compiles `text` and runs each entry point on random inputs (with padding for ids) at
// every given size, comparing every output with the interpreter; returns the worst error.
double compile_and_compare(const std::string& text,
                           const std::vector<std::map<std::string, int64_t>>& sizes) {
  ir::Module m = ir::parse_module(text);
  ir::WeightMap weights = testing::random_weights(m, 3);
  jit::JitModel model(m, weights, weights_file(m.name));
  double worst = 0;
  uint32_t seed = 1;
  for (const ir::Function& f : m.functions)
    for (const auto& s : sizes)
      for (bool padding : {false, true}) {
        std::vector<ir::Tensor> inputs = testing::random_inputs(m, f, s, seed++, padding);
        std::vector<ir::Tensor> want = ir::interpret(m, f, weights, inputs);
        std::vector<ir::Tensor> got = model.run(f.name, inputs);
        EXPECT_EQ(got.size(), want.size());
        for (size_t r = 0; r < std::min(got.size(), want.size()); ++r) {
          const double e = relative_error(got[r], want[r]);
          EXPECT_LE(e, kTolerance)
              << "function " << f.name << " result " << r << " (" << want[r].type_string() << ")";
          worst = std::max(worst, e);
        }
      }
  return worst;
}

const std::vector<std::map<std::string, int64_t>> kSizes = {
    {{"B", 1}, {"S", 1}}, {{"B", 3}, {"S", 7}}, {{"B", 2}, {"S", 9}}};

// Mean pooling as a classifier writes it: the masked sum over the sequence divided by the
// count of real tokens (reduce_sum over axis 1, keepdims on the count), and reduce_mean.
// Was: "op reduce_sum (%sum) has no kernel in compiled code".
TEST(GeneralPath, MeanPooling) {
  const double e = compile_and_compare(R"(
module @mean_pool {
  symbol B max 3
  symbol S max 9
  weight @emb : f32[11,8]
  weight @cls.weight : f32[3,8]
  weight @cls.bias : f32[3]
  func @forward(%ids: i64[B,S]) -> (f32[B,3], f32[B,8], f32[1,S,1]) {
    %e = weight() {name = "emb"} : f32[11,8]
    %h = gather(%e, %ids) : f32[B,S,8]
    %zero = constant() {value = 0} : i64[]
    %keep = ne(%ids, %zero) : bool[B,S]
    %kf = cast(%keep) : f32[B,S]
    %k3 = reshape(%kf) : f32[B,S,1]
    %hm = mul(%h, %k3) : f32[B,S,8]
    %sum = reduce_sum(%hm) {axes = [1]} : f32[B,8]
    %cnt = reduce_sum(%kf) {axes = [1], keepdims = 1} : f32[B,1]
    %mean = div(%sum, %cnt) : f32[B,8]
    %w = weight() {name = "cls.weight"} : f32[3,8]
    %b = weight() {name = "cls.bias"} : f32[3]
    %logits = linear(%mean, %w, %b) {act = "none"} : f32[B,3]
    %plain = reduce_mean(%h) {axes = [1]} : f32[B,8]
    %mx = reduce_max(%h) {axes = [0, 2], keepdims = 1} : f32[1,S,1]
    return %logits, %plain, %mx
  }
}
)",
                                       kSizes);
  std::printf("[ general ] mean pooling: max relative error %.3g\n", e);
}

// First-token pooling: a slice of the sequence axis (a strided view), reshaped and fed to
// a linear, and the linear applied to the slice directly; the slice and its reshape are
// results too. Was: "reshape of a strided view is not supported", "linear: input
// operand's leading dims cannot be collapsed", "result %92 is not computed by a kernel".
TEST(GeneralPath, FirstTokenPooling) {
  const double e = compile_and_compare(R"(
module @first_token {
  symbol B max 3
  symbol S max 9
  weight @pool.weight : f32[4,8]
  weight @pool.bias : f32[4]
  func @forward(%x: f32[B,S,8]) -> (f32[B,4], f32[B,1,4], f32[B,1,8], f32[B,8], f32[B,4]) {
    %first = slice(%x) {axis = 1, start = 0} : f32[B,1,8]
    %flat = reshape(%first) : f32[B,8]
    %w = weight() {name = "pool.weight"} : f32[4,8]
    %b = weight() {name = "pool.bias"} : f32[4]
    %y = linear(%flat, %w, %b) {act = "relu"} : f32[B,4]
    %y3 = linear(%first, %w, %b) {act = "none"} : f32[B,1,4]
    %half = slice(%x) {axis = 2, start = 4} : f32[B,S,4]
    %hfirst = slice(%half) {axis = 1, start = 0} : f32[B,1,4]
    %hflat = reshape(%hfirst) : f32[B,4]
    return %y, %y3, %first, %flat, %hflat
  }
}
)",
                                       kSizes);
  std::printf("[ general ] first-token pooling: max relative error %.3g\n", e);
}

// Softmax and argmax as outputs, over the last axis and over the sequence axis.
// Was: "op softmax (...) has no kernel", "op argmax (...) has no kernel".
TEST(GeneralPath, StandaloneSoftmaxAndArgmax) {
  const double e = compile_and_compare(R"(
module @classify {
  symbol B max 3
  symbol S max 9
  weight @head.weight : f32[5,8]
  weight @head.bias : f32[5]
  func @forward(%x: f32[B,S,8]) -> (f32[B,S,5], i64[B,S], f32[B,S,8], i64[B,8], i64[S,8]) {
    %w = weight() {name = "head.weight"} : f32[5,8]
    %b = weight() {name = "head.bias"} : f32[5]
    %logits = linear(%x, %w, %b) {act = "none"} : f32[B,S,5]
    %p = softmax(%logits) {axis = -1} : f32[B,S,5]
    %a = argmax(%logits) {axis = -1} : i64[B,S]
    %q = softmax(%x) {axis = 1} : f32[B,S,8]
    %a1 = argmax(%x) {axis = 1} : i64[B,8]
    %a0 = argmax(%x) {axis = 0} : i64[S,8]
    return %p, %a, %q, %a1, %a0
  }
}
)",
                                       kSizes);
  std::printf("[ general ] softmax and argmax: max relative error %.3g\n", e);
}

// Attention left unfused (a causal mask of shape [1,1,T,T] sliced out of a larger
// table, so its reshape is of a strided view): batched matmuls, the head transposes as
// copy kernels, a masked select broadcasting the mask, softmax over the keys.
// Was: "reshape of a strided view is not supported" naming no op.
TEST(GeneralPath, UnfusedAttentionWithStridedMask) {
  const double e = compile_and_compare(R"(
module @causal {
  symbol B max 2
  symbol S max 9
  func @forward(%x: f32[B,S,8]) -> (f32[B,S,8]) {
    %i = iota() {axis = 0} : i64[12,12]
    %j = iota() {axis = 1} : i64[12,12]
    %tri = le(%j, %i) : bool[12,12]
    %rows = slice(%tri) {axis = 0, start = 0} : bool[S,12]
    %sq = slice(%rows) {axis = 1, start = 0} : bool[S,S]
    %mask = reshape(%sq) : bool[1,1,S,S]
    %h = reshape(%x) : f32[B,S,2,4]
    %q = transpose(%h) {perm = [0, 2, 1, 3]} : f32[B,2,S,4]
    %kt = transpose(%h) {perm = [0, 2, 3, 1]} : f32[B,2,4,S]
    %s = matmul(%q, %kt) : f32[B,2,S,S]
    %scale = constant() {value = 0.5} : f32[]
    %ss = mul(%s, %scale) : f32[B,2,S,S]
    %neg = constant() {value = -1e9} : f32[]
    %m = select(%mask, %ss, %neg) : f32[B,2,S,S]
    %p = softmax(%m) {axis = -1} : f32[B,2,S,S]
    %o = matmul(%p, %q) : f32[B,2,S,4]
    %ot = transpose(%o) {perm = [0, 2, 1, 3]} : f32[B,S,2,4]
    %y = reshape(%ot) : f32[B,S,8]
    return %y
  }
}
)",
                                       {{{"B", 1}, {"S", 1}}, {{"B", 2}, {"S", 9}}});
  std::printf("[ general ] unfused attention: max relative error %.3g\n", e);
}

// Views that no strides express (a reshape merging a sliced dim with its neighbours, a
// slice at a symbolic offset after another), concat, a matmul by a weight that is not
// transposed, a linear whose weight is computed, a rank-1 linear input, and results that
// are a parameter, a weight and one value twice.
TEST(GeneralPath, CopiesConcatMatmulAndResults) {
  const double e = compile_and_compare(R"(
module @copies {
  symbol B max 3
  symbol S max 9
  weight @w : f32[8,6]
  weight @v : f32[6]
  func @forward(%x: f32[B,6,4], %y: f32[B,S,8]) -> (f32[B,12], f32[B,S,6], f32[B,9,4], f32[B,3], f32[B,6,4], f32[8,6], f32[6], f32[B,S,6], f32[1,2,8], f32[B,12]) {
    %part = slice(%x) {axis = 1, start = 2} : f32[B,3,4]
    %cols = slice(%x) {axis = 2, start = 1} : f32[B,6,2]
    %merged = reshape(%cols) : f32[B,12]
    %flat = reshape(%part) : f32[B,12]
    %w = weight() {name = "w"} : f32[8,6]
    %p = matmul(%y, %w) : f32[B,S,6]
    %cat = concat(%x, %part) {axis = 1} : f32[B,9,4]
    %wt = transpose(%w) {perm = [1, 0]} : f32[6,8]
    %sel = slice(%wt) {axis = 0, start = 3} : f32[3,8]
    %first = slice(%y) {axis = 1, start = 0} : f32[B,1,8]
    %row = reshape(%first) : f32[B,8]
    %lin = linear(%row, %sel) {act = "relu"} : f32[B,3]
    %v = weight() {name = "v"} : f32[6]
    %b1 = slice(%y) {axis = 0, start = 1} : f32[1,S,8]
    %b1s = slice(%b1) {axis = 1, start = 1} : f32[1,2,8]
    return %flat, %p, %cat, %lin, %x, %w, %v, %p, %b1s, %merged
  }
}
)",
                                       {{{"B", 2}, {"S", 3}}, {{"B", 3}, {"S", 9}}});
  std::printf("[ general ] copies, concat, matmul, results: max relative error %.3g\n", e);
}

// Models written with the DSL's nn blocks the way a user writes them (the issue's
// examples): a pre-norm classifier with learned positions, a padding mask, mean pooling
// and a softmax over the classes, and a causal model (mask [1,1,L,L]) with a tied output
// projection, first-token pooling and argmax outputs: compiled and run against the
// interpreter.
TEST(GeneralPath, ModelsWrittenWithNnBlocks) {
  using dsl::Dim;
  using dsl::DType;
  dsl::ModelBuilder mb("users");
  const Dim B = mb.symbol("B", 3), S = mb.symbol("S", 9);
  const int64_t d = 16, vocab = 13;
  {
    dsl::FunctionBuilder& f = mb.function("classify");
    dsl::Tensor ids = f.input("ids", DType::i64, {B, S});
    dsl::Tensor pad = nn::padding_mask(ids, 0);
    dsl::Tensor key_pad = dsl::reshape(pad, {B, Dim::constant(1), Dim::constant(1), S});
    dsl::Tensor x = nn::Embedding{"emb", vocab, d}(ids);
    x = nn::PositionEmbedding{"pos", 9, d}(x);
    x = nn::EncoderBlock{"layers.0", d, 2, 24, /*pre_norm=*/true}(x, key_pad);
    x = nn::LayerNorm{"norm", d}(x);
    dsl::Tensor pooled = nn::mean_pool(x, pad);
    dsl::Tensor logits = nn::Linear{"head", d, 3}(pooled);
    f.output(dsl::softmax(logits, -1), "probs");
    f.output(dsl::argmax(logits, -1), "label");
    f.output(nn::Linear{"cls", d, 3}(nn::first_token(x)), "cls");
  }
  {
    dsl::FunctionBuilder& f = mb.function("lm");
    dsl::Tensor ids = f.input("ids", DType::i64, {B, S});
    nn::Embedding emb{"tok", vocab, d};
    dsl::Tensor x = nn::PositionEmbedding{"wpe", 9, d}(emb(ids));
    x = nn::EncoderBlock{"h.0", d, 4, 32, /*pre_norm=*/true}(x, nn::causal_mask(ids));
    dsl::Tensor logits = emb.tied_projection(x);
    f.output(logits, "logits");
    f.output(dsl::argmax(logits, -1), "next");
  }
  ir::Module m = mb.finish();
  ir::WeightMap weights = testing::random_weights(m, 11);
  jit::JitModel model(m, weights, weights_file("users"));
  double worst = 0;
  uint32_t seed = 5;
  for (const ir::Function& f : m.functions)
    for (const auto& sizes : kSizes)
      for (bool padding : {false, true}) {
        std::vector<ir::Tensor> inputs = testing::random_inputs(m, f, sizes, seed++, padding);
        std::vector<ir::Tensor> want = ir::interpret(m, f, weights, inputs);
        std::vector<ir::Tensor> got = model.run(f.name, inputs);
        ASSERT_EQ(got.size(), want.size());
        for (size_t r = 0; r < got.size(); ++r) {
          const double e = relative_error(got[r], want[r]);
          EXPECT_LE(e, kTolerance) << f.name << " result " << r;
          worst = std::max(worst, e);
        }
      }
  std::printf("[ general ] nn-block models: max relative error %.3g\n", worst);
}

// Today's blocks as PyTorch code writes them (issue 26), compiled: a LLaMA-style pre-norm
// decoder layer (nn::RMSNorm written out, fused into add_layernorm {rms} with its sum; SwiGLU),
// Gemma's (1 + w) final norm, GPT-2's Conv1D MLP (weights [in, out] read as stored by the
// linear kernel) and ViT's positions [1, S, D] into a LayerNorm, against the interpreter.
TEST(GeneralPath, TodaysNormsAndConv1DCompiled) {
  using dsl::DType;
  const int64_t d = 16, vocab = 11;
  dsl::ModelBuilder mb("today");
  dsl::Dim B = mb.symbol("B", 3), S = mb.symbol("S", 9);
  dsl::FunctionBuilder& f = mb.function("forward");
  dsl::Tensor ids = f.input("ids", DType::i64, {B, S});
  dsl::Tensor x = nn::Embedding{"embed_tokens", vocab, d}(ids);
  dsl::Tensor pos = f.weight("position_embeddings", {1, 9, d});
  x = x + dsl::slice(pos, 1, 0, S);  // ViT-style [1, S, D] positions
  x = nn::LayerNorm{"pre", d}(x);
  nn::MultiHeadAttention attn{
      "layers.0.self_attn", d, 2, "q_proj", "k_proj", "v_proj", "o_proj", false, false};
  dsl::Tensor n = nn::RMSNorm{"layers.0.input_layernorm", d}(x);
  dsl::Tensor h = x + attn(n, n, nn::causal_mask(ids));
  x = h + nn::GatedFeedForward{"layers.0.mlp", d,
                               24}(nn::RMSNorm{"layers.0.post_attention_layernorm", d}(h));
  // GPT-2's Conv1D: x @ W[in, out] + b.
  dsl::Tensor fc =
      dsl::matmul(x, f.weight("mlp.c_fc.weight", {d, 32})) + f.weight("mlp.c_fc.bias", {32});
  x = x + dsl::matmul(dsl::gelu_tanh(fc), f.weight("mlp.c_proj.weight", {32, d}));
  x = nn::RMSNorm{"norm", d, 1e-6, /*unit_offset=*/true}(x);
  f.output(nn::Linear{"lm_head", d, vocab, false}(x), "logits");
  ir::Module m = mb.finish();
  ir::WeightMap weights = testing::random_weights(m, 13);
  jit::JitModel model(m, weights, weights_file("today"));
  // Fused as the issue wants: no norm written out, every GEMM a linear.
  const ir::Function& opt = *model.module().find_function("forward");
  std::map<std::string, int> ops;
  for (const ir::Op& op : opt.ops) ++ops[ir::op_name(op.kind)];
  EXPECT_EQ(ops["reduce_mean"], 0);
  EXPECT_EQ(ops["matmul"], 0);
  EXPECT_EQ(ops["add_layernorm"], 3);  // positions, post_attention, Gemma's final norm
  EXPECT_EQ(ops["layernorm"], 1);      // input_layernorm reads the `pre` norm
  EXPECT_EQ(ops["attention"], 1);
  double worst = 0;
  uint32_t seed = 9;
  for (const auto& sizes : kSizes) {
    std::vector<ir::Tensor> inputs =
        testing::random_inputs(m, m.functions[0], sizes, seed++, false);
    std::vector<ir::Tensor> want = ir::interpret(m, m.functions[0], weights, inputs);
    std::vector<ir::Tensor> got = model.run("forward", inputs);
    ASSERT_EQ(got.size(), want.size());
    const double e = relative_error(got[0], want[0]);
    EXPECT_LE(e, kTolerance);
    worst = std::max(worst, e);
  }
  std::printf("[ general ] today's norms and Conv1D: max relative error %.3g\n", worst);
}

// The layernorm variants (ir.h: unbiased, eps_outside) through the whole compiler: per
// variant a layernorm of the input, a post-norm residual (fused to add_layernorm) and a
// pre-norm one whose sum is read again (add_layernorm with its sum), all with one D and
// eps, so that a variant lowered as another, or sharing another's kernel by name, shows
// (eps = 0.1 makes each flag change the outputs by percents).
TEST(GeneralPath, LayerNormVariants) {
  std::string weights, body, results, types;
  for (int v = 0; v < 4; ++v) {
    std::string attrs = "eps = 0.1";
    if (v & 2) attrs += ", eps_outside = 1";
    if (v & 1) attrs += ", unbiased = 1";
    weights += fmt::format("  weight @n{0}.alpha : f32[8]\n  weight @n{0}.beta : f32[8]\n", v);
    body += fmt::format(
        "    %g{0} = weight() {{name = \"n{0}.alpha\"}} : f32[8]\n"
        "    %b{0} = weight() {{name = \"n{0}.beta\"}} : f32[8]\n"
        "    %l{0} = layernorm(%x, %g{0}, %b{0}) {{{1}}} : f32[B,S,8]\n"
        "    %h{0} = add(%x, %l{0}) : f32[B,S,8]\n"
        "    %n{0} = layernorm(%h{0}, %g{0}, %b{0}) {{{1}}} : f32[B,S,8]\n"
        "    %p{0} = add(%y, %l{0}) : f32[B,S,8]\n"
        "    %q{0} = layernorm(%p{0}, %g{0}, %b{0}) {{{1}}} : f32[B,S,8]\n"
        "    %r{0} = mul(%p{0}, %q{0}) : f32[B,S,8]\n",
        v, attrs);
    results += fmt::format("{0}%l{1}, %n{1}, %r{1}", v ? ", " : "", v);
    types += std::string(v ? ", " : "") + "f32[B,S,8], f32[B,S,8], f32[B,S,8]";
  }
  const std::string text = "module @norm_variants {\n  symbol B max 3\n  symbol S max 9\n" +
                           weights + "  func @forward(%x: f32[B,S,8], %y: f32[B,S,8]) -> (" +
                           types + ") {\n" + body + "    return " + results + "\n  }\n}\n";
  // The pipeline fuses every residual norm, each keeping its variant.
  ir::Module m = ir::parse_module(text);
  passes::run_passes(m, passes::default_pipeline(), {});
  std::map<std::string, int> kinds;
  for (const ir::Op& op : m.functions[0].ops) {
    ++kinds[ir::op_name(op.kind)];
    if (op.kind == ir::OpKind::layernorm || op.kind == ir::OpKind::add_layernorm)
      ++kinds[fmt::format("unbiased={} eps_outside={}", op.has_attr("unbiased"),
                          op.has_attr("eps_outside"))];
  }
  EXPECT_EQ(kinds["layernorm"], 4);
  EXPECT_EQ(kinds["add_layernorm"], 8);
  EXPECT_EQ(kinds["add_layernorm_sum"], 4);
  for (const char* variant : {"unbiased=false eps_outside=false", "unbiased=true eps_outside=false",
                              "unbiased=false eps_outside=true", "unbiased=true eps_outside=true"})
    EXPECT_EQ(kinds[variant], 3) << variant;
  const double e = compile_and_compare(text, kSizes);
  std::printf("[ general ] layernorm variants: max relative error %.3g\n", e);
}

// The general kernels compile ahead of time, as kiln compile builds them, for the host
// and for AVX2 (every kind, with and without a vectorized innermost dim).
TEST(GeneralPath, KernelsCompileAheadOfTime) {
  using codegen::MatmulKernel;
  using codegen::ReduceKernel;
  jit::expect_compiles_ahead_of_time(
      ReduceKernel{ReduceKernel::Op::sum, false, {false, true, false}});
  jit::expect_compiles_ahead_of_time(
      ReduceKernel{ReduceKernel::Op::mean, false, {true, false, true}});
  jit::expect_compiles_ahead_of_time(ReduceKernel{ReduceKernel::Op::max, true, {false, true}});
  jit::expect_compiles_ahead_of_time(
      ReduceKernel{ReduceKernel::Op::argmax, false, {false, false, true}});
  jit::expect_compiles_ahead_of_time(codegen::SoftmaxKernel{3, 1});
  jit::expect_compiles_ahead_of_time(codegen::SoftmaxKernel{2, 1});
  jit::expect_compiles_ahead_of_time(
      MatmulKernel{4, 2, 4, {false, true}, {}, false, false, "none"});
  jit::expect_compiles_ahead_of_time(MatmulKernel{3, 2, 3, {false}, {}, true, true, "gelu"});
}

// What compiled code still does not take is an error naming the op and its line.
TEST(GeneralPath, RemainingErrorsNameTheOpAndItsLine) {
  ir::Module m = ir::parse_module(R"(module @m {
  symbol B max 2
  func @f(%x: i64[B,4]) -> (i64[B,4]) {
    %c = cast(%x) : i32[B,4]
    %d = cast(%c) : i64[B,4]
    return %d
  }
})");
  passes::run_passes(m, passes::default_pipeline(), {});
  std::string message;
  try {
    codegen::lower_module(m);
  } catch (const std::exception& e) {
    message = e.what();
  }
  EXPECT_EQ(message,
            "line 4: function 'f': cast %c takes or makes an i32 tensor; compiled code supports "
            "f32, i64 and bool");
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// The number of random graphs the property test compiles, and the number of graphs
// compiled into one module (their functions side by side: one lowering and one model,
// kernels shared) to keep the test's time down.
constexpr uint32_t kPropertyGraphs = 240;

// Random verified graphs (tests/random_graph.h in its general mode) through the default
// pipeline and codegen, every output against the interpreter at two sizes: the maxima and
// a smaller one (each symbol from 2 up).
TEST(GeneralPath, RandomGraphsMatchTheInterpreter) {
  std::map<std::string, int> kinds;  // op kinds compiled, after the pipeline
  double worst = 0;
  int outputs = 0, kernels = 0;
  const auto start = std::chrono::steady_clock::now();
  for (uint32_t seed = 0; seed < kPropertyGraphs; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    ir::Module m = testing::random_module(seed, /*general=*/true);
    ir::WeightMap weights = testing::random_weights(m, seed);
    std::unique_ptr<jit::JitModel> model;
    try {
      model = std::make_unique<jit::JitModel>(m, weights, weights_file("random"));
    } catch (const std::exception& e) {
      ADD_FAILURE() << "does not compile: " << e.what() << "\n" << ir::print_module(m);
      continue;
    }
    kernels += model->kernels();
    // The memory plan the compiled code runs on is sound for these graphs too.
    for (const std::string& problem :
         passes::check_memory_plan(model->module(), model->module().functions[0]))
      ADD_FAILURE() << problem;
    for (const ir::Op& op : model->module().functions[0].ops) ++kinds[ir::op_name(op.kind)];
    const ir::Function& f = m.functions[0];
    std::mt19937 rng(seed);
    for (int round = 0; round < 2; ++round) {
      std::map<std::string, int64_t> sizes;
      for (const ir::Symbol& s : m.symbols)
        sizes[s.name] = round == 0 ? s.max : std::uniform_int_distribution<int64_t>(2, s.max)(rng);
      std::vector<ir::Tensor> inputs = testing::random_inputs(m, f, sizes, seed, round == 1);
      std::vector<ir::Tensor> want = ir::interpret(m, f, weights, inputs);
      std::vector<ir::Tensor> got;
      try {
        got = model->run(f.name, inputs);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "does not run: " << e.what() << "\n" << ir::print_module(m);
        break;
      }
      ASSERT_EQ(got.size(), want.size());
      for (size_t r = 0; r < got.size(); ++r) {
        const double e = relative_error(got[r], want[r]);
        ++outputs;
        worst = std::max(worst, e);
        EXPECT_LE(e, kTolerance) << "result " << r << " (" << want[r].type_string() << ")\n"
                                 << ir::print_module(m);
      }
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::string seen;
  for (const auto& [kind, count] : kinds) seen += fmt::format(" {}:{}", kind, count);
  std::printf(
      "[ general ] %u random graphs, %d outputs compared, %d kernels (summed over graphs), "
      "%.1f s; "
      "max relative error %.3g\n[ general ] ops compiled:%s\n",
      kPropertyGraphs, outputs, kernels, seconds, worst, seen.c_str());
  // The generator reaches every op kind of the general path.
  for (const char* kind : {"reduce_sum", "reduce_mean", "reduce_max", "softmax", "argmax",
                           "transpose", "reshape", "slice", "concat", "matmul", "gather",
                           "layernorm", "linear", "select", "cast", "tanh", "gelu"})
    EXPECT_GT(kinds[kind], 0) << kind;
}

}  // namespace
}  // namespace kiln
