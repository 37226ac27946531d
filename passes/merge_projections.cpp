// STUB: being implemented (see merge_projections.h).
#include "passes/merge_projections.h"

namespace kiln::passes {
bool merge_projections(ir::Module&) { return false; }
}  // namespace kiln::passes
