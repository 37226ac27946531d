// fuse-layernorm: (x - mean) / sqrt(var + eps) * w + b -> layernorm(x, w, b) (see
// fuse_layernorm.h).
//
// Algorithm: every reduce_mean of a square d·d, d = x - mean(x), is an anchor (the variance).
// match() follows its single-use chain forward: scalar factors (the unbiased N/(N-1)), then
// + eps and a root (or a root and + eps), then the quotient (or the product with rsqrt) of a
// d, then the optional weight and bias; it either returns the match or says why not (logged,
// and noted as a lost fusion once the chain is norm-shaped). The rewrite turns the last op
// matched into the layernorm in place, inserting constant weights where the norm has none;
// remove_dead_code drops the rest.
#include "passes/fuse_layernorm.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "passes/notes.h"
#include "passes/rewrite.h"

namespace kiln::passes {
namespace {

using ir::Function;
using ir::Op;
using ir::OpKind;
using ir::ValueId;

constexpr const char* kPass = "fuse-layernorm";
constexpr const char* kWhat = "norm-shaped subgraph";

struct Match {
  ValueId x = -1;
  ValueId w = -1, b = -1;  // -1: none (constants inserted)
  double eps = 0;
  bool unbiased = false, eps_outside = false;
  int root = -1;  // the last op matched, rewritten in place
};

class Matcher {
 public:
  explicit Matcher(const Function& f) : f_(f), g_(f), users_(readers_by_value(f)) {}

  const Op* def(ValueId v) const { return def_op(f_, g_.defs, v); }

  // The only op reading `v` (an op reading it twice counts once); -1 otherwise.
  int sole_user(ValueId v) const {
    return users_[v].size() == 1 && *users_[v].begin() >= 0 ? *users_[v].begin() : -1;
  }

  std::optional<double> scalar(ValueId v) const { return f32_scalar(f_, g_.defs, v); }
  static ValueId other(const Op& op, ValueId v) { return other_operand(op, v); }

  // A mean of `x` over its last axis with keepdims.
  bool is_last_axis_mean(const Op* op) const {
    if (!op || op->kind != OpKind::reduce_mean) return false;
    const ir::TensorType& t = f_.type(op->operands[0]);
    const std::vector<int64_t>& axes = op->ints_attr("axes");
    return axes.size() == 1 && (axes[0] == -1 || axes[0] == t.rank() - 1) &&
           op->has_attr("keepdims") && op->int_attr("keepdims") == 1;
  }

  // The x of d = sub(x, mean(x)), or -1.
  ValueId centered(ValueId d) const {
    const Op* s = def(d);
    if (!s || s->kind != OpKind::sub) return -1;
    const Op* m = def(s->operands[1]);
    if (!is_last_axis_mean(m) || m->operands[0] != s->operands[0]) return -1;
    return s->operands[0];
  }

