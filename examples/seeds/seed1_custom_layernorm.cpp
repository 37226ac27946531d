// Seed write-up 001 (../shared/seeds/001_81f6dddc71a43d39.txt): the encoder-decoder
// Transformer with its own LayerNorm. What distinguishes it: the norm is
// alpha * (x - mean) / (x.std(-1) + eps) + beta (unbiased standard deviation, eps 1e-6 added
// outside the square root, parameters alpha and beta), inside ResidualConnection modules
// (residual_connection_<i>.norm: norm(x + sublayer(x)), post-norm); no final norm on either
// stack; attention projections W_q, W_k, W_v, W_o without biases; masks filled with -1e9;
// Embedding modules holding `embedding`; a sinusoid buffer per side (source_pe.pe,
// target_pe.pe); FFN linear_1/linear_2; the vocabulary projection linear_projection.linear.
// The write-up leaves the masks to the caller and shows no mask function: as its twin,
// source key padding (encoder and cross-attention), target key padding and the lower
// triangle (decoder self-attention).
// PyTorch twin: make_golden.py (Seed1).
#include <cmath>
#include <string>

#include "frontend/generator.h"

KILN_MODEL(seed1_custom_layernorm,
           "seed 001: LayerNorm alpha*(x-mean)/(std+1e-6)+beta (unbiased), no final norms",
           {{"small",
             {{"src_vocab", 29},
              {"tgt_vocab", 33},
              {"d_model", 32},
              {"heads", 4},
              {"d_ff", 48},
              {"layers", 2},
              {"pad_id", 0},
              {"bos_id", 1},
              {"max_len", 16},
              {"max_batch", 4}}}}) {
  using namespace kiln;
  using dsl::Tensor;
  auto get = [&](const char* key) { return models::config_value(config, key); };
  const int64_t d = get("d_model"), heads = get("heads"), d_ff = get("d_ff");
  const int64_t max_len = get("max_len"), pad = get("pad_id");
  dsl::ModelBuilder mb("seed1_custom_layernorm");
  const dsl::Dim B = mb.symbol("B", get("max_batch"));
  const dsl::Dim S = mb.symbol("S", max_len), T = mb.symbol("T", max_len);
  dsl::FunctionBuilder& f = mb.function("forward");
  Tensor src = f.input("src", dsl::DType::i64, {B, S});
  Tensor tgt = f.input("tgt", dsl::DType::i64, {B, T});

  // Keep masks (src != pad)[:, None, None, :] and (tgt != pad)[:, None, None, :] & tril,
  // negated into kiln's masks (true where a score is masked).
  const dsl::Dim one = dsl::Dim::constant(1);
  auto keep_keys = [&](Tensor ids, dsl::Dim L) {
    return dsl::reshape(dsl::ne(ids, dsl::scalar(ids, static_cast<double>(pad))), {B, one, one, L});
  };
  Tensor tril = dsl::ge(dsl::iota(f, dsl::DType::i64, {one, one, T, T}, 2),
                        dsl::iota(f, dsl::DType::i64, {one, one, T, T}, 3));
  Tensor source_mask = dsl::logical_not(keep_keys(src, S));
  Tensor target_mask = dsl::logical_not(dsl::logical_and(keep_keys(tgt, T), tril));

  // Embedding modules (`<side>_embed.embedding`, times sqrt(d_model)), then `<side>_pe.pe`.
  auto embed = [&](const std::string& side, int64_t vocab, Tensor ids, dsl::Dim L) {
    Tensor x =
        nn::Embedding{side + "_embed.embedding", vocab, d}(ids)*std::sqrt(static_cast<double>(d));
    return x + dsl::slice(f.weight(side + "_pe.pe", {1, max_len, d}), 1, 0, L);
  };
  auto attention = [&](const std::string& prefix) {
    return nn::MultiHeadAttention{prefix,
                                  d,
                                  heads,
                                  "W_q",
                                  "W_k",
                                  "W_v",
                                  "W_o",
                                  /*qkv_bias=*/false,
                                  /*o_bias=*/false};
  };
  // ResidualConnection i: norm(x + sublayer(x)) with the write-up's LayerNorm.
  auto residual = [&](const std::string& block, int i, Tensor x, Tensor sublayer_out) {
    nn::LayerNorm norm{block + ".residual_connection_" + std::to_string(i) + ".norm",
                       d,
                       1e-6,
                       /*unbiased=*/true,
                       /*eps_outside=*/true,
                       "alpha",
                       "beta"};
    return norm(x + sublayer_out);
  };
  auto ffn = [&](const std::string& block) {
    return nn::FeedForward{block + ".feed_forward_block", d,          d_ff,
                           nn::Activation::relu,          "linear_1", "linear_2"};
  };

  Tensor x = embed("source", get("src_vocab"), src, S);
  for (int64_t l = 0; l < get("layers"); ++l) {
    const std::string b = "encoder_blocks." + std::to_string(l);
    x = residual(b, 1, x, attention(b + ".self_attn_block")(x, x, source_mask));
    x = residual(b, 2, x, ffn(b)(x));
  }
  Tensor y = embed("target", get("tgt_vocab"), tgt, T);
  for (int64_t l = 0; l < get("layers"); ++l) {
    const std::string b = "decoder_blocks." + std::to_string(l);
    y = residual(b, 1, y, attention(b + ".self_attn_block")(y, y, target_mask));
    y = residual(b, 2, y, attention(b + ".cross_attn_block")(y, x, source_mask));
    y = residual(b, 3, y, ffn(b)(y));
  }
  f.output(nn::Linear{"linear_projection.linear", d, get("tgt_vocab")}(y), "logits");
  return mb.finish();
}
