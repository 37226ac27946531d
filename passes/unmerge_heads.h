// unmerge-heads: attention written with batch and heads merged into one leading dim, the
// sequence first, as PyTorch's nn.MultiheadAttention computes it (and torch.onnx.export
// writes it), is rewritten into the batch-first [B, H, L, d] form that fuse-attention
// recognizes:
//
//   %qh = transpose(reshape(%q : [Lq,B,E]) : [Lq,H*B,d]) {perm = [1,0,2]}   (H*B: b*H + h)
//   %qs = div(%qh, c)                                      (optional; or mul: the scale first)
//   %kt = transpose(reshape(%k : [Lk,B,E]) : [Lk,H*B,d]) {perm = [1,2,0]}
//   %vh = transpose(reshape(%v : [Lk,B,E]) : [Lk,H*B,d]) {perm = [1,0,2]}
//   %s  = matmul(%qs, %kt) : [H*B,Lq,Lk]
//   %m  = add(%s, %mask) ...                   (any adds, muls, divs, selects of the scores)
//   %p  = softmax(%m) {axis = -1}
//   %o  = reshape(transpose(matmul(%p, %vh)) {perm = [1,0,2]}) : [Lq,B,E]
// =>
//   %qb = transpose(%q) {perm = [1,0,2]} : [B,Lq,E]          (and %kb, %vb)
//   %s  = div(matmul(transpose(reshape(%qb) : [B,Lq,H,d]) {perm = [0,2,1,3]},
//                    transpose(reshape(%kb) : [B,Lk,H,d]) {perm = [0,2,3,1]}), c)
//   ... the same score ops, each operand of [H*B, x, y] reshaped to [B,H,x,y] ...
//   %o  = transpose(reshape(transpose(matmul(softmax(...), %vh4)) {perm = [0,2,1,3]})
//                   : [B,Lq,E]) {perm = [1,0,2]} : [Lq,B,E]
//
// Score operands of rank <= 2 broadcast as before; rank-3 ones must have H*B or 1 leading.
// Moving the scale from the query to the scores may change the last bit of a score. Every
// intermediate must be used only within the pattern; the final reshape is rewritten in place
// (it keeps its value and location), the rest is removed as dead code.
// Pre: verified. Post: verified; returns whether anything was rewritten.
#pragma once

#include "ir/ir.h"

namespace kiln::passes {
bool unmerge_heads(ir::Module& module);
}  // namespace kiln::passes
