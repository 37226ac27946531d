#!/usr/bin/python3
"""The PyTorch twins of the examples that generate -- llama.cpp (LLaMA-style, as Hugging Face's
modeling_llama.py writes it) and gpt2.cpp (GPT-2-style, as modeling_gpt2.py writes it) through
nn::add_causal_lm, t5.cpp (T5 v1.1-style, as modeling_t5.py writes it) through nn::add_seq2seq
-- and their golden data, including generation with a KV cache. Regenerate with:
    /usr/bin/python3 examples/models/make_generate_golden.py

Written next to this script, in golden/, for NAME in llama, gpt2, t5:

  NAME.weights.safetensors     F32 state_dict, Hugging Face's names (a tied weight once)
  NAME.inputs.safetensors      "ids" I64 [B, L] (t5: "src" [B, S] and "tgt" [B, T])
  NAME.expected.safetensors    "logits" [B, L, V] of the teacher-forced pass
  NAME.generate.safetensors    "prompts" I64 [B, P] (prompts of different lengths, -1 padded;
                               t5: sources of different lengths, padded with its pad id 0)
                               "greedy" I64 [B, 32]: greedy search with a KV cache, the new
                               tokens, -1 after the end token (not included)
                               "beam" I64 [B, 4, 32] and "beam_scores" F32 [B, 4]: beam search
                               with 4 beams and 4 hypotheses (kiln's search, kiln/runtime.h)

The search runs each prompt (source) on its own (batch 1, no padding) with a KV cache that grows
by one position per step, as Hugging Face's generate does; kiln runs the batch padded, so equal
ids also show that padding changes nothing. float32 throughout, single-threaded.
"""

import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from make_golden import write_safetensors  # the examples' one safetensors writer

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "golden")

C = dict(vocab=61, d_model=32, heads=4, kv_heads=2, d_ff=44, layers=2, rope_theta=10000.0,
         eps=1e-5, eos_id=2)
C_GPT2 = dict(vocab=53, d_model=24, heads=3, layers=2, n_positions=48, eos_id=2)
C_T5 = dict(vocab=59, d_model=32, heads=4, d_kv=8, d_ff=40, layers=2, buckets=16,
            max_distance=20, eos_id=1)
SOURCE_LENGTHS = [6, 11, 3]
PROMPT_LENGTHS = [5, 1, 9]
NEW_TOKENS = 32
BEAM = 4


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotary(positions, head_dim, theta):
    """cos, sin [L, head_dim] for positions [L] (Hugging Face's LlamaRotaryEmbedding)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def repeat_kv(x, n_rep):
    b, kv, l, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, kv, n_rep, l, d).reshape(b, kv * n_rep, l, d)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, self.h, self.kv = c["d_model"], c["heads"], c["kv_heads"]
        self.hd = d // self.h
        self.q_proj = nn.Linear(d, self.h * self.hd, bias=False)
        self.k_proj = nn.Linear(d, self.kv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, self.kv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.h * self.hd, d, bias=False)

    def forward(self, x, cos, sin, cache):
        """x [1, L, d] at the positions cos/sin were built for; cache: (k, v) of earlier
        positions [1, KV, P, hd] or None; returns the output and the grown cache."""
        b, l, _ = x.shape
        q = self.q_proj(x).view(b, l, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, l, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, l, self.kv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if cache is not None:
            k = torch.cat([cache[0], k], 2)
            v = torch.cat([cache[1], v], 2)
        new_cache = (k, v)
        k, v = repeat_kv(k, self.h // self.kv), repeat_kv(v, self.h // self.kv)
        scores = q @ k.transpose(-2, -1) * (self.hd ** -0.5)
        lk = k.shape[2]
        # Causal: query i (at key position lk - l + i) sees keys j <= lk - l + i.
        mask = torch.ones(l, lk, dtype=torch.bool).triu(lk - l + 1)
        scores = scores.masked_fill(mask, -1e9)
        o = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, l, self.h * self.hd)
        return self.o_proj(o), new_cache


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, f = c["d_model"], c["d_ff"]
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["d_model"], c["eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["d_model"], c["eps"])
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, cache):
        a, cache = self.self_attn(self.input_layernorm(x), cos, sin, cache)
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), cache


class Inner(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab"], c["d_model"])
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["d_model"], c["eps"])


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Inner(c)
        self.lm_head = nn.Linear(c["d_model"], c["vocab"], bias=False)

    def forward(self, ids, start=0, caches=None):
        """ids [B, L] at positions start.. (the same for every row); caches per layer or None.
        Returns logits [B, L, V] and the grown caches."""
        l = ids.shape[1]
        cos, sin = rotary(torch.arange(start, start + l), self.c["d_model"] // self.c["heads"],
                          self.c["rope_theta"])
        x = self.model.embed_tokens(ids)
        caches = caches or [None] * len(self.model.layers)
        grown = []
        for layer, cache in zip(self.model.layers, caches):
            x, cache = layer(x, cos, sin, cache)
            grown.append(cache)
        return self.lm_head(self.model.norm(x)), grown


class Conv1D(nn.Module):
    """GPT-2's linear layer: weight [in, out]."""
    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return x @ self.weight + self.bias


