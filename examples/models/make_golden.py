#!/usr/bin/python3
"""PyTorch twins of the example models (classifier.cpp, gpt.cpp, multilabel.cpp,
transformer.cpp) and their
golden data. Regenerate with:   /usr/bin/python3 examples/models/make_golden.py

Each twin uses the attribute names of kiln's nn blocks (frontend/nn.h), so its state_dict
is the weights file as is. Weights are random from a fixed seed (LayerNorm weights and
biases too); the inputs are a right-padded batch with odd lengths. Written next to this
script, in golden/:

  NAME.weights.safetensors    F32 state_dict (a tied weight stored once)
  NAME.inputs.safetensors     "ids" I64 [B, L] (the transformer: "src" [B, S], "tgt" [B, T])
  NAME.expected.safetensors   the model's outputs by name
  gpt.greedy.safetensors      "prompt" I64 [1, P] and "greedy" I64 [1, N]: the tokens
                              greedy decoding (argmax, full recompute) appends to it

Numerics as kiln's: scores = q @ k^T / float32(sqrt(d_k)), masked scores set to -1e9,
LayerNorm eps 1e-5, float32 throughout, single-threaded; the output is deterministic.
"""

import json
import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "golden")


class Attention(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.heads = heads
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)

    def forward(self, x, mask, kv=None):
        """Self-attention, or cross-attention over kv [B, Lk, D] when given."""
        kv = x if kv is None else kv
        b, l, d = x.shape
        dk = d // self.heads

        def split(t):
            return t.view(b, t.shape[1], self.heads, dk).transpose(1, 2)

        q, k, v = split(self.w_q(x)), split(self.w_k(kv)), split(self.w_v(kv))
        scores = q @ k.transpose(-2, -1)
        scores = scores / torch.full_like(scores, math.sqrt(dk))
        if mask is not None:
            scores = scores.masked_fill(mask, -1e9)
        o = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, l, d)
        return self.w_o(o)


class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, act):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.act = act

    def forward(self, x):
        return self.w_2(self.act(self.w_1(x)))


class EncoderBlock(nn.Module):
    def __init__(self, d_model, heads, d_ff, pre_norm, act):
        super().__init__()
        self.self_attn = Attention(d_model, heads)
        self.ffn = FeedForward(d_model, d_ff, act)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.pre_norm = pre_norm

    def forward(self, x, mask):
        if self.pre_norm:
            x = x + self.self_attn(self.norm1(x), mask)
            return x + self.ffn(self.norm2(x))
        x = self.norm1(x + self.self_attn(x, mask))
        return self.norm2(x + self.ffn(x))


class DecoderBlock(nn.Module):
    """Post-norm: self-attention (causal + padding), cross-attention, feed-forward."""

    def __init__(self, d_model, heads, d_ff):
        super().__init__()
        self.self_attn = Attention(d_model, heads)
        self.cross_attn = Attention(d_model, heads)
        self.ffn = FeedForward(d_model, d_ff, F.relu)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)

    def forward(self, x, memory, src_mask, tgt_mask):
        x = self.norm1(x + self.self_attn(x, tgt_mask))
        x = self.norm2(x + self.cross_attn(x, src_mask, memory))
        return self.norm3(x + self.ffn(x))


def gelu(x):
    return F.gelu(x)


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


def key_padding(ids, pad_id):
    return (ids == pad_id)[:, None, None, :]


