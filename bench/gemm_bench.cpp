// GEMM benchmark: kiln's linear kernel (codegen/linear_kernel.cpp, compiled ahead of time for
// the host as a model's kernels are: bench_gemm_f32) against oneDNN's dnnl_sgemm on the model's
// projection shapes, same data, 2 threads each. Reports GFLOP/s (2·M·N·K per call over wall time)
// per run, and GFLOP per CPU-second of the process (robust to other processes sharing the cores, as
// long as neither library spins while waiting), and at the end a table of kiln / oneDNN per shape
// (medians over repetitions), with the largest difference between the two outputs as a
// sanity check.
//
// Besides one benchmark per library and shape, `paired/SHAPE` alternates the two in one
// loop, in blocks: each iteration times kiln over at least 20 ms of back-to-back calls and
// then oneDNN over as long (oneDNN first on odd iterations), each block after the untimed
// settling calls described at `kSettleSeconds`. Its counter `kiln/oneDNN` is the median
// over the iterations of oneDNN's time per call over kiln's in the same iteration: above
// 1, kiln is faster. The two blocks of an iteration run within 0.1 s of each other, so a
// neighbour's load on this shared machine, which moves on a scale of seconds, slows both
// alike; the libraries' separate medians, taken at different moments, carry it into their
// ratio.
//
//   [KILN_BENCH_THREADS=2] gemm_bench [--benchmark_repetitions=5
//       --benchmark_enable_random_interleaving=true] [--benchmark_filter=M2048]
//
// bf16 (issue 13; built where the host has AVX512-BF16, see bench/CMakeLists.txt): kiln's bf16
// linear kernels (codegen/linear_bf16_kernel.cpp, compiled ahead of time through LLVM IR and
// llc for cooperlake by `kiln compile --weights bf16`: bench/gemm_bf16.kir, one linear op per
// (K, N, relu), kiln_add_model bench_gemm_bf16), called directly like the f32 kernel,
// against oneDNN's bf16 matmul primitive (oneDNN 2.6 has no dnnl_gemm_bf16bf16f32): src bf16
// [M, K], weights bf16 with format_tag::any (reordered once from the same f32 Wᵀ, outside the
// timing, into the layout the primitive chose), bias f32 and ReLU as a post-op where the
// model has them, dst f32: the same computation as kiln's. kiln reads x in f32 and rounds it
// to bf16 as it reads; oneDNN gets x already in bf16 (converted once, outside the timing), as a
// bf16 network would hand it over. Both round to nearest even, so the outputs differ only in
// the order of the f32 sums. Benchmarks kiln_bf16/SHAPE, onednn_bf16/SHAPE and
// paired_bf16/SHAPE (as paired/, kiln's bf16 kernel against oneDNN's bf16 matmul); a second
// table at the end, with kiln bf16 over kiln f32. The library holds both forms of the bf16
// products (built with `--bf16-products auto`, as a bf16 model is by default): kiln_bf16fma/SHAPE
// and paired_bf16fma/SHAPE time the FMA form (`*_bf16fma`, the one a bf16 library runs on Intel
// Sapphire/Emerald Rapids without AMX: the same packed bytes read as int32 pairs, widened, on f32
// FMAs) against the same oneDNN bf16 matmul (onednn_bf16/SHAPE), in a table of its own.
//
// int8 (issue 27; built where the host has AVX512-VNNI): kiln's int8 linear kernels
// (codegen/linear_int8_kernel.cpp, vpdpbusd; the same gemm_shapes.kir compiled by `kiln compile
// --weights int8`, kiln_add_model bench_gemm_int8) against oneDNN 2.6's int8 matmul primitive
// as CTranslate2 uses it, at oneDNN's default ISA. kiln: W quantized per output row outside the
// timing (rt::lay_out_linear_weight_int8_rows, as its runtime does at load: s8, the row scales
// and row sums after it); each call reads x in f32 and quantizes every row (u8 with a zero
// point) inside its timing, sums u8 × s8 in int32, then scales, adds the bias and applies ReLU
// in f32. oneDNN: src u8 [M, K] already quantized outside the timing (one scale and zero point
// for the whole x: its output scales cannot carry a per-row input scale), weights s8 with the
// same per-row rounding as kiln's, format_tag::any, reordered once; output scales per column
// (mask 2), bias f32 with the zero point's compensation folded in (as CTranslate2 folds its u8
// shift), ReLU post-op, dst f32. So kiln does the quantization of x on top of the same product.
// Benchmarks kiln_int8/SHAPE, onednn_int8/SHAPE and paired_int8/SHAPE; a third table, with
// kiln int8 over kiln f32 and over kiln bf16, and each output's distance from kiln's f32 one.
// bf16 and int8 share the problem struct (PackedProblem), the oneDNN matmul setup, the
// benchmarks and the paired runner.
//
// The kiln kernel computes out = x·Wᵀ + bias (ReLU where the model has it) with W in the
// layout kiln's runtime loads (packed in 64-column panels for these N); dnnl_sgemm computes
// x·wt with wt = Wᵀ (K × N), row-major, no bias: the epilogue is kiln's extra work. Both
// layouts are prepared once, outside the timing, as both runtimes do at load time.
//
// Cold weights (f32 only): with KILN_BENCH_GEMM_COLD_MB=N each library gets copies of its
// weight, together at least N MB (e.g. 600, beyond the L3), and each call reads the next copy,
// so that the weight comes from memory as in a model whose layers each read their own (W1:
// 242 MB of weights per call). The operands in cache (the default) time the kernel's compute;
// cold weights time it with the stream of its weight, which at M = 32 is most of the cost.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <oneapi/dnnl/dnnl.h>
#if defined(KILN_BENCH_BF16) || defined(KILN_BENCH_INT8)
#include <oneapi/dnnl/dnnl.hpp>
#endif

#include "codegen/halide_kernels.h"
#include "codegen/kernels.h"
#include "kiln/runtime.h"
#include "runtime/plan.h"
#include "support/int8.h"
#include "tests/noise.h"

