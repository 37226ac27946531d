// fuse-attention: finds scaled dot-product attention (head split, Q·Kᵀ, scale, mask,
// softmax, ·V, head merge) and replaces it with one `attention` op (see fuse_attention.h).
//
// Algorithm: every softmax is a candidate anchor. can_fuse_attention() walks up from it
// through the mask and scale to the Q·Kᵀ matmul and the three head splits, and down
// through the P·V matmul and the head merge, checking each node's kind, attributes,
// types and use count, and logs why when something does not fit. The rewrite turns the
// head-merging reshape into the attention op in place (same result value, so later ops
// need no renumbering and every operand is still defined before it); remove_dead_code
// then drops the unfused ops.
#include "passes/fuse_attention.h"

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ir/op_types.h"
#include "passes/rewrite.h"
#include "support/error.h"

namespace kiln::passes {
namespace {

using ir::Dim;
using ir::DType;
using ir::Function;
using ir::Op;
using ir::OpKind;
using ir::TensorType;
using ir::ValueId;

constexpr const char* kPass = "fuse-attention";
// The fill value the attention op gives masked scores (see ir/interpreter.cpp).
constexpr double kMaskFill = -1e9;

// Def/use facts about one function, computed once per function.
struct Graph : UseInfo {
  Graph(const ir::Module& m, const Function& fn) : UseInfo(fn), module(m) {}
  const ir::Module& module;

