// Graphviz export of one function's dataflow graph, for `kiln inspect --dot`.
//
// One node per op (label: result name, op kind, result type, and the arena offset when the
// function has a memory plan), parameters and results as ellipses, and an edge from each
// operand to its user. Fused ops (attention, linear, add_layernorm) are bold, filled
// 3-D boxes; sources (weights, constants, sinusoid tables, iotas) are small grey boxes.
// The text depends only on the IR: the same function always gives the same output.
//
//   kiln opt model.kir | kiln inspect - --dot forward | dot -Tsvg -o forward.svg
#pragma once

#include <string>

#include "ir/ir.h"

namespace kiln::tools {

// The function as a Graphviz `digraph`.
std::string to_dot(const ir::Module& module, const ir::Function& function);

}  // namespace kiln::tools
