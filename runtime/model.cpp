// Running a compiled model's entry points: a model's creation from its plan, kernels and
// weights, binding a call's inputs, and its kernel calls over one leased arena (on the host,
// or through a GPU library's device views). The state is model.h; the C ABI is c_api.cpp.
#include "runtime/model.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>

#include <fmt/format.h>

#include "runtime/bf16_products.h"
#include "runtime/binding.h"
#include "runtime/builtins.h"
#include "runtime/cpu_features.h"
#include "runtime/kernel_memory.h"
#include "runtime/thread_pool.h"
#include "support/error.h"

using kiln::fail;
using kiln::rt::ArenaPool;
using kiln::rt::BufferDesc;
using kiln::rt::DeviceMirror;
using kiln::rt::DeviceTensors;
using kiln::rt::DeviceViews;
using kiln::rt::FunctionDesc;
using kiln::rt::kernel_error;
using kiln::rt::kernel_error_suffix;
using kiln::rt::Storage;
using kiln::rt::Tally;

namespace {

halide_type_t halide_type(kiln_dtype t) {
  switch (t) {
    case KILN_F32:
      return halide_type_t(halide_type_float, 32);
    case KILN_I64:
      return halide_type_t(halide_type_int, 64);
    case KILN_BOOL:
      return halide_type_t(halide_type_uint, 8);
    case KILN_BF16:
      return halide_type_t(halide_type_bfloat, 16);
    case KILN_I8:  // int8 weights
      return halide_type_t(halide_type_int, 8);
    case KILN_I32:  // int8 weights' row sums (a caller's i32 ids are converted first)
      return halide_type_t(halide_type_int, 32);
  }
  return halide_type_t(halide_type_float, 32);
}

}  // namespace

namespace kiln::rt {

void ArenaPool::init(int64_t bytes) {
  bytes_ = bytes;
  idle_.emplace_back().allocate(bytes);
}

ArenaPool::Lease::Lease(ArenaPool& pool) : pool_(pool) {
  {
    std::lock_guard<std::mutex> lock(pool.mutex_);
    if (!pool.idle_.empty()) {
      arena_ = std::move(pool.idle_.back());
      pool.idle_.pop_back();
      return;
    }
  }
  arena_.allocate(pool.bytes_);  // every idle arena is busy: this call gets its own
}

ArenaPool::Lease::~Lease() {
  std::lock_guard<std::mutex> lock(pool_.mutex_);
  pool_.idle_.push_back(std::move(arena_));
}

void ArenaPool::drop_device() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (AlignedBytes& a : idle_) a.device.reset();
}

AlignedBytes BufferCache::take(int64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto best = idle_.end();
    for (auto it = idle_.begin(); it != idle_.end(); ++it)
      if (it->size >= bytes && it->size / 2 <= bytes &&
          (best == idle_.end() || it->size < best->size))
        best = it;
    if (best != idle_.end()) {
      AlignedBytes block = std::move(*best);
      idle_.erase(best);
      bytes_ -= block.size;
      return block;
    }
  }
  AlignedBytes block;
  block.allocate(bytes);
  return block;
}

void BufferCache::give(AlignedBytes block) noexcept {
  if (!block.data || block.size > kKeptBytes) return;
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    idle_.push_back(std::move(block));
  } catch (...) {  // no memory for the list: the block is freed instead of kept
    return;
  }
  bytes_ += idle_.back().size;
  while (bytes_ > kKeptBytes) {
    bytes_ -= idle_.front().size;
    idle_.erase(idle_.begin());
  }
}

int64_t BufferCache::kept_bytes() {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

}  // namespace kiln::rt

