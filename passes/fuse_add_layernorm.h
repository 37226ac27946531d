// fuse-add-layernorm: a residual add feeding a layernorm becomes one op.
//
//   %s = add(%x, %y) : f32[B,S,D]
//   %n = layernorm(%s, %g, %b) {eps}      =>   %n = add_layernorm(%x, %y, %g, %b) {eps}
//
// The add_layernorm keeps every attribute of the layernorm (eps, and the variant's
// unbiased and eps_outside, e.g. {eps = 1e-06, eps_outside = 1, unbiased = 1}, or rms = 1
// for an RMSNorm, whose operands are then (x, y, gamma)): each variant fuses alike.
//
// Pre-norm blocks (`h = x + attn(ln1(x)); y = h + ffn(ln2(h))`) use the sum again as the
// next residual; then the add_layernorm gives it too, as its second output:
//
//   %s = add(%x, %y)                             %n = add_layernorm(%x, %y, %g, %b) {eps}
//   %n = layernorm(%s, %g, %b) {eps}        =>   %s = add_layernorm_sum(%n)
//   %t = add(%s, %z)                             %t = add(%s, %z)
//
// Fires when the add's two operands have the same type, or one broadcasts over the other's
// leading dims (ir::broadcasts_over_leading_dims: its shape a suffix of the other's after
// leading 1s: learned positions [S,D] or ViT's [1,S,D] added to token embeddings [B,S,D], or
// a bias [D]; it becomes add_layernorm's y), and every other use of
// the sum comes after the layernorm (the sum op is placed right after it; a use before the
// layernorm leaves both ops as they are, logged). The layernorm keeps its result value (name and
// uses); the add_layernorm_sum takes the add's name and its other uses (results included); the
// absorbed add is removed. Of several layernorms of one sum, only the first absorbs it;
// the others read the add_layernorm_sum. Every other op is left as it was, except that
// ops dead before the pass are removed from a function the pass changed.
//
// A refusal of a residual add (a broadcast of another kind, a sum read before the norm) is a
// lost-fusion note (passes/notes.h). In the Transformer every post-norm `LayerNorm(x +
// sublayer(x))` fuses; the final encoder/decoder norms (whose input is a layernorm) stay layernorm.
// Pre: verified. Post: verified; returns whether anything fused.
#pragma once

#include "ir/ir.h"

namespace kiln::passes {
bool fuse_add_layernorm(ir::Module& module);
}  // namespace kiln::passes