  std::optional<Match> match(int pos, std::string* why, bool* norm_shaped) const {
    *norm_shaped = false;
    const Op& var = f_.ops[pos];
    const Op* sq = def(var.operands[0]);
    if (!sq || sq->kind != OpKind::mul || sq->operands[0] != sq->operands[1]) {
      *why = "its operand is not a square d*d";
      return std::nullopt;
    }
    const ValueId d = sq->operands[0];
    const ValueId x = centered(d);
    if (x < 0) {
      *why = "the squared value is not x - mean(x) over the last axis";
      return std::nullopt;
    }
    const ir::TensorType& xt = f_.type(x);
    if (xt.dtype != ir::DType::f32 || xt.rank() < 1 || xt.shape.back().is_symbolic()) {
      *why = "x is not f32 with a constant last dim";
      return std::nullopt;
    }
    if (!is_last_axis_mean(&var)) {
      *why = "the variance is not a mean over the last axis with keepdim";
      return std::nullopt;
    }
    // Scalar factors of the variance (x.std()'s N / (N - 1)).
    ValueId v = var.result;
    double factor = 1;
    int u = sole_user(v);
    while (u >= 0 && (f_.ops[u].kind == OpKind::mul || f_.ops[u].kind == OpKind::div)) {
      const Op& op = f_.ops[u];
      std::optional<double> c = scalar(other(op, v));
      if (!c || (op.kind == OpKind::div && op.operands[0] != v) || *c == 0) break;
      factor = op.kind == OpKind::mul ? factor * *c : factor / *c;
      v = op.result;
      u = sole_user(v);
    }
    const double n = static_cast<double>(xt.shape.back().value);
    bool unbiased = false;
    if (std::abs(factor - 1) <= 1e-6) {
      unbiased = false;
    } else if (n > 1 && std::abs(factor - n / (n - 1)) <= 1e-6 * n / (n - 1)) {
      unbiased = true;
    } else {
      *why = fmt::format("the variance is scaled by {}, neither 1 nor N/(N-1) = {}", factor,
                         n / (n - 1));
      return std::nullopt;
    }
    // + eps then a root, or a root then + eps.
    if (u < 0) {
      *why = fmt::format("the variance {} has other uses", value_label(f_, v));
      return std::nullopt;
    }
    bool eps_outside = false, rsqrt = false;
    std::optional<double> eps;
    ValueId den = -1;
    const Op* a = &f_.ops[u];
    if (a->kind == OpKind::add) {
      eps = scalar(other(*a, v));
      const int r = sole_user(a->result);
      if (r < 0 || (f_.ops[r].kind != OpKind::sqrt && f_.ops[r].kind != OpKind::rsqrt)) {
        *why = "the variance + eps has no sqrt or rsqrt (or other uses)";
        return std::nullopt;
      }
      rsqrt = f_.ops[r].kind == OpKind::rsqrt;
      den = f_.ops[r].result;
    } else if (a->kind == OpKind::sqrt) {
      const int e = sole_user(a->result);
      if (e < 0 || f_.ops[e].kind != OpKind::add) {
        *why = "the standard deviation is not added to an eps (or has other uses)";
        return std::nullopt;
      }
      eps = scalar(other(f_.ops[e], a->result));
      eps_outside = true;
      den = f_.ops[e].result;
    } else {
      *why = "the variance is neither added to an eps nor rooted";
      return std::nullopt;
    }
    *norm_shaped = true;
    if (!eps || !(*eps > 0) || !std::isfinite(*eps)) {
      *why = "eps is not a positive finite scalar constant";
      return std::nullopt;
    }
    // The quotient (or product with rsqrt) of a centered x, maybe weighted first.
    const int q = sole_user(den);
    if (q < 0) {
      *why = fmt::format("the root {} has other uses", value_label(f_, den));
      return std::nullopt;
    }
    const Op& qo = f_.ops[q];
    if (rsqrt ? qo.kind != OpKind::mul : (qo.kind != OpKind::div || qo.operands[1] != den)) {
      *why = rsqrt ? "the rsqrt does not multiply x - mean" : "x - mean is not divided by the root";
      return std::nullopt;
    }
    const ValueId num = rsqrt ? other(qo, den) : qo.operands[0];
    const ir::TensorType want{ir::DType::f32, {xt.shape.back()}};
    ValueId w = -1, b = -1;
    auto is_param = [&](ValueId p) { return f_.type(p) == want; };
    if (centered(num) != x) {
      const Op* m = def(num);
      if (m && m->kind == OpKind::mul && sole_user(num) == q) {
        if (centered(m->operands[0]) == x && is_param(m->operands[1]))
          w = m->operands[1];
        else if (centered(m->operands[1]) == x && is_param(m->operands[0]))
          w = m->operands[0];
      }
      if (w < 0) {
        *why = "the normalized numerator is not x - mean (or w * (x - mean))";
        return std::nullopt;
      }
    }
    if (!(f_.type(qo.result) == xt)) {
      *why = "the normalized value is not of x's type";
      return std::nullopt;
    }
    // Every centered value and mean in the pattern is used only within it.
    int root = q;
    ValueId out = qo.result;
    if (w < 0) {
      const int m = sole_user(out);
      if (m >= 0 && f_.ops[m].kind == OpKind::mul && is_param(other(f_.ops[m], out)) &&
          f_.type(f_.ops[m].result) == xt) {
        w = other(f_.ops[m], out);
        root = m;
        out = f_.ops[m].result;
      }
    }
    const int ba = sole_user(out);
    if (ba >= 0 && f_.ops[ba].kind == OpKind::add && is_param(other(f_.ops[ba], out)) &&
        f_.type(f_.ops[ba].result) == xt) {
      b = other(f_.ops[ba], out);
      root = ba;
    }
    if (!inner_uses_ok(x, root)) {
      *why = "x - mean or the mean has uses outside the norm";
      return std::nullopt;
    }
    Match mt;
    mt.x = x;
    mt.w = w;
    mt.b = b;
    mt.eps = *eps;
    mt.unbiased = unbiased;
    mt.eps_outside = eps_outside;
    mt.root = root;
    return mt;
  }

