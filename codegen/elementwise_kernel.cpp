// The elementwise kernel (kernels.h): one Halide Func over the output's dims whose value
// is the spec's expression tree, with numpy broadcasting, gathers, iota and constants.
//
// Indexing: IR dim i of a rank-n value is Halide dim n-1-i. Broadcasting aligns IR dims
// to the right, so it aligns Halide dims to the left: an operand of rank m is read at the
// first m indices of its consumer, whatever their ranks. A dim whose broadcast flag is
// set has extent 1 and is read at index 0. A gather's ids are its leading IR dims: the
// gather's first Halide dims (one fewer than the table's rank) index the table row and the
// rest index the ids. A transpose reads its operand at permuted indices (a copy kernel
// when it is the only op).
//
// Numerics follow the interpreter (ir/interpreter.cpp): i64 division truncates toward
// zero (a zero divisor gives 0 here instead of an error, and x / -1 wraps), f32 -> i64
// casts truncate, casts to bool test for nonzero, and f32 maximum and relu propagate NaN.
//
// Schedule: the innermost dim in vectors (guarded tails, so any extent works), the other
// dims fused and run in parallel blocks of about 4096 elements. On a GPU target: a thread
// per output element, all dims fused, blocks of 256 threads.
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "codegen/halide_kernels.h"
#include "support/error.h"

