// unmerge-heads: sequence-first attention over merged batch*heads -> the batch-first head
// layout fuse-attention reads (see unmerge_heads.h).
//
// Algorithm: every rank-3 softmax over its last axis is an anchor. match() walks back from
// it through single-use elementwise score ops to the Q·Kᵀ matmul, checks the head splits of
// q, k and v ([L, B, E] reshaped to [L, H*B, d]) and forward to the P·V matmul and the
// head-merging reshape; rewrite() inserts the batch-first ops before that reshape and turns
// it into the final transpose back to [Lq, B, E].
#include "passes/unmerge_heads.h"

#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ir/op_types.h"
#include "passes/rewrite.h"
#include "support/error.h"

namespace kiln::passes {
namespace {

using ir::Dim;
using ir::Function;
using ir::Op;
using ir::OpKind;
using ir::TensorType;
using ir::ValueId;

constexpr const char* kPass = "unmerge-heads";

struct Split {
  ValueId x = -1;  // [L, B, E]
};

struct Match {
  Split q, k, v;
  int scale = -1;              // the div/mul scaling the query, or -1
  ValueId scale_value = -1;    // its constant
  std::vector<int> score_ops;  // from the matmul's user to the softmax's operand, in order
  std::vector<int> carries;    // which operand of each score op carries the scores
  int softmax = -1;
  int out = -1;  // the head-merging reshape
  int64_t heads = 0, d = 0;
  Dim b;  // the batch dim
};

class Matcher {
 public:
  explicit Matcher(const Function& f) : f_(f), g_(f), users_(readers_by_value(f)) {}

  const Op* def(ValueId v) const { return def_op(f_, g_.defs, v); }
  int sole_user(ValueId v) const {
    return users_[v].size() == 1 && *users_[v].begin() >= 0 ? *users_[v].begin() : -1;
  }
  bool used_once_by(ValueId v, int op) const { return sole_user(v) == op; }

  static bool is_perm(const Op& op, std::vector<int64_t> perm) {
    return op.kind == OpKind::transpose && op.ints_attr("perm") == perm;
  }

  // t = transpose(reshape(x : [L,B,E]) : [L,M,d]) {perm}: fills the split, heads and batch.
  bool head_split(ValueId t, const std::vector<int64_t>& perm, Split* s, Match* m,
                  std::string* why) const {
    const Op* tr = def(t);
    if (!tr || !is_perm(*tr, perm)) {
      *why = fmt::format("{} is not a transpose with the merged-heads perm", value_label(f_, t));
      return false;
    }
    const Op* rs = def(tr->operands[0]);
    if (!rs || rs->kind != OpKind::reshape || sole_user(rs->result) < 0) {
      *why = "a head split is not a reshape used once";
      return false;
    }
    const TensorType& xt = f_.type(rs->operands[0]);
    const TensorType& rt = f_.type(rs->result);
    if (xt.rank() != 3 || rt.rank() != 3 || xt.dtype != ir::DType::f32 ||
        !(xt.shape[0] == rt.shape[0]) || xt.shape[2].is_symbolic() || rt.shape[2].is_symbolic()) {
      *why = "a head split is not [L,B,E] reshaped to [L,H*B,d]";
      return false;
    }
    const int64_t e = xt.shape[2].value, d = rt.shape[2].value;
    if (d <= 0 || e % d != 0) {
      *why = "the head width does not divide the model width";
      return false;
    }
    const int64_t h = e / d;
    const Dim& b = xt.shape[1];
    const Dim& mdim = rt.shape[1];
    const bool merged = b.is_symbolic() ? (mdim.symbol == b.symbol && mdim.scale == h * b.scale &&
                                           b.value == 0 && mdim.value == 0)
                                        : (!mdim.is_symbolic() && mdim.value == h * b.value);
    if (!merged) {
      *why = fmt::format("dim {} is not the {} heads times the batch {}", ir::to_string(mdim), h,
                         ir::to_string(b));
      return false;
    }
    if (m->heads != 0 && (m->heads != h || m->d != d || !(m->b == b))) {
      *why = "q, k and v split differently";
      return false;
    }
    m->heads = h;
    m->d = d;
    m->b = b;
    s->x = rs->operands[0];
    return true;
  }

