// Whether a CUDA device is there to run CUDA-target libraries on: the tests that need one
// skip, saying why, where it is not (the suite's machines have none; the GPU machine of
// bench/run_gpu.sh does).
#pragma once

#include <dlfcn.h>

#include <string>

namespace kiln::testing {

// Why CUDA cannot run here ("" where a device is usable): the driver library is loaded as
// the generated glue loads it, then asked for devices (cuInit, cuDeviceGetCount).
inline std::string cuda_unavailable() {
  void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (!lib) lib = dlopen("libcuda.so", RTLD_LAZY | RTLD_LOCAL);
  if (!lib) return "no CUDA driver";
  using Init = int (*)(unsigned);
  using Count = int (*)(int*);
  auto init = reinterpret_cast<Init>(dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<Count>(dlsym(lib, "cuDeviceGetCount"));
  int n = 0;
  if (!init || !count || init(0) != 0 || count(&n) != 0 || n < 1) return "no CUDA device";
  return "";
}

// Whether the CUDA driver library is installed (a device or not).
inline bool cuda_driver_present() {
  for (const char* name : {"libcuda.so.1", "libcuda.so"})
    if (void* lib = dlopen(name, RTLD_LAZY | RTLD_LOCAL)) {
      dlclose(lib);
      return true;
    }
  return false;
}

// The skip message of a CUDA test where no device is usable ("" where one is).
inline std::string cuda_skip_reason() {
  static const std::string why = cuda_unavailable();
  return why.empty() ? why : "skipped: " + why + " (the CUDA build runs on a GPU)";
}

}  // namespace kiln::testing
