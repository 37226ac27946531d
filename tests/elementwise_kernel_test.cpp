// Tests for the elementwise kernel (codegen/elementwise_kernel.cpp): expression trees as
// the compiler fuses them (embedding, padding and causal masks, broadcasting, selects,
// comparisons, casts, integer and float arithmetic), JIT-compiled for the host and for
// AVX2 and compared with the reference interpreter running the same ops.
//
// Input buffers of rank >= 2 are views with padded rows (the padding is garbage), so every
// kernel runs on strided inputs. Integer and bool results must match exactly; f32 results
// within 1e-6 relative (the kernel may contract a multiply and an add into an FMA).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "codegen/halide_kernels.h"
#include "codegen/kernels.h"
#include "codegen/lower.h"
#include "ir/interpreter.h"
#include "ir/ir.h"
#include "ir/parser.h"
#include "jit_kernel.h"
#include "passes/pipeline.h"
#include "support/error.h"

namespace kiln {
namespace {

using codegen::ElementwiseKernel;
using Dtype = ElementwiseKernel::Dtype;
using Node = ElementwiseKernel::Node;
using ir::DType;
using ir::OpKind;

using jit::JitKernel;
using jit::kAvx2Target;
using jit::target_named;

// ---------------------------------------------------------------------------------
// Kernel specs

std::vector<bool> no_broadcast(int rank) { return std::vector<bool>(rank, false); }

Node input(int index, Dtype dtype, int rank, std::vector<bool> broadcast = {}) {
  Node n;
  n.kind = Node::Kind::input;
  n.input = index;
  n.dtype = dtype;
  n.rank = rank;
  n.broadcast = broadcast.empty() ? no_broadcast(rank) : std::move(broadcast);
  return n;
}

Node constant(double value, Dtype dtype) {
  Node n;
  n.kind = Node::Kind::constant;
  n.value = value;
  n.dtype = dtype;
  return n;
}

Node iota(int64_t axis, int rank) {
  Node n;
  n.op = OpKind::iota;
  n.axis = axis;
  n.dtype = Dtype::i64;
  n.rank = rank;
  n.broadcast = no_broadcast(rank);
  return n;
}

Node op(const char* name, std::vector<int> operands, Dtype dtype, int rank) {
  Node n;
  n.op = *ir::parse_op_kind(name);
  n.operands = std::move(operands);
  n.dtype = dtype;
  n.rank = rank;
  n.broadcast = no_broadcast(rank);
  return n;
}

Node gather(int table, int ids, int rank, int64_t rows) {
  Node n = op("gather", {table, ids}, Dtype::f32, rank);
  n.table_rows = rows;
  return n;
}

ElementwiseKernel kernel_of(std::vector<Node> nodes, int out_rank) {
  ElementwiseKernel k;
  k.nodes = std::move(nodes);
  k.out_rank = out_rank;
  return k;
}

// ---------------------------------------------------------------------------------
// Reference graphs

ir::Dim C(int64_t v) { return ir::Dim::constant(v); }
const ir::Dim kB = ir::Dim::sym("B");
const ir::Dim kL = ir::Dim::sym("L");
ir::TensorType T(DType dtype, std::vector<ir::Dim> shape) { return {dtype, std::move(shape)}; }

// One function, built op by op, in a module declaring the symbols B and L.
class Graph {
 public:
  Graph() {
    m_.name = "test";
    m_.symbols = {{"B", 8}, {"L", 256}};
    f_.name = "f";
  }
  ir::ValueId param(const std::string& name, ir::TensorType type) {
    return f_.add_param(name, std::move(type));
  }
  ir::ValueId op(OpKind kind, std::vector<ir::ValueId> operands, ir::TensorType type,
                 ir::Attrs attrs = {}) {
    return f_.add_op(kind, std::move(operands), std::move(type), std::move(attrs));
  }
  ir::Module finish(ir::ValueId result) {
    f_.results = {result};
    ir::Module m = m_;
    m.functions.push_back(f_);
    return m;
  }

 private:
  ir::Module m_;
  ir::Function f_;
};

// ---------------------------------------------------------------------------------
// Data

Halide::Type halide_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return Halide::Float(32);
    case DType::boolean:
      return Halide::UInt(8);
    default:
      return Halide::Int(64);
  }
}

// The Halide dims (reversed) of a flat row-major index into `shape`.
std::vector<int> halide_coords(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int> coords(shape.size());
  for (size_t j = 0; j < shape.size(); ++j) {
    const int64_t extent = shape[shape.size() - 1 - j];
    coords[j] = static_cast<int>(flat % extent);
    flat /= extent;
  }
  return coords;
}

// Address of element `flat` (row-major over the IR shape) of `b`.
void* element(const Halide::Buffer<>& b, int64_t flat, const std::vector<int64_t>& shape) {
  const std::vector<int> coords = halide_coords(flat, shape);
  int64_t offset = 0;
  for (size_t j = 0; j < coords.size(); ++j) offset += int64_t{coords[j]} * b.dim(j).stride();
  return static_cast<uint8_t*>(b.raw_buffer()->host) + offset * b.type().bytes();
}

// The tensor as a Halide buffer. Rank >= 2: rows padded by 3 elements of garbage.
Halide::Buffer<> to_buffer(const ir::Tensor& t) {
  std::vector<int> sizes;
  for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) sizes.push_back(*it);
  std::vector<int> alloc = sizes;
  if (alloc.size() >= 2) alloc[0] += 3;
  Halide::Buffer<> full(halide_type(t.dtype), alloc);
  std::memset(full.raw_buffer()->host, 0xff, full.raw_buffer()->size_in_bytes());
  Halide::Buffer<> b =
      alloc.size() >= 2 ? Halide::Buffer<>(full.get()->cropped(0, 0, sizes[0])) : full;
  for (int64_t i = 0; i < t.numel(); ++i) {
    void* p = element(b, i, t.shape);
    if (t.dtype == DType::f32)
      std::memcpy(p, &t.f[i], sizeof(float));
    else if (t.dtype == DType::boolean)
      *static_cast<uint8_t*>(p) = static_cast<uint8_t>(t.ints[i]);
    else
      std::memcpy(p, &t.ints[i], sizeof(int64_t));
  }
  return b;
}

