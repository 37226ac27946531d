// The kernels' scratch memory: what a kernel allocates while it runs (the attention kernel's
// transposed keys, values and score rows, the int8 linear's quantized input, ...). A model
// library's Halide runtime calls halide_malloc and halide_free for it, once or more per
// parallel task of every call; kiln_model_create installs these two in their place
// (kiln_hooks::set_custom_malloc and set_custom_free).
//
// Why not glibc's malloc, as Halide's default does: blocks of 128 KB and more (the attention
// kernel's 256 KB per head over 1024 positions) come from mmap until glibc raises its
// threshold, and then a free that leaves a thread arena's top chunk above the trim threshold
// gives the pages back; either way the next call faults every page in again. Whether a
// process pays depends on what it allocated before: measured (`kiln run --compiled --profile`
// of the base model's encode over 1024 positions, AMD EPYC Zen 5, 2 threads), the attention
// kernel took 6.2–6.3 ms per call with glibc's defaults and 5.3 ms with its mmap and trim
// thresholds raised (GLIBC_TUNABLES), which bench/model_bench's process happened to get by
// itself. Here each thread keeps the blocks it frees (a few, bounded in bytes) and hands them
// out again, so that a model's calls reuse the same pages whatever the process did before.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln::rt {

// Halide's halide_malloc_t and halide_free_t. The block is aligned to 64 bytes and may be
// read 64 bytes before its start and past its end (Halide asks for 8). A block may be freed
// on another thread than the one that allocated it.
void* kernel_malloc(void* user_context, size_t bytes);
void kernel_free(void* user_context, void* block);

// The free function a library's runtime had before kiln installed kernel_free (what
// halide_set_custom_free returned: Halide's default). A Halide runtime is one per program
// where several libraries link it (its symbols are weak), and the program's own Halide code
// may share it: a block such code allocated before the switch and frees after it is not
// kernel_malloc's, and kernel_free passes it to this function (ignored if null or kernel_free).
using FreeFn = void (*)(void* user_context, void* block);
void set_foreign_free(FreeFn free_fn);

// What a thread keeps: at most kKeptBlocks blocks and kKeptBytes bytes; a block freed beyond
// either goes back to the system, and the kept ones when the thread ends.
constexpr int kKeptBlocks = 16;
constexpr size_t kKeptBytes = size_t{64} << 20;

// Counts over the process since it started: blocks handed out again from a thread's kept
// ones, and blocks taken from the system.
struct KernelMemoryStats {
  uint64_t reused = 0, allocated = 0;
};
KernelMemoryStats kernel_memory_stats();

}  // namespace kiln::rt
