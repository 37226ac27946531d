// The graph IR: dtypes, symbolic shapes, values, ops, functions and modules.
//
// A Module holds the model's symbols (B, S, T with declared maxima), its weights
// (named like the PyTorch state_dict) and its Functions (entry points such as
// `forward` and `encode`). A Function is a list of Ops in SSA form: every Op
// defines exactly one Value; operands refer to Values defined earlier (or to the
// function's parameters). Weights enter a function through `weight` ops.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "ir/ops.h"

namespace kiln::ir {

enum class DType { f32, i32, i64, boolean };

const char* dtype_name(DType dtype);                 // "f32", "i32", "i64", "bool"
std::optional<DType> parse_dtype(std::string_view);  // inverse of dtype_name
int64_t dtype_size(DType dtype);                     // bytes per element (bool: 1)
inline bool is_integer(DType d) { return d == DType::i32 || d == DType::i64; }

// One dimension of a shape: an integer constant, or an affine function of one named symbol,
// scale·symbol + offset (scale >= 1): `S`, `T+1` (a prepended token), `2*T`, `64*T` (a
// symbolic axis merged with constant ones by a reshape). Written `T`, `T+1`, `T-1`, `2*T`,
// `2*T+1` in .kir. A symbol takes the values 1..max, so such a dim ranges from scale + offset
// (at 1) to scale·max + offset; the verifier (V7) refuses a dim that could be below 1 (`T-1`:
// 0 when T = 1). Sums and products of two different symbols (S+T, B*T) are not dims: the
// arithmetic below refuses them, naming the dims.
struct Dim {
  int64_t value = 0;   // the constant; for a symbolic dim its offset
  std::string symbol;  // non-empty for a symbolic dim
  int64_t scale = 1;   // a symbolic dim's scale (>= 1); 1 for a constant

  static Dim constant(int64_t v) { return Dim{v, {}, 1}; }
  static Dim sym(std::string name) { return Dim{0, std::move(name), 1}; }
  // scale·name + offset; a constant when scale is 0.
  static Dim affine(std::string name, int64_t scale, int64_t offset) {
    return scale == 0 ? constant(offset) : Dim{offset, std::move(name), scale};
  }
  bool is_symbolic() const { return !symbol.empty(); }
  // Exactly a symbol: `T`, not `T+1` or `2*T`.
  bool is_bare_symbol() const { return is_symbolic() && scale == 1 && value == 0; }
  bool is_const(int64_t v) const { return symbol.empty() && value == v; }
  // The dim's size when its symbol is `symbol_value` (a constant's own).
  int64_t at(int64_t symbol_value) const {
    return is_symbolic() ? scale * symbol_value + value : value;
  }
  bool operator==(const Dim&) const = default;
};

// Arithmetic on dims: the result, or nullopt when it is no Dim (two different symbols, a
// product of two symbolic dims, a negative or zero scale), with `why` (when given) saying
// so and naming the dims, e.g. "the sum of dims S and T: sums of different symbols are not
// supported".
std::optional<Dim> add_dims(const Dim& a, const Dim& b, std::string* why = nullptr);
std::optional<Dim> sub_dims(const Dim& a, const Dim& b, std::string* why = nullptr);
std::optional<Dim> mul_dims(const Dim& a, const Dim& b, std::string* why = nullptr);

struct TensorType {
  DType dtype = DType::f32;
  std::vector<Dim> shape;
  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  bool operator==(const TensorType&) const = default;
};

std::string to_string(const Dim& dim);
std::string to_string(const TensorType& type);  // e.g. "f32[B,S,512]", "i64[]"

// A symbol with its declared upper bound, e.g. `symbol S max 128`.
struct Symbol {
  std::string name;
  int64_t max = 0;
  bool operator==(const Symbol&) const = default;
};

// Attribute values: integers, floats, strings and integer lists.
using AttrValue = std::variant<int64_t, double, std::string, std::vector<int64_t>>;
using Attrs = std::map<std::string, AttrValue>;  // ordered: printing is deterministic

// OpKind, op_name, parse_op_kind and the is_* predicates (is_elementwise_fusable: what
// fuse-elementwise may fuse into its reader's kernel): ir/ops.h (from ir/ops.def).

// The most levels of fused ops (Op::fused) below one elementwise kernel's root: bounds the
// expression trees handed to Halide and the recursion that builds them (verifier V12).
constexpr int kMaxFusedDepth = 64;

using ValueId = int32_t;

// The value defined by an op or a parameter. `name` is what the text form shows
// after `%`; an empty name prints as the value's position number.
struct Value {
  std::string name;
  TensorType type;
};

// A source location in IR text, for diagnostics; line 0 when unknown.
struct Loc {
  int line = 0;
  int col = 0;
};

// "line 7: " for a known location, "" for an unknown one: the prefix of a diagnostic about
// an op when the IR text is not at hand (after the passes: codegen, the interpreter).
std::string line_prefix(const Loc& loc);

// Where the user wrote an op in the model's own source: the C++ DSL records each op's
// std::source_location (file base name and line) and the builder's scope
// ("layers.0.input_layernorm"), as indices into Module::sources. Printed after an op as
// `src(FILE:LINE)` or `src(FILE:LINE, SCOPE)` and parsed back, so it survives `kiln emit`
// -> .kir -> `kiln compile`. Used by diagnostics that speak to the model's author, such as
// the lost-fusion notes (passes/notes.h). Unknown: file -1 (IR written by hand).
struct SourceLoc {
  int32_t file = -1;   // index into Module::sources, or -1
  int32_t line = 0;    // line in that file (1-based)
  int32_t scope = -1;  // index into Module::sources, or -1: no scope
  bool known() const { return file >= 0; }
  bool operator==(const SourceLoc&) const = default;
};

struct Op {
  OpKind kind;
  ValueId result = -1;
  std::vector<ValueId> operands;
  Attrs attrs;
  int64_t arena_offset = -1;  // byte offset of the result in the arena; -1: not planned
  // Computed inside the elementwise kernel of its user (or users: a constant or iota),
  // never stored on its own: the grouping that passes/fuse_elementwise.h decides, and
  // plan-memory and lowering read. Printed as `fused` after the type; rules: verifier V12.
  bool fused = false;
  // Where the op was written in IR text (set by the parser; line 0: unknown, e.g. built by
  // the DSL). It is part of the op, so it moves with the op when a pass reorders or
  // erases ops. Rule for passes: an op rewritten in place keeps its location (a fusion
  // turns the root op of its pattern, the one whose result it takes over, into the fused
  // op: the head-merging reshape of an attention, the layernorm of an add_layernorm, the
  // last of matmul/add/relu of a linear); a new op takes the location of the op it is
  // created for (passes/rewrite.h's make_op and insert_op take it from that op; the
  // merged linear of merge-projections and its weight ops: the first merged linear).
  Loc loc;
  // Where the user wrote it (the DSL); moves and is copied like `loc`, by the same rule.
  SourceLoc src;