// Runs `kernel` on the first `kernel_inputs` of `inputs` and the module's function on all
// of them (the rest only bind symbols), and compares the results.
void check(const JitKernel& kernel, const ir::Module& m, const std::vector<ir::Tensor>& inputs,
           size_t kernel_inputs) {
  const ir::Tensor want = ir::interpret(m, m.functions[0], {}, inputs).at(0);
  std::vector<int> sizes;
  for (auto it = want.shape.rbegin(); it != want.shape.rend(); ++it) sizes.push_back(*it);
  Halide::Buffer<> out(halide_type(want.dtype), sizes);
  std::vector<Halide::Buffer<>> buffers;
  for (size_t i = 0; i < kernel_inputs; ++i) buffers.push_back(to_buffer(inputs[i]));
  buffers.push_back(out);
  ASSERT_EQ(kernel.run(buffers), 0);
  int mismatches = 0;
  for (int64_t i = 0; i < want.numel() && mismatches < 5; ++i) {
    const void* p = element(out, i, want.shape);
    if (want.dtype == DType::f32) {
      float got;
      std::memcpy(&got, p, sizeof got);
      const float w = want.f[i];
      const bool same = (std::isnan(got) && std::isnan(w)) || got == w ||
                        std::fabs(got - w) <= 1e-6f * std::max(1.0f, std::fabs(w));
      if (!same) {
        ++mismatches;
        ADD_FAILURE() << "element " << i << " of " << want.type_string() << ": got " << got
                      << ", want " << w;
      }
    } else {
      int64_t got;
      if (want.dtype == DType::boolean)
        got = *static_cast<const uint8_t*>(p);
      else
        std::memcpy(&got, p, sizeof got);
      if (got != want.ints[i]) {
        ++mismatches;
        ADD_FAILURE() << "element " << i << " of " << want.type_string() << ": got " << got
                      << ", want " << want.ints[i];
      }
    }
  }
}

ir::Tensor random_f32(std::mt19937& rng, std::vector<int64_t> shape, float lo, float hi) {
  ir::Tensor t = ir::Tensor::zeros(DType::f32, std::move(shape));
  std::uniform_real_distribution<float> dist(lo, hi);
  for (float& v : t.f) v = dist(rng);
  return t;
}

ir::Tensor random_ints(std::mt19937& rng, DType dtype, std::vector<int64_t> shape, int64_t lo,
                       int64_t hi) {
  ir::Tensor t = ir::Tensor::zeros(dtype, std::move(shape));
  std::uniform_int_distribution<int64_t> dist(lo, hi);
  for (int64_t& v : t.ints) v = dist(rng);
  return t;
}

// Values drawn from a few, so that comparisons see ties.
ir::Tensor choice_f32(std::mt19937& rng, std::vector<int64_t> shape,
                      const std::vector<float>& values) {
  ir::Tensor t = ir::Tensor::zeros(DType::f32, std::move(shape));
  std::uniform_int_distribution<size_t> dist(0, values.size() - 1);
  for (float& v : t.f) v = values[dist(rng)];
  return t;
}

// ---------------------------------------------------------------------------------
// Tests, for each target

class ElementwiseKernelTest : public ::testing::TestWithParam<std::string> {
 protected:
  Halide::Target target() const { return target_named(GetParam()); }
  JitKernel jit(const ElementwiseKernel& spec) const {
    return JitKernel(codegen::build_elementwise(spec, target()), target());
  }
};

// The spec of the embedding: add(mul(gather(table, ids), sqrt(D)), pe), pe [L, D] broadcast
// over the batch. Inputs: table [V, D], ids [B, L], pe [L, D].
ElementwiseKernel embedding_spec(int64_t vocab, int64_t d) {
  return kernel_of(
      {input(0, Dtype::f32, 2), input(1, Dtype::i64, 2), gather(0, 1, 3, vocab),
       constant(std::sqrt(static_cast<double>(d)), Dtype::f32), op("mul", {2, 3}, Dtype::f32, 3),
       input(2, Dtype::f32, 2), op("add", {4, 5}, Dtype::f32, 3)},
      3);
}

ir::Module embedding_module(int64_t vocab, int64_t d) {
  Graph g;
  const ir::ValueId table = g.param("table", T(DType::f32, {C(vocab), C(d)}));
  const ir::ValueId ids = g.param("ids", T(DType::i64, {kB, kL}));
  const ir::ValueId pe = g.param("pe", T(DType::f32, {kL, C(d)}));
  const ir::ValueId e = g.op(OpKind::gather, {table, ids}, T(DType::f32, {kB, kL, C(d)}));
  const ir::ValueId scale =
      g.op(OpKind::constant, {}, T(DType::f32, {}), {{"value", std::sqrt(static_cast<double>(d))}});
  const ir::ValueId scaled = g.op(OpKind::mul, {e, scale}, T(DType::f32, {kB, kL, C(d)}));
  return g.finish(g.op(OpKind::add, {scaled, pe}, T(DType::f32, {kB, kL, C(d)})));
}

TEST_P(ElementwiseKernelTest, Embedding) {
  const int64_t vocab = 37;
  for (int64_t d : {24, 7}) {
    const JitKernel kernel = jit(embedding_spec(vocab, d));
    const ir::Module m = embedding_module(vocab, d);
    std::mt19937 rng(static_cast<uint32_t>(d));
    for (int64_t b : {1, 3}) {
      for (int64_t l : {1, 7, 33, 129}) {
        SCOPED_TRACE(testing::Message() << "D " << d << " B " << b << " L " << l);
        check(kernel, m,
              {random_f32(rng, {vocab, d}, -1, 1),
               random_ints(rng, DType::i64, {b, l}, 0, vocab - 1), random_f32(rng, {l, d}, -1, 1)},
              3);
      }
    }
  }
}

// Ids out of range read the first or the last row instead of memory outside the table
// (the runtime rejects such ids before the kernel runs).
TEST_P(ElementwiseKernelTest, EmbeddingClampsIds) {
  const int64_t vocab = 5, d = 7;
  const JitKernel kernel = jit(embedding_spec(vocab, d));
  std::mt19937 rng(1);
  const ir::Tensor table = random_f32(rng, {vocab, d}, -1, 1);
  const ir::Tensor pe = random_f32(rng, {3, d}, -1, 1);
  const ir::Tensor ids = ir::Tensor::from_ints(DType::i64, {1, 3}, {-7, 2, 1000});
  const ir::Tensor clamped = ir::Tensor::from_ints(DType::i64, {1, 3}, {0, 2, vocab - 1});
  const ir::Module m = embedding_module(vocab, d);
  const ir::Tensor want = ir::interpret(m, m.functions[0], {}, {table, clamped, pe}).at(0);
  Halide::Buffer<float> out(static_cast<int>(d), 3, 1);
  ASSERT_EQ(kernel.run({to_buffer(table), to_buffer(ids), to_buffer(pe), out}), 0);
  for (int l = 0; l < 3; ++l)
    for (int c = 0; c < d; ++c) EXPECT_FLOAT_EQ(out(c, l, 0), want.f[l * d + c]) << l << "," << c;
}

