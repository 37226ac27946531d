// The entry points derived from the user's layers: a decoder-only model's (causal_lm.h) and an
// encoder–decoder's (seq2seq.h).
#include "frontend/causal_lm.h"

#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "frontend/seq2seq.h"
#include "ir/dead_code.h"
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

// The pattern fuse-attention turns into one attention op (passes/fuse_attention.h): q [N, Lq,
// H·dk] against k [N, Lk, G·dk] and v [N, Lk, G·dv]; scores scaled (unless scale is 1), plus
// `bias`, -1e9 where `mask` (bool, broadcasting to [N, H, Lq, Lk]) is true; softmax;
// [N, Lq, H·dv].
Tensor attend(Tensor q, Tensor k, Tensor v, int64_t heads, int64_t groups, double scale,
              const Tensor& bias, const Tensor& mask, const dsl::Loc& loc) {
  const Dim N = q.dim(0), Lq = q.dim(1);
  const int64_t dv = v.dim(2).value / groups;
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
  if (scale != 1.0) s = dsl::mul(s, dsl::scalar(s, scale), loc);
  if (bias.valid()) s = dsl::add(s, bias, loc);
  if (mask.valid()) s = dsl::select(mask, dsl::scalar(s, -1e9), s, loc);
  Tensor p = dsl::softmax(s, -1, loc);
  Tensor o = dsl::transpose(dsl::matmul(p, vh, loc), {0, 2, 1, 3}, loc);
  return dsl::reshape(o, {N, Lq, Dim::constant(heads * dv)}, loc);
}

std::string type_of(const Tensor& t) {
  return t.valid() ? ir::to_string(t.type()) : "an empty tensor";
}

}  // namespace

// What add_causal_lm and add_seq2seq share: the config checks, the body's runs and the caches
// declared from what forward's run recorded.
struct DecodingBuilder {
  const char* what;  // "add_causal_lm" or "add_seq2seq"
  dsl::Loc loc;
  std::vector<int64_t> cache_widths, memory_widths;  // recorded by forward's run

  template <typename... Args>
  [[noreturn]] void error(fmt::format_string<Args...> format, Args&&... args) const {
    fail("dsl error at {}: {}: {}", where(loc), what,
         fmt::format(format, std::forward<Args>(args)...));
  }
  void positive(const char* key, int64_t v) const {
    if (v < 1) error("config '{}' is {}, expected a positive integer", key, v);
  }
  void token(const char* key, int64_t id, int64_t vocab, bool optional) const {
    if (id < (optional ? -1 : 0) || id >= vocab)
      error("config '{}' is {}, expected {}a token id below vocab {}", key, id,
            optional ? "-1 (none) or " : "", vocab);
  }

  static Decoding context(FunctionBuilder& f, Decoding::Mode mode, bool seq2seq) {
    Decoding ctx;
    ctx.mode_ = mode;
    ctx.fb_ = &f;
    ctx.seq2seq_ = seq2seq;
    return ctx;
  }

  // The body's hidden state of `ids`, checked; forward's run records the caches' widths, the
  // others must make the same calls.
  Tensor hidden(Decoding& ctx, const std::function<Tensor(Decoding&, Tensor)>& body, Tensor ids,
                const char* fname) {
    FunctionBuilder& f = *ctx.fb_;
    Tensor h = body(ctx, ids);
    if (!h.valid() || h.builder() != &f || h.rank() != 3 || !(h.dim(0) == ids.dim(0)) ||
        !(h.dim(1) == ids.dim(1)))
      error("the body must give a hidden state [N, L, D] of its ids {} in '{}', got {}",
            ir::to_string(ids.type()), fname, type_of(h));
    if (ctx.updated_.empty()) error("the body calls no ctx.attention(): nothing to cache");
    if (ctx.mode_ == Decoding::Mode::forward) {
      cache_widths = ctx.cache_widths_;
      memory_widths = ctx.memory_widths_;
    } else if (ctx.updated_.size() != cache_widths.size() ||
               ctx.cross_calls_ != memory_widths.size() / 2) {
      error(
          "the body calls ctx.attention() {} and ctx.cross_attention() {} times in '{}', but {} "
          "and {} times in 'forward'",
          ctx.updated_.size() / 2, ctx.cross_calls_, fname, cache_widths.size() / 2,
          memory_widths.size() / 2);
    }
    return h;
  }