namespace {

struct GemmShape {
  int64_t M, K, N;
  bool relu;
};

// The model's linear layers: M = batch·length rows (2048 for training-size batches, 32
// for small ones), (K, N) per projection.
// The rows of each shape: 2048 (W2's and W4's projections) and 32 (W1's), or the list in
// KILN_BENCH_GEMM_M (e.g. "128" for W5's decoder steps: 32 sentences × beam 4).
std::vector<int64_t> model_rows() {
  const char* env = std::getenv("KILN_BENCH_GEMM_M");
  if (env == nullptr || *env == '\0') return {2048, 32};
  std::vector<int64_t> rows;
  for (const char* at = env; *at != '\0';) {
    char* end = nullptr;
    const long long m = std::strtoll(at, &end, 10);
    if (end == at || m < 1 || m > 2048 || (*end != ',' && *end != '\0')) {
      std::fprintf(
          stderr,
          "gemm_bench: KILN_BENCH_GEMM_M must be rows in [1, 2048] separated by commas, got '%s'\n",
          env);
      std::exit(2);
    }
    rows.push_back(m);
    at = *end == ',' ? end + 1 : end;
  }
  return rows;
}

std::vector<GemmShape> model_shapes() {
  const std::vector<std::tuple<int64_t, int64_t, bool>> kn = {
      {512, 1536, false}, {512, 512, false},  {512, 1024, false},
      {512, 2048, true},  {2048, 512, false}, {512, 32000, false}};
  std::vector<GemmShape> shapes;
  for (int64_t M : model_rows())
    for (const auto& [K, N, relu] : kn) shapes.push_back({M, K, N, relu});
  return shapes;
}

std::string shape_name(const GemmShape& s) {
  return fmt::format("M{}_K{}_N{}{}", s.M, s.K, s.N, s.relu ? "_relu" : "");
}

double flops(const GemmShape& s) { return 2.0 * s.M * s.N * s.K; }

double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Seconds per call of `call` over back-to-back calls lasting at least `seconds`; negative
// if a call failed.
template <typename Call>
double seconds_per_call(Call call, double seconds) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  int64_t calls = 0;
  double elapsed = 0;
  do {
    if (!call()) return -1;
    ++calls;
    elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  } while (elapsed < seconds);
  return elapsed / static_cast<double>(calls);
}

// Untimed calls before a library is timed after the other one ran: libgomp's workers (under
// oneDNN) spin after a parallel region, on the cores kiln's next call needs, for about
// 20 ms (GOMP_SPINCOUNT's default of 300,000 pause loops at ~140 cycles each). Measured
// without them (one library's 5 ms right after the other's): kiln at M = 32 read 64–86%
// of oneDNN with 1–3 ms of settling, 98–120% with 6–20 ms.
constexpr double kSettleSeconds = 0.03;

enum class Library { kKiln, kOneDnn, kKilnBf16, kKilnBf16Fma, kOneDnnBf16, kKilnInt8, kOneDnnInt8 };
std::optional<Library> last_library;  // the library whose calls ran last

