// Internal to lowering (codegen/lower.cpp and codegen/lower/*.cpp): the state of lowering
// one function that every op family's lowering reads and extends, its helpers, and the
// lowering function of each op kind (one file per family), which lower.cpp's dispatch
// table indexes by ir::OpKind. Not a public header: nothing outside codegen/ includes it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "codegen/kernels.h"
#include "codegen/lower.h"
#include "ir/ir.h"
#include "runtime/plan.h"

namespace kiln::codegen::lowering {

kiln_dtype elem_type(ir::DType d);
ElementwiseKernel::Dtype node_dtype(kiln_dtype t);
ElementwiseKernel::Dtype node_dtype(ir::DType d);

// elem_offset + add as one monomial, when it is one (both with the same symbols, or
// either zero).
std::optional<rt::DimExpr> add_offsets(const rt::DimExpr& a, const rt::DimExpr& b);

// A tensor in memory: storage plus a strided view, in IR dimension order.
struct View {
  rt::Storage storage = rt::Storage::arena;
  int32_t index = 0;
  int64_t byte_offset = 0;
  rt::DimExpr elem_offset = rt::DimExpr::constant(0);
  kiln_dtype type = KILN_F32;
  std::vector<rt::DimExpr> extents, strides;

  bool dense() const;
  // The same memory seen with `extents` (same element count): strides of groups of dims
  // whose products match, where each group of this view's dims is contiguous within
  // itself (numpy's reshape without a copy). Dims of extent 1 are dropped first. nullopt
  // when the sizes cannot be matched as monomials or a group is not contiguous.
  std::optional<View> reshaped(const std::vector<rt::DimExpr>& to) const;
  // The Halide buffer: dimensions reversed (innermost first).
  rt::BufferDesc halide() const;
};

// What lowering builds across the module: the plan, its kernels, its weights as stored.
class ModuleLowering {
 public:
  ModuleLowering(const ir::Module& m, const LowerOptions& options);

  const ir::Module& m;
  const LowerOptions options;
  LoweredModel out;

  // A dim as the plan's monomial: a constant, a·S, or g times a derived plan symbol for
  // a·S + b (b != 0), added to the plan's symbols the first time it is seen.
  rt::DimExpr dim(const ir::Dim& d);
  int64_t dim_max(const ir::Dim& d) const;
  View dense_view(const ir::TensorType& t, rt::Storage storage, int32_t index, int64_t byte_offset);
  // The weight `name` as stored: as declared, or for a linear's weight (`linear`) laid
  // out as its kernel reads it, transposed or packed in panels of `panel` columns.
  int32_t weight_index(const std::string& name, bool linear, int64_t panel = 0, bool bf16 = false,
                       bool int8 = false);
  int32_t table_index(int64_t rows, int64_t dim);
  // The kernel's index in the plan, added the first time a spec is seen.
  int32_t kernel_index(const KernelSpec& spec);

 private:
  std::map<std::string, int32_t> weights_;  // weight_index's key -> index
};

// Lowering one function: the values in memory so far (`views`), the steps emitted, and
// the helpers the op families share. Ops are lowered in order, each by its kind's
// function (lower.cpp's table), which emits its steps and sets its result's view.
class FunctionLowering {
 public:
  // Describes the parameters and results; fails on what compiled code cannot take.
  FunctionLowering(ModuleLowering& module, const ir::Function& f);

  ModuleLowering& module;
  const ir::Module& m;
  const ir::Function& f;
  rt::FunctionDesc fd;
  std::vector<int> defs;  // passes::def_index
  std::vector<int> uses;  // passes::use_counts
  std::map<ir::ValueId, View> views;
  // The add_layernorm_sum op of each add_layernorm that has one, by the latter's result.
  std::map<ir::ValueId, int> sum_of;
  std::map<ir::ValueId, int32_t> result_index, param_index;
  // Values written in bf16 by the bf16 kernel that computes them (plan_bf16_activations).
  std::set<ir::ValueId> bf16_values;

  rt::DimExpr dim(const ir::Dim& d) const { return module.dim(d); }
  View dense_view(const ir::TensorType& t, rt::Storage storage, int32_t index,
                  int64_t byte_offset) const {
    return module.dense_view(t, storage, index, byte_offset);
  }
  int32_t kernel_index(const KernelSpec& spec) { return module.kernel_index(spec); }

