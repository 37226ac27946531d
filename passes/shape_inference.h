// shape-inference: recomputes every op's result type from its operands with the op
// type rules (ir/op_types.h), propagating symbolic dims through the function.
//
// Types in the IR are always explicit, so this pass is the check that they are
// consistent: a result type that disagrees with the one its rule infers (or an op its
// rule rejects) throws kiln::Error naming the function, the op and both types:
//   shape inference: in function 'forward', op 12 (matmul): result type is f32[B,S,7],
//   expected f32[B,S,24]
// Pre: a parsed module. Post: every result type equals its inferred type. Changes nothing.
#pragma once

#include "ir/ir.h"

namespace kiln::passes {
bool shape_inference(ir::Module& module);
}  // namespace kiln::passes
