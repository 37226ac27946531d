// The paper's Transformer ("Attention Is All You Need"), written from the installed DSL as
// a user would: token embeddings scaled by sqrt(d_model) plus sinusoidal positions,
// post-norm encoder and decoder blocks (ReLU feed-forward), a final LayerNorm on each
// stack, a key padding mask on the source and causal + padding on the target, and an
// output projection to the target vocabulary.
// PyTorch twin: make_golden.py (Transformer).
#include <cmath>

#include "frontend/generator.h"

KILN_MODEL(transformer, "the paper's encoder-decoder Transformer, post-norm, from nn blocks",
           {{"small",
             {{"src_vocab", 31},
              {"tgt_vocab", 23},
              {"d_model", 24},
              {"heads", 4},
              {"d_ff", 40},
              {"enc_layers", 2},
              {"dec_layers", 2},
              {"pad_id", 0},
              {"max_len", 16},
              {"max_batch", 4}}}}) {
  using namespace kiln;
  auto get = [&](const char* key) { return models::config_value(config, key); };
  const int64_t d = get("d_model"), heads = get("heads"), d_ff = get("d_ff");
  const int64_t pad = get("pad_id"), max_len = get("max_len");
  dsl::ModelBuilder mb("transformer");
  const dsl::Dim B = mb.symbol("B", get("max_batch"));
  const dsl::Dim S = mb.symbol("S", max_len), T = mb.symbol("T", max_len);
  dsl::FunctionBuilder& f = mb.function("forward");
  dsl::Tensor src = f.input("src", dsl::DType::i64, {B, S});
  dsl::Tensor tgt = f.input("tgt", dsl::DType::i64, {B, T});

  // emb(ids) * sqrt(d_model) + PE[0:L].
  const double scale = static_cast<float>(std::sqrt(static_cast<double>(d)));
  dsl::Tensor pe = dsl::sinusoid_table(f, max_len, d);
  auto embed = [&](const char* name, int64_t vocab, dsl::Tensor ids) {
    dsl::Tensor x = nn::Embedding{name, vocab, d}(ids)*scale;
    return x + dsl::slice(pe, 0, 0, ids.dim(1));
  };

  dsl::Tensor src_mask = nn::key_padding_mask(src, pad);     // [B,1,1,S]
  dsl::Tensor tgt_mask = nn::causal_padding_mask(tgt, pad);  // [B,1,T,T]
  dsl::Tensor memory = embed("src_embed", get("src_vocab"), src);
  nn::EncoderBlock enc{"", d, heads, d_ff};  // post-norm, ReLU
  for (int64_t l = 0; l < get("enc_layers"); ++l) {
    enc.prefix = "encoder.layers." + std::to_string(l);
    memory = enc(memory, src_mask);
  }
  memory = nn::LayerNorm{"encoder.norm", d}(memory);

  dsl::Tensor y = embed("tgt_embed", get("tgt_vocab"), tgt);
  nn::DecoderBlock dec{"", d, heads, d_ff};
  for (int64_t l = 0; l < get("dec_layers"); ++l) {
    dec.prefix = "decoder.layers." + std::to_string(l);
    y = dec(y, memory, src_mask, tgt_mask);
  }
  y = nn::LayerNorm{"decoder.norm", d}(y);
  f.output(nn::Linear{"generator", d, get("tgt_vocab")}(y), "logits");
  return mb.finish();
}
