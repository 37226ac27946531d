// The `linear` kernel: out(n, m) = act(Σ_k x(k, m) · wt(n, k) + bias(n)) as a Halide
// pipeline with a register-blocked GEMM schedule per x86 vector width. The schedule's
// shape is the best hand schedule measured with Halide 14 on the 2-core build machines
// (312–384 GFLOP/s, 90–109% of oneDNN in the same round; 32×12 and 48×8 register blocks,
// modulo-indexed packing and no-copy variants were slower): parallel outer tiles clamped
// to the matrix (unclamped tiles read negative indices on small matrices), register blocks
// of `vectors` vectors × `rows` rows kept in registers over the whole (unrolled)
// reduction, and the bias + ReLU epilogue fused into the store.
//
// The weight is read as a contiguous K × 64 strip per block column. When N is a multiple
// of 64 the runtime packs it that way once at load time (kernels.h, `panel`), and the
// kernel reads the strips in place; otherwise the kernel copies each strip out of the
// dense N × K weight per tile. Reading the dense weight in place instead is what the copy
// avoids: its rows are N floats apart, and for N = 1024 or 2048 (4 or 8 KiB) every row of
// a strip falls into the same L1 sets. Measured with gemm_bench on the model's shapes (one
// thread): packing and the 4-row blocks below lifted M = 32 from 62–82% of oneDNN to
// 89–101%, and packing lifted M = 2048 from 94–102% to 98–103%.
//
// Tried and measured slower (gemm_bench, 2 threads, both variants in one process with
// interleaved repetitions): K-blocking, i.e. a tile's accumulators kept in memory across
// chunks of Kc rows of the panel so that a chunk stays in L1 over the row blocks, ran
// 10–20% slower at M = 2048 (Kc = 128, 256) and 20% slower at M = 32 (Kc = 8) than the
// full-K register blocks here. Halide 14's `prefetch` directive cannot hide the weight
// stream of the memory-bound M = 32, N = 32000 generator either: it lowers to
// `prefetchnta` (rw 0, locality 0), which fills L1 but not L2, so the row blocks after the
// first miss the panel in L2; and for these footprints it steps by a whole panel row (256
// bytes) per cache line, prefetching one line in four. Measured 4–5× slower (one thread).
// Viewing the packed weight as 4-D (16 floats, 4, K, N/64) did not change that stepping,
// and the K-chunks of 4 rows it would need (all row blocks per chunk, so that the lines
// are used from L1) ran at 75–83% of this schedule without any prefetch. Also slower at
// M = 32 (one thread, against the 4 × 4 blocks below): register blocks of 1 vector × 16
// rows (63–68%) or 2 × 8 (78–91%), and copying each packed panel before use (78–92%).
// Single-threaded, M = 32, N = 32000 runs at about the sum of streaming its 65 MB (16 GB/s
// on one core) and its compute from L2; oneDNN is at the same rate. Nor did explicit
// prefetches help (Intel Emerald Rapids, bench/README.md "session 13"): a custom lowering pass
// putting one prefetch per 64-byte line of the panel 4–32 KB ahead of each reduction step,
// compiled through LLVM IR with the locality set to T0 or T1, left W1 and W5 in f32 unchanged
// or slower. On AMD Zen 5 (bench/README.md, "session 20"), K-blocking M = 32 with Kc = 64 or
// 128 (the accumulators of a 32 × 64 tile in memory) ran 3–8% slower with the weights in cache
// and from memory alike, and register blocks of 1 × 16, 2 × 8, 1 × 24 or 2 × 10 no faster than
// 4 × 4.
//
// What does hide that stream (session 22, AMD Zen 5): prefetching the *next* panel while the
// current one is computed, which neither of the above did (they prefetched ahead within the
// panel being read). With AVX-512, from 4 to 63 rows (a short sequence) and from 64 to 191 rows
// that 6 does not divide (a beam search's 128 hypotheses), each parallel task runs a chunk of 2 or
// 4 consecutive panels and every step of a register block's reduction prefetches two lines of the
// next one (NextPanelPrefetch, a custom lowering pass), compiled through LLVM IR so that they are
// prefetcht0 (KernelPipeline::prefetch_llc_cpu). In the model (alternated runs): W1 f32 11.8–12.6
// → 10.4–11.0 ms, W5 f32 872–913 → 852–870 ms; gemm_bench with its weights from memory, M 128
// +4–15%, M 32 up to +24% (bench/README.md, "session 22"). The bf16 and int8 kernels share the pass
// (prefetch_next_panels, schedule_packed_linear): W5 bf16 508–511 → 491–494 ms, int8 328–329 →
// 314–322, W1 bf16 6.6–7.2 → 6.1–6.4, int8 3.8–4.0 → 3.4–3.7. Since session 23 a task's last
// panel prefetches the first of the task that its thread runs next (the runtime's pool gives
// each thread a contiguous range of the tasks), so that only a thread's first panel of a call
// comes from memory unprefetched (NextPanelPrefetch).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "codegen/halide_kernels.h"
#include "support/error.h"

