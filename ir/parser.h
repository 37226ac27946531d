// Parser of the IR text form (.kir); the grammar is in printer.h.
#pragma once

#include <string>
#include <string_view>

#include "ir/ir.h"

namespace kiln::ir {

// Parses a module. Syntax errors throw kiln::Error with the message
//   FILE:LINE:COL: error: expected ':' after parameter name, got '['
// naming the offending token. The result is not verified: call verify() (or
// parse_and_verify) to check types. Each op records its location (ir::Op::loc).
Module parse_module(std::string_view text, const std::string& file = "<input>");

// parse_module followed by verify_or_throw.
Module parse_and_verify(std::string_view text, const std::string& file = "<input>");

}  // namespace kiln::ir
