// fuse-gelu: GELU written out with erf or tanh becomes one op (gelu, gelu_tanh), which
// fuse-linear then absorbs into a linear's epilogue as it does the DSL's dsl::gelu:
//
//   %u = div(%x, 1.4142135)         (or mul(%x, 0.70710678))
//   %e = erf(%u)
//   %t = add(%e, 1)
//   %p = mul(%x, %t)
//   %y = mul(%p, 0.5)                                 =>   %y = gelu(%x)
//
//   %c = mul(mul(%x, %x), %x)       (Pow(x, 3))
//   %i = add(%x, mul(%c, 0.044715))
//   %h = tanh(mul(%i, 0.7978845608))
//   %y = mul(mul(%x, 0.5), add(1, %h))               =>   %y = gelu_tanh(%x)
//
// What torch.onnx.export writes for nn.GELU / F.gelu (opsets below 20 have no Gelu) and
// F.gelu(approximate="tanh"), and how BERT and GPT-2 write theirs by hand. Each add and mul
// in either operand order; the final product of x, 0.5 and (1 + erf/tanh) in any grouping:
// (x · t) · 0.5, (x · 0.5) · t, x · (t · 0.5). Constants are rank-0 f32 and must equal those
// values to 1e-6 relative; every intermediate is used only by the next step. The rewritten
// op is the final mul (it keeps its value, name and location); the rest is removed.
// Pre: verified. Post: verified; returns whether anything fused.
#pragma once

#include "ir/ir.h"

namespace kiln::passes {
bool fuse_gelu(ir::Module& module);
}  // namespace kiln::passes
