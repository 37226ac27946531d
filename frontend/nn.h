// nn building blocks of the reference Transformer, written in the DSL. Each block
// names its weights with a state_dict prefix, so a module built from them binds the
// PyTorch reference model's checkpoint as is (Linear weights are [out, in]).
#pragma once

#include <cstdint>
#include <string>

#include "frontend/dsl.h"

namespace kiln::nn {

using dsl::Tensor;

// y = x·Wᵀ + b with W `prefix.weight` [out, in] and b `prefix.bias` [out].
struct Linear {
  std::string prefix;
  int64_t in = 0, out = 0;
  Tensor operator()(Tensor x) const;
};

// LayerNorm over the last axis, biased variance; `prefix.{weight,bias}` [dim].
struct LayerNorm {
  std::string prefix;
  int64_t dim = 0;
  double eps = 1e-5;
  Tensor operator()(Tensor x) const;
};

// w_2(relu(w_1(x))).
struct FeedForward {
  std::string prefix;
  int64_t d_model = 0, d_ff = 0;
  Tensor operator()(Tensor x) const;
};

// A key mask for attention: bool, true where the score must be masked. Its shape
// broadcasts against the scores [B, heads, Lq, Lk] (e.g. [B,1,1,Lk] or [B,1,Lq,Lk]).
// An invalid Tensor means no mask.
struct MultiHeadAttention {
  std::string prefix;
  int64_t d_model = 0, heads = 0;
  // Queries from `xq` [B,Lq,d_model], keys and values from `xkv` [B,Lk,d_model].
  Tensor operator()(Tensor xq, Tensor xkv, Tensor mask) const;
};

struct TransformerConfig {
  int64_t src_vocab = 32000, tgt_vocab = 32000, d_model = 512, heads = 8, d_ff = 2048;
  int64_t enc_layers = 6, dec_layers = 6, pad_id = 0, max_len = 128, max_batch = 16;
  int64_t max_beam = 4;            // decoding: up to max_batch × max_beam hypotheses at once
  int64_t bos_id = 1, eos_id = 2;  // generation's default start and end tokens (target side)
};

// x = norm1(x + self_attn(x, mask)); x = norm2(x + ffn(x)).
struct EncoderLayer {
  std::string prefix;
  const TransformerConfig* cfg = nullptr;
  Tensor operator()(Tensor x, Tensor src_mask) const;
};

// x = norm1(x + self_attn(x, tgt_mask)); x = norm2(x + cross_attn(x, memory, src_mask));
// x = norm3(x + ffn(x)).
struct DecoderLayer {
  std::string prefix;
  const TransformerConfig* cfg = nullptr;
  Tensor operator()(Tensor x, Tensor memory, Tensor src_mask, Tensor tgt_mask) const;
};

// Layers then the final `encoder.norm`.
struct Encoder {
  const TransformerConfig* cfg = nullptr;
  Tensor operator()(Tensor x, Tensor src_mask) const;
};

struct Decoder {
  const TransformerConfig* cfg = nullptr;
  Tensor operator()(Tensor x, Tensor memory, Tensor src_mask, Tensor tgt_mask) const;
};

// emb(ids) * sqrt(d_model) + PE[pos] for ids [B, L] with L a symbol of max max_len.
Tensor embed(const std::string& table, Tensor ids, const TransformerConfig& cfg, int64_t vocab);

// Key padding mask [B,1,1,L] (true where ids == pad_id).
Tensor key_padding_mask(Tensor ids, int64_t pad_id);
// Causal ∨ key padding mask [B,1,L,L] for decoder self-attention.
Tensor causal_padding_mask(Tensor ids, int64_t pad_id);

// The encoder–decoder Transformer with entry points
//   forward(src i64[B,S], tgt i64[B,T]) -> logits f32[B,T,tgt_vocab]
//   encode(src i64[B,S]) -> memory f32[B,S,d_model]
//   prepare(src i64[B,S]) -> mem_k<l>, mem_v<l> f32[B,S,d_model] for each decoder layer l:
//     the encoder output projected once into every layer's cross-attention keys, values
//   decode_step(tok i64[N,1], pos i64[1], rows i64[N,P], src_row i64[N], src i64[B,S],
//               mem_k<l>, mem_v<l> f32[B,S,d_model]..., cache_k<l>, cache_v<l> f32[T,C,d_model]...)
//     -> logits f32[N,1,tgt_vocab], cache_k<l>_out, cache_v<l>_out...
//     one decoder step for N hypotheses at position pos (all at the same step): the new
//     token's keys and values are written into the caches at [pos, n] (the results are the
//     caches updated in place: compiled code requires the same buffers), and hypothesis n
//     attends to the cached positions j < P through rows[n, j] (the cache slot holding its
//     key at position j; P = pos + 1) and to source sentence src_row[n].
// Symbols: B (max max_batch), S and T (max max_len), N and C (max max_batch·max_beam), P (max
// max_len). Throws kiln::Error for a bad config (e.g. d_model not divisible by heads).
ir::Module build_transformer(const TransformerConfig& cfg);

}  // namespace kiln::nn