  // An index operand that is a parameter is checked at run time against `limit`.
  void limit_param(ir::ValueId v, const ir::Dim& limit, const char* what,
                   bool allow_minus_one = false);
  // A run-time check lhs <= rhs where either is symbolic (else the type rule checked it).
  void check_le(const ir::Dim& lhs, const ir::Dim& rhs, std::string what);
  // Where a computed value is written: its result buffer, or its arena offset.
  View output_view(const ir::Op& op) const;
  // The view of an operand already in memory.
  const View& view_of(ir::ValueId v, const ir::Op& user) const;
  // Scratch memory past the planned arena, for copies that the plan does not know of
  // (a strided view made dense for a kernel that needs it): each copy gets its own
  // bytes, never reused, so it overlaps nothing the plan placed.
  View scratch(const ir::TensorType& t);
  // A copy kernel: `from` into `to` (same extents, any strides).
  void copy(const View& from, const View& to, const std::string& what);
  // `v` (of type `t`) in dense memory: itself, or a copy in scratch memory.
  View dense(const View& v, const ir::TensorType& t, const std::string& what);
  // A view collapsed to 2-D (inner, rows) for row-wise kernels, or nullopt when its
  // leading dims (those of extent 1 aside) are not evenly strided.
  static std::optional<rt::BufferDesc> rows_view(const View& v, const ir::Op& op);
  // Operand `i` of `op` collapsed to rows for a row-wise kernel, copied to dense memory
  // first when its dims cannot be collapsed as they are.
  rt::BufferDesc rows_arg(const ir::Op& op, size_t i);
  // The output view of `op` seen with the kept shape of a reduction (same bytes: dims
  // of extent 1 inserted), after the output view itself.
  std::pair<View, View> kept_output(const ir::Op& op, const std::vector<bool>& reduced) const;
  // A view (reshape, slice) that the function returns: copied into the caller's buffer
  // where it is defined (its operand is live there), e.g. one of the keys and values a
  // merged projection computes together.
  void copy_if_result(const ir::Op& op);
  // Whether value v is computed inside its readers' elementwise kernel (fuse-elementwise's
  // mark, Op::fused; the verifier's V12 bounds the depth of a group's tree).
  bool inlined(ir::ValueId v) const { return defs[v] >= 0 && f.ops[defs[v]].fused; }
  // Results not computed into their own buffer copied there; the function's plan added.
  void finish();

 private:
  int64_t scratch_base_ = 0, scratch_top_ = 0;
};

// The lowering of one op kind (or family): emits the op's steps into L.fd and sets
// L.views[op.result]. A table in lower.cpp maps each ir::OpKind to one.
using LowerFn = void (*)(FunctionLowering& L, const ir::Op& op);

// activations.cpp: fills L.bf16_values (LowerOptions::bf16_activations), before any op is
// lowered.
void plan_bf16_activations(FunctionLowering& L);
// views.cpp: ops that bind memory without computing (or copy only when strides require).
void lower_weight(FunctionLowering& L, const ir::Op& op);
void lower_sinusoid_table(FunctionLowering& L, const ir::Op& op);
void lower_reshape(FunctionLowering& L, const ir::Op& op);
void lower_slice(FunctionLowering& L, const ir::Op& op);
// linear.cpp: the linear kernel (f32, bf16 or int8 weights). runs_bf16_linear: whether `op`
// is a linear that the bf16 kernel computes (a load-time weight, bf16 weights, the CPU).
bool runs_bf16_linear(const FunctionLowering& L, const ir::Op& op);
void lower_linear(FunctionLowering& L, const ir::Op& op);
void lower_linear_rows(FunctionLowering& L, const ir::Op& op);
// attention.cpp: attention, and incremental decoding's cache write and step attentions.
// runs_bf16_attention: whether `op` is an attention that the bf16 kernel computes.
bool runs_bf16_attention(const FunctionLowering& L, const ir::Op& op);
void lower_attention(FunctionLowering& L, const ir::Op& op);
void lower_cache_write(FunctionLowering& L, const ir::Op& op);
void lower_step_attention(FunctionLowering& L, const ir::Op& op);  // cache_, memory_attention
// norm.cpp: layernorm and add_layernorm (with its sum).
void lower_layernorm(FunctionLowering& L, const ir::Op& op);
void lower_add_layernorm_sum(FunctionLowering& L, const ir::Op& op);
// general.cpp: the general path for ops no fused kernel took.
void lower_matmul(FunctionLowering& L, const ir::Op& op);
// The general matmul kernel, on operands of any strides: a matmul, or a linear whose weight
// is computed at run time (transpose_b: W[N,K], bias, act), or a linear_rows on a GPU
// (transpose_b: W[V,K] read at the rows ids, bias, act).
void lower_general_matmul(FunctionLowering& L, const ir::Op& op, bool transpose_b);
void lower_transpose(FunctionLowering& L, const ir::Op& op);
void lower_concat(FunctionLowering& L, const ir::Op& op);
void lower_softmax(FunctionLowering& L, const ir::Op& op);
void lower_reduce(FunctionLowering& L, const ir::Op& op);  // reduce_sum/mean/max, argmax
void lower_topk(FunctionLowering& L, const ir::Op& op);
void lower_scatter_add(FunctionLowering& L, const ir::Op& op);
// moe.cpp: the sparse mixture-of-experts FFN, a runtime builtin (runtime/builtins.h).
void lower_moe_ffn(FunctionLowering& L, const ir::Op& op);
// elementwise.cpp: one elementwise kernel per group of fuse-elementwise.
void lower_elementwise(FunctionLowering& L, const ir::Op& op);

}  // namespace kiln::codegen::lowering