  Tensor logits(FunctionBuilder& f, const std::function<Tensor(Tensor)>& head, Tensor h,
                int64_t vocab) const {
    Tensor out = head(h);
    if (!out.valid() || out.builder() != &f || out.rank() != 3 || !out.dim(2).is_const(vocab))
      error("the head must give logits f32[..., {}] of the hidden state it is given, got {}", vocab,
            type_of(out));
    return out;
  }

  // What forward recorded, for the other runs to check against; with `declare`, every
  // layer's caches cache_k<l>, cache_v<l> [T, C, width], declared before the body runs.
  void declare_caches(Decoding& ctx, const Dim& T, const Dim& C, bool declare = true) const {
    ctx.T_ = T;
    ctx.C_ = C;
    for (size_t i = 0; declare && i < cache_widths.size(); ++i)
      ctx.cache_in_.push_back(ctx.fb_->input(fmt::format("cache_{}{}", i % 2 ? 'v' : 'k', i / 2),
                                             DType::f32, {T, C, Dim::constant(cache_widths[i])},
                                             loc));
    ctx.cache_widths_ = cache_widths;
    ctx.memory_widths_ = memory_widths;
  }
  // The written caches as the function's outputs cache_k<l>_out, cache_v<l>_out.
  static void output_caches(const Decoding& ctx) {
    for (size_t i = 0; i < ctx.updated_.size(); ++i)
      ctx.fb_->output(ctx.updated_[i], fmt::format("cache_{}{}_out", i % 2 ? 'v' : 'k', i / 2));
  }
  std::string widths() const {
    std::string s;
    for (size_t i = 0; i < cache_widths.size(); ++i)
      s += fmt::format("{}{}", i ? "," : "", cache_widths[i]);
    return s;
  }
};