class Classifier(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.tok_emb = nn.Embedding(c["vocab"], c["d_model"])
        self.pos_emb = nn.Embedding(c["max_len"], c["d_model"])
        self.layers = nn.ModuleList(
            [EncoderBlock(c["d_model"], c["heads"], c["d_ff"], True, gelu)
             for _ in range(c["layers"])])
        self.norm = nn.LayerNorm(c["d_model"])
        self.classifier = nn.Linear(c["d_model"], c["classes"])

    def forward(self, ids):
        x = self.tok_emb(ids) + self.pos_emb.weight[: ids.shape[1]]
        mask = key_padding(ids, self.c["pad_id"])
        for layer in self.layers:
            x = layer(x, mask)
        x = self.norm(x)
        valid = (ids != self.c["pad_id"]).float()
        pooled = (x * valid[..., None]).sum(1) / valid.sum(1, keepdim=True)
        logits = self.classifier(pooled)
        return {"logits": logits, "probs": logits.softmax(-1)}


class Gpt(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.tok_emb = nn.Embedding(c["vocab"], c["d_model"])
        self.pos_emb = nn.Embedding(c["max_len"], c["d_model"])
        self.blocks = nn.ModuleList(
            [EncoderBlock(c["d_model"], c["heads"], c["d_ff"], True, gelu_tanh)
             for _ in range(c["layers"])])
        self.ln_f = nn.LayerNorm(c["d_model"])
        self.head = nn.Linear(c["d_model"], c["vocab"], bias=False)
        self.head.weight = self.tok_emb.weight  # tied

    def forward(self, ids):
        length = ids.shape[1]
        x = self.tok_emb(ids) + self.pos_emb.weight[:length]
        causal = torch.triu(torch.ones(length, length, dtype=torch.bool), 1)[None, None]
        for block in self.blocks:
            x = block(x, causal)
        return {"logits": self.head(self.ln_f(x))}


class MultiLabel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.tok_emb = nn.Embedding(c["vocab"], c["d_model"])
        self.pos_emb = nn.Embedding(c["max_len"], c["d_model"])
        self.emb_norm = nn.LayerNorm(c["d_model"])
        self.layers = nn.ModuleList(
            [EncoderBlock(c["d_model"], c["heads"], c["d_ff"], False, gelu)
             for _ in range(c["layers"])])
        self.pooler = nn.Linear(c["d_model"], c["d_model"])
        self.head = nn.Linear(c["d_model"], c["labels"])

    def forward(self, ids):
        x = self.emb_norm(self.tok_emb(ids) + self.pos_emb.weight[: ids.shape[1]])
        mask = key_padding(ids, self.c["pad_id"])
        for layer in self.layers:
            x = layer(x, mask)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        return {"scores": torch.sigmoid(self.head(pooled))}


class Transformer(nn.Module):
    """The paper's model: emb * sqrt(d_model) + sinusoidal PE, post-norm blocks with a
    ReLU feed-forward, a final LayerNorm on each stack, a linear generator."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        d = c["d_model"]
        self.src_embed = nn.Embedding(c["src_vocab"], d)
        self.tgt_embed = nn.Embedding(c["tgt_vocab"], d)
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList(
            [EncoderBlock(d, c["heads"], c["d_ff"], False, F.relu)
             for _ in range(c["enc_layers"])])
        self.encoder.norm = nn.LayerNorm(d)
        self.decoder = nn.Module()
        self.decoder.layers = nn.ModuleList(
            [DecoderBlock(d, c["heads"], c["d_ff"]) for _ in range(c["dec_layers"])])
        self.decoder.norm = nn.LayerNorm(d)
        self.generator = nn.Linear(d, c["tgt_vocab"])
        pos = torch.arange(c["max_len"], dtype=torch.float64)[:, None]
        div = torch.pow(10000.0, torch.arange(0, d, 2, dtype=torch.float64) / d)
        pe = torch.zeros(c["max_len"], d, dtype=torch.float64)
        pe[:, 0::2] = torch.sin(pos / div)
        pe[:, 1::2] = torch.cos(pos / div)
        self.register_buffer("pe", pe.float(), persistent=False)

    def embed(self, table, ids):
        scale = torch.tensor(math.sqrt(self.c["d_model"]), dtype=torch.float32)
        return table(ids) * scale + self.pe[: ids.shape[1]]

    def forward(self, src, tgt):
        pad = self.c["pad_id"]
        src_mask = key_padding(src, pad)
        length = tgt.shape[1]
        causal = torch.triu(torch.ones(length, length, dtype=torch.bool), 1)[None, None]
        tgt_mask = key_padding(tgt, pad) | causal
        x = self.embed(self.src_embed, src)
        for layer in self.encoder.layers:
            x = layer(x, src_mask)
        memory = self.encoder.norm(x)
        y = self.embed(self.tgt_embed, tgt)
        for layer in self.decoder.layers:
            y = layer(y, memory, src_mask, tgt_mask)
        return {"logits": self.generator(self.decoder.norm(y))}


# The configs of the example sources (their "small" config).
CONFIGS = {
    "classifier": dict(vocab=29, d_model=20, heads=4, d_ff=36, layers=2, classes=5,
                       pad_id=0, max_len=16, max_batch=4),
    "gpt": dict(vocab=37, d_model=24, heads=4, d_ff=52, layers=2, max_len=24, max_batch=3),
    "multilabel": dict(vocab=31, d_model=18, heads=3, d_ff=30, layers=2, labels=7,
                       pad_id=0, max_len=16, max_batch=4),
    "transformer": dict(src_vocab=31, tgt_vocab=23, d_model=24, heads=4, d_ff=40,
                        enc_layers=2, dec_layers=2, pad_id=0, max_len=16, max_batch=4),
}
MODELS = {"classifier": Classifier, "gpt": Gpt, "multilabel": MultiLabel,
          "transformer": Transformer}
# Right-padded batches (pad id 0) with odd lengths; the longest sets L.
LENGTHS = {"classifier": [11, 7, 3], "gpt": [13, 9, 5], "multilabel": [9, 6, 1],
           "transformer": [13, 5, 9]}
# The transformer's target lengths (its source lengths are LENGTHS').
TGT_LENGTHS = [7, 11, 1]


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm1.weight", "norm2.weight", "norm3.weight", "norm.weight",
                              "ln_f.weight")):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(("emb.weight", "embed.weight")):
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))


def batch(lengths, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.int64)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(1, vocab, (n,), generator=g)
    return ids


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        dtype = {torch.float32: "F32", torch.int64: "I64"}[t.dtype]
        data = t.numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def greedy(model, prompt, steps):
    ids = prompt.clone()
    for _ in range(steps):
        nxt = model(ids)["logits"][:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], 1)
    return ids[:, prompt.shape[1]:]


def main():
    torch.set_num_threads(1)
    os.makedirs(OUT, exist_ok=True)
    for seed, name in enumerate(sorted(MODELS)):
        c = CONFIGS[name]
        model = MODELS[name](c).eval()
        randomize(model, 1000 + seed)
        if name == "transformer":
            inputs = {"src": batch(LENGTHS[name], c["src_vocab"], 2000 + seed),
                      "tgt": batch(TGT_LENGTHS, c["tgt_vocab"], 2100 + seed)}
        else:
            inputs = {"ids": batch(LENGTHS[name], c["vocab"], 2000 + seed)}
        with torch.inference_mode():
            expected = model(*inputs.values())
            if name == "gpt":
                prompt = batch([5], c["vocab"], 3000)
                write_safetensors(os.path.join(OUT, "gpt.greedy.safetensors"),
                                  {"prompt": prompt, "greedy": greedy(model, prompt, 8)})
        # A tied weight is stored once, under the first name (as safetensors' save_model).
        weights, seen = {}, set()
        for key, t in model.state_dict().items():
            if t.data_ptr() in seen:
                continue
            seen.add(t.data_ptr())
            weights[key] = t
        write_safetensors(os.path.join(OUT, name + ".weights.safetensors"), weights)
        write_safetensors(os.path.join(OUT, name + ".inputs.safetensors"), inputs)
        write_safetensors(os.path.join(OUT, name + ".expected.safetensors"), expected)
        print(name, {k: list(v.shape) for k, v in expected.items()}, len(weights), "weights")


if __name__ == "__main__":
    main()
