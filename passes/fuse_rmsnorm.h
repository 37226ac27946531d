// fuse-rmsnorm: RMSNorm written out with elementwise ops and a mean becomes one op, the
// row-wise norm kernel's RMS variant (layernorm {rms = 1}, ir/ops.def):
//
//   %q = mul(%x, %x) : f32[B,S,D]                       (x.pow(2))
//   %m = reduce_mean(%q) {axes = [-1], keepdims = 1}     (.mean(-1, keepdim=True))
//   %e = add(%m, %eps) : f32[B,S,1]                      (+ eps, a scalar constant)
//   %r = rsqrt(%e) : f32[B,S,1]
//   %n = mul(%x, %r) : f32[B,S,D]                        (x * torch.rsqrt(...))
//   %y = mul(%n, %w) : f32[B,S,D]             =>   %y = layernorm(%x, %w) {eps, rms = 1}
//
// The spellings recognized, each in either operand order of its adds and muls:
//   LLaMA, Mistral, Qwen:  x * rsqrt(mean(x*x, -1, keepdim) + eps) * w    (w · (...) too)
//   written with a root:   x / sqrt(mean(x*x, -1, keepdim) + eps) * w
//   T5:                    w * (x * rsqrt(variance + eps))
//   Gemma:                 ... * (1 + w): any gamma of type f32[D] (here add(1, w))
// with casts to the value's own dtype (`.to(torch.float32)` of an f32) anywhere on the path
// seen through. eps must be a positive finite scalar constant, the mean over the last axis
// with keepdim, x of the result's type and every intermediate used only by the next step.
//
// Lost fusions: a mean of x·x that feeds `+ eps` and a square root but does not match is
// norm-shaped; the pass says why it stays unfused with a note (passes/notes.h) at the mean's
// source line: a mean over another axis or without keepdim, an intermediate read elsewhere,
// an eps that is no positive constant, no weight of type f32[D] to scale by.
//
// The rewritten op is the final mul (it keeps its value, name and location); the ops left
// unused are removed. Runs before fuse-add-layernorm, so a residual add feeding the norm
// becomes add_layernorm {rms = 1} (pre-norm: with its sum as add_layernorm_sum).
// Pre: verified. Post: verified; returns whether anything fused.
#pragma once

#include "ir/ir.h"

namespace kiln::passes {
bool fuse_rmsnorm(ir::Module& module);
}  // namespace kiln::passes
