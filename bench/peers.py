#!/usr/bin/python3
"""PyTorch peer for kiln's model benchmarks, and the weights/ONNX files every engine uses.

Run with Debian's python3 (python3-torch, python3-numpy):

  /usr/bin/python3 bench/peers.py --weights-out /tmp/kiln-bench/base.safetensors \
      --onnx-dir /tmp/kiln-bench --reference-out /tmp/kiln-bench/reference.safetensors \
      [--openblas-dir DIR] --json-out /tmp/kiln-bench/pytorch.json

What it does:
  1. Builds the paper's base model (kiln's "base" config with max_len=1024) from the
     reference definition in tests/golden/make_golden.py (imported, not copied),
     initialised like the golden models (make_golden.init_weights, seed WEIGHT_SEED), and
     writes its state_dict with make_golden's safetensors writer (~375 MB; cached: an
     existing file is reused). This is the checkpoint kiln, PyTorch and ONNX Runtime run.
  2. --reference-out: W1-shaped ids and PyTorch's logits for them (kiln's
     check_vs_pytorch and ort/run.mjs compare against it).
  2b. --generation-reference-out: source ids and PyTorch's greedy (W3 shape) and beam-4 ids
     from the incremental decoder below, after checking it against the reference model
     without a cache (kiln's check_generate_vs_pytorch and ort/run.mjs compare against it).
  3. --onnx-dir: exports forward (src, tgt -> logits) and encode (src -> memory) with
     torch.onnx.export (TorchScript tracer, opset 17, dynamic batch and lengths) to
     forward.onnx and encode.onnx, and for generation gen_encode.onnx (src -> every decoder
     layer's cross-attention keys/values) and gen_step.onnx (one decoder step with past
     keys/values in, present out, beam reordering by a Gather of the past, log_softmax +
     top-k in the graph; see _GenStep). A failure is recorded in the JSON with its reason.
  4. --json-out: times PyTorch eager (torch.inference_mode, torch.set_num_threads(2)) on
     the workloads of bench/workloads.json: median ms over --runs runs after --warmup
     runs, each BLAS setting in its own subprocess (the BLAS is chosen at load time):
       - the system's libblas.so.3 as installed (on Debian 12 without OpenBLAS this is
         the netlib reference BLAS, ~2 GFLOP/s),
       - with OPENBLAS_CORETYPE=SkylakeX when that BLAS is OpenBLAS (and no --openblas-dir),
       - and, with --openblas-dir (a directory holding OpenBLAS's libblas.so.3, e.g. from
         Debian's libopenblas0-pthread; bench/run.sh extracts one without installing it),
         OpenBLAS through LD_LIBRARY_PATH, with OPENBLAS_CORETYPE unset and =SkylakeX.
     Each OpenBLAS setting runs with OMP_WAIT_POLICY unset and =PASSIVE (torch's libgomp
     threads otherwise spin on the cores OpenBLAS's threads need: W1 7x slower here).
     "best" is, per workload, the fastest setting, named. Settings whose BLAS probe is
     below --slow-gflops run W1 only (W2 would take minutes); a workload stops after
     --max-seconds of timed runs (at least 2 runs; the count is in the JSON).
     Then the generation workloads (workloads.json "generation": W3 greedy, W5 beam 4) with
     IncrementalDecoder, a hand-written incremental decoder over the reference model's
     weights (KV cache written in place, cross-attention keys/values once per sentence,
     batch and beams as tensor ops; see its docstring); slow settings skip W5.
     bf16 (issue 13): the same workloads under torch.autocast("cpu", dtype=torch.bfloat16)
     (matmuls and linears in bf16 through torch's oneDNN, softmax and LayerNorm in f32; one
     autocast context around a workload's warm-up and timed runs, so the weights' bf16 copies
     are cached across calls), as settings of their own ("bf16 autocast, ..."), with the
     OpenBLAS of --openblas-dir for what stays f32 (SkylakeX; OMP_WAIT_POLICY unset and
     =PASSIVE); their best is "best_bf16"/"best_generation_bf16", never mixed into the f32
     "best". Its probe is a bf16 matmul: below --slow-gflops, W1 only (and W3).

  5. --device cuda (bench/run_gpu.sh): instead of the BLAS settings, PyTorch eager FP32 and
     torch.compile on the GPU, each in its own subprocess, on the forward workloads (W1, W2,
     W4); TF32 off; every timed call ends with torch.cuda.synchronize(); torch.compile's
     compiles happen in its untimed warm-up calls (at least 3).

Ids are drawn from torch's seeded generator, uniform in [1, vocab) (no padding): the
shapes match the other engines', the ids themselves do not (the cost does not depend on
them).
"""

import argparse
import collections
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "golden"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import make_golden  # noqa: E402

# kiln's "base" config (frontend/models.cpp) with max_len raised to 1024 for W4, as
# bench/CMakeLists.txt compiles it.
BASE = collections.OrderedDict([
    ("src_vocab", 32000), ("tgt_vocab", 32000), ("d_model", 512), ("heads", 8),
    ("d_ff", 2048), ("enc_layers", 6), ("dec_layers", 6), ("pad_id", 0),
    ("max_len", 1024), ("max_batch", 16)])
WEIGHT_SEED = 2017
IDS_SEED = 7
REFERENCE_SEED = 11


def load_workloads():
    with open(os.path.join(HERE, "workloads.json")) as f:
        return json.load(f)["workloads"]


def build_model():
    torch.manual_seed(WEIGHT_SEED)
    model = make_golden.Transformer(BASE)
    make_golden.init_weights(model, WEIGHT_SEED)
    model.eval()
    return model