  const TensorType& type(ValueId v) const { return f.type(v); }
  // The op defining `v` if it is of `kind`, else nullptr.
  const Op* def(ValueId v, OpKind kind) const {
    const Op* op = def_op(f, defs, v);
    return op && op->kind == kind ? op : nullptr;
  }
  // The only op using `v` if `v` has exactly one use and it is an op of `kind`.
  const Op* sole_user(ValueId v, OpKind kind) const {
    const int u = UseInfo::sole_user(v);
    return u >= 0 && f.ops[u].kind == kind ? &f.ops[u] : nullptr;
  }
  std::string label(ValueId v) const { return value_label(f, v); }
};

// What a match of the pattern becomes.
struct AttentionMatch {
  int output_op = -1;  // the head-merging reshape, replaced by the attention op
  ValueId q = -1, k = -1, v = -1;
  ValueId key_pad = -1;  // -1: no key padding operand
  bool causal = false;
  int64_t heads = 0;
  double scale = 0;
};

// `transpose(reshape(%x : f32[B,L,H*d]) : [B,L,H,d]) {perm}` with both single-use.
struct HeadSplit {
  ValueId input = -1;
  Dim batch, length;
  int64_t heads = 0, head_dim = 0;
};

bool is_perm(const Op& op, const std::vector<int64_t>& perm) {
  return op.has_attr("perm") && op.ints_attr("perm") == perm;
}

TensorType bool_type(std::vector<Dim> shape) {
  return TensorType{DType::boolean, std::move(shape)};
}

// Sets *value to the value of `v` if it is a rank-0 f32 constant; false otherwise.
bool f32_scalar_constant(const Graph& g, ValueId v, double* value) {
  const Op* op = g.def(v, OpKind::constant);
  if (!op || !(g.type(v) == TensorType{DType::f32, {}})) return false;
  *value = op->float_attr("value");
  return true;
}

bool match_head_split(const Graph& g, ValueId t, const std::vector<int64_t>& perm, const char* what,
                      HeadSplit* split, std::string* why) {
  const Op* tr = g.def(t, OpKind::transpose);
  if (!tr || !is_perm(*tr, perm)) {
    *why = fmt::format("{} {} is not a transpose with perm [{}]", what, g.label(t),
                       fmt::join(perm, ","));
    return false;
  }
  if (g.uses[t] != 1) {
    *why = fmt::format("{} {} has {} uses", what, g.label(t), g.uses[t]);
    return false;
  }
  const ValueId r = tr->operands[0];
  const Op* rs = g.def(r, OpKind::reshape);
  if (!rs) {
    *why = fmt::format("{} {} does not transpose a reshape", what, g.label(t));
    return false;
  }
  if (g.uses[r] != 1) {
    *why = fmt::format("{} head split {} has {} uses", what, g.label(r), g.uses[r]);
    return false;
  }
  const ValueId x = rs->operands[0];
  const TensorType &xt = g.type(x), &rt = g.type(r);
  const bool splits_last =
      xt.dtype == DType::f32 && xt.rank() == 3 && rt.rank() == 4 && xt.shape[0] == rt.shape[0] &&
      xt.shape[1] == rt.shape[1] && !rt.shape[2].is_symbolic() && !rt.shape[3].is_symbolic() &&
      !xt.shape[2].is_symbolic() && xt.shape[2].value == rt.shape[2].value * rt.shape[3].value;
  if (!splits_last) {
    *why = fmt::format("{} reshape {} -> {} does not split the last dim into heads", what,
                       ir::to_string(xt), ir::to_string(rt));
    return false;
  }
  *split = HeadSplit{x, rt.shape[0], rt.shape[1], rt.shape[2].value, rt.shape[3].value};
  return true;
}

// `reshape(%kp : bool[B,Lk]) : bool[B,1,1,Lk]`; sets *key_pad to %kp.
bool match_key_padding(const Graph& g, ValueId m, const Dim& batch, const Dim& lk,
                       ValueId* key_pad) {
  const Op* rs = g.def(m, OpKind::reshape);
  if (!rs || !(g.type(m) == bool_type({batch, Dim::constant(1), Dim::constant(1), lk})))
    return false;
  if (!(g.type(rs->operands[0]) == bool_type({batch, lk}))) return false;
  *key_pad = rs->operands[0];
  return true;
}

// Whether `v` is `iota() {axis} : <int>[L,L]`.
bool is_square_iota(const Graph& g, ValueId v, int64_t axis) {
  const Op* op = g.def(v, OpKind::iota);
  const TensorType& t = g.type(v);
  return op && ir::is_integer(t.dtype) && t.rank() == 2 && t.shape[0] == t.shape[1] &&
         ir::normalize_axis(op->int_attr("axis"), 2) == axis;
}

// `gt(iota{axis=1}, iota{axis=0}) : bool[L,L]` or `lt(iota{axis=0}, iota{axis=1})`:
// true where key j > query i. Needs Lq == Lk == L.
bool match_causal(const Graph& g, ValueId m, const Dim& lq, const Dim& lk) {
  if (!(lq == lk) || !(g.type(m) == bool_type({lq, lk}))) return false;
  if (const Op* gt = g.def(m, OpKind::gt))
    return gt->operands[0] != gt->operands[1] && is_square_iota(g, gt->operands[0], 1) &&
           is_square_iota(g, gt->operands[1], 0);
  if (const Op* lt = g.def(m, OpKind::lt))
    return lt->operands[0] != lt->operands[1] && is_square_iota(g, lt->operands[0], 0) &&
           is_square_iota(g, lt->operands[1], 1);
  return false;
}

// The select's condition: key padding, causal, or logical_or of both (either order).
// The mask may have other uses (layers share it).
bool match_mask(const Graph& g, ValueId m, const Dim& batch, const Dim& lq, const Dim& lk,
                AttentionMatch* match, std::string* why) {
  if (match_key_padding(g, m, batch, lk, &match->key_pad)) return true;
  if (match_causal(g, m, lq, lk)) {
    match->causal = true;
    return true;
  }
  if (const Op* lor = g.def(m, OpKind::logical_or)) {
    if (!(g.type(m) == bool_type({batch, Dim::constant(1), lq, lk}))) {
      *why = fmt::format("mask {} : {} does not broadcast along heads to [{},H,{},{}]", g.label(m),
                         ir::to_string(g.type(m)), ir::to_string(batch), ir::to_string(lq),
                         ir::to_string(lk));
      return false;
    }
    for (int side = 0; side < 2; ++side) {
      ValueId pad = lor->operands[side], causal = lor->operands[1 - side];
      if (match_key_padding(g, pad, batch, lk, &match->key_pad) &&
          match_causal(g, causal, lq, lk)) {
        match->causal = true;
        return true;
      }
    }
    match->key_pad = -1;
  }
  *why = fmt::format(
      "mask {} : {} is not key padding bool[{},1,1,{}], causal (key > query) "
      "or their logical_or",
      g.label(m), ir::to_string(g.type(m)), ir::to_string(batch), ir::to_string(lk));
  return false;
}

// Whether the softmax at `softmax_index` is the anchor of a fusable attention pattern;
// fills *match when it is, logs why not otherwise.
bool can_fuse_attention(const Graph& g, int softmax_index, AttentionMatch* match) {
  const Op& softmax = g.f.ops[softmax_index];
  KILN_ASSERT(softmax.kind == OpKind::softmax, "can_fuse_attention anchors at a softmax");
  const ValueId probs = softmax.result;
  auto reject = [&](const std::string& why) {
    debug_log(kPass, "not fusing softmax {}: {}", g.label(probs), why);
    return false;
  };
  *match = AttentionMatch{};

  // softmax over the keys of [B,H,Lq,Lk] scores.
  const ValueId masked = softmax.operands[0];
  if (g.type(masked).rank() != 4)
    return reject(fmt::format("input {} is not rank 4", ir::to_string(g.type(masked))));
  if (ir::normalize_axis(softmax.int_attr("axis"), 4) != 3)
    return reject(fmt::format("axis {} is not the last", softmax.int_attr("axis")));
  if (g.uses[masked] != 1)
    return reject(fmt::format("its input {} has {} uses", g.label(masked), g.uses[masked]));

  // Optional mask: select(%mask, -1e9, %scaled).
  ValueId scaled = masked, mask = -1;
  if (const Op* select = g.def(masked, OpKind::select)) {
    mask = select->operands[0];
    scaled = select->operands[2];
    double fill = 0;
    if (!f32_scalar_constant(g, select->operands[1], &fill))
      return reject(
          fmt::format("select fill {} is not a rank-0 f32 constant", g.label(select->operands[1])));
    if (fill != kMaskFill)
      return reject(
          fmt::format("select fill {} is {}, not -1e9", g.label(select->operands[1]), fill));
    if (g.uses[scaled] != 1)
      return reject(fmt::format("scaled scores {} have {} uses", g.label(scaled), g.uses[scaled]));
    if (!(g.type(scaled) == g.type(masked)))
      return reject(fmt::format("select {} broadcasts the scores {} to {}", g.label(masked),
                                ir::to_string(g.type(scaled)), ir::to_string(g.type(masked))));
  }

  // Scale: div(%scores, c) or mul(%scores, c) (either order) with a rank-0 constant c.
  ValueId scores = -1;
  double c = 0;
  if (const Op* div = g.def(scaled, OpKind::div)) {
    if (f32_scalar_constant(g, div->operands[1], &c) && c != 0) {
      scores = div->operands[0];
      match->scale = 1.0 / c;
    }
  } else if (const Op* mul = g.def(scaled, OpKind::mul)) {
    for (int side = 0; side < 2 && scores < 0; ++side) {
      if (f32_scalar_constant(g, mul->operands[1 - side], &c)) {
        scores = mul->operands[side];
        match->scale = c;
      }
    }
  }
  if (scores < 0)
    return reject(fmt::format("scores {} are not a div or mul by a nonzero rank-0 f32 constant",
                              g.label(scaled)));
  const Op* qk = g.def(scores, OpKind::matmul);
  if (!qk) return reject(fmt::format("unscaled scores {} are not a matmul", g.label(scores)));
  if (g.uses[scores] != 1)
    return reject(fmt::format("scores {} have {} uses", g.label(scores), g.uses[scores]));

  // P·V, then the head merge.
  const Op* pv = g.sole_user(probs, OpKind::matmul);
  if (!pv || pv->operands[0] != probs || pv->operands[1] == probs)
    return reject(
        fmt::format("probabilities have {} uses, not one as lhs of a matmul", g.uses[probs]));
  const Op* merge_tr = g.sole_user(pv->result, OpKind::transpose);
  if (!merge_tr || !is_perm(*merge_tr, {0, 2, 1, 3}))
    return reject(fmt::format("P·V {} is not used only by a transpose with perm [0,2,1,3]",
                              g.label(pv->result)));
  const Op* merge = g.sole_user(merge_tr->result, OpKind::reshape);
  if (!merge)
    return reject(
        fmt::format("transpose {} is not used only by a reshape", g.label(merge_tr->result)));

  // The three head splits.
  HeadSplit qs, ks, vs;
  std::string why;
  if (!match_head_split(g, qk->operands[0], {0, 2, 1, 3}, "query", &qs, &why) ||
      !match_head_split(g, qk->operands[1], {0, 2, 3, 1}, "key", &ks, &why) ||
      !match_head_split(g, pv->operands[1], {0, 2, 1, 3}, "value", &vs, &why))
    return reject(why);
  if (qs.heads != ks.heads || ks.heads != vs.heads || qs.head_dim != ks.head_dim)
    return reject(fmt::format("head splits disagree: q {}x{}, k {}x{}, v {}x{}", qs.heads,
                              qs.head_dim, ks.heads, ks.head_dim, vs.heads, vs.head_dim));
  if (!(qs.batch == ks.batch) || !(ks.batch == vs.batch) || !(ks.length == vs.length))
    return reject("batch or key lengths of q, k, v disagree");

  if (mask >= 0 && !match_mask(g, mask, qs.batch, qs.length, ks.length, match, &why))
    return reject(why);

  match->output_op = g.defs[merge->result];
  match->q = qs.input;
  match->k = ks.input;
  match->v = vs.input;
  match->heads = qs.heads;

  // The attention op must type as the reshape it replaces.
  std::vector<TensorType> in = {g.type(match->q), g.type(match->k), g.type(match->v)};
  if (match->key_pad >= 0) in.push_back(g.type(match->key_pad));
  ir::Attrs attrs = {
      {"heads", match->heads}, {"scale", match->scale}, {"causal", int64_t{match->causal ? 1 : 0}}};
  ir::TypeResult t = ir::infer_type(g.module, OpKind::attention, in, attrs, nullptr);
  if (!t.ok()) return reject("attention op would not type: " + t.error);
  if (!(t.type == g.type(merge->result)))
    return reject(fmt::format("attention result {} differs from the merged heads {}",
                              ir::to_string(t.type), ir::to_string(g.type(merge->result))));
  return true;
}

// Replaces the head-merging reshape of the pattern anchored at `softmax_index` with the
// attention op, in place. The unfused ops are left for remove_dead_code.
void fuse_attention_at(Function& f, const Graph& g, int softmax_index) {
  AttentionMatch m;
  KILN_ASSERT(can_fuse_attention(g, softmax_index, &m), "fuse_attention_at needs a match");
  Op& out = f.ops[m.output_op];
  out.kind = OpKind::attention;
  out.operands = {m.q, m.k, m.v};
  if (m.key_pad >= 0) out.operands.push_back(m.key_pad);
  out.attrs = {{"heads", m.heads}, {"scale", m.scale}, {"causal", int64_t{m.causal ? 1 : 0}}};
  debug_log(kPass, "fused softmax {} into attention {} (heads {}, scale {}, causal {}{})",
            g.label(f.ops[softmax_index].result), g.label(out.result), m.heads, m.scale,
            m.causal ? 1 : 0, m.key_pad >= 0 ? ", key padding " + g.label(m.key_pad) : "");
}

bool fuse_function(const ir::Module& module, Function& f) {
  // Rewrites only change the (single-use-fed) head-merging reshapes in place, which no
  // other candidate's pattern contains, so the def/use facts stay valid for the rest.
  const Graph g(module, f);
  bool changed = false;
  for (size_t i = 0; i < f.ops.size(); ++i) {
    if (f.ops[i].kind != OpKind::softmax) continue;
    AttentionMatch m;
    if (!can_fuse_attention(g, static_cast<int>(i), &m)) continue;
    fuse_attention_at(f, g, static_cast<int>(i));
    changed = true;
  }
  if (changed) remove_dead_code(f);
  return changed;
}

}  // namespace

bool fuse_attention(ir::Module& module) {
  bool changed = false;
  for (Function& f : module.functions) changed |= fuse_function(module, f);
  return changed;
}

}  // namespace kiln::passes
