// A device tensor for the GPU benches (model_bench_cuda, gpu_kernel_bench; issue 30): a
// row-major halide_buffer_t on a model's device (kiln_model_device_interface) with a host
// copy of its values, uploaded once, as kiln_model_run_device takes it; and a call of one
// entry point on such tensors (DeviceCall).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "HalideRuntime.h"
#include "kiln/runtime.h"

namespace kiln_bench {

class DeviceTensor {
 public:
  // f32 (KILN_F32) or i64 (KILN_I64) of `shape`, holding `bytes` (its element count times the
  // element size; zeros where empty).
  DeviceTensor(const kiln_model* model, int32_t dtype, std::vector<int64_t> shape,
               const void* bytes = nullptr)
      : dtype_(dtype), shape_(std::move(shape)) {
    int64_t n = 1, stride = 1;
    for (int64_t d : shape_) n *= d;
    dims_.resize(shape_.size());
    for (size_t d = shape_.size(); d-- > 0;) {
      dims_[shape_.size() - 1 - d] =
          halide_dimension_t(0, static_cast<int32_t>(shape_[d]), static_cast<int32_t>(stride));
      stride *= shape_[d];
    }
    host_.assign(static_cast<size_t>(n) * 8, 0);  // 8: room for i64
    const size_t size = static_cast<size_t>(n) * (dtype == KILN_I64 ? 8 : 4);
    if (bytes) std::memcpy(host_.data(), bytes, size);
    buf_.host = host_.data();
    buf_.type = dtype == KILN_I64 ? halide_type_t(halide_type_int, 64)
                                  : halide_type_t(halide_type_float, 32);
    buf_.dimensions = static_cast<int32_t>(dims_.size());
    buf_.dim = dims_.data();
    status_ = halide_device_malloc(nullptr, &buf_, kiln_model_device_interface(model));
    if (status_ == 0) {
      buf_.set_host_dirty(true);
      status_ = halide_copy_to_device(nullptr, &buf_, buf_.device_interface);
    }
  }
  ~DeviceTensor() {
    if (buf_.device) halide_device_free(nullptr, &buf_);
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;

  // 0, or the status of the failed allocation or upload.
  int status() const { return status_; }
  halide_buffer_t* buffer() { return &buf_; }
  // Waits for the device's work on this tensor; 0 or Halide's error status.
  int sync() { return halide_device_sync(nullptr, &buf_); }
  kiln_tensor tensor() {
    kiln_tensor t{};
    t.dtype = dtype_;
    t.rank = static_cast<int32_t>(shape_.size());
    for (size_t d = 0; d < shape_.size(); ++d) t.shape[d] = shape_[d];
    t.data = &buf_;
    return t;
  }

 private:
  int32_t dtype_;
  std::vector<int64_t> shape_;
  std::vector<halide_dimension_t> dims_;
  std::vector<uint8_t> host_;
  halide_buffer_t buf_{};
  int status_ = -1;
};

// One entry point's call with device tensors: inputs added (allocated and uploaded), then its
// one f32 output allocated at the shape the model gives; each step returns "" or why it failed.
class DeviceCall {
 public:
  explicit DeviceCall(kiln_model* model, const char* function) : m_(model), function_(function) {}

  std::string add_input(int32_t dtype, std::vector<int64_t> shape, const void* bytes) {
    inputs_.push_back(std::make_unique<DeviceTensor>(m_, dtype, std::move(shape), bytes));
    if (const int s = inputs_.back()->status(); s != 0)
      return "cannot allocate or fill a device input (Halide status " + std::to_string(s) +
             "; no CUDA driver or device?)";
    in_.push_back(inputs_.back()->tensor());
    return "";
  }
  std::string prepare_output() {
    kiln_tensor shape{};
    if (kiln_model_output_shapes_device(m_, function_, in_.data(), in_.size(), &shape, 1) != 0)
      return kiln_model_error(m_);
    output_ = std::make_unique<DeviceTensor>(
        m_, KILN_F32, std::vector<int64_t>(shape.shape, shape.shape + shape.rank));
    if (const int s = output_->status(); s != 0)
      return "cannot allocate the device output (Halide status " + std::to_string(s) + ")";
    out_ = output_->tensor();
    return "";
  }
  // kiln_model_run_device's status (the kernels queued, not finished: see sync).
  int run() { return kiln_model_run_device(m_, function_, in_.data(), in_.size(), &out_, 1); }
  // Waits for the device to finish the output; 0 or Halide's error status.
  int sync() { return output_->sync(); }

 private:
  kiln_model* m_;
  const char* function_;
  std::vector<std::unique_ptr<DeviceTensor>> inputs_;
  std::unique_ptr<DeviceTensor> output_;
  std::vector<kiln_tensor> in_;
  kiln_tensor out_{};
};

}  // namespace kiln_bench