// Runs `call` in the benchmark loop, after settling if the other library ran last, and
// sets the GFLOP/s and GFLOP/cpu-s counters.
template <typename Call>
void measure(benchmark::State& state, const GemmShape& s, Library library, const char* error,
             Call call) {
  if (last_library != library && seconds_per_call(call, kSettleSeconds) < 0) {
    state.SkipWithError(error);
    return;
  }
  last_library = library;
  const double cpu0 = process_cpu_seconds();
  for (auto _ : state) {
    if (!call()) {
      state.SkipWithError(error);
      return;
    }
  }
  const double cpu = process_cpu_seconds() - cpu0;
  const double gflop = flops(s) * 1e-9;
  state.counters["GFLOP/s"] =
      benchmark::Counter(gflop, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/cpu-s"] =
      benchmark::Counter(cpu > 0 ? gflop * static_cast<double>(state.iterations()) / cpu : 0);
}

// A float array of noise allocated as kiln's runtime allocates its weights and arena
// (rt::allocate_aligned: from 2 MiB on, 2 MiB aligned on transparent huge pages). Both
// libraries get their operands this way.
using Floats = std::unique_ptr<float[], kiln::rt::FreeDeleter>;
Floats aligned_floats(int64_t count, uint32_t seed) {
  Floats a(reinterpret_cast<float*>(
      kiln::rt::allocate_aligned(count * int64_t{sizeof(float)}).release()));
  const std::vector<float> values = kiln::testing::noise(static_cast<size_t>(count), seed);
  std::copy(values.begin(), values.end(), a.get());
  return a;
}

// kiln's f32 kernels, compiled ahead of time from bench/gemm_shapes.kir by `kiln compile` as a
// model's are (bench_gemm_f32: through llc, with the prefetches of the next weight panel that a
// JIT-compiled kernel would not raise from prefetchnta; codegen/linear_kernel.cpp): the argv form
// of each (x, wt, bias, out).
extern "C" {
int bench_gemm_f32_kiln_linear_k512_n1536_p64_argv(void** args);
int bench_gemm_f32_kiln_linear_k512_n512_p64_argv(void** args);
int bench_gemm_f32_kiln_linear_k512_n1024_p64_argv(void** args);
int bench_gemm_f32_kiln_linear_k512_n2048_relu_p64_argv(void** args);
int bench_gemm_f32_kiln_linear_k2048_n512_p64_argv(void** args);
int bench_gemm_f32_kiln_linear_k512_n32000_p64_argv(void** args);
}
using AotKernel = int (*)(void**);

// The f32 kernel of (K, N, relu); gemm_bench's shapes are all in gemm_shapes.kir.
AotKernel f32_kernel_for(const GemmShape& s) {
  using Key = std::tuple<int64_t, int64_t, bool>;
  static const std::map<Key, AotKernel> kernels = {
      {{512, 1536, false}, bench_gemm_f32_kiln_linear_k512_n1536_p64_argv},
      {{512, 512, false}, bench_gemm_f32_kiln_linear_k512_n512_p64_argv},
      {{512, 1024, false}, bench_gemm_f32_kiln_linear_k512_n1024_p64_argv},
      {{512, 2048, true}, bench_gemm_f32_kiln_linear_k512_n2048_relu_p64_argv},
      {{2048, 512, false}, bench_gemm_f32_kiln_linear_k2048_n512_p64_argv},
      {{512, 32000, false}, bench_gemm_f32_kiln_linear_k512_n32000_p64_argv},
  };
  const auto it = kernels.find({s.K, s.N, s.relu});
  if (it == kernels.end()) {
    std::fprintf(stderr, "gemm_bench: no f32 kernel for %s in bench/gemm_shapes.kir\n",
                 shape_name(s).c_str());
    std::exit(1);
  }
  return it->second;
}

// Inputs and outputs of one shape, shared by both implementations, and the kiln kernel.
struct Problem {
  GemmShape shape;
  Floats x, wt, wt_packed, bias, out_kiln, out_dnnl;
  // Cold weights (KILN_BENCH_GEMM_COLD_MB): further copies of wt and wt_packed, each call
  // reading the next, so that the copies together exceed the caches.
  std::vector<Floats> cold_wt, cold_packed;
  size_t next_cold = 0;
  halide_buffer_t x_buf{}, wt_buf{}, bias_buf{}, out_buf{};
  halide_dimension_t x_dims[2], wt_dims[3], bias_dims[1], out_dims[2];
  AotKernel kernel = nullptr;
};

halide_buffer_t make_buffer(float* data, int dims, halide_dimension_t* shape) {
  halide_buffer_t b{};
  b.host = reinterpret_cast<uint8_t*>(data);
  b.type = halide_type_t(halide_type_float, 32);
  b.dimensions = dims;
  b.dim = shape;
  return b;
}

// Problems built once per shape.
Problem& problem_for(const GemmShape& s) {
  static std::map<std::string, std::unique_ptr<Problem>> problems;
  std::unique_ptr<Problem>& p = problems[shape_name(s)];
  if (p) return *p;
  p = std::make_unique<Problem>();
  p->shape = s;
  p->x = aligned_floats(s.M * s.K, 1);
  p->wt = aligned_floats(s.K * s.N, 2);
  p->bias = aligned_floats(s.N, 3);
  p->out_kiln = aligned_floats(s.M * s.N, 4);
  p->out_dnnl = aligned_floats(s.M * s.N, 5);
  const auto i32 = [](int64_t v) { return static_cast<int32_t>(v); };
  p->x_dims[0] = {0, i32(s.K), 1};
  p->x_dims[1] = {0, i32(s.M), i32(s.K)};
  // kiln's weight in the layout its runtime loads for this N (panels, see kernels.h).
  const int64_t P = kiln::codegen::linear_panel_for(s.N);
  if (P) {
    // W[N, K] = wtᵀ, then the runtime's layout of it.
    std::vector<float> w(s.N * s.K);
    for (int64_t k = 0; k < s.K; ++k)
      for (int64_t n = 0; n < s.N; ++n) w[n * s.K + k] = p->wt[k * s.N + n];
    p->wt_packed = aligned_floats(s.K * s.N, 0);
    kiln::rt::lay_out_linear_weight(w.data(), s.N, s.K, P, p->wt_packed.get());
    p->wt_dims[0] = {0, i32(P), 1};
    p->wt_dims[1] = {0, i32(s.K), i32(P)};
    p->wt_dims[2] = {0, i32(s.N / P), i32(P * s.K)};
  } else {
    p->wt_dims[0] = {0, i32(s.N), 1};
    p->wt_dims[1] = {0, i32(s.K), i32(s.N)};
  }
  p->bias_dims[0] = {0, i32(s.N), 1};
  p->out_dims[0] = {0, i32(s.N), 1};
  p->out_dims[1] = {0, i32(s.M), i32(s.N)};
  p->x_buf = make_buffer(p->x.get(), 2, p->x_dims);
  p->wt_buf =
      P ? make_buffer(p->wt_packed.get(), 3, p->wt_dims) : make_buffer(p->wt.get(), 2, p->wt_dims);
  p->bias_buf = make_buffer(p->bias.get(), 1, p->bias_dims);
  p->out_buf = make_buffer(p->out_kiln.get(), 2, p->out_dims);
  p->kernel = f32_kernel_for(s);
  if (const char* cold = std::getenv("KILN_BENCH_GEMM_COLD_MB"); cold && *cold) {
    const double bytes = static_cast<double>(s.K * s.N * sizeof(float));
    const int copies = std::max(1, static_cast<int>(std::atof(cold) * 1e6 / bytes));
    // Copies of the operands already made (not noise that the copy would overwrite).
    auto copy_of = [&](const Floats& from) {
      Floats to(reinterpret_cast<float*>(
          kiln::rt::allocate_aligned(s.K * s.N * int64_t{sizeof(float)}).release()));
      std::copy(from.get(), from.get() + s.K * s.N, to.get());
      return to;
    };
    for (int c = 0; c < copies; ++c) {
      p->cold_wt.push_back(copy_of(p->wt));
      if (P) p->cold_packed.push_back(copy_of(p->wt_packed));
    }
  }
  return *p;
}

int run_kiln(Problem& p) {
  if (!p.cold_packed.empty())
    p.wt_buf.host =
        reinterpret_cast<uint8_t*>(p.cold_packed[p.next_cold++ % p.cold_packed.size()].get());
  void* argv[] = {&p.x_buf, &p.wt_buf, &p.bias_buf, &p.out_buf};
  return p.kernel(argv);
}

dnnl_status_t run_dnnl(Problem& p) {
  const GemmShape& s = p.shape;
  const float* wt =
      p.cold_wt.empty() ? p.wt.get() : p.cold_wt[p.next_cold++ % p.cold_wt.size()].get();
  return dnnl_sgemm('N', 'N', s.M, s.N, s.K, 1.0f, p.x.get(), s.K, wt, s.N, 0.0f, p.out_dnnl.get(),
                    s.N);
}

#if defined(KILN_BENCH_BF16) || defined(KILN_BENCH_INT8)
// kiln's kernels with packed weights, compiled ahead of time from bench/gemm_shapes.kir (one
// library per weight type): the argv form of each, named as `kiln compile` names them (the
// library's name, then codegen's kernel_name()). bf16: x, wt, bias, out; int8: x, wt, wscale,
// wsum, bias, out.
extern "C" {
#ifdef KILN_BENCH_BF16
int bench_gemm_bf16_kiln_linear_k512_n1536_p64_bf16_argv(void** args);
int bench_gemm_bf16_kiln_linear_k512_n512_p64_bf16_argv(void** args);
int bench_gemm_bf16_kiln_linear_k512_n1024_p64_bf16_argv(void** args);
int bench_gemm_bf16_kiln_linear_k512_n2048_relu_p64_bf16_argv(void** args);
int bench_gemm_bf16_kiln_linear_k2048_n512_p64_bf16_argv(void** args);
int bench_gemm_bf16_kiln_linear_k512_n32000_p64_bf16_argv(void** args);
int bench_gemm_bf16_kiln_linear_k512_n1536_p64_bf16fma_argv(void** args);
int bench_gemm_bf16_kiln_linear_k512_n512_p64_bf16fma_argv(void** args);
int bench_gemm_bf16_kiln_linear_k512_n1024_p64_bf16fma_argv(void** args);
int bench_gemm_bf16_kiln_linear_k512_n2048_relu_p64_bf16fma_argv(void** args);
int bench_gemm_bf16_kiln_linear_k2048_n512_p64_bf16fma_argv(void** args);
int bench_gemm_bf16_kiln_linear_k512_n32000_p64_bf16fma_argv(void** args);
#endif
#ifdef KILN_BENCH_INT8
int bench_gemm_int8_kiln_linear_k512_n1536_p64_int8_argv(void** args);
int bench_gemm_int8_kiln_linear_k512_n512_p64_int8_argv(void** args);
int bench_gemm_int8_kiln_linear_k512_n1024_p64_int8_argv(void** args);
int bench_gemm_int8_kiln_linear_k512_n2048_relu_p64_int8_argv(void** args);
int bench_gemm_int8_kiln_linear_k2048_n512_p64_int8_argv(void** args);
int bench_gemm_int8_kiln_linear_k512_n32000_p64_int8_argv(void** args);
#endif
}

// The weight types compared against oneDNN's matmul primitive: bf16 in both forms of its
// products (vdpbf16ps, and f32 FMAs on the widened weights, `--bf16-products`: the library is
// built with both, as `auto` builds it), each against oneDNN's bf16 matmul; int8.
enum class Packed { kBf16, kBf16Fma, kInt8 };
const char* packed_name(Packed t) {
  return t == Packed::kBf16 ? "bf16" : t == Packed::kBf16Fma ? "bf16fma" : "int8";
}
Library kiln_library(Packed t) {
  return t == Packed::kBf16      ? Library::kKilnBf16
         : t == Packed::kBf16Fma ? Library::kKilnBf16Fma
                                 : Library::kKilnInt8;
}
Library dnnl_library(Packed t) {
  return t == Packed::kInt8 ? Library::kOneDnnInt8 : Library::kOneDnnBf16;
}

AotKernel aot_kernel_for(const GemmShape& s, Packed t) {
  using Key = std::tuple<int64_t, int64_t, bool, Packed>;
  const std::map<Key, AotKernel> kernels = {
#ifdef KILN_BENCH_BF16
      {{512, 1536, false, Packed::kBf16}, bench_gemm_bf16_kiln_linear_k512_n1536_p64_bf16_argv},
      {{512, 512, false, Packed::kBf16}, bench_gemm_bf16_kiln_linear_k512_n512_p64_bf16_argv},
      {{512, 1024, false, Packed::kBf16}, bench_gemm_bf16_kiln_linear_k512_n1024_p64_bf16_argv},
      {{512, 2048, true, Packed::kBf16}, bench_gemm_bf16_kiln_linear_k512_n2048_relu_p64_bf16_argv},
      {{2048, 512, false, Packed::kBf16}, bench_gemm_bf16_kiln_linear_k2048_n512_p64_bf16_argv},
      {{512, 32000, false, Packed::kBf16}, bench_gemm_bf16_kiln_linear_k512_n32000_p64_bf16_argv},
      {{512, 1536, false, Packed::kBf16Fma},
       bench_gemm_bf16_kiln_linear_k512_n1536_p64_bf16fma_argv},
      {{512, 512, false, Packed::kBf16Fma}, bench_gemm_bf16_kiln_linear_k512_n512_p64_bf16fma_argv},
      {{512, 1024, false, Packed::kBf16Fma},
       bench_gemm_bf16_kiln_linear_k512_n1024_p64_bf16fma_argv},
      {{512, 2048, true, Packed::kBf16Fma},
       bench_gemm_bf16_kiln_linear_k512_n2048_relu_p64_bf16fma_argv},
      {{2048, 512, false, Packed::kBf16Fma},
       bench_gemm_bf16_kiln_linear_k2048_n512_p64_bf16fma_argv},
      {{512, 32000, false, Packed::kBf16Fma},
       bench_gemm_bf16_kiln_linear_k512_n32000_p64_bf16fma_argv},
#endif
#ifdef KILN_BENCH_INT8
      {{512, 1536, false, Packed::kInt8}, bench_gemm_int8_kiln_linear_k512_n1536_p64_int8_argv},
      {{512, 512, false, Packed::kInt8}, bench_gemm_int8_kiln_linear_k512_n512_p64_int8_argv},
      {{512, 1024, false, Packed::kInt8}, bench_gemm_int8_kiln_linear_k512_n1024_p64_int8_argv},
      {{512, 2048, true, Packed::kInt8}, bench_gemm_int8_kiln_linear_k512_n2048_relu_p64_int8_argv},
      {{2048, 512, false, Packed::kInt8}, bench_gemm_int8_kiln_linear_k2048_n512_p64_int8_argv},
      {{512, 32000, false, Packed::kInt8}, bench_gemm_int8_kiln_linear_k512_n32000_p64_int8_argv},
#endif
  };
  auto it = kernels.find({s.K, s.N, s.relu, t});
  return it == kernels.end() ? nullptr : it->second;
}

using Bytes = std::unique_ptr<uint8_t[], kiln::rt::FreeDeleter>;
Bytes aligned_bytes(int64_t bytes) {
  auto p = kiln::rt::allocate_aligned(bytes);
  std::memset(p.get(), 0, static_cast<size_t>(bytes));
  return Bytes(reinterpret_cast<uint8_t*>(p.release()));
}

halide_buffer_t make_buffer_1d(void* data, halide_type_t type, halide_dimension_t* dim) {
  halide_buffer_t b{};
  b.host = static_cast<uint8_t*>(data);
  b.type = type;
  b.dimensions = 1;
  b.dim = dim;
  return b;
}

// One shape of a packed weight type (x, W and bias are the f32 problem's) and both
// libraries' prepared forms: kiln's weight packed as its runtime packs it at load (bf16:
// rt::lay_out_linear_weight_bf16_rows, [Np/64, Kp/2, 64, 2]; int8:
// rt::lay_out_linear_weight_int8_rows, [Np/64, Kp/4, 64, 4] then the row scales and row sums)
// and the kernel's argv over it; oneDNN's matmul primitive with its operands prepared
// (weights reordered into the layout it chose). What bf16 and int8 share: running either
// library, the benchmarks, the paired runner and the table.
struct PackedProblem {
  GemmShape shape;
  Packed type = Packed::kBf16;
  Problem* f32 = nullptr;
  AotKernel kernel = nullptr;
  Bytes wt_packed, x_dnnl, wt_dnnl, bias_dnnl;
  Floats out_kiln, out_dnnl;
  halide_buffer_t wt_buf{}, wscale_buf{}, wsum_buf{}, out_buf{};
  halide_dimension_t wt_dims[4], wscale_dims[1], wsum_dims[1], out_dims[2];
  std::vector<void*> argv;  // the kernel's arguments
  dnnl::engine engine;
  dnnl::stream stream;
  dnnl::matmul matmul;
  std::unordered_map<int, dnnl::memory> args;
  std::string error;  // why it cannot run, or ""
};

// W[N, K] = wtᵀ of the f32 problem (the IR's weight, as the runtime reads it from a checkpoint).
std::vector<float> weight_rows(const Problem& f32) {
  const GemmShape& s = f32.shape;
  std::vector<float> w(static_cast<size_t>(s.N * s.K));
  for (int64_t k = 0; k < s.K; ++k)
    for (int64_t n = 0; n < s.N; ++n) w[n * s.K + k] = f32.wt[k * s.N + n];
  return w;
}

// oneDNN's matmul for `p` (src_md: x as oneDNN gets it; the weights' data type, any layout;
// bias f32 [1, N], ReLU where the model has it, dst f32), weights reordered from `wt_src`
// ([K, N] row-major, of the weights' type) into its layout, and the arguments.
void make_dnnl_matmul(PackedProblem& p, const dnnl::memory::desc& src_md,
                      dnnl::memory::data_type wei_type, const void* wt_src,
                      const dnnl::primitive_attr& attr_in, const float* bias) {
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  const GemmShape& s = p.shape;
  const dnnl::memory::desc wei_any({s.K, s.N}, wei_type, tag::any);
  const dnnl::memory::desc bias_md({1, s.N}, dt::f32, tag::ab);
  const dnnl::memory::desc dst_md({s.M, s.N}, dt::f32, tag::ab);
  dnnl::post_ops ops;
  if (s.relu) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  dnnl::primitive_attr attr = attr_in;
  attr.set_post_ops(ops);
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, wei_any, bias_md, dst_md), attr,
                                        p.engine);
  p.matmul = dnnl::matmul(pd);
  p.wt_dnnl = aligned_bytes(static_cast<int64_t>(pd.weights_desc().get_size()));
  dnnl::memory wt_plain({{s.K, s.N}, wei_type, tag::ab}, p.engine, const_cast<void*>(wt_src));
  dnnl::memory wei(pd.weights_desc(), p.engine, p.wt_dnnl.get());
  dnnl::reorder(wt_plain, wei).execute(p.stream, wt_plain, wei);
  p.stream.wait();
  p.args = {{DNNL_ARG_SRC, dnnl::memory(src_md, p.engine, p.x_dnnl.get())},
            {DNNL_ARG_WEIGHTS, wei},
            {DNNL_ARG_BIAS, dnnl::memory(bias_md, p.engine, const_cast<float*>(bias))},
            {DNNL_ARG_DST, dnnl::memory(dst_md, p.engine, p.out_dnnl.get())}};
}