namespace kiln::codegen {

namespace {

using Dtype = ElementwiseKernel::Dtype;
using Node = ElementwiseKernel::Node;
using Halide::Expr;
using Halide::ImageParam;

Halide::Type halide_type(Dtype d) {
  switch (d) {
    case Dtype::f32:
      return Halide::Float(32);
    case Dtype::i64:
      return Halide::Int(64);
    case Dtype::u8:
      return Halide::UInt(8);
  }
  KILN_ASSERT(false, "bad elementwise dtype");
  return {};
}

using ir::OpKind;
using Kind = Node::Kind;

bool is_op(const Node& node, OpKind kind) { return node.kind == Kind::op && node.op == kind; }

// What signatures and messages call the node.
const char* node_name(const Node& node) {
  if (node.kind == Kind::input) return "input";
  if (node.kind == Kind::constant) return "constant";
  return ir::op_name(node.op);
}

// Operand count of a supported node; -1 for an unsupported op.
int arity(const Node& node) {
  if (node.kind != Kind::op) return 0;
  if (ir::is_elementwise(node.op) || node.op == OpKind::iota || node.op == OpKind::gather ||
      node.op == OpKind::transpose || node.op == OpKind::take_along_axis)
    return ir::op_info(node.op).min_operands;
  return -1;
}

Expr to_u8(const Expr& cond) { return Halide::cast(Halide::UInt(8), cond); }

// Whether a value is nonzero (NaN is; -0.0 is not), for f32 from its bits (is_nan_bits).
Expr nonzero(const Expr& e) {
  if (!e.type().is_float()) return e != Halide::Internal::make_zero(e.type());
  const Expr bits = Halide::reinterpret(Halide::UInt(32, e.type().lanes()), e);
  return (bits & Expr(uint32_t{0x7fffffff})) != Expr(uint32_t{0});
}

// ---------------------------------------------------------------------------------
// The pointwise ops (kPointwise in ir/ops.def): each is one function halide_<name> giving
// the node's value from its operands' values `in` (of the dtypes the op's type rule accepts;
// those of a binary op are equal).
using Operands = std::vector<Expr>;

Expr halide_add(const Node&, const Operands& in) { return in[0] + in[1]; }
Expr halide_sub(const Node&, const Operands& in) { return in[0] - in[1]; }
Expr halide_mul(const Node&, const Operands& in) { return in[0] * in[1]; }
Expr halide_div(const Node&, const Operands& in) {
  const Expr &a = in[0], &b = in[1];
  if (a.type().is_float()) return a / b;
  // Truncating division without traps: x / 0 = 0 and x / -1 = -x (wrapping).
  const Expr zero = Halide::Internal::make_zero(b.type());
  const Expr one = Halide::Internal::make_one(b.type());
  const Expr minus_one = Halide::Internal::make_const(b.type(), -1);
  const Expr safe = Halide::select(b == zero || b == minus_one, one, b);
  return Halide::select(b == zero, zero, b == minus_one, zero - a,
                        Halide::div_round_to_zero(a, safe));
}
Expr halide_minimum(const Node&, const Operands& in) {
  const Expr &a = in[0], &b = in[1];
  if (!a.type().is_float()) return Halide::min(a, b);
  return Halide::select(is_nan_bits(a), a, is_nan_bits(b), b, Halide::min(a, b));
}
Expr halide_maximum(const Node&, const Operands& in) {
  const Expr &a = in[0], &b = in[1];
  if (!a.type().is_float()) return Halide::max(a, b);
  return Halide::select(is_nan_bits(a), a, is_nan_bits(b), b, Halide::max(a, b));
}
Expr halide_eq(const Node&, const Operands& in) { return to_u8(in[0] == in[1]); }
Expr halide_ne(const Node&, const Operands& in) { return to_u8(in[0] != in[1]); }
Expr halide_lt(const Node&, const Operands& in) { return to_u8(in[0] < in[1]); }
Expr halide_le(const Node&, const Operands& in) { return to_u8(in[0] <= in[1]); }
Expr halide_gt(const Node&, const Operands& in) { return to_u8(in[0] > in[1]); }
Expr halide_ge(const Node&, const Operands& in) { return to_u8(in[0] >= in[1]); }
Expr halide_logical_and(const Node&, const Operands& in) {
  return to_u8(nonzero(in[0]) && nonzero(in[1]));
}
Expr halide_logical_or(const Node&, const Operands& in) {
  return to_u8(nonzero(in[0]) || nonzero(in[1]));
}
Expr halide_logical_not(const Node&, const Operands& in) { return to_u8(!nonzero(in[0])); }
Expr halide_relu(const Node&, const Operands& in) {
  const Expr& a = in[0];
  if (!a.type().is_float()) return Halide::max(a, Halide::Internal::make_zero(a.type()));
  return relu_keeping_nan(a);
}
Expr halide_neg(const Node&, const Operands& in) {
  return Halide::Internal::make_zero(in[0].type()) - in[0];
}
// The f32 math functions, by float_function (halide_kernels.h).
Expr math(OpKind kind, const Operands& in) {
  KILN_ASSERT(in[0].type().is_float(),
              fmt::format("elementwise {} of a non-f32 operand", ir::op_name(kind)));
  return float_function(ir::op_name(kind), in[0]);
}
Expr halide_exp(const Node&, const Operands& in) { return math(OpKind::exp, in); }
Expr halide_sqrt(const Node&, const Operands& in) { return math(OpKind::sqrt, in); }
Expr halide_log(const Node&, const Operands& in) { return math(OpKind::log, in); }
Expr halide_tanh(const Node&, const Operands& in) { return math(OpKind::tanh, in); }
Expr halide_erf(const Node&, const Operands& in) { return math(OpKind::erf, in); }
Expr halide_sigmoid(const Node&, const Operands& in) { return math(OpKind::sigmoid, in); }
Expr halide_gelu(const Node&, const Operands& in) { return math(OpKind::gelu, in); }
Expr halide_gelu_tanh(const Node&, const Operands& in) { return math(OpKind::gelu_tanh, in); }
Expr halide_silu(const Node&, const Operands& in) { return math(OpKind::silu, in); }
Expr halide_sin(const Node&, const Operands& in) { return math(OpKind::sin, in); }
Expr halide_cos(const Node&, const Operands& in) { return math(OpKind::cos, in); }
Expr halide_rsqrt(const Node&, const Operands& in) { return math(OpKind::rsqrt, in); }
Expr halide_abs(const Node&, const Operands& in) {
  const Expr& a = in[0];
  // Halide::abs of an integer is unsigned; wrap back (the most negative value stays itself).
  if (!a.type().is_float()) return Halide::select(a < 0, Halide::cast(a.type(), 0) - a, a);
  return Halide::abs(a);  // fabs: a NaN stays NaN (its sign cleared, as std::fabs)
}
Expr halide_sign(const Node&, const Operands& in) {
  const Expr& a = in[0];
  KILN_ASSERT(a.type().is_float(), "elementwise sign of a non-f32 operand");
  return Halide::select(is_nan_bits(a), a, a > 0.0f, 1.0f, a < 0.0f, -1.0f, 0.0f);
}
Expr halide_select(const Node&, const Operands& in) {
  KILN_ASSERT(in[1].type() == in[2].type(), "elementwise select branch dtypes differ");
  return Halide::select(nonzero(in[0]), in[1], in[2]);
}
Expr halide_cast(const Node& node, const Operands& in) {
  const Expr& a = in[0];
  const Halide::Type to = halide_type(node.dtype);
  if (to == a.type()) return a;
  if (to.is_uint() && to.bits() == 8) return to_u8(nonzero(a));
  return Halide::cast(to, a);  // f32 -> i64 truncates toward zero
}

// expand: nodes are evaluated at the kernel's output coordinates, where the operand's value
// is already the broadcast one.
Expr halide_expand(const Node&, const Operands& in) { return in[0]; }

// The value of a pointwise node: its op's halide_<name>.
Expr pointwise(const Node& node, const Operands& in) {
  if (in.size() == 2)
    KILN_ASSERT(in[0].type() == in[1].type(), "elementwise binary operand dtypes differ");
  switch (node.op) {
#define KILN_OP(name, ...)
#define KILN_POINTWISE_OP(name, ...) \
  case OpKind::name:                 \
    return halide_##name(node, in);
#include "ir/ops.def"
    default:
      KILN_ASSERT(false, fmt::format("elementwise op without an expression: {}", node_name(node)));
      return {};
  }
}

// Builds the Halide expression of each node; one ImageParam per buffer input.
class ExprBuilder {
 public:
  explicit ExprBuilder(const ElementwiseKernel& spec) : spec_(spec) {
    KILN_ASSERT(!spec.nodes.empty(), "elementwise kernel without nodes");
    for (size_t n = 0; n < spec.nodes.size(); ++n) check_node(static_cast<int>(n));
  }

