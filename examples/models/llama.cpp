// A LLaMA-style decoder-only language model, written the way Hugging Face's modeling_llama.py
// writes it: RMSNorm before each sublayer (x · rsqrt(mean(x²) + eps) · w), rotary position
// embeddings (half-split rotate_half, any base), grouped-query attention (fewer key/value
// heads), a SwiGLU feed-forward network (down(silu(gate(x)) · up(x))) and an untied output
// projection, with the checkpoint's state_dict names (model.layers.0.self_attn.q_proj, ...).
// nn::add_causal_lm derives forward, prefill and decode_step from the layers written once, so
// the model generates through kiln_generate (greedy, beam search, sampling).
// PyTorch twin: make_llama_golden.py.
#include <cmath>
#include <string>

#include "frontend/causal_lm.h"
#include "frontend/generator.h"

KILN_MODEL(llama, "LLaMA-style decoder-only LM: RMSNorm, rotary, grouped-query attention, SwiGLU",
           {{"small",
             {{"vocab", 61},
              {"d_model", 32},
              {"heads", 4},
              {"kv_heads", 2},
              {"d_ff", 44},
              {"layers", 2},
              {"rope_theta", 10000},
              {"max_len", 48},
              {"max_batch", 3},
              {"max_beam", 4},
              {"eos_id", 2}}}}) {
  using namespace kiln;
  using dsl::Dim;
  using dsl::Tensor;
  auto get = [&](const char* key) { return models::config_value(config, key); };
  const int64_t d = get("d_model"), heads = get("heads"), kv_heads = get("kv_heads");
  const int64_t hd = d / heads, d_ff = get("d_ff"), vocab = get("vocab");
  const double eps = 1e-5, theta = static_cast<double>(get("rope_theta"));
  dsl::ModelBuilder mb("llama");

  // LlamaRMSNorm: weight * (x * rsqrt(mean(x^2, -1) + eps)).
  auto rms_norm = [&](const std::string& name, Tensor x) {
    dsl::FunctionBuilder& f = *x.builder();
    Tensor var = dsl::reduce_mean(x * x, {-1}, /*keepdims=*/true);
    return f.weight(name + ".weight", {d}) * (x * dsl::rsqrt(var + eps));
  };
  auto linear = [&](const std::string& name, Tensor x, int64_t in, int64_t out) {
    dsl::FunctionBuilder& f = *x.builder();
    return dsl::matmul(x, dsl::transpose(f.weight(name + ".weight", {out, in}), {1, 0}));
  };
  // Rotary embedding of x [N, L, H·hd] at positions [N, L]: x·cos + rotate_half(x)·sin per
  // head, with inv_freq = 1 / theta^(2i/hd) and the angles repeated over both halves.
  auto rotary = [&](Tensor x, Tensor positions, int64_t h) {
    dsl::FunctionBuilder& f = *x.builder();
    const Dim N = x.dim(0), L = x.dim(1), half = Dim::constant(hd / 2);
    Tensor i = dsl::cast(dsl::iota(f, dsl::DType::i64, {half}, 0), dsl::DType::f32);
    Tensor inv_freq = 1.0 / dsl::exp(i * (2.0 * std::log(theta) / static_cast<double>(hd)));
    Tensor pos = dsl::reshape(dsl::cast(positions, dsl::DType::f32), {N, L, Dim::constant(1)});
    Tensor freqs = pos * inv_freq;                // [N, L, hd/2]
    Tensor emb = dsl::concat({freqs, freqs}, 2);  // [N, L, hd]
    const std::vector<Dim> rows = {N, L, Dim::constant(1), Dim::constant(hd)};
    Tensor cos = dsl::reshape(dsl::cos(emb), rows), sin = dsl::reshape(dsl::sin(emb), rows);
    Tensor xh = dsl::reshape(x, {N, L, Dim::constant(h), Dim::constant(hd)});
    Tensor x1 = dsl::slice(xh, 3, 0, half), x2 = dsl::slice(xh, 3, hd / 2, half);
    Tensor rotated = dsl::concat({-x2, x1}, 3);
    return dsl::reshape(xh * cos + rotated * sin, {N, L, Dim::constant(h * hd)});
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
        Tensor x = dsl::gather(f.weight("model.embed_tokens.weight", {vocab, d}), ids);
        for (int64_t l = 0; l < get("layers"); ++l) {
          const std::string p = "model.layers." + std::to_string(l);
          Tensor h = rms_norm(p + ".input_layernorm", x);
          Tensor q = linear(p + ".self_attn.q_proj", h, d, heads * hd);
          Tensor k = linear(p + ".self_attn.k_proj", h, d, kv_heads * hd);
          Tensor v = linear(p + ".self_attn.v_proj", h, d, kv_heads * hd);
          q = rotary(q, ctx.positions(), heads);
          k = rotary(k, ctx.positions(), kv_heads);
          Tensor a = ctx.attention(q, k, v, {.heads = heads, .kv_heads = kv_heads});
          x = x + linear(p + ".self_attn.o_proj", a, heads * hd, d);
          h = rms_norm(p + ".post_attention_layernorm", x);
          Tensor gate = dsl::silu(linear(p + ".mlp.gate_proj", h, d, d_ff));
          x = x +
              linear(p + ".mlp.down_proj", gate * linear(p + ".mlp.up_proj", h, d, d_ff), d_ff, d);
        }
        return rms_norm("model.norm", x);  // LlamaModel ends with its norm
      },
      [&](Tensor h) { return linear("lm_head", h, d, vocab); });
  return mb.finish();
}
