// plan-memory: assigns every intermediate value an offset in one arena sized for the
// symbols' declared maxima, reusing the memory of values that are dead.
//
//   func @f(%x: f32[B,64]) -> (f32[B,64]) {          symbol B max 4: 1024 bytes a value
//     %a = exp(%x) : f32[B,64]
//     %b = neg(%a) : f32[B,64]
//     %c = add(%a, %b) : f32[B,64]
//     %y = softmax(%c) {axis = 1} : f32[B,64]
//     return %y
//   }
// =>
//   func @f(%x: f32[B,64]) -> (f32[B,64]) arena 2048 {
//     %a = exp(%x) : f32[B,64] at 0
//     %b = neg(%a) : f32[B,64] at 1024       (%a is still live)
//     %c = add(%a, %b) : f32[B,64] at 0      (in place: %a dies here)
//     %y = softmax(%c) {axis = 1} : f32[B,64]  (a result: the caller's buffer)
//     return %y
//   }
//
// Liveness is computed over the current op order (run `schedule` first), as lowered code
// reads memory: a value is live from its defining op to its last read, both included (an
// unread value only at its definition), where
//  - a view (reshape, slice) has no memory of its own: codegen makes it a view of its
//    operand's, so the operand is read wherever the view is;
//  - a fused op (Op::fused, marked by fuse-elementwise: run it first, as the default
//    pipeline does) is computed inside its reader's kernel, so its operands are read when
//    that kernel runs.
// Lowering must not alias or defer reads in any other way. Arena values are every op
// result except `weight` ops', views and the function's results (those live in the
// caller's buffers); parameters are not op results. Constants and other sources are
// arena values. Offsets are chosen first-fit in order of definition, with sizes rounded
// up to 64 bytes (every offset is 64-byte aligned). In place: an elementwise or
// add_layernorm op whose operand is an arena value last read at that op and has
// exactly the result's byte size writes over it (same offset; the first such operand).
// Kernels of those ops must allow their output to be that input.
// The plan is stored in the IR (Function::arena_bytes, Op::arena_offset; -1 for ops
// outside the arena) and printed in its text form, so it round-trips. The plan depends
// only on the op order and the types: running the pass again changes nothing.
// Pre: verified. Post: verified, check_memory_plan() reports nothing for every function.
// An arena that would exceed 2^40 bytes (1 TiB; one tensor may reach 2^48 by the
// verifier) is a kiln::Error naming the function and the op that does not fit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/ir.h"

namespace kiln::passes {
bool plan_memory(ir::Module& module);

// Proves a plan sound: returns one line per violation (empty = sound), naming the value,
// its op and the byte ranges involved. Checks, independently of the planner, that
//  - every arena value has an offset, 64-byte aligned, with its maximum size inside the
//    arena;
//  - no weight, view or function result has an offset;
//  - no two arena values live at the same time (liveness as above) overlap in
//    [offset, offset + bytes), except an in-place pair: an elementwise or add_layernorm
//    op's result at the same offset and with the same size as one of its operands whose
//    last read it is.
std::vector<std::string> check_memory_plan(const ir::Module& module, const ir::Function& function);

// Sum of the maximum sizes of all arena values (what a plan without reuse would need).
int64_t sum_of_intermediates(const ir::Module& module, const ir::Function& function);

// A table of the function's memory plan for `kiln inspect --memory`: one line per op
// result other than weights, `%name  op  type  offset  bytes  live [def,last]` (offset
// "result" for function results, "view" for views, "-" when unplanned), then
// `arena peak: N bytes (X MiB); sum of intermediates: M bytes (Y MiB); reuse factor M/N`.
std::string memory_report(const ir::Module& module, const ir::Function& function);
}  // namespace kiln::passes
