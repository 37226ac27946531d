// Halide pipelines for the kernels of kernels.h. Includes Halide.h: only codegen's own
// .cpp files and the kernel tests include this header.
#pragma once

#include <string>
#include <vector>

#include "Halide.h"
#include "codegen/kernels.h"

namespace kiln::codegen {

// A pipeline with its arguments in the order of kernels.h's argument lists (the output
// buffer is the pipeline's output, last).
struct KernelPipeline {
  Halide::Pipeline pipeline;
  std::vector<Halide::Argument> args;  // inputs only, in order
  // With a GPU schedule (the target has a GPU feature): the most threads and the most
  // shared-memory bytes any of its GPU kernels uses per block, checked by compile_kernel
  // against kGpuMaxThreadsPerBlock and kGpuMaxSharedBytesPerBlock. 0 threads: no GPU schedule.
  int gpu_threads = 0;
  int64_t gpu_shared_bytes = 0;
  // The pipeline prefetches into the caches (Call::prefetch, which Halide 14 emits as
  // prefetchnta, whose lines a core may keep out of L2): compile_kernel compiles it
  // through LLVM IR with each prefetch's locality raised to 3 (prefetcht0), by llc for this CPU
  // (LLVM's name: cannonlake, skylake-avx512, cooperlake). "": no prefetch. JIT-compiled (the
  // tests), the prefetches stay prefetchnta.
  std::string prefetch_llc_cpu;
};

// The threads per block of each GPU kernel launch in a lowered module (its host code's
// halide_<api>_run calls), as Halide sizes them: per thread dimension, the largest extent any
// stage of the kernel gives it, so two stages that put their threads on different dimensions
// multiply. -1 for a launch whose size has no constant bound.
std::vector<int64_t> gpu_block_threads(const Halide::Module& module);

// Each builder schedules for `target` (for the GPU when it has a GPU feature and the kind
// has a GPU schedule: linear, attention, step attention, layernorm, elementwise, reduce, softmax
// and matmul; vector width from its features: 16 lanes of f32 with avx512, 8 with avx2, 4
// otherwise) and works for any runtime extent.
KernelPipeline build_linear(const LinearKernel& spec, const Halide::Target& target);
// spec.bf16: `target` must have avx512_sapphirerapids (see bf16_target).
KernelPipeline build_linear_bf16(const LinearKernel& spec, const Halide::Target& target);
// spec.int8: the same (vpdpbusd, AVX512-VNNI).
KernelPipeline build_linear_int8(const LinearKernel& spec, const Halide::Target& target);
KernelPipeline build_attention(const AttentionKernel& spec, const Halide::Target& target);
KernelPipeline build_step_attention(const StepAttentionKernel& spec, const Halide::Target& target);
KernelPipeline build_layernorm(const LayerNormKernel& spec, const Halide::Target& target);
KernelPipeline build_elementwise(const ElementwiseKernel& spec, const Halide::Target& target);
KernelPipeline build_reduce(const ReduceKernel& spec, const Halide::Target& target);
KernelPipeline build_softmax(const SoftmaxKernel& spec, const Halide::Target& target);
KernelPipeline build_topk(const TopkKernel& spec, const Halide::Target& target);
KernelPipeline build_scatter_add(const ScatterAddKernel& spec, const Halide::Target& target);
KernelPipeline build_matmul(const MatmulKernel& spec, const Halide::Target& target);
// The builder of `spec`'s kind.
KernelPipeline build_kernel(const KernelSpec& spec, const Halide::Target& target);

// Weight panels per parallel tile when a linear runs on fewer rows than a small register
// block (a decoding step reads every weight once): 4 consecutive panels where `panels` is a
// multiple of 4 with at least 2 tiles, else 2 on the same terms, else 1. Shared by the f32
// and bf16 linear kernels.
int one_row_panels_per_tile(int64_t panels);

// The prefetch of the next weight panel (linear_kernel.cpp): on a target with Skylake's
// AVX-512 or later, a linear of a few rows runs each parallel task over
// prefetch_chunk(target, panels) consecutive panels (0: another target, or too few panels), in
// loops named nto (tasks) > nti (its panels) > mb (register block rows) > ... > ko (reduction
// steps), and prefetch_next_panels adds to `kp` the lowering pass that prefetches, from every
// reduction step, lines of the task's next panel (the buffer "wt" of `wt_type`, panels
// `panel_bytes` apart), and sets kp.prefetch_llc_cpu to the target's LLVM CPU.
int prefetch_chunk(const Halide::Target& target, int64_t panels);
void prefetch_next_panels(KernelPipeline& kp, const Halide::Target& target, int chunk,
                          int64_t panel_bytes, const Halide::Type& wt_type);

// From 64 rows on, the linear kernels' register blocks are 6 rows high; below this many rows,
// where 6 does not divide the rows, 4 (linear_kernel.cpp, schedule_packed_linear).
constexpr int kSmallBlockRows = 192;

// The schedule of the bf16 and int8 linear kernels (weights packed in panels of 64 columns
// with groups of K adjacent: acc(j, p, m) over RDom r (group member r.x, group r.y of
// `k_groups`), out(n, m) reading acc(n % 64, n / 64, m)): parallel tiles, register blocks
// of 4 vectors × up to 6 rows over the whole reduction, the group vectorized atomically (a
// dot-product instruction) where `group_atomic`, else unrolled (one FMA per member: bf16 on
// FMAs, LinearKernel::bf16_fma); specialized for few rows; `long_k` (a panel of 128 KB or more)
// chunks the rows; `rows_parallel` makes many rows parallel tiles of rows instead, each over
// every panel, and `few_rows_parallel` 16 to 63 rows two such tiles (kPanelsPerTileBytes).
// With `chunk` (prefetch_chunk's, 0: none), the chunked loops of prefetch_next_panels (which
// the caller adds) run 4 to 63 rows where no tiles of rows are parallel (whatever the reduction's
// length), and 64 to 191 rows that 6 does not divide where the reduction is short.
// Returns the chunk loop of out, where the caller computes its converted input
// (bf16 or quantized x) once per chunk, and the condition under which that loop is itself the
// parallel one (the caller's conversion then runs serially inside it; undefined: never).
struct PackedLoops {
  Halide::Var c;
  Halide::Expr per_tile;
};
// The most bytes of packed weight panels for which the bf16 and int8 linears make rows the
// parallel tiles (`rows_parallel`; with fewer than 16 panels, `few_rows_parallel` too), every
// tile running every panel: one parallel loop per call, each thread converting its own rows and
// keeping them in its L2, where tiles over the panels needed a loop of their own before them for
// the conversion (two hand-offs between the threads per call instead of one). Every thread then
// reads the whole weight. AMD Zen 5, 2 threads (bench/README.md, session 21), gemm_bench paired
// against oneDNN, alternated runs: int8 M 2048 K 512 N 512 77–89% → 88–89%, N 1024 82–92% →
// 91–93%, N 1536 88–93% → 92–94%; M 32 N 512 79–93% → 93–108%, K 2048 N 512 86–90% → 91–95%;
// bf16 M 32 N 512 94–103% → 107–113%; the model's W2 int8 (M 2048) 2–3% faster. Not taken: N
// 32000 (16 and 32 MB: int8 M 2048 105–106% → 100–101%, bf16 M 32 93–103% → 85–86%), and few
// rows with 16 panels or more: in the model, where every linear's weight comes from memory
// (W1, M 32), int8 N 1024, 1536 and 2048 took 8–15% longer per call (each thread streams the
// whole weight), while N 512 took the same.
constexpr int64_t kPanelsPerTileBytes = int64_t{4} << 20;
PackedLoops schedule_packed_linear(Halide::Func out, Halide::Func acc, const Halide::RDom& r,
                                   const Halide::Var& n, const Halide::Var& m, const Halide::Var& j,
                                   int N, int Np, int k_groups, bool long_k, bool group_atomic,
                                   bool rows_parallel = false, bool few_rows_parallel = false,
                                   int chunk = 0);
// The buffers of a linear_rows kernel (LinearKernel::rows) but its weight's: x [K, M], ids
// [R], bias [V], out [R, M] dense; estimates for M 128 and R 4096. Returns M (out's rows).
Halide::Expr constrain_rows_buffers(Halide::ImageParam& x, Halide::ImageParam& ids,
                                    Halide::ImageParam& bias, Halide::Func out, int K, int V);
// The row of W [V, ·] a linear_rows kernel on packed weights reads for column j of its block p
// of 64 columns: ids(p·64 + j). The runtime checked the ids; the clamps keep every read inside
// the buffers whatever they hold, and the columns of the last block past R.
Halide::Expr packed_row_id(const Halide::ImageParam& ids, const Halide::Var& p,
                           const Halide::Var& j, int V);
// The schedule of the linear_rows kernels on packed weights (int8, bf16): out(n, m) reads
// acc(n % 64, n / 64, m) as above, over `gathered` (the block's rows of the weight, gathered
// per tile into a strip laid out as a panel, and what else is read per column: scales, sums,
// biases; each defined over (…, j, …, p) with acc's j and p); M is out's rows. Returns the
// chunk loop of out (one chunk: the caller converts x there).
Halide::Var schedule_packed_rows(Halide::Func out, Halide::Func acc, const Halide::RDom& r,
                                 const Halide::Var& n, const Halide::Var& m, const Halide::Var& j,
                                 const Halide::Expr& M, int k_groups, bool group_atomic,
                                 const std::vector<Halide::Func>& gathered);
// Its register block alone: acc (computed at the caller's register-block loop) vectorized
// over 4 vectors of j and its rows unrolled, the reduction innermost over the group of K.
void schedule_packed_acc(Halide::Func acc, const Halide::RDom& r, const Halide::Var& j,
                         int k_groups, bool group_atomic);

// The host target with only the x86 features this CPU really has: Halide 14 reports
// avx512_sapphirerapids on AMD Zen 4/5 (it checks BF16 and VNNI only), and LLVM's
// sapphirerapids CPU may then emit AVX512-FP16 instructions that die with SIGILL there.
Halide::Target host_target();

// f32 lanes per vector for the target.
int vector_lanes(const Halide::Target& target);

// Whether an f32 is NaN, from its bits: Halide compiles float code with fast-math flags
// that let LLVM fold a floating-point NaN test to false.
Halide::Expr is_nan_bits(const Halide::Expr& x);

// max(x, 0) for f32 that keeps NaN, as the interpreter and PyTorch do (x86's max of NaN
// and 0 may be 0).
Halide::Expr relu_keeping_nan(const Halide::Expr& x);

// The f32 math function named `op` (an ir::OpKind name: relu, exp, log, sqrt, tanh, erf,
// sigmoid, gelu, gelu_tanh, silu) of x, vectorizable, within a few ulp of the
// interpreter's double evaluation where the function is well conditioned (see kernels.cpp).
Halide::Expr float_function(const std::string& op, const Halide::Expr& x);

// The bits (u16) of f32 `f` rounded to bf16 as rt::f32_to_bf16 rounds: to nearest, ties to
// even, zero and subnormals to a zero of their sign, NaN a quiet NaN (linear_bf16_kernel.cpp).
Halide::Expr round_to_bf16_bits(const Halide::Expr& f);

}  // namespace kiln::codegen
