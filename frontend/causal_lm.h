// Generation for a decoder-only model the user writes: the layers are written once, as a
// function of a Decoding context, and kiln derives from them every entry point that
// generation needs (kiln_generate and `kiln generate` run them):
//
//   forward(ids i64[B,T]) -> logits f32[B,T,V]
//       the teacher-forced pass: causal self-attention over the whole sequence.
//   prefill(ids i64[N,L], start i64[N], cache_k<l>, cache_v<l> f32[T,C,G·d]...)
//       -> logits f32[N,1,V], cache_k<l>_out, cache_v<l>_out...
//       the prompt pass, as GEMMs over all L positions: prompts left-padded to a common
//       length L, row n's prompt starting at start[n] (positions before it are padding:
//       never attended, their outputs unused); every layer's keys and values written into
//       its caches at [0..L-1, n] in place; the logits of the last position.
//   decode_step(tok i64[N,1], pos i64[1], rows i64[N,P], start i64[N], caches...)
//       -> logits f32[N,1,V], caches_out...
//       one token per hypothesis n at cache position pos: its keys and values written at
//       [pos, n] in place; it attends to positions j < P through rows[n, j], the cache slot
//       holding its key at j (beam search reorders hypotheses by rewriting rows, never the
//       cache), -1 where there is none (the prompt's padding); P = pos + 1.
//
// In every entry point, ctx.positions() gives each token's position in its own sequence
// (i64 [N or 1, L]: 0 at the first prompt token), for learned or rotary position embeddings, and
// ctx.attention() is the layer's causal self-attention: the fused attention op in forward
// and prefill (the caches written beside it), cache_write + cache_attention in decode_step.
// Each attention call has its pair of caches, in call order (the layers' order): cache_k<l>,
// cache_v<l> of shape [T, C, kv_heads·d_head]. forward's run of the body records them; prefill
// and decode_step declare them from that record before their run, which must make the same
// calls. AttentionSpec::bias, computed from ctx.positions() and ctx.key_positions(), reaches
// the fused attention and cache_attention alike.
//
// Symbols: B (max max_batch), T (max max_len) and N, C (max max_batch·max_beam), L and P
// (max max_len). The module config gets `generation = causal_lm`, `vocab`, `max_beam`,
// `bos_id`, `eos_id` (and `pad_id` if set), which kiln_generate reads.
//
// Example (a LLaMA-style model; examples/models/llama.cpp is the whole of it):
//
//   nn::CausalLMConfig c{.vocab = 256, .max_len = 64, .max_batch = 4};
//   dsl::ModelBuilder mb("llama");
//   nn::add_causal_lm(mb, c,
//       [&](nn::Decoding& ctx, dsl::Tensor ids) {          // ids [N, L] -> hidden [N, L, d]
//         dsl::Tensor x = nn::Embedding{"embed_tokens", 256, 64}(ids);
//         for (int l = 0; l < 2; ++l) {
//           ... q, k, v projections, rotary on ctx.positions() ...
//           x = x + o_proj(ctx.attention(q, k, v, {.heads = 4, .kv_heads = 2}));
//           ...
//         }
//         return x;
//       },
//       [&](dsl::Tensor h) { return lm_head(norm(h)); });     // hidden [.., d] -> logits [.., V]
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "frontend/dsl.h"

namespace kiln::nn {

struct CausalLMConfig {
  int64_t vocab = 0;
  int64_t max_len = 0;    // the longest sequence: prompt and generated tokens together
  int64_t max_batch = 1;  // prompts per call
  int64_t max_beam = 1;   // beam search: up to max_batch × max_beam hypotheses at once
  int64_t bos_id = -1;    // -1: none (generation then needs an explicit start)
  int64_t eos_id = -1;    // the default end token; -1: none (generation stops at max length)
  int64_t pad_id = -1;    // written to the config when set; the runtime pads with -1 anyway
};

// The attention of one layer: q [N, L, heads·d_head], k [N, L, kv_heads·d_head],
// v [N, L, kv_heads·d_v]; scores q·kᵀ · scale (0: 1/√d_head; 1: none, as T5) plus `bias`
// when given; window W > 0: a query at position i sees keys i - W < j <= i (a sliding
// window), else all keys j <= i.
struct AttentionSpec {
  int64_t heads = 0;
  int64_t kv_heads = 0;  // 0: heads (multi-head); 1: multi-query; else grouped-query
  double scale = 0;
  int64_t window = 0;
  // An additive score bias f32 [N' or 1, heads or 1, Lq, Lk] (T5's relative position buckets,
  // ALiBi), computed from ctx.positions() (queries) and ctx.key_positions() (keys) so that it
  // has the right shape in every entry point: Lq = Lk = L in forward and prefill, Lq = 1 and
  // Lk = P in decode_step (nn::T5RelativeBias and nn::alibi_bias take the two).
  dsl::Tensor bias;
};

struct Seq2SeqConfig;  // seq2seq.h

class Decoding {
 public:
  enum class Mode { forward, prefill, step, prepare };