  bool has_attr(const std::string& key) const { return attrs.count(key) != 0; }
  int64_t int_attr(const std::string& key) const;   // asserts presence and type
  double float_attr(const std::string& key) const;  // accepts an integer too
  const std::string& str_attr(const std::string& key) const;
  const std::vector<int64_t>& ints_attr(const std::string& key) const;
};

struct Function {
  std::string name;
  std::vector<Value> values;     // every value: parameters and op results, by ValueId
  std::vector<ValueId> params;   // inputs, in order
  std::vector<Op> ops;           // in execution order
  std::vector<ValueId> results;  // outputs, in order; their value names name them
  int64_t arena_bytes = -1;      // size of the planned arena; -1: no memory plan

  const TensorType& type(ValueId id) const { return values.at(id).type; }
  ValueId add_value(TensorType type, std::string name = {});
  ValueId add_param(std::string name, TensorType type);
  // Appends an op at `loc` defining a new value of `type`; returns that value.
  ValueId add_op(OpKind kind, std::vector<ValueId> operands, TensorType type, Attrs attrs = {},
                 Loc loc = {});
  // Index of the op defining `id`, or -1 for a parameter. Linear scan.
  int defining_op(ValueId id) const;
};

// A named weight. `derivation` records how a weight is built at load time from
// state_dict tensors (e.g. concatenating projection weights); empty = loaded as is.
struct WeightDerivation {
  std::string op;                   // "concat"
  std::vector<std::string> inputs;  // state_dict names
  Attrs attrs;                      // e.g. {axis}
  bool operator==(const WeightDerivation&) const = default;
};

struct Weight {
  std::string name;
  TensorType type;  // always static (no symbols)
  std::optional<WeightDerivation> derivation;
};

struct Module {
  std::string name;
  std::map<std::string, std::string> config;  // model config the module was built from
  std::vector<Symbol> symbols;
  std::vector<Weight> weights;
  std::vector<Function> functions;
  // The strings SourceLoc indexes: source file names and DSL scopes, each once, in the
  // order first recorded. Printed as `source N = "text"` lines before the functions.
  std::vector<std::string> sources;

  // Index of `text` in `sources`, appended when absent.
  int32_t intern_source(std::string_view text);
  // "llama.cpp:41 (layers.0.input_layernorm)", "llama.cpp:41" without a scope; "" when
  // `src` is unknown or its indices are out of range.
  std::string source_text(const SourceLoc& src) const;

  const Symbol* find_symbol(std::string_view name) const;
  const Weight* find_weight(std::string_view name) const;
  Function* find_function(std::string_view name);
  const Function* find_function(std::string_view name) const;
  // Adds a weight, or checks that an existing one has the same type.
  void declare_weight(const std::string& name, const TensorType& type);
};

// Number of elements of a weight-like static type; asserts there are no symbols.
int64_t static_numel(const TensorType& type);
// Number of elements with every symbol at its declared maximum.
int64_t max_numel(const Module& module, const TensorType& type);
// The largest size a dim can take: scale·max + offset (its symbol at its maximum); 0 for an
// undeclared symbol.
int64_t dim_max(const Module& module, const Dim& dim);
// The smallest: scale + offset (its symbol at 1); a constant's own.
inline int64_t dim_min(const Dim& dim) { return dim.at(1); }

}  // namespace kiln::ir