Tensor Decoding::attention(Tensor q, Tensor k, Tensor v, const AttentionSpec& spec, dsl::Loc loc) {
  FunctionBuilder& fb = *fb_;
  const size_t layer = updated_.size() / 2;
  dsl::ScopeGuard scope(fb, fmt::format("attention {}", layer));
  auto check = [&](bool ok, const std::string& message) {
    if (!ok) fb.error(loc, message);
  };
  for (const Tensor* t : {&q, &k, &v})
    check(t->valid() && t->builder() == &fb && t->rank() == 3 && t->dtype() == DType::f32 &&
              !t->dim(2).is_symbolic(),
          fmt::format("q, k and v must be f32 [N, L, features] of this function, got {}",
                      type_of(*t)));
  const int64_t heads = spec.heads, groups = spec.kv_heads ? spec.kv_heads : spec.heads;
  check(heads >= 1 && groups >= 1 && heads % groups == 0,
        fmt::format("heads = {} and kv_heads = {}: kv_heads must divide heads", heads, groups));
  check(q.dim(2).value % heads == 0 && k.dim(2).value % groups == 0 &&
            v.dim(2).value % groups == 0 && q.dim(2).value / heads == k.dim(2).value / groups,
        fmt::format("q {} with {} heads and k {}, v {} with {} key/value heads do not agree",
                    ir::to_string(q.type()), heads, ir::to_string(k.type()),
                    ir::to_string(v.type()), groups));
  check(spec.window >= 0, fmt::format("window = {} must be 0 (none) or positive", spec.window));
  check(!spec.bias.valid() || (spec.bias.builder() == &fb && spec.bias.rank() == 4 &&
                               spec.bias.dtype() == DType::f32),
        fmt::format("the score bias must be f32 [N or 1, heads or 1, Lq, Lk] of this function, "
                    "got {}",
                    type_of(spec.bias)));
  const int64_t dk = q.dim(2).value / heads, dv = v.dim(2).value / groups;
  const double scale = spec.scale != 0 ? spec.scale : 1.0 / std::sqrt(static_cast<double>(dk));
  if (mode_ == Mode::forward) {
    cache_widths_.push_back(groups * dk);
    cache_widths_.push_back(groups * dv);
  } else {
    check(2 * layer + 1 < cache_widths_.size() && cache_widths_[2 * layer] == groups * dk &&
              cache_widths_[2 * layer + 1] == groups * dv,
          fmt::format("this call's keys and values ({} and {} wide) differ from forward's call "
                      "{} of ctx.attention()",
                      groups * dk, groups * dv, layer));
  }

  if (mode_ == Mode::step) {
    Tensor kc = dsl::cache_write(cache_in_[2 * layer], k, pos_, loc);
    Tensor vc = dsl::cache_write(cache_in_[2 * layer + 1], v, pos_, loc);
    updated_.push_back(kc);
    updated_.push_back(vc);
    ir::Attrs attrs{{"heads", heads}, {"scale", scale}};
    if (groups != heads) attrs["kv_heads"] = groups;
    if (spec.window > 0) attrs["window"] = spec.window;
    std::vector<Tensor> operands = {q, kc, vc, rows_};
    if (spec.bias.valid()) operands.push_back(spec.bias);
    return fb.emit(ir::OpKind::cache_attention, operands, attrs, nullptr, loc);
  }
  if (mode_ == Mode::prefill) {
    updated_.push_back(dsl::cache_write(cache_in_[2 * layer], k, loc));
    updated_.push_back(dsl::cache_write(cache_in_[2 * layer + 1], v, loc));
  } else {
    updated_.push_back(Tensor());  // counts the layer
    updated_.push_back(Tensor());
  }
  // The causal mask (and window, and the prompt's padding), built once per function and window.
  Tensor& mask = self_masks_[spec.window];
  if (!mask.valid()) {
    const Dim L = q.dim(1), one = Dim::constant(1);
    Tensor i = dsl::iota(fb, DType::i64, {one, one, L, L}, 2, loc);
    Tensor j = dsl::iota(fb, DType::i64, {one, one, L, L}, 3, loc);
    mask = dsl::gt(j, i, loc);
    if (spec.window > 0)
      mask = dsl::logical_or(mask, dsl::ge(i - j, dsl::scalar(i, static_cast<double>(spec.window))),
                             loc);
    if (key_pad_.valid())
      mask =
          dsl::logical_or(dsl::reshape(key_pad_, {key_pad_.dim(0), one, one, L}, loc), mask, loc);
  }
  return attend(q, k, v, heads, groups, scale, spec.bias, mask, loc);
}