  // forward: teacher-forced; prefill: a decoder-only model's prompt pass; step: one token of
  // decode_step; prepare: an encoder–decoder's pass over the source (only the memory's keys
  // and values, which ctx.cross_attention projects, are kept: the rest of the body is dead
  // code, removed by the passes).
  Mode mode() const { return mode_; }
  // i64 [N or 1, L] (decode_step: [N or 1, 1]): each token's position in its own sequence.
  dsl::Tensor positions() const { return positions_; }
  // i64 [N or 1, Lk]: the position of each key the self-attention sees (Lk = L, or P in
  // decode_step), for a score bias; a decoder-only prompt's padding has negative positions
  // (its keys are never attended).
  dsl::Tensor key_positions() const { return key_positions_; }
  // Causal self-attention of the next layer (each call is one layer, with its own caches):
  // [N, L, heads·d_v].
  dsl::Tensor attention(dsl::Tensor q, dsl::Tensor k, dsl::Tensor v, const AttentionSpec& spec,
                        dsl::Loc loc = dsl::Loc::current());
  // Encoder–decoder models only (nn::add_seq2seq): attention of q [N, L, heads·d_head] to the
  // encoder's output, whose keys and values are key(memory) [B, S, kv·d_head] and
  // value(memory) [B, S, kv·d_v] (the layer's projections). They are computed once per batch in
  // `prepare`, never per step; source padding (pad_id) is masked. spec.window and spec.bias
  // must be unset, spec.kv_heads must be 0 or heads.
  dsl::Tensor cross_attention(dsl::Tensor q, const std::function<dsl::Tensor(dsl::Tensor)>& key,
                              const std::function<dsl::Tensor(dsl::Tensor)>& value,
                              const AttentionSpec& spec, dsl::Loc loc = dsl::Loc::current());

 private:
  // causal_lm.cpp: build the entry points around the body.
  friend struct DecodingBuilder;
  friend void add_causal_lm(dsl::ModelBuilder&, const CausalLMConfig&,
                            const std::function<dsl::Tensor(Decoding&, dsl::Tensor)>&,
                            const std::function<dsl::Tensor(dsl::Tensor)>&, dsl::Loc);
  friend void add_seq2seq(dsl::ModelBuilder&, const Seq2SeqConfig&,
                          const std::function<dsl::Tensor(dsl::Tensor)>&,
                          const std::function<dsl::Tensor(Decoding&, dsl::Tensor)>&,
                          const std::function<dsl::Tensor(dsl::Tensor)>&, dsl::Loc);
  Mode mode_ = Mode::forward;
  bool seq2seq_ = false;
  dsl::FunctionBuilder* fb_ = nullptr;
  dsl::Tensor positions_, key_positions_, key_pad_, pos_, rows_;
  dsl::Tensor memory_, src_pad_, src_row_;  // encoder–decoder: [B,S,D], bool [B,S], i64 [N]
  ir::Dim T_, C_;
  // Caches and memory inputs declared before the body runs (prefill, prepare, step), in the
  // order forward's calls recorded their widths.
  std::vector<int64_t> cache_widths_, memory_widths_;
  std::vector<dsl::Tensor> cache_in_, memory_in_;
  std::vector<dsl::Tensor> updated_;     // the written caches (k, v, k, v, ...) per attention()
  std::vector<dsl::Tensor> memory_out_;  // prepare: the projected memory per cross_attention()
  std::map<int64_t, dsl::Tensor> self_masks_;  // forward, prefill: the causal mask per window
  dsl::Tensor cross_mask_;                     // the source padding [B, 1, 1, S]
  size_t cross_calls_ = 0;
};

// Adds forward, prefill and decode_step (above) to `mb` from `body` (ids [N, L] -> hidden
// [N, L, D], attention through the context) and `head` (hidden [..., D] -> logits
// [..., vocab]), and sets the module's symbols and generation config. Throws kiln::Error for a
// bad config or a body whose functions disagree (e.g. another number of layers per entry
// point).
void add_causal_lm(dsl::ModelBuilder& mb, const CausalLMConfig& config,
                   const std::function<dsl::Tensor(Decoding&, dsl::Tensor)>& body,
                   const std::function<dsl::Tensor(dsl::Tensor)>& head,
                   dsl::Loc loc = dsl::Loc::current());

}  // namespace kiln::nn
