// kiln import: an ONNX model (opsets 13-17, as torch.onnx.export writes them) as ordinary
// kiln IR plus its initializers as weights.
//
// The importer maps each ONNX node to kiln's core ops one for one (Gemm -> matmul with a
// transposed weight and an add, LayerNormalization -> layernorm, Trilu -> a comparison of
// iotas, Pow by 2 -> mul, ...) and evaluates shape arithmetic (Shape, Gather, Concat,
// Unsqueeze, Mul, Div, ... on sizes) itself, so that every Reshape, Expand, Slice and
// ConstantOfShape gets a static or symbolic shape. It fuses nothing: the passes recognize
// the exported shapes (decomposed LayerNorm, erf GELU, attention) as they recognize DSL
// graphs.
//
// Symbolic dims (`dim_param` of the graph inputs) become kiln symbols; each needs a maximum
// (`--dim NAME=MAX`). A product of two symbols (PyTorch's MultiheadAttention flattens
// [T, B, E] to [T*B, E] around its output projection) is no kiln dim: such a value keeps
// its unflattened shape ([T, B, E]) in the IR, which every row-wise consumer (a MatMul or
// Gemm by a weight, a broadcast Add, a Reshape back) reads as is.
//
// Errors name the node (its name and op type), the opset and the reason; every unsupported
// operator is listed at once. Hostile files (truncated, bad tensor sizes, absurd dims) are
// refused with kiln::Error, never a crash.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ir/ir.h"
#include "runtime/safetensors.h"

namespace kiln::importer {

struct OnnxImportOptions {
  std::map<std::string, int64_t> dim_max;  // --dim NAME=MAX: each symbolic dim's maximum
  std::string function = "forward";        // the entry point's name
  std::string module_name;                 // default: "imported"
  bool refuse_unused_dims = true;          // a dim_max naming no input's dim is an error
};

struct OnnxImport {
  ir::Module module;
  std::vector<rt::TensorData> weights;  // the initializers the IR reads, by their ONNX names
  int64_t opset = 0;
  size_t onnx_nodes = 0;
};

// `label` names the file in errors. `base_dir` is where external data files are looked up
// (empty: external data is refused).
OnnxImport import_onnx(std::string_view bytes, const std::string& label,
                       const OnnxImportOptions& options, const std::string& base_dir = {});
OnnxImport import_onnx_file(const std::string& path, const OnnxImportOptions& options);

}  // namespace kiln::importer
