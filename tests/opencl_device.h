// Whether an OpenCL device is there to run GPU-target libraries on (pocl in the suite): the
// tests that need one skip, saying so, where it is not.
#pragma once

#include <dlfcn.h>

#include <cstdint>

namespace kiln::testing {

// Whether the OpenCL ICD loader finds a platform with a device (asked through the loader
// directly, as Halide's runtime will). Call it only in a process without libHalide.
inline bool opencl_device_present() {
  void* lib = dlopen("libOpenCL.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (!lib) return false;
  using GetPlatforms = int32_t (*)(uint32_t, void**, uint32_t*);
  using GetDevices = int32_t (*)(void*, uint64_t, uint32_t, void**, uint32_t*);
  auto platforms = reinterpret_cast<GetPlatforms>(dlsym(lib, "clGetPlatformIDs"));
  auto devices = reinterpret_cast<GetDevices>(dlsym(lib, "clGetDeviceIDs"));
  if (!platforms || !devices) return false;
  void* ids[16];
  uint32_t n = 0;
  if (platforms(16, ids, &n) != 0) return false;
  for (uint32_t i = 0; i < n && i < 16; ++i) {
    uint32_t d = 0;
    if (devices(ids[i], 0xFFFFFFFF /* CL_DEVICE_TYPE_ALL */, 0, nullptr, &d) == 0 && d > 0)
      return true;
  }
  return false;
}

}  // namespace kiln::testing
