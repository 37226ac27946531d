// A pre-norm encoder classifier (BERT-like, pre-norm): learned positions, pre-norm
// encoder blocks with a GELU feed-forward, a final LayerNorm, mean pooling over the valid
// positions and a linear classifier; outputs the logits and the softmax over classes.
// PyTorch twin: make_golden.py (Classifier).
#include "frontend/generator.h"

KILN_MODEL(classifier, "pre-norm encoder classifier: learned positions, GELU, mean pooling",
           {{"small",
             {{"vocab", 29},
              {"d_model", 20},
              {"heads", 4},
              {"d_ff", 36},
              {"layers", 2},
              {"classes", 5},
              {"pad_id", 0},
              {"max_len", 16},
              {"max_batch", 4}}}}) {
  using namespace kiln;
  auto get = [&](const char* key) { return models::config_value(config, key); };
  const int64_t d = get("d_model");
  dsl::ModelBuilder mb("classifier");
  const dsl::Dim B = mb.symbol("B", get("max_batch")), S = mb.symbol("S", get("max_len"));
  dsl::FunctionBuilder& f = mb.function("forward");
  dsl::Tensor ids = f.input("ids", dsl::DType::i64, {B, S});

  dsl::Tensor x = nn::Embedding{"tok_emb", get("vocab"), d}(ids);
  x = nn::PositionEmbedding{"pos_emb", get("max_len"), d}(x);
  dsl::Tensor mask = nn::key_padding_mask(ids, get("pad_id"));  // [B,1,1,S]
  nn::EncoderBlock block{"", d, get("heads"), get("d_ff"), /*pre_norm=*/true, nn::Activation::gelu};
  for (int64_t l = 0; l < get("layers"); ++l) {
    block.prefix = "layers." + std::to_string(l);
    x = block(x, mask);
  }
  x = nn::LayerNorm{"norm", d}(x);
  dsl::Tensor pooled = nn::mean_pool(x, nn::padding_mask(ids, get("pad_id")));
  dsl::Tensor logits = nn::Linear{"classifier", d, get("classes")}(pooled);
  f.output(logits, "logits");
  f.output(dsl::softmax(logits, -1), "probs");
  return mb.finish();
}
