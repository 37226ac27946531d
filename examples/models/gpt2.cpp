// A GPT-2-style decoder-only language model, written the way Hugging Face's modeling_gpt2.py
// writes it: learned positions, pre-norm blocks (ln_1, ln_2), one fused Q/K/V projection
// `c_attn` split in three, Conv1D weights stored [in, out] (x·W + b), a GELU (tanh form) MLP,
// a final ln_f and an output projection tied to the token embedding, with the checkpoint's
// state_dict names (transformer.h.0.attn.c_attn.weight, ...). nn::add_causal_lm derives
// forward, prefill and decode_step from the blocks written once.
// PyTorch twin: make_generate_golden.py.
#include <string>

#include "frontend/causal_lm.h"
#include "frontend/generator.h"
#include "frontend/nn.h"

KILN_MODEL(gpt2, "GPT-2-style decoder-only LM: learned positions, Conv1D weights, tied head",
           {{"small",
             {{"vocab", 53},
              {"d_model", 24},
              {"heads", 3},
              {"layers", 2},
              {"n_positions", 48},
              {"max_len", 48},
              {"max_batch", 3},
              {"max_beam", 4},
              {"eos_id", 2}}}}) {
  using namespace kiln;
  using dsl::Dim;
  using dsl::Tensor;
  auto get = [&](const char* key) { return models::config_value(config, key); };
  const int64_t d = get("d_model"), heads = get("heads"), vocab = get("vocab");
  dsl::ModelBuilder mb("gpt2");

  // Conv1D: x·W + b with W [in, out] (GPT-2's layout).
  auto conv1d = [&](const std::string& name, Tensor x, int64_t in, int64_t out) {
    dsl::FunctionBuilder& f = *x.builder();
    return dsl::matmul(x, f.weight(name + ".weight", {in, out})) + f.weight(name + ".bias", {out});
  };
  auto layer_norm = [&](const std::string& name, Tensor x) {
    return nn::LayerNorm{name, d, 1e-5}(x);
  };

  nn::CausalLMConfig c;
  c.vocab = vocab;
  c.max_len = get("max_len");
  c.max_batch = get("max_batch");
  c.max_beam = get("max_beam");
  c.eos_id = get("eos_id");
  nn::add_causal_lm(
      mb, c,
      [&](nn::Decoding& ctx, Tensor ids) {
        dsl::FunctionBuilder& f = *ids.builder();
        Tensor x = dsl::gather(f.weight("transformer.wte.weight", {vocab, d}), ids) +
                   dsl::gather(f.weight("transformer.wpe.weight", {get("n_positions"), d}),
                               ctx.positions());
        for (int64_t l = 0; l < get("layers"); ++l) {
          const std::string p = "transformer.h." + std::to_string(l);
          Tensor qkv = conv1d(p + ".attn.c_attn", layer_norm(p + ".ln_1", x), d, 3 * d);
          const Dim D = Dim::constant(d);
          Tensor q = dsl::slice(qkv, 2, 0, D), k = dsl::slice(qkv, 2, d, D),
                 v = dsl::slice(qkv, 2, 2 * d, D);
          x = x + conv1d(p + ".attn.c_proj", ctx.attention(q, k, v, {.heads = heads}), d, d);
          Tensor h = conv1d(p + ".mlp.c_fc", layer_norm(p + ".ln_2", x), d, 4 * d);
          x = x + conv1d(p + ".mlp.c_proj", dsl::gelu_tanh(h), 4 * d, d);
        }
        return layer_norm("transformer.ln_f", x);
      },
      [&](Tensor h) {
        dsl::FunctionBuilder& f = *h.builder();
        return dsl::matmul(h,
                           dsl::transpose(f.weight("transformer.wte.weight", {vocab, d}), {1, 0}));
      });
  return mb.finish();
}
