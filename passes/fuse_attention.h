// fuse-attention: scaled dot-product attention with its head split and merge becomes
// one `attention` op, which a kernel computes without ever storing the score matrix
// (online softmax over blocks of keys).
//
//   %qh = transpose(reshape(%q) : [B,Lq,H,dk]) {perm=[0,2,1,3]}
//   %kt = transpose(reshape(%k) : [B,Lk,H,dk]) {perm=[0,2,3,1]}
//   %vh = transpose(reshape(%v) : [B,Lk,H,dv]) {perm=[0,2,1,3]}
//   %s  = div(matmul(%qh, %kt), c)                 (or mul by c)
//   %sm = select(%mask, -1e9, %s)                  (optional; or -inf)
//   %p  = softmax(%sm) {axis=-1}
//   %o  = reshape(transpose(matmul(%p, %vh)) {perm=[0,2,1,3]}) : [B,Lq,H*dv]
// =>
//   %o  = attention(%q, %k, %v [, %key_pad] [, %query_pad] [, %bias])
//           {causal = 0|1, heads = H, scale = 1/c [, fill_inf = 1] [, query_pad = 1]
//            [, kv_heads = KV] [, bias = 1] [, window = W] [, softcap = c]}
//
// Today's models (issue 26) fuse too, as Hugging Face writes them:
//   head operands  a query, key or value that is not a head split but any f32 value in head
//                  layout [B,H,L,d] (rotary embeddings applied to q and k between the head
//                  split and the scores, in either convention, or anything else computed on
//                  the heads) is merged back by an inserted transpose {perm=[0,2,1,3]} and
//                  reshape to [B,L,H*d]: the rotation stays elementwise ops feeding the
//                  attention op; the key is then `transpose(%kh) {perm=[0,1,3,2]}`.
//   grouped heads  K and V of KV < H heads repeated: reshape(expand(reshape(%x : [B,KV,L,d])
//                  : [B,KV,1,L,d]) : [B,KV,n,L,d]) : [B,KV*n,L,d] (repeat_kv), or the concat
//                  of n copies of that [B,KV,1,L,d] along axis 2 (repeat_interleave)
//                  -> kv_heads = KV, K and V of width KV*d.
//   no scale       scores that are the matmul itself (T5) -> scale = 1.
//   soft-cap       mul(tanh(div(%s, c)), c) after the scale, c a rank-0 f32 constant > 0
//                  -> softcap = c.
//   score bias     add(%s, %bias) (any number, either order) after the soft-cap, each bias
//                  f32 broadcasting to [B,H,Lq,Lk] (T5's relative position bias, ALiBi, any
//                  additive mask); with other uses allowed (layers share it) -> their sum,
//                  reshaped to rank 4, as the last operand, bias = 1.
//   sliding window a mask term comparing i - j (or j - i) with a rank-0 integer constant that
//                  masks exactly i - j >= W, W >= 1, with the causal term -> window = W.
//
// The attention op: q [B,Lq,H*dk], k [B,Lk,KV*dk], v [B,Lk,KV*dv] (KV = kv_heads, default H;
// query head h reads kv head h / (H / KV)), optional trailing bias f32 [B',H',Lq',Lk'] (each
// dim 1 or the scores'; present iff bias = 1) added to the scaled (and soft-capped: s ->
// tanh(s / softcap) * softcap) scores before the masks, window W (needs causal): also masked
// where i - j >= W. Then as below. optional key_pad
// bool [B,Lk] (true = padding key), optional query_pad bool [B,Lq] (true = padding query;
// present iff query_pad = 1, and then the last operand); per batch b, head h and query i
// the scores are s_j = (q_h[i]·k_h[j]) * scale, set to the fill where key_pad[b,j] or
// query_pad[b,i] or (causal and j > i), then softmax over j and the weighted sum of v_h
// rows. Result [B,Lq,H*dv]. The fill is -1e9 (a row whose keys are all masked is the mean
// of v over all Lk keys), or -inf with fill_inf = 1 (such a row is NaN, as in PyTorch;
// other rows are as with -1e9).
//
// Recognized masks: the select's condition, which may have other uses, in any layout that
// broadcasts to the scores [B,H,Lq,Lk] ([L,L], [1,L,L], [1,1,L,L], [B,1,1,Lk], [B,1,Lq,1],
// [B,1,L,L], ...), as a mask `select(%mask, fill, %s)` or as a keep mask
// `select(%keep, %s, fill)`; its masked set must be a union (logical_or of masks,
// logical_and of keep masks, through logical_not, eq/ne of a rank-0 constant and a bool
// mask, a cast of one or a select of one between constants (PyTorch's `mask == 0`, with
// mask bool or 0/1 of another dtype), and reshapes that add or drop leading 1s) of at most
// one each of
//   key padding    a bool[B,1,1,Lk] value: `reshape(%kp : bool[B,Lk])` -> key_pad = %kp,
//                  else a reshape to [B,Lk] is inserted (and a logical_not for keep masks);
//   query padding  a bool[B,1,Lq,1] value, likewise -> query_pad operand, query_pad=1;
//   causal         a comparison of the key index j and the query index i (integer iotas
//                  along the scores' last two dims, of those extents, e.g. gt(iota{axis=3},
//                  iota{axis=2}) : [1,1,L,L], lt(iota{axis=0}, iota{axis=1}) : [L,L]) that
//                  masks exactly j > i; needs Lq == Lk                   -> causal=1.
// The fill must be a rank-0 f32 constant of exactly -1e9 (the value the attention op gives
// masked scores) or -inf: with padding that gives fill_inf=1; with a causal mask alone
// every row keeps its diagonal, so -inf is -1e9 there and fill_inf is left out. The scale
// c must be a rank-0 f32 constant (div: scale=1/c, mul: scale=c).
// Every intermediate (head splits, scores, scaled and masked scores, probabilities, P·V
// and its transpose) must have exactly one use; anything else is left unfused, and with
// KILN_DEBUG_PASSES=fuse-attention each rejected softmax is logged with the reason, and a
// rejected softmax over scores (its input computed from a matmul) is also a lost-fusion note
// (passes/notes.h) at the softmax: "attention-shaped subgraph left unfused: <reason>".
// Numerics: scaling by 1/c instead of dividing by c may differ in the last ulp.
//
// Pre: verified; canonicalize need not have run (duplicated constants are fine).
// Post: verified; each matched head-merging reshape is an attention op (same value), with
// the paddings' reshapes or logical_nots (when needed) inserted right before it, and the
// pattern's other ops are removed as dead code.
#pragma once

#include "ir/ir.h"

namespace kiln::passes {
bool fuse_attention(ir::Module& module);
}  // namespace kiln::passes
