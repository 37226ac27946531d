// The runtime's state of a compiled model: the kiln_model behind kiln/runtime.h. Its plan,
// kernels and hooks, its weights and tables (weights.cpp loads them), the arenas its calls
// run in, its device residency (device.cpp), profiling (profile.h) and per-thread errors
// (errors.h); running an entry point is model.cpp. The C ABI over it is c_api.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/runtime.h"
#include "runtime/device.h"
#include "runtime/errors.h"
#include "runtime/mapped_file.h"
#include "runtime/plan.h"
#include "runtime/profile.h"

namespace kiln::rt {

// 64-byte aligned storage (large buffers on huge pages; see allocate_aligned), and in a GPU
// library its device mirror.
struct AlignedBytes {
  AlignedStorage data;
  int64_t size = 0;
  std::unique_ptr<DeviceMirror> device;
  void allocate(int64_t bytes) {
    size = bytes;
    data = allocate_aligned(bytes);
  }
};

// A model's weights: the buffers its kernels read, and the mapped files that some of them
// lie in (mapped_file.h), which stay mapped while the model lives.
struct LoadedWeights {
  std::vector<AlignedBytes> buffers;
  std::vector<std::shared_ptr<const MappedFile>> files;
};

// The weights of `plan` from `path` (weights.cpp), one of:
//  - a checkpoint (weights.h: a safetensors file, or shards and their index), checked against
//    the plan's sources first, every problem reported at once. The files are mapped; a weight
//    the kernels read as stored (one F32 source, not a linear weight: embeddings, norms,
//    biases) is bound to the file's pages, shared with every process mapping the file; the
//    others are concatenated, laid out for their kernels (linear weights transposed or packed,
//    bf16 and int8 converted) and F16/BF16 sources widened, in this process's memory.
//  - laid-out weights (write_laid_out_weights): every weight bound to the file's pages, so
//    processes loading one such file share all of its weights.
LoadedWeights load_weights(const Plan& plan, const std::string& path);

// Writes `weights` (the plan's, as load_weights lays them out) to `path` as laid-out weights:
//
//   "KILNWGT\0", u64 format version (1), u64 layout hash (of the plan's weights: names,
//   sources, shapes, layouts), u64 weight count, u64 file size, u64 model name length and the
//   name, then per weight u64 offset and u64 bytes; each weight's bytes at its offset, a
//   multiple of 4096 (all little-endian).
//
// load_weights refuses such a file, naming it, when its layout hash is not the plan's (written
// for another model or another --weights layout), and when it is truncated or its offsets and
// sizes do not match the plan. It holds the weights themselves: written again after the
// checkpoint changes. Written to a new file renamed over `path`, so that a process mapping the
// old file keeps reading it.
void write_laid_out_weights(const Plan& plan, const std::vector<AlignedBytes>& weights,
                            const std::string& path);
// The precomputed tables of `plan` (weights.cpp).
std::vector<AlignedBytes> build_tables(const Plan& plan);

// Arenas not in use by a call: a call leases one (or, when all are busy, gets a new one of
// `bytes`) and gives it back when it ends, so a model used from one thread allocates no
// arena per call.
class ArenaPool {
 public:
  void init(int64_t bytes);  // one idle arena of `bytes`
  // An arena held by one call, given back to the pool when the call ends.
  class Lease {
   public:
    explicit Lease(ArenaPool& pool);
    ~Lease();
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    uint8_t* data() { return arena_.data.get(); }
    AlignedBytes& bytes() { return arena_; }

   private:
    ArenaPool& pool_;
    AlignedBytes arena_;
  };
  void drop_device();  // frees the idle arenas' device memory

