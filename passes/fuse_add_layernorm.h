// fuse-add-layernorm: a residual add feeding a layernorm becomes one op.
//
//   %s = add(%x, %y) : f32[B,S,D]
//   %n = layernorm(%s, %g, %b) {eps}      =>   %n = add_layernorm(%x, %y, %g, %b) {eps}
//
// Fires only when the add's operands have the same type (no broadcasting) and its
// result has no other use. Pre: verified. Post: verified.
#pragma once

#include "ir/ir.h"

namespace kiln::passes {
bool fuse_add_layernorm(ir::Module& module);
}  // namespace kiln::passes