// A table with fewer rows than the spec declares is rejected, not read past its end.
TEST_P(ElementwiseKernelTest, EmbeddingRejectsShortTable) {
  const JitKernel kernel = jit(embedding_spec(37, 7));
  Halide::Buffer<float> table(7, 20), pe(7, 3), out(7, 3, 2);
  Halide::Buffer<int64_t> ids(3, 2);
  ids.fill(0);
  EXPECT_NE(kernel.run({table, ids, pe, out}), 0);
}

TEST_P(ElementwiseKernelTest, PaddingMask) {
  const JitKernel kernel = jit(kernel_of(
      {input(0, Dtype::i64, 2), constant(1, Dtype::i64), op("eq", {0, 1}, Dtype::u8, 2)}, 2));
  Graph g;
  const ir::ValueId ids = g.param("ids", T(DType::i64, {kB, kL}));
  const ir::ValueId pad = g.op(OpKind::constant, {}, T(DType::i64, {}), {{"value", int64_t{1}}});
  const ir::Module m = g.finish(g.op(OpKind::eq, {ids, pad}, T(DType::boolean, {kB, kL})));
  std::mt19937 rng(2);
  for (int64_t b : {1, 3}) {
    for (int64_t l : {1, 7, 33, 129}) {
      SCOPED_TRACE(testing::Message() << "B " << b << " L " << l);
      check(kernel, m, {random_ints(rng, DType::i64, {b, l}, 0, 3)}, 1);
    }
  }
}

// Broadcasting: an extent-1 dim in the middle ([B, 1, D]) and in front ([1, L, D]), and a
// lower-rank operand aligned to the right ([D]).
TEST_P(ElementwiseKernelTest, BroadcastingWithExtentOneDims) {
  const int64_t d = 7;
  const JitKernel kernel = jit(kernel_of(
      {input(0, Dtype::f32, 3, {false, true, false}), input(1, Dtype::f32, 3),
       op("add", {0, 1}, Dtype::f32, 3), input(2, Dtype::f32, 1), op("sub", {2, 3}, Dtype::f32, 3),
       input(3, Dtype::f32, 3, {true, false, false}), op("mul", {4, 5}, Dtype::f32, 3)},
      3));
  Graph g;
  const ir::TensorType out = T(DType::f32, {kB, kL, C(d)});
  const ir::ValueId a = g.param("a", T(DType::f32, {kB, C(1), C(d)}));
  const ir::ValueId b = g.param("b", out);
  const ir::ValueId c = g.param("c", T(DType::f32, {C(d)}));
  const ir::ValueId e = g.param("e", T(DType::f32, {C(1), kL, C(d)}));
  const ir::ValueId sum = g.op(OpKind::add, {a, b}, out);
  const ir::ValueId diff = g.op(OpKind::sub, {sum, c}, out);
  const ir::Module m = g.finish(g.op(OpKind::mul, {diff, e}, out));
  std::mt19937 rng(3);
  for (int64_t nb : {1, 3}) {
    for (int64_t l : {1, 7, 33}) {
      SCOPED_TRACE(testing::Message() << "B " << nb << " L " << l);
      check(kernel, m,
            {random_f32(rng, {nb, 1, d}, -1, 1), random_f32(rng, {nb, l, d}, -1, 1),
             random_f32(rng, {d}, -1, 1), random_f32(rng, {1, l, d}, -1, 1)},
            4);
    }
  }
}

// Rank 4, with a rank-3 operand broadcast in two dims.
TEST_P(ElementwiseKernelTest, RankFour) {
  const JitKernel kernel =
      jit(kernel_of({input(0, Dtype::f32, 4), input(1, Dtype::f32, 3, {false, true, false}),
                     op("add", {0, 1}, Dtype::f32, 4)},
                    4));
  Graph g;
  const ir::TensorType out = T(DType::f32, {C(2), kB, kL, C(5)});
  const ir::ValueId x = g.param("x", out);
  const ir::ValueId y = g.param("y", T(DType::f32, {kB, C(1), C(5)}));
  const ir::Module m = g.finish(g.op(OpKind::add, {x, y}, out));
  std::mt19937 rng(4);
  for (int64_t l : {1, 9}) {
    check(kernel, m, {random_f32(rng, {2, 3, l, 5}, -1, 1), random_f32(rng, {3, 1, 5}, -1, 1)}, 2);
  }
}

// Every comparison, on f32 and on i64 operands with ties: bit k of the i64 result is
// comparison k, through casts of the bools to i64.
TEST_P(ElementwiseKernelTest, Comparisons) {
  const std::vector<std::pair<const char*, OpKind>> comparisons{
      {"eq", OpKind::eq}, {"ne", OpKind::ne}, {"lt", OpKind::lt},
      {"le", OpKind::le}, {"gt", OpKind::gt}, {"ge", OpKind::ge}};
  for (Dtype dtype : {Dtype::f32, Dtype::i64}) {
    const DType ir_dtype = dtype == Dtype::f32 ? DType::f32 : DType::i64;
    std::vector<Node> nodes{input(0, dtype, 2), input(1, dtype, 2)};
    Graph g;
    const ir::TensorType in = T(ir_dtype, {kB, kL});
    const ir::ValueId x = g.param("x", in);
    const ir::ValueId y = g.param("y", in);
    int acc = -1;
    ir::ValueId ir_acc = -1;
    for (size_t k = 0; k < comparisons.size(); ++k) {
      const int base = static_cast<int>(nodes.size());
      nodes.push_back(op(comparisons[k].first, {0, 1}, Dtype::u8, 2));
      nodes.push_back(op("cast", {base}, Dtype::i64, 2));
      nodes.push_back(constant(static_cast<double>(int64_t{1} << k), Dtype::i64));
      nodes.push_back(op("mul", {base + 1, base + 2}, Dtype::i64, 2));
      const ir::ValueId cmp = g.op(comparisons[k].second, {x, y}, T(DType::boolean, {kB, kL}));
      const ir::ValueId as_int = g.op(OpKind::cast, {cmp}, T(DType::i64, {kB, kL}));
      const ir::ValueId bit =
          g.op(OpKind::constant, {}, T(DType::i64, {}), {{"value", int64_t{1} << k}});
      const ir::ValueId term = g.op(OpKind::mul, {as_int, bit}, T(DType::i64, {kB, kL}));
      if (acc < 0) {
        acc = base + 3;
        ir_acc = term;
      } else {
        nodes.push_back(op("add", {acc, base + 3}, Dtype::i64, 2));
        acc = static_cast<int>(nodes.size()) - 1;
        ir_acc = g.op(OpKind::add, {ir_acc, term}, T(DType::i64, {kB, kL}));
      }
    }
    const JitKernel kernel = jit(kernel_of(nodes, 2));
    const ir::Module m = g.finish(ir_acc);
    std::mt19937 rng(5);
    for (int64_t l : {1, 7, 33}) {
      SCOPED_TRACE(testing::Message() << (dtype == Dtype::f32 ? "f32" : "i64") << " L " << l);
      if (dtype == Dtype::f32) {
        const std::vector<float> values{-1.0f, -0.5f, 0.0f, 0.5f, 1.0f};
        check(kernel, m, {choice_f32(rng, {3, l}, values), choice_f32(rng, {3, l}, values)}, 2);
      } else {
        check(kernel, m,
              {random_ints(rng, DType::i64, {3, l}, -2, 2),
               random_ints(rng, DType::i64, {3, l}, -2, 2)},
              2);
      }
    }
  }
}