class GPT2Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["d_model"]
        self.h, self.hd = c["heads"], d // c["heads"]
        self.c_attn = Conv1D(d, 3 * d)
        self.c_proj = Conv1D(d, d)

    def forward(self, x, cache):
        b, l, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        split = lambda t: t.view(b, l, self.h, self.hd).transpose(1, 2)
        q, k, v = split(q), split(k), split(v)
        if cache is not None:
            k = torch.cat([cache[0], k], 2)
            v = torch.cat([cache[1], v], 2)
        scores = q @ k.transpose(-2, -1) / (self.hd ** 0.5)
        lk = k.shape[2]
        mask = torch.ones(l, lk, dtype=torch.bool).triu(lk - l + 1)
        scores = scores.masked_fill(mask, -1e9)
        o = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, l, d)
        return self.c_proj(o), (k, v)


class GPT2MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["d_model"]
        self.c_fc = Conv1D(d, 4 * d)
        self.c_proj = Conv1D(4 * d, d)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class GPT2Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c["d_model"])
        self.attn = GPT2Attention(c)
        self.ln_2 = nn.LayerNorm(c["d_model"])
        self.mlp = GPT2MLP(c)

    def forward(self, x, cache):
        a, cache = self.attn(self.ln_1(x), cache)
        x = x + a
        return x + self.mlp(self.ln_2(x)), cache