namespace kiln::codegen {
namespace {

using Halide::Expr;
using Halide::Func;
using Halide::RDom;
using Halide::TailStrategy;
using Halide::Var;

// Schedule parameters of one target family; adapted to the spec's N and K by
// `fit_to_shape`.
struct GemmParams {
  int lanes = 16;      // f32 lanes per vector
  int vectors = 4;     // vectors per register block along n
  int rows = 6;        // rows (m) per register block: vectors · rows accumulators
  int few_rows = 4;    // rows per register block when M < many_rows
  int many_rows = 64;  // from here on `rows`
  int tile_n = 64;     // outer tile along n (a multiple of lanes · vectors)
  int tile_m = 1024;   // largest outer tile along m
  int k_unroll = 4;    // reduction unroll factor
};

// AVX-512 has 32 vector registers: 4 × 6 = 24 accumulators, 4 loads of wt and a
// broadcast of x per k. AVX2 and SSE have 16: 2 × 6 = 12 accumulators.
// Tiles: a strip serves up to 1024 rows; measured on the model's shapes (M = 2048, 1 and
// 2 threads, strips copied), 64 × 1024 tiles ran 3–8% faster than 128 × 256 ones, and
// 64 × 2048 or 128 × 512 no faster.
// Rows: 6-row blocks compute 36 rows for M = 32; 4-row blocks fit it exactly and ran
// 1–10% faster there (packed weights, one thread), but 2–20% slower at M = 2048.
GemmParams params_for(const Halide::Target& target) {
  GemmParams p;
  p.lanes = vector_lanes(target);
  if (p.lanes < 16) p.vectors = 2;
  return p;
}

// Shrinks the vector width and block to what N allows (every split of n shifts inwards,
// so a block must fit in N) and picks a reduction unroll that divides K.
GemmParams fit_to_shape(GemmParams p, int64_t K, int64_t N, int64_t panel) {
  while (p.lanes > 1 && p.lanes > N) p.lanes /= 2;
  p.vectors = static_cast<int>(std::clamp<int64_t>(N / p.lanes, 1, p.vectors));
  const int block = p.lanes * p.vectors;
  p.tile_n = static_cast<int>(
      std::min<int64_t>(std::max(block, p.tile_n / block * block), N / block * block));
  while (p.k_unroll > 1 && K % p.k_unroll != 0) p.k_unroll /= 2;
  if (panel) {
    // A tile is one panel, so the tiles divide N and a block never straddles two panels.
    KILN_ASSERT(N % panel == 0 && panel % block == 0,
                "linear kernel: panel width must divide N and be a multiple of the register block");
    p.tile_n = static_cast<int>(panel);
  }
  return p;
}

// A register block's reduction (acc's update, computed per block): the whole reduction in
// registers, unrolled by k_unroll, the block's vectors and rows innermost.
void schedule_block_reduction(Func acc, const RDom& r, const Var& n, const Var& m,
                              const GemmParams& p) {
  Halide::RVar ko("ko"), ki("ki");
  acc.update()
      .split(r, ko, ki, p.k_unroll)
      .reorder(n, m, ki, ko)
      .vectorize(n, p.lanes)
      .unroll(n)
      .unroll(m)
      .unroll(ki);
}

// GPU schedule parameters: a block of threads_n × threads_m threads, each computing
// regs_n (n) × regs_m (m) outputs in registers over the whole reduction; with k_vec = 4 each
// thread stages its operands for 4 k at a time in registers first (x: regs_m rows of 4
// consecutive k, w: 4 rows of regs_n consecutive n), read as 16-byte loads where the
// buffers allow (x dense, K and N multiples of 4); with k_vec = 0 it reads them one float
// at a time inside the reduction.
struct GpuGemm {
  int threads_n = 16, threads_m = 8;
  int regs_n = 4, regs_m = 4;
  int k_vec = 4;
  bool legacy = false;      // the schedule before issue 30 (tail guards on n too)
  bool experiment = false;  // named by KILN_GPU_LINEAR: one schedule for every M
  int split_k = 0;          // few rows: the reduction in this many parts (0: gpu_split_k's)
};

// The schedule for few rows (M <= 64 unsplit; the parts of a split reduction up to
// kGpuSplitRows rows): g's tile as 16 × 16 threads of 4 × 2 where g is
// 16 × 8 of 4 × 4 (the default below K 2048); g itself otherwise, and for an experiment.
// Measured on an H100 (bench/README.md, "GPU mode"): at M 32, N 1536, K 512 31.3 µs against
// 50.7 (twice the warps; the reduction's latency, not the arithmetic, bounds so few rows), but
// 178.6 against 141.8 at M 2048.
GpuGemm gpu_few_rows(const GpuGemm& g) {
  if (g.experiment || g.legacy || g.threads_n != 16 || g.threads_m != 8 || g.regs_n != 4 ||
      g.regs_m != 4)
    return g;
  GpuGemm f = g;
  f.threads_m = 16;
  f.regs_m = 2;
  return f;
}

// Up to 256 rows (kGpuSplitRows) the reduction is split into S parts (split-K): S blocks of
// threads per tile of outputs, each summing K / S products of every output of its tile, and a
// second kernel summing the S partial results (in order of the parts), + bias, the activation.
// At M 32 a linear has N / 64 tiles of 64 × 32 outputs: 8 blocks for N 512, where an H100 or
// H200 has 132 multiprocessors, and each thread walks the whole reduction, so the time grew
// with K. S: the largest power of two up to 32 with at least 64 products per part and at
// most 256 blocks at M 32 (k2048_n512: 32 parts, k512_n512 to n2048: 8; the generator's 500
// tiles: none). Measured on an H200 (gpu_kernel_bench, µs per call at M 32, bench/README.md):
// unsplit 31.8–33.2 at K 512 and 116.4 at K 2048, split 15.0–15.7 and 15.5 (cuBLAS 15.4–36.5
// and 21.9); 4, 16 or 32 parts everywhere within 10% of these but 4 at K 2048 (34.5);
// splitting the generator slows it (77.0 unsplit, 88.4–148.1). W1 on the GPU: 7.47 → 1.62 ms.
constexpr int kGpuSplitRows = 256;

int gpu_split_k(const LinearKernel& spec, const GpuGemm& g, int block_n) {
  if (g.split_k > 0) return spec.K % g.split_k == 0 ? g.split_k : 1;
  const int64_t tiles = (spec.N + block_n - 1) / block_n;
  int s = 1;
  while (s < 32 && spec.K % (2 * s) == 0 && spec.K / (2 * s) >= 64 && tiles * 2 * s <= 256) s *= 2;
  return s;
}

// The schedule `build_linear_gpu` uses: the default, or the experiment named by the
// environment variable KILN_GPU_LINEAR when `kiln compile` runs (bench/CMakeLists.txt
// compiles the GPU GEMM bench's variants with it; not for production builds):
// "legacy" (16 × 4 threads of 4 × 4, scalar reads: the schedule before issue 30),
// "tn,tm,rn,rm,kv" (never split), or "split=S" (the default tiles, S parts where S divides K;
// 1: unsplit).
// Measured on an H100 (bench/gpu_kernel_bench.cpp, 12 variants on the model's 18 GEMM shapes,
// bench/README.md "GPU mode"): 16 × 8 threads of 4 × 4 outputs with 16-byte loads ran 1.2–1.8×
// faster than the legacy schedule at M = 1024 and 2048 (k512_n2048 at M 2048: 165 µs against
// 290; cuBLAS 103); for the long reduction (K = 2048) 16 × 16 threads of 4 × 2 ran fastest at
// every M (220 µs against 232 and the legacy 318 at M 2048: twice the warps to hide the
// reduction's latency). Register blocks of 8 rows or 8 columns ran 2–7× slower than 4 × 4
// (not profiled further; register pressure is the likely cause), and scalar reads of the
// same 4 × 4 blocks ran at the legacy schedule's speed.
GpuGemm gpu_gemm_for(const LinearKernel& spec) {
  GpuGemm g;
  if (spec.K >= 2048) {
    g.threads_m = 16;
    g.regs_m = 2;
  }
  if (const char* env = std::getenv("KILN_GPU_LINEAR"); env && *env) {
    if (std::string(env) == "legacy") {
      g = GpuGemm{16, 4, 4, 4, 0, true, true};
    } else if (std::string(env).rfind("split=", 0) == 0) {  // the default tiles, S parts
      g.split_k = std::atoi(env + 6);
      KILN_ASSERT(g.split_k >= 1 && g.split_k <= 256, "KILN_GPU_LINEAR=split=S: S in [1, 256]");
    } else {
      GpuGemm e;
      KILN_ASSERT(std::sscanf(env, "%d,%d,%d,%d,%d", &e.threads_n, &e.threads_m, &e.regs_n,
                              &e.regs_m, &e.k_vec) == 5 &&
                      e.threads_n >= 1 && e.threads_m >= 1 && e.regs_n >= 1 && e.regs_m >= 1 &&
                      e.threads_n * e.threads_m <= kGpuMaxThreadsPerBlock &&
                      (e.k_vec == 0 || e.k_vec == 4),
                  "KILN_GPU_LINEAR must be 'legacy', 'split=S' or 'tn,tm,rn,rm,kv' (kv 0 or 4)");
      g = e;
      g.experiment = true;
    }
  }
  if (spec.K % 4 != 0 || spec.N % 4 != 0 || g.regs_n % 4 != 0) g.k_vec = 0;
  return g;
}

// The GPU schedule (apps/cuda_mat_mul's shape in Halide's repository): blocks of
// (threads_n · regs_n) × (threads_m · regs_m) outputs, each thread's register block kept over
// the whole reduction, the bias and activation fused into the store. Rows past M and columns
// past N of a block are computed from clamped reads (the last row of x, the last column of W)
// and never stored, so any M and N work.
// Shapes: K and N are constants, M is the only run-time extent. Every buffer starts at 0;
// wt (packed in panels of P columns, or [K, N] when P is 0) and out are dense, x may have
// any row stride. Returns out's M.
Expr constrain_buffers(Halide::ImageParam& x, Halide::ImageParam& wt, Halide::ImageParam& bias,
                       Func& out, int K, int N, int P) {
  x.dim(0).set_bounds(0, K);
  x.dim(1).set_min(0);
  if (P) {
    wt.dim(0).set_bounds(0, P);
    wt.dim(1).set_bounds(0, K).set_stride(P);
    wt.dim(2).set_bounds(0, N / P).set_stride(P * K);
  } else {
    wt.dim(0).set_bounds(0, N);
    wt.dim(1).set_bounds(0, K).set_stride(N);
  }
  bias.dim(0).set_bounds(0, N);
  Halide::OutputImageParam ob = out.output_buffer();
  ob.dim(0).set_bounds(0, N);
  ob.dim(1).set_min(0).set_stride(N);
  return ob.dim(1).extent();
}

KernelPipeline build_linear_gpu(const LinearKernel& spec) {
  const int K = static_cast<int>(spec.K), N = static_cast<int>(spec.N);
  const int P = static_cast<int>(spec.panel);
  const GpuGemm g = gpu_gemm_for(spec);
  const int block_n = g.threads_n * g.regs_n;
  // N a multiple of the block: no column is clamped or guarded.
  const bool exact_n = !g.legacy && N % block_n == 0;
  Halide::ImageParam x(Halide::Float(32), 2, "x");
  Halide::ImageParam wt(Halide::Float(32), P ? 3 : 2, "wt");
  Halide::ImageParam bias(Halide::Float(32), 1, "bias");
  Var n("n"), m("m"), k("k"), u("u");
  RDom r(0, K, "r");
  Func w("w");  // W[n, k], clamped to the last column
  const Expr nc = exact_n ? Expr(n) : Halide::min(n, N - 1);
  if (P)
    w(n, k) = wt(nc % P, k, nc / P);
  else
    w(n, k) = wt(nc, k);
  Func xc("xc");  // x, clamped to the last row
  xc(k, m) = x(k, Halide::clamp(m, 0, x.dim(1).max()));
  Func acc("acc");
  acc(n, m) = 0.0f;
  acc(n, m) += xc(r, m) * w(n, r);
  // As the CPU kernel and the interpreter round: the dot product, + bias, the activation.
  auto epilogue = [&](Expr v) {
    if (spec.has_bias) v += bias(n);
    if (spec.act != "none") v = float_function(spec.act, v);
    return v;
  };
  Expr y = epilogue(acc(n, m));

  // Up to kGpuSplitRows rows: the few-rows tile (gpu_few_rows), with the reduction split into
  // `parts` (gpu_split_k): part(n, m, u) sums the products of part u, sum(n, m) the parts in
  // order. Which one runs is decided by x's rows (the same values either way but for the order
  // of the sums; x has M rows).
  const GpuGemm few = gpu_few_rows(g);
  const int parts = g.legacy || g.experiment ? 1 : gpu_split_k(spec, g, few.threads_n * few.regs_n);
  const Expr few_rows = x.dim(1).extent() <= kGpuSplitRows;
  Func part("part"), pout("pout"), sum("sum");
  RDom rc, rs;
  if (parts > 1) {
    const int chunk = K / parts;
    rc = RDom(0, chunk, "rc");
    rs = RDom(0, parts, "rs");
    part(n, m, u) = 0.0f;
    part(n, m, u) += xc(u * chunk + rc, m) * w(n, u * chunk + rc);
    pout(n, m, u) = part(n, m, u);
    sum(n, m) = 0.0f;
    sum(n, m) += pout(n, m, rs);
    y = Halide::select(few_rows, epilogue(sum(n, m)), y);
  }
  Func out("out");
  out(n, m) = y;

  constrain_buffers(x, wt, bias, out, K, N, P);

  Var ni("ni"), mi("mi"), nr("nr"), mr("mr");
  const TailStrategy n_tail = exact_n ? TailStrategy::RoundUp : TailStrategy::GuardWithIf;
  // A tile of (threads_n · regs_n) × (threads_m · regs_m) outputs per block of threads.
  auto tile = [&](Halide::Stage s, const GpuGemm& sg) {
    s.split(n, n, ni, sg.threads_n * sg.regs_n, n_tail)
        .split(m, m, mi, sg.threads_m * sg.regs_m, TailStrategy::GuardWithIf)
        .split(ni, ni, nr, sg.regs_n, n_tail)
        .split(mi, mi, mr, sg.regs_m, TailStrategy::GuardWithIf)
        .reorder(nr, mr, ni, mi, n, m)
        .gpu_threads(ni, mi)
        .unroll(nr)
        .unroll(mr);
  };
  auto schedule_out = [&](Halide::Stage s, const GpuGemm& sg) {
    tile(s, sg);
    s.gpu_blocks(n, m);
    // x dense (the usual case): its rows K apart, so the vector loads are aligned.
    if (sg.k_vec != 0) s.specialize(x.dim(1).stride() == K);
  };
  // The register block of each thread over the reduction (acc over r, part over its part).
  auto reduce = [&](Func a, Func at, const Halide::RVar& rv, const GpuGemm& sg, int regs_m) {
    a.compute_at(at, ni).bound_storage(n, sg.regs_n).bound_storage(m, regs_m).unroll(n).unroll(m);
    if (sg.k_vec == 0) {
      a.update(0).reorder(n, m, rv).unroll(n).unroll(m);
      return;
    }
    // Operands staged per k_vec steps of the reduction, in registers: x as regs_m rows of
    // k_vec consecutive k, w as k_vec rows of regs_n consecutive n, each row one vector load.
    Halide::RVar ro("ro"), ri("ri");
    a.update(0).split(rv, ro, ri, sg.k_vec).reorder(n, m, ri, ro).unroll(n).unroll(m).unroll(ri);
    Func xs = xc.in(a), ws = w.in(a);
    const Var xk = xs.args()[0], xm = xs.args()[1], wn = ws.args()[0], wk = ws.args()[1];
    xs.compute_at(a, ro)
        .store_in(Halide::MemoryType::Register)
        .bound_storage(xk, sg.k_vec)
        .bound_storage(xm, regs_m)
        .vectorize(xk)
        .unroll(xm);
    ws.compute_at(a, ro)
        .store_in(Halide::MemoryType::Register)
        .bound_storage(wn, sg.regs_n)
        .bound_storage(wk, sg.k_vec)
        .vectorize(wn, 4)
        .unroll(wk);
  };

  int threads = g.threads_n * g.threads_m;
  if (parts > 1) {
    // The parts: blocks over (tile of n, tile of m, part), each thread's registers as below.
    pout.compute_root();
    tile(pout, few);
    pout.gpu_blocks(n, m, u);
    if (few.k_vec != 0) pout.specialize(x.dim(1).stride() == K);
    // The sum: one output per thread, 64 × 4 threads, the parts' loads unrolled.
    Var no("no"), mo("mo");
    out.specialize(few_rows)
        .split(n, no, ni, 64, TailStrategy::GuardWithIf)
        .split(m, mo, mi, 4, TailStrategy::GuardWithIf)
        .reorder(ni, mi, no, mo)
        .gpu_blocks(no, mo)
        .gpu_threads(ni, mi);
    sum.compute_at(out, ni).update(0).unroll(rs.x);
    threads = std::max({threads, few.threads_n * few.threads_m, 64 * 4});
  } else if (few.threads_m != g.threads_m) {
    // Few rows, unsplit: the same 64 × 32 tile as 16 × 16 threads of 4 × 2 (gpu_few_rows),
    // twice the warps for the reduction's latency.
    schedule_out(out.specialize(out.output_buffer().dim(1).extent() <= 64), few);
    threads = std::max(threads, few.threads_n * few.threads_m);
  }
  schedule_out(out, g);
  // bound_storage: the guarded tile would otherwise be sized at run time, which puts the
  // accumulators in global memory instead of registers.
  // (acc runs g's tile, and the unsplit few-rows tile where there is one.)
  const int regs_m = parts > 1 ? g.regs_m : std::max(g.regs_m, few.regs_m);
  reduce(acc, out, r.x, g, regs_m);
  if (parts > 1) {
    reduce(part, pout, rc.x, few, few.regs_m);
    part.bound_storage(u, 1);
  }

  std::vector<Halide::Argument> args = {x, wt};
  if (spec.has_bias) args.push_back(bias);
  KernelPipeline kp{Halide::Pipeline(out), args};
  kp.gpu_threads = threads;
  return kp;
}

// The prefetch of the next weight panel (a custom lowering pass over the loops that the
// chunked schedule of build_linear names): in each task's loop over its `chunk` panels (nti),
// every step of a register block's reduction (acc's loop ko, inside the row blocks' loop mb)
// prefetches 64-byte lines of the task's next panel (two, below), spread evenly over the steps
// of all the panel's row blocks (line = step · lines / steps, in 16-bit fixed point); the last
// panel of a chunk prefetches the first of the next chunk, which the runtime's pool runs next on
// the same thread (runtime/thread_pool.h: each thread first runs a contiguous range of the
// tasks; before, with tasks claimed one at a time, it prefetched its own lines again and each
// task's first panel came from memory: `kiln run --compiled --profile` of W1 f32, AMD Zen 5, 2
// threads, 3 alternated runs, 10.2–10.6 → 9.3–9.5 ms per run, the generator's GEMM 2.43–2.46 →
// 2.22–2.26 ms). Two prefetches per step: a row block of 4 rows over K 512 has 128 steps and a
// panel 2048 lines, so at 32 rows (8 row blocks) every line is prefetched once (W1 f32 11.6 →
// 10.4–10.8 ms against one per step; four no better). A loop of them in the step with a bound
// check, or a burst of a row block's whole share at its start, ran slower than none (W5, AMD
// Zen 5).
class NextPanelPrefetch : public Halide::Internal::IRMutator {
 public:
  NextPanelPrefetch(int chunk, int64_t panel_bytes, Halide::Type wt_type)
      : chunk_(chunk), panel_(panel_bytes / wt_type.bytes()), type_(wt_type) {}

