// Device residency of a GPU library's model (see device.h): device mirrors and views, the
// checks of a caller's device tensors, the model's weights and tables copied to the device
// once, and the process's one GPU context.
#include "runtime/device.h"

#include <algorithm>
#include <memory>
#include <mutex>

#include <fmt/format.h>

#include "runtime/errors.h"
#include "runtime/model.h"
#include "runtime/weights.h"
#include "support/error.h"

namespace kiln::rt {

void check_device(int status, const std::string& what) {
  if (status != 0) fail("{} failed with status {}{}", what, status, kernel_error_suffix());
}

DeviceMirror::DeviceMirror(const kiln_device_ops& ops, uint8_t* host, int64_t bytes,
                           const std::string& what)
    : ops_(ops) {
  if (bytes > INT32_MAX)
    fail("{} has {} bytes, more than a device buffer of this runtime holds ({})", what, bytes,
         INT32_MAX);
  dim_ = halide_dimension_t(0, static_cast<int32_t>(std::max<int64_t>(bytes, 1)), 1);
  buf_.host = host;
  buf_.type = halide_type_t(halide_type_uint, 8);
  buf_.dimensions = 1;
  buf_.dim = &dim_;
  kernel_error().clear();
  check_device(ops_.device_malloc(nullptr, &buf_, ops_.interface()),
               "allocating device memory for " + what);
}

DeviceMirror::DeviceMirror(const kiln_device_ops& ops, const halide_buffer_t& external,
                           int64_t bytes, uint64_t origin)
    : ops_(ops), owned_(false), origin_(origin) {
  KILN_ASSERT(bytes <= INT32_MAX, "a device tensor's bytes are checked against its shape");
  dim_ = halide_dimension_t(0, static_cast<int32_t>(std::max<int64_t>(bytes, 1)), 1);
  buf_.device = external.device;
  buf_.device_interface = external.device_interface;
  buf_.type = halide_type_t(halide_type_uint, 8);
  buf_.dimensions = 1;
  buf_.dim = &dim_;
}

DeviceMirror::~DeviceMirror() {
  if (owned_ && buf_.device) ops_.device_free(nullptr, &buf_);
}

void DeviceMirror::upload(const std::string& what) {
  buf_.set_device_dirty(false);
  buf_.set_host_dirty(true);
  kernel_error().clear();
  check_device(ops_.copy_to_device(nullptr, &buf_, ops_.interface()),
               "copying " + what + " to the device");
}

void DeviceMirror::download(const std::string& what) {
  buf_.set_host_dirty(false);
  buf_.set_device_dirty(true);
  kernel_error().clear();
  check_device(ops_.copy_to_host(nullptr, &buf_), "copying " + what + " from the device");
}

DeviceViews::~DeviceViews() {
  for (Temp& t : temps_)
    if (t.buf.device) ops_.device_free(nullptr, &t.buf);
  for (halide_buffer_t* view : crops_)
    if (view->device) ops_.device_release_crop(nullptr, view);
}

halide_buffer_t* DeviceViews::attach(DeviceMirror& mirror, int64_t offset, halide_buffer_t* view,
                                     bool output, bool host_current, const std::string& what) {
  halide_dimension_t at(static_cast<int32_t>(offset), 1, 1);
  halide_buffer_t one{};
  one.host = view->host;
  one.type = halide_type_t(halide_type_uint, 8);
  one.dimensions = 1;
  one.dim = &at;
  kernel_error().clear();
  check_device(ops_.device_crop(nullptr, mirror.buffer(), &one), "making a device view of " + what);
  view->device = one.device;
  view->device_interface = one.device_interface;
  crops_.push_back(view);
  view->set_device_dirty(!output && !host_current);
  if ((mirror.origin() + static_cast<uint64_t>(offset)) % static_cast<uint64_t>(alignment_) == 0)
    return view;
  Temp& t = temps_.emplace_back();
  t.dims.assign(view->dim, view->dim + view->dimensions);
  int32_t stride = 1;
  for (halide_dimension_t& d : t.dims) {
    d.min = 0;
    d.stride = stride;
    stride *= d.extent;
  }
  t.buf.type = view->type;
  t.buf.dimensions = view->dimensions;
  t.buf.dim = t.dims.data();
  kernel_error().clear();
  check_device(ops_.device_malloc(nullptr, &t.buf, ops_.interface()),
               "allocating device memory for " + what);
  if (output) {
    t.view = view;
  } else {
    check_device(ops_.buffer_copy(nullptr, view, ops_.interface(), &t.buf),
                 "copying " + what + " into a device buffer");
  }
  return &t.buf;
}

void DeviceViews::finish(const std::vector<halide_buffer_t*>& outputs, const std::string& what) {
  for (Temp& t : temps_)
    if (t.view) {
      kernel_error().clear();
      check_device(ops_.buffer_copy(nullptr, &t.buf, ops_.interface(), t.view),
                   "copying the output of " + what + " to its place");
    }
  for (halide_buffer_t* b : outputs)
    if (b->host && b->host_dirty()) {
      kernel_error().clear();
      check_device(ops_.copy_to_device(nullptr, b, ops_.interface()),
                   "copying the output of " + what + " to the device");
    }
}

DeviceTensors stage_device(const kiln_device_ops& ops, const char* what, const kiln_tensor* given,
                           size_t n, bool read_values) {
  if (n && !given) fail("{}s are null", what);
  DeviceTensors out;
  for (size_t i = 0; i < n; ++i) {
    const kiln_tensor& t = given[i];
    const std::string label =
        t.name ? fmt::format("{} '{}'", what, t.name) : fmt::format("{} {}", what, i);
    if (!t.data) fail("{} has no buffer (a device tensor's data is a halide_buffer_t)", label);
    halide_buffer_t& b = *static_cast<halide_buffer_t*>(t.data);
    if (!b.device)
      fail(
          "{} is a host-only buffer: a device tensor needs a device allocation "
          "(halide_device_malloc with kiln_model_device_interface)",
          label);
    if (b.device_interface != ops.interface())
      fail("{} is on another device interface than the model's (kiln_model_device_interface)",
           label);
    if (read_values && b.host_dirty())
      fail("{} has newer data on the host (host_dirty): copy it to the device first", label);
    halide_type_t want_type;
    switch (t.dtype) {
      case KILN_F32:
        want_type = halide_type_t(halide_type_float, 32);
        break;
      case KILN_I64:
        want_type = halide_type_t(halide_type_int, 64);
        break;
      case KILN_BOOL:
        want_type = halide_type_t(halide_type_uint, 8);
        break;
      case KILN_I32:
        fail("{} is i32: a device tensor has its parameter's dtype (ids are i64)", label);
      case KILN_BF16:
      case KILN_I8:
        fail("{} is {}: an entry point's tensors are f32, i64 or bool", label,
             ::kiln::dtype_name(t.dtype));
      default:
        fail("{} has unknown dtype {}", label, t.dtype);
    }
    const bool bool_bits = t.dtype == KILN_BOOL && b.type.code == halide_type_uint &&
                           b.type.bits == 1 && b.type.lanes == 1;
    if (!(b.type == want_type) && !bool_bits)
      fail("{} is {}, its buffer holds {}{} elements", label, kiln::dtype_name(t.dtype),
           b.type.code == halide_type_float ? "float"
           : b.type.code == halide_type_int ? "int"
                                            : "uint",
           b.type.bits);
    if (t.rank < 0 || t.rank > KILN_MAX_RANK || b.dimensions != t.rank)
      fail("{} has rank {}, its buffer {} dimensions", label, t.rank, b.dimensions);
    if (t.rank > 0 && !b.dim) fail("{}'s buffer has {} dimensions and no dim", label, t.rank);
    std::vector<int64_t> shape(t.shape, t.shape + t.rank), got, strides;
    bool dense = true;
    int64_t stride = 1;
    for (int32_t d = t.rank - 1; d >= 0; --d) {
      const halide_dimension_t& hd = b.dim[t.rank - 1 - d];
      got.insert(got.begin(), hd.extent);
      strides.insert(strides.begin(), hd.stride);
      dense = dense && hd.extent == shape[d] && hd.stride == stride;
      stride *= std::max<int64_t>(shape[d], 0);
    }
    if (!dense)
      fail(
          "{} has shape {}, its buffer shape {} and strides {} (outermost first): a device "
          "tensor is dense and row-major in its tensor's shape",
          label, shape_string(shape), shape_string(got), shape_string(strides));
    const int64_t bytes = stride * static_cast<int64_t>(kiln_dtype_size(t.dtype));
    if (bytes > INT32_MAX)
      fail("{} has {} bytes, more than a device buffer of this runtime holds ({})", label, bytes,
           INT32_MAX);
    // The allocation, where the library can tell it: a shape that claims more bytes than the
    // buffer has from its start would be read or written past the allocation's end.
    Span span{b.device, 0, static_cast<uint64_t>(bytes)};
    uint64_t allocation = 0, offset = 0, room = 0;
    if (ops.allocation && ops.allocation(&b, &allocation, &offset, &room) == 0) {
      if (static_cast<uint64_t>(bytes) > room)
        fail(
            "{} of shape {} needs {} bytes of {}, its device allocation holds {} from the "
            "buffer's start",
            label, shape_string(shape), bytes, kiln::dtype_name(t.dtype), room);
      span = {allocation, offset, offset + static_cast<uint64_t>(bytes)};
    }
    out.spans.push_back(span);
    kiln_tensor& staged = out.tensors.emplace_back(t);
    staged.capacity = static_cast<size_t>(bytes);
    out.buffers.push_back(&b);
    if (!read_values || (t.dtype != KILN_I64 && t.dtype != KILN_BOOL) || bytes == 0) continue;
    std::vector<uint8_t>& host = out.values.emplace_back(static_cast<size_t>(bytes));
    halide_dimension_t dim(0, static_cast<int32_t>(bytes), 1);
    halide_buffer_t src{}, dst{};
    src.device = b.device;
    src.device_interface = b.device_interface;
    dst.host = host.data();
    src.type = dst.type = halide_type_t(halide_type_uint, 8);
    src.dimensions = dst.dimensions = 1;
    src.dim = dst.dim = &dim;
    kernel_error().clear();
    check_device(ops.buffer_copy(nullptr, &src, nullptr, &dst),
                 "copying " + label + " to the host to check its values");
    staged.data = host.data();
  }
  return out;
}

namespace {
std::mutex gpu_models_mutex;
int gpu_models = 0;  // guarded by gpu_models_mutex
}  // namespace

void gpu_model_created() {
  std::lock_guard<std::mutex> lock(gpu_models_mutex);
  ++gpu_models;
}

void gpu_model_destroyed(void (*release_device)()) {
  std::lock_guard<std::mutex> lock(gpu_models_mutex);
  if (--gpu_models == 0) release_device();
}

}  // namespace kiln::rt

