// shape-inference: recomputes every op's result type from its operands with the op
// type rules (ir/op_types.h), propagating symbolic dims through the function.
//
// Types in the IR are always explicit, so this pass is the check that they are
// consistent: a result type that disagrees with the one its rule infers (or an op its
// rule rejects) throws kiln::Error naming the function, the op and both types:
//   shape inference: in function 'forward', op 12 (matmul): result type is f32[B,S,7],
//   expected f32[B,S,24]
// A rule's rejection is reported with the rule's message:
//   shape inference: in function 'f', op 3 (add): operand shapes [B,S,24] and [B,S,5]
//   do not broadcast
// It never asserts on a malformed function: an operand used before its definition, a
// value defined twice or an undeclared symbol in a type is reported the same way.
// Pre: a parsed module (not necessarily verified). Post: every result type equals its
// inferred type. Changes nothing (returns false).
#pragma once

#include "ir/ir.h"

namespace kiln::passes {
bool shape_inference(ir::Module& module);
}  // namespace kiln::passes