class GPT2Inner(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab"], c["d_model"])
        self.wpe = nn.Embedding(c["n_positions"], c["d_model"])
        self.h = nn.ModuleList(GPT2Block(c) for _ in range(c["layers"]))
        self.ln_f = nn.LayerNorm(c["d_model"])


class GPT2(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = GPT2Inner(c)

    def forward(self, ids, start=0, caches=None):
        t = self.transformer
        x = t.wte(ids) + t.wpe(torch.arange(start, start + ids.shape[1]))[None]
        caches = caches or [None] * len(t.h)
        grown = []
        for block, cache in zip(t.h, caches):
            x, cache = block(x, cache)
            grown.append(cache)
        return t.ln_f(x) @ t.wte.weight.T, grown


class T5Attention(nn.Module):
    """T5Attention: unscaled scores plus a relative position bias (computed by the first layer's
    attention and shared), no biases in the projections."""

    def __init__(self, c, has_bias=False, bidirectional=True):
        super().__init__()
        d, self.h, self.dkv = c["d_model"], c["heads"], c["d_kv"]
        inner = self.h * self.dkv
        self.q = nn.Linear(d, inner, bias=False)
        self.k = nn.Linear(d, inner, bias=False)
        self.v = nn.Linear(d, inner, bias=False)
        self.o = nn.Linear(inner, d, bias=False)
        self.c, self.bidirectional = c, bidirectional
        if has_bias:
            self.relative_attention_bias = nn.Embedding(c["buckets"], self.h)

    def bucket(self, rp):
        """Hugging Face's T5Attention._relative_position_bucket."""
        nb, md = self.c["buckets"], self.c["max_distance"]
        buckets = torch.zeros_like(rp)
        if self.bidirectional:
            nb //= 2
            buckets += (rp > 0).to(torch.long) * nb
            rp = torch.abs(rp)
        else:
            rp = -torch.min(rp, torch.zeros_like(rp))
        max_exact = nb // 2
        is_small = rp < max_exact
        large = max_exact + (torch.log(rp.float() / max_exact) / math.log(md / max_exact) *
                             (nb - max_exact)).to(torch.long)
        large = torch.min(large, torch.full_like(large, nb - 1))
        return buckets + torch.where(is_small, rp, large)

    def compute_bias(self, qpos, kpos):
        rp = kpos[None, :] - qpos[:, None]
        return self.relative_attention_bias(self.bucket(rp)).permute(2, 0, 1)[None]

    def forward(self, x, kv=None, bias=None, mask=None, cache=None):
        b, l, _ = x.shape
        split = lambda t: t.view(b, t.shape[1], self.h, self.dkv).transpose(1, 2)
        q = split(self.q(x))
        src = x if kv is None else kv
        k, v = split(self.k(src)), split(self.v(src))
        if cache is not None:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        scores = q @ k.transpose(-2, -1)
        if bias is not None:
            scores = scores + bias
        if mask is not None:
            scores = scores.masked_fill(mask, -1e9)
        o = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, l, self.h * self.dkv)
        return self.o(o), (k, v)


class T5Sublayer(nn.Module):
    """T5LayerSelfAttention, T5LayerCrossAttention or T5LayerFF: a norm and its module."""

    def __init__(self, c, name, module):
        super().__init__()
        self.layer_norm = RMSNorm(c["d_model"], 1e-6)
        setattr(self, name, module)


class T5FF(nn.Module):
    """T5DenseGatedActDense: wo(gelu_new(wi_0 x) * wi_1 x)."""

    def __init__(self, c):
        super().__init__()
        self.wi_0 = nn.Linear(c["d_model"], c["d_ff"], bias=False)
        self.wi_1 = nn.Linear(c["d_model"], c["d_ff"], bias=False)
        self.wo = nn.Linear(c["d_ff"], c["d_model"], bias=False)

    def forward(self, x):
        return self.wo(F.gelu(self.wi_0(x), approximate="tanh") * self.wi_1(x))


class T5Block(nn.Module):
    def __init__(self, c, first, decoder):
        super().__init__()
        layers = [T5Sublayer(c, "SelfAttention", T5Attention(c, first, not decoder))]
        if decoder:
            layers.append(T5Sublayer(c, "EncDecAttention", T5Attention(c)))
        layers.append(T5Sublayer(c, "DenseReluDense", T5FF(c)))
        self.layer = nn.ModuleList(layers)


class T5Stack(nn.Module):
    def __init__(self, c, decoder):
        super().__init__()
        self.block = nn.ModuleList(T5Block(c, i == 0, decoder) for i in range(c["layers"]))
        self.final_layer_norm = RMSNorm(c["d_model"], 1e-6)


class T5(nn.Module):
    """T5ForConditionalGeneration (v1.1: gated-GELU, untied head): pad 0 = decoder start, eos 1."""

    def __init__(self, c):
        super().__init__()
        self.shared = nn.Embedding(c["vocab"], c["d_model"])
        self.encoder = T5Stack(c, False)
        self.decoder = T5Stack(c, True)
        self.lm_head = nn.Linear(c["d_model"], c["vocab"], bias=False)

    def encode(self, src):
        x = self.shared(src)
        pad = (src == 0)[:, None, None, :]
        s = torch.arange(src.shape[1])
        bias = self.encoder.block[0].layer[0].SelfAttention.compute_bias(s, s)
        for block in self.encoder.block:
            a = block.layer[0]
            x = x + a.SelfAttention(a.layer_norm(x), bias=bias, mask=pad)[0]
            f = block.layer[1]
            x = x + f.DenseReluDense(f.layer_norm(x))
        return self.encoder.final_layer_norm(x), pad

    def decode(self, tgt, memory, pad, start=0, caches=None):
        x = self.shared(tgt)
        l = tgt.shape[1]
        qpos, kpos = torch.arange(start, start + l), torch.arange(0, start + l)
        bias = self.decoder.block[0].layer[0].SelfAttention.compute_bias(qpos, kpos)
        causal = kpos[None, :] > qpos[:, None]
        caches = caches or [None] * len(self.decoder.block)
        grown = []
        for block, cache in zip(self.decoder.block, caches):
            a, e, f = block.layer
            o, cache = a.SelfAttention(a.layer_norm(x), bias=bias, mask=causal, cache=cache)
            x = x + o
            x = x + e.EncDecAttention(e.layer_norm(x), kv=memory, mask=pad)[0]
            x = x + f.DenseReluDense(f.layer_norm(x))
            grown.append(cache)
        return self.lm_head(self.decoder.final_layer_norm(x)), grown

    def forward(self, src, tgt):
        memory, pad = self.encode(src)
        return self.decode(tgt, memory, pad)[0]

    def bound(self, src):
        """The decoder over one source (no padding), called as greedy and beam_search call a
        decoder-only model: (ids, start, caches) -> (logits, caches)."""
        memory, pad = self.encode(src[None])
        return lambda ids, start=0, caches=None: self.decode(ids, memory, pad, start, caches)


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("norm.weight") or \
                    ".ln_" in name and name.endswith("weight") or name.startswith("transformer.ln_f.w"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def greedy(model, prompt, steps, eos):
    logits, caches = model(prompt[None])
    out = []
    for t in range(steps):
        nxt = int(logits[0, -1].argmax())
        if nxt == eos:
            break
        out.append(nxt)
        if t == steps - 1:
            break
        logits, caches = model(torch.tensor([[nxt]]), prompt.shape[0] + t, caches)
    return out


def beam_search(model, prompt, K, H, L, eos):
    """kiln's beam search (kiln/runtime.h, length_penalty 0): H (ids, score), best first."""
    logits, caches = model(prompt[None])
    alive = [([], 0.0, caches, logits[0, -1])]
    finished = []
    for t in range(L):
        cands = []
        for i, (toks, cum, _, row) in enumerate(alive):
            lp = torch.log_softmax(row.double(), -1).tolist()
            cands += [(cum + lp[v], i, v) for v in range(len(lp))]
        cands.sort(key=lambda c: (-c[0], c[1], c[2]))
        grown = []
        for score, i, v in cands:
            if v == eos:
                finished.append((list(alive[i][0]), score))
            else:
                grown.append((alive[i][0] + [v], score, i))
            if len(grown) == K:
                break
        if t == L - 1:
            finished += [(toks, score) for toks, score, _ in grown]
            break
        if len(finished) >= K:
            break
        # Each continuing beam takes one step from its parent's cache.
        step = []
        for toks, score, i in grown:
            logits, caches = model(torch.tensor([[toks[-1]]]), prompt.shape[0] + t, alive[i][2])
            step.append((toks, score, caches, logits[0, -1]))
        alive = step
    order = sorted(range(len(finished)), key=lambda j: (-finished[j][1], j))
    return [finished[j] for j in order][:H]


def padded(rows, width):
    return torch.tensor([r + [-1] * (width - len(r)) for r in rows], dtype=torch.int64)


def main():
    torch.set_num_threads(1)
    os.makedirs(OUT, exist_ok=True)
    for name, cls, c, seed in [("llama", Llama, C, 4242), ("gpt2", GPT2, C_GPT2, 5252)]:
        model = cls(c).eval()
        randomize(model, seed)
        g = torch.Generator().manual_seed(seed + 1)
        ids = torch.randint(0, c["vocab"], (2, 11), generator=g)
        prompts = [torch.randint(3, c["vocab"], (n,), generator=g) for n in PROMPT_LENGTHS]
        with torch.inference_mode():
            logits, _ = model(ids)
            greedy_ids = [greedy(model, p, NEW_TOKENS, c["eos_id"]) for p in prompts]
            beams = [beam_search(model, p, BEAM, BEAM, NEW_TOKENS, c["eos_id"]) for p in prompts]
        write_safetensors(os.path.join(OUT, name + ".weights.safetensors"), model.state_dict())
        write_safetensors(os.path.join(OUT, name + ".inputs.safetensors"), {"ids": ids})
        write_safetensors(os.path.join(OUT, name + ".expected.safetensors"), {"logits": logits})
        beam_ids = torch.stack([padded([h[0] for h in b], NEW_TOKENS) for b in beams])
        beam_scores = torch.tensor([[h[1] for h in b] for b in beams], dtype=torch.float32)
        write_safetensors(os.path.join(OUT, name + ".generate.safetensors"),
                          {"prompts": padded([p.tolist() for p in prompts], max(PROMPT_LENGTHS)),
                           "greedy": padded(greedy_ids, NEW_TOKENS), "beam": beam_ids,
                           "beam_scores": beam_scores})
        print(name, "greedy lengths", [len(x) for x in greedy_ids],
              "beam lengths", [[len(h[0]) for h in b] for b in beams])


    # The encoder–decoder: sources of different lengths (eos-terminated, 0-padded), each
    # generated alone from the decoder start token 0.
    model = T5(C_T5).eval()
    randomize(model, 6262)
    # T5 does not scale its scores: its initialization folds 1/sqrt(d_kv) into the query
    # projections (Hugging Face's T5PreTrainedModel._init_weights); so does this one.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".q.weight"):
                p.mul_(C_T5["d_kv"] ** -0.5)
    g = torch.Generator().manual_seed(6263)
    rows = [torch.randint(2, C_T5["vocab"], (n - 1,), generator=g).tolist() + [1]
            for n in SOURCE_LENGTHS]
    src = torch.tensor([r + [0] * (max(SOURCE_LENGTHS) - len(r)) for r in rows])
    tgt = torch.cat([torch.zeros(3, 1, dtype=torch.int64),
                     torch.randint(2, C_T5["vocab"], (3, 8), generator=g)], 1)
    start = torch.tensor([0])
    with torch.inference_mode():
        logits = model(src, tgt)
        bound = [model.bound(torch.tensor(r)) for r in rows]
        greedy_ids = [greedy(m, start, NEW_TOKENS, C_T5["eos_id"]) for m in bound]
        beams = [beam_search(m, start, BEAM, BEAM, NEW_TOKENS, C_T5["eos_id"]) for m in bound]
    write_safetensors(os.path.join(OUT, "t5.weights.safetensors"), model.state_dict())
    write_safetensors(os.path.join(OUT, "t5.inputs.safetensors"), {"src": src, "tgt": tgt})
    write_safetensors(os.path.join(OUT, "t5.expected.safetensors"), {"logits": logits})
    write_safetensors(os.path.join(OUT, "t5.generate.safetensors"),
                      {"prompts": src, "greedy": padded(greedy_ids, NEW_TOKENS),
                       "beam": torch.stack([padded([h[0] for h in b], NEW_TOKENS) for b in beams]),
                       "beam_scores": torch.tensor([[h[1] for h in b] for b in beams],
                                                   dtype=torch.float32)})
    print("t5 greedy lengths", [len(x) for x in greedy_ids],
          "beam lengths", [[len(h[0]) for h in b] for b in beams])


if __name__ == "__main__":
    main()