// select(logical_or(logical_and(gt(x, y), ne(x, 0)), logical_not(le(y, 0))), maximum(x, y),
// neg(x)).
TEST_P(ElementwiseKernelTest, SelectAndLogic) {
  const JitKernel kernel =
      jit(kernel_of({input(0, Dtype::f32, 2), input(1, Dtype::f32, 2), constant(0, Dtype::f32),
                     op("gt", {0, 1}, Dtype::u8, 2), op("ne", {0, 2}, Dtype::u8, 2),
                     op("logical_and", {3, 4}, Dtype::u8, 2), op("le", {1, 2}, Dtype::u8, 2),
                     op("logical_not", {6}, Dtype::u8, 2), op("logical_or", {5, 7}, Dtype::u8, 2),
                     op("maximum", {0, 1}, Dtype::f32, 2), op("neg", {0}, Dtype::f32, 2),
                     op("select", {8, 9, 10}, Dtype::f32, 2)},
                    2));
  Graph g;
  const ir::TensorType f = T(DType::f32, {kB, kL});
  const ir::TensorType b = T(DType::boolean, {kB, kL});
  const ir::ValueId x = g.param("x", f);
  const ir::ValueId y = g.param("y", f);
  const ir::ValueId zero = g.op(OpKind::constant, {}, T(DType::f32, {}), {{"value", 0.0}});
  const ir::ValueId gt = g.op(OpKind::gt, {x, y}, b);
  const ir::ValueId ne = g.op(OpKind::ne, {x, zero}, b);
  const ir::ValueId both = g.op(OpKind::logical_and, {gt, ne}, b);
  const ir::ValueId le = g.op(OpKind::le, {y, zero}, b);
  const ir::ValueId nle = g.op(OpKind::logical_not, {le}, b);
  const ir::ValueId cond = g.op(OpKind::logical_or, {both, nle}, b);
  const ir::ValueId mx = g.op(OpKind::maximum, {x, y}, f);
  const ir::ValueId neg = g.op(OpKind::neg, {x}, f);
  const ir::Module m = g.finish(g.op(OpKind::select, {cond, mx, neg}, f));
  std::mt19937 rng(6);
  const std::vector<float> values{-1.5f, -0.25f, 0.0f, 0.25f, 2.0f};
  for (int64_t l : {1, 7, 33, 129})
    check(kernel, m, {choice_f32(rng, {2, l}, values), choice_f32(rng, {2, l}, values)}, 2);
}

// Casts: f32 -> i64 truncates toward zero, -> bool is "nonzero", and back.
TEST_P(ElementwiseKernelTest, Casts) {
  const std::vector<float> values{-7.9f, -2.5f, -1.0f, -0.5f, 0.0f, 0.3f, 1.0f, 2.7f, 9.5f};
  std::mt19937 rng(7);
  const ir::TensorType f = T(DType::f32, {kL});
  const ir::TensorType i = T(DType::i64, {kL});
  const ir::TensorType b = T(DType::boolean, {kL});
  {  // f32 -> i64
    const JitKernel kernel =
        jit(kernel_of({input(0, Dtype::f32, 1), op("cast", {0}, Dtype::i64, 1)}, 1));
    Graph g;
    const ir::Module m = g.finish(g.op(OpKind::cast, {g.param("x", f)}, i));
    for (int64_t l : {1, 9, 33}) check(kernel, m, {choice_f32(rng, {l}, values)}, 1);
  }
  {  // f32 -> bool
    const JitKernel kernel =
        jit(kernel_of({input(0, Dtype::f32, 1), op("cast", {0}, Dtype::u8, 1)}, 1));
    Graph g;
    const ir::Module m = g.finish(g.op(OpKind::cast, {g.param("x", f)}, b));
    for (int64_t l : {1, 9, 33}) check(kernel, m, {choice_f32(rng, {l}, values)}, 1);
  }
  {  // add(cast f32 (cast i64 x), cast f32 (cast bool x)), with x f32
    const JitKernel kernel =
        jit(kernel_of({input(0, Dtype::f32, 1), op("cast", {0}, Dtype::i64, 1),
                       op("cast", {1}, Dtype::f32, 1), op("cast", {0}, Dtype::u8, 1),
                       op("cast", {3}, Dtype::f32, 1), op("add", {2, 4}, Dtype::f32, 1)},
                      1));
    Graph g;
    const ir::ValueId x = g.param("x", f);
    const ir::ValueId a = g.op(OpKind::cast, {g.op(OpKind::cast, {x}, i)}, f);
    const ir::ValueId c = g.op(OpKind::cast, {g.op(OpKind::cast, {x}, b)}, f);
    const ir::Module m = g.finish(g.op(OpKind::add, {a, c}, f));
    for (int64_t l : {1, 9, 33}) check(kernel, m, {choice_f32(rng, {l}, values)}, 1);
  }
  {  // i64 -> bool -> i64, i64 -> f32
    const JitKernel kernel = jit(kernel_of(
        {input(0, Dtype::i64, 1), op("cast", {0}, Dtype::u8, 1), op("cast", {1}, Dtype::i64, 1),
         op("add", {0, 2}, Dtype::i64, 1), op("cast", {3}, Dtype::f32, 1)},
        1));
    Graph g;
    const ir::ValueId x = g.param("x", i);
    const ir::ValueId nz = g.op(OpKind::cast, {g.op(OpKind::cast, {x}, b)}, i);
    const ir::Module m = g.finish(g.op(OpKind::cast, {g.op(OpKind::add, {x, nz}, i)}, f));
    for (int64_t l : {1, 9, 33}) check(kernel, m, {random_ints(rng, DType::i64, {l}, -3, 3)}, 1);
  }
}

