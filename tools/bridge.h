// Glue between the compiler's IR world and the runtime's files: expected weights of a
// module, loading a checkpoint into the interpreter's WeightMap, and converting
// safetensors inputs and outputs to and from interpreter tensors.
#pragma once

#include <string>
#include <vector>

#include "ir/interpreter.h"
#include "ir/ir.h"
#include "runtime/safetensors.h"
#include "runtime/weights.h"

namespace kiln::tools {

// The state_dict tensors a module needs: its weights without a derivation.
std::vector<rt::WeightSpec> expected_weights(const ir::Module& module);

// Checks `file` against the module (every problem reported at once) and returns the
// interpreter's weights, derived weights included.
ir::WeightMap load_weight_map(const ir::Module& module, const rt::SafeTensors& file);

// The function's inputs from `file`, by parameter name. Integer parameters accept
// I32 or I64 tensors; f32 parameters need F32. Missing inputs are errors naming them.
std::vector<ir::Tensor> load_inputs(const ir::Function& function, const rt::SafeTensors& file);

// The function's results as safetensors tensors named after the result values.
std::vector<rt::TensorData> to_tensor_data(const ir::Function& function,
                                           const std::vector<ir::Tensor>& results);

}  // namespace kiln::tools
