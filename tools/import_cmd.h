// `kiln import`: an ONNX model as kiln IR and a weights file (import/onnx_import.h).
#pragma once

#include <string>
#include <vector>

namespace kiln::tools {
int cmd_import(const std::vector<std::string>& argv);
}  // namespace kiln::tools