// The causal mask gt(iota axis 1, iota axis 0) on [L, L].
TEST_P(ElementwiseKernelTest, CausalMaskFromIota) {
  const JitKernel kernel =
      jit(kernel_of({iota(1, 2), iota(0, 2), op("gt", {0, 1}, Dtype::u8, 2)}, 2));
  Graph g;
  const ir::TensorType ll = T(DType::i64, {kL, kL});
  g.param("len", T(DType::f32, {kL}));  // binds L for the interpreter
  const ir::ValueId j = g.op(OpKind::iota, {}, ll, {{"axis", int64_t{1}}});
  const ir::ValueId i = g.op(OpKind::iota, {}, ll, {{"axis", int64_t{0}}});
  const ir::Module m = g.finish(g.op(OpKind::gt, {j, i}, T(DType::boolean, {kL, kL})));
  for (int64_t l : {1, 7, 33, 129}) check(kernel, m, {ir::Tensor::zeros(DType::f32, {l})}, 0);
}

// The attention mask: logical_or(padding [B, 1, L], causal [L, L]) -> [B, L, L], the causal
// part of lower rank than the output, with iota on the last axis written as -1.
TEST_P(ElementwiseKernelTest, PaddingOrCausal) {
  const JitKernel kernel =
      jit(kernel_of({input(0, Dtype::u8, 3, {false, true, false}), iota(-1, 2), iota(0, 2),
                     op("gt", {1, 2}, Dtype::u8, 2), op("logical_or", {0, 3}, Dtype::u8, 3)},
                    3));
  Graph g;
  const ir::TensorType ll = T(DType::i64, {kL, kL});
  const ir::ValueId pad = g.param("pad", T(DType::boolean, {kB, C(1), kL}));
  const ir::ValueId j = g.op(OpKind::iota, {}, ll, {{"axis", int64_t{-1}}});
  const ir::ValueId i = g.op(OpKind::iota, {}, ll, {{"axis", int64_t{0}}});
  const ir::ValueId causal = g.op(OpKind::gt, {j, i}, T(DType::boolean, {kL, kL}));
  const ir::Module m =
      g.finish(g.op(OpKind::logical_or, {pad, causal}, T(DType::boolean, {kB, kL, kL})));
  std::mt19937 rng(8);
  for (int64_t b : {1, 3})
    for (int64_t l : {1, 7, 33})
      check(kernel, m, {random_ints(rng, DType::boolean, {b, 1, l}, 0, 1)}, 1);
}

// i64 arithmetic: add(div(a, b), mul(sub(maximum(a, b), relu(neg(a))), 3)); division
// truncates toward zero, also by -1 and with negative operands.
TEST_P(ElementwiseKernelTest, IntegerArithmetic) {
  const JitKernel kernel = jit(kernel_of(
      {input(0, Dtype::i64, 2), input(1, Dtype::i64, 2), op("div", {0, 1}, Dtype::i64, 2),
       op("maximum", {0, 1}, Dtype::i64, 2), op("neg", {0}, Dtype::i64, 2),
       op("relu", {4}, Dtype::i64, 2), op("sub", {3, 5}, Dtype::i64, 2), constant(3, Dtype::i64),
       op("mul", {6, 7}, Dtype::i64, 2), op("add", {2, 8}, Dtype::i64, 2)},
      2));
  Graph g;
  const ir::TensorType t = T(DType::i64, {kB, kL});
  const ir::ValueId a = g.param("a", t);
  const ir::ValueId b = g.param("b", t);
  const ir::ValueId q = g.op(OpKind::div, {a, b}, t);
  const ir::ValueId mx = g.op(OpKind::maximum, {a, b}, t);
  const ir::ValueId r = g.op(OpKind::relu, {g.op(OpKind::neg, {a}, t)}, t);
  const ir::ValueId three = g.op(OpKind::constant, {}, T(DType::i64, {}), {{"value", int64_t{3}}});
  const ir::ValueId p = g.op(OpKind::mul, {g.op(OpKind::sub, {mx, r}, t), three}, t);
  const ir::Module m = g.finish(g.op(OpKind::add, {q, p}, t));
  std::mt19937 rng(9);
  for (int64_t l : {1, 7, 33}) {
    ir::Tensor divisor = random_ints(rng, DType::i64, {2, l}, -4, 4);
    for (int64_t& v : divisor.ints)
      if (v == 0) v = -1;
    check(kernel, m, {random_ints(rng, DType::i64, {2, l}, -50, 50), divisor}, 2);
  }
}

// f32 math: add(div(exp(x), y), sqrt(relu(x))).
TEST_P(ElementwiseKernelTest, FloatMath) {
  const JitKernel kernel = jit(
      kernel_of({input(0, Dtype::f32, 2), input(1, Dtype::f32, 2), op("exp", {0}, Dtype::f32, 2),
                 op("div", {2, 1}, Dtype::f32, 2), op("relu", {0}, Dtype::f32, 2),
                 op("sqrt", {4}, Dtype::f32, 2), op("add", {3, 5}, Dtype::f32, 2)},
                2));
  Graph g;
  const ir::TensorType t = T(DType::f32, {kB, kL});
  const ir::ValueId x = g.param("x", t);
  const ir::ValueId y = g.param("y", t);
  const ir::ValueId q = g.op(OpKind::div, {g.op(OpKind::exp, {x}, t), y}, t);
  const ir::ValueId s = g.op(OpKind::sqrt, {g.op(OpKind::relu, {x}, t)}, t);
  const ir::Module m = g.finish(g.op(OpKind::add, {q, s}, t));
  std::mt19937 rng(10);
  for (int64_t l : {1, 7, 33, 129})
    check(kernel, m, {random_f32(rng, {3, l}, -4, 4), random_f32(rng, {3, l}, 0.5f, 2)}, 2);
}

