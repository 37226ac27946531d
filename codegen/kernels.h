// Kernel specifications: what each Halide kernel computes and the buffers it takes.
// Free of Halide so the compiler driver and tests can describe kernels cheaply;
// codegen/halide_kernels.h builds the Halide pipelines for them.
//
// Conventions for every kernel:
//  - Buffers are Halide buffers: dimension 0 is the innermost (contiguous) one, so an
//    IR tensor [B, L, D] is the Halide buffer (d, l, b). Dimension 0 always has stride
//    1; other strides are arbitrary (a last-axis slice of a wider tensor is passed as
//    a view with a larger row stride), unless a kernel says "dense".
//  - Shapes are symbolic: every extent other than the spec's constants is read from the
//    buffers at run time, so one kernel serves every batch and length.
//  - f32 data; ids are int64; bool masks are uint8 (0/1).
//  - The argument order below is the order of the generated C function's parameters.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "ir/ops.h"

namespace kiln::codegen {

// out(n, m) = act(Σ_k x(k, m) · wt(n, k) + bias(n)), act "none" or the name of an
//   activation (ir::is_linear_activation: relu, gelu, gelu_tanh, silu, sigmoid, tanh)
//   args: x f32 (k, m) [K × M], wt: the weight W[N,K] of the IR `linear` op, laid out
//   once at load time either as wt f32 (n, k) [N × K] dense (W transposed; panel = 0), or
//   packed in panels of `panel` columns, wt f32 (j, k, p) [panel × K × N/panel] dense
//   with wt(j, k, p) = W[p·panel + j, k] (panel > 0, N a multiple of it), so a block of
//   columns reads one contiguous strip; bias f32 (n) [N] (when has_bias), out f32 (n, m)
//   [N × M] dense. M = product of the IR's leading dims, any size ≥ 1.
//   With bf16: the weight is bf16, packed in panels of 64 columns with pairs of K adjacent,
//   wt bf16 (pair, j, kp, p) [2 × 64 × Kp/2 × Np/64] dense with wt(pair, j, kp, p) =
//   bf16(W[p·64 + j, 2·kp + pair]), 0 outside W (Np: N rounded up to a multiple of 64, Kp:
//   K rounded up to even; panel = 64); x is rounded to bf16 (to nearest, ties to even) as
//   it is read; products summed in f32.
//   With int8: the weight quantized per output row (support/int8.h), packed in panels of 64
//   columns with 4 consecutive K adjacent, wt i8 (g, j, kg, p) [4 × 64 × Kp/4 × Np/64] dense
//   with wt(g, j, kg, p) = q(W)[p·64 + j, 4·kg + g], 0 outside W (Kp: K rounded up to a
//   multiple of 4); then wscale f32 (n) [Np] (row n's scale) and wsum i32 (n) [Np] (Σ_k of row
//   n's q), after wt and before bias; each row of x quantized as it is read (asymmetric u8
//   with a zero point z, support/int8.h); the products summed exactly in int32,
//   out = f32(Σ u·q_w − z·wsum) · (step_x · wscale) + bias.
struct LinearKernel {
  int64_t K = 0, N = 0;
  std::string act = "none";
  bool has_bias = true;
  int64_t panel = 0;
  bool bf16 = false;
  // bf16 only: the products on f32 FMAs instead of vdpbf16ps (LowerOptions::bf16_fma): the
  // same exact products of bf16 values summed in f32, the weight read as int32 pairs,
  // wt i32 (j, kp, p) [Np/64, Kp/2, 64] over the same bytes, each pair widened by a shift
  // and a mask.
  bool bf16_fma = false;
  bool int8 = false;
  // The IR's linear_rows (CPU): only the rows `ids` of W (N is W's rows, V). In f32 (panel
  // 0, f32 libraries) W is read as stored: args x, w f32 (k, v) [K × V] dense (W[V, K]
  // itself), ids i64 (n) [R] (each in [0, V)), bias f32 (v) [V] (when has_bias), out f32
  // (n, m) [R × M] dense with out(n, m) = act(Σ_k x(k, m) · W[ids(n), k] + bias(ids(n))).
  // With bf16 or int8 (panel 64) the full linear's packed weight (and for int8 its scales and
  // sums) replaces w, x rounded or quantized as that kernel's, in the same product form:
  // args x, wt[, wscale, wsum], ids, bias, out; the outputs are the full linear's at the ids.
  bool rows = false;
  // bf16 only (not rows), an activation stored in bf16 (LowerOptions::bf16_activations): x_bf16,
  // x arrives as bf16 (k, m), already rounded as the kernel would round it; out_bf16, out is
  // written as bf16 (n, m), the f32 result rounded to nearest, ties to even (subnormals to ±0,
  // as the kernels round). Either way the numbers are those of the f32 buffer read by a bf16
  // kernel.
  bool x_bf16 = false, out_bf16 = false;
};

// The panel width codegen packs linear weights into (a multiple of every target's
// register block: 4 AVX-512 vectors, 8 AVX2 ones), or 0 when N is not a multiple of it.
constexpr int64_t kLinearPanel = 64;
inline int64_t linear_panel_for(int64_t N) { return N % kLinearPanel == 0 ? kLinearPanel : 0; }

// Scaled dot-product attention, heads merged in the feature dim (the IR `attention` op):
//   for batch b, head h, query i: s_j = (Σ_d q(h·dk+d, i, b) · k(h·dk+d, j, b)) · scale,
//   s_j = fill where (causal and j > i) or (key_padding and mask(j, b) != 0) or
//   (query_padding and qmask(i, b) != 0), fill = -inf when fill_inf, else -1e9,
//   out(h·dv+e, i, b) = Σ_j softmax(s)_j · v(h·dv+e, j, b).
//   So a row whose keys are all masked is the mean of v over all Lk keys (-1e9), or NaN
//   (fill_inf, as PyTorch's softmax of a row of -inf).
//   args: q f32 (c, i, b) [heads·dk × Lq × B], k f32 (c, j, b) [heads·dk × Lk × B],
//   v f32 (c, j, b) [heads·dv × Lk × B], mask uint8 (j, b) [Lk × B] (when key_padding),
//   qmask uint8 (i, b) [Lq × B] (when query_padding), out f32 (c, i, b) [heads·dv × Lq × B]
//   dense.
//   Issue 26's variants (the fields below): with kv_heads, k and v are [kv_heads·dk] and
//   [kv_heads·dv] wide and head h reads kv head g = h / (heads / kv_heads) (k(g·dk+d, j, b));
//   s_j becomes tanh(s_j / softcap) · softcap (softcap), then s_j + bias(j, i, h, b) (bias,
//   the last argument before out), before the masks; window also masks i - j >= window.
// The score matrix is never stored: online softmax over blocks of keys.
struct AttentionKernel {
  int64_t heads = 0, dk = 0, dv = 0;
  bool causal = false;
  bool key_padding = false;
  double scale = 1.0;
  bool fill_inf = false;
  bool query_padding = false;
  // Grouped-query attention: k and v have kv_heads heads (0: heads), query head h reading
  // kv head h / (heads / kv_heads).
  int64_t kv_heads = 0;
  // An additive score bias f32 (j, i, h, b) [Lk' × Lq' × H' × B'], each extent 1 or the full
  // one (broadcast), added to the scaled (and capped) scores before the masks.
  bool bias = false;
  // Sliding window (with causal): also masked where i - j >= window (0: none).
  int64_t window = 0;
  // Logit soft-capping: scaled scores s become tanh(s / softcap) · softcap (0: none).
  double softcap = 0;
  // Both products in bf16 (a model compiled with bf16 weights, CPU, dk even): q and k rounded
  // to bf16 (to nearest, ties to even) before QKᵀ, the unnormalized probabilities and v before
  // the V product; sums, maxima, exponentials and the normalization in f32.
  bool bf16 = false;
  // bf16 only, activations stored in bf16 (LowerOptions::bf16_activations): q, k or v arrive
  // as bf16, already rounded as the kernel rounds them; out is written as bf16 (the f32 result
  // rounded to nearest, ties to even). The numbers are those of the f32 buffers.
  bool q_bf16 = false, k_bf16 = false, v_bf16 = false, out_bf16 = false;
};

// Single-query attention of incremental decoding (the IR's cache_attention and
// memory_attention): for hypothesis n, head h, key j < keys:
//   s_j = (Σ_d q(h·dk+d, n) · k(h·dk+d, a1, a0)) · scale, -1e9 where masked,
//   out(h·dv+e, n) = Σ_j softmax(s)_j · v(h·dv+e, a1, a0), where
//   cache (memory = false): (a1, a0) = (index(j, n), j), keys = index's extent 0;
//   memory (memory = true): (a1, a0) = (j, index(n)), keys = k's extent 1, masked where
//   mask(j, index(n)) != 0.
//   args: q f32 (c, n) [heads·dk × N], k f32 (c, a1, a0) [heads·dk × A1 × A0],
//   v f32 (c, a1, a0) [heads·dv × A1 × A0], index i64 (j, n) [P × N] or (n) [N],
//   mask uint8 (j, b) [S × B] (memory only), out f32 (c, n) [heads·dv × N] dense.
// Cache form only: kv_heads G (grouped-query attention) reads k and v with G·dk and G·dv
// channels, query head h using key/value head h / (heads / G); keys whose index is -1 are
// skipped, and with window W > 0 so are those with keys - 1 - j >= W (a row whose keys are
// all skipped is NaN, as in the interpreter).
struct StepAttentionKernel {
  int64_t heads = 0, dk = 0, dv = 0;
  bool memory = false;
  double scale = 1.0;
  int64_t kv_heads = 0;  // 0: heads
  int64_t window = 0;    // 0: none
  // Cache form only: a score bias f32 (j, 0, h', n') [P × 1 × H' × N'] added to the scaled
  // scores, H' and N' 1 (broadcast) or heads and N.
  bool bias = false;
};

// out(c, r) = layernorm over c of (x(c, r) [+ y(c, r)]) · gamma(c) + beta(c), biased
// variance (divided by D - 1 when `unbiased`, D >= 2), eps inside the square root (added to
// it when `eps_outside`: the IR op's attributes); with_sum (with_add only) also writes the sum
// sum(c, r) = x(c, r) + y(c, r) (an add_layernorm with its add_layernorm_sum).
//   args: x f32 (c, r) [D × R], y f32 (c, r) (when with_add), gamma f32 (c) [D],
//   beta f32 (c) [D], out f32 (c, r) [D × R] dense, sum f32 (c, r) [D × R] dense (when
//   with_sum). R = product of leading dims. out may be x's or y's memory (in place), never
//   sum's; sum is neither x's nor y's.
struct LayerNormKernel {
  int64_t D = 0;
  double eps = 1e-5;
  bool with_add = false;
  bool with_sum = false;
  // y broadcast over x's leading dims: y f32 (c, t) [D × T] with R a multiple of T, row r
  // of x adding row r mod T of y (y's IR shape a suffix of x's).
  bool broadcast_y = false;
  bool unbiased = false;
  bool eps_outside = false;
  // RMSNorm: s / sqrt(Σs² / D + eps) · gamma, no mean and no beta (its arguments: x [, y],
  // gamma).
  bool rms = false;
};

// A fused group of elementwise ops (with numpy broadcasting), gathers, transposes and
// iota/table sources, evaluated per output element: a small expression tree. A single
// input node is a copy (of a strided view into dense memory, of a view into a result).
struct ElementwiseKernel {
  enum class Dtype { f32, i64, u8 };
  // One node of the expression: a buffer argument, a splat constant, or the IR op `op` (a
  // pointwise op, gather, iota or transpose). Signatures name it "input", "constant" or the
  // op's name.
  struct Node {
    enum class Kind { op, input, constant };
    Kind kind = Kind::op;
    ir::OpKind op = ir::OpKind::add;  // for Kind::op
    std::vector<int> operands;        // node indices, each < this node's index
    Dtype dtype = Dtype::f32;
    int rank = 0;                 // of this node's value
    std::vector<bool> broadcast;  // per dim (IR order): extent 1 broadcast to output
    int input = -1;               // for an input: index among the kernel's buffer inputs
    double value = 0;             // for a constant
    int64_t axis = 0;             // for iota and take_along_axis
    int64_t table_rows = 0;       // for gather: rows of the table (ids are clamped)
    // For transpose: the IR permutation; node(i...) = operand(j...) with j[perm[d]] = i[d].
    std::vector<int64_t> perm;
  };
  std::vector<Node> nodes;  // the last node is the output
  int out_rank = 0;
  std::string signature() const;  // canonical text: equal kernels share one function
};

// The general path: kernels for ops that no fused kernel computes (a reduction, softmax,
// argmax or matmul written on its own, over any axis and layout). Correct for every shape
// the IR allows; scheduled simply (rows in parallel, the innermost dim in vectors where it
// is not reduced; on a GPU, a block per row or per 32 positions of the innermost dim with
// partial sums in shared memory, and matmul as linear's GPU GEMM), not tuned like the fused
// kernels above. On a GPU, f32 sums and softmax are computed in f32 (per-thread partials,
// then their sum), not in double: within 1e-5 of the interpreter on tests/gpu/general.kir.
//
// Reductions (the IR's reduce_sum, reduce_mean, reduce_max and argmax) over the IR dims
// marked in `reduced`:
//   args: in (rank dims, any strides), out (rank dims, each reduced dim of extent 1)
//   dense; dtype f32, or i64 when `i64`.
//   sum, mean: accumulated in double for f32 (as the interpreter does; in f32 on a GPU),
//   wrapping for i64;
//   max: NaN propagates; argmax (exactly one reduced dim): out is i64, the index of the
//   first maximum, a NaN counting as the maximum (as PyTorch and the interpreter do).
struct ReduceKernel {
  enum class Op { sum, mean, max, argmax };
  Op op = Op::sum;
  bool i64 = false;
  std::vector<bool> reduced;  // per IR dim; its size is the rank
};

// Softmax over IR dim `axis` of a rank-`rank` f32 tensor: max-subtracted, exponentials
// and their sum in double, each result rounded once (the interpreter's numerics; in f32 on a
// GPU).
//   args: in (any strides), out dense, both of the same extents.
struct SoftmaxKernel {
  int rank = 1;
  int axis = 0;
};

// Batched matrix product with broadcasting of the batch dims (the IR's matmul, and a
// linear whose weight is not a load-time weight):
//   out(n, m, batch...) = act(Σ_k a(k, m, batch_a...) · b(n, k, batch_b...) [+ bias(n)]),
//   with b read as b(k, n) (its IR form W[N,K]) when `transpose_b`.
//   args: a f32 [..., M, K] (any strides), b f32 [..., K, N] or [N, K] (any strides), bias
//   f32 (n) [N] (when has_bias), out f32 [..., M, N] dense. IR batch dims align to the
//   right; a batch dim of a or b flagged in a_broadcast / b_broadcast (IR order over its
//   batch dims) has extent 1 and is read at 0.
struct MatmulKernel {
  int a_rank = 2, b_rank = 2, out_rank = 2;
  std::vector<bool> a_broadcast, b_broadcast;
  bool transpose_b = false;
  bool has_bias = false;
  std::string act = "none";  // as LinearKernel's
  // With transpose_b and b_rank 2 (the IR's linear_rows on a GPU): column n is row ids(n) of
  // b (W[V, K]), args a, b, ids i64 (n) [N] (each in [0, V)), bias f32 (n) [V] read at ids(n)
  // too, out.
  bool gather_b = false;
};

// The IR's topk over rows: the indices of the k largest values of each row, largest first,
// ties to the lower index, a NaN above every number (the interpreter's order).
//   args: in (n, rows) f32 or i64 (when `i64`), any row stride; out i64 (k, rows) dense.
// k chained selections per row (each the best element ranked below the previous pick):
// O(k · n) per row, rows in parallel (on a GPU: a thread per row, blocks of 64).
struct TopkKernel {
  int64_t k = 1;
  bool i64 = false;
};

// The IR's scatter_add over IR dim `axis` of rank-`rank` tensors:
//   out = base; out[j] += src[i] for every i in row-major order, j = i with j[axis] =
//   clamp(ids[i], 0, extent - 1) (the interpreter refuses an index out of range; compiled
//   code clamps it, as gather does).
//   args: base, ids i64, src (any strides; base and src f32, or i64 when `i64`), out dense.
// The update runs over src's axis in order for each position of the other dims, those in
// parallel (on a GPU: a thread per position, blocks of 256).
struct ScatterAddKernel {
  int rank = 1;
  int axis = 0;
  bool i64 = false;
};

using KernelSpec = std::variant<LinearKernel, AttentionKernel, StepAttentionKernel, LayerNormKernel,
                                ElementwiseKernel, ReduceKernel, SoftmaxKernel, MatmulKernel,
                                TopkKernel, ScatterAddKernel>;

// A C identifier naming the kernel, unique per spec (e.g. "linear_k512_n2048_relu").
std::string kernel_name(const KernelSpec& spec);

// Outputs of the kernel (the last arguments of its call): 2 for a layernorm with its sum,
// else 1.
int kernel_num_outputs(const KernelSpec& spec);

// GPU targets (a Halide target string with a GPU feature, e.g. host-opencl or
// host-cuda-cuda_capability_86): the kernels run on the device through Halide's OpenCL or
// CUDA back end, one set of GPU schedules for both.
// The device API of `target`: "opencl", "cuda", or "" for a CPU target; kiln::Error for
// another GPU API (kiln has schedules for none of them).
std::string gpu_api(const std::string& target);
// The kernel kind of `spec` as messages name it ("bf16 linear") when it has no GPU schedule
// yet, or "" when it has one (linear with f32 weights, attention, cache_attention,
// memory_attention, layernorm, add_layernorm, elementwise kernels with their gathers, transposes
// and copies, and the general kernels: reductions, argmax, softmax, matmul, topk, scatter_add).
std::string kind_without_gpu_schedule(const KernelSpec& spec);
// What a GPU schedule may use per block (checked when a kernel is compiled for a GPU): CUDA's
// limits, which Halide 14 never raises (pocl allows more, so its tests would not notice).
constexpr int kGpuMaxThreadsPerBlock = 1024;
constexpr int64_t kGpuMaxSharedBytesPerBlock = 48 * 1024;

// What compile_kernel wrote: the object itself, or (a bf16 or int8 linear kernel) LLVM assembly
// that the caller compiles into the object with `llc-14 -O3 -mcpu=LLC_CPU
// -relocation-model=pic -filetype=obj`. Halide 14 emits vdpbf16ps and vpdpbusd only for
// avx512_sapphirerapids, whose LLVM CPU may also emit AVX512-FP16 instructions, which AMD
// Zen 4/5 lack; the IR names no CPU, and llc compiles it for LLVM's cooperlake.
struct KernelOutput {
  std::string llvm_assembly;  // "" when the object is written
  std::string llc_cpu;
};

// Compiles `spec` for `target` (a Halide target string; "host" = this machine) into an
// object file at `object_path` defining `function_name` (and `function_name_argv`),
// without the Halide runtime (see compile_runtime), or into LLVM assembly at
// `object_path`.ll (see KernelOutput). Runs no other program. Throws kiln::Error on failure.
KernelOutput compile_kernel(const KernelSpec& spec, const std::string& target,
                            const std::string& function_name, const std::string& object_path);

// Compiles Halide's runtime for `target` into one object shared by all kernels.
void compile_runtime(const std::string& target, const std::string& object_path);

// The canonical form of a target string ("host" resolved to this machine's features, as is
// the "host" of "host-opencl").
std::string resolve_target(const std::string& target);

// The x86 feature a library with bf16 kernels requires besides its target's: kiln's name
// for LLVM's cooperlake (AVX-512 with AVX512-BF16 and VNNI; see runtime/cpu_features.h).
inline constexpr const char* kBf16Feature = "avx512_bf16";
// Why bf16 weights cannot be compiled for `target` (a target string or "host"), or "".
std::string bf16_target_problem(const std::string& target);
// The same for int8 weights: kiln's name for AVX-512 with VNNI (the int8 kernels are compiled
// for LLVM's cooperlake too, and use only its VNNI beyond AVX-512 BW/DQ/VL).
inline constexpr const char* kInt8Feature = "avx512_vnni";
std::string int8_target_problem(const std::string& target);

}  // namespace kiln::codegen
