// The runtime behind kiln/runtime.h: loads weights for a plan, validates inputs, and
// runs an entry point's kernel calls over one preallocated arena.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "HalideRuntime.h"
#include "kiln/runtime.h"
#include "runtime/cpu_features.h"
#include "runtime/generate.h"
#include "runtime/plan.h"
#include "runtime/safetensors.h"
#include "runtime/thread_pool.h"
#include "runtime/weights.h"
#include "support/error.h"
#include "support/sinusoid.h"

using kiln::fail;
using kiln::rt::BufferDesc;
using kiln::rt::ElemType;
using kiln::rt::FunctionDesc;
using kiln::rt::Plan;
using kiln::rt::Storage;

namespace {

// Kernel errors reported by the Halide runtime, per thread, until taken.
thread_local std::string g_kernel_error;
void record_kernel_error(void*, const char* message) { g_kernel_error = message ? message : ""; }

// Throws "<what> failed with status <status>: <Halide's message>" for a failed device call.
void check_device(int status, const std::string& what) {
  if (status != 0)
    fail("{} failed with status {}{}{}", what, status, g_kernel_error.empty() ? "" : ": ",
         g_kernel_error);
}

// Device memory of a GPU library mirroring `bytes` of host memory, as a one-dimensional
// byte buffer: kernels get views of it (device crops), and it is copied as a whole between
// host and device only when asked (upload, download). Frees the device memory when
// destroyed.
class DeviceMirror {
 public:
  DeviceMirror(const kiln_device_ops& ops, uint8_t* host, int64_t bytes, const std::string& what)
      : ops_(ops) {
    if (bytes > INT32_MAX)
      fail("{} has {} bytes, more than a device buffer of this runtime holds ({})", what, bytes,
           INT32_MAX);
    dim_ = halide_dimension_t(0, static_cast<int32_t>(std::max<int64_t>(bytes, 1)), 1);
    buf_.host = host;
    buf_.type = halide_type_t(halide_type_uint, 8);
    buf_.dimensions = 1;
    buf_.dim = &dim_;
    g_kernel_error.clear();
    check_device(ops_.device_malloc(nullptr, &buf_, ops_.interface()),
                 "allocating device memory for " + what);
  }
  // A view of a caller's device allocation (kiln_model_run_device) as `bytes` bytes: never
  // copied to or from the host, never freed here.
  DeviceMirror(const kiln_device_ops& ops, const halide_buffer_t& external, int64_t bytes)
      : ops_(ops), owned_(false) {
    KILN_ASSERT(bytes <= INT32_MAX, "a device tensor's bytes are checked against its shape");
    dim_ = halide_dimension_t(0, static_cast<int32_t>(std::max<int64_t>(bytes, 1)), 1);
    buf_.device = external.device;
    buf_.device_interface = external.device_interface;
    buf_.type = halide_type_t(halide_type_uint, 8);
    buf_.dimensions = 1;
    buf_.dim = &dim_;
  }
  ~DeviceMirror() {
    if (owned_ && buf_.device) ops_.device_free(nullptr, &buf_);
  }
  DeviceMirror(const DeviceMirror&) = delete;
  DeviceMirror& operator=(const DeviceMirror&) = delete;

  void upload(const std::string& what) {
    buf_.set_device_dirty(false);
    buf_.set_host_dirty(true);
    g_kernel_error.clear();
    check_device(ops_.copy_to_device(nullptr, &buf_, ops_.interface()),
                 "copying " + what + " to the device");
  }
  void download(const std::string& what) {
    buf_.set_host_dirty(false);
    buf_.set_device_dirty(true);
    g_kernel_error.clear();
    check_device(ops_.copy_to_host(nullptr, &buf_), "copying " + what + " from the device");
  }
  halide_buffer_t* buffer() { return &buf_; }

 private:
  const kiln_device_ops& ops_;
  bool owned_ = true;
  halide_buffer_t buf_{};
  halide_dimension_t dim_{};
};

// 64-byte aligned storage (large buffers on huge pages; see rt::allocate_aligned), and in a
// GPU library its device mirror.
struct AlignedBytes {
  kiln::rt::AlignedStorage data;
  int64_t size = 0;
  std::unique_ptr<DeviceMirror> device;
  void allocate(int64_t bytes) {
    size = bytes;
    data = kiln::rt::allocate_aligned(bytes);
  }
};

// A kernel call's buffers on the device: each view of a mirror becomes a device crop at its
// byte offset, or, where that offset is off the device's view alignment (OpenCL
// sub-buffers), a dense temporary that inputs are copied into and outputs out of (device to
// device). Releases the crops and frees the temporaries when destroyed.
class DeviceViews {
 public:
  DeviceViews(const kiln_device_ops& ops, int64_t alignment) : ops_(ops), alignment_(alignment) {}
  ~DeviceViews() {
    for (Temp& t : temps_)
      if (t.buf.device) ops_.device_free(nullptr, &t.buf);
    for (halide_buffer_t* view : crops_)
      if (view->device) ops_.device_release_crop(nullptr, view);
  }
  DeviceViews(const DeviceViews&) = delete;
  DeviceViews& operator=(const DeviceViews&) = delete;