  // The buffer inputs in the order of their `input` indices.
  std::vector<Halide::Argument> arguments() const {
    std::vector<Halide::Argument> args;
    for (const auto& [index, param] : params_) args.push_back(param);
    return args;
  }

  // The value of node `n` at Halide index `idx` (one index per dim of the node). A node
  // read twice at the same index gives the same Expr, so shared subtrees stay shared.
  Expr emit(int n, std::vector<Expr> idx) {
    const Node& node = spec_.nodes[n];
    KILN_ASSERT(static_cast<int>(idx.size()) == node.rank, "elementwise index rank");
    for (int i = 0; i < static_cast<int>(node.broadcast.size()); ++i)
      if (node.broadcast[i]) idx[node.rank - 1 - i] = 0;
    for (const auto& [at, value] : memo_[n]) {
      bool same = true;
      for (size_t j = 0; same && j < idx.size(); ++j) same = Halide::Internal::equal(at[j], idx[j]);
      if (same) return value;
    }
    Expr e = compute(n, idx);
    memo_[n].emplace_back(std::move(idx), e);
    return e;
  }

 private:
  Expr compute(int n, const std::vector<Expr>& idx) {
    const Node& node = spec_.nodes[n];
    const Halide::Type type = halide_type(node.dtype);

    if (node.kind == Kind::input) return params_.at(node.input)(idx);
    if (node.kind == Kind::constant) {
      if (node.dtype == Dtype::f32) return Expr(static_cast<float>(node.value));
      if (node.dtype == Dtype::i64) return Expr(static_cast<int64_t>(node.value));
      return Expr(static_cast<uint8_t>(node.value != 0 ? 1 : 0));
    }
    if (node.op == OpKind::iota) {
      const int64_t axis = node.axis < 0 ? node.axis + node.rank : node.axis;
      return Halide::cast(type, idx[node.rank - 1 - axis]);
    }
    if (node.op == OpKind::gather) return emit_gather(node, idx);
    if (node.op == OpKind::take_along_axis) return emit_take_along_axis(node, idx);
    if (node.op == OpKind::transpose) {
      // IR dim d of the node is IR dim perm[d] of the operand; Halide dims are reversed.
      std::vector<Expr> at(idx.size());
      for (int d = 0; d < node.rank; ++d)
        at[static_cast<size_t>(node.rank - 1 - node.perm[d])] = idx[node.rank - 1 - d];
      return emit(node.operands[0], at);
    }

    std::vector<Expr> in;
    for (int o : node.operands) {
      const int rank = spec_.nodes[o].rank;
      in.push_back(emit(o, std::vector<Expr>(idx.begin(), idx.begin() + rank)));
    }
    Expr e = pointwise(node, in);
    KILN_ASSERT(e.type() == type, fmt::format("elementwise node {} ({}) computes a value of the "
                                              "wrong dtype",
                                              n, node_name(node)));
    return e;
  }

