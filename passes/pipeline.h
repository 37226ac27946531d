// The pass registry and the default pipeline. Every pass is a function
// `bool pass(ir::Module&)` returning whether it changed the module; all of them are
// listed, explicitly, in pipeline.cpp.
#pragma once

#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "ir/ir.h"
#include "passes/notes.h"

namespace kiln::passes {

using PassFn = bool (*)(ir::Module&);

struct PassInfo {
  const char* name;  // kebab-case, as given to `kiln opt --passes=`
  PassFn run;
  const char* summary;  // one line for --help
};

// Every pass, in default-pipeline order.
const std::vector<PassInfo>& all_passes();
// Names of the default pipeline's passes, in order.
std::vector<std::string> default_pipeline();
// Resolves "default" or a comma list of names; unknown names throw kiln::Error listing
// the known ones.
std::vector<std::string> parse_pass_list(const std::string& spec);

struct PipelineOptions {
#ifdef NDEBUG
  bool verify_each = false;  // release builds verify once at the end
#else
  bool verify_each = true;  // debug and test builds verify after every pass
#endif
  bool print_ir_after_all = false;       // dump after every pass that changed the module
  std::set<std::string> print_ir_after;  // dump after these passes (changed or not)
  bool time_passes = false;              // report each pass's wall time
  std::FILE* dump = stderr;              // where dumps and timings go
};

// Runs the named passes in order. Verifies after each pass when `verify_each` (a
// failure names the pass that broke the module) and always at the end. Returns the
// lost-fusion notes the passes recorded (passes/notes.h), in the order noted; the caller
// prints them with format_lost_fusions().
std::vector<LostFusion> run_passes(ir::Module& module, const std::vector<std::string>& names,
                                   const PipelineOptions& options = {});

}  // namespace kiln::passes
