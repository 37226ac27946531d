// The op kinds and what the op table (ir/ops.def) says of each: operand counts, attributes,
// result rule and flags. Free of the rest of the IR, so kernel specs can name op kinds.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace kiln::ir {

enum class OpKind {
#define KILN_OP(name, ...) name,
#include "ir/ops.def"
};

// The number of op kinds: every OpKind is below it.
inline constexpr int kNumOpKinds = 0
#define KILN_OP(name, ...) +1
#include "ir/ops.def"
    ;

// An op's max_operands when it takes any number from min_operands up.
inline constexpr int kVariadic = -1;

// How an op's result type follows from its operands (ir/op_types.cpp applies it).
enum class TypeRule {
  arith,          // (a, b) of one dtype, not bool, broadcast: that dtype
  compare,        // (a, b) of one dtype, broadcast: bool
  logical,        // bool operand(s), broadcast: bool
  f32_unary,      // (x f32): x's type
  numeric_unary,  // (x, not bool): x's type
  select,         // (cond bool, a, b) with a and b of one dtype, the three broadcast: a's dtype
  custom,         // the kind's own rule in infer_type
};

enum OpFlag : uint32_t {
  kPointwise = 1u << 0,        // per element with numpy broadcasting (is_elementwise)
  kFusable = 1u << 1,          // computed inside an elementwise kernel's expression
  kActivation = 1u << 2,       // a `linear` op's act may name it
  kDeclaredType = 1u << 3,     // the result type is the declared one (needs_declared_type)
  kOperandsByAttrs = 1u << 4,  // the type rule checks the operand count the attributes allow
};

enum class AttrType { integer, number, string, ints };

// The range of an attribute's value that does not depend on the operands (check_attrs).
enum class AttrRange {
  any,
  flag,             // 0 or 1
  nonnegative,      // >= 0
  at_least_one,     // >= 1
  positive_finite,  // > 0 and finite
  finite,
  activation,  // "none" or an activation op's name (is_linear_activation)
};

struct AttrSpec {
  const char* key;
  AttrType type;
  bool required;
  AttrRange range;
};

// One row of the op table.
struct OpInfo {
  OpKind kind;
  const char* name;
  int min_operands;
  int max_operands;  // kVariadic: no upper bound
  TypeRule rule;
  uint32_t flags;                   // OpFlag bits
  std::span<const AttrSpec> attrs;  // in the order the verifier checks their ranges

  bool has(OpFlag flag) const { return (flags & flag) != 0; }
};

// The row of `kind` (which must be a valid OpKind).
const OpInfo& op_info(OpKind kind);

const char* op_name(OpKind kind);  // "?" for a value that is no OpKind
std::optional<OpKind> parse_op_kind(std::string_view name);

// Pointwise ops (kPointwise): per element, with numpy broadcasting.
bool is_elementwise(OpKind kind);
// The pointwise ops of 1 and 2 operands.
bool is_unary_elementwise(OpKind kind);
bool is_binary_elementwise(OpKind kind);
// Ops an elementwise kernel computes inside its expression (kFusable): the pointwise ones,
// gather, constant and iota.
bool is_elementwise_fusable(OpKind kind);
// eq, ne, lt, le, gt, ge (rule compare).
bool is_comparison(OpKind kind);
// The unary math functions defined on f32 only (rule f32_unary: exp, log, tanh, ...).
bool is_float_unary(OpKind kind);
// Whether `act` names an activation that a `linear` op applies after its bias: "none",
// "relu", "gelu", "gelu_tanh", "silu", "sigmoid" or "tanh" (each the unary op of that name,
// flagged kActivation).
bool is_linear_activation(std::string_view act);

}  // namespace kiln::ir