// The math functions, as PyTorch defines them, in double (independent of the interpreter).
double math_reference(const std::string& op, double x) {
  const double pi = std::acos(-1.0);
  if (op == "exp") return std::exp(x);
  if (op == "log") return std::log(x);
  if (op == "tanh") return std::tanh(x);
  if (op == "erf") return std::erf(x);
  if (op == "sigmoid") return 1.0 / (1.0 + std::exp(-x));
  if (op == "silu") return x / (1.0 + std::exp(-x));
  // gelu = 0.5·x·(1 + erf(x/√2)) = 0.5·x·erfc(-x/√2), and 0.5·x·(1 + tanh(u)) = x / (1 +
  // exp(-2u)): the same functions, without the cancellation that leaves double with no
  // correct digit for x below about -6 (where 1 + erf and 1 + tanh round to 0).
  if (op == "gelu") return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
  if (op == "gelu_tanh")
    return x / (1.0 + std::exp(-2.0 * std::sqrt(2.0 / pi) * (x + 0.044715 * x * x * x)));
  ADD_FAILURE() << "no reference for " << op;
  return 0;
}

// Each math function of one f32 input against the double reference over a wide sweep:
// |x| from 1e-7 to 80 in steps of 0.1% (and 0), both signs (log: positive only). Error bound
// per element: rel·|f(x)| + abs·|x|. Measured (host, AVX-512) worst relative errors: exp
// 3.0e-7 (at x = 78), log 1.6e-7, tanh 1.6e-7, erf 3.9e-7 (Halide's erf, at x = 1.004),
// sigmoid 1.5e-7, silu 1.7e-7 (u = 6e-8 is one ulp). gelu's abs term covers the cancellation
// in 1 + erf(x/√2) for negative x, that PyTorch's float evaluation of the same formula has
// too: |error| ≤ 0.5·|x|·|error of erf| ≈ 2e-7·|x|. gelu_tanh = x / (1 + exp(-2u)) loses
// relative accuracy as |u| grows (the rounding of u is amplified by 2|u|), 7e-7 at x = -3.6;
// its abs term covers x < -3.5, where the value is below 5e-4·|x|.
TEST_P(ElementwiseKernelTest, MathFunctionsAgainstDoubleReference) {
  struct Bound {
    const char* op;
    double rel, abs;
  };
  const Bound bounds[] = {{"exp", 4e-7, 0},     {"log", 3e-7, 0},         {"tanh", 3e-7, 0},
                          {"erf", 5e-7, 0},     {"sigmoid", 3e-7, 0},     {"silu", 3e-7, 0},
                          {"gelu", 5e-7, 2e-7}, {"gelu_tanh", 6e-7, 1e-9}};
  std::vector<float> xs = {0.0f};
  for (double a = 1e-7; a < 80; a *= 1.001) {
    xs.push_back(static_cast<float>(a));
    xs.push_back(static_cast<float>(-a));
  }
  const int64_t n = static_cast<int64_t>(xs.size());
  for (const Bound& b : bounds) {
    SCOPED_TRACE(b.op);
    const std::string name = b.op;
    const JitKernel kernel =
        jit(kernel_of({input(0, Dtype::f32, 1), op(b.op, {0}, Dtype::f32, 1)}, 1));
    Halide::Buffer<> in(Halide::Float(32), {static_cast<int>(n)});
    std::memcpy(in.raw_buffer()->host, xs.data(), xs.size() * sizeof(float));
    Halide::Buffer<> out(Halide::Float(32), {static_cast<int>(n)});
    ASSERT_EQ(kernel.run({in, out}), 0);
    const float* got = reinterpret_cast<const float*>(out.raw_buffer()->host);
    double worst_rel = 0, worst_x = 0;
    int failures = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double x = xs[i];
      if (name == "log" && x <= 0) continue;
      const double want = math_reference(name, x);
      if (!std::isfinite(want) || std::fabs(want) > 3e38) continue;  // beyond f32
      const double err = std::fabs(static_cast<double>(got[i]) - want);
      const double rel = want == 0 ? err : err / std::fabs(want);
      if (std::fabs(want) >= 1e-3 && rel > worst_rel) worst_rel = rel, worst_x = x;
      if (!(err <= b.rel * std::fabs(want) + b.abs * std::fabs(x)) && ++failures <= 5)
        ADD_FAILURE() << name << "(" << x << ") = " << got[i] << ", want " << want << " (relative "
                      << rel << ")";
    }
    std::printf("  %-9s worst relative error %.3g at x = %.6g (where |f(x)| >= 1e-3)\n", b.op,
                worst_rel, worst_x);
  }
}

// The math functions through the interpreter's ops, on random data of several extents.
TEST_P(ElementwiseKernelTest, MathFunctionsMatchInterpreter) {
  const std::pair<const char*, OpKind> ops[] = {{"log", OpKind::log},
                                                {"tanh", OpKind::tanh},
                                                {"erf", OpKind::erf},
                                                {"sigmoid", OpKind::sigmoid},
                                                {"gelu", OpKind::gelu},
                                                {"silu", OpKind::silu},
                                                {"gelu_tanh", OpKind::gelu_tanh},
                                                {"sin", OpKind::sin},
                                                {"cos", OpKind::cos},
                                                {"rsqrt", OpKind::rsqrt}};
  std::mt19937 rng(12);
  for (const auto& [name, kind] : ops) {
    SCOPED_TRACE(name);
    // f(x) + y, y broadcast over rows, so the function is fused in a tree.
    const JitKernel kernel =
        jit(kernel_of({input(0, Dtype::f32, 2), input(1, Dtype::f32, 1),
                       op(name, {0}, Dtype::f32, 2), op("add", {2, 1}, Dtype::f32, 2)},
                      2));
    Graph g;
    const ir::TensorType t = T(DType::f32, {kB, kL});
    const ir::ValueId x = g.param("x", t);
    const ir::ValueId y = g.param("y", T(DType::f32, {kL}));
    const ir::Module m = g.finish(g.op(OpKind::add, {g.op(kind, {x}, t), y}, t));
    const float lo = kind == OpKind::log || kind == OpKind::rsqrt ? 0.01f : -8.0f;
    for (int64_t l : {1, 7, 33, 129})
      check(kernel, m, {random_f32(rng, {3, l}, lo, 8), random_f32(rng, {l}, -1, 1)}, 2);
    // NaN stays NaN; infinities, zeros and large arguments give what the interpreter gives.
    const float inf = std::numeric_limits<float>::infinity();
    const std::vector<float> special = {
        std::numeric_limits<float>::quiet_NaN(), inf, -inf, 0.0f, -0.0f, 100.0f, -100.0f, 1e-30f};
    check(kernel, m,
          {ir::Tensor::from_f32({1, 8}, special), ir::Tensor::from_f32({8}, std::vector<float>(8))},
          2);
  }
}

