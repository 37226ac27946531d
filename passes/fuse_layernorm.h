// fuse-layernorm: LayerNorm written out with a mean, a variance and elementwise ops becomes
// one op, the row-wise norm kernel's (layernorm, ir/ops.def):
//
//   %m  = reduce_mean(%x) {axes = [-1], keepdims = 1}
//   %d  = sub(%x, %m)
//   %q  = mul(%d, %d)                                    (Pow(d, 2) as kiln import writes it)
//   %v  = reduce_mean(%q) {axes = [-1], keepdims = 1}
//   %e  = add(%v, %eps)
//   %s  = sqrt(%e)
//   %n  = div(%d, %s)
//   %y  = mul(%n, %w)
//   %o  = add(%y, %b)                     =>   %o = layernorm(%x, %w, %b) {eps}
//
// What torch.onnx.export writes for nn.LayerNorm below opset 17, and what hand-written norms
// are. The spellings recognized, each in either operand order of its adds and muls:
//   eps inside the root     (x - mean) / sqrt(var + eps)            (nn.LayerNorm, BERT's own)
//   eps outside the root    (x - mean) / (sqrt(var) + eps)          -> eps_outside = 1
//   unbiased variance       var * N / (N - 1) (x.std(): scalar constants multiplying or
//                           dividing the mean of squares, their product N/(N-1), N the last
//                           dim)                                    -> unbiased = 1
//   the reciprocal root     (x - mean) * rsqrt(var + eps)
//   the weight first        w * (x - mean) / ..., or after: ... * w; either optional, as is
//                           the bias (+ b); missing ones become constants 1 and 0 of [D].
// The two (x - mean)s may be separate ops (each sub of x and its own mean over the last axis).
// Every intermediate must be used only within the pattern; w and b of type f32[D].
//
// Lost fusions: a mean of (x - mean(x))² that feeds a root and does not match is norm-shaped;
// the pass says why with a note (passes/notes.h) at the mean's source line.
//
// Runs before fuse-rmsnorm (whose pattern a centered x would also match: the RMS of x - mean)
// and before fuse-add-layernorm, so a residual add feeding the norm
// becomes add_layernorm. The rewritten op is the last op matched (it keeps its value, name and
// location); the rest is removed as dead code.
// Pre: verified. Post: verified; returns whether anything fused.
#pragma once

#include "ir/ir.h"

namespace kiln::passes {
bool fuse_layernorm(ir::Module& module);
}  // namespace kiln::passes
