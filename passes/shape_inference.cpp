// shape-inference: checks every op's declared result type against the one its type
// rule infers (see shape_inference.h).
//
// Algorithm: one walk over each function in op order. Parameter types are taken as
// declared; each op's operand types are then known (every operand is defined earlier),
// so its rule gives its result type, which must equal the declared one. The first
// disagreement throws, so every type the walk relies on has been checked already.
#include "passes/shape_inference.h"

#include <string>
#include <vector>

#include "ir/op_types.h"
#include "support/error.h"

namespace kiln::passes {
namespace {

// Throws when `type` names a symbol the module does not declare.
void check_symbols(const ir::Module& m, const ir::TensorType& type, const std::string& where) {
  for (const ir::Dim& d : type.shape)
    if (d.is_symbolic() && !m.find_symbol(d.symbol))
      fail("shape inference: {}: type {} uses undeclared symbol '{}'", where, ir::to_string(type),
           d.symbol);
}

void infer_function(const ir::Module& m, const ir::Function& f) {
  const int nvalues = static_cast<int>(f.values.size());
  std::vector<bool> defined(nvalues, false);
  for (ir::ValueId p : f.params) {
    if (p < 0 || p >= nvalues)
      fail("shape inference: in function '{}': parameter refers to missing value {}", f.name, p);
    defined[p] = true;
    check_symbols(m, f.type(p),
                  fmt::format("in function '{}', parameter %{}", f.name, f.values[p].name));
  }
  for (size_t i = 0; i < f.ops.size(); ++i) {
    const ir::Op& op = f.ops[i];
    const std::string where = fmt::format("{}in function '{}', op {} ({})", ir::line_prefix(op.loc),
                                          f.name, i, ir::op_name(op.kind));
    std::vector<ir::TensorType> operand_types;
    for (ir::ValueId v : op.operands) {
      if (v < 0 || v >= nvalues || !defined[v])
        fail("shape inference: {}: operand {} is not defined before the op", where, v);
      operand_types.push_back(f.type(v));
    }
    if (op.result < 0 || op.result >= nvalues)
      fail("shape inference: {}: result refers to missing value {}", where, op.result);
    if (defined[op.result])
      fail("shape inference: {}: value {} is defined twice", where, op.result);
    const ir::TensorType& declared = f.type(op.result);
    check_symbols(m, declared, where);
    ir::TypeResult r = ir::infer_type(m, op.kind, operand_types, op.attrs, &declared);
    if (!r.ok()) fail("shape inference: {}: {}", where, r.error);
    if (!(r.type == declared))
      fail("shape inference: {}: result type is {}, expected {}", where, ir::to_string(declared),
           ir::to_string(r.type));
    defined[op.result] = true;
  }
  for (ir::ValueId r : f.results)
    if (r < 0 || r >= nvalues || !defined[r])
      fail("shape inference: in function '{}': return refers to undefined value {}", f.name, r);
}

}  // namespace

bool shape_inference(ir::Module& module) {
  for (const ir::Function& f : module.functions) infer_function(module, f);
  return false;
}

}  // namespace kiln::passes
