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

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ir/op_types.h"
#include "passes/notes.h"
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

// One padding term of a mask: `value`, a bool [B,L] value, or [B,1,1,L] / [B,1,L,1]
// (reshape: a reshape to [B,L] is inserted), true where the key or query is padding (or
// false, negate: a keep mask; a logical_not is inserted). value -1: none.
struct PadTerm {
  ValueId value = -1;
  bool reshape = false, negate = false;
};

// What a mask means to the attention op: query i of batch b does not see key j where
// (causal and j > i) or key padding[b, j] or query padding[b, i].
struct MaskTerms {
  bool causal = false;
  int64_t window = 0;  // also masked where i - j >= window (0: none)
  PadTerm key, query;
};

// `transpose(reshape(%x : f32[B,L,H*d]) : [B,L,H,d]) {perm}` with both single-use, or
// (merge) any f32 value %x : [B,H,L,d] in head layout, whose heads the rewrite merges with an
// inserted transpose and reshape (rotary embeddings, or any other computation on the heads).
struct HeadSplit {
  ValueId input = -1;
  Dim batch, length;
  int64_t heads = 0, head_dim = 0;
  bool merge = false;
  // The attention operand's type [B,L,H*d].
  TensorType merged() const {
    return TensorType{DType::f32, {batch, length, Dim::constant(heads * head_dim)}};
  }
};

// What a match of the pattern becomes.
struct AttentionMatch {
  int output_op = -1;  // the head-merging reshape, replaced by the attention op
  ValueId q = -1, k = -1, v = -1;
  bool causal = false;
  // Its key and query padding (-1: none) become the key_pad and query_pad operands.
  MaskTerms mask;
  // The fill is -inf and some row may have every key masked (padding): fill_inf = 1.
  bool fill_inf = false;
  int64_t heads = 0;
  double scale = 0;
  // K and V's head operands (merge: inserted head merges), their head count (kv_heads when
  // below heads: grouped-query attention).
  HeadSplit qs, ks, vs;
  int64_t kv_heads = 0;
  // Additive score biases (outermost first), summed into the bias operand.
  std::vector<ValueId> biases;
  double softcap = 0;
};

bool is_perm(const Op& op, const std::vector<int64_t>& perm) {
  return op.has_attr("perm") && op.ints_attr("perm") == perm;
}

TensorType bool_type(std::vector<Dim> shape) {
  return TensorType{DType::boolean, std::move(shape)};
}

// Sets *value to the value of `v` if it is a rank-0 constant (of any dtype); false otherwise.
bool scalar_constant(const Graph& g, ValueId v, double* value) {
  const Op* op = g.def(v, OpKind::constant);
  if (!op || g.type(v).rank() != 0) return false;
  *value = op->float_attr("value");
  return true;
}

