#!/usr/bin/python3
"""Generate golden reference files for kiln's encoder-decoder Transformer.

Regenerate with:   /usr/bin/python3 tests/golden/make_golden.py

Defines the reference post-norm encoder-decoder Transformer in PyTorch, builds
two small configs with odd sizes ("tiny", "small"), initialises them with a
fixed seed, runs them in float32 under torch.inference_mode() and writes
safetensors files next to this script:

  NAME.weights.safetensors        F32 state_dict; metadata = config (str->str)
  NAME_bK.inputs.safetensors      "src" I64 [B,S], "tgt" I64 [B,T]
  NAME_bK.expected.safetensors    "logits" F32 [B,T,tgt_vocab],
                                  "memory" F32 [B,S,d_model] (encoder.norm out)

The safetensors writer/reader are implemented here (no `safetensors` package).
The output is deterministic (single-threaded torch, fixed seeds, fixed JSON
key order); rerunning produces byte-identical files.

Numerical choices (the C++ side should match these):
  * Embedding: x = emb(ids) * float32(sqrt(d_model)) + pe[:L]; the PE table
    (max_len rows) is computed in float64 and cast to the model dtype.
  * Attention scale: scores = (q @ k^T) / float32(sqrt(d_k)) -- a true IEEE
    elementwise DIVISION by sqrt(d_k) rounded to float32 (not multiplication
    by a reciprocal). It is done against a full tensor so that no torch
    version can silently turn it into a multiply-by-reciprocal.
  * Masked scores are set to -1e9 (masked_fill where mask is False) before
    softmax over the last dim. Padding (id == pad_id) masks KEYS only; padded
    query rows are computed normally and appear in the outputs.
  * Decoder self-attention mask: causal (key j <= query i) AND tgt key mask.
  * LayerNorm eps = 1e-5 (nn.LayerNorm default).
"""

import collections
import copy
import hashlib
import json
import math
import os
import struct
import sys

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))

CONFIG_KEYS = ["src_vocab", "tgt_vocab", "d_model", "heads", "d_ff",
               "enc_layers", "dec_layers", "pad_id", "max_len", "max_batch"]

CONFIGS = collections.OrderedDict([
    ("tiny", dict(src_vocab=37, tgt_vocab=41, d_model=24, heads=3, d_ff=40,
                  enc_layers=2, dec_layers=2, pad_id=0, max_len=40,
                  max_batch=4)),
    ("small", dict(src_vocab=53, tgt_vocab=29, d_model=20, heads=5, d_ff=36,
                   enc_layers=1, dec_layers=3, pad_id=1, max_len=48,
                   max_batch=3)),
])

# Batches per config: (tag, S, T, src_lengths, tgt_lengths); B = len(lengths).
BATCHES = {
    "tiny": [
        ("b1", 7, 6, [7, 1, 5], [6, 3, 1]),
        ("b2", 33, 1, [33, 20], [1, 1]),
    ],
    "small": [
        ("b1", 9, 11, [9, 4], [11, 8]),
    ],
}

WEIGHT_SEED = {"tiny": 1234, "small": 5678}
INPUT_SEED = 4242


# ----------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------

def sinusoidal_pe(max_len, d_model):
    """PE[pos,2i] = sin(pos/10000^(2i/d)), PE[pos,2i+1] = cos(...), float64."""
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pos = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    div = torch.pow(torch.tensor(10000.0, dtype=torch.float64), two_i / d_model)
    pe[:, 0::2] = torch.sin(pos / div)
    pe[:, 1::2] = torch.cos(pos / div)
    return pe


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        assert d_model % heads == 0
        self.h = heads
        self.d_k = d_model // heads
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)

    def forward(self, xq, xkv, mask):
        # mask: bool, broadcastable to [B, H, Lq, Lk]; True = may attend.
        B, Lq, D = xq.shape
        Lk = xkv.shape[1]
        q = self.w_q(xq).view(B, Lq, self.h, self.d_k).transpose(1, 2)
        k = self.w_k(xkv).view(B, Lk, self.h, self.d_k).transpose(1, 2)
        v = self.w_v(xkv).view(B, Lk, self.h, self.d_k).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1))
        # True division by sqrt(d_k) (rounded to the model dtype).
        scores = scores / torch.full_like(scores, math.sqrt(self.d_k))
        scores = scores.masked_fill(mask == False, -1e9)  # noqa: E712
        p = torch.softmax(scores, dim=-1)
        o = torch.matmul(p, v)
        o = o.transpose(1, 2).contiguous().view(B, Lq, D)
        return self.w_o(o)


