// A model written as a user writes one (frontend/generator.h), for the generator tests:
// mean-pooled embeddings through a linear layer, with two configs.
#include "frontend/generator.h"

KILN_MODEL(toy, "mean-pooled embeddings and a linear layer",
           {{"small", {{"vocab", 11}, {"dim", 6}, {"classes", 3}, {"max_len", 9}}},
            {"wide", {{"vocab", 11}, {"dim", 16}, {"classes", 5}, {"max_len", 9}}}}) {
  using namespace kiln;
  const int64_t vocab = models::config_value(config, "vocab");
  const int64_t dim = models::config_value(config, "dim");
  const int64_t classes = models::config_value(config, "classes");
  dsl::ModelBuilder mb("toy");
  const dsl::Dim B = mb.symbol("B", 4), S = mb.symbol("S", models::config_value(config, "max_len"));
  mb.set_config("dim", std::to_string(dim));
  dsl::FunctionBuilder& f = mb.function("forward");
  dsl::Tensor ids = f.input("ids", dsl::DType::i64, {B, S});
  dsl::Tensor x = dsl::gather(f.weight("emb.weight", {vocab, dim}), ids);
  f.output(nn::Linear{"head", dim, classes}(dsl::reduce_mean(x, {1})), "logits");
  return mb.finish();
}
