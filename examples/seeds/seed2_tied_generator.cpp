// Seed write-up 002 (../shared/seeds/002_1941aeb8be709000.txt): the encoder-decoder
// Transformer with the output projection tied to the target embedding. What distinguishes
// it: `generator.weight` is `decoder.embedding.weight` (stored once, under the embedding's
// name) with a bias of its own (`generator.bias`); the embeddings and sinusoid buffers live
// inside the stacks (`encoder.embedding`, `encoder.pos_encoder.pe`, ...); post-norm layers
// with nn.LayerNorm (eps 1e-5) and a final LayerNorm after each stack; masks built by the
// model with fill -1e9: source key padding (encoder and cross-attention), target key padding
// and the lower triangle (decoder self-attention).
// PyTorch twin: make_golden.py (Seed2).
#include <cmath>
#include <string>

#include "frontend/generator.h"

KILN_MODEL(seed2_tied_generator,
           "seed 002: generator tied to the target embedding (own bias), final norms, -1e9",
           {{"small",
             {{"src_vocab", 35},
              {"tgt_vocab", 41},
              {"d_model", 24},
              {"heads", 4},
              {"d_ff", 56},
              {"layers", 2},
              {"pad_id", 1},
              {"bos_id", 2},
              {"max_len", 16},
              {"max_batch", 4}}}}) {
  using namespace kiln;
  using dsl::Tensor;
  auto get = [&](const char* key) { return models::config_value(config, key); };
  const int64_t d = get("d_model"), heads = get("heads"), d_ff = get("d_ff");
  const int64_t max_len = get("max_len"), pad = get("pad_id");
  dsl::ModelBuilder mb("seed2_tied_generator");
  const dsl::Dim B = mb.symbol("B", get("max_batch"));
  const dsl::Dim S = mb.symbol("S", max_len), T = mb.symbol("T", max_len);
  dsl::FunctionBuilder& f = mb.function("forward");
  Tensor src = f.input("src", dsl::DType::i64, {B, S});
  Tensor tgt = f.input("tgt", dsl::DType::i64, {B, T});

  // The write-up's keep masks (true where attention may look), negated into kiln's masks
  // (true where a score is masked): src (src != pad)[:, None, None, :], tgt the same of tgt
  // and the lower triangle (key j <= query i).
  const dsl::Dim one = dsl::Dim::constant(1);
  auto keep_keys = [&](Tensor ids, dsl::Dim L) {
    return dsl::reshape(dsl::ne(ids, dsl::scalar(ids, static_cast<double>(pad))), {B, one, one, L});
  };
  Tensor tril = dsl::ge(dsl::iota(f, dsl::DType::i64, {one, one, T, T}, 2),
                        dsl::iota(f, dsl::DType::i64, {one, one, T, T}, 3));
  Tensor src_mask = dsl::logical_not(keep_keys(src, S));
  Tensor tgt_mask = dsl::logical_not(dsl::logical_and(keep_keys(tgt, T), tril));

  // Each stack: its embedding times sqrt(d_model) plus its buffer pe[:, :L], then layers, then
  // its final norm.
  auto embed = [&](const std::string& stack, int64_t vocab, Tensor ids, dsl::Dim L) {
    Tensor x = nn::Embedding{stack + ".embedding", vocab, d}(ids)*std::sqrt(static_cast<double>(d));
    return x + dsl::slice(f.weight(stack + ".pos_encoder.pe", {1, max_len, d}), 1, 0, L);
  };
  auto attention = [&](const std::string& prefix) {
    return nn::MultiHeadAttention{prefix, d, heads};
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
  Tensor memory = norm("encoder.norm")(x);

  Tensor y = embed("decoder", get("tgt_vocab"), tgt, T);
  for (int64_t l = 0; l < get("layers"); ++l) {
    const std::string p = "decoder.layers." + std::to_string(l);
    y = norm(p + ".norm1")(y + attention(p + ".self_attn")(y, y, tgt_mask));
    y = norm(p + ".norm2")(y + attention(p + ".cross_attn")(y, memory, src_mask));
    y = norm(p + ".norm3")(y + ffn(p)(y));
  }
  y = norm("decoder.norm")(y);
  // generator: the decoder embedding's weight (tied) and a bias of its own.
  nn::Embedding tgt_embedding{"decoder.embedding", get("tgt_vocab"), d};
  f.output(tgt_embedding.tied_projection(y) + f.weight("generator.bias", {get("tgt_vocab")}),
           "logits");
  return mb.finish();
}
