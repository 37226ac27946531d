// The C++ DSL: build IR functions with tensors and operators, shape-checked as they
// are built. A misuse (e.g. a matmul of mismatched shapes) throws kiln::Error naming
// the op, the operand types, the place in the user's code and the model scope:
//
//   dsl error at model.cpp:57 in 'encoder.layers.0.ffn': matmul: contraction dims
//   differ: f32[B,S,24] x f32[40,36]
//
// Example:
//   ModelBuilder mb("toy");
//   Dim B = mb.symbol("B", 8), S = mb.symbol("S", 128);
//   FunctionBuilder& f = mb.function("encode");
//   Tensor ids = f.input("src", DType::i64, {B, S});
//   Tensor x = gather(f.weight("emb.weight", {100, 16}), ids);
//   f.output(relu(x), "memory");
//   ir::Module m = mb.finish();  // verified
#pragma once

#include <cstdint>
#include <memory>
#include <source_location>
#include <string>
#include <vector>

#include "ir/ir.h"

// Arithmetic on dims, for shapes such as [B,T+1,D] (a prepended token) and [B,64*T] (a
// symbolic axis merged with constant ones): `T + 1`, `T - 1`, `2 * T`, `T * 64`, `H * Dk`. A
// dim is a constant or an affine function of one symbol (ir::Dim); what is not (S + T, B * T,
// a negative scale) throws kiln::Error naming the dims, e.g. "dim arithmetic: the sum of dims
// S and T: sums of different symbols are not supported".
namespace kiln::ir {
Dim operator+(const Dim& a, const Dim& b);
Dim operator+(const Dim& a, int64_t b);
Dim operator+(int64_t a, const Dim& b);
Dim operator-(const Dim& a, const Dim& b);
Dim operator-(const Dim& a, int64_t b);
Dim operator*(const Dim& a, const Dim& b);
Dim operator*(const Dim& a, int64_t b);
Dim operator*(int64_t a, const Dim& b);
}  // namespace kiln::ir

namespace kiln::dsl {

using ir::Dim;
using ir::DType;
using Loc = std::source_location;

class FunctionBuilder;

// A value under construction in one FunctionBuilder. Cheap to copy.
class Tensor {
 public:
  Tensor() = default;
  Tensor(FunctionBuilder* fb, ir::ValueId id) : fb_(fb), id_(id) {}

  const ir::TensorType& type() const;
  const std::vector<Dim>& shape() const { return type().shape; }
  DType dtype() const { return type().dtype; }
  int64_t rank() const { return type().rank(); }
  const Dim& dim(int64_t axis) const;  // negative axes count from the end
  ir::ValueId id() const { return id_; }
  FunctionBuilder* builder() const { return fb_; }
  bool valid() const { return fb_ != nullptr; }

 private:
  FunctionBuilder* fb_ = nullptr;
  ir::ValueId id_ = -1;
};

// Builds one function (entry point) of the module.
class FunctionBuilder {
 public:
  FunctionBuilder(ir::Module* module, size_t index) : module_(module), index_(index) {}

  Tensor input(const std::string& name, DType dtype, std::vector<Dim> shape,
               Loc loc = Loc::current());
  // Declares (or reuses) a module weight of static shape and returns it as a value.
  Tensor weight(const std::string& name, std::vector<int64_t> shape, Loc loc = Loc::current());
  // A scalar constant (rank 0) of `dtype`.
  Tensor constant(double value, DType dtype = DType::f32);
  void output(Tensor value, const std::string& name, Loc loc = Loc::current());

  // Appends an op after checking it with the op's type rule; `declared` is required
  // for ops whose result type is not implied by the operands (see op_types.h).
  Tensor emit(ir::OpKind kind, const std::vector<Tensor>& operands, ir::Attrs attrs = {},
              const ir::TensorType* declared = nullptr, Loc loc = Loc::current());

  // A scope name for diagnostics ("encoder.layers.0.self_attn"); use ScopeGuard.
  void push_scope(std::string name) { scopes_.push_back(std::move(name)); }
  void pop_scope() { scopes_.pop_back(); }
  std::string scope() const;

  ir::Function& function() { return module_->functions[index_]; }
  const ir::Module& module() const { return *module_; }

  [[noreturn]] void error(const Loc& loc, const std::string& message) const;

 private:
  ir::Module* module_;
  size_t index_;
  std::vector<std::string> scopes_;
  std::vector<std::pair<std::string, ir::ValueId>> weight_cache_;
};

// Pushes a scope name for the lifetime of the guard.
class ScopeGuard {
 public:
  ScopeGuard(FunctionBuilder& fb, std::string name) : fb_(fb) { fb_.push_scope(std::move(name)); }
  ~ScopeGuard() { fb_.pop_scope(); }
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;

 private:
  FunctionBuilder& fb_;
};

// Builds a module: symbols, config, functions.
class ModelBuilder {
 public:
  explicit ModelBuilder(std::string name);
  Dim symbol(const std::string& name, int64_t max);
  void set_config(const std::string& key, const std::string& value);
  FunctionBuilder& function(const std::string& name);
  // Verifies and returns the module; throws kiln::Error if it is invalid.
  ir::Module finish();

