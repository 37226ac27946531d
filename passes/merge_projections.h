// merge-projections: linears of the same input with the same activation become one
// wider linear whose weight is the concatenation of theirs, followed by slices.
//
//   %q = linear(%x, %Wq, %bq)                %qkv = linear(%x, %Wqkv, %bqkv)
//   %k = linear(%x, %Wk, %bk)          =>    %q = slice(%qkv) {axis=-1, start=0}
//   %v = linear(%x, %Wv, %bv)                %k = slice(%qkv) {axis=-1, start=D} ...
//
// The merged weights are module weights with a derivation
//   weight @L.qkv.weight : f32[3D,D] = concat(@L.w_q.weight, @L.w_k.weight, @L.w_v.weight) {axis = 0}
// so the runtime builds them once at load time from the original state_dict tensors.
// Memory: the merged weight is stored besides the originals only if they are still
// used elsewhere. Groups: self-attention Q,K,V of one input (3 linears) and
// cross-attention K,V of the memory (2). Only linears whose weights and biases come
// straight from `weight` ops merge. Pre: fuse-linear ran. Post: verified.
#pragma once

#include "ir/ir.h"

namespace kiln::passes {
bool merge_projections(ir::Module& module);
}  // namespace kiln::passes