class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.w_2(torch.relu(self.w_1(x)))


class EncoderLayer(nn.Module):
    def __init__(self, d_model, heads, d_ff):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, heads)
        self.ffn = FeedForward(d_model, d_ff)
        self.norm1 = nn.LayerNorm(d_model, eps=1e-5)
        self.norm2 = nn.LayerNorm(d_model, eps=1e-5)

    def forward(self, x, src_mask):
        x = self.norm1(x + self.self_attn(x, x, src_mask))
        x = self.norm2(x + self.ffn(x))
        return x


class DecoderLayer(nn.Module):
    def __init__(self, d_model, heads, d_ff):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, heads)
        self.cross_attn = MultiHeadAttention(d_model, heads)
        self.ffn = FeedForward(d_model, d_ff)
        self.norm1 = nn.LayerNorm(d_model, eps=1e-5)
        self.norm2 = nn.LayerNorm(d_model, eps=1e-5)
        self.norm3 = nn.LayerNorm(d_model, eps=1e-5)

    def forward(self, x, memory, src_mask, tgt_mask):
        x = self.norm1(x + self.self_attn(x, x, tgt_mask))
        x = self.norm2(x + self.cross_attn(x, memory, src_mask))
        x = self.norm3(x + self.ffn(x))
        return x


class Encoder(nn.Module):
    def __init__(self, n, d_model, heads, d_ff):
        super().__init__()
        self.layers = nn.ModuleList(
            [EncoderLayer(d_model, heads, d_ff) for _ in range(n)])
        self.norm = nn.LayerNorm(d_model, eps=1e-5)

    def forward(self, x, src_mask):
        for layer in self.layers:
            x = layer(x, src_mask)
        return self.norm(x)


class Decoder(nn.Module):
    def __init__(self, n, d_model, heads, d_ff):
        super().__init__()
        self.layers = nn.ModuleList(
            [DecoderLayer(d_model, heads, d_ff) for _ in range(n)])
        self.norm = nn.LayerNorm(d_model, eps=1e-5)

    def forward(self, x, memory, src_mask, tgt_mask):
        for layer in self.layers:
            x = layer(x, memory, src_mask, tgt_mask)
        return self.norm(x)


class Transformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = dict(cfg)
        d = cfg["d_model"]
        self.src_embed = nn.Embedding(cfg["src_vocab"], d)  # no padding_idx
        self.tgt_embed = nn.Embedding(cfg["tgt_vocab"], d)
        self.encoder = Encoder(cfg["enc_layers"], d, cfg["heads"], cfg["d_ff"])
        self.decoder = Decoder(cfg["dec_layers"], d, cfg["heads"], cfg["d_ff"])
        self.generator = nn.Linear(d, cfg["tgt_vocab"])
        # float64 table, not part of the state_dict; cast at use.
        self.register_buffer("pe", sinusoidal_pe(cfg["max_len"], d),
                             persistent=False)

    def _embed(self, emb, ids):
        w = emb.weight
        L = ids.shape[1]
        assert L <= self.cfg["max_len"]
        scale = torch.tensor(math.sqrt(self.cfg["d_model"]), dtype=w.dtype)
        return emb(ids) * scale + self.pe[:L].to(w.dtype)

    def _src_mask(self, src):
        # [B,1,1,S]: keys that are not padding.
        return (src != self.cfg["pad_id"]).unsqueeze(1).unsqueeze(2)

    def _tgt_mask(self, tgt):
        T = tgt.shape[1]
        key = (tgt != self.cfg["pad_id"]).unsqueeze(1).unsqueeze(2)  # [B,1,1,T]
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))       # j <= i
        return key & causal.unsqueeze(0).unsqueeze(0)                 # [B,1,T,T]

    def encode(self, src):
        return self.encoder(self._embed(self.src_embed, src),
                            self._src_mask(src))

    def decode(self, memory, src, tgt):
        x = self._embed(self.tgt_embed, tgt)
        return self.decoder(x, memory, self._src_mask(src),
                            self._tgt_mask(tgt))

    def forward(self, src, tgt):
        memory = self.encode(src)
        return self.generator(self.decode(memory, src, tgt))