  std::optional<Match> match(int pos, std::string* why) const {
    const Op& sm = f_.ops[pos];
    const TensorType& st = f_.type(sm.result);
    if (st.rank() != 3 || (sm.int_attr("axis") != -1 && sm.int_attr("axis") != 2)) {
      *why = "not a rank-3 softmax over the last axis";
      return std::nullopt;
    }
    Match m;
    m.softmax = pos;
    // Back through the score ops to Q·Kᵀ.
    ValueId v = sm.operands[0];
    const Op* op = def(v);
    std::vector<int> chain, carry;
    while (op && op->kind != OpKind::matmul) {
      const bool score_op = op->kind == OpKind::add || op->kind == OpKind::mul ||
                            op->kind == OpKind::div || op->kind == OpKind::select ||
                            op->kind == OpKind::sub;
      if (!score_op || sole_user(op->result) < 0 || !(f_.type(op->result) == st)) {
        *why = "the scores pass through an op other than add, mul, div, sub or select";
        return std::nullopt;
      }
      chain.push_back(g_.defs[op->result]);
      // The operand carrying the scores: the one of the scores' type (the first such).
      ValueId next = -1;
      for (size_t k = 0; k < op->operands.size() && next < 0; ++k)
        if (f_.type(op->operands[k]) == st && def(op->operands[k])) {
          next = op->operands[k];
          carry.push_back(static_cast<int>(k));
        }
      if (next < 0) {
        *why = "no operand of a score op carries the scores";
        return std::nullopt;
      }
      op = def(next);
    }
    if (!op) {
      *why = "the scores are no matmul";
      return std::nullopt;
    }
    const Op& qk = *op;
    if (sole_user(qk.result) < 0 || !(f_.type(qk.result) == st)) {
      *why = "Q·Kᵀ has other uses";
      return std::nullopt;
    }
    m.score_ops.assign(chain.rbegin(), chain.rend());
    m.carries.assign(carry.rbegin(), carry.rend());
    // The query, maybe scaled.
    ValueId qv = qk.operands[0];
    const Op* sc = def(qv);
    if (sc && (sc->kind == OpKind::div || sc->kind == OpKind::mul) && sole_user(qv) >= 0) {
      const Op* c = def(sc->operands[1]);
      if (c && c->kind == OpKind::constant && f_.type(c->result).rank() == 0) {
        m.scale = g_.defs[qv];
        m.scale_value = sc->operands[1];
        qv = sc->operands[0];
      }
    }
    if (!head_split(qv, {1, 0, 2}, &m.q, &m, why) ||
        !head_split(qk.operands[1], {1, 2, 0}, &m.k, &m, why))
      return std::nullopt;
    // P·V and the merge.
    const int pv = sole_user(sm.result);
    if (pv < 0 || f_.ops[pv].kind != OpKind::matmul || f_.ops[pv].operands[0] != sm.result) {
      *why = "the probabilities are not used once, by P·V";
      return std::nullopt;
    }
    if (!head_split(f_.ops[pv].operands[1], {1, 0, 2}, &m.v, &m, why)) return std::nullopt;
    const int tr = sole_user(f_.ops[pv].result);
    if (tr < 0 || !is_perm(f_.ops[tr], {1, 0, 2})) {
      *why = "P·V is not transposed back to [Lq,H*B,d]";
      return std::nullopt;
    }
    const int rs = sole_user(f_.ops[tr].result);
    const TensorType& qt = f_.type(m.q.x);
    if (rs < 0 || f_.ops[rs].kind != OpKind::reshape ||
        !(f_.type(f_.ops[rs].result) ==
          TensorType{ir::DType::f32, {qt.shape[0], m.b, Dim::constant(m.heads * m.d)}})) {
      *why = "the heads are not merged back to [Lq,B,E]";
      return std::nullopt;
    }
    m.out = rs;
    // Score operands: rank <= 2, or rank 3 leading with H*B or 1.
    for (int i : m.score_ops)
      for (ValueId o : f_.ops[i].operands) {
        const TensorType& t = f_.type(o);
        if (t == st || t.rank() <= 2) continue;
        if (t.rank() != 3 || !(t.shape[0] == st.shape[0] || t.shape[0].is_const(1))) {
          *why = fmt::format("score operand {} is {}", value_label(f_, o), ir::to_string(t));
          return std::nullopt;
        }
      }
    return m;
  }