// The one elementwise kernel `m` lowers to after the default pipeline (an op added by its
// row in ir/ops.def, its interpreter semantics and its Halide expression, end to end). A
// value read twice is a kernel of its own: then this fails rather than test a part.
ElementwiseKernel lowered_single_kernel(const ir::Module& m) {
  ir::Module optimized = m;
  passes::run_passes(optimized, passes::default_pipeline(), {});
  const codegen::LoweredModel lowered = codegen::lower_module(optimized);
  EXPECT_EQ(lowered.kernels.size(), 1u);
  const auto* k = std::get_if<ElementwiseKernel>(&lowered.kernels.at(0));
  EXPECT_NE(k, nullptr);
  return k ? *k : ElementwiseKernel{};
}

// The names of a kernel's op nodes, in their order.
std::vector<std::string> op_names(const ElementwiseKernel& spec) {
  std::vector<std::string> ops;
  for (const Node& n : spec.nodes)
    if (n.kind == Node::Kind::op) ops.push_back(ir::op_name(n.op));
  return ops;
}

// sign fuses with its users into a single elementwise kernel, which matches the
// interpreter (NaN stays NaN, -0.0 gives 0).
const char* const kSignModule = R"kir(module @m {
  symbol B max 8
  symbol L max 256
  func @f(%x: f32[B,L], %y: f32[L]) -> (f32[B,L]) {
    %s = sign(%x) : f32[B,L]
    %p = mul(%s, %y) : f32[B,L]
    %r = add(%p, %x) : f32[B,L]
    return %r
  }
}
)kir";

TEST_P(ElementwiseKernelTest, SignFusesAndMatchesInterpreter) {
  const ir::Module m = ir::parse_module(kSignModule);
  const ElementwiseKernel spec = lowered_single_kernel(m);
  EXPECT_EQ(op_names(spec), (std::vector<std::string>{"sign", "mul", "add"}));
  const JitKernel kernel = jit(spec);
  std::mt19937 rng(14);
  for (int64_t l : {1, 7, 33, 129})
    check(kernel, m, {random_f32(rng, {3, l}, -2, 2), random_f32(rng, {l}, -1, 1)}, 2);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special = {
      std::numeric_limits<float>::quiet_NaN(), inf, -inf, 0.0f, -0.0f, 1e-30f, -1e-30f, 5.0f};
  check(
      kernel, m,
      {ir::Tensor::from_f32({1, 8}, special), ir::Tensor::from_f32({8}, std::vector<float>(8, 2))},
      2);
}

// minimum, abs, sin, cos and rsqrt (rows of ir/ops.def with their interpreter and Halide
// semantics) after the default pipeline: one fused elementwise kernel (every value read
// once, so none is materialized apart) matching the interpreter on random values of every
// sign and on NaN, infinities and zeros (abs of integers wraps: the next test).
const char* const kMoreMathModule = R"kir(module @m {
  symbol B max 8
  symbol L max 256
  func @f(%x: f32[B,L], %y: f32[L]) -> (f32[B,L]) {
    %p = mul(%x, %y) : f32[B,L]
    %a = abs(%x) : f32[B,L]
    %r = rsqrt(%a) : f32[B,L]
    %s = sin(%x) : f32[B,L]
    %c = cos(%x) : f32[B,L]
    %m = minimum(%s, %c) : f32[B,L]
    %t = add(%m, %r) : f32[B,L]
    %u = add(%t, %p) : f32[B,L]
    return %u
  }
}
)kir";

TEST_P(ElementwiseKernelTest, MoreMathFusesAndMatchesInterpreter) {
  const ir::Module m = ir::parse_module(kMoreMathModule);
  const ElementwiseKernel spec = lowered_single_kernel(m);
  std::vector<std::string> ops = op_names(spec);
  std::sort(ops.begin(), ops.end());
  EXPECT_EQ(ops, (std::vector<std::string>{"abs", "add", "add", "cos", "minimum", "mul", "rsqrt",
                                           "sin"}));
  const JitKernel kernel = jit(spec);
  std::mt19937 rng(27);
  for (int64_t l : {1, 7, 33, 129}) {
    check(kernel, m, {random_f32(rng, {3, l}, -4, 4), random_f32(rng, {l}, -3, 3)}, 2);
    check(kernel, m, {random_f32(rng, {3, l}, 0.1f, 4), random_f32(rng, {l}, -2, 2)}, 2);
  }
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> xs = {nan, inf, -inf, 0.0f, -0.0f, 1.0f, -8.0f, 2.0f};
  const std::vector<float> ys = {0.0f, 0.5f, 2.0f, nan, 1.0f / 3.0f, nan, 0.5f, -inf};
  check(kernel, m, {ir::Tensor::from_f32({1, 8}, xs), ir::Tensor::from_f32({8}, ys)}, 2);
}

TEST_P(ElementwiseKernelTest, IntegerAbsAndMinimumMatchInterpreter) {
  const ir::Module m = ir::parse_module(R"kir(module @m {
  symbol L max 64
  func @f(%x: i64[L], %y: i64[L]) -> (i64[L]) {
    %a = abs(%x) : i64[L]
    %m = minimum(%a, %y) : i64[L]
    return %m
  }
}
)kir");
  const JitKernel kernel = jit(lowered_single_kernel(m));
  const int64_t lo = std::numeric_limits<int64_t>::min();
  check(kernel, m,
        {ir::Tensor::from_ints(DType::i64, {6}, {lo, -5, 0, 7, lo + 1, -1}),
         ir::Tensor::from_ints(DType::i64, {6}, {0, 3, -2, 100, 0, lo})},
        2);
}

