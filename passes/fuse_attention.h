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
// Recognized masks (the select's condition, which may have other uses):
//   none;
//   key padding  `reshape(%kp : bool[B,Lk]) : bool[B,1,1,Lk]`          -> operand 4 = %kp;
//   causal       `gt(iota{axis=1}, iota{axis=0}) : bool[L,L]` (or
//                `lt(iota{axis=0}, iota{axis=1})`), needs Lq == Lk == L  -> causal=1;
//   both         `logical_or` of the two, either order, : bool[B,1,L,L]  -> both.
// The fill must be a rank-0 f32 constant of exactly -1e9 (the value the attention op
// gives masked scores); the scale c a rank-0 f32 constant (div: scale=1/c, mul: scale=c).
// Every intermediate (head splits, scores, scaled and masked scores, probabilities, P·V
// and its transpose) must have exactly one use; anything else is left unfused, and with
// KILN_DEBUG_PASSES=fuse-attention each rejected softmax is logged with the reason.
// Numerics: scaling by 1/c instead of dividing by c may differ in the last ulp.
//
// Pre: verified; canonicalize need not have run (duplicated constants are fine).
// Post: verified; each matched head-merging reshape is an attention op (same value)
// and the pattern's other ops are removed as dead code.
#pragma once

#include "ir/ir.h"

namespace kiln::passes {
bool fuse_attention(ir::Module& module);
}  // namespace kiln::passes
