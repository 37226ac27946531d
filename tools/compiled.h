// Running a compiled model's shared library (kiln compile --emit=shared) from the CLI:
// dlopen, create with the C ABI, feed safetensors inputs by name.
#pragma once

#include <string>
#include <vector>

#include "runtime/safetensors.h"

namespace kiln::tools {

// Runs `function` of the shared library in `dir` (the one lib*.so there) on the
// inputs of `inputs` (by parameter name), with weights from `weights_path`. Returns
// the outputs by result name. Every failure is a kiln::Error with the runtime's message.
std::vector<rt::TensorData> run_compiled(const std::string& dir, const std::string& function,
                                         const std::string& weights_path,
                                         const rt::SafeTensors& inputs, int threads);

}  // namespace kiln::tools