// expand (torch's x.expand: numpy broadcasting to the declared shape, here over a new
// leading dim and a dim of 1) fuses into its user's kernel and matches the interpreter, and
// alone it is one kernel of its own; also of bools (the masks repeat_kv-like code expands).
TEST_P(ElementwiseKernelTest, ExpandFusesAndMatchesInterpreter) {
  const ir::Module fused = ir::parse_module(R"kir(module @m {
  symbol B max 8
  symbol L max 64
  func @f(%x: f32[L,1], %y: f32[B,1,3]) -> (f32[B,L,3]) {
    %e = expand(%x) : f32[B,L,3]
    %r = add(%e, %y) : f32[B,L,3]
    return %r
  }
}
)kir");
  const ElementwiseKernel spec = lowered_single_kernel(fused);
  EXPECT_EQ(op_names(spec), (std::vector<std::string>{"expand", "add"}));
  const JitKernel kernel = jit(spec);
  const ir::Module alone = ir::parse_module(R"kir(module @m {
  symbol L max 64
  func @f(%x: bool[1,L,1]) -> (bool[2,L,3]) {
    %e = expand(%x) : bool[2,L,3]
    return %e
  }
}
)kir");
  const ElementwiseKernel alone_spec = lowered_single_kernel(alone);
  EXPECT_EQ(op_names(alone_spec), (std::vector<std::string>{"expand"}));
  const JitKernel alone_kernel = jit(alone_spec);
  std::mt19937 rng(31);
  for (int64_t l : {1, 7, 33}) {
    const ir::Tensor x = random_f32(rng, {l, 1}, -2, 2), y = random_f32(rng, {3, 1, 3}, -1, 1);
    std::vector<int64_t> bits;
    for (int64_t i = 0; i < l; ++i) bits.push_back(rng() % 2);
    const ir::Tensor b = ir::Tensor::from_ints(DType::boolean, {1, l, 1}, bits);
    check(kernel, fused, {x, y}, 2);
    check(alone_kernel, alone, {b}, 1);
  }
}

// The same kernel compiles ahead of time, as kiln compile compiles it.
TEST(ElementwiseSign, CompilesAheadOfTime) {
  jit::expect_compiles_ahead_of_time(lowered_single_kernel(ir::parse_module(kSignModule)));
}

// maximum and relu propagate NaN, as the interpreter's do.
TEST_P(ElementwiseKernelTest, NanPropagation) {
  const JitKernel kernel = jit(kernel_of(
      {input(0, Dtype::f32, 1), input(1, Dtype::f32, 1), op("maximum", {0, 1}, Dtype::f32, 1),
       op("relu", {0}, Dtype::f32, 1), op("add", {2, 3}, Dtype::f32, 1)},
      1));
  Graph g;
  const ir::TensorType t = T(DType::f32, {kL});
  const ir::ValueId x = g.param("x", t);
  const ir::ValueId y = g.param("y", t);
  const ir::ValueId mx = g.op(OpKind::maximum, {x, y}, t);
  const ir::Module m = g.finish(g.op(OpKind::add, {mx, g.op(OpKind::relu, {x}, t)}, t));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> xs{nan, 1, nan, -1, 2, -3, 0, nan, 5, -2, 1, nan, 3, 4, -5, 6, nan};
  const std::vector<float> ys{1, nan, nan, -2, nan, 1, 0, -1, 2, -3, 7, 0, nan, 1, 2, -1, 3};
  const int64_t n = static_cast<int64_t>(xs.size());
  check(kernel, m, {ir::Tensor::from_f32({n}, xs), ir::Tensor::from_f32({n}, ys)}, 2);
}

// f32 -> bool of NaN is true and of -0.0 false.
TEST_P(ElementwiseKernelTest, NanAndNegativeZeroToBool) {
  const JitKernel kernel =
      jit(kernel_of({input(0, Dtype::f32, 1), op("cast", {0}, Dtype::u8, 1)}, 1));
  Graph g;
  const ir::Module m =
      g.finish(g.op(OpKind::cast, {g.param("x", T(DType::f32, {kL}))}, T(DType::boolean, {kL})));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> xs{nan,    -0.0f, 0.0f, 1.0f, -nan,  2.0f,  nan, 0.0f, -0.0f, nan,
                              1e-30f, nan,   0.0f, nan,  -1.0f, -0.0f, nan, 3.0f, nan};
  check(kernel, m, {ir::Tensor::from_f32({static_cast<int64_t>(xs.size())}, xs)}, 1);
}

// A node read by two consumers is built once: 40 doublings, each reading the previous
// value twice, compile quickly (a tree of 2^40 adds would not).
TEST_P(ElementwiseKernelTest, SharedSubexpressions) {
  const int doublings = 40;
  std::vector<Node> nodes{input(0, Dtype::f32, 2)};
  Graph g;
  const ir::TensorType t = T(DType::f32, {kB, kL});
  ir::ValueId v = g.param("x", t);
  for (int k = 0; k < doublings; ++k) {
    nodes.push_back(op("add", {k, k}, Dtype::f32, 2));
    v = g.op(OpKind::add, {v, v}, t);
  }
  const JitKernel kernel = jit(kernel_of(nodes, 2));
  const ir::Module m = g.finish(v);
  std::mt19937 rng(11);
  check(kernel, m, {random_f32(rng, {2, 9}, -1e-9f, 1e-9f)}, 1);
}

// A scalar output (rank 0).
TEST_P(ElementwiseKernelTest, ScalarOutput) {
  const JitKernel kernel = jit(kernel_of(
      {input(0, Dtype::f32, 0), constant(2.5, Dtype::f32), op("mul", {0, 1}, Dtype::f32, 0)}, 0));
  Graph g;
  const ir::TensorType t = T(DType::f32, {});
  const ir::ValueId x = g.param("x", t);
  const ir::ValueId c = g.op(OpKind::constant, {}, t, {{"value", 2.5}});
  const ir::Module m = g.finish(g.op(OpKind::mul, {x, c}, t));
  check(kernel, m, {ir::Tensor::from_f32({}, {-1.25f})}, 1);
}

INSTANTIATE_TEST_SUITE_P(Targets, ElementwiseKernelTest,
                         ::testing::Values(std::string("host"), std::string(kAvx2Target)),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           return std::string(param_info.param == "host" ? "host" : "avx2");
                         });

// ---------------------------------------------------------------------------------
// Errors and the AOT path

TEST(ElementwiseKernelErrorTest, UnsupportedOp) {
  ElementwiseKernel spec =
      kernel_of({input(0, Dtype::f32, 1), op("softmax", {0}, Dtype::f32, 1)}, 1);
  try {
    codegen::build_elementwise(spec, codegen::host_target());
    FAIL() << "expected kiln::Error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "elementwise kernel: unsupported op 'softmax'");
  }
}

TEST(ElementwiseKernelErrorTest, GatherFromComputedTable) {
  ElementwiseKernel spec = kernel_of({input(0, Dtype::f32, 2), op("neg", {0}, Dtype::f32, 2),
                                      input(1, Dtype::i64, 1), gather(1, 2, 2, 5)},
                                     2);
  try {
    codegen::build_elementwise(spec, codegen::host_target());
    FAIL() << "expected kiln::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported gather"), std::string::npos) << e.what();
  }
}

TEST(ElementwiseKernelAotTest, CompilesToObject) {
  jit::expect_compiles_ahead_of_time(embedding_spec(37, 24));
}

}  // namespace
}  // namespace kiln
