// Fuzz target: bytes as an ONNX model through `kiln import` (importer::import_onnx: the
// protobuf parse, initializers and Constant tensors, every node's mapping, shape arithmetic,
// symbolic dims), then the IR it emits through the default pass pipeline. Dims named B, S, T
// or batch, sequence get maxima; others are refused as `kiln import` refuses them without
// --dim. External data is refused (no folder is given). The corpus is seeded with small
// exports of the test models (tests/onnx/export_models.py --fuzz-seeds). kiln::Error is the
// expected outcome of a bad file; anything else is a bug.
#include <cstdint>
#include <string_view>

#include "import/onnx_import.h"
#include "passes/pipeline.h"
#include "support/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  importer::OnnxImportOptions options;
  options.dim_max = {{"B", 3}, {"S", 7}, {"T", 7}, {"batch", 3}, {"sequence", 7}};
  options.refuse_unused_dims = false;
  importer::OnnxImport r;
  try {
    r = importer::import_onnx(std::string_view(reinterpret_cast<const char*>(data), size),
                              "fuzz.onnx", options);
  } catch (const Error&) {
    return 0;
  }
  try {
    passes::run_passes(r.module, passes::default_pipeline());
  } catch (const Error&) {
    return 0;
  }
  return 0;
}