  // Checks the structure of node `n` and creates the ImageParam of an input.
  void check_node(int n) {
    const Node& node = spec_.nodes[n];
    if (arity(node) < 0) fail("elementwise kernel: unsupported op '{}'", node_name(node));
    KILN_ASSERT(static_cast<int>(node.operands.size()) == arity(node),
                fmt::format("elementwise node {} ({}): operand count", n, node_name(node)));
    KILN_ASSERT(node.rank >= 0 && node.broadcast.size() <= static_cast<size_t>(node.rank),
                fmt::format("elementwise node {} ({}): rank", n, node_name(node)));
    for (int o : node.operands) {
      KILN_ASSERT(o >= 0 && o < n, fmt::format("elementwise node {}: bad operand {}", n, o));
      if (is_op(node, OpKind::transpose))
        KILN_ASSERT(
            spec_.nodes[o].rank == node.rank && static_cast<int>(node.perm.size()) == node.rank,
            fmt::format("elementwise node {}: transpose rank", n));
      if (!is_op(node, OpKind::gather))
        KILN_ASSERT(spec_.nodes[o].rank <= node.rank,
                    fmt::format("elementwise node {}: operand {} has a higher rank", n, o));
    }
    if (node.kind == Kind::input) {
      KILN_ASSERT(node.input >= 0, "elementwise input without an index");
      auto it = params_.find(node.input);
      if (it == params_.end()) {
        params_.emplace(node.input, ImageParam(halide_type(node.dtype), node.rank,
                                               fmt::format("input{}", node.input)));
      } else {
        KILN_ASSERT(
            it->second.type() == halide_type(node.dtype) && it->second.dimensions() == node.rank,
            fmt::format("elementwise input {} used with two types", node.input));
      }
    }
    if (is_op(node, OpKind::iota)) {
      const int64_t axis = node.axis < 0 ? node.axis + node.rank : node.axis;
      KILN_ASSERT(axis >= 0 && axis < node.rank, "elementwise iota axis out of range");
      KILN_ASSERT(node.dtype == Dtype::i64, "elementwise iota must be i64");
    }
    if (is_op(node, OpKind::take_along_axis)) {
      const Node& x = spec_.nodes[node.operands[0]];
      const Node& ids = spec_.nodes[node.operands[1]];
      if (x.kind != Kind::input)
        fail("elementwise kernel: unsupported take_along_axis from a {} (needs an input)",
             node_name(x));
      const int64_t axis = node.axis < 0 ? node.axis + node.rank : node.axis;
      KILN_ASSERT(ids.dtype == Dtype::i64 && ids.rank == node.rank && x.rank == node.rank &&
                      x.dtype == node.dtype && axis >= 0 && axis < node.rank,
                  fmt::format("elementwise node {}: take_along_axis operands", n));
    }
    if (is_op(node, OpKind::gather)) {
      const Node& table = spec_.nodes[node.operands[0]];
      const Node& ids = spec_.nodes[node.operands[1]];
      if (table.kind != Kind::input || table.rank < 1)
        fail(
            "elementwise kernel: unsupported gather from a {} of rank {} (needs an input "
            "table of rank >= 1)",
            node_name(table), table.rank);
      KILN_ASSERT(ids.dtype == Dtype::i64 && ids.rank == node.rank - (table.rank - 1) &&
                      table.dtype == node.dtype,
                  fmt::format("elementwise node {}: gather operands", n));
    }
  }