  // Points `view` (host pointer and dims set, `offset` bytes into `mirror`'s host memory) at
  // the device; returns the buffer to pass the kernel (`view` or a temporary). `host_current`:
  // the mirror's host memory holds what its device memory does (inputs, weights, tables),
  // else (the arena, outputs) a kernel part that runs on the host must copy from the device.
  halide_buffer_t* attach(DeviceMirror& mirror, int64_t offset, halide_buffer_t* view, bool output,
                          bool host_current, const std::string& what) {
    halide_dimension_t at(static_cast<int32_t>(offset), 1, 1);
    halide_buffer_t one{};
    one.host = view->host;
    one.type = halide_type_t(halide_type_uint, 8);
    one.dimensions = 1;
    one.dim = &at;
    g_kernel_error.clear();
    check_device(ops_.device_crop(nullptr, mirror.buffer(), &one),
                 "making a device view of " + what);
    view->device = one.device;
    view->device_interface = one.device_interface;
    crops_.push_back(view);
    view->set_device_dirty(!output && !host_current);
    if (offset % alignment_ == 0) return view;
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
    g_kernel_error.clear();
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

  // After the kernel: outputs written to temporaries go to their views, and outputs a kernel
  // part wrote on the host go to the device.
  void finish(const std::vector<halide_buffer_t*>& outputs, const std::string& what) {
    for (Temp& t : temps_)
      if (t.view) {
        g_kernel_error.clear();
        check_device(ops_.buffer_copy(nullptr, &t.buf, ops_.interface(), t.view),
                     "copying the output of " + what + " to its place");
      }
    for (halide_buffer_t* b : outputs)
      if (b->host && b->host_dirty()) {
        g_kernel_error.clear();
        check_device(ops_.copy_to_device(nullptr, b, ops_.interface()),
                     "copying the output of " + what + " to the device");
      }
  }

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

std::string shape_str(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ","));
}

const char* type_name(ElemType t) {
  switch (t) {
    case ElemType::f32:
      return "f32";
    case ElemType::i64:
      return "i64";
    case ElemType::u8:
      return "bool";
    case ElemType::bf16:
      return "bf16";
  }
  return "?";
}

halide_type_t halide_type(ElemType t) {
  switch (t) {
    case ElemType::f32:
      return halide_type_t(halide_type_float, 32);
    case ElemType::i64:
      return halide_type_t(halide_type_int, 64);
    case ElemType::u8:
      return halide_type_t(halide_type_uint, 8);
    case ElemType::bf16:
      return halide_type_t(halide_type_bfloat, 16);
  }
  return halide_type_t(halide_type_float, 32);
}

// The C ABI dtype a plan's element type is passed as (i64 inputs also take KILN_I32).
int32_t abi_dtype(ElemType t) {
  switch (t) {
    case ElemType::f32:
      return KILN_F32;
    case ElemType::i64:
      return KILN_I64;
    case ElemType::u8:
      return KILN_BOOL;
    case ElemType::bf16:  // weights only, never an entry point's tensor
      return -1;
  }
  return -1;
}

// Elements of a validated shape (every dim >= 1 and at most its maximum or constant).
int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

// Concurrency: one model may run from any number of threads at once. What a call reads
// (the plan, weights, tables) is immutable after kiln_model_create; what it writes lives
// in an arena that the call holds alone (taken from `idle_arenas`, or allocated when all
// are busy, and given back after the call), in its caller's outputs, and in the calling
// thread's error text. Profiling tallies are the one shared, written state, behind
// `profile_mutex`.
struct kiln_model {
  Plan plan;
  std::vector<kiln_kernel_fn> kernels;
  kiln_hooks hooks{};
  std::vector<AlignedBytes> weights;
  std::vector<AlignedBytes> tables;
  int64_t arena_bytes = 0;  // the largest entry point's arena
  std::vector<const char*> function_names;

  // A GPU library (hooks.device set): weights and tables live on the device too, copied
  // there once, by kiln_model_create or, where the device failed it, by the next run; each
  // arena gets its device memory with its first run, and keeps it.
  std::mutex device_mutex;
  bool resident = false;       // guarded by device_mutex
  int64_t view_alignment = 1;  // kiln_device_ops::view_alignment, set with `resident`

  void make_resident() {
    std::lock_guard<std::mutex> lock(device_mutex);
    if (resident) return;
    const kiln_device_ops& ops = *hooks.device;
    auto mirror = [&](AlignedBytes& bytes, const std::string& what) {
      if (bytes.device) return;
      auto d = std::make_unique<DeviceMirror>(ops, bytes.data.get(), bytes.size, what);
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

  // Frees every device allocation (before the device context is given back).
  void drop_device() {
    for (AlignedBytes& w : weights) w.device.reset();
    for (AlignedBytes& t : tables) t.device.reset();
    std::lock_guard<std::mutex> lock(arena_mutex);
    for (AlignedBytes& a : idle_arenas) a.device.reset();
  }

  // Arenas not in use by a call; one is allocated at create, so a model used from one
  // thread allocates no arena per call.
  std::mutex arena_mutex;
  std::vector<AlignedBytes> idle_arenas;

  // An arena held by one call, given back to the model when the call ends.
  class ArenaLease {
   public:
    explicit ArenaLease(kiln_model& m) : model_(m) {
      {
        std::lock_guard<std::mutex> lock(m.arena_mutex);
        if (!m.idle_arenas.empty()) {
          arena_ = std::move(m.idle_arenas.back());
          m.idle_arenas.pop_back();
          return;
        }
      }
      arena_.allocate(m.arena_bytes);  // every idle arena is busy: this call gets its own
    }
    ~ArenaLease() {
      std::lock_guard<std::mutex> lock(model_.arena_mutex);
      model_.idle_arenas.push_back(std::move(arena_));
    }
    ArenaLease(const ArenaLease&) = delete;
    ArenaLease& operator=(const ArenaLease&) = delete;
    uint8_t* data() { return arena_.data.get(); }
    AlignedBytes& bytes() { return arena_; }

   private:
    kiln_model& model_;
    AlignedBytes arena_;
  };

  // The last error of each thread's calls on this model (kiln_model_error).
  mutable std::mutex error_mutex;
  std::map<std::thread::id, std::string> errors;

  void set_error(std::string text) {  // "" clears it
    std::lock_guard<std::mutex> lock(error_mutex);
    if (text.empty())
      errors.erase(std::this_thread::get_id());
    else
      errors[std::this_thread::get_id()] = std::move(text);
  }
  // Valid until this thread's next call on this model.
  const char* error_text() const {
    std::lock_guard<std::mutex> lock(error_mutex);
    auto it = errors.find(std::this_thread::get_id());
    return it == errors.end() ? "" : it->second.c_str();
  }

  // Profiling (kiln_model_set_profiling): per kernel, calls and seconds; per entry point,
  // runs and seconds.
  struct Tally {
    int64_t calls = 0;
    double seconds = 0;
  };
  std::mutex profile_mutex;  // guards the three below
  bool profiling = false;
  std::vector<Tally> kernel_time;
  std::map<std::string, Tally> run_time;

  std::string profile_report() const {
    std::string out;
    double in_kernels = 0;
    for (const Tally& t : kernel_time) in_kernels += t.seconds;
    for (const auto& [name, t] : run_time)
      out += fmt::format("kiln profile: '{}' ran {} time(s), {:.3f} ms per run\n", name, t.calls,
                         1e3 * t.seconds / static_cast<double>(std::max<int64_t>(t.calls, 1)));
    if (run_time.empty()) return out + "kiln profile: nothing ran while profiling\n";
    std::vector<size_t> order;
    for (size_t k = 0; k < kernel_time.size(); ++k)
      if (kernel_time[k].calls) order.push_back(k);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return kernel_time[a].seconds > kernel_time[b].seconds;
    });
    size_t width = 6;
    for (size_t k : order) width = std::max(width, plan.kernel_names[k].size());
    out += fmt::format("{:<{}}  {:>7}  {:>10}  {:>12}  {:>6}\n", "kernel", width, "calls",
                       "total ms", "ms per call", "share");
    for (size_t k : order) {
      const Tally& t = kernel_time[k];
      out += fmt::format("{:<{}}  {:>7}  {:>10.3f}  {:>12.4f}  {:>5.1f}%\n", plan.kernel_names[k],
                         width, t.calls, 1e3 * t.seconds,
                         1e3 * t.seconds / static_cast<double>(t.calls),
                         in_kernels > 0 ? 100.0 * t.seconds / in_kernels : 0.0);
    }
    return out;
  }

