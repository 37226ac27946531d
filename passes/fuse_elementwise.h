// fuse-elementwise: marks each pointwise op (elementwise, gather, constant, iota) that is
// computed inside the elementwise kernel of its user instead of in memory of its own
// (Op::fused, printed `fused`), so that the grouping of elementwise chains into kernels is
// one decision in the IR that plan-memory (liveness) and lowering (one kernel per group)
// both read, as XLA's fusion passes make kFusion instructions before buffer assignment.
//
//   %a = exp(%x) : f32[B,64]                         %a = exp(%x) : f32[B,64] fused
//   %b = neg(%a) : f32[B,64]                    =>   %b = neg(%a) : f32[B,64] fused
//   %c = constant() {value = 2.0} : f32[]            %c = constant() {value = 2.0} : f32[] fused
//   %y = mul(%b, %c) : f32[B,64]                     %y = mul(%b, %c) : f32[B,64]
//   %s = softmax(%y) {axis = 1} : f32[B,64]          %s = softmax(%y) {axis = 1} : f32[B,64]
//
// One kernel then computes %y = -exp(%x) * 2 per element; %a, %b and %c are never written
// (plan-memory still gives them blocks, as it did before the marks, so plans stay the same).
// A group is a tree: its root is an unfused op, its other nodes the fused ops whose users
// lie in it. An op is fused when
//  - it is pointwise and not a function result (a result is written to its buffer);
//  - something reads it, and every reader is an elementwise op whose result has its shape
//    (a rank-0 constant: any elementwise reader), so the reader's kernel indexes it as its
//    own output; a broadcast operand is read from memory by the kernel;
//  - it is read once, or it is a constant or iota (cheap to compute in every reader);
//  - it is at most ir::kMaxFusedDepth (64) levels of fused ops below its group's root: a
//    longer chain is cut there (the next op down becomes a root), bounding the expression
//    trees handed to Halide and the recursion that builds them.
// Decided from the last op back (a user's depth is known before its operands'); the
// decision depends on the graph, not the order, so `schedule` may run before or after.
// Each pointwise op with readers that stays unfused is logged with the reason
// (`--debug-passes=fuse-elementwise`). Every mark is recomputed: a stale one goes.
// Pre: verified. Post: verified (V12 holds); returns whether any op's mark changed.
#pragma once

#include "ir/ir.h"

namespace kiln::passes {
bool fuse_elementwise(ir::Module& module);
}  // namespace kiln::passes