def read_weights_fast(path):
    """state_dict from a safetensors file (F32 only) via numpy: make_golden's reader
    unpacks with struct and takes minutes on 375 MB."""
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    sd = collections.OrderedDict()
    for name, info in header.items():
        assert info["dtype"] == "F32", (path, name)
        b, e = info["data_offsets"]
        arr = np.frombuffer(data, dtype="<f4", count=(e - b) // 4, offset=base + b)
        sd[name] = torch.from_numpy(arr.copy()).reshape(info["shape"])
    return sd


def load_model(weights):
    model = make_golden.Transformer(BASE)
    missing, unexpected = model.load_state_dict(read_weights_fast(weights), strict=True)
    assert not missing and not unexpected
    model.eval()
    return model


def random_ids(g, batch, length, vocab, pad_id):
    ids = torch.randint(1, vocab, (batch, length), generator=g, dtype=torch.int64)
    assert pad_id == 0 and bool((ids != pad_id).all())
    return ids


def write_weights(path):
    t0 = time.time()
    model = build_model()
    sd = model.state_dict()
    assert list(sd.keys()) == make_golden.expected_state_dict_keys(BASE)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    make_golden.write_safetensors(tmp, list(sd.items()), BASE)
    os.replace(tmp, path)
    print("peers.py: wrote %s (%.0f MB) in %.1f s" % (path, os.path.getsize(path) / 1e6, time.time() - t0),
          file=sys.stderr)


def write_reference(weights, path):
    model = load_model(weights)
    g = torch.Generator().manual_seed(REFERENCE_SEED)
    src = random_ids(g, 1, 32, BASE["src_vocab"], BASE["pad_id"])
    tgt = random_ids(g, 1, 32, BASE["tgt_vocab"], BASE["pad_id"])
    torch.set_num_threads(1)
    with torch.inference_mode():
        logits = model(src, tgt)
        logits64 = model.double()(src, tgt)
    assert torch.isfinite(logits).all()
    # The golden-style init (weights 0.3·randn at d_model 512) gives near one-hot softmaxes
    # and large pre-norm activations: float32 rounding alone moves the logits by ~0.2
    # (of ~30). Engines are judged against the float64 logits next to PyTorch's own f32.
    f32_err = (logits.double() - logits64).abs().max().item()
    make_golden.write_safetensors(
        path, [("src", src), ("tgt", tgt), ("logits", logits.contiguous()),
               ("logits_f64", logits64.float().contiguous())],
        collections.OrderedDict([("what", "W1-shaped ids, PyTorch's f32 logits and f64 logits (rounded to f32)"),
                                 ("pytorch_f32_vs_f64_max_abs", "%.6g" % f32_err)]))
    print("peers.py: wrote %s" % path, file=sys.stderr)


class _Encode(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, src):
        return self.model.encode(src)


class _BoolCompareAsTensor:
    """Export-only workaround: the reference model masks with `mask == False`, which
    torch 1.13's tracer records as aten::eq(Tensor, bool) and then rejects ("We don't have
    an op for aten::eq but it isn't a special case"). While exporting, a comparison with
    a Python bool compares with a 0-d bool tensor instead: same values, traceable."""

    def __enter__(self):
        self.eq, self.ne = torch.Tensor.__eq__, torch.Tensor.__ne__
        eq, ne = self.eq, self.ne
        torch.Tensor.__eq__ = lambda a, b: eq(a, torch.tensor(b)) if isinstance(b, bool) else eq(a, b)
        torch.Tensor.__ne__ = lambda a, b: ne(a, torch.tensor(b)) if isinstance(b, bool) else ne(a, b)
        return self

    def __exit__(self, *exc):
        torch.Tensor.__eq__, torch.Tensor.__ne__ = self.eq, self.ne
        return False


def export_onnx(weights, out_dir):
    """Returns {"forward": path or None, "encode": ..., "errors": {...}}."""
    import warnings
    model = load_model(weights)
    os.makedirs(out_dir, exist_ok=True)
    # Trace with shapes unlike any workload's, so a shape baked in by the tracer shows up
    # as a failure on the workloads rather than passing unnoticed.
    g = torch.Generator().manual_seed(3)
    src = random_ids(g, 2, 7, BASE["src_vocab"], BASE["pad_id"])
    tgt = random_ids(g, 2, 5, BASE["tgt_vocab"], BASE["pad_id"])
    result = {"forward": None, "encode": None, "errors": {}, "opset": 17,
              "note": "traced at B=2, S=7, T=5 with dynamic B/S/T; `mask == False` exported as a "
                      "tensor comparison (torch 1.13 tracer workaround, same values)"}
    jobs = [
        ("forward", model, (src, tgt), ["src", "tgt"], ["logits"],
         {"src": {0: "B", 1: "S"}, "tgt": {0: "B", 1: "T"}, "logits": {0: "B", 1: "T"}}),
        ("encode", _Encode(model), (src,), ["src"], ["memory"],
         {"src": {0: "B", 1: "S"}, "memory": {0: "B", 1: "S"}}),
    ]
    for name, module, args, inputs, outputs, axes in jobs:
        path = os.path.join(out_dir, name + ".onnx")
        t0 = time.time()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with torch.no_grad(), _BoolCompareAsTensor():
                    torch.onnx.export(module, args, path + ".tmp", input_names=inputs, output_names=outputs,
                                      dynamic_axes=axes, opset_version=17, do_constant_folding=True)
            os.replace(path + ".tmp", path)
            result[name] = path
            print("peers.py: exported %s (%.0f MB) in %.1f s" % (path, os.path.getsize(path) / 1e6,
                                                                 time.time() - t0), file=sys.stderr)
        except Exception as e:  # noqa: BLE001 -- report any exporter failure
            result["errors"][name] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            print("peers.py: ONNX export of %s failed: %s" % (name, result["errors"][name]), file=sys.stderr)
    return result


# ----------------------------------------------------------------------------
# Generation (issue 11: W3, W5): a hand-written incremental decoder over the reference
# model's weights, and the ONNX graphs ONNX Runtime's peer decodes with.
# ----------------------------------------------------------------------------

def load_generation():
    with open(os.path.join(HERE, "workloads.json")) as f:
        doc = json.load(f)
    return doc.get("generation", []), doc.get("generation_ids", {"start_id": 1, "end_id": 2})


def _linear(x, w, b):
    """F.linear, but for one row torch.addmv: with OpenBLAS, F.linear on [1, K] (sgemm with
    M = 1) takes about twice as long as sgemv here (generator 512x32000: 30 vs 15 ms). Under
    bf16 autocast F.linear, which autocast runs in bf16 (addmv it leaves in f32)."""
    if x.dim() == 2 and x.shape[0] == 1 and not torch.is_autocast_cpu_enabled():
        return torch.addmv(b, w, x[0]).unsqueeze(0)
    return F.linear(x, w, b)


class IncrementalDecoder:
    """Greedy and beam search with the reference model's weights, written as a careful
    PyTorch user would (fairseq / CTranslate2 style), under torch.inference_mode():

    - prepare(src): the encoder once, then every decoder layer's cross-attention keys and
      values projected once per sentence ([B,H,dk,S] and [B,H,S,dk], never copied per beam:
      the beams of a sentence attend with their queries batched as [B,H,K,dk]);
    - self-attention keys/values in buffers allocated once for (rows, max length),
      [N,H,T,dk], the new token's written in place at position t; beam reordering gathers the
      filled prefix into the other of two buffers (index_select with out=: one copy);
    - q, k, v of self-attention as one merged [3D, D] matmul (weights concatenated once);
      a single row (greedy, batch 1) through torch.addmv (sgemv), not sgemm with M = 1;
    - search with tensor ops: log_softmax, the end token masked before min_length, argmax
      (greedy) or topk over [B, K·V] (beam); hypotheses kept in a [B·K] row order.

    Beam search here serves the benchmark's setting (min_length = max_length: no hypothesis
    ends early); greedy stops when every sentence has produced the end token."""

    def __init__(self, model):
        self.model = model
        cfg = model.cfg
        self.D, self.H = cfg["d_model"], cfg["heads"]
        self.dk = self.D // self.H
        self.V = cfg["tgt_vocab"]
        self.pad_id = cfg["pad_id"]
        self.scale = math.sqrt(self.dk)
        self.emb_scale = math.sqrt(self.D)
        self.emb = model.tgt_embed.weight.detach()
        self.pe = model.pe.float()
        self.layers = []
        with torch.no_grad():
            self._merge(model)
        self.norm = model.decoder.norm
        self.gen_w, self.gen_b = model.generator.weight.detach(), model.generator.bias.detach()

    def _merge(self, model):
        for layer in model.decoder.layers:
            sa, ca = layer.self_attn, layer.cross_attn
            self.layers.append(dict(
                w_qkv=torch.cat([sa.w_q.weight, sa.w_k.weight, sa.w_v.weight]).contiguous(),
                b_qkv=torch.cat([sa.w_q.bias, sa.w_k.bias, sa.w_v.bias]).contiguous(),
                w_o=sa.w_o.weight, b_o=sa.w_o.bias,
                c_wq=ca.w_q.weight, c_bq=ca.w_q.bias, c_wo=ca.w_o.weight, c_bo=ca.w_o.bias,
                c_wk=ca.w_k.weight, c_bk=ca.w_k.bias, c_wv=ca.w_v.weight, c_bv=ca.w_v.bias,
                w1=layer.ffn.w_1.weight, b1=layer.ffn.w_1.bias, w2=layer.ffn.w_2.weight, b2=layer.ffn.w_2.bias,
                n1=layer.norm1, n2=layer.norm2, n3=layer.norm3))
            for k, v in self.layers[-1].items():
                if isinstance(v, torch.Tensor):
                    self.layers[-1][k] = v.detach()

    def prepare(self, src):
        B, S = src.shape
        memory = self.model.encode(src)
        self.mem = []
        for L in self.layers:
            k = F.linear(memory, L["c_wk"], L["c_bk"]).view(B, S, self.H, self.dk).permute(0, 2, 3, 1).contiguous()
            v = F.linear(memory, L["c_wv"], L["c_bv"]).view(B, S, self.H, self.dk).transpose(1, 2).contiguous()
            self.mem.append((k, v))  # [B,H,dk,S], [B,H,S,dk]
        pad = src == self.pad_id
        self.src_bias = pad.view(B, 1, 1, S).float() * -1e9 if bool(pad.any()) else None

    def _layer(self, x, l, t, B, K, cache):
        L = self.layers[l]
        N, D, H, dk = x.shape[0], self.D, self.H, self.dk
        qkv = _linear(x, L["w_qkv"], L["b_qkv"])
        q, k, v = qkv.split(D, dim=1)
        ck, cv = cache
        ck[:N, :, t] = k.view(N, H, dk)
        cv[:N, :, t] = v.view(N, H, dk)
        s = torch.matmul(q.view(N, H, 1, dk), ck[:N, :, :t + 1].transpose(2, 3)) / self.scale
        o = torch.matmul(torch.softmax(s, dim=-1), cv[:N, :, :t + 1]).view(N, D)
        x = F.layer_norm(x + _linear(o, L["w_o"], L["b_o"]), (D,), L["n1"].weight, L["n1"].bias, 1e-5)
        mk, mv = self.mem[l]
        q = _linear(x, L["c_wq"], L["c_bq"]).view(B, K, H, dk).transpose(1, 2)  # [B,H,K,dk]
        s = torch.matmul(q, mk) / self.scale  # [B,H,K,S]
        if self.src_bias is not None:
            s = s + self.src_bias
        o = torch.matmul(torch.softmax(s, dim=-1), mv).transpose(1, 2).reshape(N, D)
        x = F.layer_norm(x + _linear(o, L["c_wo"], L["c_bo"]), (D,), L["n2"].weight, L["n2"].bias, 1e-5)
        h = _linear(torch.relu(_linear(x, L["w1"], L["b1"])), L["w2"], L["b2"])
        return F.layer_norm(x + h, (D,), L["n3"].weight, L["n3"].bias, 1e-5)

    def step_logits(self, tok, t, B, K, cache):
        x = F.embedding(tok, self.emb) * self.emb_scale + self.pe[t]
        for l in range(len(self.layers)):
            x = self._layer(x, l, t, B, K, cache[l])
        x = self.norm(x)
        return _linear(x, self.gen_w, self.gen_b)  # [N, V]

    def new_cache(self, rows, max_len, double=False):
        shape = (rows, self.H, max_len, self.dk)
        n = 2 if double else 1
        return [[(torch.empty(shape), torch.empty(shape)) for _ in range(n)] for _ in self.layers]

    def greedy(self, src, start_id, end_id, max_len, min_len, return_logits=False):
        """Returns (ids [B, steps], cum [B]) (and the logits of every step if asked)."""
        B = src.shape[0]
        self.prepare(src)
        cache = [c[0] for c in self.new_cache(B, max_len)]
        tok = torch.full((B,), start_id, dtype=torch.int64)
        done = torch.zeros(B, dtype=torch.bool)
        cum = torch.zeros(B)
        out, logits_seen = [], []
        for t in range(max_len):
            logits = self.step_logits(tok, t, B, 1, cache)
            if return_logits:
                logits_seen.append(logits.clone())
            lp = torch.log_softmax(logits, dim=-1)
            if t < min_len:
                lp[:, end_id] = -math.inf
            best, tok = lp.max(dim=-1)
            cum = cum + torch.where(done, torch.zeros_like(best), best)
            out.append(tok)
            done = done | (tok == end_id)
            if bool(done.all()):
                break
        ids = torch.stack(out, dim=1)
        return (ids, cum, logits_seen) if return_logits else (ids, cum)

    def beam(self, src, start_id, end_id, beam, max_len, min_len):
        """Returns (best ids [B, max_len], their cum [B]); needs min_len == max_len."""
        assert min_len == max_len, "the peer's beam search serves the forced-length workload"
        B = src.shape[0]
        V = self.V
        self.prepare(src)
        bufs = self.new_cache(B * beam, max_len, double=True)
        cur = 0
        tok = torch.full((B,), start_id, dtype=torch.int64)
        cum = torch.zeros(B, 1)
        hist = torch.empty(B, 0, dtype=torch.int64)
        K = 1
        base = torch.arange(B).unsqueeze(1)
        for t in range(max_len):
            cache = [b[cur] for b in bufs]
            logits = self.step_logits(tok, t, B, K, cache)
            lp = torch.log_softmax(logits, dim=-1)
            if t < min_len:
                lp[:, end_id] = -math.inf
            scores = (cum.view(B, K, 1) + lp.view(B, K, V)).view(B, K * V)
            cum, idx = scores.topk(beam, dim=1)  # sorted, best first
            parent = torch.div(idx, V, rounding_mode="floor")
            tok = (idx - parent * V).view(-1)
            rows = (base * K + parent).view(-1)  # [B·beam] rows of this step's hypotheses
            hist = torch.cat([hist.index_select(0, rows), tok.view(-1, 1)], dim=1)
            if t + 1 < max_len:
                nxt = 1 - cur
                for l in range(len(self.layers)):
                    for c in range(2):
                        torch.index_select(bufs[l][cur][c][:B * K, :, :t + 1], 0, rows,
                                           out=bufs[l][nxt][c][:B * beam, :, :t + 1])
                cur = nxt
            K = beam
        return hist.view(B, beam, -1)[:, 0], cum[:, 0]


class _GenEncode(torch.nn.Module):
    """ONNX graph gen_encode: src [B,S] -> mem_k<l> [B,H,dk,S], mem_v<l> [B,H,S,dk] for every
    decoder layer (cross-attention keys/values projected once), src_bias [B,1,1,S] (0, or
    -1e9 at padding)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.H = model.cfg["heads"]
        self.dk = model.cfg["d_model"] // self.H

    def forward(self, src):
        memory = self.model.encode(src)
        B, S = src.shape[0], src.shape[1]
        outs = []
        for layer in self.model.decoder.layers:
            ca = layer.cross_attn
            outs.append(ca.w_k(memory).view(B, S, self.H, self.dk).permute(0, 2, 3, 1))
            outs.append(ca.w_v(memory).view(B, S, self.H, self.dk).transpose(1, 2))
        bias = (src == self.model.cfg["pad_id"]).to(torch.float32).view(B, 1, 1, S) * -1e9
        return tuple(outs) + (bias,)


class _GenStep(torch.nn.Module):
    """ONNX graph gen_step: one decoder step with past keys/values, and the search's
    scoring. Inputs:
      tok [B,K] i64 (the last token of each of the K live hypotheses of each sentence),
      pos [1] i64, beam_idx [B·K] i64 (the row of past_* each hypothesis continues),
      cum [B,K] f32 (their scores), end_bias [V] f32 (-inf at end_id before min_length),
      kout [Kout] f32 (only its length is read: the hypotheses to keep, 1 for greedy),
      src_bias [B,1,1,S], then per layer past_k<l>, past_v<l> [Nprev,H,P,dk],
      mem_k<l> [B,H,dk,S], mem_v<l> [B,H,S,dk].
    Outputs: scores [B,Kout] and index [B,Kout] (into K·V: hypothesis index // V, token
    index % V) of the best continuations (log_softmax + topk in the graph, so the 32000·N
    logits never leave ORT), present_k<l>, present_v<l> [B·K,H,P+1,dk] (the past gathered
    by beam_idx, then this step's keys/values appended)."""

    def __init__(self, model):
        super().__init__()
        self.dec = IncrementalDecoder(model)
        self.model = model

    def forward(self, tok, pos, beam_idx, cum, end_bias, kout, src_bias, *state):
        d = self.dec
        B, K = tok.shape[0], tok.shape[1]
        N = B * K
        D, H, dk = d.D, d.H, d.dk
        x = F.embedding(tok.reshape(-1), d.emb) * d.emb_scale + torch.index_select(d.pe, 0, pos)
        presents = []
        for l, L in enumerate(d.layers):
            past_k, past_v, mk, mv = state[4 * l: 4 * l + 4]
            qkv = F.linear(x, L["w_qkv"], L["b_qkv"])
            q, k, v = qkv.split(D, dim=1)
            kk = torch.cat([torch.index_select(past_k, 0, beam_idx), k.reshape(N, H, 1, dk)], dim=2)
            vv = torch.cat([torch.index_select(past_v, 0, beam_idx), v.reshape(N, H, 1, dk)], dim=2)
            presents += [kk, vv]
            s = torch.matmul(q.reshape(N, H, 1, dk), kk.transpose(2, 3)) / d.scale
            o = torch.matmul(torch.softmax(s, dim=-1), vv).reshape(N, D)
            x = F.layer_norm(x + F.linear(o, L["w_o"], L["b_o"]), (D,), L["n1"].weight, L["n1"].bias, 1e-5)
            qc = F.linear(x, L["c_wq"], L["c_bq"]).reshape(B, K, H, dk).transpose(1, 2)
            s = torch.matmul(qc, mk) / d.scale + src_bias
            o = torch.matmul(torch.softmax(s, dim=-1), mv).transpose(1, 2).reshape(N, D)
            x = F.layer_norm(x + F.linear(o, L["c_wo"], L["c_bo"]), (D,), L["n2"].weight, L["n2"].bias, 1e-5)
            h = F.linear(torch.relu(F.linear(x, L["w1"], L["b1"])), L["w2"], L["b2"])
            x = F.layer_norm(x + h, (D,), L["n3"].weight, L["n3"].bias, 1e-5)
        x = d.norm(x)
        lp = torch.log_softmax(F.linear(x, d.gen_w, d.gen_b), dim=-1) + end_bias
        scores = (cum.reshape(B, K, 1) + lp.reshape(B, K, d.V)).reshape(B, K * d.V)
        top, index = torch.topk(scores, kout.shape[0], dim=1)
        return (top, index) + tuple(presents)


def export_generation_onnx(weights, out_dir):
    """gen_encode.onnx and gen_step.onnx; returns {"gen_encode": path or None, ...}."""
    import warnings
    model = load_model(weights)
    L = BASE["dec_layers"]
    H, dk = BASE["heads"], BASE["d_model"] // BASE["heads"]
    g = torch.Generator().manual_seed(5)
    B, S, K, P = 2, 7, 3, 4
    src = random_ids(g, B, S, BASE["src_vocab"], BASE["pad_id"])
    enc = _GenEncode(model)
    with torch.no_grad():
        mems = enc(src)
    mem_names = []
    for l in range(L):
        mem_names += ["mem_k%d" % l, "mem_v%d" % l]
    step_state, state_names, state_axes = [], [], {}
    for l in range(L):
        pk = torch.randn(B * 2, H, P, dk)
        pv = torch.randn(B * 2, H, P, dk)
        step_state += [pk, pv, mems[2 * l], mems[2 * l + 1]]
        state_names += ["past_k%d" % l, "past_v%d" % l, "mem_k%d" % l, "mem_v%d" % l]
        state_axes.update({"past_k%d" % l: {0: "Np", 2: "P"}, "past_v%d" % l: {0: "Np", 2: "P"},
                           "mem_k%d" % l: {0: "B", 3: "S"}, "mem_v%d" % l: {0: "B", 2: "S"},
                           "present_k%d" % l: {0: "N", 2: "P1"}, "present_v%d" % l: {0: "N", 2: "P1"}})
    tok = random_ids(g, B, K, BASE["tgt_vocab"], BASE["pad_id"])
    step_args = (tok, torch.tensor([P], dtype=torch.int64),
                 torch.tensor([0, 1, 1, 2, 3, 3], dtype=torch.int64), torch.randn(B, K),
                 torch.zeros(BASE["tgt_vocab"]), torch.zeros(2), mems[-1]) + tuple(step_state)
    present_names = []
    for l in range(L):
        present_names += ["present_k%d" % l, "present_v%d" % l]
    step_axes = {"tok": {0: "B", 1: "K"}, "beam_idx": {0: "N"}, "cum": {0: "B", 1: "K"}, "kout": {0: "Kout"},
                 "src_bias": {0: "B", 3: "S"}, "scores": {0: "B", 1: "Kout"}, "index": {0: "B", 1: "Kout"}}
    step_axes.update(state_axes)
    enc_axes = {"src": {0: "B", 1: "S"}, "src_bias": {0: "B", 3: "S"}}
    for l in range(L):
        enc_axes["mem_k%d" % l] = {0: "B", 3: "S"}
        enc_axes["mem_v%d" % l] = {0: "B", 2: "S"}
    result = {"gen_encode": None, "gen_step": None, "errors": {}, "opset": 17,
              "note": "traced at B=2, S=7, K=3, P=4 with dynamic axes"}
    jobs = [("gen_encode", enc, (src,), ["src"], mem_names + ["src_bias"], enc_axes),
            ("gen_step", _GenStep(model), step_args,
             ["tok", "pos", "beam_idx", "cum", "end_bias", "kout", "src_bias"] + state_names,
             ["scores", "index"] + present_names, step_axes)]
    for name, module, args, inputs, outputs, axes in jobs:
        path = os.path.join(out_dir, name + ".onnx")
        t0 = time.time()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with torch.no_grad(), _BoolCompareAsTensor():
                    torch.onnx.export(module, args, path + ".tmp", input_names=inputs, output_names=outputs,
                                      dynamic_axes=axes, opset_version=17, do_constant_folding=True)
            os.replace(path + ".tmp", path)
            result[name] = path
            print("peers.py: exported %s (%.0f MB) in %.1f s" % (path, os.path.getsize(path) / 1e6,
                                                                 time.time() - t0), file=sys.stderr)
        except Exception as e:  # noqa: BLE001 -- report any exporter failure
            result["errors"][name] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")
            print("peers.py: ONNX export of %s failed: %s" % (name, result["errors"][name]), file=sys.stderr)
    return result


GEN_REFERENCE_SEED = 13


def write_generation_reference(weights, path):
    """Source ids, and PyTorch's greedy (W3 shape) and beam-4 (2 sentences, W5's setting)
    ids from the incremental decoder, which is checked here against the reference model
    without a cache: the greedy ids must equal greedy decoding that reruns the full model
    every step, and every step's logits are compared with forward()'s (max |Δ| recorded).
    generate_bench (kiln) and ort/run.mjs report how many of these ids they reproduce."""
    model = load_model(weights)
    gen, ids = load_generation()
    start_id, end_id = ids["start_id"], ids["end_id"]
    n = gen[0]["new_tokens"]
    g = torch.Generator().manual_seed(GEN_REFERENCE_SEED)
    src = random_ids(g, 1, 32, BASE["src_vocab"], BASE["pad_id"])
    src_b = random_ids(g, 2, 32, BASE["src_vocab"], BASE["pad_id"])
    torch.set_num_threads(1)
    dec = IncrementalDecoder(model)
    with torch.inference_mode():
        greedy, cum, step_logits = dec.greedy(src, start_id, end_id, n, n, return_logits=True)
        # The same greedy search rerunning the full model (no cache) every step.
        tgt = torch.tensor([[start_id]])
        full_ids = []
        for t in range(n):
            lp = torch.log_softmax(model(src, tgt)[:, -1], dim=-1)
            lp[:, end_id] = -math.inf
            full_ids.append(int(lp.argmax(-1)))
            tgt = torch.cat([tgt, torch.tensor([[full_ids[-1]]])], dim=1)
        # Teacher forced with the incremental decoder's ids: every step's logits.
        tf = model(src, torch.cat([torch.tensor([[start_id]]), greedy[:, :-1]], dim=1))[0]
        logit_err = max(float((step_logits[t][0] - tf[t]).abs().max()) for t in range(n))
        beam_ids, beam_cum = dec.beam(src_b, start_id, end_id, 4, n, n)
    same = int(sum(a == b for a, b in zip(greedy[0].tolist(), full_ids)))
    meta = collections.OrderedDict([
        ("what", "generation reference: src (W3 shape) and PyTorch's greedy ids; src_beam (2 sentences) "
                 "and PyTorch's best beam-4 ids; start_id %d, end_id %d, min = max length %d" % (start_id, end_id, n)),
        ("greedy_cum", "%.6f" % float(cum[0])),
        ("beam_cum", ",".join("%.6f" % float(c) for c in beam_cum)),
        ("incremental_vs_full_greedy_same_ids", "%d/%d" % (same, n)),
        ("incremental_vs_forward_max_abs_logit_diff", "%.3g" % logit_err)])
    make_golden.write_safetensors(path, [("src", src), ("greedy_ids", greedy.contiguous()),
                                         ("src_beam", src_b), ("beam_ids", beam_ids.contiguous())], meta)
    print("peers.py: wrote %s (incremental decoder vs full model: greedy ids %d/%d equal, "
          "logits max |Δ| %.3g)" % (path, same, n, logit_err), file=sys.stderr)


def time_generation(model, args, slow):
    """{key: timing} of the generation workloads with the incremental decoder."""
    gen, ids = load_generation()
    dec = IncrementalDecoder(model)
    out = {}
    for w in gen:
        key = w["key"]
        if slow and w["beam"] > 1:
            out[key] = {"skipped": "slow BLAS: beam search not run with this BLAS"}
            continue
        g = torch.Generator().manual_seed(IDS_SEED + int(key[1:]))
        src = random_ids(g, w["batch"], w["src_len"], BASE["src_vocab"], BASE["pad_id"])
        n = w["new_tokens"]
        if w["beam"] == 1:
            fn = lambda: dec.greedy(src, ids["start_id"], ids["end_id"], n, n)  # noqa: E731
        else:
            fn = lambda: dec.beam(src, ids["start_id"], ids["end_id"], w["beam"], n, n)  # noqa: E731
        times = []
        with torch.inference_mode(), autocast(args.bf16):
            t0 = time.perf_counter()
            for _ in range(args.warmup):
                toks, _cum = fn()
            warm_ms = (time.perf_counter() - t0) * 1e3 / max(args.warmup, 1)
            assert toks.shape == (w["batch"], n), toks.shape
            if warm_ms > args.max_seconds * 1e3:
                # A setting this slow (libgomp spinning against OpenBLAS: W5 takes minutes)
                # gets its warm-up call as its only figure, marked runs 0.
                out[key] = {"median_ms": warm_ms, "min_ms": warm_ms, "runs_ms": [], "runs": 0,
                            "warmup": args.warmup, "note": "warm-up only: slower than --max-seconds",
                            "target_tokens": w["batch"] * n, "tokens_per_s": w["batch"] * n / (warm_ms / 1e3)}
                print("peers.py:   %s %.1f ms (warm-up only)" % (key, warm_ms), file=sys.stderr)
                continue
            start = time.perf_counter()
            for _ in range(args.runs):
                if len(times) >= 2 and time.perf_counter() - start > args.max_seconds:
                    break
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        med = statistics.median(times)
        out[key] = {"median_ms": med, "min_ms": min(times), "runs_ms": [round(t, 3) for t in times],
                    "runs": len(times), "warmup": args.warmup,
                    "target_tokens": w["batch"] * n, "tokens_per_s": w["batch"] * n / (med / 1e3)}
        print("peers.py:   %s %.1f ms (median of %d)" % (key, med, len(times)), file=sys.stderr)
    return out


# ----------------------------------------------------------------------------
# Timing (worker subprocess: one BLAS setting)
# ----------------------------------------------------------------------------

def loaded_blas():
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            p = line.split()[-1] if len(line.split()) >= 6 else ""
            if "blas" in os.path.basename(p):
                libs.add(p)
    return sorted(libs)


def blas_probe(threads, bf16=False):
    """GFLOP/s of one 2048x512 @ 512x2048 matmul: tells a usable BLAS from netlib's (with
    bf16: under bf16 autocast)."""
    a = torch.randn(2048, 512)
    b = torch.randn(512, 2048)
    with autocast(bf16):
        a @ b
        t0 = time.perf_counter()
        a @ b
        dt = time.perf_counter() - t0
    return 2.0 * 2048 * 512 * 2048 / dt / 1e9


def autocast(bf16):
    """bf16 autocast on the CPU, or nothing."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else torch.autocast("cpu", enabled=False)


def rss_mib():
    """The resident set size now (VmRSS), in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def worker(args):
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model = load_model(args.weights)
    load_ms = (time.perf_counter() - t0) * 1e3
    rss_after_load = rss_mib()
    blas = loaded_blas()
    probe = blas_probe(args.threads, args.bf16)
    out = {"blas": blas, "is_openblas": any("openblas" in b for b in blas),
           "probe_gflops": round(probe, 1), "torch_num_threads": torch.get_num_threads(),
           "load_ms": round(load_ms, 1), "rss_after_load_mib": round(rss_after_load, 1),
           "bf16_autocast": args.bf16, "workloads": {}}
    slow = probe < args.slow_gflops
    for w in [] if args.generation_only else load_workloads():
        key = w["key"]
        if slow and key != "W1":
            out["workloads"][key] = {"skipped": "BLAS probe %.1f GFLOP/s < %.0f: only W1 is run with this BLAS"
                                                % (probe, args.slow_gflops)}
            continue
        g = torch.Generator().manual_seed(IDS_SEED + int(key[1:]))
        src = random_ids(g, w["batch"], w["src_len"], BASE["src_vocab"], BASE["pad_id"])
        tgt = random_ids(g, w["batch"], w["tgt_len"], BASE["tgt_vocab"], BASE["pad_id"]) \
            if w["function"] == "forward" else None
        runs = args.runs if not slow else min(args.runs, 3)
        times = []
        with torch.inference_mode(), autocast(args.bf16):
            fn = (lambda: model(src, tgt)) if w["function"] == "forward" else (lambda: model.encode(src))
            for _ in range(args.warmup):
                y = fn()
            assert torch.isfinite(y).all()
            del y
            start = time.perf_counter()
            for _ in range(runs):
                if len(times) >= 2 and time.perf_counter() - start > args.max_seconds:
                    break  # slow setting: fewer runs (recorded below)
                t0 = time.perf_counter()
                y = fn()
                times.append((time.perf_counter() - t0) * 1e3)
                del y
        out["workloads"][key] = {"median_ms": statistics.median(times), "min_ms": min(times),
                                 "runs_ms": [round(t, 3) for t in times], "runs": len(times), "warmup": args.warmup}
        print("peers.py:   %s %.1f ms (median of %d)" % (key, statistics.median(times), len(times)),
              file=sys.stderr)
    # Peak over the load and every workload run (ru_maxrss is in KiB on Linux); generation
    # after it, with its own figure.
    out["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)
    if not args.no_generation:
        out["generation"] = time_generation(model, args, slow)
        out["peak_rss_with_generation_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)
    json.dump(out, sys.stdout)


def on_device(model, device):
    """The model on `device`, its causal mask built there: make_golden's _tgt_mask makes
    it on the CPU (same values; the reference module is not changed)."""
    model = model.to(device)
    pad_id = model.cfg["pad_id"]

    def tgt_mask(tgt):
        T = tgt.shape[1]
        key = (tgt != pad_id).unsqueeze(1).unsqueeze(2)  # [B,1,1,T]
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool, device=tgt.device))
        return key & causal.unsqueeze(0).unsqueeze(0)  # [B,1,T,T]
    model._tgt_mask = tgt_mask
    return model


def gpu_worker(args):
    """One GPU setting (--device cuda): PyTorch eager FP32, or with --torch-compile the
    model under torch.compile (default mode, dynamic=False: one graph per workload shape,
    compiled during the warm-up calls, which are not timed). FP32 throughout: TF32 off
    (torch.set_float32_matmul_precision("highest")), as kiln's FP32 kernels use no tensor
    cores. Each timed call ends with torch.cuda.synchronize()."""
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        json.dump({"error": "no CUDA device visible to PyTorch (torch.cuda.is_available() is False)"},
                  sys.stdout)
        return 0
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()
    t0 = time.perf_counter()
    model = on_device(load_model(args.weights), device)
    sync()
    load_ms = (time.perf_counter() - t0) * 1e3
    out = {"device": str(device), "torch_compile": args.torch_compile, "load_ms": round(load_ms, 1),
           "workloads": {}}
    if device.type == "cuda":
        out["device_name"] = torch.cuda.get_device_name(device)
    warmup = max(args.warmup, 3) if args.torch_compile else args.warmup
    for w in load_workloads():
        key = w["key"]
        g = torch.Generator().manual_seed(IDS_SEED + int(key[1:]))
        src = random_ids(g, w["batch"], w["src_len"], BASE["src_vocab"], BASE["pad_id"]).to(device)
        tgt = random_ids(g, w["batch"], w["tgt_len"], BASE["tgt_vocab"], BASE["pad_id"]).to(device) \
            if w["function"] == "forward" else None
        fn = model if w["function"] == "forward" else model.encode
        if args.torch_compile:
            fn = torch.compile(fn, dynamic=False)
        call = (lambda: fn(src, tgt)) if w["function"] == "forward" else (lambda: fn(src))
        times = []
        with torch.inference_mode():
            t0 = time.perf_counter()
            for _ in range(warmup):
                y = call()
            sync()
            warm_ms = (time.perf_counter() - t0) * 1e3
            assert torch.isfinite(y).all()
            del y
            start = time.perf_counter()
            for _ in range(args.runs):
                if len(times) >= 2 and time.perf_counter() - start > args.max_seconds:
                    break
                t0 = time.perf_counter()
                y = call()
                sync()
                times.append((time.perf_counter() - t0) * 1e3)
                del y
        out["workloads"][key] = {"median_ms": statistics.median(times), "min_ms": min(times),
                                 "runs_ms": [round(t, 3) for t in times], "runs": len(times),
                                 "warmup": warmup, "warmup_ms": round(warm_ms, 1)}
        print("peers.py:   %s %.2f ms (median of %d)" % (key, statistics.median(times), len(times)),
              file=sys.stderr)
    if device.type == "cuda":
        out["peak_device_mib"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    json.dump(out, sys.stdout)


def bench_gpu(args):
    """--device cuda: PyTorch eager FP32 and torch.compile on that device, one subprocess
    each; "best" is, per workload, the faster of the two (named)."""
    settings = []
    for name, compiled in (("eager FP32", False), ("torch.compile", True)):
        if compiled and args.no_torch_compile:
            continue
        settings.append(run_setting(args, "%s, %s" % (name, args.device), {}, torch_compile=compiled))
    keys = [w["key"] for w in load_workloads()]
    best = {}
    for key in keys:
        cands = [(s["workloads"][key]["median_ms"], s["name"]) for s in settings
                 if "median_ms" in s.get("workloads", {}).get(key, {})]
        if cands:
            ms, name = min(cands)
            best[key] = {"median_ms": ms, "setting": name}
    return {"engine": "pytorch", "torch_version": torch.__version__, "device": args.device,
            "runs": args.runs, "warmup": args.warmup, "settings": settings, "best": best,
            "ids": "torch.Generator seeded, uniform in [1, vocab): same shapes as kiln's, not the same ids"}


def run_setting(args, name, env_changes, bf16=False, torch_compile=False):
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OMP_WAIT_POLICY", None)
    env["OPENBLAS_NUM_THREADS"] = str(args.threads)
    env["OMP_NUM_THREADS"] = str(args.threads)
    env.update(env_changes)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--weights", args.weights,
           "--threads", str(args.threads), "--runs", str(args.runs), "--warmup", str(args.warmup),
           "--slow-gflops", str(args.slow_gflops), "--max-seconds", str(args.max_seconds)]
    if args.no_generation:
        cmd.append("--no-generation")
    if args.generation_only:
        cmd.append("--generation-only")
    if bf16:
        cmd.append("--bf16")
    if args.device != "cpu":
        cmd += ["--device", args.device]
    if torch_compile:
        cmd.append("--torch-compile")
    print("peers.py: PyTorch with %s" % name, file=sys.stderr)
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        return {"name": name, "env": env_changes, "error": "worker exited with %d" % p.returncode}
    res = json.loads(p.stdout)
    if res.get("error"):
        print("peers.py: %s: %s" % (name, res["error"]), file=sys.stderr)
    res["name"] = name
    res["env"] = env_changes
    res["bf16_autocast"] = bf16
    return res


def bench(args, onnx_result):
    """Runs every BLAS setting, or with --only-settings-from FILE (an earlier pytorch.json)
    only the settings that were best there (bench/run.sh's later rounds)."""
    only = None
    if args.only_settings_from:
        with open(args.only_settings_from) as f:
            doc = json.load(f)
            only = {b["setting"] for key in ("best", "best_generation", "best_bf16", "best_generation_bf16")
                    for b in doc.get(key, {}).values()}

    def run(name, env, bf16=False):
        if only is None or name in only:
            settings.append(run_setting(args, name, env, bf16))

    settings = []
    run("system libblas.so.3", {})
    system_is_openblas = bool(settings and settings[0].get("is_openblas"))
    skylakex = "system libblas.so.3, OPENBLAS_CORETYPE=SkylakeX"
    if not args.openblas_dir and (system_is_openblas or (only and skylakex in only)):
        run(skylakex, {"OPENBLAS_CORETYPE": "SkylakeX"})
    if args.openblas_dir:
        ld = args.openblas_dir + (":" + os.environ["LD_LIBRARY_PATH"] if os.environ.get("LD_LIBRARY_PATH") else "")
        # torch's OpenMP threads spin-wait (libgomp's default) between parallel regions,
        # on the cores OpenBLAS's own threads need: OMP_WAIT_POLICY=PASSIVE avoids that.
        for coretype in (None, "SkylakeX"):
            for wait in (None, "PASSIVE"):
                env = {"LD_LIBRARY_PATH": ld}
                if coretype:
                    env["OPENBLAS_CORETYPE"] = coretype
                if wait:
                    env["OMP_WAIT_POLICY"] = wait
                run("OpenBLAS, OPENBLAS_CORETYPE=%s, OMP_WAIT_POLICY=%s" % (coretype or "unset", wait or "unset"),
                    env)
    # bf16 autocast (issue 13): matmuls in bf16 through torch's oneDNN; the f32 rest (and
    # W3's addmv, which autocast leaves in f32) on OpenBLAS where there is one.
    bf16_env = {}
    if args.openblas_dir:
        bf16_env = {"LD_LIBRARY_PATH": ld, "OPENBLAS_CORETYPE": "SkylakeX"}
    for wait in () if args.no_bf16 else (None, "PASSIVE"):
        env = dict(bf16_env)
        if wait:
            env["OMP_WAIT_POLICY"] = wait
        run("bf16 autocast, %s, OMP_WAIT_POLICY=%s" % (
            "OpenBLAS SkylakeX" if args.openblas_dir else "system libblas.so.3", wait or "unset"), env, bf16=True)

    def best_of(section, keys, bf16):
        best = {}
        for key in keys:
            cands = [(s[section][key]["median_ms"], s["name"]) for s in settings
                     if bool(s.get("bf16_autocast")) == bf16 and "median_ms" in s.get(section, {}).get(key, {})]
            if cands:
                ms, name = min(cands)
                best[key] = {"median_ms": ms, "setting": name}
        return best
    keys = [w["key"] for w in load_workloads()]
    gen, _ids = load_generation()
    gen_keys = [w["key"] for w in gen]
    best, best_gen = best_of("workloads", keys, False), best_of("generation", gen_keys, False)
    best_bf16, best_gen_bf16 = best_of("workloads", keys, True), best_of("generation", gen_keys, True)
    return {"engine": "pytorch", "torch_version": torch.__version__, "threads": args.threads,
            "runs": args.runs, "warmup": args.warmup, "settings": settings, "best": best, "best_generation": best_gen,
            "best_bf16": best_bf16, "best_generation_bf16": best_gen_bf16,
            "onnx_export": onnx_result,
            "ids": "torch.Generator seeded, uniform in [1, vocab): same shapes as kiln's, not the same ids"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights-out", help="write (or reuse) the base checkpoint here")
    ap.add_argument("--weights", help="checkpoint to run (default: --weights-out)")
    ap.add_argument("--force", action="store_true", help="regenerate weights/ONNX/reference even if present")
    ap.add_argument("--reference-out", help="write W1 ids and PyTorch's logits here")
    ap.add_argument("--onnx-dir", help="export forward.onnx and encode.onnx here")
    ap.add_argument("--json-out", help="time PyTorch and write the results here")
    ap.add_argument("--openblas-dir", help="directory with OpenBLAS's libblas.so.3 (LD_LIBRARY_PATH)")
    ap.add_argument("--only-settings-from", help="run only the best settings of this earlier --json-out")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    # netlib's reference BLAS probes at 2-4 GFLOP/s here; OpenBLAS at 10-60 even when its
    # core detection fails and the machine is loaded.
    ap.add_argument("--slow-gflops", type=float, default=8.0)
    ap.add_argument("--max-seconds", type=float, default=20.0,
                    help="per workload and setting: stop timing after this long (at least 2 runs)")
    ap.add_argument("--generation-reference-out",
                    help="write W3-shaped ids and PyTorch's greedy and beam ids here (checks the "
                         "incremental decoder against the full model)")
    ap.add_argument("--no-generation", action="store_true", help="time the forward workloads only")
    ap.add_argument("--generation-only", action="store_true", help="time the generation workloads only")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--bf16", action="store_true", help=argparse.SUPPRESS)  # worker: bf16 autocast
    ap.add_argument("--no-bf16", action="store_true", help="skip the bf16 autocast settings")
    ap.add_argument("--device", default="cpu",
                    help="cpu (the BLAS settings above), or cuda: PyTorch eager FP32 and torch.compile "
                         "on the GPU, forward workloads only (bench/run_gpu.sh)")
    ap.add_argument("--torch-compile", action="store_true", help=argparse.SUPPRESS)  # GPU worker
    ap.add_argument("--no-torch-compile", action="store_true",
                    help="--device cuda: PyTorch eager only, without torch.compile")
    args = ap.parse_args()
    args.weights = args.weights or args.weights_out
    if args.worker:
        return gpu_worker(args) if args.device != "cpu" else worker(args)
    if not args.weights:
        ap.error("give --weights-out (or --weights)")
    if args.weights_out and (args.force or not os.path.exists(args.weights_out)):
        write_weights(args.weights_out)
    if args.reference_out and (args.force or not os.path.exists(args.reference_out)):
        write_reference(args.weights, args.reference_out)
    if args.generation_reference_out and (args.force or not os.path.exists(args.generation_reference_out)):
        write_generation_reference(args.weights, args.generation_reference_out)
    onnx_result = None
    if args.onnx_dir:
        status = os.path.join(args.onnx_dir, "onnx_export.json")
        if not args.force and os.path.exists(status):
            with open(status) as f:
                onnx_result = json.load(f)
        if onnx_result is None or any(onnx_result.get(k) and not os.path.exists(onnx_result[k])
                                      for k in ("forward", "encode")):
            onnx_result = export_onnx(args.weights, args.onnx_dir)
            with open(status, "w") as f:
                json.dump(onnx_result, f, indent=1)
        gen_status = os.path.join(args.onnx_dir, "onnx_generation_export.json")
        gen_result = None
        if not args.force and os.path.exists(gen_status):
            with open(gen_status) as f:
                gen_result = json.load(f)
        if gen_result is None or any(gen_result.get(k) and not os.path.exists(gen_result[k])
                                     for k in ("gen_encode", "gen_step")):
            gen_result = export_generation_onnx(args.weights, args.onnx_dir)
            with open(gen_status, "w") as f:
                json.dump(gen_result, f, indent=1)
        onnx_result = dict(onnx_result, generation=gen_result)
    if args.json_out:
        result = bench_gpu(args) if args.device != "cpu" else bench(args, onnx_result)
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=1)
        print("peers.py: wrote %s" % args.json_out, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