// kiln's bf16 weight and oneDNN's bf16 matmul: x and Wᵀ converted to bf16 by oneDNN's reorders
// (round to nearest even), outside the timing.
void prepare_bf16(PackedProblem& p) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  const GemmShape& s = p.shape;
  const int64_t P = 64, Kp = s.K + s.K % 2, Np = (s.N + P - 1) / P * P;
  const std::vector<float> w = weight_rows(*p.f32);
  p.wt_packed = aligned_bytes(Np * Kp * 2);
  kiln::rt::lay_out_linear_weight_bf16_rows(reinterpret_cast<const uint8_t*>(w.data()), 0, s.N, s.N,
                                            s.K, reinterpret_cast<uint16_t*>(p.wt_packed.get()));
  const auto i32 = [](int64_t v) { return static_cast<int32_t>(v); };
  p.wt_dims[0] = {0, 2, 1};
  p.wt_dims[1] = {0, i32(P), 2};
  p.wt_dims[2] = {0, i32(Kp / 2), i32(2 * P)};
  p.wt_dims[3] = {0, i32(Np / P), i32(P * Kp)};
  p.wt_buf.host = p.wt_packed.get();
  p.wt_buf.type = halide_type_t(halide_type_bfloat, 16);
  p.wt_buf.dimensions = 4;
  p.wt_buf.dim = p.wt_dims;
  if (p.type == Packed::kBf16Fma) {
    // The same bytes as each pair of bf16 in an int32: [Np/64, Kp/2, 64]
    // (codegen/lower/linear.cpp).
    p.wt_dims[0] = {0, i32(P), 1};
    p.wt_dims[1] = {0, i32(Kp / 2), i32(P)};
    p.wt_dims[2] = {0, i32(Np / P), i32(P * Kp / 2)};
    p.wt_buf.type = halide_type_t(halide_type_int, 32);
    p.wt_buf.dimensions = 3;
  }
  p.argv = {&p.f32->x_buf, &p.wt_buf, &p.f32->bias_buf, &p.out_buf};

  const dnnl::memory::desc src_md({s.M, s.K}, dt::bf16, tag::ab);
  p.x_dnnl = aligned_bytes(s.M * s.K * 2);
  dnnl::memory x_f32({{s.M, s.K}, dt::f32, tag::ab}, p.engine, p.f32->x.get());
  dnnl::memory src(src_md, p.engine, p.x_dnnl.get());
  dnnl::reorder(x_f32, src).execute(p.stream, x_f32, src);
  // Wᵀ in bf16 ([K, N], the primitive's logical weights), then into its layout.
  std::vector<uint16_t> wt_bf16(static_cast<size_t>(s.K * s.N));
  {
    dnnl::memory wt_f32({{s.K, s.N}, dt::f32, tag::ab}, p.engine, p.f32->wt.get());
    dnnl::memory wt_b({{s.K, s.N}, dt::bf16, tag::ab}, p.engine, wt_bf16.data());
    dnnl::reorder(wt_f32, wt_b).execute(p.stream, wt_f32, wt_b);
    p.stream.wait();
  }
  make_dnnl_matmul(p, src_md, dt::bf16, wt_bf16.data(), dnnl::primitive_attr(), p.f32->bias.get());
}

