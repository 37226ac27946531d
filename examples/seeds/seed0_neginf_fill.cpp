// Seed write-up 000 (../shared/seeds/000_e19cebd730983f9d.txt): the encoder-decoder
// Transformer that masks with -inf. What distinguishes it: masked_fill(mask == 0, -inf)
// instead of -1e9 (a query whose keys are all masked would give NaN, as in PyTorch; these
// masks always keep key 0); one sinusoid buffer pos_encoding.pe for both sides; post-norm
// layers with nn.LayerNorm (eps 1e-5) and a final LayerNorm after each stack (encoder.norm,
// decoder.norm); FFN feed_forward.linear1/linear2; an untied output_layer (its prose speaks of
// sharing, its code shares nothing). The write-up leaves the masks to the caller and shows no
// mask function: as its twin, source key padding for the encoder and as memory mask, target
// key padding and the lower triangle for decoder self-attention.
// PyTorch twin: make_golden.py (Seed0).
#include <cmath>
#include <limits>
#include <string>

#include "frontend/generator.h"

KILN_MODEL(seed0_neginf_fill,
           "seed 000: masks filled with -inf, final norms, one shared positional buffer",
           {{"small",
             {{"src_vocab", 31},
              {"tgt_vocab", 37},
              {"d_model", 24},
              {"heads", 3},
              {"d_ff", 40},
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
  dsl::ModelBuilder mb("seed0_neginf_fill");
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
  Tensor src_mask = dsl::logical_not(keep_keys(src, S));
  Tensor tgt_mask = dsl::logical_not(dsl::logical_and(keep_keys(tgt, T), tril));

  // Embeddings times sqrt(d_model) plus pos_encoding.pe[:, :L].
  Tensor pe = f.weight("pos_encoding.pe", {1, max_len, d});
  auto embed = [&](const std::string& table, int64_t vocab, Tensor ids, dsl::Dim L) {
    Tensor x = nn::Embedding{table, vocab, d}(ids)*std::sqrt(static_cast<double>(d));
    return x + dsl::slice(pe, 1, 0, L);
  };
  auto attention = [&](const std::string& prefix) {
    return nn::MultiHeadAttention{.prefix = prefix,
                                  .d_model = d,
                                  .heads = heads,
                                  .fill = -std::numeric_limits<double>::infinity()};
  };
  auto norm = [&](const std::string& prefix) { return nn::LayerNorm{prefix, d}; };
  auto ffn = [&](const std::string& prefix) {
    return nn::FeedForward{prefix + ".feed_forward", d,         d_ff,
                           nn::Activation::relu,     "linear1", "linear2"};
  };

  Tensor x = embed("src_embedding", get("src_vocab"), src, S);
  for (int64_t l = 0; l < get("layers"); ++l) {
    const std::string p = "encoder.layers." + std::to_string(l);
    x = norm(p + ".norm1")(x + attention(p + ".self_attn")(x, x, src_mask));
    x = norm(p + ".norm2")(x + ffn(p)(x));
  }
  Tensor memory = norm("encoder.norm")(x);
  Tensor y = embed("tgt_embedding", get("tgt_vocab"), tgt, T);
  for (int64_t l = 0; l < get("layers"); ++l) {
    const std::string p = "decoder.layers." + std::to_string(l);
    y = norm(p + ".norm1")(y + attention(p + ".self_attn")(y, y, tgt_mask));
    y = norm(p + ".norm2")(y + attention(p + ".cross_attn")(y, memory, src_mask));
    y = norm(p + ".norm3")(y + ffn(p)(y));
  }
  y = norm("decoder.norm")(y);
  f.output(nn::Linear{"output_layer", d, get("tgt_vocab")}(y), "logits");
  return mb.finish();
}
