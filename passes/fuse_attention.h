// fuse-attention: scaled dot-product attention with its head split and merge becomes
// one `attention` op, which a kernel computes without ever storing the score matrix
// (online softmax over blocks of keys).
//
//   %qh = transpose(reshape(%q) : [B,Lq,H,dk]) {perm=[0,2,1,3]}
//   %kt = transpose(reshape(%k) : [B,Lk,H,dk]) {perm=[0,2,3,1]}
//   %vh = transpose(reshape(%v) : [B,Lk,H,dk]) {perm=[0,2,1,3]}
//   %s  = div(matmul(%qh, %kt), c)                 (or mul by c)
//   %sm = select(%mask, -1e9, %s)                  (optional)
//   %p  = softmax(%sm) {axis=-1}
//   %o  = reshape(transpose(matmul(%p, %vh)) {perm=[0,2,1,3]}) : [B,Lq,H*dk]
// =>
//   %o  = attention(%q, %k, %v [, %key_pad]) {causal, heads=H, scale=1/c}
//
// The attention op: q [B,Lq,H*dk], k [B,Lk,H*dk], v [B,Lk,H*dv], optional key_pad
// bool [B,Lk] (true = padding key); per batch b, head h and query i the scores are
// s_j = (q_h[i]·k_h[j]) * scale, set to -1e9 where key_pad[b,j] or (causal and j > i),
// then softmax over j and the weighted sum of v_h rows. Result [B,Lq,H*dv].
//
// Recognized masks: none; key padding `reshape(%kp : bool[B,Lk]) : [B,1,1,Lk]`; and
// causal `logical_or(<key padding>, gt(iota{axis=1}, iota{axis=0}) : [Lq,Lk])` (or the
// causal part alone). Anything else is left unfused. Every intermediate (scores,
// probabilities, split heads) must have no other use, or the pattern is left as is.
// Pre: canonicalized (one op per pattern node). Post: no softmax of a matched pattern.
#pragma once

#include "ir/ir.h"

namespace kiln::passes {
bool fuse_attention(ir::Module& module);
}  // namespace kiln::passes