// kiln's int8 weight (each row of W quantized at "load", support/int8.h) and oneDNN's int8
// matmul as CTranslate2 calls it: src u8 [M, K] quantized outside the timing (one scale and
// zero point for the whole matrix: oneDNN's output scales cannot carry a per-row input
// scale), weights s8 quantized per output column with the same rounding as kiln's (so both
// read the same q(W)), reordered once into the layout the primitive chose; output scales per
// column (mask 2: step_x · scale_n), bias f32 with the zero point's compensation folded in
// (−z · Σ_k q(W)[n, k], as CTranslate2 folds its u8 shift), ReLU as a post-op, dst f32.
// oneDNN 2.x adds the bias to the int32 sum before the output scale, so the bias it gets is
// divided by the scale (a column of zeros gets the bias through a scale of 1 instead).
void prepare_int8(PackedProblem& p) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  const GemmShape& s = p.shape;
  const int64_t P = 64, Kp = (s.K + 3) / 4 * 4, Np = (s.N + P - 1) / P * P;
  const std::vector<float> w = weight_rows(*p.f32);
  p.wt_packed = aligned_bytes(Np * Kp + 8 * Np);
  if (kiln::rt::lay_out_linear_weight_int8_rows(reinterpret_cast<const uint8_t*>(w.data()), 0, s.N,
                                                s.N, s.K, p.wt_packed.get()) != -1) {
    p.error = "non-finite weight";
    return;
  }
  const auto i32 = [](int64_t v) { return static_cast<int32_t>(v); };
  p.wt_dims[0] = {0, 4, 1};
  p.wt_dims[1] = {0, i32(P), 4};
  p.wt_dims[2] = {0, i32(Kp / 4), i32(4 * P)};
  p.wt_dims[3] = {0, i32(Np / P), i32(P * Kp)};
  p.wt_buf.host = p.wt_packed.get();
  p.wt_buf.type = halide_type_t(halide_type_int, 8);
  p.wt_buf.dimensions = 4;
  p.wt_buf.dim = p.wt_dims;
  p.wscale_dims[0] = {0, i32(Np), 1};
  p.wsum_dims[0] = {0, i32(Np), 1};
  uint8_t* scales = p.wt_packed.get() + Np * Kp;
  p.wscale_buf = make_buffer_1d(scales, halide_type_t(halide_type_float, 32), p.wscale_dims);
  p.wsum_buf = make_buffer_1d(scales + 4 * Np, halide_type_t(halide_type_int, 32), p.wsum_dims);
  p.argv = {&p.f32->x_buf, &p.wt_buf, &p.wscale_buf, &p.wsum_buf, &p.f32->bias_buf, &p.out_buf};

  // oneDNN's operands: q(W)ᵀ [K, N] s8 with each column's scale and sum, x in u8.
  std::vector<int8_t> qwt(static_cast<size_t>(s.K * s.N));
  std::vector<float> wscale(static_cast<size_t>(s.N));
  std::vector<int32_t> wsum(static_cast<size_t>(s.N), 0);
  for (int64_t n = 0; n < s.N; ++n) {
    const float* row = w.data() + n * s.K;
    const float absmax = kiln::int8::absmax(row, s.K);
    const float inverse = kiln::int8::inverse_scale(absmax);
    wscale[n] = kiln::int8::scale(absmax);
    for (int64_t k = 0; k < s.K; ++k) {
      const int8_t q = kiln::int8::quantize(row[k], inverse);
      qwt[k * s.N + n] = q;
      wsum[n] += q;
    }
  }
  const kiln::int8::InputRow xq = kiln::int8::input_row(p.f32->x.get(), s.M * s.K);
  p.x_dnnl = aligned_bytes(s.M * s.K);
  for (int64_t i = 0; i < s.M * s.K; ++i) p.x_dnnl[i] = kiln::int8::quantize_input(p.f32->x[i], xq);
  std::vector<float> oscales(static_cast<size_t>(s.N));
  p.bias_dnnl = aligned_bytes(s.N * 4);
  float* bias = reinterpret_cast<float*>(p.bias_dnnl.get());
  for (int64_t n = 0; n < s.N; ++n) {
    const float o = xq.step * wscale[n];
    oscales[n] = o > 0 ? o : 1.0f;
    bias[n] = p.f32->bias[n] / oscales[n] - xq.zero * static_cast<float>(wsum[n]);
  }
  dnnl::primitive_attr attr;
  attr.set_output_scales(1 << 1, oscales);
  make_dnnl_matmul(p, dnnl::memory::desc({s.M, s.K}, dt::u8, tag::ab), dt::s8, qwt.data(), attr,
                   bias);
}