def expected_state_dict_keys(cfg):
    keys = ["src_embed.weight", "tgt_embed.weight"]

    def attn(prefix):
        return ["%s.%s.%s" % (prefix, w, p)
                for w in ("w_q", "w_k", "w_v", "w_o") for p in ("weight", "bias")]

    def ffn(prefix):
        return ["%s.%s.%s" % (prefix, w, p)
                for w in ("w_1", "w_2") for p in ("weight", "bias")]

    def norm(prefix):
        return [prefix + ".weight", prefix + ".bias"]

    for i in range(cfg["enc_layers"]):
        p = "encoder.layers.%d" % i
        keys += attn(p + ".self_attn") + ffn(p + ".ffn")
        keys += norm(p + ".norm1") + norm(p + ".norm2")
    keys += norm("encoder.norm")
    for i in range(cfg["dec_layers"]):
        p = "decoder.layers.%d" % i
        keys += attn(p + ".self_attn") + attn(p + ".cross_attn") + ffn(p + ".ffn")
        keys += norm(p + ".norm1") + norm(p + ".norm2") + norm(p + ".norm3")
    keys += norm("decoder.norm")
    keys += ["generator.weight", "generator.bias"]
    return keys


def init_weights(model, seed):
    """Deterministic init with non-trivial activations."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if ".norm" in name or name.startswith("encoder.norm") or \
                    name.startswith("decoder.norm"):
                if name.endswith(".weight"):
                    p.copy_(1.0 + 0.1 * r)
                else:
                    p.copy_(0.1 * r)
            elif name.endswith(".bias"):
                p.copy_(0.1 * r)
            else:  # Linear weights and embeddings
                p.copy_(0.3 * r)


# ----------------------------------------------------------------------------
# Minimal safetensors writer / reader
# ----------------------------------------------------------------------------

_DTYPES = {torch.float32: ("F32", "<f", 4), torch.int64: ("I64", "<q", 8)}
_DTYPES_BY_NAME = {"F32": (torch.float32, "<f", 4), "I64": (torch.int64, "<q", 8)}


def _tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    name, fmt, size = _DTYPES[t.dtype]
    vals = t.reshape(-1).tolist()
    return struct.pack("<%d%s" % (len(vals), fmt[1]), *vals)


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, tensor) in the desired order."""
    header = collections.OrderedDict()
    if metadata is not None:
        header["__metadata__"] = collections.OrderedDict(
            (str(k), str(v)) for k, v in metadata.items())
    blobs = []
    off = 0
    for name, t in tensors:
        b = _tensor_bytes(t)
        header[name] = collections.OrderedDict([
            ("dtype", _DTYPES[t.dtype][0]),
            ("shape", list(t.shape)),
            ("data_offsets", [off, off + len(b)]),
        ])
        blobs.append(b)
        off += len(b)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((-len(hjson)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    """Returns (OrderedDict name->tensor, metadata dict)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"),
                        object_pairs_hook=collections.OrderedDict)
    base = 8 + n
    meta = header.pop("__metadata__", {})
    out = collections.OrderedDict()
    expect_off = 0
    for name, info in header.items():
        dt, fmt, size = _DTYPES_BY_NAME[info["dtype"]]
        b, e = info["data_offsets"]
        assert b == expect_off, "non-contiguous data in %s" % path
        expect_off = e
        numel = 1
        for s in info["shape"]:
            numel *= s
        assert e - b == numel * size
        vals = struct.unpack("<%d%s" % (numel, fmt[1]), data[base + b:base + e])
        out[name] = torch.tensor(vals, dtype=dt).reshape(info["shape"])
    assert base + expect_off == len(data), "trailing bytes in %s" % path
    return out, meta


def check_roundtrip(path, tensors, metadata):
    got, meta = read_safetensors(path)
    assert list(got.keys()) == [n for n, _ in tensors], path
    for name, t in tensors:
        r = got[name]
        assert r.dtype == t.dtype and r.shape == t.shape, (path, name)
        assert torch.equal(r, t.detach().cpu()), (path, name)
    want_meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    assert dict(meta) == want_meta, path


def write_and_check(path, tensors, metadata=None):
    write_safetensors(path, tensors, metadata)
    check_roundtrip(path, tensors, metadata)


# ----------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------

def make_ids(g, B, L, lengths, vocab, pad_id):
    """Real tokens drawn uniformly from [0,vocab) \\ {pad_id}, pad at the end."""
    assert len(lengths) == B and all(1 <= l <= L for l in lengths)
    r = torch.randint(0, vocab - 1, (B, L), generator=g, dtype=torch.int64)
    r = r + (r >= pad_id).to(torch.int64)  # skip pad_id
    for b, l in enumerate(lengths):
        r[b, l:] = pad_id
    return r


# ----------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------

def fmt_float(x):
    return "%.9g" % x


def main():
    torch.set_default_dtype(torch.float32)
    torch.set_num_threads(1)  # deterministic reductions
    torch.use_deterministic_algorithms(True)

    summary = []
    for name, cfg in CONFIGS.items():
        assert list(cfg.keys()) == CONFIG_KEYS
        torch.manual_seed(WEIGHT_SEED[name])
        model = Transformer(cfg)
        init_weights(model, WEIGHT_SEED[name])
        model.eval()
        sd = model.state_dict()
        assert list(sd.keys()) == expected_state_dict_keys(cfg), \
            sorted(set(sd.keys()) ^ set(expected_state_dict_keys(cfg)))
        assert all(v.dtype == torch.float32 for v in sd.values())

        meta = collections.OrderedDict((k, str(cfg[k])) for k in CONFIG_KEYS)
        wpath = os.path.join(HERE, "%s.weights.safetensors" % name)
        write_and_check(wpath, list(sd.items()), meta)

        model64 = copy.deepcopy(model).double()
        g = torch.Generator().manual_seed(INPUT_SEED + len(name))
        for tag, S, T, slens, tlens in BATCHES[name]:
            B = len(slens)
            assert B <= cfg["max_batch"] and S <= cfg["max_len"] and \
                T <= cfg["max_len"]
            src = make_ids(g, B, S, slens, cfg["src_vocab"], cfg["pad_id"])
            tgt = make_ids(g, B, T, tlens, cfg["tgt_vocab"], cfg["pad_id"])
            with torch.inference_mode():
                memory = model.encode(src)
                logits = model(src, tgt)
                memory64 = model64.encode(src)
                logits64 = model64(src, tgt)
            assert memory.dtype == torch.float32 and logits.dtype == torch.float32
            assert logits.shape == (B, T, cfg["tgt_vocab"])
            assert memory.shape == (B, S, cfg["d_model"])
            assert torch.isfinite(logits).all() and torch.isfinite(memory).all()
            dl = (logits.double() - logits64).abs().max().item()
            dm = (memory.double() - memory64).abs().max().item()
            stem = "%s_%s" % (name, tag)
            print("%-9s B=%d S=%2d T=%2d  max|logits| = %-10s max|f32-f64| "
                  "logits = %s  memory = %s"
                  % (stem, B, S, T, fmt_float(logits.abs().max().item()),
                     fmt_float(dl), fmt_float(dm)))
            summary.append((stem, dl, dm))

            ipath = os.path.join(HERE, stem + ".inputs.safetensors")
            write_and_check(ipath, [("src", src), ("tgt", tgt)],
                            collections.OrderedDict([
                                ("config", name),
                                ("src_lengths", ",".join(map(str, slens))),
                                ("tgt_lengths", ",".join(map(str, tlens))),
                            ]))
            epath = os.path.join(HERE, stem + ".expected.safetensors")
            write_and_check(epath, [("logits", logits), ("memory", memory)],
                            collections.OrderedDict([
                                ("config", name),
                                ("max_abs_diff_f32_vs_f64_logits", fmt_float(dl)),
                                ("max_abs_diff_f32_vs_f64_memory", fmt_float(dm)),
                                ("torch_version", torch.__version__),
                            ]))

    total = 0
    for fn in sorted(os.listdir(HERE)):
        if fn.endswith(".safetensors"):
            p = os.path.join(HERE, fn)
            total += os.path.getsize(p)
            with open(p, "rb") as f:
                h = hashlib.sha256(f.read()).hexdigest()[:16]
            print("  %-32s %7d bytes  sha256 %s" % (fn, os.path.getsize(p), h))
    print("total %d bytes" % total)
    assert total < 1 << 20
    return 0


if __name__ == "__main__":
    sys.exit(main())