 private:
  // The means of x and the centered values (x - mean) between them and `root`: each used only
  // by ops that the rewrite removes (squares, the numerator, the weight's mul, other means).
  bool inner_uses_ok(ValueId x, int root) const {
    for (int i : users_[x]) {
      if (i < 0 || i > root) continue;
      const Op& op = f_.ops[i];
      if (op.kind == OpKind::reduce_mean && is_last_axis_mean(&op)) {
        for (int s : users_[op.result])
          if (s < 0 || s > root || f_.ops[s].kind != OpKind::sub) return false;
      } else if (op.kind == OpKind::sub && centered(op.result) == x) {
        for (int s : users_[op.result])
          if (s < 0 || s > root || (f_.ops[s].kind != OpKind::mul && f_.ops[s].kind != OpKind::div))
            return false;
      }
    }
    return true;
  }

  const Function& f_;
  UseInfo g_;
  std::vector<std::set<int>> users_;
};

bool fuse_function(Function& f) {
  std::vector<Match> matches;
  {
    const Matcher mt(f);
    std::set<int> roots;
    for (size_t i = 0; i < f.ops.size(); ++i) {
      if (f.ops[i].kind != OpKind::reduce_mean) continue;
      std::string why;
      bool norm_shaped = false;
      std::optional<Match> m = mt.match(static_cast<int>(i), &why, &norm_shaped);
      if (!m) {
        if (why != "its operand is not a square d*d")
          debug_log(kPass, "{}: {}", value_label(f, f.ops[i].result), why);
        if (norm_shaped) note_lost_fusion(f, f.ops[i], kPass, kWhat, why);
        continue;
      }
      if (!roots.insert(m->root).second) continue;
      debug_log(kPass, "fused {} = layernorm({}) {{eps = {}{}{}}}",
                value_label(f, f.ops[m->root].result), value_label(f, m->x), m->eps,
                m->unbiased ? ", unbiased = 1" : "", m->eps_outside ? ", eps_outside = 1" : "");
      matches.push_back(*m);
    }
  }
  if (matches.empty()) return false;
  std::sort(matches.begin(), matches.end(),
            [](const Match& a, const Match& b) { return a.root < b.root; });
  // Rewrite from the last match back, so inserted constants do not shift later positions.
  for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
    Match m = *it;
    const ir::TensorType param{ir::DType::f32, {f.type(m.x).shape.back()}};
    size_t root = static_cast<size_t>(m.root);
    if (m.b < 0) {
      m.b = insert_op(f, root, root, OpKind::constant, {}, param, {{"value", 0.0}});
      ++root;
    }
    if (m.w < 0) {
      m.w = insert_op(f, root, root, OpKind::constant, {}, param, {{"value", 1.0}});
      ++root;
    }
    Op& op = f.ops[root];
    op.kind = OpKind::layernorm;
    op.operands = {m.x, m.w, m.b};
    op.attrs = {{"eps", m.eps}};
    if (m.unbiased) op.attrs["unbiased"] = int64_t{1};
    if (m.eps_outside) op.attrs["eps_outside"] = int64_t{1};
  }
  remove_dead_code(f);
  return true;
}

}  // namespace

bool fuse_layernorm(ir::Module& module) { return rewrite_functions(module, fuse_function); }

}  // namespace kiln::passes
