// STUB: being implemented (see canonicalize.h).
#include "passes/canonicalize.h"

namespace kiln::passes {
bool canonicalize(ir::Module&) { return false; }
}  // namespace kiln::passes