Tensor Decoding::cross_attention(Tensor q, const std::function<Tensor(Tensor)>& key,
                                 const std::function<Tensor(Tensor)>& value,
                                 const AttentionSpec& spec, dsl::Loc loc) {
  FunctionBuilder& fb = *fb_;
  const size_t layer = cross_calls_++;
  dsl::ScopeGuard scope(fb, fmt::format("cross_attention {}", layer));
  auto check = [&](bool ok, const std::string& message) {
    if (!ok) fb.error(loc, message);
  };
  check(seq2seq_,
        "ctx.cross_attention() is for encoder–decoder models (nn::add_seq2seq); a decoder-only "
        "model has no encoder output to attend to");
  check(q.valid() && q.builder() == &fb && q.rank() == 3 && q.dtype() == DType::f32 &&
            !q.dim(2).is_symbolic(),
        fmt::format("q must be f32 [N, L, features] of this function, got {}", type_of(q)));
  const int64_t heads = spec.heads;
  check(heads >= 1 && (spec.kv_heads == 0 || spec.kv_heads == heads) && spec.window == 0 &&
            !spec.bias.valid(),
        fmt::format("heads = {} must be positive, and kv_heads ({}), window ({}) and bias ({}) "
                    "unset: the cross-attention's decoding kernel has none of them",
                    heads, spec.kv_heads, spec.window, spec.bias.valid() ? "set" : "unset"));
  check(q.dim(2).value % heads == 0,
        fmt::format("q {} does not split into {} heads", ir::to_string(q.type()), heads));
  const int64_t dk = q.dim(2).value / heads;
  const double scale = spec.scale != 0 ? spec.scale : 1.0 / std::sqrt(static_cast<double>(dk));
  if (mode_ == Mode::step) {
    check(2 * layer + 1 < memory_in_.size(),
          fmt::format("call {} of ctx.cross_attention() was not made in 'forward'", layer));
    Tensor mk = memory_in_[2 * layer], mv = memory_in_[2 * layer + 1];
    check(mk.dim(2).value == heads * dk,
          fmt::format("this call's q {} and forward's keys {} do not agree",
                      ir::to_string(q.type()), ir::to_string(mk.type())));
    return dsl::memory_attention(q, mk, mv, src_row_, src_pad_, heads, scale, loc);
  }
  Tensor k = key(memory_), v = value(memory_);
  for (const auto& [t, name] : {std::pair{&k, "key"}, {&v, "value"}})
    check(t->valid() && t->builder() == &fb && t->rank() == 3 && t->dtype() == DType::f32 &&
              t->dim(0) == memory_.dim(0) && t->dim(1) == memory_.dim(1) &&
              !t->dim(2).is_symbolic() && t->dim(2).value % heads == 0,
          fmt::format("{}(memory {}) must be f32 [B, S, heads·d] of this function, got {}", name,
                      ir::to_string(memory_.type()), type_of(*t)));
  check(k.dim(2).value == heads * dk,
        fmt::format("q {} and keys {} do not agree", ir::to_string(q.type()),
                    ir::to_string(k.type())));
  if (mode_ == Mode::forward) {
    memory_widths_.push_back(k.dim(2).value);
    memory_widths_.push_back(v.dim(2).value);
  } else if (mode_ == Mode::prepare) {
    memory_out_.push_back(k);
    memory_out_.push_back(v);
  }
  // The cross-attention's pattern: every query sees every source key but the padding.
  if (!cross_mask_.valid()) {
    const Dim one = Dim::constant(1);
    cross_mask_ = dsl::reshape(src_pad_, {src_pad_.dim(0), one, one, src_pad_.dim(1)}, loc);
  }
  return attend(q, k, v, heads, heads, scale, Tensor(), cross_mask_, loc);
}

void add_causal_lm(dsl::ModelBuilder& mb, const CausalLMConfig& c,
                   const std::function<Tensor(Decoding&, Tensor)>& body,
                   const std::function<Tensor(Tensor)>& head, dsl::Loc loc) {
  DecodingBuilder db{"add_causal_lm", loc, {}, {}};
  db.positive("vocab", c.vocab);
  db.positive("max_len", c.max_len);
  db.positive("max_batch", c.max_batch);
  db.positive("max_beam", c.max_beam);
  for (auto [key, id] : {std::pair{"bos_id", c.bos_id}, {"eos_id", c.eos_id}, {"pad_id", c.pad_id}})
    db.token(key, id, c.vocab, /*optional=*/true);
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

  const Dim one = Dim::constant(1);
  {  // forward
    FunctionBuilder& f = mb.function("forward");
    Decoding ctx = DecodingBuilder::context(f, Decoding::Mode::forward, false);
    Tensor ids = f.input("ids", DType::i64, {B, T});
    ctx.positions_ = dsl::iota(f, DType::i64, {B, T}, 1);
    ctx.key_positions_ = dsl::iota(f, DType::i64, {one, T}, 1);
    f.output(db.logits(f, head, db.hidden(ctx, body, ids, "forward"), c.vocab), "logits");
  }
  {  // prefill
    FunctionBuilder& f = mb.function("prefill");
    Decoding ctx = DecodingBuilder::context(f, Decoding::Mode::prefill, false);
    Tensor ids = f.input("ids", DType::i64, {N, L});
    Tensor start = dsl::reshape(f.input("start", DType::i64, {N}), {N, one});
    db.declare_caches(ctx, T, C);
    Tensor j = dsl::iota(f, DType::i64, {N, L}, 1);
    ctx.key_pad_ = dsl::lt(j, start);
    ctx.key_positions_ = j - start;
    ctx.positions_ = dsl::maximum(ctx.key_positions_, dsl::scalar(j, 0));
    Tensor h = db.hidden(ctx, body, ids, "prefill");
    // The last position's hidden state [N, 1, D] (L is symbolic: selected, not sliced).
    Tensor at = dsl::iota(f, DType::i64, {one, L, one}, 1);
    Tensor last = dsl::eq(at, dsl::reduce_max(at, {1}, true));
    Tensor h_last = dsl::reduce_sum(dsl::select(last, h, dsl::scalar(h, 0)), {1}, true);
    f.output(db.logits(f, head, h_last, c.vocab), "logits");
    DecodingBuilder::output_caches(ctx);
  }
  {  // decode_step
    FunctionBuilder& f = mb.function("decode_step");
    Decoding ctx = DecodingBuilder::context(f, Decoding::Mode::step, false);
    Tensor tok = f.input("tok", DType::i64, {N, one});
    ctx.pos_ = f.input("pos", DType::i64, {one});
    ctx.rows_ = f.input("rows", DType::i64, {N, P});
    Tensor start = dsl::reshape(f.input("start", DType::i64, {N}), {N, one});
    db.declare_caches(ctx, T, C);
    ctx.positions_ = dsl::reshape(ctx.pos_, {one, one}) - start;
    ctx.key_positions_ = dsl::iota(f, DType::i64, {one, P}, 1) - start;
    Tensor h = db.hidden(ctx, body, tok, "decode_step");
    f.output(db.logits(f, head, h, c.vocab), "logits");
    DecodingBuilder::output_caches(ctx);
  }
  // What kiln_generate allocates: each cache's last dim, in decode_step's order.
  mb.set_config("cache_widths", db.widths());
}

