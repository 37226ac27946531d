#!/usr/bin/python3
"""Small models exported to ONNX with Debian's PyTorch, for `kiln import`'s tests.

Regenerate with:   /usr/bin/python3 tests/onnx/export_models.py [OUT_DIR]
The fuzz seeds:     /usr/bin/python3 tests/onnx/export_models.py --fuzz-seeds fuzz/corpus/onnx
(default OUT_DIR: tests/onnx/models, where the files are committed; each export is tens of
KB). For each model NAME and opset N in (14, 17) it writes

  NAME_opsetN.onnx          torch.onnx.export with named dynamic axes (batch B, lengths S, T)
  NAME.inputs.safetensors   the inputs by the ONNX graph's input names
  NAME.expected.safetensors PyTorch's outputs by the graph's output names (float32, eval mode,
                            single-threaded)
  NAME.dims                 the --dim options `kiln import` needs (one NAME=MAX per line)

The models, each written the way its kind is usually written in PyTorch:
  transformer  nn.Transformer (batch_first) with embeddings, a float -inf causal mask from
               torch.triu, key padding masks, and a generator Linear: PyTorch's own
               MultiheadAttention (packed in-projection sliced three ways, [T, B*H, d] heads)
  seed0        the twin of seed write-up 000 (examples/seeds/make_golden.py: post-norm,
               -inf fill, sinusoid buffer), with its committed golden weights
  seed1        the twin of write-up 001 (its own LayerNorm: unbiased std, eps outside)
  bert         a BERT-style encoder as Hugging Face writes it: word + position + token type
               embeddings, LayerNorm(eps 1e-12), separate Q/K/V Linears, an additive
               (1 - mask) * -10000 attention mask, erf GELU, post-norm
  gpt2         a GPT-2-style decoder: Conv1D weights stored [in, out] (addmm on [B*T, C]), one
               packed c_attn split three ways, a causal mask from torch.tril, tanh GELU,
               pre-norm, final ln_f, lm_head tied to the token embedding
"""

import functools
import importlib.util
import json
import math
import os
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OPSETS = (14, 17)


def write_safetensors(path, tensors):
    """F32/I64 tensors by name: the seed twins' writer (examples/seeds/make_golden.py)."""
    seeds_module().write_safetensors(path, tensors)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        dtype = {"F32": torch.float32, "I64": torch.int64}[info["dtype"]]
        buf = bytearray(data[8 + n + a:8 + n + b])
        out[name] = torch.frombuffer(buf, dtype=dtype).reshape(info["shape"]).clone()
    return out


