// The runtime's thread pool for the kernels' parallel loops (installed into every
// library's Halide runtime at create: halide_set_custom_do_par_for).
//
// Halide's own pool puts a worker to sleep on a condition variable as soon as it finds
// no work, so every parallel loop of every kernel call starts by waking the workers
// (a futex wake, tens of µs on a VM) while the calling thread already works alone: a
// kernel of 40 µs on 2 threads lost 3–4 µs to it, oneDNN's OpenMP about 1. This pool's
// workers spin on the job counter for a while after each loop (KILN_SPIN_US, 1000 µs by
// default; 0: sleep at once) before they sleep, as OpenMP's do, so the back-to-back
// loops of a model call find them awake.
//
// Each thread of a loop runs a contiguous range of its indices first, in order (the
// caller the first range), then helps with what is left of the others', so a task knows
// which task its thread most likely runs next: the one after it. The linears that prefetch
// the next weight panel rely on it (codegen/linear_kernel.cpp, NextPanelPrefetch: the last
// panel of a task prefetches the first of the next task). The same kernels with indices
// claimed one at a time from a shared counter, then with the ranges (AMD Zen 5, 2 threads,
// alternated runs, ms): model_bench W1 f32 10.1–10.6 → 9.1–10.0, bf16 5.9–6.3 → 5.5–6.0,
// int8 3.2–3.8 → 2.8–3.5; generate_bench W5 f32 834–839 → 816–821, bf16 482–483 → 470–474,
// int8 314–317 → 303–306; W2 and W4 unchanged.
//
// One pool per process. A loop run while the pool is busy (another application thread's
// call on any model, or a loop inside a loop) runs on the calling thread alone: the
// result is the same, only slower.
#pragma once

#include <cstdint>

namespace kiln::rt {

using ParTask = int (*)(void* user_context, int index, uint8_t* closure);

// Runs task(user_context, i, closure) for every i in [min, min + size), on the calling
// thread and the pool's workers. Returns 0, or the first nonzero result of a task (the
// tasks not started by then are skipped).
int pool_par_for(void* user_context, ParTask task, int min, int size, uint8_t* closure);

// The number of threads a loop uses, the calling thread included (at least 1). Before the
// first call: HL_NUM_THREADS, else the number of CPUs.
void pool_set_threads(int threads);
int pool_threads();

}  // namespace kiln::rt
