// Generation for an encoder–decoder model the user writes (T5, the paper's Transformer,
// BART-style): the encoder and the decoder's layers are written once, the decoder's as a
// function of a Decoding context (causal_lm.h), and kiln derives every entry point that
// generation needs (kiln_generate and `kiln translate`/`kiln generate` run them):
//
//   forward(src i64[B,S], tgt i64[B,T]) -> logits f32[B,T,V]
//       teacher-forced: the encoder, then the decoder over the whole target.
//   encode(src) -> memory f32[B,S,D]
//       the encoder's output.
//   prepare(src) -> mem_k<l>, mem_v<l> f32[B,S,w]...
//       once per batch: every cross-attention's keys and values of the encoder output (the
//       projections the body passes to ctx.cross_attention), in call order.
//   decode_step(tok i64[N,1], pos i64[1], rows i64[N,P], src_row i64[N], src i64[B,S],
//               mem_k<l>, mem_v<l>..., cache_k<l>, cache_v<l> f32[T,C,w]...)
//       -> logits f32[N,1,V], cache_k<l>_out, cache_v<l>_out...
//       one token per hypothesis n at position pos: the self-attention's keys and values
//       written into its caches at [pos, n] in place, attending to positions j < P through
//       rows[n, j] (beam indirection, as in causal_lm.h); the cross-attention reads sentence
//       src_row[n]'s memory keys and values (never copied per beam), source padding masked.
//   decode_step_restricted(the same inputs..., vocab i64[R]) -> logits f32[N,1,R], caches...
//       decode_step with the logits of the token ids vocab[r] only (vocabulary restriction:
//       kiln_search_options::vocabulary). Where the head ends in a linear (on weights), the
//       compiler's restrict-vocabulary computes only those rows of it (linear_rows), which
//       for a 32000-token generator and a few thousand ids is most of its work saved.
//
// In the decoder body ctx.positions() is each target token's position, ctx.attention() the
// layer's causal self-attention (cached), ctx.cross_attention() its attention to the encoder
// output. Symbols: B (max max_batch), S (max max_src_len), T (max max_len), N and C (max
// max_batch·max_beam), P (max max_len), R (max vocab). The module config gets `generation =
// seq2seq`, `tgt_vocab`, `max_len`, `max_batch`, `max_beam`, `bos_id` (the decoder's start
// token), `eos_id`, `pad_id` and `cache_widths`, which kiln_generate reads.
//
// Example (a T5-style model; examples/models/t5.cpp is the whole of it):
//
//   nn::Seq2SeqConfig c{.vocab = 64, .max_len = 32, .max_src_len = 32, .bos_id = 0,
//                       .eos_id = 1, .pad_id = 0};
//   nn::add_seq2seq(mb, c,
//       [&](dsl::Tensor src) { ... return memory; },               // src [B, S] -> [B, S, D]
//       [&](nn::Decoding& ctx, dsl::Tensor tgt) {                   // tgt [N, L] -> [N, L, D]
//         ... x = x + o(ctx.attention(q, k, v, {.heads = 4, .scale = 1, .bias = bias}));
//         ... x = x + o2(ctx.cross_attention(q2, k_proj, v_proj, {.heads = 4, .scale = 1}));
//         return x;
//       },
//       [&](dsl::Tensor h) { return lm_head(norm(h)); });         // [.., D] -> [.., V]
#pragma once

#include <cstdint>
#include <functional>

#include "frontend/causal_lm.h"
#include "frontend/dsl.h"

namespace kiln::nn {

struct Seq2SeqConfig {
  int64_t vocab = 0;        // the target vocabulary (the logits' width)
  int64_t max_len = 0;      // the longest target, start token included
  int64_t max_src_len = 0;  // the longest source
  int64_t max_batch = 1;    // source sentences per call
  int64_t max_beam = 1;     // beam search: up to max_batch × max_beam hypotheses at once
  int64_t bos_id = 0;       // the decoder's start token
  int64_t eos_id = 1;       // the end token
  int64_t pad_id = 0;       // source padding: masked in every cross-attention
  // Whether forward's self-attention also masks target tokens equal to pad_id (the paper's
  // Transformer does; T5, whose start token is its pad token, does not). decode_step never
  // does: generation feeds no padding.
  bool mask_target_padding = false;
};

// Adds forward, encode, prepare and decode_step (above) to `mb` from `encoder` (src [B, S] ->
// memory [B, S, D]), `decoder` (tgt [N, L] -> hidden [N, L, D'], self-attention through
// ctx.attention, cross-attention through ctx.cross_attention) and `head` (hidden [..., D'] ->
// logits [..., vocab]), and sets the module's symbols and generation config. Throws kiln::Error
// for a bad config or a body whose entry points disagree.
void add_seq2seq(dsl::ModelBuilder& mb, const Seq2SeqConfig& config,
                 const std::function<dsl::Tensor(dsl::Tensor)>& encoder,
                 const std::function<dsl::Tensor(Decoding&, dsl::Tensor)>& decoder,
                 const std::function<dsl::Tensor(dsl::Tensor)>& head,
                 dsl::Loc loc = dsl::Loc::current());

}  // namespace kiln::nn