std::unique_ptr<kiln_model> kiln_model::create(const uint8_t* plan, size_t plan_size,
                                               const kiln_kernel_fn* kernels, size_t num_kernels,
                                               const kiln_hooks* hooks, const char* weights_path) {
  auto m = std::make_unique<kiln_model>();
  m->plan = kiln::rt::deserialize_plan(plan, plan_size);
  // Before any kernel runs: code for a feature this CPU lacks would die with SIGILL.
  if (std::vector<std::string> missing = kiln::rt::missing_cpu_features(m->plan.target);
      !missing.empty())
    fail(
        "model '{}' was compiled for target {}, but this CPU lacks {}; compile it again "
        "with --target host on this machine (or a target without those features)",
        m->plan.model, m->plan.target, fmt::join(missing, ", "));
  // A bf16 (or int8) library with both forms of its products: the one for this CPU
  // (bf16_products.h; without AVX512-BF16 an int8 library's f32 attention),
  // named in the config (kiln_model_config(model, "bf16_products")) as a library with one
  // form names its own.
  if (!m->plan.fma_functions.empty()) {
    const std::string form = kiln::rt::bf16_products_for_this_cpu();
    if (form == "fma") m->plan.functions = std::move(m->plan.fma_functions);
    m->plan.fma_functions.clear();
    for (auto& [key, value] : m->plan.config)
      if (key == "bf16_products") value = form;
  }
  if (num_kernels != m->plan.kernel_names.size())
    fail("model library has {} kernels, its plan needs {}", num_kernels,
         m->plan.kernel_names.size());
  m->kernels.assign(kernels, kernels + num_kernels);
  if (hooks) m->hooks = *hooks;
  // Halide prints kernel errors by default; kiln returns them instead.
  if (m->hooks.set_error_handler) m->hooks.set_error_handler(kiln::rt::record_kernel_error);
  if (m->hooks.set_custom_do_par_for) m->hooks.set_custom_do_par_for(kiln_do_par_for);
  // The kernels' scratch memory (kernel_memory.h): the free first, so that no block of
  // kiln_kernel_malloc ever reaches Halide's default free; blocks allocated before the switch
  // go back to the free they were made for.
  if (m->hooks.set_custom_free && m->hooks.set_custom_malloc) {
    const kiln_free_fn before = m->hooks.set_custom_free(kiln_kernel_free);
    if (before != kiln_kernel_free) kiln::rt::set_foreign_free(before);
    m->hooks.set_custom_malloc(kiln_kernel_malloc);
  }
  if (weights_path) {
    kiln::rt::LoadedWeights w = kiln::rt::load_weights(m->plan, weights_path);
    m->weight_files = std::move(w.files);
    m->weights = std::move(w.buffers);
  } else if (!m->plan.weights.empty())
    fail("no weights file given (model '{}' has {} weights)", m->plan.model,
         m->plan.weights.size());
  m->tables = kiln::rt::build_tables(m->plan);
  for (const auto& f : m->plan.functions) m->arena_bytes = std::max(m->arena_bytes, f.arena_bytes);
  m->arenas.init(m->arena_bytes);
  // A GPU library's weights go to the device now; where the device fails, each run tries
  // again and reports why.
  if (m->hooks.device) try {
      m->make_resident();
    } catch (const std::exception&) {
    }
  for (const auto& f : m->plan.functions) m->function_names.push_back(f.name.c_str());
  m->function_names.push_back(nullptr);
  for (const auto& f : m->plan.functions) {
    auto& texts = m->dim_texts.emplace_back();
    for (const auto* list : {&f.params, &f.results})
      for (const auto& t : *list) {
        auto& dims = texts.emplace_back();
        for (const auto& d : t.shape)
          dims.push_back(d.is_constant() ? "" : kiln::rt::dim_text(d, m->plan));
      }
  }
  if (m->hooks.release_device) kiln::rt::gpu_model_created();
  return m;
}

void kiln_model::release() {
  if (!hooks.release_device) return;
  drop_device();
  kiln::rt::gpu_model_destroyed(hooks.release_device);
}

const FunctionDesc& kiln_model::function(const char* name) const {
  return kiln::rt::find_function(plan, name);
}

void kiln_model::output_shapes(const char* fname, const kiln_tensor* inputs, size_t n_in,
                               kiln_tensor* outputs, size_t n_out) {
  const FunctionDesc& f = function(fname);
  std::vector<const kiln_tensor*> ordered;
  std::vector<int64_t> syms = kiln::rt::bind(plan, f, inputs, n_in, &ordered);
  kiln::rt::describe_outputs(f, syms, outputs, n_out);
}

