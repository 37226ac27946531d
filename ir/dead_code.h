// Dead-code removal on one function, shared by the passes (passes/rewrite.h) and the DSL (an
// entry point built by running more of the user's code than it returns: nn::add_seq2seq's
// prepare).
#pragma once

#include <vector>

#include "ir/ir.h"

namespace kiln::ir {

// How many times each value is used: as an operand (once per occurrence) or a result.
std::vector<int> use_counts(const Function& f);

// Removes ops whose results are unused (transitively), then drops values that are no
// longer defined and renumbers the rest in order. Returns whether anything changed.
bool remove_dead_code(Function& f);

// Renumbers values so that only parameters and op results remain, in their order.
void compact_values(Function& f);

}  // namespace kiln::ir
