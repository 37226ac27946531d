// Running a compiled model's shared library (kiln compile --emit=shared) from the CLI:
// dlopen, create with the C ABI, feed safetensors inputs by name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/runtime.h"
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

struct Generated {
  int64_t batch = 0, hypotheses = 0, max_length = 0;
  std::vector<int64_t> ids;      // [batch, hypotheses, max_length], -1 padded
  std::vector<int64_t> lengths;  // [batch, hypotheses]
  std::vector<float> scores;     // [batch, hypotheses]
};

// Runs kiln_generate of the shared library in `dir` on source ids [batch, length] with
// `search` (whose callback must be null), in chunks of the model's max_batch sentences, with
// `threads` kernel threads (0: the Halide runtime's default).
Generated generate_compiled(const std::string& dir, const std::string& weights_path,
                            const std::vector<int64_t>& src, int64_t batch, int64_t length,
                            const kiln_search_options& search, int threads);

}  // namespace kiln::tools
