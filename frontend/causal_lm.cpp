// The entry points of a decoder-only model derived from the user's layers (causal_lm.h).
#include "frontend/causal_lm.h"

#include <cmath>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "support/error.h"

namespace kiln::nn {

using dsl::DType;
using dsl::FunctionBuilder;
using dsl::Tensor;
using ir::Dim;

namespace {

std::string where(const dsl::Loc& loc) {
  const char* slash = std::strrchr(loc.file_name(), '/');
  return fmt::format("{}:{}", slash ? slash + 1 : loc.file_name(), loc.line());
}

// The head split of the fused attention's pattern: [N, L, H·d] -> [N, H, L, d] (or, for keys,
// [N, H, d, L]).
Tensor heads_of(Tensor x, int64_t heads, bool keys, const dsl::Loc& loc) {
  const int64_t d = x.dim(2).value / heads;
  Tensor r = dsl::reshape(x, {x.dim(0), x.dim(1), Dim::constant(heads), Dim::constant(d)}, loc);
  return dsl::transpose(
      r, keys ? std::vector<int64_t>{0, 2, 3, 1} : std::vector<int64_t>{0, 2, 1, 3}, loc);
}

// Key/value heads in head layout [N, G, L, d] repeated for grouped-query attention, as Hugging
// Face's repeat_kv writes it: x[:, :, None].expand(N, G, rep, L, d).reshape(N, G·rep, L, d)
// (fuse-attention folds it into the attention's kv_heads).
Tensor repeat_kv(Tensor x, int64_t rep, const dsl::Loc& loc) {
  if (rep == 1) return x;
  const Dim N = x.dim(0), G = x.dim(1), L = x.dim(2), d = x.dim(3);
  Tensor e = dsl::reshape(x, {N, G, Dim::constant(1), L, d}, loc);
  e = dsl::expand(e, {N, G, Dim::constant(rep), L, d}, loc);
  return dsl::reshape(e, {N, Dim::constant(G.value * rep), L, d}, loc);
}

}  // namespace

Tensor Decoding::attention(Tensor q, Tensor k, Tensor v, const AttentionSpec& spec, dsl::Loc loc) {
  FunctionBuilder& fb = *fb_;
  const int64_t layer = static_cast<int64_t>(updated_.size() / 2);
  dsl::ScopeGuard scope(fb, fmt::format("attention {}", layer));
  auto check = [&](bool ok, const std::string& message) {
    if (!ok) fb.error(loc, message);
  };
  for (const Tensor* t : {&q, &k, &v})
    check(t->valid() && t->builder() == &fb && t->rank() == 3 && t->dtype() == DType::f32 &&
              !t->dim(2).is_symbolic(),
          fmt::format("q, k and v must be f32 [N, L, features] of this function, got {}",
                      t->valid() ? ir::to_string(t->type()) : "an empty tensor"));
  const int64_t heads = spec.heads, groups = spec.kv_heads ? spec.kv_heads : spec.heads;
  check(heads >= 1 && groups >= 1 && heads % groups == 0,
        fmt::format("heads = {} and kv_heads = {}: kv_heads must divide heads", heads, groups));
  check(q.dim(2).value % heads == 0 && k.dim(2).value % groups == 0 &&
            v.dim(2).value % groups == 0 && q.dim(2).value / heads == k.dim(2).value / groups,
        fmt::format("q {} with {} heads and k {}, v {} with {} key/value heads do not agree",
                    ir::to_string(q.type()), heads, ir::to_string(k.type()),
                    ir::to_string(v.type()), groups));
  check(spec.window >= 0, fmt::format("window = {} must be 0 (none) or positive", spec.window));
  const int64_t dk = q.dim(2).value / heads, dv = v.dim(2).value / groups;
  const double scale = spec.scale != 0 ? spec.scale : 1.0 / std::sqrt(static_cast<double>(dk));

  if (mode_ == Mode::step) {
    Tensor kc = fb.input(fmt::format("cache_k{}", layer), DType::f32,
                         {T_, C_, Dim::constant(groups * dk)}, loc);
    Tensor vc = fb.input(fmt::format("cache_v{}", layer), DType::f32,
                         {T_, C_, Dim::constant(groups * dv)}, loc);
    kc = dsl::cache_write(kc, k, pos_, loc);
    vc = dsl::cache_write(vc, v, pos_, loc);
    updated_.push_back(kc);
    updated_.push_back(vc);
    ir::Attrs attrs{{"heads", heads}, {"scale", scale}};
    if (groups != heads) attrs["kv_heads"] = groups;
    if (spec.window > 0) attrs["window"] = spec.window;
    return fb.emit(ir::OpKind::cache_attention, {q, kc, vc, rows_}, attrs, nullptr, loc);
  }
  if (mode_ == Mode::prefill) {
    Tensor kc = fb.input(fmt::format("cache_k{}", layer), DType::f32,
                         {T_, C_, Dim::constant(groups * dk)}, loc);
    Tensor vc = fb.input(fmt::format("cache_v{}", layer), DType::f32,
                         {T_, C_, Dim::constant(groups * dv)}, loc);
    updated_.push_back(dsl::cache_write(kc, k, loc));
    updated_.push_back(dsl::cache_write(vc, v, loc));
  } else {
    updated_.push_back(Tensor());  // counts the layer
    updated_.push_back(Tensor());
  }
  // The fused attention's pattern (passes/fuse_attention.h): causal, with the prompt's
  // padding as key padding in prefill.
  const Dim N = q.dim(0), L = q.dim(1);
  Tensor qh = heads_of(q, heads, false, loc);
  Tensor kt, vh;
  if (groups == heads) {  // the paper's head split: keys straight to [N, H, d, L]
    kt = heads_of(k, heads, true, loc);
    vh = heads_of(v, heads, false, loc);
  } else {  // grouped-query: split the G heads, repeat them, then keys to [N, H, d, L]
    kt = dsl::transpose(repeat_kv(heads_of(k, groups, false, loc), heads / groups, loc),
                        {0, 1, 3, 2}, loc);
    vh = repeat_kv(heads_of(v, groups, false, loc), heads / groups, loc);
  }
  Tensor s = dsl::matmul(qh, kt, loc);
  s = dsl::mul(s, dsl::scalar(s, scale), loc);
  const Dim one = Dim::constant(1);
  Tensor i = dsl::iota(fb, DType::i64, {one, one, L, L}, 2, loc);
  Tensor j = dsl::iota(fb, DType::i64, {one, one, L, L}, 3, loc);
  Tensor mask = dsl::gt(j, i, loc);
  if (spec.window > 0)
    mask = dsl::logical_or(mask, dsl::ge(i - j, dsl::scalar(i, static_cast<double>(spec.window))),
                           loc);
  if (key_pad_.valid())
    mask = dsl::logical_or(dsl::reshape(key_pad_, {N, one, one, L}, loc), mask, loc);
  s = dsl::select(mask, dsl::scalar(s, -1e9), s, loc);
  Tensor p = dsl::softmax(s, -1, loc);
  Tensor o = dsl::transpose(dsl::matmul(p, vh, loc), {0, 2, 1, 3}, loc);
  return dsl::reshape(o, {N, L, Dim::constant(heads * dv)}, loc);
}

void add_causal_lm(dsl::ModelBuilder& mb, const CausalLMConfig& c,
                   const std::function<Tensor(Decoding&, Tensor)>& body,
                   const std::function<Tensor(Tensor)>& head, dsl::Loc loc) {
  auto positive = [&](const char* key, int64_t v) {
    if (v < 1)
      fail("dsl error at {}: add_causal_lm: config '{}' is {}, expected a positive integer",
           where(loc), key, v);
  };
  positive("vocab", c.vocab);
  positive("max_len", c.max_len);
  positive("max_batch", c.max_batch);
  positive("max_beam", c.max_beam);
  for (auto [key, id] : {std::pair{"bos_id", c.bos_id}, {"eos_id", c.eos_id}, {"pad_id", c.pad_id}})
    if (id < -1 || id >= c.vocab)
      fail(
          "dsl error at {}: add_causal_lm: config '{}' is {}, expected -1 (none) or a token id "
          "below vocab {}",
          where(loc), key, id, c.vocab);
  const Dim B = mb.symbol("B", c.max_batch), T = mb.symbol("T", c.max_len);
  const Dim N = mb.symbol("N", c.max_batch * c.max_beam),
            C = mb.symbol("C", c.max_batch * c.max_beam);
  const Dim L = mb.symbol("L", c.max_len), P = mb.symbol("P", c.max_len);
  mb.set_config("generation", "causal_lm");
  mb.set_config("vocab", std::to_string(c.vocab));
  mb.set_config("max_len", std::to_string(c.max_len));
  mb.set_config("max_batch", std::to_string(c.max_batch));
  mb.set_config("max_beam", std::to_string(c.max_beam));
  if (c.bos_id >= 0) mb.set_config("bos_id", std::to_string(c.bos_id));
  if (c.eos_id >= 0) mb.set_config("eos_id", std::to_string(c.eos_id));
  if (c.pad_id >= 0) mb.set_config("pad_id", std::to_string(c.pad_id));

  auto logits_of = [&](FunctionBuilder& f, Tensor h) {
    Tensor logits = head(h);
    if (!logits.valid() || logits.builder() != &f || logits.rank() != 3 ||
        !logits.dim(2).is_const(c.vocab))
      fail(
          "dsl error at {}: add_causal_lm: the head must give logits f32[..., {}] of the "
          "hidden state it is given, got {}",
          where(loc), c.vocab, logits.valid() ? ir::to_string(logits.type()) : "an empty tensor");
    return logits;
  };
  auto hidden_of = [&](Decoding& ctx, FunctionBuilder& f, Tensor ids, const char* fname) {
    Tensor h = body(ctx, ids);
    if (!h.valid() || h.builder() != &f || h.rank() != 3 || !(h.dim(0) == ids.dim(0)) ||
        !(h.dim(1) == ids.dim(1)))
      fail(
          "dsl error at {}: add_causal_lm: the body must give a hidden state [N, L, D] of its "
          "ids {} in '{}', got {}",
          where(loc), ir::to_string(ids.type()), fname,
          h.valid() ? ir::to_string(h.type()) : "an empty tensor");
    if (ctx.updated_.empty())
      fail("dsl error at {}: add_causal_lm: the body calls no ctx.attention(): nothing to cache",
           where(loc));
    return h;
  };
  const Dim one = Dim::constant(1);
  size_t layers = 0;
  {  // forward
    FunctionBuilder& f = mb.function("forward");
    Decoding ctx;
    ctx.mode_ = Decoding::Mode::forward;
    ctx.fb_ = &f;
    Tensor ids = f.input("ids", DType::i64, {B, T});
    ctx.positions_ = dsl::iota(f, DType::i64, {B, T}, 1);
    f.output(logits_of(f, hidden_of(ctx, f, ids, "forward")), "logits");
    layers = ctx.updated_.size();
  }
  auto same_layers = [&](const Decoding& ctx, const char* fname) {
    if (ctx.updated_.size() != layers)
      fail(
          "dsl error at {}: add_causal_lm: the body calls ctx.attention() {} times in '{}' "
          "and {} times in 'forward'",
          where(loc), ctx.updated_.size() / 2, fname, layers / 2);
  };
  {  // prefill
    FunctionBuilder& f = mb.function("prefill");
    Decoding ctx;
    ctx.mode_ = Decoding::Mode::prefill;
    ctx.fb_ = &f;
    ctx.T_ = T;
    ctx.C_ = C;
    Tensor ids = f.input("ids", DType::i64, {N, L});
    Tensor start = dsl::reshape(f.input("start", DType::i64, {N}), {N, one});
    Tensor j = dsl::iota(f, DType::i64, {N, L}, 1);
    ctx.key_pad_ = dsl::lt(j, start);
    ctx.positions_ = dsl::maximum(j - start, dsl::scalar(j, 0));
    Tensor h = hidden_of(ctx, f, ids, "prefill");
    same_layers(ctx, "prefill");
    // The last position's hidden state [N, 1, D] (L is symbolic: selected, not sliced).
    Tensor at = dsl::iota(f, DType::i64, {one, L, one}, 1);
    Tensor last = dsl::eq(at, dsl::reduce_max(at, {1}, true));
    Tensor h_last = dsl::reduce_sum(dsl::select(last, h, dsl::scalar(h, 0)), {1}, true);
    f.output(logits_of(f, h_last), "logits");
    for (size_t i = 0; i < ctx.updated_.size(); ++i)
      f.output(ctx.updated_[i], fmt::format("cache_{}{}_out", i % 2 ? 'v' : 'k', i / 2));
  }
  {  // decode_step
    FunctionBuilder& f = mb.function("decode_step");
    Decoding ctx;
    ctx.mode_ = Decoding::Mode::step;
    ctx.fb_ = &f;
    ctx.T_ = T;
    ctx.C_ = C;
    Tensor tok = f.input("tok", DType::i64, {N, one});
    ctx.pos_ = f.input("pos", DType::i64, {one});
    ctx.rows_ = f.input("rows", DType::i64, {N, P});
    Tensor start = dsl::reshape(f.input("start", DType::i64, {N}), {N, one});
    ctx.positions_ = dsl::reshape(ctx.pos_, {one, one}) - start;
    Tensor h = hidden_of(ctx, f, tok, "decode_step");
    same_layers(ctx, "decode_step");
    f.output(logits_of(f, h), "logits");
    std::string widths;
    for (size_t i = 0; i < ctx.updated_.size(); ++i) {
      f.output(ctx.updated_[i], fmt::format("cache_{}{}_out", i % 2 ? 'v' : 'k', i / 2));
      widths += fmt::format("{}{}", i ? "," : "", ctx.updated_[i].dim(2).value);
    }
    // What kiln_generate allocates: each cache's last dim, in decode_step's order.
    mb.set_config("cache_widths", widths);
  }
}

}  // namespace kiln::nn
