// canonicalize: local cleanups that put the graph in the form the fusions expect.
//
//  - dead code: ops whose results are unused are removed (weights too);
//  - common subexpressions: ops of equal kind, operands and attributes are merged
//    (equal constants, repeated weight ops, repeated masks);
//  - constant folding: elementwise ops of scalar constants fold to a constant;
//    `slice(sinusoid_table[R,D]) {axis=0, start=0} : [S,D]` becomes
//    `sinusoid_table : [S,D]` (the table is computed only for the rows used);
//  - reshape(reshape(x)) -> reshape(x); a reshape to the same shape -> x;
//  - transpose(transpose(x, p), q) -> transpose(x, p∘q); identity transposes -> x.
//
//   %1 = reshape(%0) : f32[B,S,8,64]        %2 = reshape(%0) : f32[B,S,512]
//   %2 = reshape(%1) : f32[B,S,512]    =>   (and %2 == %0's shape: uses of %2 use %0)
//
// Pre: a verified module. Post: verified, no dead ops, no duplicate ops.
#pragma once

#include "ir/ir.h"

namespace kiln::passes {
bool canonicalize(ir::Module& module);
}  // namespace kiln::passes
