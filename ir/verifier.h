// The IR verifier. It reports violations as diagnostics and never asserts on
// malformed input, so it can run on anything the parser or a pass produced.
//
// Invariants checked, by number (diagnostics cite them as "[V3]" etc.):
//  V1. Symbol names are unique, identifiers, and each declared maximum is >= 1.
//  V2. Weight names are unique and weight types are static (no symbols), with
//      non-negative dims and at most 2^48 bytes.
//  V3. Function names are unique and every function has at least one result.
//  V4. Every value id an op or a return refers to exists in the function.
//  V5. SSA: every value is defined exactly once (as a parameter or by one op), and
//      every operand is defined before the op that uses it.
//  V6. Value names are unique within a function.
//  V7. Every symbol in a type (parameters, op results) is declared in the module, every
//      symbolic dim scale·S + offset has scale >= 1 and is at least 1 for every value of S
//      (scale + offset >= 1: `T-1` is refused, it is 0 when T = 1), and every type has
//      non-negative dims and at most 2^48 bytes at the symbols' maxima.
//  V8. Every op obeys its type rule (op_types.h): operand count, attributes, operand
//      types, and a result type equal to the one the rule infers.
//  V9. A derived weight's inputs are declared, underived weights, its op is
//      "concat", and concatenating their types along its axis gives its type.
// V10. Every op's attributes are those its kind takes (op_types.h's check_attrs), each
//      required one present and of its type, and each in its fixed range:
//        weight {name: string}              constant {value: number}
//        iota, concat, softmax, argmax {axis: int}
//        slice {axis: int, start: int >= 0}  transpose {perm: int list}
//        layernorm, add_layernorm {eps: number, positive and finite, unbiased?: 0 or 1,
//                                  eps_outside?: 0 or 1}
//        reduce_* {axes: int list, keepdims?: 0 or 1}
//        linear {act: "none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid" or "tanh"}
//        attention {heads: int >= 1, scale: finite number, causal?, fill_inf?,
//                   query_pad?: 0 or 1}
//        every other op: none.
//      The ranges that depend on operands (an axis within the rank, perm a permutation,
//      a slice within its operand, heads dividing the feature size, a last dim other
//      than 1 for an unbiased layernorm) are part of V8.
//      So the interpreter, passes and codegen may read attributes with Op::int_attr etc.
// V11. An add_layernorm_sum's operand is the result of an add_layernorm op, and no
//      add_layernorm has more than one add_layernorm_sum.
// V12. An op marked `fused` (Op::fused: computed inside its readers' elementwise kernel)
//      is elementwise-fusable (an elementwise op, gather, constant or iota), not a
//      function result, and read by at least one op; every op reading it is elementwise
//      with a result of its shape (a rank-0 constant: of any shape); it is read once
//      unless it is a constant or an iota; and at most kMaxFusedDepth levels of fused ops
//      lead from it up to the unfused op whose kernel computes it. Checked only in a
//      function that passed the invariants above. So lowering may trust the marks.
#pragma once

#include <string>
#include <vector>

#include "ir/ir.h"

namespace kiln::ir {

struct Diagnostic {
  std::string function;  // empty for module-level problems
  int op_index = -1;     // -1 when not about one op
  Loc loc;               // line 0 when unknown
  std::string message;   // starts with the invariant, e.g. "[V8] matmul: ..."
};

// Checks every invariant above; returns all violations (empty when valid).
std::vector<Diagnostic> verify(const Module& module);

// "FILE:LINE:COL: error: MESSAGE" when the location is known, otherwise
// "error: in function 'forward', op 12: MESSAGE".
std::string format_diagnostic(const Diagnostic& d, const std::string& file = "<input>");

// Throws kiln::Error with the first diagnostics (up to 10) when the module is invalid.
void verify_or_throw(const Module& module, const std::string& file = "<input>");

}  // namespace kiln::ir
