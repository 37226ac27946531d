// nn building blocks and the reference Transformer (see nn.h).
#include "frontend/nn.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "frontend/seq2seq.h"
#include "support/error.h"

namespace kiln::nn {

using dsl::Dim;
using dsl::DType;
using dsl::FunctionBuilder;
using dsl::ScopeGuard;

namespace {

FunctionBuilder& fb_of(const Tensor& t, const Loc& loc) {
  if (!t.valid()) {
    const char* slash = std::strrchr(loc.file_name(), '/');
    throw Error(fmt::format("dsl error at {}:{}: nn block applied to an empty tensor",
                            slash ? slash + 1 : loc.file_name(), loc.line()));
  }
  return *t.builder();
}

// Makes `path` (a block's full state_dict prefix) the diagnostics scope while alive:
// pushes only the part below the enclosing block's scope when `path` continues it, so a
// nested block reports 'layers.0.self_attn', not 'layers.0.layers.0.self_attn'.
class PathScope {
 public:
  PathScope(FunctionBuilder& fb, const std::string& path) : fb_(fb) {
    const std::string current = fb.scope();
    if (path == current) return;
    pushed_ = true;
    if (!current.empty() && path.rfind(current + ".", 0) == 0)
      fb.push_scope(path.substr(current.size() + 1));
    else
      fb.push_scope(path);
  }
  ~PathScope() {
    if (pushed_) fb_.pop_scope();
  }
  PathScope(const PathScope&) = delete;
  PathScope& operator=(const PathScope&) = delete;

