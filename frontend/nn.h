// nn building blocks, written in the DSL, and the reference Transformer. Each block
// names its weights with a PyTorch state_dict prefix, so a module built from them binds
// the checkpoint of a PyTorch model with the same module tree as is.
//
// The state_dict naming convention (a PyTorch twin uses these attribute names):
//   Linear                 <p>.weight [out, in], <p>.bias [out]      (nn.Linear)
//   LayerNorm              <p>.weight [dim], <p>.bias [dim]          (nn.LayerNorm)
//                          or the names its `weight` and `bias` fields give, e.g.
//                          <p>.alpha, <p>.beta (the Annotated Transformer's LayerNorm)
//   Embedding              <p>.weight [vocab, dim]                    (nn.Embedding)
//   PositionEmbedding      <p>.weight [max_len, dim]                  (nn.Embedding over arange(L))
//   MultiHeadAttention     <p>.w_q, <p>.w_k, <p>.w_v, <p>.w_o          (four Linear [d_model,
//                          d_model]; other names and no biases: its fields q, k, v, o,
//                          qkv_bias, o_bias, e.g. W_q ... without bias)
//   FeedForward            <p>.w_1 [d_ff, d_model], <p>.w_2 [d_model, d_ff]   (Linear; other
//                          names: its fields w1, w2, e.g. linear1/linear2)
//   RMSNorm                <p>.weight [dim]                           (LlamaRMSNorm)
//   GatedFeedForward       <p>.gate_proj, <p>.up_proj [d_ff, d_model], <p>.down_proj
//                          [d_model, d_ff] (LlamaMLP: Linears without bias)
//   SparseMoE              <p>.gate [experts, d_model], <p>.experts.{e}.w1, .w3 [d_ff, d_model]
//                          and .w2 [d_model, d_ff] (MixtralSparseMoeBlock)
//   EncoderBlock           <p>.self_attn, <p>.ffn, <p>.norm1, <p>.norm2
//   DecoderBlock           <p>.self_attn, <p>.cross_attn, <p>.ffn, <p>.norm1..norm3
// Weight tying (Embedding::tied_projection) stores the shared weight once, under the
// embedding's name, as PyTorch's safetensors writers keep a tied tensor.
//
// Every block takes the caller's source location (defaulted) and checks its configuration
// before it builds anything: a misuse is a kiln::Error naming the block's module path and
// the user's line, e.g.
//   dsl error at gpt.cpp:31 in 'layers.0.self_attn' (function 'forward'):
//   heads = 5 does not divide d_model = 64
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "frontend/dsl.h"

