#!/usr/bin/python3
"""PyTorch twins of the five seed write-ups (../shared/seeds/, see seeds/README.md in the
kiln docs) and their golden data. Regenerate with:   /usr/bin/python3 examples/seeds/make_golden.py

Each twin is written here from what its write-up specifies (module tree and parameter names,
pre/post-norm, LayerNorm formula and epsilon, final norms of the stacks, embedding scale,
positional encoding buffer, masks and their fill value, output projection and weight
sharing); nothing of the write-ups' code is used. Dropout is left out (inference: identity).
The kiln model of each is examples/seeds/<name>.cpp; its state_dict is the weights file
as is (the positional-encoding buffers included, as PyTorch saves them; a tied weight
stored once).

Weights are random from a fixed seed (LayerNorm weights and biases too); the inputs are a
right-padded batch with odd lengths on both sides (padded with the pad id). Written next to
this script, in golden/:

  NAME.weights.safetensors    F32 state_dict (a tied weight stored once, under its first name)
  NAME.inputs.safetensors     "src" I64 [B, S], "tgt" I64 [B, T]
  NAME.expected.safetensors   "logits" F32 [B, T, tgt_vocab]
  NAME.greedy.safetensors     "src" I64 [2, S'] (padded), "prompt" I64 [2, 1] (the start
                              token) and "greedy" I64 [2, N]: the tokens greedy decoding
                              (argmax of the last position, full recompute) appends

float32 throughout, single-threaded; the output is deterministic.
"""

import json
import math
import os
import struct

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "golden")


def sinusoid(max_len, d_model):
    """The paper's table [max_len, d_model]: sin on even channels, cos on odd ones."""
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) *
                     (-math.log(10000.0) / d_model))
    table = torch.zeros(max_len, d_model)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)
    return table


class SinusoidBuffer(nn.Module):
    """x + pe[:, :L]; the table is a buffer `pe` [1, max_len, d_model] (in the state_dict)."""

    def __init__(self, d_model, max_len):
        super().__init__()
        self.register_buffer("pe", sinusoid(max_len, d_model)[None])

    def forward(self, x):
        return x + self.pe[:, : x.shape[1]]


def attend(q, k, v, heads, keep, fill):
    """Scaled dot-product attention of [B, L, D] projections over `heads` heads; scores where
    `keep` (broadcasting to [B, H, Lq, Lk]) is 0 are set to `fill` before the softmax."""
    b, lq, d = q.shape
    lk = k.shape[1]
    dk = d // heads
    qh = q.reshape(b, lq, heads, dk).transpose(1, 2)
    kh = k.reshape(b, lk, heads, dk).transpose(1, 2)
    vh = v.reshape(b, lk, heads, dk).transpose(1, 2)
    scores = qh @ kh.transpose(-2, -1) / math.sqrt(dk)
    if keep is not None:
        scores = scores.masked_fill(keep == 0, fill)
    out = scores.softmax(-1) @ vh
    return out.transpose(1, 2).reshape(b, lq, d)


class Projections(nn.Module):
    """Four projections named by the write-up (`names`: q, k, v, o), each with a bias or not."""

    def __init__(self, d_model, heads, names, bias, fill):
        super().__init__()
        self.heads, self.fill, self.names = heads, fill, names
        for name, has_bias in zip(names, bias):
            setattr(self, name, nn.Linear(d_model, d_model, bias=has_bias))

    def forward(self, xq, xkv, keep):
        q, k, v, o = (getattr(self, n) for n in self.names)
        return o(attend(q(xq), k(xkv), v(xkv), self.heads, keep, self.fill))


class TwoLinears(nn.Module):
    """second(relu(first(x))) with the write-up's attribute names."""

    def __init__(self, d_model, d_ff, first, second):
        super().__init__()
        self.first, self.second = first, second
        setattr(self, first, nn.Linear(d_model, d_ff))
        setattr(self, second, nn.Linear(d_ff, d_model))

    def forward(self, x):
        return getattr(self, self.second)(torch.relu(getattr(self, self.first)(x)))


def keep_keys(ids, pad):
    """[B, 1, 1, L], true where the key is not padding."""
    return (ids != pad)[:, None, None, :]


def lower_triangle(length):
    """[1, 1, L, L], true where key j <= query i."""
    return torch.tril(torch.ones(length, length)).bool()[None, None]


# --- seed 000 (000_e19cebd730983f9d.txt) -----------------------------------------------------


