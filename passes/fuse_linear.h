// fuse-linear: a matmul with a transposed rank-2 weight, a bias add and an optional
// ReLU become one `linear` op (a GEMM with its epilogue).
//
//   %wt = transpose(%W : f32[N,K]) {perm=[1,0]}
//   %m  = matmul(%x : f32[...,K], %wt)
//   %y  = add(%m, %b : f32[N])
//   %r  = relu(%y)                      =>   %r = linear(%x, %W, %b) {act="relu"}
//
// Without a bias add the op has two operands; without a relu act="none". Each absorbed
// intermediate must have no other use (a matmul whose result is also used elsewhere
// stays). Pre: verified. Post: verified.
#pragma once

#include "ir/ir.h"

namespace kiln::passes {
bool fuse_linear(ir::Module& module);
}  // namespace kiln::passes
