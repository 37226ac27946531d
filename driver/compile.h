// `kiln compile`: runs the default pipeline, lowers the module, compiles every kernel
// with Halide (in parallel child processes), and packages a static library and a header
// (optionally a shared library and the final IR) that an application links with kiln's
// runtime library only. Free of Halide.
//
// Output in `out_dir` for model name N:
//   libN.a   kernels, the Halide runtime, and the entry points (plan + C ABI glue)
//   N.h      the C ABI (`N_create`) and a C++ class `kiln_models::N` with typed entry points
//   libN.so  (with emit_shared) the same C ABI, kiln's runtime linked in
//   N.kir    (with emit_ir) the optimized IR the library was built from
#pragma once

#include <functional>
#include <string>

#include "ir/ir.h"

namespace kiln::driver {

struct CompileOptions {
  std::string target = "host";  // a Halide target string
  std::string weights = "f32";  // "f32", or "bf16": linear weights in bf16 (AVX512-BF16)
  // With bf16 weights, what the products run on (runtime/bf16_products.h): "dot" (vdpbf16ps;
  // attention in bf16 too), "fma" (f32 FMAs on the widened weights; attention in f32) or
  // "auto" (both forms in the library; the runtime runs the faster on the CPU it loads on).
  // With int8 weights, the same for attention's two products (the linears are int8 in both):
  // "dot" bf16 (the library then needs AVX512-BF16 too), "fma" f32, "auto" both (f32 where the
  // CPU lacks AVX512-BF16; with target "host" on such a CPU, f32 only).
  std::string bf16_products = "auto";
  // With bf16 weights, activations that only bf16 kernels read (a linear's input, attention's
  // q, k, v) written in bf16 by the kernel that computes them (codegen::LowerOptions); false
  // keeps every activation in f32. The same numbers either way.
  bool bf16_activations = true;
  std::string out_dir = ".";
  std::string name;  // library name; default: the module's name
  bool emit_static = true;
  bool emit_shared = false;
  bool emit_ir = false;
  int jobs = 0;  // child processes compiling at once (kernels, tools); 0: one per CPU
  std::function<void(const std::string&)> progress;  // one line per step; may be empty
  // One line per lost-fusion note (passes/notes.h), right after the pipeline; may be empty.
  std::function<void(const std::string&)> note;
  std::string ir_file;  // the IR text's file name, for notes about hand-written IR
};

struct CompileResult {
  std::string static_library, shared_library, header, ir_file;
  int kernels = 0;
  double seconds = 0;
};

// Throws kiln::Error; on SIGINT, SIGTERM or SIGHUP it kills its children, removes what it wrote,
// and re-raises the signal with its former disposition.
CompileResult compile_model(ir::Module module, const CompileOptions& options);

// Where this kiln finds kiln/runtime.h and libkiln_runtime.a (installed layout next to
// the executable, else the build tree); used to compile the generated glue.
std::string runtime_include_dir();
std::string runtime_library();

}  // namespace kiln::driver
