// Steps the runtime performs itself between an entry point's kernels (plan.h, Builtin).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "HalideRuntime.h"
#include "runtime/plan.h"

namespace kiln::rt {

// The builtin cache_write (plan.h): x (d, l, n) -> cache(d, n, pos + l), in the result
// buffer that is the cache parameter's (pos 0 when the step has no position). Bounds were
// checked when binding (pos < T by its id limit with L = 1, L <= T and N <= C by the
// function's checks); they are asserted again here.
// `param_data`: the entry point's inputs (in parameter order); `result_data` and
// `result_bytes`: its outputs; `syms`: the bound symbols.
void cache_write(const StepDesc& step, const std::vector<const uint8_t*>& param_data,
                 const uint8_t* arena_data, const std::vector<uint8_t*>& result_data,
                 const std::vector<int64_t>& result_bytes, const std::vector<int64_t>& syms);

// What a moe_ffn step computed: the experts it ran (those with at least one routed row) and
// the (row, slot) pairs they took (Σ over experts of the rows routed to each).
struct MoeWork {
  int64_t experts_run = 0;
  int64_t expert_rows = 0;
};

// The builtin moe_ffn (plan.h) on the step's buffers, resolved and bounds-checked like a
// kernel's (host memory): x f32 (d, rows), ids i64 (k, rows), gates f32 (k, rows), per expert
// w1, w3 and w2 as stored for the step's linear kernels, out f32 (d, rows). Groups the
// (row, slot) pairs by expert, and for each expert that some row chose gathers its rows and
// runs the step's three linear kernels over just them through `call(kernel, args)` (a = silu(x
// w1ᵀ), b = x w3ᵀ, y = (a ⊙ b) w2ᵀ), then adds gate · y into each row's output (experts in
// order). An id out of [0, experts) is a kiln::Error naming the step.
MoeWork moe_ffn(const StepDesc& step, std::vector<halide_buffer_t>& bufs,
                const std::function<void(int32_t kernel, void** args)>& call);

}  // namespace kiln::rt