 private:
  using IRMutator::visit;
  using Stmt = Halide::Internal::Stmt;
  struct Loop {
    std::string name;
    Expr min, extent;
  };
  static bool ends_with(const std::string& s, const char* tail) {
    const size_t n = std::char_traits<char>::length(tail);
    return s.size() >= n && s.compare(s.size() - n, n, tail) == 0;
  }
  static Expr rel(const Loop& l) {
    return Halide::Internal::Variable::make(Halide::Int(32), l.name) - l.min;
  }

  Stmt visit(const Halide::Internal::For* op) override {
    using namespace Halide::Internal;
    Loop* level = nullptr;
    if (ends_with(op->name, ".nto"))
      level = &task_;
    else if (ends_with(op->name, ".nti") && !task_.name.empty())
      level = &panel_loop_;
    else if (ends_with(op->name, ".mb") && !panel_loop_.name.empty())
      level = &rows_;
    if (level) {
      *level = {op->name, op->min, op->extent};
      Stmt s = IRMutator::visit(op);
      *level = {};
      return s;
    }
    if (!ends_with(op->name, ".ko") || rows_.name.empty()) return IRMutator::visit(op);
    const Expr panel = rel(task_) * chunk_ + rel(panel_loop_);
    // The next panel, the first of the next task after a task's last (the runtime's pool runs
    // it on the same thread, thread_pool.h); the last panel of all prefetches itself.
    const Expr next = Halide::min(panel + 1, task_.extent * chunk_ - 1);
    const Loop steps{op->name, op->min, op->extent};
    constexpr int q = 2;  // prefetches per step
    const Expr step = Halide::cast<int64_t>(rel(rows_) * steps.extent + rel(steps)) * q;
    const int line_elements = 64 / type_.bytes();
    const int64_t lines = panel_ / line_elements;
    const Expr per_step =
        Expr(lines << 16) / Halide::cast<int64_t>(rows_.extent * steps.extent * q);
    Stmt body = mutate(op->body);
    for (int j = q - 1; j >= 0; --j) {
      const Expr line = Halide::cast<int32_t>(((step + j) * per_step) >> 16);
      const Expr offset =
          Halide::cast<int32_t>(Halide::cast<int64_t>(next) * Expr(panel_)) + line * line_elements;
      const Stmt prefetch = Evaluate::make(
          Call::make(type_, Call::prefetch, {Variable::make(Halide::Handle(), "wt"), offset, 1, 1},
                     Call::Intrinsic));
      body = Block::make(prefetch, body);
    }
    return For::make(op->name, op->min, op->extent, op->for_type, op->device_api, body);
  }

