// fuse-gelu: x * 0.5 * (1 + erf(x / sqrt 2)) -> gelu(x), and the tanh form -> gelu_tanh(x)
// (see fuse_gelu.h).
//
// Algorithm: every erf and tanh is an anchor; match() checks its argument (x/√2, or
// √(2/π)·(x + 0.044715·x³)) and follows its single-use chain forward (+ 1, then the product
// with x and 0.5 in any grouping), returning the final mul's position and x.
#include "passes/fuse_gelu.h"

#include <cmath>
#include <optional>
#include <vector>

#include "passes/rewrite.h"

namespace kiln::passes {
namespace {

using ir::Function;
using ir::Op;
using ir::OpKind;
using ir::ValueId;

constexpr const char* kPass = "fuse-gelu";

struct Match {
  ValueId x = -1;
  int root = -1;
  OpKind kind = OpKind::gelu;
};

bool near(double a, double b) { return std::abs(a - b) <= 1e-6 * std::abs(b); }

class Matcher {
 public:
  explicit Matcher(const Function& f) : f_(f), g_(f) {}

  const Op* def(ValueId v) const { return def_op(f_, g_.defs, v); }

  std::optional<double> scalar(ValueId v) const { return f32_scalar(f_, g_.defs, v); }
  static ValueId other(const Op& op, ValueId v) { return other_operand(op, v); }

  // `v` = x * c (either order) or x / (1/c): returns x.
  ValueId scaled(ValueId v, double c) const {
    const Op* op = def(v);
    if (!op) return -1;
    if (op->kind == OpKind::mul) {
      for (int i = 0; i < 2; ++i) {
        std::optional<double> k = scalar(op->operands[i]);
        if (k && near(*k, c)) return op->operands[1 - i];
      }
    }
    if (op->kind == OpKind::div) {
      std::optional<double> k = scalar(op->operands[1]);
      if (k && *k != 0 && near(1 / *k, c)) return op->operands[0];
    }
    return -1;
  }

  // The x of x*x*x in any grouping.
  ValueId cube(ValueId v) const {
    const Op* op = def(v);
    if (!op || op->kind != OpKind::mul) return -1;
    for (int i = 0; i < 2; ++i) {
      const Op* sq = def(op->operands[i]);
      const ValueId y = op->operands[1 - i];
      if (sq && sq->kind == OpKind::mul && sq->operands[0] == y && sq->operands[1] == y) return y;
    }
    return -1;
  }

  std::optional<Match> match(int pos) const {
    const Op& anchor = f_.ops[pos];
    Match m;
    ValueId x = -1;
    if (anchor.kind == OpKind::erf) {
      x = scaled(anchor.operands[0], 1 / std::sqrt(2.0));
      m.kind = OpKind::gelu;
    } else {
      // tanh(c1 * (x + c2 * x^3))
      const ValueId inner = scaled(anchor.operands[0], std::sqrt(2 / M_PI));
      const Op* add = inner >= 0 ? def(inner) : nullptr;
      if (!add || add->kind != OpKind::add) return std::nullopt;
      for (int i = 0; i < 2 && x < 0; ++i) {
        const ValueId c = scaled(add->operands[1 - i], 0.044715);
        if (c >= 0 && cube(c) == add->operands[i]) x = add->operands[i];
      }
      m.kind = OpKind::gelu_tanh;
    }
    if (x < 0 || !(f_.type(x) == f_.type(anchor.result))) return std::nullopt;
    // 1 + erf/tanh
    const int a = g_.sole_user(anchor.result);
    if (a < 0 || f_.ops[a].kind != OpKind::add) return std::nullopt;
    std::optional<double> one = scalar(other(f_.ops[a], anchor.result));
    if (!one || *one != 1) return std::nullopt;
    const ValueId t = f_.ops[a].result;
    const int p = g_.sole_user(t);
    if (p < 0 || f_.ops[p].kind != OpKind::mul) return std::nullopt;
    const ValueId o = other(f_.ops[p], t);
    const ValueId pr = f_.ops[p].result;
    int root = -1;
    if (o == x) {  // (x * t) * 0.5
      const int q = g_.sole_user(pr);
      std::optional<double> h =
          q >= 0 && f_.ops[q].kind == OpKind::mul ? scalar(other(f_.ops[q], pr)) : std::nullopt;
      if (h && *h == 0.5) root = q;
    } else if (std::optional<double> h = scalar(o); h && *h == 0.5) {  // x * (t * 0.5)
      const int q = g_.sole_user(pr);
      if (q >= 0 && f_.ops[q].kind == OpKind::mul && other(f_.ops[q], pr) == x) root = q;
    } else if (scaled(o, 0.5) == x && g_.sole_user(o) == p) {  // (x * 0.5) * t
      root = p;
    }
    if (root < 0 || !(f_.type(f_.ops[root].result) == f_.type(x))) return std::nullopt;
    m.x = x;
    m.root = root;
    return m;
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
      if (f.ops[i].kind != OpKind::erf && f.ops[i].kind != OpKind::tanh) continue;
      if (std::optional<Match> m = mt.match(static_cast<int>(i))) {
        debug_log(kPass, "fused {} = {}({})", value_label(f, f.ops[m->root].result),
                  ir::op_name(m->kind), value_label(f, m->x));
        matches.push_back(*m);
      }
    }
  }
  if (matches.empty()) return false;
  for (const Match& m : matches) {
    Op& op = f.ops[m.root];
    op.kind = m.kind;
    op.operands = {m.x};
    op.attrs.clear();
  }
  remove_dead_code(f);
  return true;
}

}  // namespace

bool fuse_gelu(ir::Module& module) { return rewrite_functions(module, fuse_function); }

}  // namespace kiln::passes
