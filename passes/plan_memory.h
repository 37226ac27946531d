// plan-memory: assigns every intermediate value an offset in one arena sized for the
// symbols' declared maxima, reusing the memory of values that are dead.
//
// Liveness is computed over the current op order (run `schedule` first): a value is
// live from its defining op to its last use. Offsets are chosen first-fit in order of
// definition, aligned to 64 bytes. In place: an elementwise op whose operand dies at
// that op and has the result's size writes over the operand (same offset).
// Not in the arena: parameters and results (the caller's buffers), weights.
// The plan is stored in the IR (Function::arena_bytes, Op::arena_offset) and printed
// in its text form, so it round-trips.
#pragma once

#include <string>
#include <vector>

#include "ir/ir.h"

namespace kiln::passes {
bool plan_memory(ir::Module& module);

// Proves a plan sound: returns one line per violation (empty = sound). Checks that
// every arena value has an aligned offset with its maximum size inside the arena, and
// that no two values live at the same time overlap, except an in-place pair (an
// elementwise op's result at the same offset as an operand whose last use it is).
std::vector<std::string> check_memory_plan(const ir::Module& module, const ir::Function& function);

// Sum of the maximum sizes of all arena values (what a plan without reuse would need).
int64_t sum_of_intermediates(const ir::Module& module, const ir::Function& function);
}  // namespace kiln::passes