  // out(d..., i...) = table(d..., clamp(ids(i...), 0, rows - 1)): the first Halide dims
  // (as many as the table has besides its rows) index the table's row, the others the ids.
  Expr emit_gather(const Node& node, const std::vector<Expr>& idx) {
    const Node& table = spec_.nodes[node.operands[0]];
    const ImageParam& t = params_.at(table.input);
    const size_t inner = static_cast<size_t>(table.rank - 1);
    const Expr id = emit(node.operands[1], std::vector<Expr>(idx.begin() + inner, idx.end()));
    // The rows the spec declares; Halide checks that the table buffer has them. Without
    // them, the rows the buffer has.
    const Expr last = node.table_rows > 0
                          ? Expr(node.table_rows - 1)
                          : Halide::cast(Halide::Int(64), t.dim(table.rank - 1).max());
    const Expr row = Halide::cast(Halide::Int(32), Halide::clamp(id, Expr(int64_t{0}), last));
    std::vector<Expr> at(idx.begin(), idx.begin() + inner);
    at.push_back(row);
    return t(at);
  }

  // out(i...) = x(i... with i[axis] = clamp(ids(i...), 0, extent - 1)): an index out of range
  // is clamped (the interpreter refuses it).
  Expr emit_take_along_axis(const Node& node, const std::vector<Expr>& idx) {
    const Node& x = spec_.nodes[node.operands[0]];
    const ImageParam& t = params_.at(x.input);
    const int64_t axis = node.axis < 0 ? node.axis + node.rank : node.axis;
    const int h = static_cast<int>(node.rank - 1 - axis);
    const Expr id = emit(node.operands[1], idx);
    const Expr last = Halide::cast(Halide::Int(64), t.dim(h).max());
    std::vector<Expr> at = idx;
    at[static_cast<size_t>(h)] =
        Halide::cast(Halide::Int(32), Halide::clamp(id, Expr(int64_t{0}), last));
    return t(at);
  }

  const ElementwiseKernel& spec_;
  std::map<int, ImageParam> params_;                                     // by input index
  std::map<int, std::vector<std::pair<std::vector<Expr>, Expr>>> memo_;  // node -> (idx, value)
};

}  // namespace

KernelPipeline build_elementwise(const ElementwiseKernel& spec, const Halide::Target& target) {
  ExprBuilder builder(spec);
  const int rank = spec.out_rank;
  const Node& last = spec.nodes.back();
  KILN_ASSERT(rank >= 0 && last.rank <= rank, "elementwise output rank");

  // Not named v<N>: Halide gives implicitly named Vars such names.
  std::vector<Halide::Var> vars;
  for (int i = 0; i < rank; ++i) vars.emplace_back(fmt::format("dim{}", i));
  Halide::Func out("elementwise");
  out(vars) = builder.emit(static_cast<int>(spec.nodes.size()) - 1,
                           std::vector<Expr>(vars.begin(), vars.begin() + last.rank));

  KernelPipeline kp{Halide::Pipeline(out), builder.arguments()};
  if (target.has_gpu_feature()) {
    // One GPU thread per output element, blocks of 256 over all dims fused (any extents:
    // a broadcast or a dim of 1 costs no idle threads), innermost dim fastest.
    if (rank == 0) {
      out.gpu_single_thread();
      kp.gpu_threads = 1;
      return kp;
    }
    Halide::Var all = vars[0];
    for (int i = 1; i < rank; ++i) {
      Halide::Var fused(fmt::format("all{}", i));
      out.fuse(all, vars[i], fused);
      all = fused;
    }
    Halide::Var block("block"), thread("thread");
    out.gpu_tile(all, block, thread, 256, Halide::TailStrategy::GuardWithIf);
    kp.gpu_threads = 256;
    return kp;
  }
  if (rank >= 1) out.vectorize(vars[0], vector_lanes(target), Halide::TailStrategy::GuardWithIf);
  if (rank >= 2) {
    Halide::Var rows = vars[1];
    for (int i = 2; i < rank; ++i) {
      Halide::Var fused(fmt::format("rows{}", i));
      out.fuse(rows, vars[i], fused);
      rows = fused;
    }
    // About 4096 elements per parallel task, whatever the row length.
    const Expr row_len = out.output_buffer().dim(0).extent();
    const Expr task_rows = Halide::max(1, 4096 / Halide::max(row_len, 1));
    out.parallel(rows, task_rows, Halide::TailStrategy::GuardWithIf);
  }
  return kp;
}

}  // namespace kiln::codegen
