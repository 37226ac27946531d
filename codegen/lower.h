// Lowering of an optimized module to an execution plan: which kernel computes each op,
// and where every buffer lives. No Halide here: kernels are described by KernelSpecs.
//
//  - `linear`, `attention`, `layernorm`, `add_layernorm` each become one kernel call (the
//    fast paths); an operand whose dims cannot be collapsed to rows is copied to dense
//    memory first, and a linear whose weight is computed at run time takes the general
//    matmul kernel;
//  - elementwise ops, gathers, constants and iotas become one elementwise kernel per
//    group that fuse-elementwise marked: an unfused one is the root, computing the ops
//    marked `fused` below it (Op::fused); inputs of the group may broadcast;
//  - the general path for ops no fused kernel took: `matmul` (batched, broadcasting),
//    `softmax`, `reduce_sum/mean/max` and `argmax` over any axes get the kernels of
//    general_kernel.cpp, `transpose` a copy kernel, `concat` one copy per operand;
//  - `reshape` and `slice` become views (no copy) where the operand's strides allow it,
//    else views of a dense copy of the operand; `weight` ops bind load-time weights
//    (`linear` weights transposed, or packed in 64-column panels, once at load time);
//    `sinusoid_table` binds a table computed at load time;
//  - a result that is a view, a parameter, a weight or a table, or a value returned
//    twice, is copied into its result buffer.
// Copies that the memory plan does not know of (made only for the general path) live in
// scratch bytes past the planned arena, one region each, never reused.
// Pre: the module went through the default pipeline (every intermediate has an arena
// offset, and fuse-elementwise marked the groups: without its marks, every pointwise op
// is a kernel of its own). What cannot be compiled is an error naming the op and its line.
#pragma once

#include <vector>

#include "codegen/kernels.h"
#include "ir/ir.h"
#include "runtime/plan.h"

namespace kiln::codegen {

struct LoweredModel {
  rt::Plan plan;
  std::vector<KernelSpec> kernels;  // kernels[i] is named plan.kernel_names[i]
};

struct LowerOptions {
  // Every `linear` kernel with bf16 weights (kernels.h, LinearKernel::bf16).
  bool bf16_weights = false;
  // Every `linear` kernel with int8 weights (kernels.h, LinearKernel::int8).
  bool int8_weights = false;
  // The kernels run on a GPU: linear weights are stored unpanelled, as Wᵀ [K, N] (a warp's
  // threads read consecutive n of one k row: coalesced, 16-byte loads; kernels.h).
  bool gpu = false;
  // bf16 weights whose products run on f32 FMAs (LinearKernel::bf16_fma), attention in f32:
  // for CPUs where vdpbf16ps is slower than two FMAs (driver: CompileOptions::bf16_products).
  // With int8 weights: attention in f32 (else its two products in bf16, as with bf16 weights).
  bool bf16_fma = false;
  // bf16 weights: an activation that only bf16 kernels read, each rounding it to bf16 as it
  // reads it (a linear's input, an attention's q, k or v), is written in bf16 by the bf16
  // kernel that computes it (LinearKernel::out_bf16, AttentionKernel::out_bf16) and read as
  // such: the same numbers in half the bytes (codegen/lower/activations.cpp).
  bool bf16_activations = true;
};

LoweredModel lower_module(const ir::Module& module, const LowerOptions& options = {});

}  // namespace kiln::codegen
