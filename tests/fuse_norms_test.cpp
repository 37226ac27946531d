// Today's blocks written the way PyTorch code writes them, through the default pipeline
// (issue 26): a pre-norm LLaMA-style decoder (RMSNorm in two spellings, SwiGLU, a final
// norm), T5's RMSNorm, Gemma's (1 + w), GPT-2's Conv1D weights, and ViT's positions
// [1, N+1, D] + LayerNorm. Each
// asserts the op list after the pipeline (every residual + norm one add_layernorm, every
// norm fused: no reduce_mean, rsqrt or sqrt left, every GEMM a linear) and that the
// interpreter gives the same outputs before and after (random weights and inputs,
// several lengths, within 1e-4); the nn blocks against hand computations.
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "frontend/dsl.h"
#include "frontend/nn.h"
#include "ir/interpreter.h"
#include "ir/ir.h"
#include "passes/notes.h"
#include "passes/pipeline.h"
#include "support/error.h"
#include "tests/pass_harness.h"

namespace kiln {
namespace {

using dsl::Dim;
using dsl::DType;
using dsl::Tensor;
using ir::OpKind;
using testing::count_ops;
using testing::function;

constexpr int64_t kD = 16, kHeads = 2, kFf = 24, kVocab = 13;

// The interpreter's results before and after the pipeline agree within this on every output:
// the fused norms reorder float arithmetic (the mean of squares in double, one rounding).
constexpr double kTolerance = 1e-4;

// How RMSNorm is written in a model's own code.
enum class Spelling {
  nn_block,  // nn::RMSNorm: x * rsqrt(mean(x*x, -1, keepdim) + eps) * w (LLaMA)
  root,      // w * (x / sqrt(mean(x*x, -1, keepdim) + eps)), through .to(float32) casts
  t5,        // w * (h * rsqrt(h.pow(2).mean(-1, keepdim) + eps)), h = x.to(float32)
  gemma,     // x * rsqrt(...) * (1 + w)
};

Tensor rms_norm(Spelling s, const std::string& prefix, Tensor x) {
  dsl::FunctionBuilder& fb = *x.builder();
  if (s == Spelling::nn_block) return nn::RMSNorm{prefix, kD, 1e-6}(x);
  if (s == Spelling::gemma) return nn::RMSNorm{prefix, kD, 1e-6, /*unit_offset=*/true}(x);
  dsl::ScopeGuard scope(fb, prefix);
  Tensor w = fb.weight(prefix + ".weight", {kD});
  Tensor h = dsl::cast(x, DType::f32);
  Tensor variance = dsl::reduce_mean(h * h, {-1}, /*keepdims=*/true);
  if (s == Spelling::root) return w * dsl::cast(h / dsl::sqrt(variance + 1e-6), DType::f32);
  return w * (h * dsl::rsqrt(variance + 1e-6));
}

// A LLaMA-style decoder: embeddings, `layers` pre-norm blocks
//   h = x + self_attn(input_layernorm(x));  x = h + mlp(post_attention_layernorm(h))
// with causal attention (no biases) and a SwiGLU MLP, then the final norm and the LM head.
ir::Module llama(Spelling spelling, int layers = 2) {
  dsl::ModelBuilder mb("llama");
  Dim B = mb.symbol("B", 2), S = mb.symbol("S", 9);
  dsl::FunctionBuilder& f = mb.function("forward");
  Tensor ids = f.input("ids", DType::i64, {B, S});
  Tensor x = nn::Embedding{"model.embed_tokens", kVocab, kD}(ids);
  const Tensor mask = nn::causal_mask(ids);
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    nn::MultiHeadAttention attn{p + ".self_attn", kD,       kHeads,   "q_proj",
                                "k_proj",         "v_proj", "o_proj", /*qkv_bias=*/false,
                                /*o_bias=*/false};
    Tensor n = rms_norm(spelling, p + ".input_layernorm", x);
    Tensor h = x + attn(n, n, mask);
    x = h + nn::GatedFeedForward{p + ".mlp", kD,
                                 kFf}(rms_norm(spelling, p + ".post_attention_layernorm", h));
  }
  x = rms_norm(spelling, "model.norm", x);
  f.output(nn::Linear{"lm_head", kD, kVocab, /*bias=*/false}(x), "logits");
  return mb.finish();
}

// ViT: patches [B, N+1, P] projected, plus positions [1, N+1, D] (a weight broadcasting over
// the batch), then a pre-norm encoder block and the final LayerNorm.
ir::Module vit() {
  dsl::ModelBuilder mb("vit");
  Dim B = mb.symbol("B", 2);
  dsl::FunctionBuilder& f = mb.function("forward");
  Tensor patches = f.input("patches", DType::f32, {B, Dim::constant(5), Dim::constant(12)});
  Tensor x = nn::Linear{"embeddings.patch_embeddings.projection", 12, kD}(patches);
  Tensor pos = f.weight("embeddings.position_embeddings", {1, 5, kD});
  x = x + pos;
  x = nn::EncoderBlock{"encoder.layer.0", kD, kHeads, kFf, /*pre_norm=*/true, nn::Activation::gelu}(
      x, Tensor());
  f.output(nn::LayerNorm{"layernorm", kD, 1e-12}(x), "hidden");
  return mb.finish();
}

struct Optimized {
  ir::Module before, after;
  std::vector<std::string> notes;
};

Optimized optimize(ir::Module m) {
  Optimized o{m, std::move(m), {}};
  passes::PipelineOptions options;
  options.verify_each = true;
  const std::vector<passes::LostFusion> lost =
      passes::run_passes(o.after, passes::default_pipeline(), options);
  o.notes = passes::format_lost_fusions(o.after, lost, "");
  return o;
}

std::map<OpKind, int> kinds(const ir::Function& f) {
  std::map<OpKind, int> n;
  for (const ir::Op& op : f.ops) ++n[op.kind];
  return n;
}

std::string op_list(const ir::Function& f) {
  std::string s;
  for (const ir::Op& op : f.ops) s += std::string(ir::op_name(op.kind)) + " ";
  return s;
}

// No norm written out is left, and no GEMM outside a linear (attention fused).
void expect_fully_fused(const ir::Function& f) {
  for (OpKind k : {OpKind::reduce_mean, OpKind::rsqrt, OpKind::sqrt, OpKind::matmul,
                   OpKind::softmax, OpKind::transpose})
    EXPECT_EQ(count_ops(f, k), 0) << ir::op_name(k) << " left in: " << op_list(f);
}

class LlamaBlock : public ::testing::TestWithParam<Spelling> {};

std::string spelling_name(const ::testing::TestParamInfo<Spelling>& p) {
  static const char* const kNames[] = {"nn_block", "root", "t5", "gemma"};
  return kNames[static_cast<int>(p.param)];
}

// 2 layers: the first input_layernorm reads the embeddings (no residual: a layernorm
// {rms}); every other norm reads a residual sum: 2 per layer minus that one, plus the final
// norm, each an add_layernorm {rms} whose sum also feeds the next residual but the last.
TEST_P(LlamaBlock, EveryResidualAndNormIsOneOpAndComputesTheSame) {
  const Optimized o = optimize(llama(GetParam()));
  const ir::Function& fwd = function(o.after, "forward");
  const std::map<OpKind, int> n = kinds(fwd);
  EXPECT_EQ(n.count(OpKind::layernorm) ? n.at(OpKind::layernorm) : 0, 1) << op_list(fwd);
  EXPECT_EQ(n.count(OpKind::add_layernorm) ? n.at(OpKind::add_layernorm) : 0, 4) << op_list(fwd);
  EXPECT_EQ(n.count(OpKind::add_layernorm_sum) ? n.at(OpKind::add_layernorm_sum) : 0, 3);
  for (const ir::Op& op : fwd.ops)
    if (op.kind == OpKind::layernorm || op.kind == OpKind::add_layernorm) {
      EXPECT_EQ(op.int_attr("rms"), 1);
      EXPECT_NEAR(op.float_attr("eps"), 1e-6, 1e-12);
    }
  expect_fully_fused(fwd);
  // Every GEMM a linear: q/k/v merged, o, gate/up merged... and the head.
  EXPECT_EQ(count_ops(fwd, OpKind::attention), 2);
  EXPECT_GE(count_ops(fwd, OpKind::linear), 2 * 4 + 1) << op_list(fwd);
  EXPECT_TRUE(o.notes.empty()) << o.notes[0];
  EXPECT_LE(testing::max_difference(o.before, o.after, {1, 7, 9}), kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Spellings, LlamaBlock,
                         ::testing::Values(Spelling::nn_block, Spelling::root, Spelling::t5,
                                           Spelling::gemma),
                         spelling_name);

// ViT: the positions [1, 5, D] broadcast over the batch fuse into the first norm's add, whose
// sum feeds the residual; the patch projection is a linear.
TEST(VitBlock, PositionsFuseIntoTheNorm) {
  const Optimized o = optimize(vit());
  const ir::Function& fwd = function(o.after, "forward");
  // norm1(x + pos) with its sum, norm2(h = x + attn) with its sum, the final norm of the
  // last residual.
  EXPECT_EQ(count_ops(fwd, OpKind::add_layernorm), 3) << op_list(fwd);
  EXPECT_EQ(count_ops(fwd, OpKind::layernorm), 0) << op_list(fwd);
  EXPECT_EQ(count_ops(fwd, OpKind::add), 0) << op_list(fwd);
  bool positions = false;
  for (const ir::Op& op : fwd.ops)
    if (op.kind == OpKind::add_layernorm &&
        ir::to_string(fwd.type(op.operands[1])) == "f32[1,5,16]")
      positions = true;
  EXPECT_TRUE(positions) << op_list(fwd);
  expect_fully_fused(fwd);
  EXPECT_EQ(count_ops(fwd, OpKind::attention), 1);
  EXPECT_TRUE(o.notes.empty()) << o.notes[0];
  EXPECT_LE(testing::max_difference(o.before, o.after, {1}), kTolerance);
}

// GPT-2: Conv1D weights stored [in, out] (matmul(x, W) + b), a pre-norm block with the
// attention written out over the split c_attn output, and the final ln_f.
ir::Module gpt2() {
  dsl::ModelBuilder mb("gpt2");
  Dim B = mb.symbol("B", 2), S = mb.symbol("S", 9);
  dsl::FunctionBuilder& f = mb.function("forward");
  Tensor ids = f.input("input_ids", DType::i64, {B, S});
  Tensor x = nn::Embedding{"wte", kVocab, kD}(ids);
  x = nn::PositionEmbedding{"wpe", 9, kD}(x);
  const auto conv1d = [&](const std::string& p, Tensor in, int64_t nx, int64_t nf) {
    // transformers.pytorch_utils.Conv1D: x @ weight [nx, nf] + bias.
    return dsl::matmul(in, f.weight(p + ".weight", {nx, nf})) + f.weight(p + ".bias", {nf});
  };
  const int64_t hd = kD / kHeads;
  const auto heads = [&](Tensor t) {  // [B,S,D] -> [B,H,S,hd]
    return dsl::transpose(dsl::reshape(t, {B, S, Dim::constant(kHeads), Dim::constant(hd)}),
                          {0, 2, 1, 3});
  };
  Tensor a = nn::LayerNorm{"h.0.ln_1", kD}(x);
  Tensor qkv = conv1d("h.0.attn.c_attn", a, kD, 3 * kD);
  Tensor q = heads(dsl::slice(qkv, 2, 0, Dim::constant(kD)));
  Tensor k = heads(dsl::slice(qkv, 2, kD, Dim::constant(kD)));
  Tensor v = heads(dsl::slice(qkv, 2, 2 * kD, Dim::constant(kD)));
  Tensor scores = dsl::matmul(q, dsl::transpose(k, {0, 1, 3, 2})) / std::sqrt(double(hd));
  Tensor masked = dsl::select(nn::causal_mask(ids), dsl::scalar(scores, -1e9), scores);
  Tensor ctx = dsl::matmul(dsl::softmax(masked, -1), v);
  ctx = dsl::reshape(dsl::transpose(ctx, {0, 2, 1, 3}), {B, S, Dim::constant(kD)});
  x = x + conv1d("h.0.attn.c_proj", ctx, kD, kD);
  Tensor m = nn::LayerNorm{"h.0.ln_2", kD}(x);
  x = x + conv1d("h.0.mlp.c_proj", dsl::gelu_tanh(conv1d("h.0.mlp.c_fc", m, kD, kFf)), kFf, kD);
  f.output(nn::LayerNorm{"ln_f", kD}(x), "hidden");
  return mb.finish();
}

// Every Conv1D is a linear reading W.T = transpose(@W), derived at load time from the same
// checkpoint tensor; the residuals fuse into the norms; the outputs stay the same.
TEST(Gpt2Block, Conv1DWeightsBecomeLinears) {
  const Optimized o = optimize(gpt2());
  const ir::Function& fwd = function(o.after, "forward");
  EXPECT_EQ(count_ops(fwd, OpKind::linear), 4) << op_list(fwd);
  for (const ir::Op& op : fwd.ops) {
    if (op.kind == OpKind::matmul) {
      // Only attention's own products may stay (if not fused): never a weight.
      const int d = fwd.defining_op(op.operands[1]);
      EXPECT_FALSE(d >= 0 && fwd.ops[d].kind == OpKind::weight) << op_list(fwd);
    }
    if (op.kind != OpKind::linear) continue;
    const ir::Op& w = fwd.ops[fwd.defining_op(op.operands[1])];
    ASSERT_EQ(w.kind, OpKind::weight);
    const ir::Weight* decl = o.after.find_weight(w.str_attr("name"));
    ASSERT_NE(decl, nullptr);
    ASSERT_TRUE(decl->derivation.has_value()) << decl->name;
    EXPECT_EQ(decl->derivation->op, "transpose");
    EXPECT_EQ(decl->name, decl->derivation->inputs.at(0) + ".T");
  }
  // ln_2(x + attn) with its sum, ln_f(x + mlp); ln_1 reads the positions' sum.
  EXPECT_EQ(count_ops(fwd, OpKind::add_layernorm), 3) << op_list(fwd);
  EXPECT_EQ(count_ops(fwd, OpKind::reduce_mean), 0);
  EXPECT_LE(testing::max_difference(o.before, o.after, {1, 7, 9}), kTolerance);
}

// A norm that cannot fuse says so, at the user's line: the mean over the wrong axis.
TEST(RmsNormNotes, TheWrongAxisIsNotedAtTheUsersLine) {
  dsl::ModelBuilder mb("m");
  Dim B = mb.symbol("B", 2);
  dsl::FunctionBuilder& f = mb.function("forward");
  Tensor x = f.input("x", DType::f32, {B, Dim::constant(3), Dim::constant(kD)});
  Tensor w = f.weight("norm.weight", {kD});
  const int line = __LINE__ + 1;
  Tensor variance = dsl::reduce_mean(x * x, {1}, /*keepdims=*/true);
  f.output(x * dsl::rsqrt(variance + 1e-6) * w, "y");
  const Optimized o = optimize(mb.finish());
  EXPECT_EQ(count_ops(function(o.after, "forward"), OpKind::reduce_mean), 1);
  ASSERT_EQ(o.notes.size(), 1u);
  EXPECT_EQ(o.notes[0],
            "note: fuse_norms_test.cpp:" + std::to_string(line) +
                ": norm-shaped subgraph left unfused: the mean of squares is over axes [1], not "
                "the last axis only (the norm kernel normalizes the last axis) [fuse-rmsnorm]");
}

// nn::RMSNorm against the formula in double; nn::GatedFeedForward's state_dict names and
// down(silu(gate(x)) * up(x)) against a hand computation.
TEST(NnBlocks, RmsNormAndGatedFeedForward) {
  dsl::ModelBuilder mb("m");
  Dim B = mb.symbol("B", 3);
  dsl::FunctionBuilder& f = mb.function("forward");
  Tensor x = f.input("x", DType::f32, {B, Dim::constant(4)});
  f.output(nn::RMSNorm{"norm", 4, 1e-5}(x), "norm");
  f.output(nn::RMSNorm{"gemma_norm", 4, 1e-5, true}(x), "gemma");
  f.output(nn::GatedFeedForward{"mlp", 4, 3}(x), "mlp");
  const ir::Module m = mb.finish();
  std::vector<std::string> names;
  for (const ir::Weight& w : m.weights) names.push_back(w.name + " " + ir::to_string(w.type));
  EXPECT_EQ(names,
            (std::vector<std::string>{
                "norm.weight f32[4]", "gemma_norm.weight f32[4]", "mlp.gate_proj.weight f32[3,4]",
                "mlp.up_proj.weight f32[3,4]", "mlp.down_proj.weight f32[4,3]"}));
  ir::WeightMap weights = testing::random_weights(m, 5);
  const ir::Tensor in = ir::Tensor::from_f32({2, 4}, {0.5f, -1, 2, 0.25f, 3, 0, -0.5f, 1});
  const std::vector<ir::Tensor> out = ir::interpret(m, m.functions[0], weights, {in});
  const auto& wn = weights.at("norm.weight").f;
  const auto& wg = weights.at("gemma_norm.weight").f;
  const auto& gate = weights.at("mlp.gate_proj.weight").f;
  const auto& up = weights.at("mlp.up_proj.weight").f;
  const auto& down = weights.at("mlp.down_proj.weight").f;
  for (int r = 0; r < 2; ++r) {
    const float* xr = &in.f[r * 4];
    double ms = 0;
    for (int i = 0; i < 4; ++i) ms += double(xr[i]) * xr[i];
    const double inv = 1.0 / std::sqrt(ms / 4 + 1e-5);
    std::vector<double> act(3);
    for (int j = 0; j < 3; ++j) {
      double g = 0, u = 0;
      for (int i = 0; i < 4; ++i) {
        g += double(gate[j * 4 + i]) * xr[i];
        u += double(up[j * 4 + i]) * xr[i];
      }
      act[j] = g / (1 + std::exp(-g)) * u;
    }
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(out[0].f[r * 4 + i], xr[i] * inv * wn[i], 1e-6) << r << "," << i;
      EXPECT_NEAR(out[1].f[r * 4 + i], xr[i] * inv * (1.0 + wg[i]), 1e-6) << r << "," << i;
      double y = 0;
      for (int j = 0; j < 3; ++j) y += down[i * 3 + j] * act[j];
      EXPECT_NEAR(out[2].f[r * 4 + i], y, 1e-5) << r << "," << i;
    }
  }
  // Misuse: named at the user's line and the block's scope.
  dsl::ModelBuilder bad("bad");
  Dim B2 = bad.symbol("B", 3);
  dsl::FunctionBuilder& g = bad.function("forward");
  Tensor y = g.input("x", DType::f32, {B2, Dim::constant(4)});
  try {
    nn::RMSNorm{"model.norm", 8}(y);
    FAIL() << "a norm of the wrong width was built";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in 'model.norm'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("input is f32[B,4], expected a last dim of dim = 8"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kiln