void add_seq2seq(dsl::ModelBuilder& mb, const Seq2SeqConfig& c,
                 const std::function<Tensor(Tensor)>& encoder,
                 const std::function<Tensor(Decoding&, Tensor)>& decoder,
                 const std::function<Tensor(Tensor)>& head, dsl::Loc loc) {
  DecodingBuilder db{"add_seq2seq", loc, {}, {}};
  db.positive("vocab", c.vocab);
  db.positive("max_len", c.max_len);
  db.positive("max_src_len", c.max_src_len);
  db.positive("max_batch", c.max_batch);
  db.positive("max_beam", c.max_beam);
  db.token("bos_id", c.bos_id, c.vocab, /*optional=*/false);
  db.token("eos_id", c.eos_id, c.vocab, /*optional=*/false);
  if (c.pad_id < 0) db.error("config 'pad_id' is {}, expected a token id", c.pad_id);
  const Dim B = mb.symbol("B", c.max_batch), S = mb.symbol("S", c.max_src_len),
            T = mb.symbol("T", c.max_len);
  const Dim N = mb.symbol("N", c.max_batch * c.max_beam), P = mb.symbol("P", c.max_len),
            C = mb.symbol("C", c.max_batch * c.max_beam);
  mb.set_config("generation", "seq2seq");
  mb.set_config("tgt_vocab", std::to_string(c.vocab));
  mb.set_config("max_len", std::to_string(c.max_len));
  mb.set_config("max_batch", std::to_string(c.max_batch));
  mb.set_config("max_beam", std::to_string(c.max_beam));
  mb.set_config("bos_id", std::to_string(c.bos_id));
  mb.set_config("eos_id", std::to_string(c.eos_id));
  mb.set_config("pad_id", std::to_string(c.pad_id));

  const Dim one = Dim::constant(1);
  auto memory_of = [&](FunctionBuilder& f, Tensor src) {
    Tensor m = encoder(src);
    if (!m.valid() || m.builder() != &f || m.rank() != 3 || m.dtype() != DType::f32 ||
        !(m.dim(0) == src.dim(0)) || !(m.dim(1) == src.dim(1)))
      db.error("the encoder must give f32 [B, S, D] of its source {}, got {}",
               ir::to_string(src.type()), type_of(m));
    return m;
  };
  auto source_padding = [&](Tensor src) {
    return dsl::eq(src, dsl::scalar(src, static_cast<double>(c.pad_id)));
  };
  {  // forward
    FunctionBuilder& f = mb.function("forward");
    Decoding ctx = DecodingBuilder::context(f, Decoding::Mode::forward, true);
    Tensor src = f.input("src", DType::i64, {B, S});
    Tensor tgt = f.input("tgt", DType::i64, {B, T});
    ctx.src_pad_ = source_padding(src);
    ctx.memory_ = memory_of(f, src);
    if (c.mask_target_padding) ctx.key_pad_ = source_padding(tgt);
    ctx.positions_ = dsl::iota(f, DType::i64, {one, T}, 1);
    ctx.key_positions_ = ctx.positions_;
    f.output(db.logits(f, head, db.hidden(ctx, decoder, tgt, "forward"), c.vocab), "logits");
  }
  {  // encode
    FunctionBuilder& f = mb.function("encode");
    f.output(memory_of(f, f.input("src", DType::i64, {B, S})), "memory");
  }
  {  // prepare: the decoder's run only for the cross-attentions' keys and values
    FunctionBuilder& f = mb.function("prepare");
    Decoding ctx = DecodingBuilder::context(f, Decoding::Mode::prepare, true);
    Tensor src = f.input("src", DType::i64, {B, S});
    ctx.src_pad_ = source_padding(src);
    ctx.memory_ = memory_of(f, src);
    db.declare_caches(ctx, T, C, /*declare=*/false);  // prepare writes no cache
    ctx.positions_ = dsl::iota(f, DType::i64, {one, one}, 1);
    ctx.key_positions_ = ctx.positions_;
    db.hidden(ctx, decoder, dsl::iota(f, DType::i64, {B, one}, 1), "prepare");
    for (size_t i = 0; i < ctx.memory_out_.size(); ++i)
      f.output(ctx.memory_out_[i], fmt::format("mem_{}{}", i % 2 ? 'v' : 'k', i / 2));
    ir::remove_dead_code(f.function());  // the rest of the decoder's run
  }
  // decode_step, and decode_step_restricted: the same step, its logits only for the token ids
  // `vocab` (vocabulary restriction: the search chooses among them). Written as the columns of
  // the head's logits, which the compiler's restrict-vocabulary pass turns into a linear over
  // those rows of the head's weight where the head ends in one (passes/restrict_vocabulary.h).
  const Dim R = mb.symbol("R", c.vocab);
  for (const bool restricted : {false, true}) {
    const char* name = restricted ? "decode_step_restricted" : "decode_step";
    FunctionBuilder& f = mb.function(name);
    Decoding ctx = DecodingBuilder::context(f, Decoding::Mode::step, true);
    Tensor tok = f.input("tok", DType::i64, {N, one});
    ctx.pos_ = f.input("pos", DType::i64, {one});
    ctx.rows_ = f.input("rows", DType::i64, {N, P});
    ctx.src_row_ = f.input("src_row", DType::i64, {N});
    Tensor src = f.input("src", DType::i64, {B, S});
    ctx.src_pad_ = source_padding(src);
    for (size_t i = 0; i < db.memory_widths.size(); ++i)
      ctx.memory_in_.push_back(f.input(fmt::format("mem_{}{}", i % 2 ? 'v' : 'k', i / 2),
                                       DType::f32, {B, S, Dim::constant(db.memory_widths[i])},
                                       loc));
    db.declare_caches(ctx, T, C);
    Tensor vocab = restricted ? f.input("vocab", DType::i64, {R}) : Tensor{};
    ctx.positions_ = dsl::reshape(ctx.pos_, {one, one});
    ctx.key_positions_ = dsl::iota(f, DType::i64, {one, P}, 1);
    Tensor h = db.hidden(ctx, decoder, tok, name);
    Tensor logits = db.logits(f, head, h, c.vocab);
    if (restricted)
      logits = dsl::take_along_axis(
          logits, dsl::expand(dsl::reshape(vocab, {one, one, R}), {N, one, R}), 2);
    f.output(logits, "logits");
    DecodingBuilder::output_caches(ctx);
  }
  mb.set_config("cache_widths", db.widths());
}

}  // namespace kiln::nn