// Sets *value to the value of `v` if it is a rank-0 f32 constant; false otherwise.
// An f32 `constant`: a splat, of rank 0 or of any shape it broadcasts in (an imported
// ConstantOfShape), so one value.
bool f32_scalar_constant(const Graph& g, ValueId v, double* value) {
  const Op* op = g.def(v, OpKind::constant);
  if (!op || g.type(v).dtype != DType::f32) return false;
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

// A value in head layout [B,H,L,d]: its head split (transpose perm [0,2,1,3] of a reshape of
// [B,L,H*d]) when it is one, else the value itself, to merge (`merge`).
bool match_heads(const Graph& g, ValueId hv, const char* what, HeadSplit* split, std::string* why) {
  if (match_head_split(g, hv, {0, 2, 1, 3}, what, split, why)) return true;
  const TensorType& t = g.type(hv);
  if (t.dtype != DType::f32 || t.rank() != 4 || t.shape[1].is_symbolic() ||
      t.shape[3].is_symbolic()) {
    *why = fmt::format("{} {} : {} is not f32 [B,H,L,d] with constant H and d", what, g.label(hv),
                       ir::to_string(t));
    return false;
  }
  *split = HeadSplit{hv, t.shape[0], t.shape[2], t.shape[1].value, t.shape[3].value, true};
  return true;
}

// K or V in head layout [B,H,L,d] (`hv`), possibly with its KV heads repeated (grouped-query
// attention): reshape(%r : [B,KV,n,L,d]) : [B,KV·n,L,d] where %r is expand(reshape(%x :
// [B,KV,L,d]) : [B,KV,1,L,d]) (Hugging Face's repeat_kv) or concat of n times that reshape
// along axis 2 (repeat_interleave), every step single-use; then %x's heads (KV of them).
bool match_kv_heads(const Graph& g, ValueId hv, const char* what, HeadSplit* split,
                    std::string* why) {
  const TensorType& t = g.type(hv);
  const Op* merge = g.def(hv, OpKind::reshape);
  const ValueId r = merge ? merge->operands[0] : -1;
  const bool repeat_shape = merge && g.uses[r] == 1 && g.type(r).rank() == 5 && t.rank() == 4 &&
                            g.type(r).shape[0] == t.shape[0] && g.type(r).shape[3] == t.shape[2] &&
                            g.type(r).shape[4] == t.shape[3];
  if (repeat_shape) {
    const TensorType& rt = g.type(r);
    ValueId unit = -1;  // the [B,KV,1,L,d] value repeated
    if (const Op* ex = g.def(r, OpKind::expand)) {
      unit = ex->operands[0];
    } else if (const Op* cat = g.def(r, OpKind::concat)) {
      if (ir::normalize_axis(cat->int_attr("axis"), 5) == 2 &&
          std::all_of(cat->operands.begin(), cat->operands.end(),
                      [&](ValueId o) { return o == cat->operands[0]; }))
        unit = cat->operands[0];
    }
    const Op* unit_rs = unit >= 0 ? g.def(unit, OpKind::reshape) : nullptr;
    if (unit_rs) {
      const TensorType& ut = g.type(unit);
      const ValueId x = unit_rs->operands[0];
      const TensorType& xt = g.type(x);
      const size_t expected_uses =
          g.def(r, OpKind::concat) ? g.def(r, OpKind::concat)->operands.size() : 1;
      if (g.uses[unit] == static_cast<int>(expected_uses) && ut.rank() == 5 &&
          ut.shape[2].is_const(1) && xt.rank() == 4 &&
          ut ==
              TensorType{xt.dtype,
                         {xt.shape[0], xt.shape[1], Dim::constant(1), xt.shape[2], xt.shape[3]}} &&
          rt.shape[1] == xt.shape[1] && !rt.shape[2].is_symbolic())
        return match_heads(g, x, what, split, why);
    }
  }
  return match_heads(g, hv, what, split, why);
}

// The scores' query and key dims, against which masks broadcast: [B,H,Lq,Lk].
struct ScoreDims {
  Dim batch, lq, lk;
};

bool is_unit(const Dim& d) { return d.is_const(1); }

// `shape` without its leading 1s.
std::vector<Dim> strip_leading_units(const std::vector<Dim>& shape) {
  size_t k = 0;
  while (k < shape.size() && is_unit(shape[k])) ++k;
  return std::vector<Dim>(shape.begin() + static_cast<std::ptrdiff_t>(k), shape.end());
}

// A reshape that only adds or drops leading 1s: it broadcasts as its operand does.
const Op* unit_reshape(const Graph& g, ValueId v) {
  const Op* rs = g.def(v, OpKind::reshape);
  if (!rs) return nullptr;
  return strip_leading_units(g.type(v).shape) == strip_leading_units(g.type(rs->operands[0]).shape)
             ? rs
             : nullptr;
}

// Which index of the scores `v` is, broadcast against [B,H,Lq,Lk]: 2 for the query index
// i, 3 for the key index j (an integer iota along the query or key dim, with that dim's
// extent, through leading-1 reshapes), -1 otherwise.
int score_index(const Graph& g, ValueId v, const ScoreDims& dims) {
  while (const Op* rs = unit_reshape(g, v)) v = rs->operands[0];
  const Op* iota = g.def(v, OpKind::iota);
  const TensorType& t = g.type(v);
  if (!iota || !ir::is_integer(t.dtype) || t.rank() > 4) return -1;
  const int64_t axis = ir::normalize_axis(iota->int_attr("axis"), t.rank());
  const int64_t dim = 4 - t.rank() + axis;
  if (dim == 2 && t.shape[axis] == dims.lq) return 2;
  if (dim == 3 && t.shape[axis] == dims.lk) return 3;
  return -1;
}

OpKind swapped(OpKind k) {  // a < b  <=>  b > a
  switch (k) {
    case OpKind::lt:
      return OpKind::gt;
    case OpKind::gt:
      return OpKind::lt;
    case OpKind::le:
      return OpKind::ge;
    case OpKind::ge:
      return OpKind::le;
    default:
      return k;
  }
}

OpKind negated(OpKind k) {  // !(a < b)  <=>  a >= b
  switch (k) {
    case OpKind::lt:
      return OpKind::ge;
    case OpKind::gt:
      return OpKind::le;
    case OpKind::le:
      return OpKind::gt;
    case OpKind::ge:
      return OpKind::lt;
    default:
      return k;
  }
}

// A value that takes one of two values, as a bool mask is true or false.
struct BoolImage {
  ValueId mask = -1;
  double if_true = 1, if_false = 0;
};

// Whether `x` is a function of one bool mask (itself, a cast of it, or a select of it between
// rank-0 constants, through leading-1 reshapes); fills *image.
bool bool_image(const Graph& g, ValueId x, BoolImage* image) {
  if (g.type(x).dtype == DType::boolean) {
    *image = BoolImage{x, 1, 0};
    return true;
  }
  while (const Op* rs = unit_reshape(g, x)) x = rs->operands[0];
  if (const Op* cast = g.def(x, OpKind::cast)) {
    if (g.type(cast->operands[0]).dtype != DType::boolean) return false;
    *image = BoolImage{cast->operands[0], 1, 0};
    return true;
  }
  const Op* select = g.def(x, OpKind::select);
  double a = 0, z = 0;
  if (!select || !scalar_constant(g, select->operands[1], &a) ||
      !scalar_constant(g, select->operands[2], &z))
    return false;
  *image = BoolImage{select->operands[0], a, z};
  return true;
}

// Adds the terms of mask `m` (masked where m is true; where it is false when !polarity) to
// *terms: logical_or of terms (and, by De Morgan, logical_and of negated ones), logical_not,
// eq/ne of a bool mask (or a cast or select of one) and a constant, leading-1 reshapes, key
// padding [B,1,1,Lk] and query padding [B,1,Lq,1] (a reshape of [B,L] or any such value),
// and the causal comparison of the key and query indices (iotas) that masks exactly j > i.
// Sets *why when `m` is anything else.
bool collect_mask_terms(const Graph& g, ValueId m, bool polarity, const ScoreDims& dims,
                        MaskTerms* terms, std::string* why) {
  const TensorType& t = g.type(m);
  const Op* op = def_op(g.f, g.defs, m);
  const Dim one = Dim::constant(1);
  const bool key_pad = t == bool_type({dims.batch, one, one, dims.lk});
  if (key_pad || t == bool_type({dims.batch, one, dims.lq, one})) {
    PadTerm& pad = key_pad ? terms->key : terms->query;
    if (pad.value >= 0) {
      *why = fmt::format("mask {} has two {} padding terms", g.label(m), key_pad ? "key" : "query");
      return false;
    }
    const Op* rs = g.def(m, OpKind::reshape);
    if (rs && g.type(rs->operands[0]) == bool_type({dims.batch, key_pad ? dims.lk : dims.lq})) {
      pad.value = rs->operands[0];
    } else {
      pad.value = m;
      pad.reshape = true;
    }
    pad.negate = !polarity;
    return true;
  }
  if (!op) {
    *why = fmt::format(
        "mask {} : {} is a parameter, neither key padding bool[{},1,1,{}], query padding "
        "bool[{},1,{},1] nor computed from iotas",
        g.label(m), ir::to_string(t), ir::to_string(dims.batch), ir::to_string(dims.lk),
        ir::to_string(dims.batch), ir::to_string(dims.lq));
    return false;
  }
  switch (op->kind) {
    case OpKind::logical_not:
      return collect_mask_terms(g, op->operands[0], !polarity, dims, terms, why);
    case OpKind::eq:
    case OpKind::ne: {
      // x == c or x != c (PyTorch's `mask == 0`) with c a rank-0 constant and x a function of
      // one bool mask m: m itself, a cast of m (a 0/1 mask of another dtype) or select(m, a,
      // z) of constants, through leading-1 reshapes. Masks where m is, or where m is not.
      double c = 0;
      const int side = scalar_constant(g, op->operands[1], &c)   ? 0
                       : scalar_constant(g, op->operands[0], &c) ? 1
                                                                 : -1;
      BoolImage x;
      if (side >= 0 && bool_image(g, op->operands[static_cast<size_t>(side)], &x)) {
        auto holds = [&](double value) { return (value == c) == (op->kind == OpKind::eq); };
        if (holds(x.if_true) != holds(x.if_false))
          return collect_mask_terms(g, x.mask, holds(x.if_true) ? polarity : !polarity, dims, terms,
                                    why);
      }
      *why = fmt::format(
          "mask {} compares {} and {}, not a bool mask (or a cast or select of one) and a "
          "constant that tells its two values apart",
          g.label(m), g.label(op->operands[0]), g.label(op->operands[1]));
      return false;
    }
    case OpKind::logical_or:
    case OpKind::logical_and:
      // A union of masked sets: or of masks, or and of keep masks.
      if ((op->kind == OpKind::logical_or) == polarity)
        return collect_mask_terms(g, op->operands[0], polarity, dims, terms, why) &&
               collect_mask_terms(g, op->operands[1], polarity, dims, terms, why);
      *why = fmt::format("mask {} masks the intersection of two masks ({} of {})", g.label(m),
                         ir::op_name(op->kind), polarity ? "masks" : "keep masks");
      return false;
    case OpKind::reshape:
      if (unit_reshape(g, m))
        return collect_mask_terms(g, op->operands[0], polarity, dims, terms, why);
      break;
    case OpKind::expand: {
      // A rank-4 mask expanded along the heads only (PyTorch's MultiheadAttention expands
      // the key padding over the heads): the scores broadcast it there anyway, so it masks
      // the same set.
      const TensorType& x = g.type(op->operands[0]);
      if (x.rank() == t.rank()) {
        bool heads_only = true;
        for (int64_t i = 0; i < t.rank(); ++i)
          if (!(x.shape[i] == t.shape[i]) && !(t.rank() == 4 && i == 1)) heads_only = false;
        if (heads_only) return collect_mask_terms(g, op->operands[0], polarity, dims, terms, why);
      }
      break;
    }
    case OpKind::lt:
    case OpKind::le:
    case OpKind::gt:
    case OpKind::ge: {
      // A sliding window: (i - j) or (j - i) compared with a rank-0 integer constant.
      for (int side = 0; side < 2; ++side) {
        const Op* diff = g.def(op->operands[static_cast<size_t>(side)], OpKind::sub);
        double c = 0;
        if (!diff || !scalar_constant(g, op->operands[static_cast<size_t>(1 - side)], &c) ||
            !ir::is_integer(g.type(op->operands[static_cast<size_t>(1 - side)]).dtype))
          continue;
        const int a = score_index(g, diff->operands[0], dims);
        const int b = score_index(g, diff->operands[1], dims);
        if (a < 0 || b < 0 || a == b) continue;
        // The relation of i - j to the constant that the masked set is.
        OpKind rel = side == 0 ? op->kind : swapped(op->kind);  // diff REL c
        if (a == 3) {                                           // j - i REL c  <=>  i - j REL' -c
          rel = swapped(rel);
          c = -c;
        }
        if (!polarity) rel = negated(rel);
        const double w = rel == OpKind::ge ? c : rel == OpKind::gt ? c + 1 : 0;
        if (w < 1) {
          *why = fmt::format(
              "mask {} compares query - key with {}, not a sliding window (query - key >= W, W "
              ">= 1)",
              g.label(m), g.label(op->operands[static_cast<size_t>(1 - side)]));
          return false;
        }
        if (terms->window != 0) {
          *why = fmt::format("mask {} has two sliding windows", g.label(m));
          return false;
        }
        terms->window = static_cast<int64_t>(w);
        return true;
      }
      const int a = score_index(g, op->operands[0], dims);
      const int b = score_index(g, op->operands[1], dims);
      if (a < 0 || b < 0 || a == b) {
        *why = fmt::format(
            "mask {} compares {} and {}, not the key and query positions (iotas "
            "along the scores' last two dims)",
            g.label(m), g.label(op->operands[0]), g.label(op->operands[1]));
        return false;
      }
      // The relation of key j to query i that the masked set is.
      OpKind rel = a == 3 ? op->kind : swapped(op->kind);
      if (!polarity) rel = negated(rel);
      if (rel != OpKind::gt) {
        *why = fmt::format("mask {} masks where key {} query, not key > query (causal)", g.label(m),
                           rel == OpKind::lt   ? "<"
                           : rel == OpKind::le ? "<="
                                               : ">=");
        return false;
      }
      terms->causal = true;
      return true;
    }
    default:
      break;
  }
  *why = fmt::format(
      "mask {} : {} ({}) is not key padding bool[{},1,1,{}], query padding bool[{},1,{},1], "
      "a causal comparison (key > query) or their logical_or",
      g.label(m), ir::to_string(t), ir::op_name(op->kind), ir::to_string(dims.batch),
      ir::to_string(dims.lk), ir::to_string(dims.batch), ir::to_string(dims.lq));
  return false;
}

// The select's condition (masked where it is true, or where it is false when !polarity):
// key padding, query padding, causal, or any union of them, in any layout that broadcasts to
// the scores ([L,L], [1,L,L], [1,1,L,L], [B,1,1,Lk], [B,1,Lq,1], [B,1,L,L], ...). The mask may
// have other uses (layers share it).
bool match_mask(const Graph& g, ValueId m, bool polarity, const ScoreDims& dims,
                AttentionMatch* match, std::string* why) {
  MaskTerms terms;
  if (!collect_mask_terms(g, m, polarity, dims, &terms, why)) return false;
  if (terms.causal && !(dims.lq == dims.lk)) {
    *why = fmt::format("causal mask {} needs as many queries as keys, not {} and {}", g.label(m),
                       ir::to_string(dims.lq), ir::to_string(dims.lk));
    return false;
  }
  if (terms.window != 0 && !terms.causal) {
    *why = fmt::format("mask {} has a sliding window without the causal mask (key > query)",
                       g.label(m));
    return false;
  }
  match->causal = terms.causal;
  match->mask = terms;
  return true;
}

// The attention op's attributes for `m` (fill_inf and query_pad only when set).
ir::Attrs attention_attrs(const AttentionMatch& m) {
  ir::Attrs attrs = {{"heads", m.heads}, {"scale", m.scale}, {"causal", int64_t{m.causal ? 1 : 0}}};
  if (m.fill_inf) attrs["fill_inf"] = int64_t{1};
  if (m.mask.query.value >= 0) attrs["query_pad"] = int64_t{1};
  if (m.kv_heads != m.heads) attrs["kv_heads"] = m.kv_heads;
  if (!m.biases.empty()) attrs["bias"] = int64_t{1};
  if (m.mask.window != 0) attrs["window"] = m.mask.window;
  if (m.softcap != 0) attrs["softcap"] = m.softcap;
  return attrs;
}

// Whether `v` is computed from a matmul through the ops between scores and their softmax
// (select, add, sub, mul, div, tanh, a few levels deep): a softmax of it is attention-shaped.
bool over_scores(const Graph& g, ValueId v, int depth = 0) {
  const Op* op = def_op(g.f, g.defs, v);
  if (!op || depth > 8) return false;
  if (op->kind == OpKind::matmul) {
    // A product with a model weight (x·W or x·Wᵀ: a router's or a classifier's logits, e.g. a
    // mixture of experts' gate) is a projection, not query-key scores.
    const Op* rhs = def_op(g.f, g.defs, op->operands[1]);
    if (rhs && rhs->kind == OpKind::transpose) rhs = def_op(g.f, g.defs, rhs->operands[0]);
    return !(rhs && rhs->kind == OpKind::weight);
  }
  switch (op->kind) {
    case OpKind::select:
    case OpKind::add:
    case OpKind::sub:
    case OpKind::mul:
    case OpKind::div:
    case OpKind::tanh:
      return std::any_of(op->operands.begin(), op->operands.end(),
                         [&](ValueId o) { return over_scores(g, o, depth + 1); });
    default:
      return false;
  }
}

// Whether the softmax at `softmax_index` is the anchor of a fusable attention pattern;
// fills *match when it is, logs why not otherwise.
bool can_fuse_attention(const Graph& g, int softmax_index, AttentionMatch* match) {
  const Op& softmax = g.f.ops[softmax_index];
  KILN_ASSERT(softmax.kind == OpKind::softmax, "can_fuse_attention anchors at a softmax");
  const ValueId probs = softmax.result;
  // Only a softmax over scores (its input reaches a matmul) is attention-shaped: its
  // rejection is also a lost-fusion note at the softmax (a classifier's softmax is not).
  auto reject = [&](const std::string& why) {
    debug_log(kPass, "not fusing softmax {}: {}", g.label(probs), why);
    if (over_scores(g, softmax.operands[0]))
      note_lost_fusion(g.f, softmax, kPass, "attention-shaped subgraph", why);
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
  bool polarity = true;  // masked where the condition is true
  bool infinite_fill = false;
  if (const Op* select = g.def(masked, OpKind::select)) {
    mask = select->operands[0];
    // select(mask, fill, scores), or select(keep, scores, fill): masked where keep is false.
    double fill = 0;
    int fill_side = 1;
    if (!f32_scalar_constant(g, select->operands[1], &fill)) {
      fill_side = 2;
      if (!f32_scalar_constant(g, select->operands[2], &fill))
        return reject(fmt::format("select fill {} is not a rank-0 f32 constant",
                                  g.label(select->operands[1])));
    }
    polarity = fill_side == 1;
    scaled = select->operands[3 - fill_side];
    // -inf masks as -1e9 does where a row keeps one key (a causal mask keeps the diagonal);
    // rows that padding may mask whole need fill_inf (NaN), decided once the mask is known.
    infinite_fill = std::isinf(fill) && fill < 0;
    if (fill != kMaskFill && !infinite_fill)
      return reject(fmt::format("select fill {} is {}, not -1e9 or -inf",
                                g.label(select->operands[fill_side]), fill));
    if (g.uses[scaled] != 1)
      return reject(fmt::format("scaled scores {} have {} uses", g.label(scaled), g.uses[scaled]));
    if (!(g.type(scaled) == g.type(masked)))
      return reject(fmt::format("select {} broadcasts the scores {} to {}", g.label(masked),
                                ir::to_string(g.type(scaled)), ir::to_string(g.type(masked))));
  }

  // Additive score biases: add(%x, %bias), %x the side that leads to the Q·Kᵀ matmul.
  auto leads_to_scores = [&](ValueId v) {
    for (int hops = 0; hops < 6; ++hops) {
      const Op* op = def_op(g.f, g.defs, v);
      if (!op) return false;
      if (op->kind == OpKind::matmul) return g.type(v).rank() == 4;
      if (op->kind != OpKind::div && op->kind != OpKind::mul && op->kind != OpKind::tanh)
        return false;
      double c = 0;
      v = op->operands.size() == 2 && f32_scalar_constant(g, op->operands[0], &c) ? op->operands[1]
                                                                                  : op->operands[0];
    }
    return false;
  };
  while (const Op* add = g.def(scaled, OpKind::add)) {
    const int side = leads_to_scores(add->operands[0])   ? 0
                     : leads_to_scores(add->operands[1]) ? 1
                                                         : -1;
    if (side < 0)
      return reject(fmt::format("scores {} are an add of which no side is Q·Kᵀ", g.label(scaled)));
    const ValueId x = add->operands[static_cast<size_t>(side)];
    const ValueId bias = add->operands[static_cast<size_t>(1 - side)];
    if (g.uses[x] != 1) return reject(fmt::format("scores {} have {} uses", g.label(x), g.uses[x]));
    if (!(g.type(x) == g.type(scaled)) || g.type(bias).dtype != DType::f32 ||
        g.type(bias).rank() > 4)
      return reject(fmt::format("score bias {} : {} is not f32 broadcasting to the scores {}",
                                g.label(bias), ir::to_string(g.type(bias)),
                                ir::to_string(g.type(scaled))));
    match->biases.push_back(bias);
    scaled = x;
  }

  // Logit soft-capping: mul(tanh(div(%s, c)), c) (either order) with c a rank-0 f32 constant.
  if (const Op* mul = g.def(scaled, OpKind::mul)) {
    for (int side = 0; side < 2; ++side) {
      double c = 0, c2 = 0;
      const Op* tanh = g.def(mul->operands[static_cast<size_t>(side)], OpKind::tanh);
      if (!tanh || !f32_scalar_constant(g, mul->operands[static_cast<size_t>(1 - side)], &c))
        continue;
      const Op* div = g.def(tanh->operands[0], OpKind::div);
      if (!div || !f32_scalar_constant(g, div->operands[1], &c2) || c2 != c || !(c > 0) ||
          std::isinf(c) || g.uses[tanh->result] != 1 || g.uses[div->result] != 1)
        return reject(fmt::format(
            "scores {} are a mul of a tanh, not a soft-cap tanh(s / c) * c with c > 0 a rank-0 "
            "f32 constant",
            g.label(scaled)));
      match->softcap = c;
      scaled = div->operands[0];
      if (g.uses[scaled] != 1)
        return reject(
            fmt::format("scaled scores {} have {} uses", g.label(scaled), g.uses[scaled]));
      break;
    }
  }

  // Scale: div(%scores, c) or mul(%scores, c) (either order) with a rank-0 constant c, or none
  // (scale 1: T5).
  ValueId scores = -1;
  double c = 0;
  if (g.def(scaled, OpKind::matmul)) {
    scores = scaled;
    match->scale = 1;
  } else if (const Op* div = g.def(scaled, OpKind::div)) {
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
    return reject(
        fmt::format("scores {} are not a matmul or a div or mul of one by a nonzero rank-0 f32 "
                    "constant",
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

  // The three head operands: head splits, or values in head layout (merged by the rewrite);
  // K's transposed [B,H,dk,Lk] and K and V possibly with repeated KV heads.
  HeadSplit qs, ks, vs;
  std::string why;
  if (!match_heads(g, qk->operands[0], "query", &qs, &why)) return reject(why);
  const ValueId kt = qk->operands[1];
  if (!match_head_split(g, kt, {0, 2, 3, 1}, "key", &ks, &why)) {
    const Op* tr = g.def(kt, OpKind::transpose);
    if (!tr || !is_perm(*tr, {0, 1, 3, 2}) || g.uses[kt] != 1)
      return reject(fmt::format(
          "key {} is neither a head split transposed with perm [0,2,3,1] nor a single-use "
          "transpose with perm [0,1,3,2]",
          g.label(kt)));
    if (!match_kv_heads(g, tr->operands[0], "key", &ks, &why)) return reject(why);
  }
  if (!match_kv_heads(g, pv->operands[1], "value", &vs, &why)) return reject(why);
  if (ks.heads != vs.heads || qs.head_dim != ks.head_dim || qs.heads % ks.heads != 0)
    return reject(fmt::format("head splits disagree: q {}x{}, k {}x{}, v {}x{}", qs.heads,
                              qs.head_dim, ks.heads, ks.head_dim, vs.heads, vs.head_dim));
  if (!(qs.batch == ks.batch) || !(ks.batch == vs.batch) || !(ks.length == vs.length))
    return reject("batch or key lengths of q, k, v disagree");

  if (mask >= 0 &&
      !match_mask(g, mask, polarity, ScoreDims{qs.batch, qs.length, ks.length}, match, &why))
    return reject(why);
  match->fill_inf = infinite_fill && (match->mask.key.value >= 0 || match->mask.query.value >= 0);

  match->output_op = g.defs[merge->result];
  match->q = qs.input;
  match->k = ks.input;
  match->v = vs.input;
  match->qs = qs;
  match->ks = ks;
  match->vs = vs;
  match->heads = qs.heads;
  match->kv_heads = ks.heads;

  // The attention op must type as the reshape it replaces.
  std::vector<TensorType> in = {qs.merged(), ks.merged(), vs.merged()};
  if (match->mask.key.value >= 0) in.push_back(bool_type({qs.batch, ks.length}));
  if (match->mask.query.value >= 0) in.push_back(bool_type({qs.batch, qs.length}));
  if (!match->biases.empty()) {
    TensorType sum = g.type(match->biases[0]);
    for (size_t i = 1; i < match->biases.size(); ++i) {
      ir::TypeResult b = ir::broadcast_types(sum, g.type(match->biases[i]), DType::f32);
      if (!b.ok()) return reject("score biases do not broadcast: " + b.error);
      sum = b.type;
    }
    if (sum.rank() > 4) return reject("score bias sum has rank above 4");
    while (sum.rank() < 4) sum.shape.insert(sum.shape.begin(), Dim::constant(1));
    in.push_back(sum);
  }
  ir::TypeResult t =
      ir::infer_type(g.module, OpKind::attention, in, attention_attrs(*match), nullptr);
  if (!t.ok()) return reject("attention op would not type: " + t.error);
  if (!(t.type == g.type(merge->result)))
    return reject(fmt::format("attention result {} differs from the merged heads {}",
                              ir::to_string(t.type), ir::to_string(g.type(merge->result))));
  return true;
}

// Replaces the head-merging reshape of the pattern anchored at `softmax_index` with the
// attention op, in place. The unfused ops are left for remove_dead_code.
// A key padding mask of another form than bool[B,Lk] (true = padding) is brought to it by
// a reshape and a logical_not inserted before the head merge: matches are rewritten from
// the last head merge back, so the positions of the others stay valid.
void fuse_attention_at(Function& f, const Graph& g, int softmax_index) {
  AttentionMatch m;
  KILN_ASSERT(can_fuse_attention(g, softmax_index, &m), "fuse_attention_at needs a match");
  const std::string softmax_label = g.label(f.ops[softmax_index].result);
  size_t pos = static_cast<size_t>(m.output_op);
  // A padding term as a bool [B,L] value, true at padding: inserts its reshape and
  // logical_not before the head merge; describes it in *log.
  auto pad_operand = [&](const PadTerm& pad, const Dim& length, const char* what,
                         std::string* log) {
    ValueId value = pad.value;
    std::string label = g.label(value);
    const TensorType pad_type = bool_type({m.qs.batch, length});
    if (pad.reshape) {
      value = insert_op(f, pos, pos, OpKind::reshape, {value}, pad_type);
      ++pos;
      label = "reshape(" + label + ")";
    }
    if (pad.negate) {
      value = insert_op(f, pos, pos, OpKind::logical_not, {value}, pad_type);
      ++pos;
      label = "logical_not(" + label + ")";
    }
    *log += fmt::format(", {} padding {}", what, label);
    return value;
  };
  // A head operand in head layout [B,H,L,d]: transpose and reshape to [B,L,H*d].
  auto head_operand = [&](const HeadSplit& hs, const char* what, std::string* log) {
    if (!hs.merge) return hs.input;
    const TensorType merged = hs.merged();
    const TensorType tt{DType::f32,
                        {hs.batch, hs.length, Dim::constant(hs.heads), Dim::constant(hs.head_dim)}};
    const std::string label = g.label(hs.input);
    ValueId t = insert_op(f, pos, pos, OpKind::transpose, {hs.input}, tt,
                          {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
    ++pos;
    ValueId r = insert_op(f, pos, pos, OpKind::reshape, {t}, merged);
    ++pos;
    *log += fmt::format(", {} heads {}", what, label);
    return r;
  };
  std::string log;
  std::vector<ValueId> operands = {head_operand(m.qs, "query", &log),
                                   head_operand(m.ks, "key", &log),
                                   head_operand(m.vs, "value", &log)};
  if (m.mask.key.value >= 0) operands.push_back(pad_operand(m.mask.key, m.ks.length, "key", &log));
  if (m.mask.query.value >= 0)
    operands.push_back(pad_operand(m.mask.query, m.qs.length, "query", &log));
  if (!m.biases.empty()) {
    // Innermost first, as the graph adds them; then leading 1s up to rank 4.
    ValueId sum = m.biases.back();
    std::string label = g.label(sum);
    for (size_t i = m.biases.size() - 1; i-- > 0;) {
      ir::TypeResult t = ir::broadcast_types(f.type(sum), f.type(m.biases[i]), DType::f32);
      KILN_ASSERT(t.ok(), "fuse-attention: score biases broadcast");
      sum = insert_op(f, pos, pos, OpKind::add, {sum, m.biases[i]}, t.type);
      ++pos;
      label = fmt::format("add({}, {})", label, g.label(m.biases[i]));
    }
    if (f.type(sum).rank() < 4) {
      TensorType t4 = f.type(sum);
      while (t4.rank() < 4) t4.shape.insert(t4.shape.begin(), Dim::constant(1));
      sum = insert_op(f, pos, pos, OpKind::reshape, {sum}, t4);
      ++pos;
      label = "reshape(" + label + ")";
    }
    operands.push_back(sum);
    log += ", bias " + label;
  }
  if (m.kv_heads != m.heads) log += fmt::format(", kv heads {}", m.kv_heads);
  if (m.mask.window != 0) log += fmt::format(", window {}", m.mask.window);
  if (m.softcap != 0) log += fmt::format(", softcap {}", m.softcap);
  Op& out = f.ops[pos];
  out.kind = OpKind::attention;
  out.operands = std::move(operands);
  out.attrs = attention_attrs(m);
  debug_log(kPass, "fused softmax {} into attention {} (heads {}, scale {}, causal {}{}{})",
            softmax_label, value_label(f, out.result), m.heads, m.scale, m.causal ? 1 : 0, log,
            m.fill_inf ? ", fill -inf" : "");
}

bool fuse_function(const ir::Module& module, Function& f) {
  // Rewrites only change the (single-use-fed) head-merging reshapes in place, which no
  // other candidate's pattern contains, so the def/use facts stay valid for the rest.
  const Graph g(module, f);
  std::vector<std::pair<int, int>> matches;  // (head merge, softmax)
  for (size_t i = 0; i < f.ops.size(); ++i) {
    if (f.ops[i].kind != OpKind::softmax) continue;
    AttentionMatch m;
    if (!can_fuse_attention(g, static_cast<int>(i), &m)) continue;
    matches.emplace_back(m.output_op, static_cast<int>(i));
  }
  // From the last head merge back: ops inserted before one leave earlier positions alone,
  // and every op of an earlier match precedes its own head merge.
  std::sort(matches.rbegin(), matches.rend());
  for (const auto& [merge, softmax] : matches) fuse_attention_at(f, g, softmax);
  const bool changed = !matches.empty();
  if (changed) remove_dead_code(f);
  return changed;
}

}  // namespace

bool fuse_attention(ir::Module& module) {
  return rewrite_functions(module, [&](Function& f) { return fuse_function(module, f); });
}

}  // namespace kiln::passes
