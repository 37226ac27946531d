// Running a compiled model's shared library (kiln compile --emit=shared) from the CLI:
// dlopen, create with the C ABI, feed safetensors inputs by name.
#pragma once

#include <string>
#include <vector>

#include "runtime/safetensors.h"

namespace kiln::tools {

struct CompiledRunOptions {
  int threads = 0;       // kernel threads; 0: the Halide runtime's default
  int repeat = 1;        // runs of the entry point (the outputs are the last run's)
  bool profile = false;  // print the runtime's per-kernel profile of the runs to stderr
};

// Runs `function` of the shared library in `dir` (the one lib*.so there) on the
// inputs of `inputs` (by parameter name), with weights from `weights_path`. Returns
// the outputs by result name. Every failure is a kiln::Error with the runtime's message.
std::vector<rt::TensorData> run_compiled(const std::string& dir, const std::string& function,
                                         const std::string& weights_path,
                                         const rt::SafeTensors& inputs,
                                         const CompiledRunOptions& options);

}  // namespace kiln::tools