 private:
  FunctionBuilder& fb_;
  bool pushed_ = false;
};

// Misuse checks, reported at the user's line in the block's scope.
template <typename... Args>
void check(bool ok, FunctionBuilder& fb, const Loc& loc, fmt::format_string<Args...> format,
           Args&&... args) {
  if (!ok) fb.error(loc, fmt::format(format, std::forward<Args>(args)...));
}

void check_positive(FunctionBuilder& fb, const Loc& loc, const char* key, int64_t v) {
  check(v >= 1, fb, loc, "{} = {}, expected a positive size", key, v);
}

// x's last dim is the constant `dim` (named `key` in the block).
void check_last_dim(FunctionBuilder& fb, const Loc& loc, const Tensor& x, const char* what,
                    const char* key, int64_t dim) {
  check(x.rank() >= 1 && x.shape().back().is_const(dim), fb, loc,
        "{} is {}, expected a last dim of {} = {}", what, ir::to_string(x.type()), key, dim);
}

void check_attention(FunctionBuilder& fb, const Loc& loc, int64_t d_model, int64_t heads) {
  check_positive(fb, loc, "d_model", d_model);
  check(heads >= 1, fb, loc, "heads = {}, expected a positive head count", heads);
  check(d_model % heads == 0, fb, loc, "heads = {} does not divide d_model = {}", heads, d_model);
}

void check_mask(FunctionBuilder& fb, const Loc& loc, const Tensor& mask, const char* what) {
  if (!mask.valid()) return;
  check(mask.builder() == &fb, fb, loc, "{} belongs to another function", what);
  check(mask.dtype() == DType::boolean && mask.rank() == 4, fb, loc,
        "{} is {}, expected bool of rank 4 broadcasting to the scores [B, heads, Lq, Lk]", what,
        ir::to_string(mask.type()));
}

}  // namespace

Tensor activate(Activation act, Tensor x, Loc loc) {
  switch (act) {
    case Activation::relu:
      return dsl::relu(x, loc);
    case Activation::gelu:
      return dsl::gelu(x, loc);
    case Activation::gelu_tanh:
      return dsl::gelu_tanh(x, loc);
    case Activation::silu:
      return dsl::silu(x, loc);
  }
  fb_of(x, loc).error(loc, fmt::format("unknown activation {}", static_cast<int>(act)));
}

Tensor Linear::operator()(Tensor x, Loc loc) const {
  FunctionBuilder& fb = fb_of(x, loc);
  PathScope scope(fb, prefix);
  check_positive(fb, loc, "in", in);
  check_positive(fb, loc, "out", out);
  check_last_dim(fb, loc, x, "input", "in", in);
  Tensor w = fb.weight(prefix + ".weight", {out, in}, loc);
  if (!bias) return dsl::matmul(x, dsl::transpose(w, {1, 0}, loc), loc);
  Tensor b = fb.weight(prefix + ".bias", {out}, loc);
  return dsl::add(dsl::matmul(x, dsl::transpose(w, {1, 0}, loc), loc), b, loc);
}

Tensor LayerNorm::operator()(Tensor x, Loc loc) const {
  FunctionBuilder& fb = fb_of(x, loc);
  PathScope scope(fb, prefix);
  check_positive(fb, loc, "dim", dim);
  check(eps > 0, fb, loc, "eps = {}, expected a positive number", eps);
  check(!unbiased || dim >= 2, fb, loc,
        "dim = {} with unbiased variance divides by dim - 1 = 0, expected dim >= 2", dim);
  check(!weight.empty() && !bias.empty() && weight != bias, fb, loc,
        "parameter names '{}' and '{}' must be distinct and non-empty", weight, bias);
  check_last_dim(fb, loc, x, "input", "dim", dim);
  Tensor gamma = fb.weight(prefix + "." + weight, {dim}, loc);  // declared in state_dict order
  Tensor beta = fb.weight(prefix + "." + bias, {dim}, loc);
  return dsl::layernorm(x, gamma, beta, dsl::LayerNormOptions{eps, unbiased, eps_outside}, loc);
}

Tensor RMSNorm::operator()(Tensor x, Loc loc) const {
  FunctionBuilder& fb = fb_of(x, loc);
  PathScope scope(fb, prefix);
  check_positive(fb, loc, "dim", dim);
  check(eps > 0 && std::isfinite(eps), fb, loc, "eps = {}, expected a positive number", eps);
  check_last_dim(fb, loc, x, "input", "dim", dim);
  Tensor w = fb.weight(prefix + ".weight", {dim}, loc);
  if (unit_offset) w = dsl::add(dsl::scalar(w, 1.0), w, loc);
  // As LlamaRMSNorm: variance = x.pow(2).mean(-1, keepdim=True);
  // x * torch.rsqrt(variance + eps) * weight.
  Tensor variance = dsl::reduce_mean(dsl::mul(x, x, loc), {-1}, /*keepdims=*/true, loc);
  Tensor inv = dsl::rsqrt(dsl::add(variance, dsl::scalar(variance, eps), loc), loc);
  return dsl::mul(dsl::mul(x, inv, loc), w, loc);
}

Tensor GatedFeedForward::operator()(Tensor x, Loc loc) const {
  FunctionBuilder& fb = fb_of(x, loc);
  PathScope scope(fb, prefix);
  check_positive(fb, loc, "d_model", d_model);
  check_positive(fb, loc, "d_ff", d_ff);
  check(!gate.empty() && !up.empty() && !down.empty() && gate != up && gate != down && up != down,
        fb, loc, "projection names '{}', '{}' and '{}' must be distinct and non-empty", gate, up,
        down);
  check_last_dim(fb, loc, x, "input", "d_model", d_model);
  const Linear g{prefix + "." + gate, d_model, d_ff, false};
  const Linear u{prefix + "." + up, d_model, d_ff, false};
  const Linear d{prefix + "." + down, d_ff, d_model, false};
  // The gate first: weights are declared in state_dict order.
  Tensor gated = activate(act, g(x, loc), loc);
  return d(dsl::mul(gated, u(x, loc), loc), loc);
}

Tensor SparseMoE::operator()(Tensor x, Loc loc) const {
  FunctionBuilder& fb = fb_of(x, loc);
  PathScope scope(fb, prefix);
  check_positive(fb, loc, "d_model", d_model);
  check_positive(fb, loc, "d_ff", d_ff);
  check_positive(fb, loc, "experts", experts);
  check_positive(fb, loc, "top_k", top_k);
  check(top_k <= experts, fb, loc, "top_k = {} exceeds experts = {}", top_k, experts);
  check_last_dim(fb, loc, x, "input", "d_model", d_model);
  // Weights in state_dict order: the router, then each expert's w1, w2, w3.
  const Linear gate{prefix + ".gate", d_model, experts, false};
  Tensor probs = dsl::softmax(gate(x, loc), -1, loc);
  Tensor ids = dsl::topk(probs, top_k, loc);
  Tensor w = dsl::take_along_axis(probs, ids, -1, loc);
  if (renormalize) w = dsl::div(w, dsl::reduce_sum(w, {-1}, /*keepdims=*/true, loc), loc);
  std::vector<dsl::ExpertWeights> ew;
  for (int64_t e = 0; e < experts; ++e) {
    const std::string p = fmt::format("{}.experts.{}.", prefix, e);
    dsl::ExpertWeights one;
    one.w1 = fb.weight(p + "w1.weight", {d_ff, d_model}, loc);
    one.w2 = fb.weight(p + "w2.weight", {d_model, d_ff}, loc);
    one.w3 = fb.weight(p + "w3.weight", {d_ff, d_model}, loc);
    ew.push_back(one);
  }
  return dsl::moe_ffn(x, ids, w, ew, loc);
}

Tensor Embedding::operator()(Tensor ids, Loc loc) const {
  FunctionBuilder& fb = fb_of(ids, loc);
  PathScope scope(fb, prefix);
  check_positive(fb, loc, "vocab", vocab);
  check_positive(fb, loc, "dim", dim);
  check(ir::is_integer(ids.dtype()), fb, loc, "ids are {}, expected integers",
        ir::to_string(ids.type()));
  return dsl::gather(fb.weight(prefix + ".weight", {vocab, dim}, loc), ids, loc);
}

Tensor Embedding::tied_projection(Tensor x, Loc loc) const {
  FunctionBuilder& fb = fb_of(x, loc);
  PathScope scope(fb, prefix);
  check_positive(fb, loc, "vocab", vocab);
  check_positive(fb, loc, "dim", dim);
  check_last_dim(fb, loc, x, "input of the tied projection", "dim", dim);
  Tensor w = fb.weight(prefix + ".weight", {vocab, dim}, loc);
  return dsl::matmul(x, dsl::transpose(w, {1, 0}, loc), loc);
}

Tensor PositionEmbedding::operator()(Tensor x, Loc loc) const {
  FunctionBuilder& fb = fb_of(x, loc);
  PathScope scope(fb, prefix);
  check_positive(fb, loc, "max_len", max_len);
  check_positive(fb, loc, "dim", dim);
  check(x.rank() == 3, fb, loc, "input is {}, expected [B, L, dim]", ir::to_string(x.type()));
  check_last_dim(fb, loc, x, "input", "dim", dim);
  const Dim L = x.dim(1);
  const int64_t longest = ir::dim_max(fb.module(), L);  // T+1 (a prepended token) too
  check(longest <= max_len, fb, loc, "input length {} may be up to {}, above max_len = {}",
        ir::to_string(L), longest, max_len);
  Tensor table = fb.weight(prefix + ".weight", {max_len, dim}, loc);
  return dsl::add(x, dsl::slice(table, 0, 0, L, loc), loc);
}

Tensor FeedForward::operator()(Tensor x, Loc loc) const {
  FunctionBuilder& fb = fb_of(x, loc);
  PathScope scope(fb, prefix);
  check_positive(fb, loc, "d_model", d_model);
  check_positive(fb, loc, "d_ff", d_ff);
  check_last_dim(fb, loc, x, "input", "d_model", d_model);
  Tensor h = activate(act, Linear{prefix + "." + w1, d_model, d_ff}(x, loc), loc);
  return Linear{prefix + "." + w2, d_ff, d_model}(h, loc);
}

Tensor MultiHeadAttention::operator()(Tensor xq, Tensor xkv, Tensor mask, Loc loc) const {
  FunctionBuilder& fb = fb_of(xq, loc);
  PathScope scope(fb, prefix);
  check_attention(fb, loc, d_model, heads);
  check(xkv.valid() && xkv.builder() == &fb, fb, loc,
        "keys and values come from an empty tensor or another function");
  for (const auto& [t, what] : {std::pair{xq, "query input"}, {xkv, "key/value input"}}) {
    check(t.rank() == 3, fb, loc, "{} is {}, expected [B, L, d_model]", what,
          ir::to_string(t.type()));
    check_last_dim(fb, loc, t, what, "d_model", d_model);
  }
  check_mask(fb, loc, mask, "mask");
  const int64_t dk = d_model / heads;
  const Dim B = xq.dim(0), Lq = xq.dim(1), Lk = xkv.dim(1);
  const Dim H = Dim::constant(heads), Dk = Dim::constant(dk);
  Tensor q = Linear{prefix + "." + this->q, d_model, d_model, qkv_bias}(xq, loc);
  Tensor k = Linear{prefix + "." + this->k, d_model, d_model, qkv_bias}(xkv, loc);
  Tensor v = Linear{prefix + "." + this->v, d_model, d_model, qkv_bias}(xkv, loc);
  // Split heads: [B,L,D] -> [B,H,L,dk]; keys go straight to [B,H,dk,Lk].
  Tensor qh = dsl::transpose(dsl::reshape(q, {B, Lq, H, Dk}, loc), {0, 2, 1, 3}, loc);
  Tensor kt = dsl::transpose(dsl::reshape(k, {B, Lk, H, Dk}, loc), {0, 2, 3, 1}, loc);
  Tensor vh = dsl::transpose(dsl::reshape(v, {B, Lk, H, Dk}, loc), {0, 2, 1, 3}, loc);
  Tensor qk = dsl::matmul(qh, kt, loc);
  Tensor scores = dsl::div(qk, dsl::scalar(qk, std::sqrt(static_cast<double>(dk))), loc);
  if (mask.valid()) scores = dsl::select(mask, dsl::scalar(scores, fill), scores, loc);
  Tensor p = dsl::softmax(scores, -1, loc);
  Tensor o = dsl::transpose(dsl::matmul(p, vh, loc), {0, 2, 1, 3}, loc);
  return Linear{prefix + "." + this->o, d_model, d_model, o_bias}(
      dsl::reshape(o, {B, Lq, Dim::constant(d_model)}, loc), loc);
}

Tensor EncoderBlock::operator()(Tensor x, Tensor mask, Loc loc) const {
  FunctionBuilder& fb = fb_of(x, loc);
  PathScope scope(fb, prefix);
  // The whole block's configuration, before any op is built.
  {
    PathScope attn_scope(fb, prefix + ".self_attn");
    check_attention(fb, loc, d_model, heads);
  }
  check_positive(fb, loc, "d_ff", d_ff);
  check_last_dim(fb, loc, x, "input", "d_model", d_model);
  check_mask(fb, loc, mask, "mask");
  MultiHeadAttention attn{prefix + ".self_attn", d_model, heads};
  FeedForward ffn{prefix + ".ffn", d_model, d_ff, act};
  LayerNorm norm1{prefix + ".norm1", d_model, eps}, norm2{prefix + ".norm2", d_model, eps};
  if (pre_norm) {
    Tensor h = norm1(x, loc);
    x = dsl::add(x, attn(h, h, mask, loc), loc);
    return dsl::add(x, ffn(norm2(x, loc), loc), loc);
  }
  x = norm1(dsl::add(x, attn(x, x, mask, loc), loc), loc);
  return norm2(dsl::add(x, ffn(x, loc), loc), loc);
}

Tensor DecoderBlock::operator()(Tensor x, Tensor memory, Tensor src_mask, Tensor tgt_mask,
                                Loc loc) const {
  FunctionBuilder& fb = fb_of(x, loc);
  PathScope scope(fb, prefix);
  {
    PathScope attn_scope(fb, prefix + ".self_attn");
    check_attention(fb, loc, d_model, heads);
  }
  check_positive(fb, loc, "d_ff", d_ff);
  check_last_dim(fb, loc, x, "input", "d_model", d_model);
  check(memory.valid() && memory.builder() == &fb, fb, loc,
        "memory is an empty tensor or belongs to another function");
  check_last_dim(fb, loc, memory, "memory", "d_model", d_model);
  check_mask(fb, loc, src_mask, "src_mask");
  check_mask(fb, loc, tgt_mask, "tgt_mask");
  MultiHeadAttention self_attn{prefix + ".self_attn", d_model, heads};
  MultiHeadAttention cross_attn{prefix + ".cross_attn", d_model, heads};
  FeedForward ffn{prefix + ".ffn", d_model, d_ff, act};
  LayerNorm norm1{prefix + ".norm1", d_model, eps}, norm2{prefix + ".norm2", d_model, eps},
      norm3{prefix + ".norm3", d_model, eps};
  if (pre_norm) {
    Tensor h = norm1(x, loc);
    x = dsl::add(x, self_attn(h, h, tgt_mask, loc), loc);
    x = dsl::add(x, cross_attn(norm2(x, loc), memory, src_mask, loc), loc);
    return dsl::add(x, ffn(norm3(x, loc), loc), loc);
  }
  x = norm1(dsl::add(x, self_attn(x, x, tgt_mask, loc), loc), loc);
  x = norm2(dsl::add(x, cross_attn(x, memory, src_mask, loc), loc), loc);
  return norm3(dsl::add(x, ffn(x, loc), loc), loc);
}

Tensor mean_pool(Tensor x, Tensor pad, Loc loc) {
  FunctionBuilder& fb = fb_of(x, loc);
  check(x.rank() == 3, fb, loc, "mean_pool: input is {}, expected [B, L, D]",
        ir::to_string(x.type()));
  check(pad.valid() && pad.builder() == &fb && pad.dtype() == DType::boolean && pad.rank() == 2 &&
            pad.dim(0) == x.dim(0) && pad.dim(1) == x.dim(1),
        fb, loc, "mean_pool: padding mask is {}, expected bool[{},{}] (true at padding)",
        pad.valid() ? ir::to_string(pad.type()) : "empty", ir::to_string(x.dim(0)),
        ir::to_string(x.dim(1)));
  Tensor valid = dsl::cast(dsl::logical_not(pad, loc), x.dtype(), loc);
  valid = dsl::reshape(valid, {x.dim(0), x.dim(1), Dim::constant(1)}, loc);
  Tensor sum = dsl::reduce_sum(dsl::mul(x, valid, loc), {1}, /*keepdims=*/false, loc);
  Tensor count = dsl::reduce_sum(valid, {1}, /*keepdims=*/false, loc);
  return dsl::div(sum, count, loc);
}

Tensor first_token(Tensor x, Loc loc) {
  FunctionBuilder& fb = fb_of(x, loc);
  check(x.rank() == 3, fb, loc, "first_token: input is {}, expected [B, L, D]",
        ir::to_string(x.type()));
  Tensor first = dsl::slice(x, 1, 0, Dim::constant(1), loc);
  return dsl::reshape(first, {x.dim(0), x.dim(2)}, loc);
}

Tensor padding_mask(Tensor ids, int64_t pad_id, Loc loc) {
  fb_of(ids, loc);
  return dsl::eq(ids, dsl::scalar(ids, static_cast<double>(pad_id)), loc);
}

Tensor causal_mask(Tensor ids, Loc loc) {
  FunctionBuilder& fb = fb_of(ids, loc);
  check(ids.rank() == 2, fb, loc, "causal_mask: ids are {}, expected [B, L]",
        ir::to_string(ids.type()));
  const Dim one = Dim::constant(1), L = ids.dim(1);
  Tensor row = dsl::iota(fb, DType::i64, {one, one, L, L}, 2, loc);
  Tensor col = dsl::iota(fb, DType::i64, {one, one, L, L}, 3, loc);
  return dsl::gt(col, row, loc);
}

std::pair<Tensor, Tensor> Rotary::tables(FunctionBuilder& fb, Dim L, Loc loc) const {
  ScopeGuard scope(fb, "rotary");
  check(head_dim >= 2 && head_dim % 2 == 0, fb, loc, "head_dim = {}, expected a positive even size",
        head_dim);
  check(base > 1 && std::isfinite(base), fb, loc, "base = {}, expected a finite number above 1",
        base);
  check(scaling > 0 && std::isfinite(scaling), fb, loc, "scaling = {}, expected a positive number",
        scaling);
  const Dim half = Dim::constant(head_dim / 2);
  // inv_freq[k] = base^(-2k/d), positions t / scaling, freqs = t · inv_freq: [L, d/2].
  Tensor k = dsl::cast(dsl::iota(fb, DType::i64, {L, half}, 1, loc), DType::f32, loc);
  Tensor inv_freq = dsl::exp(
      dsl::mul(k, dsl::scalar(k, -2.0 * std::log(base) / static_cast<double>(head_dim)), loc), loc);
  Tensor t = dsl::cast(dsl::iota(fb, DType::i64, {L, half}, 0, loc), DType::f32, loc);
  if (scaling != 1.0) t = dsl::div(t, dsl::scalar(t, scaling), loc);
  Tensor freqs = dsl::mul(t, inv_freq, loc);
  Tensor emb;
  if (style == RotaryStyle::half) {
    emb = dsl::concat({freqs, freqs}, 1, loc);  // cat((freqs, freqs), -1)
  } else {
    // repeat_interleave(freqs, 2, -1): [L, d/2, 1] twice along the last axis, then [L, d].
    Tensor f3 = dsl::reshape(freqs, {L, half, Dim::constant(1)}, loc);
    emb = dsl::reshape(dsl::concat({f3, f3}, 2, loc), {L, Dim::constant(head_dim)}, loc);
  }
  return {dsl::cos(emb, loc), dsl::sin(emb, loc)};
}

Tensor Rotary::operator()(Tensor x, Tensor cos, Tensor sin, Loc loc) const {
  FunctionBuilder& fb = fb_of(x, loc);
  ScopeGuard scope(fb, "rotary");
  check(x.rank() == 4 && x.shape().back().is_const(head_dim) && head_dim % 2 == 0, fb, loc,
        "rotary input is {}, expected [B, H, L, head_dim = {}] with an even head_dim",
        ir::to_string(x.type()), head_dim);
  const int64_t h2 = head_dim / 2;
  Tensor rotated;
  if (style == RotaryStyle::half) {
    // rotate_half: cat((-x2, x1), -1).
    Tensor x1 = dsl::slice(x, 3, 0, Dim::constant(h2), loc);
    Tensor x2 = dsl::slice(x, 3, h2, Dim::constant(h2), loc);
    rotated = dsl::concat({dsl::neg(x2, loc), x1}, 3, loc);
  } else {
    // stack((-x[..., 1::2], x[..., 0::2]), -1).reshape(x.shape), the strided slices taken
    // from x viewed as [..., d/2, 2].
    const Dim B = x.dim(0), H = x.dim(1), L = x.dim(2), one = Dim::constant(1);
    Tensor pairs = dsl::reshape(x, {B, H, L, Dim::constant(h2), Dim::constant(2)}, loc);
    Tensor even = dsl::slice(pairs, 4, 0, one, loc), odd = dsl::slice(pairs, 4, 1, one, loc);
    rotated = dsl::reshape(dsl::concat({dsl::neg(odd, loc), even}, 4, loc), x.shape(), loc);
  }
  return dsl::add(dsl::mul(x, cos, loc), dsl::mul(rotated, sin, loc), loc);
}

Tensor repeat_kv(Tensor x, int64_t n_rep, RepeatKv how, Loc loc) {
  FunctionBuilder& fb = fb_of(x, loc);
  check(x.rank() == 4 && n_rep >= 1, fb, loc,
        "repeat_kv of {} by {}, expected [B, KV, L, d] and n >= 1", ir::to_string(x.type()), n_rep);
  if (n_rep == 1) return x;
  const Dim B = x.dim(0), KV = x.dim(1), L = x.dim(2), d = x.dim(3);
  check(!KV.is_symbolic(), fb, loc, "repeat_kv: kv heads of {} must be constant",
        ir::to_string(x.type()));
  Tensor unit = dsl::reshape(x, {B, KV, Dim::constant(1), L, d}, loc);  // x[:, :, None]
  const Dim n = Dim::constant(n_rep);
  Tensor r = how == RepeatKv::expand ? dsl::expand(unit, {B, KV, n, L, d}, loc)
                                     : dsl::concat(std::vector<Tensor>(n_rep, unit), 2, loc);
  return dsl::reshape(r, {B, Dim::constant(KV.value * n_rep), L, d}, loc);
}

Tensor GQAttention::operator()(Tensor x, Tensor mask, Tensor bias, Loc loc) const {
  FunctionBuilder& fb = fb_of(x, loc);
  PathScope scope(fb, prefix);
  check_positive(fb, loc, "hidden", hidden);
  check(heads >= 1, fb, loc, "heads = {}, expected a positive head count", heads);
  const int64_t kvh = kv_heads ? kv_heads : heads;
  check(kvh >= 1 && heads % kvh == 0, fb, loc, "kv_heads = {} does not divide heads = {}", kvh,
        heads);
  check(head_dim > 0 || hidden % heads == 0, fb, loc, "heads = {} does not divide hidden = {}",
        heads, hidden);
  const int64_t hd = head_dim ? head_dim : hidden / heads;
  check(x.rank() == 3, fb, loc, "input is {}, expected [B, L, hidden]", ir::to_string(x.type()));
  check_last_dim(fb, loc, x, "input", "hidden", hidden);
  check_mask(fb, loc, mask, "mask");
  const Dim B = x.dim(0), L = x.dim(1), D = Dim::constant(hd);
  const Dim H = Dim::constant(heads), KV = Dim::constant(kvh);
  Tensor q = Linear{prefix + ".q_proj", hidden, heads * hd, qkv_bias}(x, loc);
  Tensor k = Linear{prefix + ".k_proj", hidden, kvh * hd, qkv_bias}(x, loc);
  Tensor v = Linear{prefix + ".v_proj", hidden, kvh * hd, qkv_bias}(x, loc);
  // view(B, L, heads, head_dim).transpose(1, 2)
  Tensor qh = dsl::transpose(dsl::reshape(q, {B, L, H, D}, loc), {0, 2, 1, 3}, loc);
  Tensor kh = dsl::transpose(dsl::reshape(k, {B, L, KV, D}, loc), {0, 2, 1, 3}, loc);
  Tensor vh = dsl::transpose(dsl::reshape(v, {B, L, KV, D}, loc), {0, 2, 1, 3}, loc);
  if (rotary) {
    const Rotary rope{hd, rotary_base, rotary_scaling, rotary_style};
    auto [cos, sin] = rope.tables(fb, L, loc);
    qh = rope(qh, cos, sin, loc);
    kh = rope(kh, cos, sin, loc);
  }
  kh = repeat_kv(kh, heads / kvh, repeat, loc);
  vh = repeat_kv(vh, heads / kvh, repeat, loc);
  Tensor scores = dsl::matmul(qh, dsl::transpose(kh, {0, 1, 3, 2}, loc), loc);
  const double s = scaling != 0 ? scaling : 1.0 / std::sqrt(static_cast<double>(hd));
  if (s != 1.0) scores = dsl::mul(scores, dsl::scalar(scores, s), loc);
  if (softcap > 0) {
    scores = dsl::div(scores, dsl::scalar(scores, softcap), loc);
    scores = dsl::mul(dsl::tanh(scores, loc), dsl::scalar(scores, softcap), loc);
  }
  if (bias.valid()) scores = dsl::add(scores, bias, loc);
  if (mask.valid()) scores = dsl::select(mask, dsl::scalar(scores, fill), scores, loc);
  Tensor p = dsl::softmax(scores, -1, loc);
  Tensor o = dsl::transpose(dsl::matmul(p, vh, loc), {0, 2, 1, 3}, loc);
  o = dsl::reshape(o, {B, L, Dim::constant(heads * hd)}, loc);
  return Linear{prefix + ".o_proj", heads * hd, hidden, o_bias}(o, loc);
}

namespace {

// T5's bucket of relative positions rp = key position - query position (i64, any shape), as
// Hugging Face's _relative_position_bucket computes it.
Tensor t5_bucket(const T5RelativeBias& b, FunctionBuilder& fb, Tensor rp, Loc loc) {
  check(b.heads >= 1, fb, loc, "heads = {}, expected a positive head count", b.heads);
  check(b.buckets >= (b.bidirectional ? 4 : 2) &&
            b.max_distance > b.buckets / (b.bidirectional ? 4 : 2),
        fb, loc, "buckets = {}, max_distance = {}: too few buckets or too short a distance",
        b.buckets, b.max_distance);
  int64_t nb = b.buckets;
  Tensor bucket;
  if (b.bidirectional) {
    nb /= 2;
    bucket = dsl::mul(dsl::cast(dsl::gt(rp, dsl::scalar(rp, 0), loc), DType::i64, loc),
                      dsl::scalar(rp, static_cast<double>(nb)), loc);
    rp = dsl::abs(rp, loc);
  } else {
    rp = dsl::neg(dsl::minimum(rp, dsl::scalar(rp, 0), loc), loc);
  }
  const int64_t max_exact = nb / 2;
  Tensor is_small = dsl::lt(rp, dsl::scalar(rp, static_cast<double>(max_exact)), loc);
  // max_exact + log(rp / max_exact) / log(max_distance / max_exact) · (nb - max_exact), to
  // long; of max(rp, 1) so that the branch not taken (rp = 0) stays finite.
  Tensor rpf = dsl::maximum(dsl::cast(rp, DType::f32, loc), fb.constant(1.0), loc);
  Tensor scaled = dsl::mul(
      dsl::div(dsl::log(dsl::div(rpf, dsl::scalar(rpf, static_cast<double>(max_exact)), loc), loc),
               dsl::scalar(rpf, std::log(static_cast<double>(b.max_distance) /
                                         static_cast<double>(max_exact))),
               loc),
      dsl::scalar(rpf, static_cast<double>(nb - max_exact)), loc);
  Tensor large = dsl::add(dsl::cast(scaled, DType::i64, loc),
                          dsl::scalar(rp, static_cast<double>(max_exact)), loc);
  large = dsl::minimum(large, dsl::scalar(large, static_cast<double>(nb - 1)), loc);
  Tensor r = dsl::select(is_small, rp, large, loc);
  return bucket.valid() ? dsl::add(bucket, r, loc) : r;
}

}  // namespace

Tensor T5RelativeBias::operator()(Tensor query_pos, Tensor key_pos, Loc loc) const {
  FunctionBuilder& fb = fb_of(query_pos, loc);
  PathScope scope(fb, prefix);
  check(key_pos.valid() && key_pos.builder() == &fb && query_pos.rank() == 2 &&
            key_pos.rank() == 2 && query_pos.dtype() == DType::i64 && key_pos.dtype() == DType::i64,
        fb, loc, "positions {} and {}: expected i64 [N, Lq] and i64 [N or 1, Lk]",
        ir::to_string(query_pos.type()),
        key_pos.valid() ? ir::to_string(key_pos.type()) : "an empty tensor");
  const Dim one = Dim::constant(1);
  // relative_position = memory_position - context_position: [N', Lq, Lk].
  Tensor rp =
      dsl::sub(dsl::reshape(key_pos, {key_pos.dim(0), one, key_pos.dim(1)}, loc),
               dsl::reshape(query_pos, {query_pos.dim(0), query_pos.dim(1), one}, loc), loc);
  Tensor values = dsl::gather(fb.weight(prefix + ".weight", {buckets, heads}, loc),
                              t5_bucket(*this, fb, rp, loc), loc);  // [N', Lq, Lk, H]
  return dsl::transpose(values, {0, 3, 1, 2}, loc);
}

Tensor T5RelativeBias::operator()(FunctionBuilder& fb, Dim Lq, Dim Lk, Loc loc) const {
  PathScope scope(fb, prefix);
  // relative_position = memory_position - context_position = j - i.
  Tensor i = dsl::iota(fb, DType::i64, {Lq, Lk}, 0, loc);
  Tensor j = dsl::iota(fb, DType::i64, {Lq, Lk}, 1, loc);
  Tensor b = t5_bucket(*this, fb, dsl::sub(j, i, loc), loc);
  // relative_attention_bias(bucket): [Lq, Lk, H], permute([2, 0, 1]).unsqueeze(0).
  Tensor values = dsl::gather(fb.weight(prefix + ".weight", {buckets, heads}, loc), b, loc);
  Tensor bhl = dsl::transpose(values, {2, 0, 1}, loc);
  return dsl::reshape(bhl, {Dim::constant(1), Dim::constant(heads), Lq, Lk}, loc);
}

Tensor alibi_slopes(FunctionBuilder& fb, int64_t heads, Loc loc) {
  check(heads >= 1, fb, loc, "alibi: heads = {}, expected a positive head count", heads);
  int64_t cp = 1;  // closest power of two at most heads
  while (cp * 2 <= heads) cp *= 2;
  const double ln2 = std::log(2.0);
  // base^(1..cp) with base = 2^(-8/cp), then extra_base^(1, 3, ...) with extra_base =
  // 2^(-4/cp): exp(power · log(base)).
  auto powers = [&](int64_t n, double first, double step, double log_base) {
    Tensor k = dsl::cast(dsl::iota(fb, DType::i64, {Dim::constant(n)}, 0, loc), DType::f32, loc);
    Tensor p = dsl::add(dsl::mul(k, dsl::scalar(k, step), loc), dsl::scalar(k, first), loc);
    return dsl::exp(dsl::mul(p, dsl::scalar(p, log_base), loc), loc);
  };
  Tensor slopes = powers(cp, 1, 1, -8.0 / static_cast<double>(cp) * ln2);
  if (cp != heads) {
    const int64_t extra = std::min(cp, heads - cp);
    slopes =
        dsl::concat({slopes, powers(extra, 1, 2, -4.0 / static_cast<double>(cp) * ln2)}, 0, loc);
  }
  return slopes;
}

Tensor alibi_bias(FunctionBuilder& fb, int64_t heads, Dim Lq, Dim Lk, bool relative, Loc loc) {
  const Dim one = Dim::constant(1), H = Dim::constant(heads);
  Tensor slopes = dsl::reshape(alibi_slopes(fb, heads, loc), {one, H, one, one}, loc);
  Tensor dist;
  if (relative) {
    Tensor i = dsl::iota(fb, DType::i64, {Lq, Lk}, 0, loc);
    Tensor j = dsl::iota(fb, DType::i64, {Lq, Lk}, 1, loc);
    dist = dsl::cast(dsl::sub(j, i, loc), DType::f32, loc);  // [Lq, Lk]
  } else {
    dist = dsl::cast(dsl::iota(fb, DType::i64, {one, Lk}, 1, loc), DType::f32, loc);  // [1, Lk]
  }
  return dsl::mul(slopes, dist, loc);
}

Tensor alibi_bias(Tensor query_pos, Tensor key_pos, int64_t heads, Loc loc) {
  FunctionBuilder& fb = fb_of(query_pos, loc);
  check(key_pos.valid() && key_pos.builder() == &fb && query_pos.rank() == 2 &&
            key_pos.rank() == 2 && query_pos.dtype() == DType::i64 && key_pos.dtype() == DType::i64,
        fb, loc, "alibi: positions {} and {}: expected i64 [N, Lq] and i64 [N or 1, Lk]",
        ir::to_string(query_pos.type()),
        key_pos.valid() ? ir::to_string(key_pos.type()) : "an empty tensor");
  const Dim one = Dim::constant(1), H = Dim::constant(heads);
  Tensor slopes = dsl::reshape(alibi_slopes(fb, heads, loc), {one, H, one, one}, loc);
  Tensor rp = dsl::sub(dsl::reshape(key_pos, {key_pos.dim(0), one, key_pos.dim(1)}, loc),
                       dsl::reshape(query_pos, {query_pos.dim(0), query_pos.dim(1), one}, loc),
                       loc);  // [N', Lq, Lk]
  rp = dsl::reshape(dsl::cast(rp, DType::f32, loc), {rp.dim(0), one, rp.dim(1), rp.dim(2)}, loc);
  return dsl::mul(slopes, rp, loc);
}

Tensor sliding_window_mask(Tensor ids, int64_t window, Loc loc) {
  FunctionBuilder& fb = fb_of(ids, loc);
  check(ids.rank() == 2, fb, loc, "sliding_window_mask: ids are {}, expected [B, L]",
        ir::to_string(ids.type()));
  check_positive(fb, loc, "window", window);
  const Dim one = Dim::constant(1), L = ids.dim(1);
  Tensor row = dsl::iota(fb, DType::i64, {one, one, L, L}, 2, loc);
  Tensor col = dsl::iota(fb, DType::i64, {one, one, L, L}, 3, loc);
  Tensor far = dsl::ge(dsl::sub(row, col, loc), dsl::scalar(row, static_cast<double>(window)), loc);
  return dsl::logical_or(dsl::gt(col, row, loc), far, loc);
}

Tensor EncoderLayer::operator()(Tensor x, Tensor src_mask) const {
  const TransformerConfig& c = *cfg;
  return EncoderBlock{prefix, c.d_model, c.heads, c.d_ff}(x, src_mask);
}

Tensor DecoderLayer::operator()(Tensor x, Tensor memory, Tensor src_mask, Tensor tgt_mask) const {
  const TransformerConfig& c = *cfg;
  return DecoderBlock{prefix, c.d_model, c.heads, c.d_ff}(x, memory, src_mask, tgt_mask);
}

Tensor Encoder::operator()(Tensor x, Tensor src_mask) const {
  for (int64_t i = 0; i < cfg->enc_layers; ++i)
    x = EncoderLayer{"encoder.layers." + std::to_string(i), cfg}(x, src_mask);
  return LayerNorm{"encoder.norm", cfg->d_model}(x);
}

Tensor Decoder::operator()(Tensor x, Tensor memory, Tensor src_mask, Tensor tgt_mask) const {
  for (int64_t i = 0; i < cfg->dec_layers; ++i)
    x = DecoderLayer{"decoder.layers." + std::to_string(i), cfg}(x, memory, src_mask, tgt_mask);
  return LayerNorm{"decoder.norm", cfg->d_model}(x);
}

Tensor embed(const std::string& table, Tensor ids, const TransformerConfig& cfg, int64_t vocab) {
  FunctionBuilder& fb = *ids.builder();
  ScopeGuard scope(fb, table);
  Tensor e = dsl::gather(fb.weight(table + ".weight", {vocab, cfg.d_model}), ids);
  Tensor x =
      e * static_cast<double>(static_cast<float>(std::sqrt(static_cast<double>(cfg.d_model))));
  Tensor pe = dsl::slice(dsl::sinusoid_table(fb, cfg.max_len, cfg.d_model), 0, 0, ids.dim(1));
  return x + pe;
}

Tensor key_padding_mask(Tensor ids, int64_t pad_id, Loc loc) {
  Tensor pad = padding_mask(ids, pad_id, loc);
  return dsl::reshape(pad, {ids.dim(0), Dim::constant(1), Dim::constant(1), ids.dim(1)}, loc);
}

Tensor causal_padding_mask(Tensor ids, int64_t pad_id, Loc loc) {
  FunctionBuilder& fb = fb_of(ids, loc);
  const Dim L = ids.dim(1);
  Tensor row = dsl::iota(fb, DType::i64, {L, L}, 0, loc);
  Tensor col = dsl::iota(fb, DType::i64, {L, L}, 1, loc);
  return dsl::logical_or(key_padding_mask(ids, pad_id, loc), dsl::gt(col, row, loc), loc);
}

namespace {

// One decoder layer of the paper's Transformer, written once against the decoding context
// (seq2seq.h): post-norm self-attention (cached), cross-attention to the encoder output and
// the feed-forward network. q, k, v in that order, so that merge-projections merges them alike
// in every entry point.
Tensor decoder_layer(Decoding& ctx, const TransformerConfig& c, int64_t l, Tensor x) {
  const std::string p = "decoder.layers." + std::to_string(l);
  ScopeGuard scope(*x.builder(), p);
  auto proj = [&](const std::string& name) { return Linear{p + name, c.d_model, c.d_model}; };
  const AttentionSpec spec{.heads = c.heads};
  Tensor q = proj(".self_attn.w_q")(x), k = proj(".self_attn.w_k")(x);
  Tensor a = ctx.attention(q, k, proj(".self_attn.w_v")(x), spec);
  x = LayerNorm{p + ".norm1", c.d_model}(x + proj(".self_attn.w_o")(a));
  Tensor m = ctx.cross_attention(proj(".cross_attn.w_q")(x), proj(".cross_attn.w_k"),
                                 proj(".cross_attn.w_v"), spec);
  x = LayerNorm{p + ".norm2", c.d_model}(x + proj(".cross_attn.w_o")(m));
  return LayerNorm{p + ".norm3", c.d_model}(x + FeedForward{p + ".ffn", c.d_model, c.d_ff}(x));
}

}  // namespace

ir::Module build_transformer(const TransformerConfig& c) {
  auto positive = [](const char* key, int64_t v) {
    if (v < 1) fail("config '{}' is {}, expected a positive integer", key, v);
  };
  positive("src_vocab", c.src_vocab);
  positive("tgt_vocab", c.tgt_vocab);
  positive("d_model", c.d_model);
  positive("heads", c.heads);
  positive("d_ff", c.d_ff);
  positive("max_len", c.max_len);
  positive("max_batch", c.max_batch);
  positive("max_beam", c.max_beam);
  for (auto [key, v] : {std::pair{"bos_id", c.bos_id}, {"eos_id", c.eos_id}})
    if (v < 0 || v >= c.tgt_vocab)
      fail("config '{}' = {} is outside the target vocabulary [0, {})", key, v, c.tgt_vocab);
  if (c.enc_layers < 0 || c.dec_layers < 0) fail("config layer counts must not be negative");
  // The IR grows with the layer count (sizes are bounded by the verifier's 2^48 bytes per
  // tensor): refuse an absurd count before building it.
  constexpr int64_t kMaxLayers = 1000;
  for (auto [key, v] : {std::pair{"enc_layers", c.enc_layers}, {"dec_layers", c.dec_layers}})
    if (v > kMaxLayers) fail("config '{}' is {}, above the limit of {} layers", key, v, kMaxLayers);
  // So are absurd sizes, before anything is built or allocated: each of the largest tensors
  // (f32, at the symbols' maxima) must fit in 2^40 bytes, plan-memory's limit on an arena.
  constexpr int64_t kMaxTensorBytes = int64_t{1} << 40;
  const std::pair<const char*, std::vector<int64_t>> largest[] = {
      {"'max_batch' * 'max_len' * 'tgt_vocab'", {c.max_batch, c.max_len, c.tgt_vocab}},
      {"'max_batch' * 'max_beam' * 'tgt_vocab'", {c.max_batch, c.max_beam, c.tgt_vocab}},
      {"'max_batch' * 'heads' * 'max_len'^2", {c.max_batch, c.heads, c.max_len, c.max_len}},
      {"'max_batch' * 'max_len' * 'd_ff'", {c.max_batch, c.max_len, c.d_ff}},
      {"'max_batch' * 'max_beam' * 'max_len' * 'd_model'",
       {c.max_batch, c.max_beam, c.max_len, c.d_model}},
      {"'src_vocab' * 'd_model'", {c.src_vocab, c.d_model}},
      {"'tgt_vocab' * 'd_model'", {c.tgt_vocab, c.d_model}},
      {"'d_ff' * 'd_model'", {c.d_ff, c.d_model}},
      {"'d_model'^2", {c.d_model, c.d_model}}};
  for (const auto& [keys, values] : largest) {
    int64_t bytes = 4;
    bool over = false;
    std::string product;
    for (int64_t v : values) {
      over = over || __builtin_mul_overflow(bytes, v, &bytes) || bytes > kMaxTensorBytes;
      product += (product.empty() ? "" : " * ") + std::to_string(v);
    }
    if (over)
      fail("config {} = {} values of 4 bytes: a tensor above the limit of {} bytes", keys, product,
           kMaxTensorBytes);
  }
  if (c.d_model % c.heads != 0)
    fail("config 'd_model' = {} is not divisible by 'heads' = {}", c.d_model, c.heads);
  if (c.pad_id < 0 || c.pad_id >= c.src_vocab || c.pad_id >= c.tgt_vocab)
    fail("config 'pad_id' = {} is outside the vocabularies [0, {}) and [0, {})", c.pad_id,
         c.src_vocab, c.tgt_vocab);

  dsl::ModelBuilder mb("transformer");
  const std::pair<const char*, int64_t> keys[] = {
      {"src_vocab", c.src_vocab},   {"tgt_vocab", c.tgt_vocab}, {"d_model", c.d_model},
      {"heads", c.heads},           {"d_ff", c.d_ff},           {"enc_layers", c.enc_layers},
      {"dec_layers", c.dec_layers}, {"pad_id", c.pad_id},       {"max_len", c.max_len},
      {"max_batch", c.max_batch},   {"max_beam", c.max_beam},   {"bos_id", c.bos_id},
      {"eos_id", c.eos_id}};
  for (const auto& [k, v] : keys) mb.set_config(k, std::to_string(v));

  // forward, encode, prepare and decode_step, derived from the layers written once.
  Seq2SeqConfig s2s{.vocab = c.tgt_vocab,
                    .max_len = c.max_len,
                    .max_src_len = c.max_len,
                    .max_batch = c.max_batch,
                    .max_beam = c.max_beam,
                    .bos_id = c.bos_id,
                    .eos_id = c.eos_id,
                    .pad_id = c.pad_id,
                    .mask_target_padding = true};
  add_seq2seq(
      mb, s2s,
      [&](Tensor src) {
        return Encoder{&c}(embed("src_embed", src, c, c.src_vocab),
                           key_padding_mask(src, c.pad_id));
      },
      [&](Decoding& ctx, Tensor tgt) {
        FunctionBuilder& f = *tgt.builder();
        Tensor x;
        {  // emb(tgt) * sqrt(d_model) + PE[position]
          ScopeGuard scope(f, "tgt_embed");
          Tensor e = dsl::gather(f.weight("tgt_embed.weight", {c.tgt_vocab, c.d_model}), tgt);
          x = e *
              static_cast<double>(static_cast<float>(std::sqrt(static_cast<double>(c.d_model))));
          Tensor table = dsl::sinusoid_table(f, c.max_len, c.d_model);
          // forward: positions 0..T-1, the table's first rows; a step: row pos.
          x = x + (ctx.mode() == Decoding::Mode::forward ? dsl::slice(table, 0, 0, tgt.dim(1))
                                                         : dsl::gather(table, ctx.positions()));
        }
        for (int64_t l = 0; l < c.dec_layers; ++l) x = decoder_layer(ctx, c, l, x);
        return LayerNorm{"decoder.norm", c.d_model}(x);
      },
      [&](Tensor h) {
        return Linear{"generator", c.d_model, c.tgt_vocab}(h);
      });
  return mb.finish();
}

}  // namespace kiln::nn
