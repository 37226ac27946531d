// The op table (ir/ops.def) as data, and the predicates derived from it.
#include "ir/ops.h"

#include <iterator>

namespace kiln::ir {
namespace {

// Each op's attributes, as kAttrs_<name>; a row without attributes gets an empty span.
#define KILN_ATTR(key, type, presence, range) \
  AttrSpec { #key, AttrType::type, AttrRequired::presence, AttrRange::range }
struct AttrRequired {
  static constexpr bool required = true;
  static constexpr bool optional = false;
};
#define KILN_OP(name, lo, hi, rule, flags, ...) \
  __VA_OPT__(constexpr AttrSpec kAttrs_##name[] = {__VA_ARGS__};)
#include "ir/ops.def"

#define KILN_OP(name, lo, hi, rule, flags, ...) \
  OpInfo{OpKind::name,                          \
         #name,                                 \
         lo,                                    \
         hi,                                    \
         TypeRule::rule,                        \
         static_cast<uint32_t>(flags),          \
         std::span<const AttrSpec>(__VA_OPT__(kAttrs_##name))},
constexpr OpInfo kOps[] = {
#include "ir/ops.def"
};
#undef KILN_ATTR

static_assert(std::size(kOps) == static_cast<size_t>(kNumOpKinds));
constexpr bool rows_in_enum_order() {
  for (int i = 0; i < kNumOpKinds; ++i)
    if (static_cast<int>(kOps[i].kind) != i) return false;
  return true;
}
static_assert(rows_in_enum_order());

bool valid(OpKind kind) {
  return static_cast<int>(kind) >= 0 && static_cast<int>(kind) < kNumOpKinds;
}

}  // namespace

const OpInfo& op_info(OpKind kind) { return kOps[static_cast<int>(kind)]; }

const char* op_name(OpKind kind) { return valid(kind) ? op_info(kind).name : "?"; }

std::optional<OpKind> parse_op_kind(std::string_view name) {
  for (const OpInfo& info : kOps)
    if (name == info.name) return info.kind;
  return std::nullopt;
}

bool is_elementwise(OpKind k) { return op_info(k).has(kPointwise); }
bool is_unary_elementwise(OpKind k) { return is_elementwise(k) && op_info(k).min_operands == 1; }
bool is_binary_elementwise(OpKind k) { return is_elementwise(k) && op_info(k).min_operands == 2; }
bool is_elementwise_fusable(OpKind k) { return op_info(k).has(kFusable); }
bool is_comparison(OpKind k) { return op_info(k).rule == TypeRule::compare; }
bool is_float_unary(OpKind k) { return op_info(k).rule == TypeRule::f32_unary; }

bool is_linear_activation(std::string_view act) {
  if (act == "none") return true;
  const std::optional<OpKind> kind = parse_op_kind(act);
  return kind && op_info(*kind).has(kActivation);
}

}  // namespace kiln::ir