void kiln_model::run(const char* fname, const kiln_tensor* inputs, size_t n_in,
                     kiln_tensor* outputs, size_t n_out, bool on_device) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point run_start = Clock::now();
  const bool profile_this_run = profile.on();
  std::vector<Tally> kernel_tally(profile_this_run ? kernels.size() : 0);
  std::map<std::string, kiln::rt::BuiltinTally> builtin_tally;  // by step
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
    device_in.emplace(
        kiln::rt::stage_device(*hooks.device, "input", inputs, n_in, /*read_values=*/true));
    device_out.emplace(
        kiln::rt::stage_device(*hooks.device, "output", outputs, n_out, /*read_values=*/false));
    inputs = device_in->tensors.data();
    outputs = device_out->tensors.data();
  }
  std::vector<const kiln_tensor*> ordered;
  std::vector<int64_t> syms = kiln::rt::bind(plan, f, inputs, n_in, &ordered);
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
  std::vector<uint8_t*> result_data;
  std::vector<int64_t> result_bytes;
  kiln::rt::check_outputs(f, syms, ordered, outputs, n_out, &result_data, &result_bytes);
  // No output may overlap an input or another output (in host memory, or in device
  // allocations for device tensors): kernels would read what they already overwrote.
  std::vector<uint64_t> param_origin;  // device tensors: their offsets in their allocations
  if (on_device) {
    std::vector<kiln::rt::Span> param_spans;
    for (const kiln_tensor* t : ordered) {
      param_spans.push_back(device_in->spans[static_cast<size_t>(t - inputs)]);
      param_origin.push_back(param_spans.back().begin);
    }
    kiln::rt::check_disjoint(f, param_spans, device_out->spans);
  } else {
    std::vector<kiln::rt::Span> result_spans;
    for (size_t r = 0; r < n_out; ++r) {
      const uint64_t at = reinterpret_cast<uintptr_t>(result_data[r]);
      result_spans.push_back({0, at, at + static_cast<uint64_t>(result_bytes[r])});
    }
    kiln::rt::check_disjoint(f, kiln::rt::host_spans(ordered), result_spans);
  }

  ArenaPool::Lease arena(arenas);  // after the checks: a refused call takes no arena
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
        arena.bytes().device =
            std::make_unique<DeviceMirror>(*device, arena.data(), arena.bytes().size, "the arena");
      for (size_t p = 0; p < n_in; ++p) {
        if (on_device) {
          param_device[p] = std::make_unique<DeviceMirror>(*device, *param_buffer[p],
                                                           param_bytes[p], param_origin[p]);
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
            on_device ? std::make_unique<DeviceMirror>(*device, *result_buffer[r], result_bytes[r],
                                                       device_out->spans[r].begin)
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
        kiln::rt::cache_write(step, param_data, arena.data(), result_data, result_bytes, syms);
        continue;
      }
      // On the host, between kernels: its source row and the cache come from the device
      // and the cache goes back.
      const BufferDesc& cache = step.args.back();
      if (step.args[0].storage == Storage::arena) arena.bytes().device->download("the arena");
      result_mirror[cache.index]->download(output_what(cache.index));
      kiln::rt::cache_write(step, param_data, arena.data(), result_data, result_bytes, syms);
      result_mirror[cache.index]->upload(output_what(cache.index));
      continue;
    }
    // moe_ffn runs on the host (a GPU target refuses it when compiling).
    const bool moe = step.builtin == kiln::rt::Builtin::moe_ffn;
    if (moe && device)
      fail("step '{}': moe_ffn runs on the host and this library runs on the GPU", step.op);
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
      const int64_t esize = static_cast<int64_t>(kiln_dtype_size(b.type));
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
                  fmt::format("step '{}': buffer {} spans bytes [{}, {}) of {}", step.op, a, first,
                              last + esize, size));
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
    if (moe) {
      const Clock::time_point start = profile_this_run ? Clock::now() : Clock::time_point{};
      // Its kernels, called as any step's (tallied as theirs, the builtin's time including
      // theirs).
      auto call = [&](int32_t kernel, void** kernel_args) {
        kernel_error().clear();
        const Clock::time_point t0 = profile_this_run ? Clock::now() : Clock::time_point{};
        const int status = kernels[kernel](kernel_args);
        if (status != 0)
          fail("kernel {} ({}) failed with status {}{}", plan.kernel_names[kernel], step.op, status,
               kernel_error_suffix());
        if (profile_this_run) {
          Tally& t = kernel_tally[static_cast<size_t>(kernel)];
          t.calls += 1;
          t.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
        }
      };
      const kiln::rt::MoeWork work = kiln::rt::moe_ffn(step, bufs, call);
      if (profile_this_run) {
        kiln::rt::BuiltinTally& t = builtin_tally[step.op];
        t.calls += 1;
        t.seconds += std::chrono::duration<double>(Clock::now() - start).count();
        t.experts_run += work.experts_run;
        t.expert_rows += work.expert_rows;
      }
      continue;
    }
    kernel_error().clear();
    const Clock::time_point start = profile_this_run ? Clock::now() : Clock::time_point{};
    int status = kernels[step.kernel](args.data());
    if (status != 0)
      fail("kernel {} ({}) failed with status {}{}", plan.kernel_names[step.kernel], step.op,
           status, kernel_error_suffix());
    if (device) {
      std::vector<halide_buffer_t*> written;
      for (size_t a = static_cast<size_t>(first_output); a < args.size(); ++a)
        written.push_back(static_cast<halide_buffer_t*>(args[a]));
      views->finish(written, fmt::format("step '{}'", step.op));
      // A GPU kernel call returns once the kernel is queued: profiled, each kernel's time is
      // measured up to the device's finishing it (device_sync on one of its outputs), so the
      // tallies are the kernels' own times (plus a sync's latency each) rather than launch
      // times with all the work charged to whichever later step waits.
      if (profile_this_run && !written.empty() && written[0]->device_interface) {
        kernel_error().clear();
        const int synced = written[0]->device_interface->device_sync(nullptr, written[0]);
        if (synced != 0)
          fail("step '{}': waiting for the device failed with status {}{}", step.op, synced,
               kernel_error_suffix());
      }
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
  if (profile_this_run)
    profile.add_run(f.name, kernel_tally,
                    std::chrono::duration<double>(Clock::now() - run_start).count(), builtin_tally);
}
