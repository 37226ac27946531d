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