namespace kiln::nn {

using dsl::Loc;
using dsl::Tensor;

// The activation of a FeedForward: relu (the paper), gelu (erf form: PyTorch's
// F.gelu / nn.GELU()), gelu_tanh (nn.GELU(approximate="tanh"), GPT-2) or silu.
enum class Activation { relu, gelu, gelu_tanh, silu };

// act(x).
Tensor activate(Activation act, Tensor x, Loc loc = Loc::current());

// y = x·Wᵀ + b with W `prefix.weight` [out, in] and b `prefix.bias` [out] (no bias when
// `bias` is false). x [..., in].
struct Linear {
  std::string prefix;
  int64_t in = 0, out = 0;
  bool bias = true;
  Tensor operator()(Tensor x, Loc loc = Loc::current()) const;
};

// LayerNorm over the last axis: `prefix.<weight>` [dim] · (x - mean) / sqrt(var + eps) +
// `prefix.<bias>` [dim] with the biased variance (PyTorch's nn.LayerNorm), or a variant
// (dsl::LayerNormOptions): `unbiased` divides the variance by dim - 1 (x.std(-1); dim must
// then be at least 2), `eps_outside` divides by sqrt(var) + eps. The Annotated
// Transformer's `alpha * (x - mean) / (x.std(-1) + eps) + beta` with parameters
// `norm.alpha`, `norm.beta` is
//   nn::LayerNorm{"norm", 512, 1e-6, /*unbiased=*/true, /*eps_outside=*/true, "alpha", "beta"}
struct LayerNorm {
  std::string prefix;
  int64_t dim = 0;
  double eps = 1e-5;
  bool unbiased = false;
  bool eps_outside = false;
  std::string weight = "weight", bias = "bias";  // the parameters' names under the prefix
  Tensor operator()(Tensor x, Loc loc = Loc::current()) const;
};

// RMSNorm over the last axis (LLaMA, Mistral, Qwen, T5; `<p>.weight` [dim]), written as
// PyTorch code writes it, with plain DSL ops that the default pipeline fuses into one op
// (passes/fuse_rmsnorm.h):
//   x * rsqrt(mean(x * x, -1, keepdim) + eps) * weight
// `unit_offset` scales by (1 + weight) instead (Gemma, whose checkpoints store weight - 1).
struct RMSNorm {
  std::string prefix;
  int64_t dim = 0;
  double eps = 1e-6;
  bool unit_offset = false;
  Tensor operator()(Tensor x, Loc loc = Loc::current()) const;
};

// A token embedding: `prefix.weight` [vocab, dim] gathered by ids [...] -> [..., dim].
struct Embedding {
  std::string prefix;
  int64_t vocab = 0, dim = 0;
  Tensor operator()(Tensor ids, Loc loc = Loc::current()) const;
  // The output projection tied to this embedding's weight: x [..., dim] -> x·Wᵀ
  // [..., vocab] (logits over the vocabulary), with no weight of its own (PyTorch:
  // `head.weight = emb.weight`, no bias). The weight is stored once, as `prefix.weight`.
  Tensor tied_projection(Tensor x, Loc loc = Loc::current()) const;
};

// Learned positions: x [B, L, dim] + `prefix.weight`[0:L] with the weight [max_len, dim]
// (PyTorch: x + nn.Embedding(max_len, dim)(torch.arange(L))). L's declared maximum must
// not exceed max_len.
struct PositionEmbedding {
  std::string prefix;
  int64_t max_len = 0, dim = 0;
  Tensor operator()(Tensor x, Loc loc = Loc::current()) const;
};

// w_2(act(w_1(x))).
struct FeedForward {
  std::string prefix;
  int64_t d_model = 0, d_ff = 0;
  Activation act = Activation::relu;
  std::string w1 = "w_1", w2 = "w_2";  // the two Linears' names under prefix
  Tensor operator()(Tensor x, Loc loc = Loc::current()) const;
};

// The gated feed-forward of LLaMA-style models (SwiGLU; GeGLU with gelu_tanh):
//   down(act(gate(x)) * up(x))
// three bias-free Linears named as Hugging Face's checkpoints name them by default
// (`<p>.gate_proj.weight` [d_ff, d_model], `<p>.up_proj.weight` [d_ff, d_model],
// `<p>.down_proj.weight` [d_model, d_ff]); T5's names are `wi_0`, `wi_1`, `wo`.
struct GatedFeedForward {
  std::string prefix;
  int64_t d_model = 0, d_ff = 0;
  Activation act = Activation::silu;
  std::string gate = "gate_proj", up = "up_proj", down = "down_proj";
  Tensor operator()(Tensor x, Loc loc = Loc::current()) const;
};

// A sparse mixture-of-experts SwiGLU FFN (Hugging Face's MixtralSparseMoeBlock; its names
// under `prefix`, e.g. "layers.0.block_sparse_moe"): the router <p>.gate [experts, d_model]
// (a Linear without bias) -> softmax -> the top_k experts of each row (topk, their
// probabilities by take_along_axis) -> divided by their sum (renormalize; Qwen2-MoE's
// norm_topk_prob = false: not) -> moe_ffn over the experts <p>.experts.{e}.w1 [d_ff, d_model],
// .w2 [d_model, d_ff], .w3 [d_ff, d_model]: Σ_k w_k · w2(silu(w1 x) ⊙ w3 x). Compiled code
// computes only the chosen experts' products (work ∝ rows · top_k, not rows · experts).
struct SparseMoE {
  std::string prefix;
  int64_t d_model = 0, d_ff = 0, experts = 0, top_k = 2;
  bool renormalize = true;
  Tensor operator()(Tensor x, Loc loc = Loc::current()) const;
};

// A key mask for attention: bool, true where the score must be masked. Its shape
// broadcasts against the scores [B, heads, Lq, Lk] (e.g. [B,1,1,Lk], [1,1,Lq,Lk] or
// [B,1,Lq,Lk]). An invalid Tensor means no mask. Masked scores are `fill` before the
// softmax (PyTorch: scores.masked_fill(mask, fill)); scores are q·kᵀ / sqrt(d_model / heads).
// With fill = -inf a query whose keys are all masked gives NaN, as in PyTorch.
struct MultiHeadAttention {
  std::string prefix;
  int64_t d_model = 0, heads = 0;
  // The projections' names under prefix, and whether they have biases (q, k, v and o).
  std::string q = "w_q", k = "w_k", v = "w_v", o = "w_o";
  bool qkv_bias = true, o_bias = true;
  // Queries from `xq` [B,Lq,d_model], keys and values from `xkv` [B,Lk,d_model].
  Tensor operator()(Tensor xq, Tensor xkv, Tensor mask, Loc loc = Loc::current()) const;
  double fill = -1e9;  // the masked_fill value: -1e9 or -std::numeric_limits<double>::infinity()
};

// Rotary position embeddings (RoPE), as Hugging Face's models apply them to q and k in head
// layout [B, H, L, head_dim] between the head split and the scores:
//   half         (Llama, Mistral, Qwen, GPT-NeoX) rotate_half(x) = cat(-x2, x1), x1 and x2
//                the halves of the last dim; the tables cat(freqs, freqs)
//   interleaved  (GPT-J, RoFormer) rotate(x) = stack((-x[..., 1::2], x[..., 0::2]), -1)
//                .reshape(x.shape) (written with a reshape to [..., d/2, 2] and slices of
//                extent 1); the tables freqs repeated by pairs (repeat_interleave(2))
// and x·cos + rotate(x)·sin. The tables [L, head_dim] are computed in the graph with sin and
// cos: inv_freq[k] = base^(-2k/d), angle = (position / scaling) · inv_freq[k] (linear
// scaling; 1 for none), positions 0..L-1.
enum class RotaryStyle { half, interleaved };
struct Rotary {
  int64_t head_dim = 0;
  double base = 10000.0;
  double scaling = 1.0;
  RotaryStyle style = RotaryStyle::half;
  // cos and sin tables f32 [L, head_dim] of `fb` for positions 0..L-1.
  std::pair<Tensor, Tensor> tables(dsl::FunctionBuilder& fb, dsl::Dim L,
                                   Loc loc = Loc::current()) const;
  // x·cos + rotate(x)·sin for x [B, H, L, head_dim] and tables [L, head_dim] (broadcast).
  Tensor operator()(Tensor x, Tensor cos, Tensor sin, Loc loc = Loc::current()) const;
};

// How K and V heads are repeated for grouped-query attention, [B, KV, L, d] -> [B, KV·n, L,
// d], each KV head n times in a row: `expand` is Hugging Face's repeat_kv
// (x[:, :, None].expand(B, KV, n, L, d).reshape(B, KV·n, L, d)), `concat` is
// torch.repeat_interleave(x, n, dim=1) written as n copies of x[:, :, None] concatenated.
enum class RepeatKv { expand, concat };
Tensor repeat_kv(Tensor x, int64_t n_rep, RepeatKv how = RepeatKv::expand,
                 Loc loc = Loc::current());

// Attention as today's decoder models write it (Hugging Face's LlamaAttention and kin):
// `prefix.q_proj` [heads·head_dim, hidden], `prefix.k_proj` and `prefix.v_proj`
// [kv_heads·head_dim, hidden], `prefix.o_proj` [hidden, heads·head_dim] (biases when
// qkv_bias / o_bias), heads split and transposed, the rotary embedding applied to q and k
// when given (tables of `rotary`), K and V repeated to the query heads (`repeat`),
// scores = q·kᵀ · scaling (1/√head_dim; T5 uses 1), soft-capped to tanh(s/softcap)·softcap
// when softcap > 0 (Gemma 2), plus `bias` (broadcasting to [B, heads, L, L]: T5's relative
// position bias, ALiBi) when valid, masked_fill(mask, fill) when mask (bool, broadcasting
// to the scores) is valid, softmax, ·V, heads merged, o_proj.
struct GQAttention {
  std::string prefix;
  int64_t hidden = 0, heads = 0, kv_heads = 0, head_dim = 0;  // head_dim 0: hidden / heads
  bool qkv_bias = false, o_bias = false;
  bool rotary = false;  // apply Rotary{head_dim, rotary_base, rotary_scaling, rotary_style}
  double rotary_base = 10000.0, rotary_scaling = 1.0;
  RotaryStyle rotary_style = RotaryStyle::half;
  RepeatKv repeat = RepeatKv::expand;
  double scaling = 0;  // 0: 1/√head_dim
  double softcap = 0;
  double fill = -1e9;
  Tensor operator()(Tensor x, Tensor mask, Tensor bias = Tensor(), Loc loc = Loc::current()) const;
};

// T5's relative position bias [1, heads, Lq, Lk]: `prefix.weight` [buckets, heads] (the
// relative_attention_bias embedding) gathered at the bucket of j - i (Hugging Face's
// T5Attention._relative_position_bucket: bidirectional or not, num_buckets, max_distance).
struct T5RelativeBias {
  std::string prefix;
  int64_t heads = 0, buckets = 32, max_distance = 128;
  bool bidirectional = true;
  Tensor operator()(dsl::FunctionBuilder& fb, dsl::Dim Lq, dsl::Dim Lk,
                    Loc loc = Loc::current()) const;
  // The bias [N', heads, Lq, Lk] of queries at positions query_pos i64 [N', Lq] and keys at
  // key_pos i64 [N' or 1, Lk] (a Decoding context's positions() and key_positions(): the same
  // block in forward and decode_step).
  Tensor operator()(Tensor query_pos, Tensor key_pos, Loc loc = Loc::current()) const;
};

// ALiBi: slopes [heads] as the paper and Hugging Face's build_alibi_tensor compute them
// (2^(-8(h+1)/n) for a power of two n, interleaved extra slopes otherwise), and the bias
// slopes[h]·(j - i) [1, heads, Lq, Lk] (relative), or slopes[h]·j [1, heads, 1, Lk] (BLOOM:
// equal to it under the softmax, as row constants cancel).
Tensor alibi_slopes(dsl::FunctionBuilder& fb, int64_t heads, Loc loc = Loc::current());
Tensor alibi_bias(dsl::FunctionBuilder& fb, int64_t heads, dsl::Dim Lq, dsl::Dim Lk,
                  bool relative = true, Loc loc = Loc::current());
// The relative bias slopes[h]·(key position - query position) [N', heads, Lq, Lk] of queries at
// query_pos i64 [N', Lq] and keys at key_pos i64 [N' or 1, Lk] (a Decoding context's
// positions() and key_positions(): the same bias in forward, prefill and decode_step).
Tensor alibi_bias(Tensor query_pos, Tensor key_pos, int64_t heads, Loc loc = Loc::current());

// A sliding-window causal mask bool [1, 1, L, L] for ids [B, L]: true where key j > query i
// or i - j >= window (Mistral's local attention).
Tensor sliding_window_mask(Tensor ids, int64_t window, Loc loc = Loc::current());

// One encoder block: self-attention and a feed-forward network, each with a residual
// connection and a LayerNorm, either
//   post-norm (the paper, BERT): x = norm1(x + self_attn(x)); x = norm2(x + ffn(x))
//   pre-norm (GPT-2, ViT):       x = x + self_attn(norm1(x)); x = x + ffn(norm2(x))
// With a causal mask it is a GPT block.
struct EncoderBlock {
  std::string prefix;
  int64_t d_model = 0, heads = 0, d_ff = 0;
  bool pre_norm = false;
  Activation act = Activation::relu;
  double eps = 1e-5;
  Tensor operator()(Tensor x, Tensor mask, Loc loc = Loc::current()) const;
};

// One decoder block: self-attention (tgt_mask), cross-attention over `memory` (src_mask)
// and a feed-forward network, post-norm (norm1..norm3 after each residual sum) or pre-norm
// (before each sublayer), as EncoderBlock.
struct DecoderBlock {
  std::string prefix;
  int64_t d_model = 0, heads = 0, d_ff = 0;
  bool pre_norm = false;
  Activation act = Activation::relu;
  double eps = 1e-5;
  Tensor operator()(Tensor x, Tensor memory, Tensor src_mask, Tensor tgt_mask,
                    Loc loc = Loc::current()) const;
};

// Pooling of x [B, L, D] into [B, D]: the mean over the positions where `pad` [B, L]
// (bool, true at padding; see padding_mask) is false, as PyTorch's
// (x * ~pad[..., None]).sum(1) / (~pad).sum(1, keepdim=True). A row of padding only gives
// NaN, as there.
Tensor mean_pool(Tensor x, Tensor pad, Loc loc = Loc::current());
// x[:, 0, :] (BERT's [CLS] position).
Tensor first_token(Tensor x, Loc loc = Loc::current());

// bool [B, L], true where ids [B, L] == pad_id.
Tensor padding_mask(Tensor ids, int64_t pad_id, Loc loc = Loc::current());
// bool [1, 1, L, L] for ids [B, L], true above the diagonal (key j > query i): the causal
// mask of a decoder-only model (PyTorch: torch.triu(torch.ones(L, L), 1).bool()).
Tensor causal_mask(Tensor ids, Loc loc = Loc::current());

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
Tensor key_padding_mask(Tensor ids, int64_t pad_id, Loc loc = Loc::current());
// Causal ∨ key padding mask [B,1,L,L] for decoder self-attention.
Tensor causal_padding_mask(Tensor ids, int64_t pad_id, Loc loc = Loc::current());

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
// max_len). All four are derived by nn::add_seq2seq (seq2seq.h) from the decoder layer written
// once. Throws kiln::Error for a bad config (e.g. d_model not divisible by heads).
ir::Module build_transformer(const TransformerConfig& cfg);

}  // namespace kiln::nn
