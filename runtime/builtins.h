// Steps the runtime performs itself between an entry point's kernels (plan.h, Builtin).
#pragma once

#include <cstdint>
#include <vector>

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

}  // namespace kiln::rt
