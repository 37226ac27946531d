// Running a compiled model's shared library (kiln compile --emit=shared) from the CLI:
// dlopen, create with the C ABI, feed safetensors inputs by name.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
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

// Loads the shared library in `dir` with the checkpoint `weights_path` and writes its weights,
// laid out, to `output` (kiln_model_save_weights: kiln pack-weights).
void pack_weights(const std::string& dir, const std::string& weights_path,
                  const std::string& output);

struct Generated {
  int64_t batch = 0, hypotheses = 0, max_length = 0;
  std::vector<int64_t> ids;      // [batch, hypotheses, max_length], -1 padded
  std::vector<int64_t> lengths;  // [batch, hypotheses]
  std::vector<float> scores;     // [batch, hypotheses]
};

struct LoadedLibrary;  // compiled.cpp

// A compiled model's shared library in `dir`, opened, with a model created from
// `weights_path`, for kiln_generate (kiln translate).
class CompiledGenerator {
 public:
  // `threads` kernel threads (0: the Halide runtime's default).
  CompiledGenerator(const std::string& dir, const std::string& weights_path, int threads);
  ~CompiledGenerator();
  // The integer of the model's config `key` (kiln_model_config), or -1 where it has none.
  int64_t config(const char* key) const;
  // The declared maximum of a shape symbol ("B", "S"), or -1.
  int64_t symbol_max(const char* symbol) const;
  // Sets the kernel threads (kiln_model_set_num_threads: process-wide, at least 1).
  void set_threads(int threads) const;
  // kiln_generate on source ids [batch, length] with `search` (its callback is not used), in
  // chunks of the model's max_batch sentences. A refused chunk is a kiln::Error with the
  // runtime's message; where it names a batch row, `sentence(i)` describes the input's
  // sentence i (from 0) after it (e.g. "sentence 3 'three...'").
  // With `on_token`, each token chosen (greedy search or sampling) is handed to it as it
  // is chosen, with its sentence's index in `src` (kiln generate --stream).
  Generated generate(const std::vector<int64_t>& src, int64_t batch, int64_t length,
                     const kiln_search_options& search,
                     const std::function<std::string(int64_t)>& sentence,
                     const std::function<void(int64_t, int64_t)>& on_token = {}) const;

 private:
  std::unique_ptr<LoadedLibrary> loaded_;
};

}  // namespace kiln::tools