 private:
  int64_t bytes_ = 0;
  std::mutex mutex_;
  std::vector<AlignedBytes> idle_;  // guarded by mutex_
};

// Host buffers of kiln_generate's searches (generate.cpp: every layer's self-attention caches,
// the encoder memory, the logits), kept between calls so that the next call writes pages it
// already has. Allocated anew, W5's 145 MB (6 layers' caches for 128 hypotheses over 33
// times, the cross-attention memory, the logits) were page faults and kernel zeroing on every
// call: 6.6% of its profile (`perf record`, AMD EPYC Zen 5, 2 threads), as the kernels'
// scratch memory was before kernel_memory.h. A call takes blocks at its start and gives
// them back when it ends, so concurrent calls never share one; a generator
// (kiln_generator_*) allocates its own once and does not use this.
class BufferCache {
 public:
  // What is kept: at most this many bytes (the oldest given back go first).
  static constexpr int64_t kKeptBytes = int64_t{512} << 20;
  // A block of `bytes` (contents undefined): a kept one of at least `bytes` and at most twice
  // that (the smallest such), else a new one. Its `size` is what it was allocated with.
  AlignedBytes take(int64_t bytes);
  void give(AlignedBytes block) noexcept;  // (called from destructors: never throws)
  int64_t kept_bytes();

 private:
  std::mutex mutex_;
  std::vector<AlignedBytes> idle_;  // guarded by mutex_, oldest first
  int64_t bytes_ = 0;               // guarded by mutex_: idle_'s sizes summed
};

}  // namespace kiln::rt

// Concurrency: one model may run from any number of threads at once. What a call reads
// (the plan, weights, tables) is immutable after kiln_model_create; what it writes lives
// in an arena that the call holds alone (leased from `arenas`), in its caller's outputs,
// and in the calling thread's error text. Profiling tallies are the one shared, written
// state, behind their mutex.
struct kiln_model {
  kiln::rt::Plan plan;
  std::vector<kiln_kernel_fn> kernels;
  kiln_hooks hooks{};
  // The mapped files that weights lie in (load_weights), declared before `weights`: unmapped
  // after them.
  std::vector<std::shared_ptr<const kiln::rt::MappedFile>> weight_files;
  std::vector<kiln::rt::AlignedBytes> weights;
  std::vector<kiln::rt::AlignedBytes> tables;
  int64_t arena_bytes = 0;  // the largest entry point's arena
  std::vector<const char*> function_names;
  // kiln_model_tensor_type's dim texts (plan symbols as the IR writes them; "" for a
  // constant), per entry point, params then results, per dim; built by create.
  std::vector<std::vector<std::vector<std::string>>> dim_texts;
  kiln::rt::ArenaPool arenas;
  kiln::rt::BufferCache generation_buffers;  // kiln_generate's caches, memory, logits
  kiln::rt::ThreadErrors errors;             // kiln_model_error
  kiln::rt::Profile profile;

  // A GPU library (hooks.device set): weights and tables live on the device too, copied
  // there once, by create or, where the device failed it, by the next run; each arena gets
  // its device memory with its first run, and keeps it.
  std::mutex device_mutex;
  bool resident = false;       // guarded by device_mutex
  int64_t view_alignment = 1;  // kiln_device_ops::view_alignment, set with `resident`

  // kiln_model_create: the plan deserialized and checked against this CPU and the kernels,
  // the weights loaded, the tables built, one arena allocated and, for a GPU library, the
  // weights copied to the device (where that fails, each run tries again). Throws
  // kiln::Error.
  static std::unique_ptr<kiln_model> create(const uint8_t* plan, size_t plan_size,
                                            const kiln_kernel_fn* kernels, size_t num_kernels,
                                            const kiln_hooks* hooks, const char* weights_path);
  // kiln_model_destroy's work before the delete: a GPU library's device allocations are
  // freed, and the context given back once no GPU model is left.
  void release();

  const kiln::rt::FunctionDesc& function(const char* name) const;
  void output_shapes(const char* fname, const kiln_tensor* inputs, size_t n_in,
                     kiln_tensor* outputs, size_t n_out);
  // `on_device`: the inputs and outputs are device tensors (kiln_model_run_device), read and
  // written in place on the device.
  void run(const char* fname, const kiln_tensor* inputs, size_t n_in, kiln_tensor* outputs,
           size_t n_out, bool on_device = false);

  // device.cpp
  void make_resident();
  void drop_device();  // frees every device allocation (before the context is given back)
  void require_device(const char* fname) const;
  void output_shapes_device(const char* fname, const kiln_tensor* inputs, size_t n_in,
                            kiln_tensor* outputs, size_t n_out);
};
