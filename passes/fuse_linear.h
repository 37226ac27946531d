// fuse-linear: a matmul with a transposed rank-2 weight, a bias add and an optional
// activation (relu, gelu, gelu_tanh, silu, sigmoid, tanh) become one `linear` op (a GEMM
// with its epilogue).
//
//   %wt = transpose(%W : f32[N,K]) {perm=[1,0]}
//   %m  = matmul(%x : f32[...,K], %wt)
//   %y  = add(%m, %b : f32[N])          (or add(%b, %m))
//   %r  = relu(%y)                      =>   %r = linear(%x, %W, %b) {act="relu"}
//
// A matmul by a plain rank-2 weight W [K, N] (stored [in, out], GPT-2's Conv1D:
// matmul(x, W) + b) first reads it as transpose(@W.T), W.T = transpose(@W) {perm=[1,0]} a
// module weight [N, K] derived at load time from the same checkpoint tensor, and fuses like
// the others (the runtime transposes the stored [K, N] at load time into whatever layout the
// linear kernel reads: panels, bf16, int8).
//
// The anchor is a matmul whose right operand is `transpose(%W) {perm=[1,0]}` of any f32
// rank-2 value (usually a `weight`); a batched matmul such as attention's Q·Kᵀ
// (f32[B,H,L,dk] x f32[B,H,dk,L]) never matches and stays a matmul. Then, step by step:
//  - the add is absorbed when the matmul's only use is an add whose other operand has
//    type exactly f32[N] (a broadcast bias); otherwise the linear has two operands and
//    the add (if any) stays;
//  - the activation is absorbed when the pre-activation (the add, or the matmul without
//    a bias) has exactly one use and it is one of those ops (act = its name, e.g.
//    act="gelu"); otherwise act="none".
// The last absorbed op is replaced in place by the linear, keeping its result value, so
// other uses of the matmul (when the bias was not absorbed) see the same value. The
// transpose is not absorbed but bypassed: the linear reads %W directly, and the
// transpose stays only if something else uses it. Absorbed ops and ops dead before the
// pass are removed from a function the pass changed. Nothing is ever computed twice.
// Pre: verified. Post: verified; returns whether anything fused.
#pragma once

#include "ir/ir.h"

namespace kiln::passes {
bool fuse_linear(ir::Module& module);
}  // namespace kiln::passes