class Seed0Layer(nn.Module):
    def __init__(self, c, cross):
        super().__init__()
        names, bias = ("w_q", "w_k", "w_v", "w_o"), (True,) * 4
        self.self_attn = Projections(c["d_model"], c["heads"], names, bias, float("-inf"))
        if cross:
            self.cross_attn = Projections(c["d_model"], c["heads"], names, bias, float("-inf"))
        self.feed_forward = TwoLinears(c["d_model"], c["d_ff"], "linear1", "linear2")
        for i in range(1, 4 if cross else 3):
            setattr(self, f"norm{i}", nn.LayerNorm(c["d_model"]))

    def forward(self, x, self_keep, memory=None, memory_keep=None):
        x = self.norm1(x + self.self_attn(x, x, self_keep))
        if memory is None:
            return self.norm2(x + self.feed_forward(x))
        x = self.norm2(x + self.cross_attn(x, memory, memory_keep))
        return self.norm3(x + self.feed_forward(x))


class Seed0Stack(nn.Module):
    def __init__(self, c, cross):
        super().__init__()
        self.layers = nn.ModuleList([Seed0Layer(c, cross) for _ in range(c["layers"])])
        self.norm = nn.LayerNorm(c["d_model"])

    def forward(self, x, *args):
        for layer in self.layers:
            x = layer(x, *args)
        return self.norm(x)


class Seed0(nn.Module):
    """The twin of write-up 000_e19cebd730983f9d.txt.

    Post-norm layers with nn.LayerNorm (eps 1e-5), a final LayerNorm after each stack
    (encoder.norm, decoder.norm), masked_fill(mask == 0, -inf), one sinusoid buffer
    `pos_encoding.pe` shared by both sides, embeddings scaled by sqrt(d_model), an untied
    `output_layer` (the prose mentions sharing; the code does not share). FFN linear1/linear2.
    The write-up leaves the masks to the caller and shows no mask function: this twin uses the
    usual ones, src_mask = (src != pad)[:, None, None, :] for encoder self-attention and as
    memory_mask, tgt_mask = (tgt != pad)[:, None, None, :] & tril for decoder self-attention.
    """

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.src_embedding = nn.Embedding(c["src_vocab"], c["d_model"])
        self.tgt_embedding = nn.Embedding(c["tgt_vocab"], c["d_model"])
        self.pos_encoding = SinusoidBuffer(c["d_model"], c["max_len"])
        self.encoder = Seed0Stack(c, cross=False)
        self.decoder = Seed0Stack(c, cross=True)
        self.output_layer = nn.Linear(c["d_model"], c["tgt_vocab"])

    def forward(self, src, tgt):
        pad, scale = self.c["pad_id"], math.sqrt(self.c["d_model"])
        src_mask = keep_keys(src, pad)
        tgt_mask = keep_keys(tgt, pad) & lower_triangle(tgt.shape[1])
        memory = self.encoder(self.pos_encoding(self.src_embedding(src) * scale), src_mask)
        y = self.decoder(self.pos_encoding(self.tgt_embedding(tgt) * scale), tgt_mask, memory,
                         src_mask)
        return self.output_layer(y)


# --- seed 001 (001_81f6dddc71a43d39.txt) -----------------------------------------------------