  const FunctionDesc& function(const char* name) const {
    if (!name) fail("model '{}': no entry point name given (NULL)", plan.model);
    for (const FunctionDesc& f : plan.functions)
      if (f.name == name) return f;
    std::vector<std::string> names;
    for (const FunctionDesc& f : plan.functions) names.push_back(f.name);
    fail("model '{}' has no entry point '{}' (entry points: {})", plan.model, name,
         fmt::join(names, ", "));
  }

  void load_weights(const std::string& path) {
    kiln::rt::SafeTensors file = kiln::rt::SafeTensors::load(path);
    std::vector<kiln::rt::WeightSpec> expected;
    std::map<std::string, bool> seen;
    for (const auto& w : plan.weights)
      for (size_t i = 0; i < w.sources.size(); ++i)
        if (!seen[w.sources[i]]) {
          seen[w.sources[i]] = true;
          expected.push_back({w.sources[i], kiln::rt::DType::f32, w.source_shapes[i], true});
        }
    kiln::rt::check_weights_or_throw(file, expected);
    weights.resize(plan.weights.size());
    for (size_t wi = 0; wi < plan.weights.size(); ++wi) {
      const auto& w = plan.weights[wi];
      // Concatenation along axis 0, straight from the file's bytes into the laid-out weight
      // (a linear weight as its kernel reads it): each source is a block of rows.
      // Each source is f32 or bf16 (checked above), converted to what the kernels read.
      int64_t numel = 1, source_numel = 0;
      for (int64_t d : w.shape) numel *= d;
      std::vector<std::span<const uint8_t>> parts;
      std::vector<bool> part_bf16;
      for (const std::string& s : w.sources) {
        const kiln::rt::TensorInfo& info = file.at(s);
        parts.push_back(file.bytes(info));
        part_bf16.push_back(info.dtype == kiln::rt::DType::bf16);
        source_numel += static_cast<int64_t>(parts.back().size() / (part_bf16.back() ? 2 : 4));
      }
      // A linear weight W[N, K] (its sources are blocks of rows of K; the bf16 layout pads
      // N to a multiple of 64 and K to even).
      const int64_t K = w.transpose && !w.source_shapes.empty() && !w.source_shapes[0].empty()
                            ? w.source_shapes[0].back()
                            : 1;
      if (w.bf16 ? (K < 1 || source_numel % K != 0 || (source_numel / K + 63) / 64 != w.shape[0] ||
                    (K + 1) / 2 != w.shape[1])
                 : source_numel != numel)
        fail("weight '{}' has {} elements, the plan expects {}", w.name, source_numel,
             w.bf16 ? fmt::format("[N, K] with N/64 = {}, K/2 = {} (rounded up)", w.shape[0],
                                  w.shape[1])
                    : std::to_string(numel));
      weights[wi].allocate(numel * (w.bf16 ? 2 : 4));
      if (w.bf16) std::memset(weights[wi].data.get(), 0, static_cast<size_t>(numel) * 2);
      if (w.transpose) {
        // Stored as [K, N], [N/panel, K, panel] or [Np/64, Kp/2, 64, 2] (the plan is
        // validated) from W[N, K].
        int64_t row = 0;
        for (size_t pi = 0; pi < parts.size(); ++pi) {
          const bool b = part_bf16[pi];
          const int64_t rows = static_cast<int64_t>(parts[pi].size() / (b ? 2 : 4)) / K;
          if (w.bf16)
            kiln::rt::lay_out_linear_weight_bf16_rows(
                parts[pi].data(), row, rows, source_numel / K, K,
                reinterpret_cast<uint16_t*>(weights[wi].data.get()), b);
          else
            kiln::rt::lay_out_linear_weight_rows(parts[pi].data(), row, rows, numel / K, K, w.panel,
                                                 reinterpret_cast<float*>(weights[wi].data.get()),
                                                 b);
          row += rows;
        }
      } else {
        float* out = reinterpret_cast<float*>(weights[wi].data.get());
        for (size_t pi = 0; pi < parts.size(); ++pi) {
          const int64_t n = static_cast<int64_t>(parts[pi].size() / (part_bf16[pi] ? 2 : 4));
          if (part_bf16[pi])
            for (int64_t i = 0; i < n; ++i) {
              uint16_t b;
              std::memcpy(&b, parts[pi].data() + 2 * i, 2);
              out[i] = kiln::rt::bf16_to_f32(b);
            }
          else
            std::memcpy(out, parts[pi].data(), parts[pi].size());
          out += n;
        }
      }
    }
  }

  void build_tables() {
    tables.resize(plan.tables.size());
    for (size_t ti = 0; ti < plan.tables.size(); ++ti) {
      const auto& t = plan.tables[ti];
      if (t.kind != "sinusoid") fail("unknown table kind '{}'", t.kind);
      tables[ti].allocate(t.rows * t.dim * 4);
      kiln::fill_sinusoid_table(t.rows, t.dim, reinterpret_cast<float*>(tables[ti].data.get()));
    }
  }

  // Device tensors (kiln_model_run_device): every tensor's `data` is a halide_buffer_t with
  // an allocation on this library's device.
  struct DeviceTensors {
    std::vector<kiln_tensor> tensors;         // as host tensors for bind() and run()'s checks
    std::vector<halide_buffer_t*> buffers;    // the caller's, by position
    std::deque<std::vector<uint8_t>> values;  // host copies of ids and bools, for their checks
  };

  void require_device(const char* fname) const {
    if (!hooks.device)
      fail(
          "model '{}' was compiled for the CPU (target {}): device tensors for entry point '{}' "
          "need a library compiled for a GPU target (host-opencl, host-cuda-...)",
          plan.model, plan.target, fname ? fname : "");
  }

