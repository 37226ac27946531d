// fuse-attention: scaled dot-product attention with its head split and merge becomes
// one `attention` op, which a kernel computes without ever storing the score matrix
// (online softmax over blocks of keys).
//
//   %qh = transpose(reshape(%q) : [B,Lq,H,dk]) {perm=[0,2,1,3]}
//   %kt = transpose(reshape(%k) : [B,Lk,H,dk]) {perm=[0,2,3,1]}
//   %vh = transpose(reshape(%v) : [B,Lk,H,dv]) {perm=[0,2,1,3]}
//   %s  = div(matmul(%qh, %kt), c)                 (or mul by c)
//   %sm = select(%mask, -1e9, %s)                  (optional)
//   %p  = softmax(%sm) {axis=-1}
//   %o  = reshape(transpose(matmul(%p, %vh)) {perm=[0,2,1,3]}) : [B,Lq,H*dv]
// =>
//   %o  = attention(%q, %k, %v [, %key_pad]) {causal = 0|1, heads = H, scale = 1/c}
//
// The attention op: q [B,Lq,H*dk], k [B,Lk,H*dk], v [B,Lk,H*dv], optional key_pad
// bool [B,Lk] (true = padding key); per batch b, head h and query i the scores are
// s_j = (q_h[i]·k_h[j]) * scale, set to -1e9 where key_pad[b,j] or (causal and j > i),
// then softmax over j and the weighted sum of v_h rows. Result [B,Lq,H*dv].
//
// Recognized masks: the select's condition, which may have other uses, in any layout that
// broadcasts to the scores [B,H,Lq,Lk] ([L,L], [1,1,L,L], [B,1,1,Lk], [B,1,L,L], ...),
// as a mask `select(%mask, -1e9, %s)` or as a keep mask `select(%keep, %s, -1e9)`; its
// masked set must be a union (logical_or of masks, logical_and of keep masks, through
// logical_not and reshapes that add or drop leading 1s) of at most one each of
//   key padding  a bool[B,1,1,Lk] value: `reshape(%kp : bool[B,Lk])` -> operand 4 = %kp,
//                else a reshape to [B,Lk] is inserted (and a logical_not for keep masks);
//   causal       a comparison of the key index j and the query index i (integer iotas
//                along the scores' last two dims, of those extents, e.g. gt(iota{axis=3},
//                iota{axis=2}) : [1,1,L,L], lt(iota{axis=0}, iota{axis=1}) : [L,L]) that
//                masks exactly j > i; needs Lq == Lk                   -> causal=1.
// The fill must be a rank-0 f32 constant of exactly -1e9 (the value the attention op
// gives masked scores), or -inf with a causal mask alone (every row keeps its diagonal,
// so -inf and -1e9 give the same probabilities); the scale c a rank-0 f32 constant (div:
// scale=1/c, mul: scale=c).
// Every intermediate (head splits, scores, scaled and masked scores, probabilities, P·V
// and its transpose) must have exactly one use; anything else is left unfused, and with
// KILN_DEBUG_PASSES=fuse-attention each rejected softmax is logged with the reason.
// Numerics: scaling by 1/c instead of dividing by c may differ in the last ulp.
//
// Pre: verified; canonicalize need not have run (duplicated constants are fine).
// Post: verified; each matched head-merging reshape is an attention op (same value), with
// the key padding's reshape or logical_not (when needed) inserted right before it, and the
// pattern's other ops are removed as dead code.
#pragma once

#include "ir/ir.h"

namespace kiln::passes {
bool fuse_attention(ir::Module& module);
}  // namespace kiln::passes
