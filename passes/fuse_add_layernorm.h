// fuse-add-layernorm: a residual add feeding a layernorm becomes one op.
//
//   %s = add(%x, %y) : f32[B,S,D]
//   %n = layernorm(%s, %g, %b) {eps}      =>   %n = add_layernorm(%x, %y, %g, %b) {eps}
//
// Fires only when the add's two operands have the same type (no broadcasting: a bias
// add of f32[D] to f32[B,S,D] stays an add) and the add's result has no other use (a
// use elsewhere, e.g. as the next residual, would need the sum anyway). The layernorm
// keeps its result value (name and uses); the absorbed add is removed. Every other op
// is left as it was, except that ops dead before the pass are removed from a function
// the pass changed.
//
// In the Transformer every post-norm `LayerNorm(x + sublayer(x))` fuses; the final
// encoder/decoder norms (whose input is a layernorm) stay layernorm.
// Pre: verified. Post: verified; returns whether anything fused.
#pragma once

#include "ir/ir.h"

namespace kiln::passes {
bool fuse_add_layernorm(ir::Module& module);
}  // namespace kiln::passes
