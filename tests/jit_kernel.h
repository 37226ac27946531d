// Running a kernel pipeline in the tests: JIT-compiled by Halide for one target and called
// through its argv entry point with the buffers in kernels.h's argument order (output
// last), exactly as the AOT-compiled function is called by the runtime.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "codegen/halide_kernels.h"
#include "codegen/kernels.h"

namespace kiln::jit {

// An AVX2-only target: the schedules are per target family, and this machine runs both.
inline const char* const kAvx2Target = "x86-64-linux-avx-avx2-f16c-fma-sse41";

// "host" or a Halide target string.
inline Halide::Target target_named(const std::string& name) {
  return name == "host" ? codegen::host_target() : Halide::Target(name);
}

// The message of the last error a JIT-compiled kernel reported.
inline std::string& last_error() {
  static std::string message;
  return message;
}

class JitKernel {
 public:
  JitKernel(const codegen::KernelPipeline& kp, const Halide::Target& target) {
    static int counter = 0;
    const std::string name = "kiln_test_kernel_" + std::to_string(counter++);
    Halide::Pipeline pipeline = kp.pipeline;
    Halide::Module module =
        pipeline.compile_to_module(kp.args, name, target.with_feature(Halide::Target::JIT));
    jit_ = Halide::Internal::JITModule(module, module.get_function_by_name(name));
  }

  // Runs on the buffers (inputs, then output); returns Halide's status (0: success). An
  // error is recorded in last_error() instead of ending the process.
  int operator()(const std::vector<halide_buffer_t*>& buffers) const {
    std::vector<const void*> argv(buffers.begin(), buffers.end());
    Halide::JITHandlers handlers;
    handlers.custom_error = [](Halide::JITUserContext*, const char* message) {
      last_error() = message;
    };
    const Halide::JITHandlers old =
        Halide::Internal::JITSharedRuntime::set_default_handlers(handlers);
    last_error().clear();
    const int status = jit_.argv_function()(argv.data());
    Halide::Internal::JITSharedRuntime::set_default_handlers(old);
    return status;
  }
  int run(const std::vector<Halide::Buffer<>>& buffers) const {
    std::vector<halide_buffer_t*> raw;
    for (const Halide::Buffer<>& b : buffers)
      raw.push_back(const_cast<halide_buffer_t*>(b.raw_buffer()));
    return (*this)(raw);
  }

 private:
  Halide::Internal::JITModule jit_;
};

// The AOT path: `spec` compiles to an object file (as kiln compile does, without the
// runtime) for the host and for AVX2, and each object is a real one (over 1000 bytes; any
// file left by an earlier run is removed first, so it cannot pass for a new one).
inline void expect_compiles_ahead_of_time(const codegen::KernelSpec& spec) {
  const std::string name = codegen::kernel_name(spec);
  for (const char* target : {"host", kAvx2Target}) {
    const std::filesystem::path object =
        std::filesystem::path(::testing::TempDir()) /
        ("kiln_aot_" + name + (target == std::string("host") ? "_host" : "_avx2") + ".o");
    std::filesystem::remove(object);
    codegen::compile_kernel(spec, target, name, object.string());
    std::error_code ec;
    EXPECT_GT(std::filesystem::file_size(object, ec), 1000u)
        << target << " " << name << " " << ec.message();
    std::filesystem::remove(object);
  }
}

}  // namespace kiln::jit