def ids(g, lengths, vocab, pad):
    out = torch.full((len(lengths), max(lengths)), pad, dtype=torch.int64)
    for i, n in enumerate(lengths):
        row = torch.randint(0, vocab - 1, (n,), generator=g)
        out[i, :n] = row + (row >= pad).long()
    return out


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and ("norm" in name or "ln" in name or "LayerNorm" in name) \
                    and name.endswith("weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif "embed" in name or "wte" in name or "wpe" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))


# --- nn.Transformer -------------------------------------------------------------------------

class NNTransformer(nn.Module):
    def __init__(self, src_vocab=23, tgt_vocab=29, d=24, heads=3, d_ff=40, layers=2, pad=0):
        super().__init__()
        self.pad = pad
        self.src_embed = nn.Embedding(src_vocab, d)
        self.tgt_embed = nn.Embedding(tgt_vocab, d)
        self.transformer = nn.Transformer(d_model=d, nhead=heads, num_encoder_layers=layers,
                                          num_decoder_layers=layers, dim_feedforward=d_ff,
                                          dropout=0.0, batch_first=True)
        self.generator = nn.Linear(d, tgt_vocab)

    def forward(self, src, tgt):
        t = tgt.shape[1]
        causal = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        src_pad = src == self.pad
        h = self.transformer(self.src_embed(src), self.tgt_embed(tgt), tgt_mask=causal,
                             src_key_padding_mask=src_pad, memory_key_padding_mask=src_pad)
        return self.generator(h)


def transformer(**small):
    torch.manual_seed(0)
    m = NNTransformer(**small).eval()
    randomize(m, 2900)
    g = torch.Generator().manual_seed(2901)
    # Every row's last key is real: a row of all-padding keys is NaN in PyTorch.
    src = ids(g, [9, 6, 3], 23, 0)
    tgt = ids(g, [7, 7, 7], 29, 0)
    return m, (src, tgt), ["src", "tgt"], ["logits"], \
        {"src": {0: "B", 1: "S"}, "tgt": {0: "B", 1: "T"}, "logits": {0: "B", 1: "T"}}, \
        {"B": 4, "S": 16, "T": 16}


# --- the seed write-ups' twins --------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def seeds_module():
    path = os.path.join(ROOT, "examples", "seeds", "make_golden.py")
    spec = importlib.util.spec_from_file_location("seeds_make_golden", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def seed(name):
    mod = seeds_module()
    c = mod.CONFIGS[name]
    m = mod.MODELS[name](c).eval()
    golden = os.path.join(ROOT, "examples", "seeds", "golden")
    state = read_safetensors(os.path.join(golden, name + ".weights.safetensors"))
    m.load_state_dict(state, strict=False)
    inputs = read_safetensors(os.path.join(golden, name + ".inputs.safetensors"))
    return m, (inputs["src"], inputs["tgt"]), ["src", "tgt"], ["logits"], \
        {"src": {0: "B", 1: "S"}, "tgt": {0: "B", 1: "T"}, "logits": {0: "B", 1: "T"}}, \
        {"B": c["max_batch"], "S": c["max_len"], "T": c["max_len"]}


# --- BERT-style encoder ---------------------------------------------------------------------

class BertLayer(nn.Module):
    def __init__(self, d, heads, d_ff):
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.attn_out = nn.Linear(d, d)
        self.attn_norm = nn.LayerNorm(d, eps=1e-12)
        self.intermediate = nn.Linear(d, d_ff)
        self.output = nn.Linear(d_ff, d)
        self.out_norm = nn.LayerNorm(d, eps=1e-12)

    def split(self, x):
        b, l, d = x.size()
        return x.view(b, l, self.heads, d // self.heads).permute(0, 2, 1, 3)

    def forward(self, x, bias):
        q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))
        probs = F.softmax(scores + bias, dim=-1)
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        ctx = ctx.view(ctx.size(0), ctx.size(1), -1)
        x = self.attn_norm(self.attn_out(ctx) + x)
        return self.out_norm(self.output(F.gelu(self.intermediate(x))) + x)


class Bert(nn.Module):
    def __init__(self, vocab=41, d=32, heads=4, d_ff=48, layers=2, max_pos=32, types=2):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, d)
        self.position_embeddings = nn.Embedding(max_pos, d)
        self.token_type_embeddings = nn.Embedding(types, d)
        self.embed_norm = nn.LayerNorm(d, eps=1e-12)
        self.layers = nn.ModuleList([BertLayer(d, heads, d_ff) for _ in range(layers)])

    def forward(self, input_ids, attention_mask, token_type_ids):
        pos = torch.arange(input_ids.size(1), dtype=torch.long)
        x = self.word_embeddings(input_ids) + self.position_embeddings(pos)[None] + \
            self.token_type_embeddings(token_type_ids)
        x = self.embed_norm(x)
        bias = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * -10000.0
        for layer in self.layers:
            x = layer(x, bias)
        return x


def bert(**small):
    torch.manual_seed(0)
    m = Bert(**small).eval()
    randomize(m, 3100)
    g = torch.Generator().manual_seed(3101)
    input_ids = ids(g, [11, 8, 5], 41, 0)
    mask = (input_ids != 0).long()
    types = torch.zeros_like(input_ids)
    types[:, 4:] = 1
    return m, (input_ids, mask, types), ["input_ids", "attention_mask", "token_type_ids"], \
        ["last_hidden_state"], \
        {"input_ids": {0: "B", 1: "S"}, "attention_mask": {0: "B", 1: "S"},
         "token_type_ids": {0: "B", 1: "S"}, "last_hidden_state": {0: "B", 1: "S"}}, \
        {"B": 4, "S": 32}