class Seed1Norm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.alpha = nn.Parameter(torch.ones(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)  # unbiased (N - 1)
        return self.alpha * (x - mean) / (std + self.eps) + self.beta


class Seed1Residual(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.norm = Seed1Norm(d_model)

    def forward(self, x, sublayer):
        return self.norm(x + sublayer(x))


class Seed1Embedding(nn.Module):
    def __init__(self, d_model, vocab):
        super().__init__()
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab, d_model)

    def forward(self, ids):
        return self.embedding(ids) * math.sqrt(self.d_model)


class Seed1Block(nn.Module):
    def __init__(self, c, cross):
        super().__init__()
        d, names, bias = c["d_model"], ("W_q", "W_k", "W_v", "W_o"), (False,) * 4
        self.self_attn_block = Projections(d, c["heads"], names, bias, -1e9)
        self.residual_connection_1 = Seed1Residual(d)
        if cross:
            self.cross_attn_block = Projections(d, c["heads"], names, bias, -1e9)
            self.residual_connection_2 = Seed1Residual(d)
        self.feed_forward_block = TwoLinears(d, c["d_ff"], "linear_1", "linear_2")
        setattr(self, f"residual_connection_{3 if cross else 2}", Seed1Residual(d))

    def forward(self, x, self_keep, memory=None, memory_keep=None):
        x = self.residual_connection_1(x, lambda h: self.self_attn_block(h, h, self_keep))
        if memory is None:
            return self.residual_connection_2(x, self.feed_forward_block)
        x = self.residual_connection_2(x, lambda h: self.cross_attn_block(h, memory, memory_keep))
        return self.residual_connection_3(x, self.feed_forward_block)


class Seed1(nn.Module):
    """The twin of write-up 001_81f6dddc71a43d39.txt.

    Its own LayerNorm: alpha * (x - mean) / (std + eps) + beta with the unbiased std and eps 1e-6
    outside the square root (parameters alpha, beta), inside ResidualConnection modules
    (norm(x + sublayer(x)), post-norm), no final norm on either stack, attention projections
    W_q, W_k, W_v, W_o without biases, fill -1e9 where mask == 0, FFN linear_1/linear_2,
    Embedding modules holding `embedding` (scaled by sqrt(d_model)), a sinusoid buffer per side
    (source_pe.pe, target_pe.pe), the output Linear inside linear_projection.linear.
    The write-up leaves the masks to the caller (source_mask for encoder self-attention and
    cross-attention, a triangular target_mask for decoder self-attention) and shows no mask
    function: this twin uses (src != pad)[:, None, None, :] and
    (tgt != pad)[:, None, None, :] & tril.
    """

    def __init__(self, c):
        super().__init__()
        self.c = c
        d = c["d_model"]
        self.source_embed = Seed1Embedding(d, c["src_vocab"])
        self.target_embed = Seed1Embedding(d, c["tgt_vocab"])
        self.source_pe = SinusoidBuffer(d, c["max_len"])
        self.target_pe = SinusoidBuffer(d, c["max_len"])
        self.encoder_blocks = nn.ModuleList([Seed1Block(c, False) for _ in range(c["layers"])])
        self.decoder_blocks = nn.ModuleList([Seed1Block(c, True) for _ in range(c["layers"])])
        self.linear_projection = nn.Module()
        self.linear_projection.linear = nn.Linear(d, c["tgt_vocab"])

    def forward(self, src, tgt):
        pad = self.c["pad_id"]
        source_mask = keep_keys(src, pad)
        target_mask = keep_keys(tgt, pad) & lower_triangle(tgt.shape[1])
        x = self.source_pe(self.source_embed(src))
        for block in self.encoder_blocks:
            x = block(x, source_mask)
        y = self.target_pe(self.target_embed(tgt))
        for block in self.decoder_blocks:
            y = block(y, target_mask, x, source_mask)
        return self.linear_projection.linear(y)


# --- seed 002 (002_1941aeb8be709000.txt) -----------------------------------------------------


class Seed2Layer(nn.Module):
    def __init__(self, c, cross):
        super().__init__()
        names, bias = ("w_q", "w_k", "w_v", "w_o"), (True,) * 4
        self.self_attn = Projections(c["d_model"], c["heads"], names, bias, -1e9)
        if cross:
            self.cross_attn = Projections(c["d_model"], c["heads"], names, bias, -1e9)
        self.feed_forward = TwoLinears(c["d_model"], c["d_ff"], "w_1", "w_2")
        for i in range(1, 4 if cross else 3):
            setattr(self, f"norm{i}", nn.LayerNorm(c["d_model"]))

    def forward(self, x, self_keep, memory=None, memory_keep=None):
        x = self.norm1(x + self.self_attn(x, x, self_keep))
        if memory is None:
            return self.norm2(x + self.feed_forward(x))
        x = self.norm2(x + self.cross_attn(x, memory, memory_keep))
        return self.norm3(x + self.feed_forward(x))


class Seed2Stack(nn.Module):
    def __init__(self, c, vocab, cross):
        super().__init__()
        self.d_model = c["d_model"]
        self.embedding = nn.Embedding(vocab, c["d_model"])
        self.pos_encoder = SinusoidBuffer(c["d_model"], c["max_len"])
        self.layers = nn.ModuleList([Seed2Layer(c, cross) for _ in range(c["layers"])])
        self.norm = nn.LayerNorm(c["d_model"])

    def forward(self, ids, *args):
        x = self.pos_encoder(self.embedding(ids) * math.sqrt(self.d_model))
        for layer in self.layers:
            x = layer(x, *args)
        return self.norm(x)


class Seed2(nn.Module):
    """The twin of write-up 002_1941aeb8be709000.txt.

    Post-norm layers with nn.LayerNorm (eps 1e-5), final norms (encoder.norm, decoder.norm), the
    embeddings and sinusoid buffers inside the stacks (encoder.embedding, encoder.pos_encoder.pe,
    decoder.embedding, decoder.pos_encoder.pe), fill -1e9 where mask == 0, masks built by the
    model: src_mask (src != pad)[:, None, None, :] (encoder and cross-attention), tgt_mask
    (tgt != pad)[:, None, None, :] & tril; the generator's weight is the decoder embedding
    (decoder.embedding.weight = generator.weight: stored once, as decoder.embedding.weight),
    with a bias of its own (generator.bias). FFN w_1/w_2.
    """

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.encoder = Seed2Stack(c, c["src_vocab"], cross=False)
        self.decoder = Seed2Stack(c, c["tgt_vocab"], cross=True)
        self.generator = nn.Linear(c["d_model"], c["tgt_vocab"])
        self.decoder.embedding.weight = self.generator.weight  # tied

    def forward(self, src, tgt):
        pad = self.c["pad_id"]
        src_mask = keep_keys(src, pad)
        tgt_mask = keep_keys(tgt, pad) & lower_triangle(tgt.shape[1])
        memory = self.encoder(src, src_mask)
        return self.generator(self.decoder(tgt, tgt_mask, memory, src_mask))


# --- seed 003 (003_2c60c57d5bb3dc01.txt) -----------------------------------------------------


class Seed3Layer(nn.Module):
    def __init__(self, c, cross):
        super().__init__()
        names, bias = ("W_q", "W_k", "W_v", "W_o"), (False, False, False, True)
        self.self_attn = Projections(c["d_model"], c["heads"], names, bias, -1e9)
        self.norm1 = nn.LayerNorm(c["d_model"])
        if cross:
            self.cross_attn = Projections(c["d_model"], c["heads"], names, bias, -1e9)
            self.norm2 = nn.LayerNorm(c["d_model"])
        self.ffn = TwoLinears(c["d_model"], c["d_ff"], "linear1", "linear2")
        setattr(self, f"norm{3 if cross else 2}", nn.LayerNorm(c["d_model"]))

    def forward(self, x, self_keep, memory=None, memory_keep=None):
        x = self.norm1(x + self.self_attn(x, x, self_keep))
        if memory is None:
            return self.norm2(x + self.ffn(x))
        x = self.norm2(x + self.cross_attn(x, memory, memory_keep))
        return self.norm3(x + self.ffn(x))


class Seed3(nn.Module):
    """The twin of write-up 003_2c60c57d5bb3dc01.txt.

    Post-norm layers with nn.LayerNorm (eps 1e-5), a final norm after the encoder only
    (encoder.norm; the decoder has none), W_q, W_k, W_v without biases and W_o with one, fill
    -1e9 where mask == 0, FFN linear1/linear2, one sinusoid buffer positional_encoding.pe, the
    output Linear fc_out. Masks from its create_padding_mask: src_mask (src != pad)[:, None,
    None, :] for the encoder; tgt_mask (tgt != pad)[:, None, :, None] & tril: padding of the
    QUERY (rows), so a padded target position attends to nothing but gets a uniform softmax
    over -1e9; the decoder is called without memory_mask, so cross-attention is unmasked.
    """

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.encoder_embedding = nn.Embedding(c["src_vocab"], c["d_model"])
        self.decoder_embedding = nn.Embedding(c["tgt_vocab"], c["d_model"])
        self.positional_encoding = SinusoidBuffer(c["d_model"], c["max_len"])
        self.encoder = nn.Module()
        self.encoder.layers = nn.ModuleList([Seed3Layer(c, False) for _ in range(c["layers"])])
        self.encoder.norm = nn.LayerNorm(c["d_model"])
        self.decoder = nn.Module()
        self.decoder.layers = nn.ModuleList([Seed3Layer(c, True) for _ in range(c["layers"])])
        self.fc_out = nn.Linear(c["d_model"], c["tgt_vocab"])

    @staticmethod
    def create_padding_mask(src, tgt, pad):
        src_mask = (src != pad)[:, None, None, :]
        tgt_mask = (tgt != pad)[:, None, :, None] & lower_triangle(tgt.shape[1])
        return src_mask, tgt_mask

    def forward(self, src, tgt):
        src_mask, tgt_mask = self.create_padding_mask(src, tgt, self.c["pad_id"])
        scale = math.sqrt(self.c["d_model"])
        x = self.positional_encoding(self.encoder_embedding(src) * scale)
        y = self.positional_encoding(self.decoder_embedding(tgt) * scale)
        for layer in self.encoder.layers:
            x = layer(x, src_mask)
        x = self.encoder.norm(x)
        for layer in self.decoder.layers:
            y = layer(y, tgt_mask, x, None)  # no memory mask
        return self.fc_out(y)


# --- seed 004 (004_026ae558ff9b0225.txt) -----------------------------------------------------


class Seed4Layer(nn.Module):
    def __init__(self, c, cross):
        super().__init__()
        names, bias = ("w_q", "w_k", "w_v", "fc_out"), (True,) * 4
        self.self_attn = Projections(c["d_model"], c["heads"], names, bias, -1e9)
        if cross:
            self.cross_attn = Projections(c["d_model"], c["heads"], names, bias, -1e9)
        self.feed_forward = TwoLinears(c["d_model"], c["d_ff"], "w_1", "w_2")
        for i in range(1, 4 if cross else 3):
            setattr(self, f"norm{i}", nn.LayerNorm(c["d_model"]))

    def forward(self, x, self_keep, memory=None, memory_keep=None):
        x = self.norm1(x + self.self_attn(x, x, self_keep))
        if memory is None:
            return self.norm2(x + self.feed_forward(x))
        x = self.norm2(x + self.cross_attn(x, memory, memory_keep))
        return self.norm3(x + self.feed_forward(x))


class Seed4Stack(nn.Module):
    def __init__(self, c, vocab, cross):
        super().__init__()
        self.d_model = c["d_model"]
        self.embedding = nn.Embedding(vocab, c["d_model"])
        self.pos_encoder = SinusoidBuffer(c["d_model"], c["max_len"])
        self.layers = nn.ModuleList([Seed4Layer(c, cross) for _ in range(c["layers"])])
        if cross:
            self.fc_out = nn.Linear(c["d_model"], vocab)

    def forward(self, ids, *args):
        x = self.pos_encoder(self.embedding(ids) * math.sqrt(self.d_model))
        for layer in self.layers:
            x = layer(x, *args)
        return self.fc_out(x) if hasattr(self, "fc_out") else x


def make_pad_mask(q, k, pad):
    return (k != pad).unsqueeze(1).unsqueeze(2)


def make_subsequent_mask(length):
    return torch.tril(torch.ones((length, length), dtype=torch.uint8)).unsqueeze(0)


class Seed4(nn.Module):
    """The twin of write-up 004_026ae558ff9b0225.txt.

    Post-norm layers with nn.LayerNorm (eps 1e-5), NO final norm on either stack, the embeddings
    and sinusoid buffers inside the stacks (encoder.embedding, encoder.pos_encoder.pe, ...), the
    attention output projection named fc_out (w_q, w_k, w_v, fc_out, all with biases), FFN
    w_1/w_2, fill -1e9 where mask == 0, the vocabulary projection inside the decoder
    (decoder.fc_out). Masks from its make_pad_mask ((k != pad)[:, None, None, :], bool) and
    make_subsequent_mask (tril, uint8 [1, L, L]): src_mask for the encoder and cross-attention,
    tgt_mask = pad mask & subsequent mask (uint8 after the &).
    """

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.encoder = Seed4Stack(c, c["src_vocab"], cross=False)
        self.decoder = Seed4Stack(c, c["tgt_vocab"], cross=True)

    def forward(self, src, tgt):
        pad = self.c["pad_id"]
        src_mask = make_pad_mask(src, src, pad)
        tgt_mask = make_pad_mask(tgt, tgt, pad) & make_subsequent_mask(tgt.shape[1])
        memory = self.encoder(src, src_mask)
        return self.decoder(tgt, tgt_mask, memory, src_mask)


# The configs of the kiln sources (their "small" config); bos_id starts greedy decoding.
CONFIGS = {
    "seed0_neginf_fill": dict(src_vocab=31, tgt_vocab=37, d_model=24, heads=3, d_ff=40,
                              layers=2, pad_id=0, bos_id=1, max_len=16, max_batch=4),
    "seed1_custom_layernorm": dict(src_vocab=29, tgt_vocab=33, d_model=32, heads=4, d_ff=48,
                                   layers=2, pad_id=0, bos_id=1, max_len=16, max_batch=4),
    "seed2_tied_generator": dict(src_vocab=35, tgt_vocab=41, d_model=24, heads=4, d_ff=56,
                                 layers=2, pad_id=1, bos_id=2, max_len=16, max_batch=4),
    "seed3_query_mask": dict(src_vocab=30, tgt_vocab=34, d_model=28, heads=2, d_ff=44,
                             layers=2, pad_id=0, bos_id=1, max_len=16, max_batch=4),
    "seed4_no_final_norm": dict(src_vocab=32, tgt_vocab=39, d_model=24, heads=4, d_ff=60,
                                layers=2, pad_id=0, bos_id=1, max_len=16, max_batch=4),
}
MODELS = {"seed0_neginf_fill": Seed0, "seed1_custom_layernorm": Seed1,
          "seed2_tied_generator": Seed2, "seed3_query_mask": Seed3,
          "seed4_no_final_norm": Seed4}
# Right-padded batches with odd lengths; the longest sets the length.
SRC_LENGTHS = [11, 7, 3]
TGT_LENGTHS = [9, 5, 3]
GREEDY_SRC_LENGTHS = [7, 3]
GREEDY_STEPS = 6
# The random seeds of each model's weights and greedy source batch: picked (among four tried)
# so that greedy decoding does not repeat one token, with top-2 logit gaps >= 0.01.
SEEDS = {"seed0_neginf_fill": 1700, "seed1_custom_layernorm": 1701, "seed2_tied_generator": 1802,
         "seed3_query_mask": 1603, "seed4_no_final_norm": 1804}


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            is_norm = (".norm" in "." + name and leaf in ("weight", "alpha")) or \
                (leaf == "alpha")
            if is_norm:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif "embed" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))


