// canonicalize: local cleanups that put the graph in the form the fusions expect.
//
//  - dead code: ops whose results are unused are removed (weight ops too; the module's
//    weight declarations and unused parameters stay);
//  - common subexpressions: ops of equal kind, operands, attributes and result type are
//    merged into the first (equal constants, 0 and 0.0 included, repeated weight ops,
//    repeated masks);
//  - constant folding: elementwise ops whose operands are all scalar (rank-0) constants
//    fold to a constant, computed by the reference interpreter (so f32 rounding and
//    integer wrap-around are the op's own; an op that would fail, like an integer
//    division by zero, is left alone). Nothing of non-scalar or symbolic shape folds;
//    `slice(sinusoid_table[R,D]) {axis=0, start=0} : [S,D]` becomes
//    `sinusoid_table : [S,D]` (the table is computed only for the rows used);
//  - reshape(reshape(x)) -> reshape(x); a reshape to x's own type -> x;
//  - transpose(transpose(x, p), q) -> transpose(x, r), r[i] = p[q[i]]; identity
//    transposes -> x; a slice of a whole axis -> x;
//  - select(c, a, a) -> a; select(true, a, b) -> a, select(false, a, b) -> b;
//    x and true -> x; x or false -> x; x * 1.0 -> x; cast(select(c, a, 0)) to bool -> c for scalar
//    constants a != 0 (each only when no broadcast makes the result larger than the value
//    it is replaced by); add(s, select(m, -inf, 0)) -> select(m, -inf, s) (an additive mask of
//    -inf and 0, as PyTorch's float masks are, is exactly a masked select).
//
//   %1 = reshape(%0) : f32[B,S,8,64]        %2 = reshape(%0) : f32[B,S,512]
//   %2 = reshape(%1) : f32[B,S,512]    =>   (and %2 == %0's shape: uses of %2 use %0)
//
//   %a = constant() {value = 2} : f32[]
//   %b = constant() {value = 2.0} : f32[]   =>   %a = constant() {value = 2} : f32[]
//   %y = div(%x, %b) : f32[B,S,8]                %y = div(%x, %a) : f32[B,S,8]
//
// Runs to a fixed point per function. Function results keep their names: a result is
// not replaced by a parameter or another result (both have names of their own); when it
// is replaced by an intermediate, that value takes the result's name. A function that
// changes loses its memory plan (merged values live longer) and its fuse-elementwise
// marks (readers change), so run fuse-elementwise and plan-memory after.
// Pre: a verified module. Post: verified, no dead ops, no duplicate ops; running it
// again changes nothing; the output depends only on the input (no pointer order).
#pragma once

#include "ir/ir.h"

namespace kiln::passes {
bool canonicalize(ir::Module& module);
}  // namespace kiln::passes