 private:
  std::unique_ptr<ir::Module> module_;
  std::vector<std::unique_ptr<FunctionBuilder>> builders_;
};

// Elementwise arithmetic with numpy broadcasting. A double operand becomes a scalar
// constant of the tensor's dtype.
Tensor add(Tensor a, Tensor b, Loc loc = Loc::current());
Tensor sub(Tensor a, Tensor b, Loc loc = Loc::current());
Tensor mul(Tensor a, Tensor b, Loc loc = Loc::current());
Tensor div(Tensor a, Tensor b, Loc loc = Loc::current());
Tensor maximum(Tensor a, Tensor b, Loc loc = Loc::current());
Tensor minimum(Tensor a, Tensor b, Loc loc = Loc::current());

// An operand of the operators below: a Tensor and the place of the expression it is used
// in. An operator cannot take a defaulted std::source_location; the defaulted argument of
// this conversion is evaluated where the operand is converted, in the user's expression,
// so a misuse (`x + y` of shapes that do not broadcast) is reported at the user's line.
struct Operand {
  Operand(Tensor t, Loc place = Loc::current()) : tensor(t), loc(place) {}
  Tensor tensor;
  Loc loc;
};
Tensor operator+(Operand a, Operand b);
Tensor operator-(Operand a, Operand b);
Tensor operator*(Operand a, Operand b);
Tensor operator/(Operand a, Operand b);
// Scalar arithmetic on either side: `x + 1.0`, `1.0 - x`, `2.0 * x`, `1.0 / x`.
Tensor operator+(Operand a, double b);
Tensor operator-(Operand a, double b);
Tensor operator*(Operand a, double b);
Tensor operator/(Operand a, double b);
Tensor operator+(double a, Operand b);
Tensor operator-(double a, Operand b);
Tensor operator*(double a, Operand b);
Tensor operator/(double a, Operand b);
Tensor operator-(Operand x);  // neg(x)

Tensor eq(Tensor a, Tensor b, Loc loc = Loc::current());
Tensor ne(Tensor a, Tensor b, Loc loc = Loc::current());
Tensor lt(Tensor a, Tensor b, Loc loc = Loc::current());
Tensor le(Tensor a, Tensor b, Loc loc = Loc::current());
Tensor gt(Tensor a, Tensor b, Loc loc = Loc::current());
Tensor ge(Tensor a, Tensor b, Loc loc = Loc::current());
Tensor logical_and(Tensor a, Tensor b, Loc loc = Loc::current());
Tensor logical_or(Tensor a, Tensor b, Loc loc = Loc::current());
Tensor logical_not(Tensor a, Loc loc = Loc::current());
Tensor relu(Tensor x, Loc loc = Loc::current());
Tensor neg(Tensor x, Loc loc = Loc::current());
Tensor abs(Tensor x, Loc loc = Loc::current());  // integers wrap: |most negative| is itself
// Math functions of f32 tensors, as PyTorch defines them (rsqrt(x) = 1/√x; sin and cos in
// radians; sign(x) is -1, 0 or +1, NaN for NaN):
//   sigmoid(x) = 1 / (1 + exp(-x)), silu(x) = x · sigmoid(x),
//   gelu(x) = 0.5 · x · (1 + erf(x / √2))                     (torch GELU()),
//   gelu_tanh(x) = 0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))
//                                                            (torch GELU(approximate='tanh')).
Tensor exp(Tensor x, Loc loc = Loc::current());
Tensor log(Tensor x, Loc loc = Loc::current());
Tensor sqrt(Tensor x, Loc loc = Loc::current());
Tensor rsqrt(Tensor x, Loc loc = Loc::current());
Tensor sin(Tensor x, Loc loc = Loc::current());
Tensor cos(Tensor x, Loc loc = Loc::current());
Tensor sign(Tensor x, Loc loc = Loc::current());
Tensor tanh(Tensor x, Loc loc = Loc::current());
Tensor erf(Tensor x, Loc loc = Loc::current());
Tensor sigmoid(Tensor x, Loc loc = Loc::current());
Tensor gelu(Tensor x, Loc loc = Loc::current());
Tensor gelu_tanh(Tensor x, Loc loc = Loc::current());
Tensor silu(Tensor x, Loc loc = Loc::current());
Tensor select(Tensor cond, Tensor a, Tensor b, Loc loc = Loc::current());
Tensor cast(Tensor x, DType dtype, Loc loc = Loc::current());

// Scalar constant in the builder of `like`, with `like`'s dtype unless given.
Tensor scalar(const Tensor& like, double value);
Tensor scalar(const Tensor& like, double value, DType dtype);

Tensor gather(Tensor table, Tensor ids, Loc loc = Loc::current());
Tensor transpose(Tensor x, std::vector<int64_t> perm, Loc loc = Loc::current());
Tensor reshape(Tensor x, std::vector<Dim> shape, Loc loc = Loc::current());
// x broadcast to `shape` (numpy rules, torch's x.expand(shape)): no copy where it fuses.
Tensor expand(Tensor x, std::vector<Dim> shape, Loc loc = Loc::current());
Tensor slice(Tensor x, int64_t axis, int64_t start, Dim extent, Loc loc = Loc::current());
Tensor concat(const std::vector<Tensor>& xs, int64_t axis, Loc loc = Loc::current());
Tensor matmul(Tensor a, Tensor b, Loc loc = Loc::current());
Tensor softmax(Tensor x, int64_t axis, Loc loc = Loc::current());
Tensor layernorm(Tensor x, Tensor gamma, Tensor beta, double eps, Loc loc = Loc::current());
// The variants of layernorm (ir.h): `unbiased` divides the variance by D - 1 (torch's
// x.std(-1); a last dim of 1 is an error), `eps_outside` normalizes by sqrt(var) + eps
// instead of sqrt(var + eps). The defaults are nn.LayerNorm's, the op without attributes.
struct LayerNormOptions {
  double eps = 1e-5;
  bool unbiased = false;
  bool eps_outside = false;
};
Tensor layernorm(Tensor x, Tensor gamma, Tensor beta, const LayerNormOptions& options,
                 Loc loc = Loc::current());
// RMSNorm over the last axis as one op (layernorm {rms = 1}): gamma · x / sqrt(mean(x²) + eps),
// gamma [D]. Written out instead (x * rsqrt(mean(x*x, -1, keepdim) + eps) * w and the other
// spellings of passes/fuse_rmsnorm.h), it becomes this op in the default pipeline.
Tensor rmsnorm(Tensor x, Tensor gamma, double eps, Loc loc = Loc::current());
Tensor reduce_sum(Tensor x, std::vector<int64_t> axes, bool keepdims = false,
                  Loc loc = Loc::current());
Tensor reduce_max(Tensor x, std::vector<int64_t> axes, bool keepdims = false,
                  Loc loc = Loc::current());
Tensor reduce_mean(Tensor x, std::vector<int64_t> axes, bool keepdims = false,
                   Loc loc = Loc::current());
Tensor argmax(Tensor x, int64_t axis, Loc loc = Loc::current());

// Indexing by computed indices (i64). take_along_axis: result[i] = x[i with i[axis] =
// ids[i]] (torch.gather(x, axis, ids); ids of x's rank, its other dims equal to x's).
// scatter_add: base with result[j] += src[i] where j is i with j[axis] = ids[i]
// (torch.scatter_add(base, axis, ids, src); ids of src's shape). topk: the indices of the k
// largest elements along the last axis, largest first, ties to the lower index
// (torch.topk(x, k).indices); the values are take_along_axis(x, topk(x, k), -1).
Tensor take_along_axis(Tensor x, Tensor ids, int64_t axis, Loc loc = Loc::current());
Tensor scatter_add(Tensor base, Tensor ids, Tensor src, int64_t axis, Loc loc = Loc::current());
Tensor topk(Tensor x, int64_t k, Loc loc = Loc::current());
// A sparse mixture-of-experts SwiGLU FFN (ir/ops.def, moe_ffn): x [..., D], ids i64 [..., K]
// (each row's experts), gates f32 [..., K] (their weights), and per expert e the three
// weights {w1 [F, D], w3 [F, D], w2 [D, F]}: result[t] = Σ_k gates[t,k] ·
// w2_e(silu(w1_e x[t]) ⊙ w3_e x[t]), e = ids[t,k]; only the chosen experts are computed.
struct ExpertWeights {
  Tensor w1, w3, w2;
};
Tensor moe_ffn(Tensor x, Tensor ids, Tensor gates, const std::vector<ExpertWeights>& experts,
               Loc loc = Loc::current());

// Incremental decoding (see ir.h): the cache with rows [pos, n, :] replaced by x[n, 0, :],
// and single-query attention over a cache (through a row table) or over encoder memory
// (through each query's source row, with a key padding mask).
Tensor cache_write(Tensor cache, Tensor x, Tensor pos, Loc loc = Loc::current());
// A prompt pass: the cache with rows [l, n, :] replaced by x[n, l, :] for every l < L.
Tensor cache_write(Tensor cache, Tensor x, Loc loc = Loc::current());
Tensor cache_attention(Tensor q, Tensor k, Tensor v, Tensor rows, int64_t heads, double scale,
                       Loc loc = Loc::current());
Tensor memory_attention(Tensor q, Tensor k, Tensor v, Tensor src_row, Tensor key_pad, int64_t heads,
                        double scale, Loc loc = Loc::current());

// Sources built in `fb`.
Tensor sinusoid_table(FunctionBuilder& fb, int64_t rows, int64_t dim, Loc loc = Loc::current());
Tensor iota(FunctionBuilder& fb, DType dtype, std::vector<Dim> shape, int64_t axis,
            Loc loc = Loc::current());

}  // namespace kiln::dsl
