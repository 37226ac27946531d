// The execution plan of a compiled model: what `kiln compile` hands the runtime.
//
// A plan lists the model's symbols, the weights to build at load time (by state_dict
// name, with concatenation and the linear kernels' layout applied once), precomputed tables, and
// per entry point the sequence of kernel calls. Each call names a kernel and describes each of its
// buffers as a view (base storage, element offset, extents and strides) whose sizes are monomials
// of the symbols (symbols derived from others included: T+1), so one plan runs every batch
// and length up to the maxima. The compiler serializes
// the plan into the generated library; the runtime deserializes and validates it. Only the
// runtime's own types appear here (element types are its C ABI's kiln_dtype).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/runtime.h"

namespace kiln::rt {

// coeff · Π symbols[i]^pows[i]: the size or stride of a dim in elements.
struct DimExpr {
  int64_t coeff = 0;
  std::vector<int8_t> pows;  // one per plan symbol (may be shorter: missing = 0)

  static DimExpr constant(int64_t c) { return DimExpr{c, {}}; }
  static DimExpr symbol(int index, int64_t coeff = 1);
  int64_t eval(const std::vector<int64_t>& symbols) const;
  DimExpr operator*(const DimExpr& other) const;
  bool operator==(const DimExpr& other) const;  // as monomials (trailing zero pows ignored)
  bool is_constant() const;
  // The symbol index when this is exactly one symbol (coeff 1, power 1), else -1.
  int single_symbol() const;
  // The symbol index when this is coeff times one symbol (power 1, coeff >= 1), else -1.
  int scaled_symbol() const;
};

enum class Storage : int8_t {
  param = 0,   // the entry point's input `index`
  result = 1,  // the entry point's output `index`
  arena = 2,   // the arena, at byte offset `byte_offset`
  weight = 3,  // plan weight `index`
  table = 4,   // plan table `index`
};

// A buffer argument of a kernel call, in Halide dimension order (innermost first).
struct BufferDesc {
  Storage storage = Storage::arena;
  int32_t index = 0;
  int64_t byte_offset = 0;  // added to the storage's base (arena offsets)
  DimExpr elem_offset = DimExpr::constant(0);
  kiln_dtype type = KILN_F32;  // f32, i64, bool or (a weight) bf16
  std::vector<DimExpr> extents, strides;
};

// Steps the runtime performs itself rather than through a generated kernel.
enum class Builtin : int8_t {
  none = 0,
  // The IR's cache_write, in place: args x f32 (d, l, n) [D × L × N], pos i64 (1) [1]
  // (absent: 0), cache f32 (d, c, t) [D × C × T] (the result, whose buffer is the cache
  // parameter's); copies x(·, l, n) to cache(·, n, pos + l) and leaves the rest of the cache
  // untouched.
  cache_write = 1,
  // The IR's moe_ffn (runtime/builtins.h): args x f32 (d, rows), ids i64 (k, rows), gates f32
  // (k, rows), then per expert the weights w1, w3 and w2 as stored for the step's linear
  // kernels (`calls`: linear d -> f with silu, d -> f, f -> d), then out f32 (d, rows). Only
  // the experts that some row chose run, each through those kernels over just its rows.
  moe_ffn = 2,
};

struct StepDesc {
  int32_t kernel = 0;            // index into Plan::kernel_names (-1 for a builtin)
  std::string op;                // what it computes, for errors and profiling
  std::vector<BufferDesc> args;  // inputs in kernel order, then the output
  Builtin builtin = Builtin::none;
  std::vector<int32_t> calls;  // a builtin's kernels (indices into Plan::kernel_names)
};

struct TensorDesc {
  std::string name;
  kiln_dtype type = KILN_F32;  // f32, i64 or bool
  std::vector<DimExpr> shape;  // IR order; each a constant or a single symbol
  // For ids and indices: valid values are [lowest, limit) for each limit, a constant or a
  // symbol's bound size (e.g. the batch a source row indexes), and lowest 0 or -1 (-1: a
  // cache row table's "no key here"); `what` names such a value for errors ("token id",
  // "position", ...).
  struct IdLimit {
    DimExpr limit;
    std::string what;
    int64_t lowest = 0;
  };
  std::vector<IdLimit> id_limits;
  // For a result: the parameter it updates in place (a cache), whose buffer the caller must
  // pass as this output too; -1 for an ordinary result.
  int32_t updates_param = -1;
};

// A relation between sizes that the inputs' shapes must satisfy: lhs <= rhs (e.g. the
// positions a row table covers are at most the cache's length). `what` names it.
struct DimCheck {
  DimExpr lhs, rhs;
  std::string what;
};

struct FunctionDesc {
  std::string name;
  std::vector<TensorDesc> params, results;
  std::vector<StepDesc> steps;
  int64_t arena_bytes = 0;
  std::vector<DimCheck> checks;
};

// A weight as the kernels want it: concat(sources, axis 0), then for a linear weight
// W[N, K] the layout its kernel reads (lay_out_linear_weight).
struct WeightDesc {
  std::string name;                  // for messages
  std::vector<std::string> sources;  // state_dict names
  std::vector<std::vector<int64_t>> source_shapes;
  bool transpose = false;  // a linear weight, laid out after concatenation
  int64_t panel = 0;       // its panel width (0: transposed only)
  // As stored: [K, N], [N/panel, K, panel], bf16 [Np/64, Kp/2, 64, 2] or int8 [Np/64, Kp/4,
  // 64, 4] (then its scales and row sums, see weight_bytes).
  std::vector<int64_t> shape;
  bool bf16 = false;  // packed for the bf16 linear kernel (lay_out_linear_weight_bf16_rows)
  bool int8 = false;  // quantized for the int8 linear kernel (lay_out_linear_weight_int8_rows)
  // Its sources are stored [K, N_i] (an [in, out] weight: GPT-2's Conv1D, an ONNX MatMul by
  // an initializer), each transposed to rows of W[N, K] at load time before the layout.
  bool source_kn = false;
};

// The bytes a weight takes as the runtime lays it out: its shape's elements (f32, bf16 or
// int8), and for int8 then Np f32 scales and Np i32 row sums (Np = shape[0]·64).
int64_t weight_bytes(const WeightDesc& w);

// Lays out a linear weight W[N, K] (row-major) as codegen's linear kernel reads it
// (codegen/kernels.h, LinearKernel): panel = 0: wt[k·N + n] = W[n, k], i.e. Wᵀ [K, N];
// panel > 0 (dividing N): wt[(n / panel)·K·panel + k·panel + n % panel] = W[n, k], i.e.
// [N/panel, K, panel], each block of `panel` columns a contiguous K × panel strip.
void lay_out_linear_weight(const float* w, int64_t N, int64_t K, int64_t panel, float* wt);
// The same for rows [n0, n0 + rows) of W given on their own (`w_rows`: rows × K f32,
// little-endian, any alignment), e.g. one source of a weight concatenated along axis 0.
// `source_bf16`: the rows are bf16 (little-endian) instead of f32.
void lay_out_linear_weight_rows(const uint8_t* w_rows, int64_t n0, int64_t rows, int64_t N,
                                int64_t K, int64_t panel, float* wt, bool source_bf16 = false);
// The bf16 layout of codegen's bf16 linear kernel (kernels.h, LinearKernel::bf16), with Np
// = N rounded up to a multiple of 64 and Kp = K rounded up to even: wt[(n / 64)·Kp·64 +
// (k / 2)·128 + (n % 64)·2 + k % 2] = bf16(W[n, k]), i.e. [Np/64, Kp/2, 64, 2], rounded to
// nearest, ties to even; rows [n0, n0 + rows) of W given as f32 (or bf16 with
// `source_bf16`) rows of K. The padding is left as it is: zero `wt` first.
void lay_out_linear_weight_bf16_rows(const uint8_t* w_rows, int64_t n0, int64_t rows, int64_t N,
                                     int64_t K, uint16_t* wt, bool source_bf16 = false);
// The int8 layout of codegen's int8 linear kernel (kernels.h, LinearKernel::int8), with Np =
// N rounded up to a multiple of 64 and Kp = K rounded up to a multiple of 4: each row of W
// quantized (support/int8.h), q(W)[n, k] at byte (n / 64)·Kp·64 + (k / 4)·256 + (n % 64)·4 +
// k % 4, i.e. [Np/64, Kp/4, 64, 4]; then at byte Np·Kp the f32 scale of row n at n, then at
// byte Np·Kp + 4·Np the i32 Σ_k q(W)[n, k] at n. Rows [n0, n0 + rows) of W given as f32 (or
// bf16 with `source_bf16`) rows of K; the padding is left as it is: zero `out` first. Returns
// the first of those rows with a value that is not finite (nothing is written for it or after
// it), or -1.
int64_t lay_out_linear_weight_int8_rows(const uint8_t* w_rows, int64_t n0, int64_t rows, int64_t N,
                                        int64_t K, uint8_t* out, bool source_bf16 = false);
// f32 -> bf16 bits as AVX512-BF16 converts (vcvtne2ps2bf16): rounded to nearest, ties to
// even; zero and subnormals (below 2^-126) to a zero of their sign (so a bf16 subnormal, which
// vdpbf16ps would read as zero, is never made); NaN stays NaN. bf16 bits -> f32.
uint16_t f32_to_bf16(float x);
float bf16_to_f32(uint16_t bits);

// Storage as the runtime allocates its weights, tables and arena: 64-byte aligned, and
// from 2 MiB on 2 MiB aligned with transparent huge pages asked for (fewer page faults
// when it is first written, fewer TLB misses when the kernels stream it; where THP is off
// the advice is ignored). At least 64 bytes; throws kiln::Error when memory runs out.
// `owned` false: the bytes are another's (a weight bound to a mapped file's pages).
struct FreeDeleter {
  bool owned = true;
  void operator()(void* p) const {
    if (owned) std::free(p);
  }
};
using AlignedStorage = std::unique_ptr<uint8_t, FreeDeleter>;
AlignedStorage allocate_aligned(int64_t bytes);

// A table computed at load time: PE[pos, 2i] = sin(pos / 10000^(2i/dim)),
// PE[pos, 2i+1] = cos(…), in double, stored as f32 [rows, dim].
struct TableDesc {
  std::string kind = "sinusoid";
  int64_t rows = 0, dim = 0;
};

// A plan symbol: one of the model's (base -1: bound by the inputs' shapes, 1 when no input
// of an entry point has it), or derived from one of those as scale·symbols[base] + offset
// (an IR dim such as T+1, in lowest terms: codegen/lower's ModuleLowering::dim), computed
// from its base once the inputs are bound, or binding its base when only it is given.
struct SymbolDesc {
  std::string name;  // "T", or a derived one as the IR writes it: "T+1", "2*T-1"
  int64_t max = 0;   // a derived symbol's: scale·max(base) + offset
  int32_t base = -1;
  int64_t scale = 1, offset = 0;
};

struct Plan {
  std::string model;
  std::string target;  // the Halide target the kernels were compiled for (checked at load)
  std::vector<std::pair<std::string, std::string>> config;  // the model config it was built from
  std::vector<SymbolDesc> symbols;
  std::vector<std::string> kernel_names;  // the generated library's kernel functions
  std::vector<WeightDesc> weights;
  std::vector<TableDesc> tables;
  std::vector<FunctionDesc> functions;
  // A bf16 library compiled with `--bf16-products auto`: the same entry points (same names,
  // parameters and results, in the same order) with their linear products on f32 FMAs and
  // attention in f32 (LowerOptions::bf16_fma), where `functions` has them on vdpbf16ps (an
  // int8 library: its attention in f32, where `functions` has it in bf16). The
  // runtime runs one of the two, chosen when the model is created (bf16_products.h); empty
  // for every other library.
  std::vector<FunctionDesc> fma_functions;
};

// A dim's size as the IR writes it, in the plan's symbols: "32", "B", "T+1", "2*T", "2*(T+1)".
std::string dim_text(const DimExpr& d, const Plan& plan);

std::vector<uint8_t> serialize_plan(const Plan& plan);
// Reads and validates a serialized plan (indices in range, ranks consistent); throws
// kiln::Error naming the problem.
Plan deserialize_plan(const uint8_t* data, size_t size);

}  // namespace kiln::rt
