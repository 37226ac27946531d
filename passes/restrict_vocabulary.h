// restrict-vocabulary: the columns `ids` of a linear's outputs, taken along the last axis,
// become a linear over those rows of its weight (linear_rows), so that only they are computed:
//
//   %l = linear(%x, @W, @b) {act}                   (W[V, K], b[V]: weight ops)
//   %i = expand(reshape(%ids, [1, ..., 1, R]), [..., R])   (or expand(%ids); %ids i64[R])
//   %y = take_along_axis(%l, %i) {axis = last}       =>   %y = linear_rows(%x, @W, %ids, @b) {act}
//
// What nn::add_seq2seq's decode_step_restricted writes (frontend/seq2seq.h): the logits of the
// token ids a translation may choose from (vocabulary restriction, as CTranslate2's vmap), where
// the generator's 32000 columns would otherwise all be computed for a few thousand. The ids
// must be the same for every row (a vector broadcast along the other axes): that is what
// lets one gathered weight serve all rows. The activation commutes with taking columns. The
// linear stays where something else reads it. Pre: verified. Post: verified; returns whether
// anything was rewritten.
#pragma once

#include "ir/ir.h"

namespace kiln::passes {
bool restrict_vocabulary(ir::Module& module);
}  // namespace kiln::passes
