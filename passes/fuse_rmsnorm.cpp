// fuse-rmsnorm: x * rsqrt(mean(x*x) + eps) * w -> layernorm(x, w) {rms} (see fuse_rmsnorm.h).
//
// Algorithm: every reduce_mean of a square x·x is an anchor. match_rmsnorm() follows its
// single-use chain forward (+ eps, rsqrt or sqrt, the product or quotient with x, the product
// with a gamma [D]), seeing through identity casts, and either returns the match or says why
// not (logged, and noted as a lost fusion once the chain is norm-shaped: the mean of squares
// feeds + eps and a root). The rewrite turns the final mul into the layernorm in place;
// remove_dead_code drops the rest.
#include "passes/fuse_rmsnorm.h"

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "passes/notes.h"
#include "passes/rewrite.h"
#include "support/error.h"

namespace kiln::passes {
namespace {

using ir::Function;
using ir::Op;
using ir::OpKind;
using ir::ValueId;

constexpr const char* kPass = "fuse-rmsnorm";
constexpr const char* kWhat = "norm-shaped subgraph";

struct Match {
  ValueId x = -1;      // the normalized input
  ValueId gamma = -1;  // f32[D]
  double eps = 0;
  int root = -1;  // the final mul, rewritten in place
};

class Matcher {
 public:
  explicit Matcher(const Function& f) : f_(f), g_(f) {}

  // `v` seen through casts to its own dtype (identities).
  ValueId strip(ValueId v) const {
    for (const Op* d = def_op(f_, g_.defs, v);
         d && d->kind == OpKind::cast && f_.type(d->operands[0]).dtype == f_.type(v).dtype;
         d = def_op(f_, g_.defs, v))
      v = d->operands[0];
    return v;
  }

  // The only op reading `v`, through identity casts each read once; -1 when another op or
  // a result reads it. `*last` is the value read (v or the last cast of it).
  int next(ValueId v, ValueId* last) const {
    for (;;) {
      *last = v;
      const int u = g_.sole_user(v);
      if (u < 0) return -1;
      const Op& op = f_.ops[u];
      if (op.kind == OpKind::cast && f_.type(op.result).dtype == f_.type(v).dtype) {
        v = op.result;
        continue;
      }
      return u;
    }
  }

  // The positive finite value of a scalar constant `v`, if it is one.
  std::optional<double> scalar(ValueId v) const {
    const Op* d = def_op(f_, g_.defs, strip(v));
    if (!d || d->kind != OpKind::constant || f_.type(d->result).rank() != 0) return std::nullopt;
    return d->float_attr("value");
  }