PackedProblem& packed_problem_for(const GemmShape& s, Packed t) {
  static std::map<std::pair<std::string, Packed>, std::unique_ptr<PackedProblem>> problems;
  std::unique_ptr<PackedProblem>& p = problems[{shape_name(s), t}];
  if (p) return *p;
  p = std::make_unique<PackedProblem>();
  p->shape = s;
  p->type = t;
  p->f32 = &problem_for(s);
  p->kernel = aot_kernel_for(s, t);
  if (!p->kernel) {
    p->error =
        fmt::format("no {} kernel for {} in bench/gemm_shapes.kir", packed_name(t), shape_name(s));
    return *p;
  }
  const auto i32 = [](int64_t v) { return static_cast<int32_t>(v); };
  p->out_kiln = aligned_floats(s.M * s.N, 6);
  p->out_dnnl = aligned_floats(s.M * s.N, 7);
  p->out_dims[0] = {0, i32(s.N), 1};
  p->out_dims[1] = {0, i32(s.M), i32(s.N)};
  p->out_buf = make_buffer(p->out_kiln.get(), 2, p->out_dims);
  try {
    p->engine = dnnl::engine(dnnl::engine::kind::cpu, 0);
    p->stream = dnnl::stream(p->engine);
    if (t == Packed::kInt8)
      prepare_int8(*p);
    else
      prepare_bf16(*p);
  } catch (const dnnl::error& e) {
    p->error = fmt::format("oneDNN {} matmul: {}", packed_name(t), e.what());
  }
  return *p;
}

int run_kiln_packed(PackedProblem& p) { return p.kernel(p.argv.data()); }

bool run_dnnl_packed(PackedProblem& p) {
  try {
    p.matmul.execute(p.stream, p.args);
    p.stream.wait();
    return true;
  } catch (const dnnl::error&) {
    return false;
  }
}

void bm_kiln_packed(benchmark::State& state, GemmShape s, Packed t) {
  PackedProblem& p = packed_problem_for(s, t);
  if (!p.error.empty()) {
    state.SkipWithError(p.error.c_str());
    return;
  }
  measure(state, s, kiln_library(t), "kiln kernel failed", [&] { return run_kiln_packed(p) == 0; });
}