  // Checks each of `given` (`what`: "input" or "output") against the buffer it points to:
  // a device allocation of this library's device interface, the tensor's element type, and
  // its shape dense and row-major. The returned tensors hold the buffer's bytes as their
  // capacity; with `read_values`, ids and bools (whose values bind() checks) are copied to
  // the host (a device-to-host copy of those few bytes), and an input whose newest data is on
  // the host (host_dirty) is refused.
  DeviceTensors stage_device(const char* what, const kiln_tensor* given, size_t n,
                             bool read_values) {
    if (n && !given) fail("{}s are null", what);
    const kiln_device_ops& ops = *hooks.device;
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
            label, shape_str(shape), shape_str(got), shape_str(strides));
      const int64_t bytes = stride * static_cast<int64_t>(kiln_dtype_size(t.dtype));
      if (bytes > INT32_MAX)
        fail("{} has {} bytes, more than a device buffer of this runtime holds ({})", label, bytes,
             INT32_MAX);
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
      g_kernel_error.clear();
      check_device(ops.buffer_copy(nullptr, &src, nullptr, &dst),
                   "copying " + label + " to the host to check its values");
      staged.data = host.data();
    }
    return out;
  }

  void output_shapes_device(const char* fname, const kiln_tensor* inputs, size_t n_in,
                            kiln_tensor* outputs, size_t n_out) {
    require_device(fname);
    DeviceTensors in = stage_device("input", inputs, n_in, /*read_values=*/true);
    output_shapes(fname, in.tensors.data(), n_in, outputs, n_out);
  }

  // Binds symbols from the inputs and validates them; returns the symbol values.
  std::vector<int64_t> bind(const FunctionDesc& f, const kiln_tensor* inputs, size_t n,
                            std::vector<const kiln_tensor*>* ordered) const {
    if (n != f.params.size())
      fail("entry point '{}' takes {} inputs, got {}", f.name, f.params.size(), n);
    if (n && !inputs) fail("entry point '{}': inputs is null", f.name);
    ordered->assign(f.params.size(), nullptr);
    for (size_t i = 0; i < n; ++i) {
      size_t slot = i;
      if (inputs[i].name) {
        slot = f.params.size();
        for (size_t p = 0; p < f.params.size(); ++p)
          if (f.params[p].name == inputs[i].name) slot = p;
        if (slot == f.params.size())
          fail("entry point '{}' has no input '{}'", f.name, inputs[i].name);
      }
      if ((*ordered)[slot]) fail("input '{}' is given twice", f.params[slot].name);
      (*ordered)[slot] = &inputs[i];
    }
    std::vector<int64_t> syms(plan.symbols.size(), -1);
    for (size_t p = 0; p < f.params.size(); ++p) {
      const auto& want = f.params[p];
      const kiln_tensor& t = *(*ordered)[p];
      const bool ok_type =
          t.dtype == abi_dtype(want.type) || (want.type == ElemType::i64 && t.dtype == KILN_I32);
      if (!ok_type)
        fail("input '{}' is {}, expected {}", want.name, kiln::dtype_name(t.dtype),
             want.type == ElemType::i64 ? "i64 or i32" : kiln::dtype_name(abi_dtype(want.type)));
      if (t.rank != static_cast<int32_t>(want.shape.size()) || t.rank < 0 || t.rank > KILN_MAX_RANK)
        fail("input '{}' has rank {}, expected {}", want.name, t.rank, want.shape.size());
      std::vector<int64_t> shape(t.shape, t.shape + t.rank);
      for (size_t d = 0; d < want.shape.size(); ++d) {
        const auto& dim = want.shape[d];
        int s = dim.single_symbol();
        if (s < 0) {
          if (shape[d] != dim.coeff)
            fail("input '{}' has shape {}: dim {} is {}, expected {}", want.name, shape_str(shape),
                 d, shape[d], dim.coeff);
          continue;
        }
        const auto& sym = plan.symbols[s];
        if (shape[d] < 1)
          fail("input '{}' has shape {}: dim {} ({}) is {}, expected at least 1", want.name,
               shape_str(shape), d, sym.name, shape[d]);
        if (shape[d] > sym.max)
          fail("input '{}' has shape {}: dim {} ({}) is {}, above its maximum {}", want.name,
               shape_str(shape), d, sym.name, shape[d], sym.max);
        if (syms[s] >= 0 && syms[s] != shape[d])
          fail("input '{}' has shape {}: dim {} ({}) is {}, but {} is {} in an earlier input",
               want.name, shape_str(shape), d, sym.name, shape[d], sym.name, syms[s]);
        syms[s] = shape[d];
      }
      const int64_t n_el = numel_of(shape);
      const uint64_t bytes = static_cast<uint64_t>(n_el) * kiln_dtype_size(t.dtype);
      if (t.capacity < bytes)
        fail("input '{}' of shape {} needs {} bytes of {}, its buffer holds {}", want.name,
             shape_str(shape), bytes, kiln::dtype_name(t.dtype), t.capacity);
      if (!t.data) fail("input '{}' has no data", want.name);
      if (t.dtype == KILN_BOOL)
        for (int64_t e = 0; e < n_el; ++e)
          if (uint8_t v = static_cast<const uint8_t*>(t.data)[e]; v > 1)
            fail("input '{}' holds {} at element {}; bool elements must be 0 or 1", want.name, v,
                 e);
    }
    for (size_t s = 0; s < syms.size(); ++s)
      if (syms[s] < 0) syms[s] = 1;  // a symbol no input of this entry point uses
    for (const auto& c : f.checks)
      if (int64_t lhs = c.lhs.eval(syms), rhs = c.rhs.eval(syms); lhs > rhs)
        fail("entry point '{}': {} ({} > {})", f.name, c.what, lhs, rhs);
    // Ids and indices, once every size they are checked against is bound.
    for (size_t p = 0; p < f.params.size(); ++p) {
      const auto& want = f.params[p];
      const kiln_tensor& t = *(*ordered)[p];
      std::vector<int64_t> shape(t.shape, t.shape + t.rank);
      const int64_t n_el = numel_of(shape);
      for (const auto& [limit_expr, what] : want.id_limits)
        for (int64_t e = 0, limit = limit_expr.eval(syms); e < n_el; ++e) {
          int64_t id = t.dtype == KILN_I64 ? static_cast<const int64_t*>(t.data)[e]
                                           : static_cast<const int32_t*>(t.data)[e];
          if (id < 0 || id >= limit) {
            std::string index;
            for (int64_t r = e, d = t.rank - 1; d >= 0; --d) {
              index = std::to_string(r % shape[d]) + (index.empty() ? "" : ",") + index;
              r /= shape[d];
            }
            fail("{} {} at '{}'[{}] is out of range [0, {})", what, id, want.name, index, limit);
          }
        }
    }
    return syms;
  }

  std::vector<int64_t> result_shape(const kiln::rt::TensorDesc& r,
                                    const std::vector<int64_t>& syms) const {
    std::vector<int64_t> s;
    for (const auto& d : r.shape) s.push_back(d.eval(syms));
    return s;
  }

  void output_shapes(const char* fname, const kiln_tensor* inputs, size_t n_in,
                     kiln_tensor* outputs, size_t n_out) {
    const FunctionDesc& f = function(fname);
    std::vector<const kiln_tensor*> ordered;
    std::vector<int64_t> syms = bind(f, inputs, n_in, &ordered);
    if (n_out != f.results.size())
      fail("entry point '{}' has {} outputs, got room for {}", f.name, f.results.size(), n_out);
    for (size_t i = 0; i < n_out; ++i) {
      std::vector<int64_t> s = result_shape(f.results[i], syms);
      outputs[i].name = f.results[i].name.c_str();
      outputs[i].dtype = abi_dtype(f.results[i].type);
      outputs[i].rank = static_cast<int32_t>(s.size());
      for (size_t d = 0; d < s.size(); ++d) outputs[i].shape[d] = s[d];
    }
  }

  // The builtin cache_write (plan.h): x (d, n) -> cache(d, n, pos), in the result buffer
  // that is the cache parameter's. Bounds were checked when binding (pos < T by its id
  // limit, N <= C by the function's checks); they are asserted again here.
  void cache_write(const kiln::rt::StepDesc& step, const std::vector<const uint8_t*>& param_data,
                   const uint8_t* arena_data, const std::vector<uint8_t*>& result_data,
                   const std::vector<int64_t>& result_bytes, const std::vector<int64_t>& syms) {
    const BufferDesc &x = step.args[0], &pos = step.args[1], &cache = step.args[2];
    KILN_ASSERT(x.storage != Storage::result && pos.storage == Storage::param &&
                    cache.storage == Storage::result && cache.byte_offset == 0,
                fmt::format("step '{}': a cache_write's buffers are misplaced", step.op));
    const int64_t d = x.extents[0].eval(syms), n = x.extents[1].eval(syms);
    const int64_t c = cache.extents[1].eval(syms), t = cache.extents[2].eval(syms);
    const int64_t at =
        *reinterpret_cast<const int64_t*>(param_data[pos.index] + pos.elem_offset.eval(syms) * 8);
    KILN_ASSERT(d == cache.extents[0].eval(syms) && n <= c && at >= 0 && at < t,
                fmt::format("step '{}': cache_write out of bounds", step.op));
    const int64_t x_row = x.strides[1].eval(syms), c_slot = cache.strides[1].eval(syms),
                  c_pos = cache.strides[2].eval(syms);
    KILN_ASSERT((at * c_pos + (c - 1) * c_slot + d) * 4 <= result_bytes[cache.index],
                fmt::format("step '{}': cache_write outside the cache", step.op));
    const uint8_t* src_base = nullptr;
    switch (x.storage) {
      case Storage::param:
        src_base = param_data[x.index];
        break;
      case Storage::arena:
        src_base = arena_data;
        break;
      default:
        fail("step '{}': a cache_write reads from unsupported storage", step.op);
    }
    const float* src =
        reinterpret_cast<const float*>(src_base + x.byte_offset) + x.elem_offset.eval(syms);
    float* dst = reinterpret_cast<float*>(result_data[cache.index]) + at * c_pos;
    for (int64_t r = 0; r < n; ++r)
      std::memcpy(dst + r * c_slot, src + r * x_row, static_cast<size_t>(d) * sizeof(float));
  }

  // `on_device`: the inputs and outputs are device tensors (kiln_model_run_device), read and
  // written in place on the device.
  void run(const char* fname, const kiln_tensor* inputs, size_t n_in, kiln_tensor* outputs,
           size_t n_out, bool on_device = false) {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point run_start = Clock::now();
    bool profile_this_run = false;
    {
      std::lock_guard<std::mutex> lock(profile_mutex);
      profile_this_run = profiling;
    }
    std::vector<Tally> kernel_tally(profile_this_run ? kernels.size() : 0);
    const FunctionDesc& f = function(fname);
    std::optional<DeviceTensors> device_in, device_out;
    if (on_device) {
      require_device(fname);
      for (const auto& step : f.steps)
        if (step.builtin == kiln::rt::Builtin::cache_write)
          fail(
              "entry point '{}' writes a cache on the host between its kernels (cache_write): "
              "run it with host tensors (kiln_model_run)",
              f.name);
      device_in.emplace(stage_device("input", inputs, n_in, /*read_values=*/true));
      device_out.emplace(stage_device("output", outputs, n_out, /*read_values=*/false));
      inputs = device_in->tensors.data();
      outputs = device_out->tensors.data();
    }
    std::vector<const kiln_tensor*> ordered;
    std::vector<int64_t> syms = bind(f, inputs, n_in, &ordered);
    if (n_out != f.results.size())
      fail("entry point '{}' has {} outputs, got {}", f.name, f.results.size(), n_out);
    // Device tensors: the caller's buffers of the parameters (in order) and results.
    std::vector<halide_buffer_t*> param_buffer, result_buffer;
    if (on_device) {
      for (const kiln_tensor* t : ordered)
        param_buffer.push_back(device_in->buffers[static_cast<size_t>(t - inputs)]);
      result_buffer = device_out->buffers;
    }

    // Inputs: ids as int64 (converted from int32 when needed).
    std::vector<std::vector<int64_t>> converted(f.params.size());
    std::vector<const uint8_t*> param_data(f.params.size());
    std::vector<int64_t> param_bytes(f.params.size());
    for (size_t p = 0; p < f.params.size(); ++p) {
      const kiln_tensor& t = *ordered[p];
      int64_t n_el = 1;
      for (int32_t d = 0; d < t.rank; ++d) n_el *= t.shape[d];
      if (t.dtype == KILN_I32) {
        converted[p].resize(n_el);
        for (int64_t e = 0; e < n_el; ++e) converted[p][e] = static_cast<const int32_t*>(t.data)[e];
        param_data[p] = reinterpret_cast<const uint8_t*>(converted[p].data());
        param_bytes[p] = n_el * 8;
      } else {
        param_data[p] = static_cast<const uint8_t*>(t.data);
        param_bytes[p] = n_el * static_cast<int64_t>(kiln_dtype_size(t.dtype));
      }
    }
    std::vector<uint8_t*> result_data(n_out);
    std::vector<int64_t> result_bytes(n_out);
    // Every output is checked before any kernel runs: a refused call writes nothing.
    if (n_out && !outputs) fail("entry point '{}': outputs is null", f.name);
    for (size_t r = 0; r < n_out; ++r) {
      const std::string& name = f.results[r].name;
      if (outputs[r].dtype != abi_dtype(f.results[r].type))
        fail("output '{}' is {}, given a buffer of {}", name,
             kiln::dtype_name(abi_dtype(f.results[r].type)), kiln::dtype_name(outputs[r].dtype));
      std::vector<int64_t> want = result_shape(f.results[r], syms);
      std::vector<int64_t> got(outputs[r].shape,
                               outputs[r].shape + std::clamp(outputs[r].rank, 0, KILN_MAX_RANK));
      if (got != want)
        fail("output '{}' has shape {}, expected {}", name, shape_str(got), shape_str(want));
      result_bytes[r] = numel_of(want) * kiln::rt::elem_size(f.results[r].type);
      if (outputs[r].capacity < static_cast<uint64_t>(result_bytes[r]))
        fail("output '{}' of shape {} needs {} bytes of {}, its buffer holds {}", name,
             shape_str(want), result_bytes[r], kiln::dtype_name(outputs[r].dtype),
             outputs[r].capacity);
      if (!outputs[r].data) fail("output '{}' has no data", name);
      result_data[r] = static_cast<uint8_t*>(outputs[r].data);
      if (const int32_t p = f.results[r].updates_param;
          p >= 0 && outputs[r].data != ordered[p]->data)
        fail("output '{}' updates input '{}' in place: pass the same buffer for both", name,
             f.params[p].name);
    }

    ArenaLease arena(*this);  // after the checks: a refused call takes no arena
    // A GPU library: the inputs are copied to the device once, the outputs get device memory
    // (a cache output its input's), and the arena its own with its first run.
    const kiln_device_ops* device = hooks.device;
    std::vector<std::unique_ptr<DeviceMirror>> param_device(device ? n_in : 0),
        result_device(device ? n_out : 0);
    std::vector<DeviceMirror*> result_mirror(device ? n_out : 0);
    auto input_what = [&](size_t p) { return fmt::format("input '{}'", f.params[p].name); };
    auto output_what = [&](size_t r) { return fmt::format("output '{}'", f.results[r].name); };
    if (device) try {
        make_resident();
        if (!arena.bytes().device)
          arena.bytes().device = std::make_unique<DeviceMirror>(*device, arena.data(),
                                                                arena.bytes().size, "the arena");
        for (size_t p = 0; p < n_in; ++p) {
          if (on_device) {
            param_device[p] =
                std::make_unique<DeviceMirror>(*device, *param_buffer[p], param_bytes[p]);
            continue;
          }
          param_device[p] = std::make_unique<DeviceMirror>(
              *device, const_cast<uint8_t*>(param_data[p]), param_bytes[p], input_what(p));
          param_device[p]->upload(input_what(p));
        }
        for (size_t r = 0; r < n_out; ++r) {
          if (const int32_t p = f.results[r].updates_param; p >= 0) {
            result_mirror[r] = param_device[static_cast<size_t>(p)].get();
            continue;
          }
          result_device[r] =
              on_device
                  ? std::make_unique<DeviceMirror>(*device, *result_buffer[r], result_bytes[r])
                  : std::make_unique<DeviceMirror>(*device, result_data[r], result_bytes[r],
                                                   output_what(r));
          result_mirror[r] = result_device[r].get();
        }
      } catch (const std::exception& e) {
        fail("entry point '{}' cannot run on the device: {}", f.name, e.what());
      }
    std::vector<halide_buffer_t> bufs;
    std::vector<std::vector<halide_dimension_t>> dims;
    std::vector<void*> args;
    for (const auto& step : f.steps) {
      if (step.builtin == kiln::rt::Builtin::cache_write) {
        if (!device) {
          cache_write(step, param_data, arena.data(), result_data, result_bytes, syms);
          continue;
        }
        // On the host, between kernels: its source row and the cache come from the device
        // and the cache goes back.
        const BufferDesc& cache = step.args[2];
        if (step.args[0].storage == Storage::arena) arena.bytes().device->download("the arena");
        result_mirror[cache.index]->download(output_what(cache.index));
        cache_write(step, param_data, arena.data(), result_data, result_bytes, syms);
        result_mirror[cache.index]->upload(output_what(cache.index));
        continue;
      }
      std::optional<DeviceViews> views;  // a GPU library's views of this call's buffers
      if (device) views.emplace(*device, view_alignment);
      const int first_output =
          device ? static_cast<int>(step.args.size()) - device->kernel_outputs[step.kernel] : 0;
      bufs.assign(step.args.size(), halide_buffer_t{});
      dims.assign(step.args.size(), {});
      args.assign(step.args.size(), nullptr);
      for (size_t a = 0; a < step.args.size(); ++a) {
        const BufferDesc& b = step.args[a];
        uint8_t* base = nullptr;
        int64_t size = 0;
        switch (b.storage) {
          case Storage::param:
            base = const_cast<uint8_t*>(param_data[b.index]);
            size = param_bytes[b.index];
            break;
          case Storage::result:
            base = result_data[b.index];
            size = result_bytes[b.index];
            break;
          case Storage::arena:
            base = arena.data();
            size = f.arena_bytes;
            break;
          case Storage::weight:
            base = weights[b.index].data.get();
            size = weights[b.index].size;
            break;
          case Storage::table:
            base = tables[b.index].data.get();
            size = tables[b.index].size;
            break;
        }
        const int64_t esize = kiln::rt::elem_size(b.type);
        int64_t first = b.byte_offset + b.elem_offset.eval(syms) * esize, last = first;
        dims[a].resize(b.extents.size());
        for (size_t d = 0; d < b.extents.size(); ++d) {
          int64_t extent = b.extents[d].eval(syms), stride = b.strides[d].eval(syms);
          if (extent < 1 || extent > INT32_MAX || stride < 0 || stride > INT32_MAX)
            fail("step '{}': buffer {} has extent {} and stride {}", step.op, a, extent, stride);
          last += (extent - 1) * stride * esize;
          dims[a][d] =
              halide_dimension_t(0, static_cast<int32_t>(extent), static_cast<int32_t>(stride));
        }
        // A wrong plan must never read or write outside its storage.
        KILN_ASSERT(first >= 0 && last + esize <= size,
                    fmt::format("step '{}': buffer {} spans bytes [{}, {}) of {}", step.op, a,
                                first, last + esize, size));
        // A device tensor has no host memory here.
        const bool caller_device =
            on_device && (b.storage == Storage::param || b.storage == Storage::result);
        halide_buffer_t& hb = bufs[a];
        hb.host = caller_device ? nullptr : base + first;
        hb.type = halide_type(b.type);
        hb.dimensions = static_cast<int32_t>(dims[a].size());
        hb.dim = dims[a].data();
        args[a] = &hb;
        if (!device) continue;
        DeviceMirror* mirror = nullptr;
        switch (b.storage) {
          case Storage::param:
            mirror = param_device[b.index].get();
            break;
          case Storage::result:
            mirror = result_mirror[b.index];
            break;
          case Storage::arena:
            mirror = arena.bytes().device.get();
            break;
          case Storage::weight:
            mirror = weights[b.index].device.get();
            break;
          case Storage::table:
            mirror = tables[b.index].device.get();
            break;
        }
        const bool host_current = (b.storage == Storage::param && !caller_device) ||
                                  b.storage == Storage::weight || b.storage == Storage::table;
        args[a] = views->attach(*mirror, first, &hb, static_cast<int>(a) >= first_output,
                                host_current, fmt::format("buffer {} of step '{}'", a, step.op));
      }
      g_kernel_error.clear();
      const Clock::time_point start = profile_this_run ? Clock::now() : Clock::time_point{};
      int status = kernels[step.kernel](args.data());
      if (status != 0)
        fail("kernel {} ({}) failed with status {}{}{}", plan.kernel_names[step.kernel], step.op,
             status, g_kernel_error.empty() ? "" : ": ", g_kernel_error);
      if (device) {
        std::vector<halide_buffer_t*> written;
        for (size_t a = static_cast<size_t>(first_output); a < args.size(); ++a)
          written.push_back(static_cast<halide_buffer_t*>(args[a]));
        views->finish(written, fmt::format("step '{}'", step.op));
      }
      if (profile_this_run) {
        Tally& t = kernel_tally[static_cast<size_t>(step.kernel)];
        t.calls += 1;
        t.seconds += std::chrono::duration<double>(Clock::now() - start).count();
      }
    }
    if (on_device) {
      // The results are on the device, newer than any host memory of the caller's buffers.
      for (halide_buffer_t* b : result_buffer) {
        b->set_host_dirty(false);
        b->set_device_dirty(true);
      }
    } else {
      for (size_t r = 0; r < result_mirror.size(); ++r) result_mirror[r]->download(output_what(r));
    }
    if (profile_this_run) {
      std::lock_guard<std::mutex> lock(profile_mutex);
      if (!profiling || kernel_time.size() != kernel_tally.size()) return;  // stopped meanwhile
      for (size_t k = 0; k < kernel_tally.size(); ++k) {
        kernel_time[k].calls += kernel_tally[k].calls;
        kernel_time[k].seconds += kernel_tally[k].seconds;
      }
      Tally& t = run_time[f.name];
      t.calls += 1;
      t.seconds += std::chrono::duration<double>(Clock::now() - run_start).count();
    }
  }
};

