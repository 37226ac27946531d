// schedule: reorders each function's ops into a deterministic topological order that
// keeps the peak of live intermediate memory (at the symbols' maxima) low.
//
// A value is live from its defining op to its last use (both included) and weighs its
// size with every symbol at its maximum; parameters, weights and results weigh nothing.
//
// Algorithm: list scheduling. Among ready ops, pick the one that most reduces live
// bytes (frees the most, allocates the least); ties go to the op that came first in
// the current order. Sources with no operands (weights, constants, sinusoid tables,
// iotas), and ops computed from sources alone (a weight's transpose), are placed just
// before their first user. Then chains whose results are only needed later are sunk
// past the peak. The new order is kept only if its peak is lower than that of the
// current order with its sources sunk the same way, so the peak never grows and an
// order that is already optimal stays as it is (schedule.cpp has the details).
// Deterministic: no pointer or hash order is involved.
//
//   %a = exp(%x) : f32[4096]          %a = exp(%x) : f32[4096]
//   %b = exp(%y) : f32[4096]    =>    %sa = reduce_sum(%a) : f32[]
//   %sa = reduce_sum(%a) : f32[]      %b = exp(%y) : f32[4096]
//   %sb = reduce_sum(%b) : f32[]      %sb = reduce_sum(%b) : f32[]
//   (peak 32 KiB: %a and %b live together)   (peak 16 KiB + 4 bytes)
//
// Pre: verified. Post: verified, same ops (with their locations), dependencies respected.
// When the order changes, a memory plan made for the old one is dropped (run plan-memory
// after schedule).
// Returns whether the order changed.
#pragma once

#include "ir/ir.h"

namespace kiln::passes {
bool schedule(ir::Module& module);

// Peak live bytes of intermediates over the function's current op order, with every
// symbol at its maximum (parameters, weights and results excluded).
int64_t peak_live_bytes(const ir::Module& module, const ir::Function& function);
}  // namespace kiln::passes