# --- GPT-2-style decoder --------------------------------------------------------------------

class Conv1D(nn.Module):
    """GPT-2's linear layer: weight [in, out], y = addmm(b, x.view(-1, in), W)."""

    def __init__(self, n_out, n_in):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out) * 0.02)
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        shape = x.size()[:-1] + (self.weight.size(-1),)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(shape)


class GPT2Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads, self.d = heads, d
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = Conv1D(3 * d, d)
        self.c_proj = Conv1D(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = Conv1D(4 * d, d)
        self.mlp_proj = Conv1D(d, 4 * d)

    def heads_of(self, x):
        b, t, c = x.size()
        return x.view(b, t, self.heads, c // self.heads).transpose(1, 2)

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(self.ln_1(x)).split(self.d, dim=2)
        q, k, v = self.heads_of(q), self.heads_of(k), self.heads_of(v)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~causal, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, vocab=53, d=32, heads=4, layers=2, max_pos=32):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(max_pos, d)
        self.h = nn.ModuleList([GPT2Block(d, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)

    def forward(self, input_ids):
        pos = torch.arange(input_ids.size(1), dtype=torch.long)
        x = self.wte(input_ids) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # lm_head tied to wte


def gpt2(**small):
    torch.manual_seed(0)
    m = GPT2(**small).eval()
    randomize(m, 3200)
    g = torch.Generator().manual_seed(3201)
    input_ids = torch.randint(0, 53, (2, 13), generator=g)
    return m, (input_ids,), ["input_ids"], ["logits"], \
        {"input_ids": {0: "B", 1: "T"}, "logits": {0: "B", 1: "T"}}, {"B": 4, "T": 32}


MODELS = {"transformer": transformer,
          "seed0": lambda: seed("seed0_neginf_fill"),
          "seed1": lambda: seed("seed1_custom_layernorm"),
          "bert": bert, "gpt2": gpt2}


def export(name, out_dir):
    m, args, in_names, out_names, axes, dims = MODELS[name]()
    with torch.inference_mode():
        outs = m(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    write_safetensors(os.path.join(out_dir, name + ".inputs.safetensors"),
                      dict(zip(in_names, args)))
    write_safetensors(os.path.join(out_dir, name + ".expected.safetensors"),
                      dict(zip(out_names, outs)))
    with open(os.path.join(out_dir, name + ".dims"), "w") as f:
        for k, v in dims.items():
            f.write("%s=%d\n" % (k, v))
    for opset in OPSETS:
        path = os.path.join(out_dir, "%s_opset%d.onnx" % (name, opset))
        torch.onnx.export(m, args, path, opset_version=opset, input_names=in_names,
                          output_names=out_names, dynamic_axes=axes)
        print("wrote", path, os.path.getsize(path), "bytes")


# Seeds for the importer's fuzz target (fuzz/corpus/onnx): the same graphs at the smallest
# sizes (one layer, width 8), a few KB each.
FUZZ_SEEDS = {"transformer": dict(d=8, heads=2, d_ff=8, layers=1),
              "bert": dict(d=8, heads=2, d_ff=8, layers=1),
              "gpt2": dict(d=8, heads=2, layers=1)}


def fuzz_seeds(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    for name, small in FUZZ_SEEDS.items():
        m, args, in_names, out_names, axes, _ = MODELS[name](**small)
        for opset in OPSETS:
            path = os.path.join(out_dir, "%s_opset%d.onnx" % (name, opset))
            torch.onnx.export(m, args, path, opset_version=opset, input_names=in_names,
                              output_names=out_names, dynamic_axes=axes)
            print("wrote", path, os.path.getsize(path), "bytes")


def main():
    torch.set_num_threads(1)
    if len(sys.argv) > 2 and sys.argv[1] == "--fuzz-seeds":
        fuzz_seeds(sys.argv[2])
        return
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "models")
    names = sys.argv[2:] or list(MODELS)
    os.makedirs(out_dir, exist_ok=True)
    for name in names:
        export(name, out_dir)


if __name__ == "__main__":
    main()
