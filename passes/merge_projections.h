// merge-projections: linears of the same input with the same activation, in the same
// attention block, become one wider linear whose weight is the concatenation of theirs,
// followed by slices.
//
//   %q = linear(%x, %Wq, %bq)                %qkv = linear(%x, %Wqkv, %bqkv)
//   %k = linear(%x, %Wk, %bk)          =>    %q = slice(%qkv) {axis = 2, start = 0}
//   %v = linear(%x, %Wv, %bv)                %k = slice(%qkv) {axis = 2, start = D} ...
//
// (slices use the last axis, written as a non-negative index.) The merged weights are
// module weights with a derivation, so the runtime builds them once at load time from
// the original state_dict tensors:
//   weight @P.w_qkv.weight : f32[3D,D]
//       = concat(@P.w_q.weight, @P.w_k.weight, @P.w_v.weight) {axis = 0}
//   weight @P.w_qkv.bias : f32[3D] = concat(@P.w_q.bias, @P.w_k.bias, @P.w_v.bias) {axis = 0}
//
// Groups: a linear is a candidate when its W (and b, if any) are `weight` ops of
// underived module weights and W is named `<P>.<c>.weight` (P may be empty). An [in, out] W
// (fuse-linear's transpose(@W): GPT-2's Conv1D, an ONNX MatMul by an initializer, whose name
// like `onnx::MatMul_687` may say nothing) is a candidate too, named by W, else by its bias
// `<P>.<c>.bias`, else by the imported node's name path (`/<P with / for .>/<c>/MatMul`, the
// op's source scope); such linears merge only with each other, into
//   weight @P.w_qkv.weight : f32[3D,D] = concat(@Wq, @Wk, @Wv) {axis = 0, transpose = 1}
// (each [in, out] input transposed, then concatenated; the runtime does it at load time).
// Candidates merge when they share the input value, act, having a bias, and the prefix P, and have
// different components c; the group is in program order. The prefix keeps linears of one
// input in different blocks apart: the encoder memory feeds the cross-attention K and V
// of every decoder layer, and only each layer's pair merges. In the Transformer: the
// self-attention Q,K,V of each layer (3) and the cross-attention K,V of the memory (2).
//
// Names: the merged component is "w_" + the joined suffixes when every c is `w_<s>`
// (w_q, w_k, w_v -> w_qkv; w_k, w_v -> w_kv), else the c joined by "_"; the weights are
// `<P>.<merged>.weight` and `.bias`. An existing weight of that name is reused when it
// has the same type and derivation (a block in two functions, e.g. the encoder in
// `forward` and `encode`); otherwise "_2", "_3", ... is appended to the component.
//
// The merged linear is placed just before the group's first member; each member is
// replaced in place by its slice (same result value). The original weights stay
// declared in the module (they are the state_dict tensors the derivations read), while
// `weight` ops left unused are removed. Memory: the merged weight is stored besides the
// originals (whether the runtime frees derivation inputs no function reads is its
// business). Idempotent: a merged weight is derived, so it never merges again.
// Pre: verified; fuse-linear ran (there are linear ops). Post: verified; returns whether
// anything merged.
#pragma once

#include "ir/ir.h"

namespace kiln::passes {
bool merge_projections(ir::Module& module);
}  // namespace kiln::passes