  // The match anchored at the reduce_mean at `pos`, or why not. `norm_shaped` is set once
  // the chain is recognizably an RMSNorm (mean of squares, + eps, a root).
  std::optional<Match> match(int pos, std::string* why, bool* norm_shaped) const {
    *norm_shaped = false;
    const Op& mean = f_.ops[pos];
    const Op* sq = def_op(f_, g_.defs, mean.operands[0]);
    if (!sq || sq->kind != OpKind::mul || strip(sq->operands[0]) != strip(sq->operands[1])) {
      *why = "its operand is not a square x*x";
      return std::nullopt;
    }
    const ValueId x = strip(sq->operands[0]);
    const ir::TensorType& xt = f_.type(x);
    if (xt.dtype != ir::DType::f32 || xt.rank() < 1) {
      *why = "x is not f32 of rank >= 1";
      return std::nullopt;
    }
    // The norm's shape: + eps, then a root.
    ValueId m = mean.result, e = -1, root_v = -1;
    const int add = next(mean.result, &m);
    if (add < 0 || f_.ops[add].kind != OpKind::add) {
      *why = add < 0 ? fmt::format("the mean {} has other uses", value_label(f_, m))
                     : "the mean is not added to an eps";
      return std::nullopt;
    }
    const Op& add_op = f_.ops[add];
    const ValueId eps_v = add_op.operands[0] == m ? add_op.operands[1] : add_op.operands[0];
    const int root = next(add_op.result, &e);
    if (root < 0 || (f_.ops[root].kind != OpKind::rsqrt && f_.ops[root].kind != OpKind::sqrt)) {
      *why = root < 0 ? fmt::format("the mean + eps {} has other uses", value_label(f_, e))
                      : "the mean + eps has no rsqrt or sqrt";
      return std::nullopt;
    }
    *norm_shaped = true;
    const bool rsqrt = f_.ops[root].kind == OpKind::rsqrt;
    // Where the reduction and eps must be.
    const std::vector<int64_t>& axes = mean.ints_attr("axes");
    if (axes.size() != 1 || (axes[0] != -1 && axes[0] != xt.rank() - 1)) {
      *why = fmt::format(
          "the mean of squares is over axes [{}], not the last axis only (the norm kernel "
          "normalizes the last axis)",
          fmt::join(axes, ", "));
      return std::nullopt;
    }
    if (!(mean.has_attr("keepdims") && mean.int_attr("keepdims") == 1)) {
      *why = "the mean of squares drops the reduced axis (write it with keepdim=True)";
      return std::nullopt;
    }
    const std::optional<double> eps = scalar(eps_v);
    if (!eps || !(*eps > 0) || !std::isfinite(*eps)) {
      *why = fmt::format("eps {} is not a positive finite scalar constant", value_label(f_, eps_v));
      return std::nullopt;
    }
    // x times the reciprocal root, or x over the root.
    ValueId r = -1;
    const int scale = next(f_.ops[root].result, &r);
    const Op* s = scale >= 0 ? &f_.ops[scale] : nullptr;
    const auto other = [](const Op& op, ValueId v) {
      return op.operands[0] == v ? op.operands[1] : op.operands[0];
    };
    const bool ok_scale =
        s &&
        ((rsqrt && s->kind == OpKind::mul && strip(other(*s, r)) == x) ||
         (!rsqrt && s->kind == OpKind::div && s->operands[1] == r && strip(s->operands[0]) == x));
    if (!ok_scale) {
      *why = scale < 0 ? fmt::format("the root {} has other uses", value_label(f_, r))
             : rsqrt   ? "the rsqrt does not multiply the x whose squares are averaged"
                       : "the x whose squares are averaged is not divided by the sqrt";
      return std::nullopt;
    }
    if (!(f_.type(s->result) == xt)) {
      *why = fmt::format("the normalized value {} is not of x's type {}",
                         ir::to_string(f_.type(s->result)), ir::to_string(xt));
      return std::nullopt;
    }
    // Times gamma [D].
    ValueId n = -1;
    const int wpos = next(s->result, &n);
    const ir::TensorType want{ir::DType::f32, {xt.shape.back()}};
    if (wpos < 0 || f_.ops[wpos].kind != OpKind::mul ||
        !(f_.type(other(f_.ops[wpos], n)) == want) || !(f_.type(f_.ops[wpos].result) == xt)) {
      *why = wpos < 0 && g_.user[n] >= 0
                 ? fmt::format("the normalized value {} has other uses", value_label(f_, n))
                 : fmt::format("the normalized value is not multiplied by a weight of type {}",
                               ir::to_string(want));
      return std::nullopt;
    }
    return Match{x, other(f_.ops[wpos], n), *eps, wpos};
  }

 private:
  const Function& f_;
  UseInfo g_;
};

bool fuse_function(Function& f) {
  std::vector<Match> matches;
  {
    const Matcher mt(f);
    for (size_t i = 0; i < f.ops.size(); ++i) {
      if (f.ops[i].kind != OpKind::reduce_mean) continue;
      std::string why;
      bool norm_shaped = false;
      std::optional<Match> m = mt.match(static_cast<int>(i), &why, &norm_shaped);
      if (!m) {
        debug_log(kPass, "{}: {}", value_label(f, f.ops[i].result), why);
        if (norm_shaped) note_lost_fusion(f, f.ops[i], kPass, kWhat, why);
        continue;
      }
      debug_log(kPass, "fused {} = rmsnorm({}, {}) {{eps = {}}}",
                value_label(f, f.ops[m->root].result), value_label(f, m->x),
                value_label(f, m->gamma), m->eps);
      matches.push_back(*m);
    }
  }
  if (matches.empty()) return false;
  for (const Match& m : matches) {
    Op& op = f.ops[m.root];
    op.kind = OpKind::layernorm;
    op.operands = {m.x, m.gamma};
    op.attrs = {{"eps", m.eps}, {"rms", int64_t{1}}};
  }
  remove_dead_code(f);
  return true;
}

}  // namespace

bool fuse_rmsnorm(ir::Module& module) { return rewrite_functions(module, fuse_function); }

}  // namespace kiln::passes