  int chunk_;
  int64_t panel_;  // elements of wt from one panel to the next
  Halide::Type type_;
  Loop task_, panel_loop_, rows_;
};

// LLVM's CPU for a target with the prefetching schedule, as Halide 14 picks it for the
// target's features (cooperlake rather than sapphirerapids, as for the bf16 kernels), or "" for
// a target without Skylake's AVX-512 (which keeps the schedules without prefetches).
std::string prefetch_cpu(const Halide::Target& target) {
  if (target.has_feature(Halide::Target::AVX512_SapphireRapids)) return "cooperlake";
  if (target.has_feature(Halide::Target::AVX512_Cannonlake)) return "cannonlake";
  if (target.has_feature(Halide::Target::AVX512_Skylake)) return "skylake-avx512";
  return "";
}

}  // namespace

// Panels per parallel task where a linear prefetches the next panel (see
// NextPanelPrefetch): 4 where that leaves at least 4 tasks, else 2 on the same terms, else 0 (no
// prefetch: each task one panel); 0 on a target without Skylake's AVX-512.
int prefetch_chunk(const Halide::Target& target, int64_t panels) {
  if (prefetch_cpu(target).empty()) return 0;
  for (int c : {4, 2})
    if (panels % c == 0 && panels / c >= 4) return c;
  return 0;
}

void prefetch_next_panels(KernelPipeline& kp, const Halide::Target& target, int chunk,
                          int64_t panel_bytes, const Halide::Type& wt_type) {
  kp.pipeline.add_custom_lowering_pass(new NextPanelPrefetch(chunk, panel_bytes, wt_type));
  kp.prefetch_llc_cpu = prefetch_cpu(target);
}

int one_row_panels_per_tile(int64_t panels) {
  for (int g : {4, 2})
    if (panels % g == 0 && panels >= 2 * g) return g;
  return 1;
}

Expr constrain_rows_buffers(Halide::ImageParam& x, Halide::ImageParam& ids,
                            Halide::ImageParam& bias, Func out, int K, int V) {
  const Expr R = ids.dim(0).extent();
  x.dim(0).set_bounds(0, K);
  x.dim(1).set_min(0);
  ids.dim(0).set_min(0);
  bias.dim(0).set_bounds(0, V);
  Halide::OutputImageParam ob = out.output_buffer();
  ob.dim(0).set_bounds(0, R);
  ob.dim(1).set_min(0).set_stride(R);
  x.set_estimates({{0, K}, {0, 128}});
  ids.set_estimates({{0, 4096}});
  bias.set_estimates({{0, V}});
  out.set_estimates({{0, 4096}, {0, 128}});
  return ob.dim(1).extent();
}

Expr packed_row_id(const Halide::ImageParam& ids, const Var& p, const Var& j, int V) {
  constexpr int P = 64;  // LinearKernel::panel of the packed kernels
  const Expr R = ids.dim(0).extent();
  return Halide::clamp(Halide::cast<int>(ids(Halide::min(p * P + j, R - 1))), 0, V - 1);
}

// The rows `ids` of the weight only (LinearKernel::rows, the IR's linear_rows): the f32
// kernel's register blocks and tiles, over a strip of the gathered columns that each block
// column copies out of the weight as stored, W[V, K], once per tile of rows (W5's 128 rows:
// once per step): 16 rows of W per gather instruction, each row read along K, so every cache
// line of it is used (the runtime's packed panels, 64 columns a line apart in K, would not
// do better for ids spread over the vocabulary, and W as stored is what every build maps from
// the checkpoint without a copy). The bias is read at the ids too. The number of ids R is a
// run-time extent: tiles of a whole block column while R allows, else one guarded tile.
static KernelPipeline build_linear_rows(const LinearKernel& spec, const Halide::Target& target) {
  KILN_ASSERT(spec.panel == 0 && !spec.bf16 && !spec.int8, "linear_rows reads W[V, K] in f32");
  const int K = static_cast<int>(spec.K), V = static_cast<int>(spec.N);
  const GemmParams p = fit_to_shape(params_for(target), K, V, 0);
  const int block_n = p.lanes * p.vectors;

  Halide::ImageParam x(Halide::Float(32), 2, "x");
  Halide::ImageParam w(Halide::Float(32), 2, "w");  // w(k, v) = W[v, k]
  Halide::ImageParam ids(Halide::Int(64), 1, "ids");
  Halide::ImageParam bias(Halide::Float(32), 1, "bias");
  Var n("n"), m("m"), k("k");
  RDom r(0, K, "r");

  const Expr R = ids.dim(0).extent();  // the output's columns (constrained below)
  // The weight row of output column n (the runtime checked the ids; the clamps keep every
  // read inside the buffers whatever they hold, and the guarded tile's columns past R).
  const Expr id = Halide::clamp(Halide::cast<int>(ids(Halide::min(n, R - 1))), 0, V - 1);
  Func strip("strip");
  strip(n, k) = w(k, id);
  Func acc("acc");
  acc(n, m) = 0.0f;
  acc(n, m) += x(r, m) * strip(n, r);
  Expr y = acc(n, m);  // as the interpreter rounds: the dot product, + bias, the activation
  if (spec.has_bias) y += bias(id);
  if (spec.act != "none") y = float_function(spec.act, y);
  Func out("out");
  out(n, m) = y;

  const Expr M = constrain_rows_buffers(x, ids, bias, out, K, V);
  w.dim(0).set_bounds(0, K);
  w.dim(1).set_bounds(0, V).set_stride(K);
  w.set_estimates({{0, K}, {0, V}});

  // As build_linear's loops, with tiles of one block column.
  Var nt("nt"), mt("mt"), ni("ni"), mi("mi"), nb("nb"), nv("nv"), mb("mb"), mr("mr"), t("t");
  auto schedule_out = [&](Halide::Stage s, const Expr& tile_m, int rows, TailStrategy n_tail) {
    s.split(n, nt, ni, block_n, n_tail)
        .split(m, mt, mi, tile_m, TailStrategy::ShiftInwards)
        .split(ni, nb, nv, block_n, n_tail)
        .split(mi, mb, mr, rows, TailStrategy::ShiftInwards)
        .reorder(nv, mr, mb, nb, mt, nt)
        .fuse(mt, nt, t)
        .parallel(t)
        .vectorize(nv, p.lanes)
        .unroll(nv)
        .unroll(mr);
  };
  const Expr wide = R >= block_n;
  schedule_out(out.specialize(wide && M < p.few_rows), M, 1, TailStrategy::ShiftInwards);
  schedule_out(out.specialize(wide && M < p.many_rows), M, p.few_rows, TailStrategy::ShiftInwards);
  const Expr tiles_m = (M + p.tile_m - 1) / p.tile_m;
  schedule_out(out.specialize(wide), (M + tiles_m - 1) / tiles_m, p.rows,
               TailStrategy::ShiftInwards);
  schedule_out(out, M, 1, TailStrategy::GuardWithIf);  // fewer ids than a block column

  // A whole block column of the strip and the accumulators also where the guarded tile needs
  // fewer (their loops then have a constant extent to unroll; the ids are clamped).
  strip.compute_at(out, nb).bound_extent(n, block_n).vectorize(n, p.lanes).unroll(n);
  acc.compute_at(out, mb).bound_extent(n, block_n).vectorize(n, p.lanes).unroll(n).unroll(m);
  schedule_block_reduction(acc, r, n, m, p);

  std::vector<Halide::Argument> args = {x, w, ids};
  if (spec.has_bias) args.push_back(bias);
  return KernelPipeline{Halide::Pipeline(out), args};
}

KernelPipeline build_linear(const LinearKernel& spec, const Halide::Target& target) {
  if (spec.rows) return build_linear_rows(spec, target);
  KILN_ASSERT(spec.K >= 1 && spec.N >= 1, "linear kernel needs K >= 1 and N >= 1");
  KILN_ASSERT(spec.K <= (int64_t{1} << 30) && spec.N <= (int64_t{1} << 30),
              "linear kernel dims must fit in int32");
  const int K = static_cast<int>(spec.K), N = static_cast<int>(spec.N);
  KILN_ASSERT(spec.panel >= 0 && spec.panel <= spec.N, "linear kernel: bad panel width");
  const int P = static_cast<int>(spec.panel);
  if (target.has_gpu_feature()) return build_linear_gpu(spec);
  const GemmParams p = fit_to_shape(params_for(target), K, N, P);
  const int block_n = p.lanes * p.vectors;

  Halide::ImageParam x(Halide::Float(32), 2, "x");
  Halide::ImageParam wt(Halide::Float(32), P ? 3 : 2, "wt");
  Halide::ImageParam bias(Halide::Float(32), 1, "bias");
  Var n("n"), m("m"), k("k");
  RDom r(0, K, "r");

  // The K × block_n strip of wt that a column of register blocks reads, contiguous:
  // in place when packed, else copied per tile.
  Func wt_strip("wt_strip");
  if (P)
    wt_strip(n, k) = wt(n % P, k, n / P);
  else
    wt_strip(n, k) = wt(n, k);
  // One register block's accumulators.
  Func acc("acc");
  acc(n, m) = 0.0f;
  acc(n, m) += x(r, m) * wt_strip(n, r);
  // As the interpreter rounds: the dot product, then + bias, then the activation (ReLU keeps
  // NaN, as in the interpreter).
  Expr y = acc(n, m);
  if (spec.has_bias) y += bias(n);
  if (spec.act != "none") y = float_function(spec.act, y);
  Func out("out");
  out(n, m) = y;

  const Expr M = constrain_buffers(x, wt, bias, out, K, N, P);
  x.set_estimates({{0, K}, {0, 2048}});
  if (P)
    wt.set_estimates({{0, P}, {0, K}, {0, N / P}});
  else
    wt.set_estimates({{0, N}, {0, K}});
  bias.set_estimates({{0, N}});
  out.set_estimates({{0, N}, {0, 2048}});

  // Loops of out, outermost first: t (fused tiles, parallel) > nb (block column of the
  // tile) > mb (register block row) > mr (rows, unrolled) > nv (vectors, unrolled).
  // In t the m tile varies fastest: consecutive tasks share a weight panel and differ in
  // their rows. Measured when the thread pool handed consecutive tasks to different threads
  // (gemm_bench, M = 2048, 2 threads, two runs): 92–110% of oneDNN against 88–102% with the
  // n tile varying fastest, each thread keeping its rows of x. Now that each thread runs a
  // contiguous range of the tasks (runtime/thread_pool.h), a thread runs both m tiles of its
  // panels, each panel read from memory once: gemm_bench at M 2048 (AMD Zen 5, 3 alternated
  // runs) and W2 measured the same either way.
  // Every split shifts inwards, so no block reads or writes outside the matrix as long as
  // the tile and block sizes do not exceed the extents: tile_n and block_n fit in N by
  // construction, the m tile is at most M, and the register block is `rows` ≤ the m tile.
  // With packed weights the n tiles divide N exactly (RoundUp adds no tail), so the
  // simplifier sees that each block reads inside one panel, contiguously.
  Var nt("nt"), mt("mt"), ni("ni"), mi("mi"), nb("nb"), nv("nv"), mb("mb"), mr("mr"), t("t");
  auto schedule_out = [&](Halide::Stage s, const Expr& tile_m, int rows, int tile_n) {
    s.split(n, nt, ni, tile_n, P ? TailStrategy::RoundUp : TailStrategy::ShiftInwards)
        .split(m, mt, mi, tile_m, TailStrategy::ShiftInwards)
        .split(ni, nb, nv, block_n, TailStrategy::ShiftInwards)
        .split(mi, mb, mr, rows, TailStrategy::ShiftInwards)
        .reorder(nv, mr, mb, nb, mt, nt)
        .fuse(mt, nt, t)
        .parallel(t)
        .vectorize(nv, p.lanes)
        .unroll(nv)
        .unroll(mr);
  };
  // Few rows with packed weights on AVX-512: each task runs `chunk` consecutive panels, all
  // the rows, and prefetches the next panel while it computes the current one
  // (NextPanelPrefetch). Without it a panel's first register block waits on memory for the
  // whole panel and the other blocks then run from L2: the stream and the products add up
  // instead of overlapping.
  const int chunk = P && p.lanes == 16 ? prefetch_chunk(target, N / P) : 0;
  Var nto("nto"), nti("nti");
  auto schedule_chunks = [&](Halide::Stage s) {
    s.split(n, nt, ni, P, TailStrategy::RoundUp)
        .split(nt, nto, nti, chunk, TailStrategy::RoundUp)
        .split(ni, nb, nv, block_n, TailStrategy::ShiftInwards)
        .split(m, mb, mr, p.few_rows, TailStrategy::ShiftInwards)
        .reorder(nv, mr, mb, nb, nti, nto)
        .parallel(nto)
        .vectorize(nv, p.lanes)
        .unroll(nv)
        .unroll(mr);
  };
  // Fewer rows than a small register block (e.g. one token): one row at a time.
  // Its tiles are 4 panels wide where N allows: a thread streams 4 consecutive panels
  // (512 KB at K = 512) instead of one.
  const int one_row_tile_n = P ? one_row_panels_per_tile(N / P) * P : p.tile_n;
  schedule_out(out.specialize(M < p.few_rows), M, 1, one_row_tile_n);
  // A few rows (a short sequence): one tile of them, in small register blocks.
  if (chunk)
    schedule_chunks(out.specialize(M < p.many_rows));
  else
    schedule_out(out.specialize(M < p.many_rows), M, p.few_rows, p.tile_n);
  // AVX-512, up to 191 rows that 6-row blocks do not divide (a beam search's 128 hypotheses):
  // 4-row blocks, which compute no row twice (6-row blocks shifted inwards compute 132 rows
  // for 128). gemm_bench at M 128 (AMD Zen 5, 2 threads; K512 N1536, N512, K2048 N512): 1–3%
  // faster, the weights in cache or not; W5 in the model below (schedule_packed_linear).
  if (chunk)
    schedule_chunks(out.specialize(M < kSmallBlockRows && M % p.rows != 0));
  else if (p.lanes == 16)
    schedule_out(out.specialize(M < kSmallBlockRows && M % p.rows != 0), M, p.few_rows, p.tile_n);
  // Otherwise tiles of at most tile_m rows, balanced so the last one is not mostly overlap.
  const Expr tiles_m = (M + p.tile_m - 1) / p.tile_m;
  schedule_out(out, (M + tiles_m - 1) / tiles_m, p.rows, p.tile_n);

  if (!P) wt_strip.compute_at(out, nb).vectorize(n, p.lanes).unroll(n);
  acc.compute_at(out, mb).vectorize(n, p.lanes).unroll(n).unroll(m);
  schedule_block_reduction(acc, r, n, m, p);

  std::vector<Halide::Argument> args = {x, wt};
  if (spec.has_bias) args.push_back(bias);
  KernelPipeline kp{Halide::Pipeline(out), args};
  if (chunk) prefetch_next_panels(kp, target, chunk, int64_t{4} * P * K, Halide::Float(32));
  return kp;
}

}  // namespace kiln::codegen
