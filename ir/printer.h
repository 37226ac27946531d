// The printer of the IR text form (.kir). `parse_module(print_module(m))` gives
// back m, and printing that again gives identical text.
//
// The text form, by example:
//
//   module @transformer {
//     config {d_model = "24", heads = "3"}
//     symbol B max 4
//     symbol S max 40
//     weight @src_embed.weight : f32[37,24]
//     weight @w_qkv : f32[72,24] = concat(@w_q, @w_k, @w_v) {axis = 0}
//     func @encode(%src: i64[B,S]) -> (f32[B,S,24]) {
//       %0 = weight() {name = "src_embed.weight"} : f32[37,24]
//       %1 = gather(%0, %src) : f32[B,S,24]
//       %memory = layernorm(%1, %2, %3) {eps = 1.0000000000000001e-05} : f32[B,S,24]
//       return %memory
//     }
//   }
//
// Grammar (whitespace and `# comments` between tokens are ignored):
//   module     := 'module' '@' NAME '{' item* '}'
//   item       := config | symbol | weight | source | func
//   config     := 'config' '{' (IDENT '=' STRING (',' IDENT '=' STRING)*)? '}'
//   symbol     := 'symbol' IDENT 'max' INT
//   weight     := 'weight' '@' NAME ':' type ('=' 'concat' '(' '@' NAME (',' '@' NAME)* ')' attrs)?
//   source     := 'source' INT '=' STRING      (numbered 0, 1, ... in order, before any use)
//   func       := 'func' '@' NAME '(' (param (',' param)*)? ')' '->' '(' type (',' type)* ')'
//                 ('arena' INT)? '{' op* 'return' value (',' value)* '}'
//   param      := value ':' type
//   op         := value '=' OPNAME '(' (value (',' value)*)? ')' attrs? ':' type 'fused'?
//                 ('at' INT)? ('src' '(' INT ':' INT (',' INT)? ')')?
//   value      := '%' (IDENT | INT)
//   attrs      := '{' IDENT '=' attr (',' IDENT '=' attr)* '}'
//   attr       := INT | FLOAT | STRING | '[' (INT (',' INT)*)? ']'
//   type       := DTYPE '[' (dim (',' dim)*)? ']'        DTYPE: f32 i32 i64 bool
//   dim        := INT | IDENT
// NAME is [A-Za-z0-9_.]+; a FLOAT always has '.', 'e', "inf" or "nan" in it, which
// tells it from an INT. Unnamed values print as %0, %1, ... in definition order.
// The memory plan (passes/plan_memory.h), when present, is `arena BYTES` on the
// function and `at OFFSET` on each op whose result lives in the arena. `src(F:LINE, S)` is
// where the user wrote the op (ir::SourceLoc): file `source F`, that line, scope `source S`.
#pragma once

#include <string>
#include <vector>

#include "ir/ir.h"

namespace kiln::ir {

std::string print_module(const Module& module);
std::string print_function(const Module& module, const Function& function, int indent = 2);
std::string print_attr_value(const AttrValue& value);

// Each value's name as the text form shows it: '%' and its own name, or its number among
// the unnamed values (parameters first, then op results in order).
std::vector<std::string> value_names(const Function& function);

}  // namespace kiln::ir
