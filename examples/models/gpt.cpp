// A decoder-only causal language model (GPT-like): learned positions, pre-norm blocks
// with a causal mask and a GELU (tanh form, as GPT-2) feed-forward, a final LayerNorm and
// an output projection tied to the token embedding (one stored weight).
// PyTorch twin: make_golden.py (Gpt).
#include "frontend/generator.h"

KILN_MODEL(gpt, "decoder-only causal LM: learned positions, pre-norm, tied output projection",
           {{"small",
             {{"vocab", 37},
              {"d_model", 24},
              {"heads", 4},
              {"d_ff", 52},
              {"layers", 2},
              {"max_len", 24},
              {"max_batch", 3}}}}) {
  using namespace kiln;
  auto get = [&](const char* key) { return models::config_value(config, key); };
  const int64_t d = get("d_model");
  dsl::ModelBuilder mb("gpt");
  const dsl::Dim B = mb.symbol("B", get("max_batch")), T = mb.symbol("T", get("max_len"));
  dsl::FunctionBuilder& f = mb.function("forward");
  dsl::Tensor ids = f.input("ids", dsl::DType::i64, {B, T});

  nn::Embedding tok_emb{"tok_emb", get("vocab"), d};
  dsl::Tensor x = nn::PositionEmbedding{"pos_emb", get("max_len"), d}(tok_emb(ids));
  dsl::Tensor causal = nn::causal_mask(ids);  // [1,1,T,T]
  nn::EncoderBlock block{
      "", d, get("heads"), get("d_ff"), /*pre_norm=*/true, nn::Activation::gelu_tanh};
  for (int64_t l = 0; l < get("layers"); ++l) {
    block.prefix = "blocks." + std::to_string(l);
    x = block(x, causal);
  }
  x = nn::LayerNorm{"ln_f", d}(x);
  f.output(tok_emb.tied_projection(x), "logits");
  return mb.finish();
}
