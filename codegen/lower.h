// Lowering of an optimized module to an execution plan: which kernel computes each op,
// and where every buffer lives. No Halide here: kernels are described by KernelSpecs.
//
//  - `linear`, `attention`, `layernorm`, `add_layernorm` each become one kernel call;
//  - connected elementwise ops, gathers, constants and iotas become one elementwise
//    kernel per group (an op is folded into its user when it has that single use and
//    the same shape; inputs of the group may broadcast);
//  - `reshape` and `slice` become views (no copy); `weight` ops bind load-time weights
//    (`linear` weights transposed, or packed in 64-column panels, once at load time);
//    `sinusoid_table` binds a table computed at load time.
// Pre: the module went through the default pipeline (every intermediate has an arena
// offset). Ops with no kernel (matmul, softmax, transpose, ...) are an error naming them.
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
};

LoweredModel lower_module(const ir::Module& module, const LowerOptions& options = {});

}  // namespace kiln::codegen
