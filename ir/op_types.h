// Type rules of every op: the operand count, attributes and operand types it
// accepts, and the result type it produces. Shared by the verifier, the DSL (which
// checks shapes while building) and shape inference.
#pragma once

#include <string>
#include <vector>

#include "ir/ir.h"

namespace kiln::ir {

struct TypeResult {
  TensorType type;    // valid when error is empty
  std::string error;  // e.g. "operand shapes f32[B,S,24] and f32[B,T,24] do not broadcast"
  bool ok() const { return error.empty(); }
};

// Computes the result type of an op of `kind` applied to operands of `operand_types`
// with `attrs`. Ops whose result type is not determined by their operands (weight,
// constant, sinusoid_table, iota, cast, reshape, slice) take it from `declared`, which
// must then be non-null; the rule checks it. Never throws.
TypeResult infer_type(const Module& module, OpKind kind,
                      const std::vector<TensorType>& operand_types, const Attrs& attrs,
                      const TensorType* declared);

// Checks an op's attributes against those its kind takes (verifier invariant V10): no
// unknown key, every required one present, each of its type (integer, number, string,
// integer list), and each in the range that does not depend on the operands: slice start
// >= 0, eps positive and finite, keepdims, causal, fill_inf, query_pad, unbiased and
// eps_outside 0 or 1, act "none" or "relu", heads >= 1, scale finite. Returns the first
// problem, e.g.
//   attribute 'causal' must be an integer, got string "yes"
// or "" when there is none. infer_type starts with it, so a type rule never reads an
// attribute of the wrong type. Never throws.
std::string check_attrs(OpKind kind, const Attrs& attrs);

// True when the op kind takes its result type from the declaration.
bool needs_declared_type(OpKind kind);

// Numpy-style broadcast of two shapes; empty optional-like error when incompatible.
TypeResult broadcast_types(const TensorType& a, const TensorType& b, DType result_dtype);

// Whether y broadcasts over x's leading dims: y is not x's type, has x's dtype, and its shape
// after any leading 1s is a suffix of x's (the last dim included): the addend y of an
// add_layernorm whose rows repeat over x's rows ([S,D] or [1,S,D] over [B,S,D]).
bool broadcasts_over_leading_dims(const TensorType& y, const TensorType& x);

// Where an attention op's optional operands are among its `count` operands (-1: absent):
// q, k, v, then key_pad (when the count leaves room for it), query_pad (attribute
// query_pad = 1), bias (attribute bias = 1), in that order.
struct AttentionOperands {
  int key_pad = -1, query_pad = -1, bias = -1;
};
AttentionOperands attention_operands(const Attrs& attrs, size_t count);

// Normalizes a possibly negative axis against `rank`; returns -1 when out of range.
int64_t normalize_axis(int64_t axis, int64_t rank);

// Formats a shape as "[B,S,24]".
std::string shape_string(const std::vector<Dim>& shape);

}  // namespace kiln::ir
