// Seed write-up 004 (../shared/seeds/004_026ae558ff9b0225.txt): the encoder-decoder
// Transformer without final norms. What distinguishes it: neither stack ends with a
// LayerNorm (the last layer's norm3 feeds the vocabulary projection, decoder.fc_out, inside
// the decoder); the attention output projection is named fc_out (w_q, w_k, w_v, fc_out);
// the embeddings and sinusoid buffers live inside the stacks (encoder.embedding,
// encoder.pos_encoder.pe, ...); masks from its make_pad_mask ((k != pad)[:, None, None, :])
// and make_subsequent_mask (tril [1, L, L]), fill -1e9; post-norm layers with nn.LayerNorm
// (eps 1e-5); FFN feed_forward.w_1/w_2.
// PyTorch twin: make_golden.py (Seed4).
#include <cmath>
#include <string>

#include "frontend/generator.h"

KILN_MODEL(seed4_no_final_norm,
           "seed 004: no final norm on either stack, attention output named fc_out, -1e9",
           {{"small",
             {{"src_vocab", 32},
              {"tgt_vocab", 39},
              {"d_model", 24},
              {"heads", 4},
              {"d_ff", 60},
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
  dsl::ModelBuilder mb("seed4_no_final_norm");
  const dsl::Dim B = mb.symbol("B", get("max_batch"));
  const dsl::Dim S = mb.symbol("S", max_len), T = mb.symbol("T", max_len);
  dsl::FunctionBuilder& f = mb.function("forward");
  Tensor src = f.input("src", dsl::DType::i64, {B, S});
  Tensor tgt = f.input("tgt", dsl::DType::i64, {B, T});

  // make_pad_mask: (k != pad)[:, None, None, :]; make_subsequent_mask: tril [1, L, L]; kiln's
  // masks are their negations (true where a score is masked).
  const dsl::Dim one = dsl::Dim::constant(1);
  auto make_pad_mask = [&](Tensor k, dsl::Dim L) {
    return dsl::reshape(dsl::ne(k, dsl::scalar(k, static_cast<double>(pad))), {B, one, one, L});
  };
  Tensor subsequent = dsl::ge(dsl::iota(f, dsl::DType::i64, {one, T, T}, 1),
                              dsl::iota(f, dsl::DType::i64, {one, T, T}, 2));
  Tensor src_mask = dsl::logical_not(make_pad_mask(src, S));
  Tensor tgt_mask = dsl::logical_not(dsl::logical_and(make_pad_mask(tgt, T), subsequent));

  auto embed = [&](const std::string& stack, int64_t vocab, Tensor ids, dsl::Dim L) {
    Tensor x = nn::Embedding{stack + ".embedding", vocab, d}(ids)*std::sqrt(static_cast<double>(d));
    return x + dsl::slice(f.weight(stack + ".pos_encoder.pe", {1, max_len, d}), 1, 0, L);
  };
  auto attention = [&](const std::string& prefix) {
    return nn::MultiHeadAttention{prefix, d, heads, "w_q", "w_k", "w_v", "fc_out"};
  };
  auto norm = [&](const std::string& prefix) { return nn::LayerNorm{prefix, d}; };
  auto ffn = [&](const std::string& prefix) {
    return nn::FeedForward{prefix + ".feed_forward", d, d_ff};
  };

  Tensor x = embed("encoder", get("src_vocab"), src, S);
  for (int64_t l = 0; l < get("layers"); ++l) {
    const std::string p = "encoder.layers." + std::to_string(l);
    x = norm(p + ".norm1")(x + attention(p + ".self_attn")(x, x, src_mask));
    x = norm(p + ".norm2")(x + ffn(p)(x));
  }
  Tensor y = embed("decoder", get("tgt_vocab"), tgt, T);
  for (int64_t l = 0; l < get("layers"); ++l) {
    const std::string p = "decoder.layers." + std::to_string(l);
    y = norm(p + ".norm1")(y + attention(p + ".self_attn")(y, y, tgt_mask));
    y = norm(p + ".norm2")(y + attention(p + ".cross_attn")(y, x, src_mask));
    y = norm(p + ".norm3")(y + ffn(p)(y));
  }
  f.output(nn::Linear{"decoder.fc_out", d, get("tgt_vocab")}(y), "logits");
  return mb.finish();
}