def batch(lengths, vocab, pad, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((len(lengths), max(lengths)), pad, dtype=torch.int64)
    for i, n in enumerate(lengths):
        row = torch.randint(0, vocab - 1, (n,), generator=g)
        ids[i, :n] = row + (row >= pad).long()  # every id but the pad id
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


def greedy(model, src, prompt, steps):
    """Appends the argmax of the last position, `steps` times; returns the appended tokens and
    the smallest gap between the best and second-best logit on the way."""
    tgt, gap = prompt.clone(), float("inf")
    for _ in range(steps):
        last = model(src, tgt)[:, -1]
        top = last.topk(2, -1).values
        gap = min(gap, float((top[:, 0] - top[:, 1]).min()))
        tgt = torch.cat([tgt, last.argmax(-1, keepdim=True)], 1)
    return tgt[:, prompt.shape[1]:], gap


def main():
    torch.set_num_threads(1)
    os.makedirs(OUT, exist_ok=True)
    for name in sorted(MODELS):
        c, seed = CONFIGS[name], SEEDS[name]
        model = MODELS[name](c).eval()
        randomize(model, seed)
        src = batch(SRC_LENGTHS, c["src_vocab"], c["pad_id"], seed + 1000)
        tgt = batch(TGT_LENGTHS, c["tgt_vocab"], c["pad_id"], seed + 1100)
        with torch.inference_mode():
            logits = model(src, tgt)
            assert torch.isfinite(logits).all(), name
            gsrc = batch(GREEDY_SRC_LENGTHS, c["src_vocab"], c["pad_id"], seed + 2000)
            prompt = torch.full((len(GREEDY_SRC_LENGTHS), 1), c["bos_id"], dtype=torch.int64)
            tokens, gap = greedy(model, gsrc, prompt, GREEDY_STEPS)
        # A tied weight is stored once, under its first name (as safetensors' save_model).
        weights, seen = {}, set()
        for key, t in model.state_dict().items():
            if t.data_ptr() in seen:
                continue
            seen.add(t.data_ptr())
            weights[key] = t
        write_safetensors(os.path.join(OUT, name + ".weights.safetensors"), weights)
        write_safetensors(os.path.join(OUT, name + ".inputs.safetensors"), {"src": src, "tgt": tgt})
        write_safetensors(os.path.join(OUT, name + ".expected.safetensors"), {"logits": logits})
        write_safetensors(os.path.join(OUT, name + ".greedy.safetensors"),
                          {"src": gsrc, "prompt": prompt, "greedy": tokens})
        print(name, list(logits.shape), len(weights), "weights;", "greedy",
              tokens.tolist(), f"(smallest top-2 gap {gap:.3g})")


if __name__ == "__main__":
    main()