void bm_dnnl_packed(benchmark::State& state, GemmShape s, Packed t) {
  PackedProblem& p = packed_problem_for(s, t);
  if (!p.error.empty()) {
    state.SkipWithError(p.error.c_str());
    return;
  }
  measure(state, s, dnnl_library(t), "oneDNN matmul failed", [&] { return run_dnnl_packed(p); });
}
#endif  // KILN_BENCH_BF16 || KILN_BENCH_INT8

void bm_kiln(benchmark::State& state, GemmShape s) {
  Problem& p = problem_for(s);
  measure(state, s, Library::kKiln, "kiln kernel failed", [&] { return run_kiln(p) == 0; });
}

void bm_dnnl(benchmark::State& state, GemmShape s) {
  Problem& p = problem_for(s);
  measure(state, s, Library::kOneDnn, "dnnl_sgemm failed",
          [&] { return run_dnnl(p) == dnnl_success; });
}

double median_of(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

constexpr double kPairedBlockSeconds = 0.02;

// Alternating blocks of kiln's `kiln` and oneDNN's `dnnl` (see the header); `kiln_lib` and
// `dnnl_lib`: which libraries they are, for the settling of the next benchmark.
template <typename Kiln, typename Dnnl>
void paired(benchmark::State& state, Kiln kiln, Dnnl dnnl, Library kiln_lib, Library dnnl_lib) {
  const auto block = [&](auto call) {
    return seconds_per_call(call, kSettleSeconds) < 0 ? -1.0
                                                      : seconds_per_call(call, kPairedBlockSeconds);
  };
  std::vector<double> ratios;
  bool kiln_first = true;
  for (auto _ : state) {
    double tk, td;
    if (kiln_first) {
      tk = block(kiln);
      td = block(dnnl);
    } else {
      td = block(dnnl);
      tk = block(kiln);
    }
    last_library = kiln_first ? dnnl_lib : kiln_lib;
    kiln_first = !kiln_first;
    if (tk <= 0 || td <= 0) {
      state.SkipWithError(tk <= 0 ? "kiln kernel failed" : "oneDNN failed");
      return;
    }
    ratios.push_back(td / tk);
  }
  state.counters["kiln/oneDNN"] = median_of(ratios);
}

void bm_paired(benchmark::State& state, GemmShape s) {
  Problem& p = problem_for(s);
  paired(
      state, [&] { return run_kiln(p) == 0; }, [&] { return run_dnnl(p) == dnnl_success; },
      Library::kKiln, Library::kOneDnn);
}

#if defined(KILN_BENCH_BF16) || defined(KILN_BENCH_INT8)
void bm_paired_packed(benchmark::State& state, GemmShape s, Packed t) {
  PackedProblem& p = packed_problem_for(s, t);
  if (!p.error.empty()) {
    state.SkipWithError(p.error.c_str());
    return;
  }
  paired(
      state, [&] { return run_kiln_packed(p) == 0; }, [&] { return run_dnnl_packed(p); },
      kiln_library(t), dnnl_library(t));
}

// After one call of each: the largest |kiln − oneDNN| over the outputs (both with bias and
// ReLU), the largest |kiln − f32| and |oneDNN − f32| (f32: kiln's f32 kernel on the same x, W
// and bias: what the quantization costs each), and the largest |f32| for scale; NaN if a call
// failed.
struct PackedDifference {
  double kiln_dnnl = NAN, kiln_f32 = NAN, dnnl_f32 = NAN, scale = NAN;
};
PackedDifference max_difference_packed(PackedProblem& p) {
  PackedDifference d;
  if (!p.error.empty() || run_kiln_packed(p) != 0 || !run_dnnl_packed(p) || run_kiln(*p.f32) != 0)
    return d;
  d = {0, 0, 0, 0};
  for (int64_t i = 0; i < p.shape.M * p.shape.N; ++i) {
    const double k = p.out_kiln[i], o = p.out_dnnl[i], f = p.f32->out_kiln[i];
    d.kiln_dnnl = std::max(d.kiln_dnnl, std::fabs(k - o));
    d.kiln_f32 = std::max(d.kiln_f32, std::fabs(k - f));
    d.dnnl_f32 = std::max(d.dnnl_f32, std::fabs(o - f));
    d.scale = std::max(d.scale, std::fabs(f));
  }
  return d;
}
#endif

// Prints as the console reporter does and keeps each run's counters by benchmark name.
class CollectingReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Iteration || r.error_occurred) continue;
      for (const auto& [counter, value] : r.counters)
        values_[{r.run_name.function_name, counter}].push_back(value.value);
    }
  }
  // The median of `counter` over `name`'s runs; NaN if none ran.
  double median(const std::string& name, const std::string& counter) const {
    auto it = values_.find({name, counter});
    return it == values_.end() ? NAN : median_of(it->second);
  }

 private:
  std::map<std::pair<std::string, std::string>, std::vector<double>> values_;
};

// The largest |kiln − (oneDNN + bias, ReLU)| over the outputs, after one call of each.
double max_difference(Problem& p) {
  if (run_kiln(p) != 0 || run_dnnl(p) != dnnl_success) return NAN;
  const GemmShape& s = p.shape;
  double worst = 0;
  for (int64_t m = 0; m < s.M; ++m) {
    for (int64_t n = 0; n < s.N; ++n) {
      float want = p.out_dnnl[m * s.N + n] + p.bias[n];
      if (s.relu) want = std::max(want, 0.0f);
      worst = std::max(worst, std::fabs(static_cast<double>(p.out_kiln[m * s.N + n]) - want));
    }
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  // The same number of threads each (2 unless KILN_BENCH_THREADS says otherwise): Halide's
  // thread pool reads HL_NUM_THREADS when it starts (at the first kernel call); oneDNN here
  // runs on libgomp, whose environment is read at load time, so set its thread count
  // through the OpenMP API when it is present.
  const char* threads_env = std::getenv("KILN_BENCH_THREADS");
  const int threads = threads_env ? std::max(1, std::atoi(threads_env)) : 2;
  setenv("HL_NUM_THREADS", std::to_string(threads).c_str(), 1);
  setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 1);
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "omp_set_num_threads")))
    set(threads);
  benchmark::AddCustomContext("threads", std::to_string(threads));
  // kiln_model_create installs the runtime's thread pool and its allocator of the kernels'
  // scratch memory into a model library's Halide runtime; the kernels are called directly
  // here, so install them the same way (the pool reads HL_NUM_THREADS at its first loop), into
  // the AOT libraries' runtime (weak symbols: the f32, bf16 and int8 libraries share one).
  halide_set_custom_do_par_for(kiln_do_par_for);
  halide_set_custom_malloc(kiln_kernel_malloc);
  halide_set_custom_free(kiln_kernel_free);
