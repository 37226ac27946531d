// A T5-style encoder–decoder (T5 v1.1), written the way Hugging Face's modeling_t5.py writes
// it: RMS norms before each sublayer (T5LayerNorm: no mean, no bias), unscaled attention scores
// plus a relative position bias (bucketed distances, learned per head in the first layer and
// shared by the others: bidirectional in the encoder, causal in the decoder), a gated-GELU
// feed-forward network (wo(gelu_tanh(wi_0 x) · wi_1 x)) and an untied output projection, with
// the checkpoint's state_dict names (encoder.block.0.layer.0.SelfAttention.q, ...).
// nn::add_seq2seq derives forward, encode, prepare and decode_step from the layers written
// once, so the model generates through kiln_generate (greedy, beam search, sampling).
// PyTorch twin: make_generate_golden.py.
#include <string>

#include "frontend/generator.h"
#include "frontend/nn.h"
#include "frontend/seq2seq.h"

KILN_MODEL(t5, "T5-style encoder-decoder: RMS norms, relative position bias, gated-GELU FFN",
           {{"small",
             {{"vocab", 59},
              {"d_model", 32},
              {"heads", 4},
              {"d_kv", 8},
              {"d_ff", 40},
              {"layers", 2},
              {"buckets", 16},
              {"max_distance", 20},
              {"max_len", 40},
              {"max_src_len", 16},
              {"max_batch", 3},
              {"max_beam", 4}}}}) {
  using namespace kiln;
  using dsl::Dim;
  using dsl::Tensor;
  auto get = [&](const char* key) { return models::config_value(config, key); };
  const int64_t d = get("d_model"), heads = get("heads"), d_kv = get("d_kv");
  const int64_t inner = heads * d_kv, d_ff = get("d_ff"), vocab = get("vocab");
  const int64_t layers = get("layers");
  dsl::ModelBuilder mb("t5");

  // T5LayerNorm: weight * (x * rsqrt(mean(x^2, -1) + eps)), eps 1e-6.
  auto norm = [&](const std::string& name, Tensor x) {
    dsl::FunctionBuilder& f = *x.builder();
    Tensor var = dsl::reduce_mean(x * x, {-1}, /*keepdims=*/true);
    return f.weight(name + ".weight", {d}) * (x * dsl::rsqrt(var + 1e-6));
  };
  // nn.Linear(in, out, bias=False).
  auto linear = [&](const std::string& name, int64_t in, int64_t out) {
    return [=](Tensor x) {
      dsl::FunctionBuilder& f = *x.builder();
      return dsl::matmul(x, dsl::transpose(f.weight(name + ".weight", {out, in}), {1, 0}));
    };
  };
  // T5DenseGatedActDense: wo(gelu_new(wi_0(x)) * wi_1(x)).
  auto ffn = [&](const std::string& p, Tensor x) {
    Tensor g = dsl::gelu_tanh(linear(p + ".wi_0", d, d_ff)(x));
    return linear(p + ".wo", d_ff, d)(g * linear(p + ".wi_1", d, d_ff)(x));
  };
  auto bias_of = [&](const std::string& stack, bool bidirectional) {
    return nn::T5RelativeBias{stack + ".block.0.layer.0.SelfAttention.relative_attention_bias",
                              heads, get("buckets"), get("max_distance"), bidirectional};
  };
  const nn::AttentionSpec spec{.heads = heads, .scale = 1.0};  // T5 does not scale scores

  nn::Seq2SeqConfig c;
  c.vocab = vocab;
  c.max_len = get("max_len");
  c.max_src_len = get("max_src_len");
  c.max_batch = get("max_batch");
  c.max_beam = get("max_beam");
  c.bos_id = 0;  // T5's decoder_start_token_id is its pad token
  c.eos_id = 1;
  c.pad_id = 0;
  nn::add_seq2seq(
      mb, c,
      [&](Tensor src) {  // T5Stack (encoder): the attention written out as PyTorch does it
        dsl::FunctionBuilder& f = *src.builder();
        const Dim B = src.dim(0), S = src.dim(1), one = Dim::constant(1);
        Tensor x = dsl::gather(f.weight("shared.weight", {vocab, d}), src);
        // Padding (id 0) masked as keys; the bias [1, H, S, S], shared by every layer.
        Tensor pad = dsl::reshape(dsl::eq(src, dsl::scalar(src, 0)), {B, one, one, S});
        Tensor bias = bias_of("encoder", true)(f, S, S);
        auto heads_of = [&](Tensor t) {
          return dsl::transpose(dsl::reshape(t, {B, S, Dim::constant(heads), Dim::constant(d_kv)}),
                                {0, 2, 1, 3});
        };
        for (int64_t l = 0; l < layers; ++l) {
          const std::string p = "encoder.block." + std::to_string(l) + ".layer.";
          Tensor h = norm(p + "0.layer_norm", x);
          const std::string a = p + "0.SelfAttention.";
          Tensor q = heads_of(linear(a + "q", d, inner)(h)),
                 k = heads_of(linear(a + "k", d, inner)(h));
          Tensor v = heads_of(linear(a + "v", d, inner)(h));
          Tensor scores = dsl::matmul(q, dsl::transpose(k, {0, 1, 3, 2})) + bias;
          scores = dsl::select(pad, dsl::scalar(scores, -1e9), scores);
          Tensor o = dsl::matmul(dsl::softmax(scores, -1), v);
          o = dsl::reshape(dsl::transpose(o, {0, 2, 1, 3}), {B, S, Dim::constant(inner)});
          x = x + linear(a + "o", inner, d)(o);
          x = x + ffn(p + "1.DenseReluDense", norm(p + "1.layer_norm", x));
        }
        return norm("encoder.final_layer_norm", x);
      },
      [&](nn::Decoding& ctx, Tensor tgt) {  // T5Stack (decoder), through the decoding context
        dsl::FunctionBuilder& f = *tgt.builder();
        Tensor x = dsl::gather(f.weight("shared.weight", {vocab, d}), tgt);
        nn::AttentionSpec self = spec;
        self.bias = bias_of("decoder", false)(ctx.positions(), ctx.key_positions());
        for (int64_t l = 0; l < layers; ++l) {
          const std::string p = "decoder.block." + std::to_string(l) + ".layer.";
          Tensor h = norm(p + "0.layer_norm", x);
          const std::string a = p + "0.SelfAttention.", e = p + "1.EncDecAttention.";
          Tensor o = ctx.attention(linear(a + "q", d, inner)(h), linear(a + "k", d, inner)(h),
                                   linear(a + "v", d, inner)(h), self);
          x = x + linear(a + "o", inner, d)(o);
          h = norm(p + "1.layer_norm", x);
          o = ctx.cross_attention(linear(e + "q", d, inner)(h), linear(e + "k", d, inner),
                                  linear(e + "v", d, inner), spec);
          x = x + linear(e + "o", inner, d)(o);
          x = x + ffn(p + "2.DenseReluDense", norm(p + "2.layer_norm", x));
        }
        return norm("decoder.final_layer_norm", x);
      },
      [&](Tensor h) { return linear("lm_head", d, vocab)(h); });
  return mb.finish();
}
