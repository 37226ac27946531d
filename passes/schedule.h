// schedule: reorders each function's ops into a deterministic topological order that
// keeps the peak of live intermediate memory (at the symbols' maxima) low.
//
// Algorithm: list scheduling. Among ready ops, pick the one that most reduces live
// bytes (frees the most, allocates the least); ties go to the op that came first in
// the current order. Sources with no operands (weights, constants) are placed just
// before their first user. Deterministic: no pointer or hash order is involved.
// Pre: verified. Post: verified, same ops, dependencies respected.
#pragma once

#include "ir/ir.h"

namespace kiln::passes {
bool schedule(ir::Module& module);

// Peak live bytes of intermediates over the function's current op order, with every
// symbol at its maximum (parameters, weights and results excluded).
int64_t peak_live_bytes(const ir::Module& module, const ir::Function& function);
}  // namespace kiln::passes