void kiln_model::make_resident() {
  std::lock_guard<std::mutex> lock(device_mutex);
  if (resident) return;
  const kiln_device_ops& ops = *hooks.device;
  auto mirror = [&](kiln::rt::AlignedBytes& bytes, const std::string& what) {
    if (bytes.device) return;
    auto d = std::make_unique<kiln::rt::DeviceMirror>(ops, bytes.data.get(), bytes.size, what);
    d->upload(what);
    bytes.device = std::move(d);
  };
  for (size_t i = 0; i < weights.size(); ++i)
    mirror(weights[i], fmt::format("weight '{}'", plan.weights[i].name));
  for (size_t i = 0; i < tables.size(); ++i) mirror(tables[i], fmt::format("table {}", i));
  const int64_t alignment = ops.view_alignment();
  view_alignment = alignment >= 1 ? alignment : 4096;  // 4096: no device said
  resident = true;
}

void kiln_model::drop_device() {
  for (kiln::rt::AlignedBytes& w : weights) w.device.reset();
  for (kiln::rt::AlignedBytes& t : tables) t.device.reset();
  arenas.drop_device();
}

void kiln_model::require_device(const char* fname) const {
  if (!hooks.device)
    kiln::fail(
        "model '{}' was compiled for the CPU (target {}): device tensors for entry point '{}' "
        "need a library compiled for a GPU target (host-opencl, host-cuda-...)",
        plan.model, plan.target, fname ? fname : "");
}

void kiln_model::output_shapes_device(const char* fname, const kiln_tensor* inputs, size_t n_in,
                                      kiln_tensor* outputs, size_t n_out) {
  require_device(fname);
  kiln::rt::DeviceTensors in =
      kiln::rt::stage_device(*hooks.device, "input", inputs, n_in, /*read_values=*/true);
  output_shapes(fname, in.tensors.data(), n_in, outputs, n_out);
}
