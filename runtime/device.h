// Device residency for a library compiled for a GPU target: device memory mirroring the
// runtime's host storage (weights, tables, arenas, a call's inputs and outputs), the device
// views a kernel call gets of it, and the checks of device tensors a caller passes
// (kiln_model_run_device). Everything goes through the library's kiln_device_ops.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "HalideRuntime.h"
#include "kiln/runtime.h"
#include "runtime/binding.h"

namespace kiln::rt {

// Throws "<what> failed with status <status>: <Halide's message>" for a failed device call.
void check_device(int status, const std::string& what);

// Device memory of a GPU library mirroring `bytes` of host memory, as a one-dimensional
// byte buffer: kernels get views of it (device crops), and it is copied as a whole between
// host and device only when asked (upload, download). Frees the device memory when
// destroyed.
class DeviceMirror {
 public:
  DeviceMirror(const kiln_device_ops& ops, uint8_t* host, int64_t bytes, const std::string& what);
  // A view of a caller's device allocation (kiln_model_run_device) as `bytes` bytes, which
  // start `origin` bytes into the allocation (a crop's offset; 0 where unknown): never copied
  // to or from the host, never freed here.
  DeviceMirror(const kiln_device_ops& ops, const halide_buffer_t& external, int64_t bytes,
               uint64_t origin);
  ~DeviceMirror();
  DeviceMirror(const DeviceMirror&) = delete;
  DeviceMirror& operator=(const DeviceMirror&) = delete;

  void upload(const std::string& what);
  void download(const std::string& what);
  halide_buffer_t* buffer() { return &buf_; }
  uint64_t origin() const { return origin_; }

 private:
  const kiln_device_ops& ops_;
  bool owned_ = true;
  uint64_t origin_ = 0;
  halide_buffer_t buf_{};
  halide_dimension_t dim_{};
};

// A kernel call's buffers on the device: each view of a mirror becomes a device crop at its
// byte offset, or, where that offset (from the allocation's start: a caller's crop adds its
// own) is off the device's view alignment (OpenCL sub-buffers), a dense temporary that inputs
// are copied into and outputs out of (device to device). Releases the crops and frees the
// temporaries when destroyed.
class DeviceViews {
 public:
  DeviceViews(const kiln_device_ops& ops, int64_t alignment) : ops_(ops), alignment_(alignment) {}
  ~DeviceViews();
  DeviceViews(const DeviceViews&) = delete;
  DeviceViews& operator=(const DeviceViews&) = delete;

  // Points `view` (host pointer and dims set, `offset` bytes into `mirror`'s host memory) at
  // the device; returns the buffer to pass the kernel (`view` or a temporary). `host_current`:
  // the mirror's host memory holds what its device memory does (inputs, weights, tables),
  // else (the arena, outputs) a kernel part that runs on the host must copy from the device.
  halide_buffer_t* attach(DeviceMirror& mirror, int64_t offset, halide_buffer_t* view, bool output,
                          bool host_current, const std::string& what);

  // After the kernel: outputs written to temporaries go to their views, and outputs a kernel
  // part wrote on the host go to the device.
  void finish(const std::vector<halide_buffer_t*>& outputs, const std::string& what);

 private:
  struct Temp {
    halide_buffer_t buf{};
    std::vector<halide_dimension_t> dims;
    halide_buffer_t* view = nullptr;  // an output's place
  };
  const kiln_device_ops& ops_;
  int64_t alignment_;
  std::deque<Temp> temps_;  // stable addresses
  std::vector<halide_buffer_t*> crops_;
};

// Device tensors (kiln_model_run_device): every tensor's `data` is a halide_buffer_t with
// an allocation on the library's device.
struct DeviceTensors {
  std::vector<kiln_tensor> tensors;       // as host tensors for bind() and run()'s checks
  std::vector<halide_buffer_t*> buffers;  // the caller's, by position
  // Where each tensor's bytes lie: in its device allocation where the library tells it
  // (kiln_device_ops::allocation), else the buffer's device handle from 0 (so only tensors
  // of one handle are known to overlap).
  std::vector<Span> spans;
  std::deque<std::vector<uint8_t>> values;  // host copies of ids and bools, for their checks
};

// Checks each of `given` (`what`: "input" or "output") against the buffer it points to:
// a device allocation of `ops`'s device interface, the tensor's element type, its shape
// dense and row-major, and (where the library tells an allocation's size) its bytes within
// the allocation from the buffer's start. The returned tensors hold the buffer's bytes as
// their capacity; with
// `read_values`, ids and bools (whose values bind() checks) are copied to the host (a
// device-to-host copy of those few bytes), and an input whose newest data is on the host
// (host_dirty) is refused.
DeviceTensors stage_device(const kiln_device_ops& ops, const char* what, const kiln_tensor* given,
                           size_t n, bool read_values);

// The GPU context of the Halide runtime is one per process, shared by every model of a GPU
// library: it is given back (`release_device`) when the last such model is destroyed, not
// while another may be running on it.
void gpu_model_created();
void gpu_model_destroyed(void (*release_device)());

}  // namespace kiln::rt
