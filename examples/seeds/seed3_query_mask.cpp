// Seed write-up 003 (../shared/seeds/003_2c60c57d5bb3dc01.txt): the encoder-decoder
// Transformer whose target mask pads queries, not keys. What distinguishes it: its
// create_padding_mask makes the target mask (tgt != pad)[:, None, :, None] & tril, so a padded
// target position (a row of the scores) is masked whole and gets a uniform softmax over -1e9;
// the decoder is called without a memory mask, so cross-attention is unmasked; q, k and v
// projections W_q, W_k, W_v have no bias (W_o has one); a final LayerNorm after the encoder
// only (encoder.norm), none after the decoder; one sinusoid buffer positional_encoding.pe for
// both sides; post-norm layers with nn.LayerNorm (eps 1e-5); FFN ffn.linear1/linear2; the
// vocabulary projection fc_out.
// PyTorch twin: make_golden.py (Seed3).
#include <cmath>
#include <string>

#include "frontend/generator.h"

KILN_MODEL(seed3_query_mask,
           "seed 003: target mask pads queries, unmasked cross-attention, encoder-only final norm",
           {{"small",
             {{"src_vocab", 30},
              {"tgt_vocab", 34},
              {"d_model", 28},
              {"heads", 2},
              {"d_ff", 44},
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
  dsl::ModelBuilder mb("seed3_query_mask");
  const dsl::Dim B = mb.symbol("B", get("max_batch"));
  const dsl::Dim S = mb.symbol("S", max_len), T = mb.symbol("T", max_len);
  dsl::FunctionBuilder& f = mb.function("forward");
  Tensor src = f.input("src", dsl::DType::i64, {B, S});
  Tensor tgt = f.input("tgt", dsl::DType::i64, {B, T});

  // create_padding_mask's keep masks, negated into kiln's (true where a score is masked):
  // src (src != pad)[:, None, None, :]; tgt (tgt != pad)[:, None, :, None] & tril.
  const dsl::Dim one = dsl::Dim::constant(1);
  auto not_pad = [&](Tensor ids) {
    return dsl::ne(ids, dsl::scalar(ids, static_cast<double>(pad)));
  };
  Tensor tril = dsl::ge(dsl::iota(f, dsl::DType::i64, {one, one, T, T}, 2),
                        dsl::iota(f, dsl::DType::i64, {one, one, T, T}, 3));
  Tensor src_mask = dsl::logical_not(dsl::reshape(not_pad(src), {B, one, one, S}));
  Tensor tgt_mask =
      dsl::logical_not(dsl::logical_and(dsl::reshape(not_pad(tgt), {B, one, T, one}), tril));

  // Embeddings times sqrt(d_model) plus positional_encoding.pe[:, :L].
  Tensor pe = f.weight("positional_encoding.pe", {1, max_len, d});
  auto embed = [&](const std::string& table, int64_t vocab, Tensor ids, dsl::Dim L) {
    Tensor x = nn::Embedding{table, vocab, d}(ids)*std::sqrt(static_cast<double>(d));
    return x + dsl::slice(pe, 1, 0, L);
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
                                  /*o_bias=*/true};
  };
  auto norm = [&](const std::string& prefix) { return nn::LayerNorm{prefix, d}; };
  auto ffn = [&](const std::string& prefix) {
    return nn::FeedForward{prefix + ".ffn", d, d_ff, nn::Activation::relu, "linear1", "linear2"};
  };

  Tensor x = embed("encoder_embedding", get("src_vocab"), src, S);
  Tensor y = embed("decoder_embedding", get("tgt_vocab"), tgt, T);
  for (int64_t l = 0; l < get("layers"); ++l) {
    const std::string p = "encoder.layers." + std::to_string(l);
    x = norm(p + ".norm1")(x + attention(p + ".self_attn")(x, x, src_mask));
    x = norm(p + ".norm2")(x + ffn(p)(x));
  }
  Tensor memory = norm("encoder.norm")(x);
  for (int64_t l = 0; l < get("layers"); ++l) {
    const std::string p = "decoder.layers." + std::to_string(l);
    y = norm(p + ".norm1")(y + attention(p + ".self_attn")(y, y, tgt_mask));
    y = norm(p + ".norm2")(y + attention(p + ".cross_attn")(y, memory, Tensor()));  // no mask
    y = norm(p + ".norm3")(y + ffn(p)(y));
  }
  f.output(nn::Linear{"fc_out", d, get("tgt_vocab")}(y), "logits");  // no final decoder norm
  return mb.finish();
}