 private:
  const Function& f_;
  UseInfo g_;
  std::vector<std::set<int>> users_;
};

void rewrite(Function& f, const Match& m) {
  size_t pos = static_cast<size_t>(m.out);  // where new ops go; the reshape moves along
  auto add = [&](OpKind kind, std::vector<ValueId> operands, ir::Attrs attrs,
                 const TensorType* declared) {
    std::vector<TensorType> types;
    for (ValueId v : operands) types.push_back(f.type(v));
    const ir::Module none;
    ir::TypeResult r = ir::infer_type(none, kind, types, attrs, declared);
    KILN_ASSERT(r.ok(), "unmerge-heads built an ill-typed " + std::string(ir::op_name(kind)) +
                            ": " + r.error);
    const ValueId v = insert_op(f, pos, pos, kind, std::move(operands), r.type, std::move(attrs));
    ++pos;
    return v;
  };
  const ir::DType f32 = ir::DType::f32;
  const Dim h = Dim::constant(m.heads), d = Dim::constant(m.d), e = Dim::constant(m.heads * m.d);
  auto heads = [&](const Split& s, std::vector<int64_t> perm) {
    const Dim l = f.type(s.x).shape[0];
    const ValueId b =
        add(OpKind::transpose, {s.x}, {{"perm", std::vector<int64_t>{1, 0, 2}}}, nullptr);
    const TensorType rt{f32, {m.b, l, h, d}};
    const ValueId r = add(OpKind::reshape, {b}, {}, &rt);
    return add(OpKind::transpose, {r}, {{"perm", perm}}, nullptr);
  };
  const ValueId qh = heads(m.q, {0, 2, 1, 3});
  const ValueId kt = heads(m.k, {0, 2, 3, 1});
  const ValueId vh = heads(m.v, {0, 2, 1, 3});
  ValueId s = add(OpKind::matmul, {qh, kt}, {}, nullptr);
  if (m.scale >= 0) {
    const OpKind kind = f.ops[m.scale].kind;
    s = add(kind, {s, m.scale_value}, {}, nullptr);
  }
  const TensorType scores = f.type(f.ops[m.softmax].operands[0]);  // [H*B, Lq, Lk]
  for (size_t n = 0; n < m.score_ops.size(); ++n) {
    const Op old = f.ops[static_cast<size_t>(m.score_ops[n])];  // before m.out: never shifted
    std::vector<ValueId> operands;
    for (size_t k = 0; k < old.operands.size(); ++k) {
      const ValueId o = old.operands[k];
      const TensorType& t = f.type(o);
      if (static_cast<int>(k) == m.carries[n]) {
        operands.push_back(s);
      } else if (t.rank() == 3 && t.shape[0] == scores.shape[0]) {
        const TensorType rt{t.dtype, {m.b, h, t.shape[1], t.shape[2]}};
        operands.push_back(add(OpKind::reshape, {o}, {}, &rt));
      } else {
        operands.push_back(o);
      }
    }
    s = add(old.kind, operands, old.attrs, nullptr);
  }
  const ValueId p = add(OpKind::softmax, {s}, {{"axis", int64_t{-1}}}, nullptr);
  const ValueId o = add(OpKind::matmul, {p, vh}, {}, nullptr);
  const ValueId ot =
      add(OpKind::transpose, {o}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}}, nullptr);
  const TensorType bt{f32, {m.b, f.type(m.q.x).shape[0], e}};
  const ValueId ob = add(OpKind::reshape, {ot}, {}, &bt);
  Op& out = f.ops[pos];  // the head-merging reshape, rewritten in place
  out.kind = OpKind::transpose;
  out.operands = {ob};
  out.attrs = {{"perm", std::vector<int64_t>{1, 0, 2}}};
}

}  // namespace

bool unmerge_heads(ir::Module& module) {
  return rewrite_functions(module, [](Function& f) {
    std::vector<Match> matches;
    {
      const Matcher mt(f);
      for (size_t i = 0; i < f.ops.size(); ++i) {
        if (f.ops[i].kind != OpKind::softmax) continue;
        std::string why;
        if (std::optional<Match> m = mt.match(static_cast<int>(i), &why)) {
          debug_log(kPass, "{}: batch-first heads ({} heads of {})",
                    value_label(f, f.ops[m->out].result), m->heads, m->d);
          matches.push_back(*m);
        } else {
          debug_log(kPass, "softmax {}: {}", value_label(f, f.ops[i].result), why);
        }
      }
    }
    if (matches.empty()) return false;
    // From the last match back: inserting before a later reshape leaves earlier ops in place.
    for (auto it = matches.rbegin(); it != matches.rend(); ++it) rewrite(f, *it);
    remove_dead_code(f);
    return true;
  });
}

}  // namespace kiln::passes
