// A post-norm encoder tagger (BERT-like): token and learned position embeddings with a
// LayerNorm, post-norm encoder blocks with a GELU feed-forward, the first token's state
// through a tanh pooler, and independent sigmoid scores per label.
// PyTorch twin: make_golden.py (MultiLabel).
#include "frontend/generator.h"

KILN_MODEL(multilabel, "post-norm encoder, first-token tanh pooler, sigmoid scores per label",
           {{"small",
             {{"vocab", 31},
              {"d_model", 18},
              {"heads", 3},
              {"d_ff", 30},
              {"layers", 2},
              {"labels", 7},
              {"pad_id", 0},
              {"max_len", 16},
              {"max_batch", 4}}}}) {
  using namespace kiln;
  auto get = [&](const char* key) { return models::config_value(config, key); };
  const int64_t d = get("d_model");
  dsl::ModelBuilder mb("multilabel");
  const dsl::Dim B = mb.symbol("B", get("max_batch")), S = mb.symbol("S", get("max_len"));
  dsl::FunctionBuilder& f = mb.function("forward");
  dsl::Tensor ids = f.input("ids", dsl::DType::i64, {B, S});

  dsl::Tensor x = nn::PositionEmbedding{"pos_emb", get("max_len"),
                                        d}(nn::Embedding{"tok_emb", get("vocab"), d}(ids));
  x = nn::LayerNorm{"emb_norm", d}(x);
  dsl::Tensor mask = nn::key_padding_mask(ids, get("pad_id"));
  nn::EncoderBlock block{
      "", d, get("heads"), get("d_ff"), /*pre_norm=*/false, nn::Activation::gelu};
  for (int64_t l = 0; l < get("layers"); ++l) {
    block.prefix = "layers." + std::to_string(l);
    x = block(x, mask);
  }
  dsl::Tensor pooled = dsl::tanh(nn::Linear{"pooler", d, d}(nn::first_token(x)));
  f.output(dsl::sigmoid(nn::Linear{"head", d, get("labels")}(pooled)), "scores");
  return mb.finish();
}