#if defined(KILN_BENCH_BF16) || defined(KILN_BENCH_INT8)
  std::vector<Packed> packed_types;
#ifdef KILN_BENCH_BF16
  packed_types.push_back(Packed::kBf16);
  packed_types.push_back(Packed::kBf16Fma);
#endif
#ifdef KILN_BENCH_INT8
  packed_types.push_back(Packed::kInt8);
#endif
#endif

  const std::vector<GemmShape> shapes = model_shapes();
  for (const GemmShape& s : shapes) {
    benchmark::RegisterBenchmark(("kiln/" + shape_name(s)).c_str(), bm_kiln, s)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("onednn/" + shape_name(s)).c_str(), bm_dnnl, s)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("paired/" + shape_name(s)).c_str(), bm_paired, s)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
#if defined(KILN_BENCH_BF16) || defined(KILN_BENCH_INT8)
    for (Packed t : packed_types) {
      const std::string suffix = std::string("_") + packed_name(t) + "/" + shape_name(s);
      benchmark::RegisterBenchmark(("kiln" + suffix).c_str(), bm_kiln_packed, s, t)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
      if (t != Packed::kBf16Fma)  // its oneDNN side is onednn_bf16's
        benchmark::RegisterBenchmark(("onednn" + suffix).c_str(), bm_dnnl_packed, s, t)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("paired" + suffix).c_str(), bm_paired_packed, s, t)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
#endif
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  CollectingReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);

  std::printf("\n%-22s %25s %8s %25s %8s %8s %10s\n", "", "GFLOP/s (wall)", "", "GFLOP/cpu-s", "",
              "paired", "");
  std::printf("%-22s %12s %12s %8s %12s %12s %8s %8s %10s\n", "shape", "kiln", "oneDNN", "ratio",
              "kiln", "oneDNN", "ratio", "ratio", "max |diff|");
  for (const GemmShape& s : shapes) {
    const std::string kiln = "kiln/" + shape_name(s), dnnl = "onednn/" + shape_name(s);
    const double kw = reporter.median(kiln, "GFLOP/s"), dw = reporter.median(dnnl, "GFLOP/s");
    const double kc = reporter.median(kiln, "GFLOP/cpu-s");
    const double dc = reporter.median(dnnl, "GFLOP/cpu-s");
    const double pr = reporter.median("paired/" + shape_name(s), "kiln/oneDNN");
    if (std::isnan(kw) && std::isnan(dw) && std::isnan(pr)) continue;  // filtered out
    std::printf("%-22s %12.1f %12.1f %7.1f%% %12.1f %12.1f %7.1f%% %7.1f%% %10.3g\n",
                shape_name(s).c_str(), kw, dw, 100.0 * kw / dw, kc, dc, 100.0 * kc / dc, 100.0 * pr,
                max_difference(problem_for(s)));
  }
#if defined(KILN_BENCH_BF16) || defined(KILN_BENCH_INT8)
  // One table per packed weight type: kiln's kernel against oneDNN's matmul of that type; its
  // speed-up over kiln's f32 kernel (and for int8 over kiln's bf16 one, where built), GFLOP/s
  // medians; the outputs' differences (for int8 also each against the f32 kernel's output).
  for (Packed t : packed_types) {
    const char* name = packed_name(t);
    bool header = false;
    for (const GemmShape& s : shapes) {
      const std::string suffix = std::string("_") + name + "/" + shape_name(s);
      const double kw = reporter.median("kiln" + suffix, "GFLOP/s");
      const std::string dnnl_suffix = std::string("_") +
                                      packed_name(t == Packed::kBf16Fma ? Packed::kBf16 : t) + "/" +
                                      shape_name(s);
      const double dw = reporter.median("onednn" + dnnl_suffix, "GFLOP/s");
      const double kc = reporter.median("kiln" + suffix, "GFLOP/cpu-s");
      const double dc = reporter.median("onednn" + dnnl_suffix, "GFLOP/cpu-s");
      const double pr = reporter.median("paired" + suffix, "kiln/oneDNN");
      const double kf = reporter.median("kiln/" + shape_name(s), "GFLOP/s");
      const double kb = reporter.median("kiln_bf16/" + shape_name(s), "GFLOP/s");
      if (std::isnan(kw) && std::isnan(dw) && std::isnan(pr)) continue;  // filtered out
      const bool int8 = t == Packed::kInt8;
      if (!header) {
        if (int8)
          std::printf(
              "\nint8: kiln's int8 kernel (x f32, quantized per row inside the call) vs oneDNN's "
              "int8 matmul (x already u8, weights s8 any, per-column output scales)\n");
        else
          std::printf(
              "\n%s: kiln's bf16 kernel (%s) vs oneDNN's bf16 matmul (x bf16, weights any)\n", name,
              t == Packed::kBf16 ? "vdpbf16ps" : "f32 FMAs on the widened weights");
        std::printf("%-22s %12s %12s %8s %12s %12s %8s %8s %10s", "shape",
                    int8 ? "kiln int8" : ("kiln " + std::string(name)).c_str(),
                    int8 ? "oneDNN int8" : "oneDNN bf16", "ratio", "kiln cpu-s", "oneDNN cpu-s",
                    "ratio", "paired", int8 ? "int8/f32" : "bf16/f32");
        if (int8) std::printf(" %10s", "int8/bf16");
        std::printf(" %10s\n", "max |diff|");
        header = true;
      }
      const PackedDifference d = max_difference_packed(packed_problem_for(s, t));
      // kiln's speed-ups (GFLOP/s medians), "-" where the other kernel was filtered out.
      const auto speedup = [&](double other) {
        return std::isnan(other) ? std::string("-") : fmt::format("{:.2f}x", kw / other);
      };
      std::printf("%-22s %12.1f %12.1f %7.1f%% %12.1f %12.1f %7.1f%% %7.1f%% %10s",
                  shape_name(s).c_str(), kw, dw, 100.0 * kw / dw, kc, dc, 100.0 * kc / dc,
                  100.0 * pr, speedup(kf).c_str());
      if (int8)
        std::printf(" %10s %10.3g (of %.3g; kiln-f32 %.3g, oneDNN-f32 %.3g)\n", speedup(kb).c_str(),
                    d.kiln_dnnl, d.scale, d.kiln_f32, d.dnnl_f32);
      else
        std::printf(" %10.3g (of %.3g)\n", d.kiln_dnnl, d.scale);
    }
  }
#endif
  benchmark::Shutdown();
  return 0;
}