namespace {
// The GPU context of the Halide runtime is one per process, shared by every model of a GPU
// library: it is given back when the last such model is destroyed, not while another may be
// running on it.
std::mutex gpu_models_mutex;
int gpu_models = 0;

char* copy_error(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out) std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}
}  // namespace

extern "C" {

kiln_model* kiln_model_create(const uint8_t* plan, size_t plan_size, const kiln_kernel_fn* kernels,
                              size_t num_kernels, const kiln_hooks* hooks, const char* weights_path,
                              char** error) {
  try {
    auto m = std::make_unique<kiln_model>();
    m->plan = kiln::rt::deserialize_plan(plan, plan_size);
    // Before any kernel runs: code for a feature this CPU lacks would die with SIGILL.
    if (std::vector<std::string> missing = kiln::rt::missing_cpu_features(m->plan.target);
        !missing.empty())
      fail(
          "model '{}' was compiled for target {}, but this CPU lacks {}; compile it again "
          "with --target host on this machine (or a target without those features)",
          m->plan.model, m->plan.target, fmt::join(missing, ", "));
    if (num_kernels != m->plan.kernel_names.size())
      fail("model library has {} kernels, its plan needs {}", num_kernels,
           m->plan.kernel_names.size());
    m->kernels.assign(kernels, kernels + num_kernels);
    if (hooks) m->hooks = *hooks;
    // Halide prints kernel errors by default; kiln returns them instead.
    if (m->hooks.set_error_handler) m->hooks.set_error_handler(record_kernel_error);
    if (m->hooks.set_custom_do_par_for) m->hooks.set_custom_do_par_for(kiln_do_par_for);
    if (weights_path)
      m->load_weights(weights_path);
    else if (!m->plan.weights.empty())
      fail("no weights file given (model '{}' has {} weights)", m->plan.model,
           m->plan.weights.size());
    m->build_tables();
    for (const auto& f : m->plan.functions)
      m->arena_bytes = std::max(m->arena_bytes, f.arena_bytes);
    m->idle_arenas.emplace_back().allocate(m->arena_bytes);
    // A GPU library's weights go to the device now; where the device fails, each run tries
    // again and reports why.
    if (m->hooks.device) try {
        m->make_resident();
      } catch (const std::exception&) {
      }
    for (const auto& f : m->plan.functions) m->function_names.push_back(f.name.c_str());
    m->function_names.push_back(nullptr);
    if (m->hooks.release_device) {
      std::lock_guard<std::mutex> lock(gpu_models_mutex);
      ++gpu_models;
    }
    if (error) *error = nullptr;
    return m.release();
  } catch (const std::exception& e) {
    if (error) *error = copy_error(e.what());
    return nullptr;
  }
}

void kiln_model_destroy(kiln_model* model) {
  // A GPU library: its device allocations (weights, tables, arenas) are freed, and the
  // context given back once no GPU model is left.
  if (model && model->hooks.release_device) {
    model->drop_device();
    std::lock_guard<std::mutex> lock(gpu_models_mutex);
    if (--gpu_models == 0) model->hooks.release_device();
  }
  delete model;
}
void kiln_free_error(char* error) { std::free(error); }

int kiln_model_num_inputs(const kiln_model* model, const char* function) {
  if (!model || !function) return -1;
  for (const auto& f : model->plan.functions)
    if (f.name == function) return static_cast<int>(f.params.size());
  return -1;
}

int kiln_model_num_outputs(const kiln_model* model, const char* function) {
  if (!model || !function) return -1;
  for (const auto& f : model->plan.functions)
    if (f.name == function) return static_cast<int>(f.results.size());
  return -1;
}

const char* kiln_model_input_name(const kiln_model* model, const char* function, int index) {
  if (!model || !function) return nullptr;
  for (const auto& f : model->plan.functions)
    if (f.name == function && index >= 0 && index < static_cast<int>(f.params.size()))
      return f.params[index].name.c_str();
  return nullptr;
}

const char* const* kiln_model_functions(const kiln_model* model) {
  static const char* const none[] = {nullptr};
  return model ? model->function_names.data() : none;
}

int kiln_model_output_shapes(kiln_model* model, const char* function, const kiln_tensor* inputs,
                             size_t num_inputs, kiln_tensor* outputs, size_t num_outputs) {
  if (!model) return 1;
  try {
    if (num_outputs && !outputs)
      fail("entry point '{}': outputs is null", function ? function : "");
    model->output_shapes(function, inputs, num_inputs, outputs, num_outputs);
    model->set_error("");
    return 0;
  } catch (const std::exception& e) {
    model->set_error(e.what());
    return 1;
  }
}

int kiln_model_run(kiln_model* model, const char* function, const kiln_tensor* inputs,
                   size_t num_inputs, kiln_tensor* outputs, size_t num_outputs) {
  if (!model) return 1;
  try {
    model->run(function, inputs, num_inputs, outputs, num_outputs);
    model->set_error("");
    return 0;
  } catch (const std::exception& e) {
    model->set_error(e.what());
    return 1;
  }
}

int kiln_model_output_shapes_device(kiln_model* model, const char* function,
                                    const kiln_tensor* inputs, size_t num_inputs,
                                    kiln_tensor* outputs, size_t num_outputs) {
  if (!model) return 1;
  try {
    if (num_outputs && !outputs)
      fail("entry point '{}': outputs is null", function ? function : "");
    model->output_shapes_device(function, inputs, num_inputs, outputs, num_outputs);
    model->set_error("");
    return 0;
  } catch (const std::exception& e) {
    model->set_error(e.what());
    return 1;
  }
}

int kiln_model_run_device(kiln_model* model, const char* function, const kiln_tensor* inputs,
                          size_t num_inputs, kiln_tensor* outputs, size_t num_outputs) {
  if (!model) return 1;
  try {
    model->run(function, inputs, num_inputs, outputs, num_outputs, /*on_device=*/true);
    model->set_error("");
    return 0;
  } catch (const std::exception& e) {
    model->set_error(e.what());
    return 1;
  }
}

const struct halide_device_interface_t* kiln_model_device_interface(const kiln_model* model) {
  return model && model->hooks.device ? model->hooks.device->interface() : nullptr;
}

const char* kiln_model_config(const kiln_model* model, const char* key) {
  if (!model || !key) return nullptr;
  for (const auto& [k, v] : model->plan.config)
    if (k == key) return v.c_str();
  return nullptr;
}

int64_t kiln_model_symbol_max(const kiln_model* model, const char* symbol) {
  if (!model || !symbol) return -1;
  for (const auto& s : model->plan.symbols)
    if (s.name == symbol) return s.max;
  return -1;
}

void kiln_search_options_init(kiln_search_options* o) {
  if (!o) return;
  std::memset(o, 0, sizeof *o);
  o->beam_size = 1;
  o->num_hypotheses = 1;
  o->max_decoding_length = 64;
  o->min_decoding_length = 0;
  o->length_penalty = 0;
  o->start_id = -1;
  o->end_id = -1;
  o->sampling_top_k = 1;
  o->sampling_temperature = 1;
}

int kiln_generate(kiln_model* model, const kiln_tensor* src, const kiln_search_options* options,
                  kiln_generation* out) {
  if (!model) return 1;
  try {
    if (!src || !options || !out) fail("kiln_generate: src, options and out must not be null");
    std::memset(out, 0, sizeof *out);
    kiln::rt::Generation g = kiln::rt::generate(model, *src, *options);
    auto copy = [](const auto& v) {
      using T = typename std::decay_t<decltype(v)>::value_type;
      T* p = static_cast<T*>(std::malloc(std::max<size_t>(1, v.size() * sizeof(T))));
      if (!p) fail("out of memory returning a generation");
      if (!v.empty()) std::memcpy(p, v.data(), v.size() * sizeof(T));
      return p;
    };
    kiln_generation r{g.batch, g.hypotheses, g.max_length, nullptr, nullptr, nullptr};
    r.ids = copy(g.ids);
    r.lengths = copy(g.lengths);
    r.scores = copy(g.scores);
    *out = r;
    model->set_error("");
    return 0;
  } catch (const std::exception& e) {
    model->set_error(e.what());
    return 1;
  }
}

void kiln_generation_free(kiln_generation* g) {
  if (!g) return;
  std::free(g->ids);
  std::free(g->lengths);
  std::free(g->scores);
  g->ids = g->lengths = nullptr;
  g->scores = nullptr;
}

const char* kiln_model_error(const kiln_model* model) {
  return model ? model->error_text() : "kiln: no model (NULL)";
}

size_t kiln_dtype_size(int32_t dtype) {
  switch (dtype) {
    case KILN_F32:
      return 4;
    case KILN_I64:
      return 8;
    case KILN_I32:
      return 4;
    case KILN_BOOL:
      return 1;
  }
  return 0;
}

int kiln_do_par_for(void* user_context, kiln_par_task task, int min, int size, uint8_t* closure) {
  return kiln::rt::pool_par_for(user_context, task, min, size, closure);
}

int kiln_model_set_num_threads(kiln_model* model, int threads) {
  if (!model || !model->hooks.set_num_threads) return -1;
  threads = std::max(threads, 1);
  kiln::rt::pool_set_threads(threads);
  return model->hooks.set_num_threads(threads);
}

int kiln_model_set_profiling(kiln_model* model, int on) {
  if (!model) return -1;
  std::lock_guard<std::mutex> lock(model->profile_mutex);
  model->profiling = on != 0;
  if (model->profiling) {
    model->kernel_time.assign(model->plan.kernel_names.size(), {});
    model->run_time.clear();
  }
  return 0;
}

const char* kiln_model_profile(kiln_model* model) {
  if (!model) return "";
  thread_local std::string text;  // valid until this thread's next call of this function
  std::lock_guard<std::mutex> lock(model->profile_mutex);
  text = model->kernel_time.empty() ? "" : model->profile_report();
  return text.c_str();
}

int kiln_tensor_read(const char* path, const char* name, kiln_tensor* out, char** error) {
  try {
    if (!path || !name || !out) fail("kiln_tensor_read: null argument");
    kiln::rt::SafeTensors file = kiln::rt::SafeTensors::load(path);
    const kiln::rt::TensorInfo& t = file.at(name);
    if (t.shape.size() > KILN_MAX_RANK) fail("tensor '{}' has rank {}", name, t.shape.size());
    std::memset(out, 0, sizeof *out);
    out->rank = static_cast<int32_t>(t.shape.size());
    for (size_t d = 0; d < t.shape.size(); ++d) out->shape[d] = t.shape[d];
    if (t.dtype == kiln::rt::DType::f32) {
      std::vector<float> v = file.to_f32(t);
      out->dtype = KILN_F32;
      out->data = std::malloc(std::max<size_t>(1, v.size() * 4));
      if (out->data && !v.empty()) std::memcpy(out->data, v.data(), v.size() * 4);
    } else if (t.dtype == kiln::rt::DType::boolean || t.dtype == kiln::rt::DType::u8) {
      std::span<const uint8_t> v = file.bytes(t);
      out->dtype = KILN_BOOL;
      out->data = std::malloc(std::max<size_t>(1, v.size()));
      if (out->data && !v.empty()) std::memcpy(out->data, v.data(), v.size());
    } else {
      std::vector<int64_t> v = file.to_i64(t);
      out->dtype = KILN_I64;
      out->data = std::malloc(std::max<size_t>(1, v.size() * 8));
      if (out->data && !v.empty()) std::memcpy(out->data, v.data(), v.size() * 8);
    }
    if (!out->data) fail("out of memory reading tensor '{}'", name);
    out->capacity = static_cast<size_t>(t.numel()) * kiln_dtype_size(out->dtype);
    if (error) *error = nullptr;
    return 0;
  } catch (const std::exception& e) {
    if (error) *error = copy_error(e.what());
    return 1;
  }
}

void kiln_tensor_free(kiln_tensor* tensor) {
  if (!tensor) return;
  std::free(tensor->data);
  tensor->data = nullptr;
}

}  // extern "C"
