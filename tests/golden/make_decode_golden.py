#!/usr/bin/python3
"""Generate golden files for kiln's generation (greedy and beam search).

Regenerate with:   /usr/bin/python3 tests/golden/make_decode_golden.py

Uses the reference model, configs and safetensors writer/reader of
make_golden.py (imported, not copied) and the committed weights
NAME.weights.safetensors (loaded, not re-initialised). Writes, next to this
script, NAME_decode.safetensors for NAME in {tiny, small}. Deterministic:
single-threaded torch, fixed seeds, fixed JSON key order; a rerun gives
byte-identical files.

Search specification (kiln's C++ runtime implements the same)
-------------------------------------------------------------

* Source: ids [B,S], each sentence padded at the end with pad_id (different
  lengths in one batch). The encoder runs on the padded batch with the key
  padding mask, as in forward().
* Decoding starts from [start_id]. At generation step t = 0, 1, ..., the
  decoder sees y_0..y_t (y_0 = start_id, then the hypothesis's own generated
  tokens), with the causal mask only (generated tokens are never treated as
  padding in the target), with no cache: the full decoder is rerun each step.
  The cross-attention uses the sentence's encoder memory and the source key
  padding mask. The float32 logits at position t are cast to float64 and
  logprobs = log_softmax(logits) is computed in float64.
* min_decoding_length m: for t < m, logprob[end_id] = -inf (set after the
  log_softmax; the other logprobs are not renormalised).
* max_decoding_length L: at most L generated tokens (end token included).
* Scores: cum = sum of the logprobs of the generated tokens (the end token's
  included when it is generated). Normalised score = cum / length **
  length_penalty, where length = number of generated tokens including the end
  token when generated. length_penalty 0 gives the raw cum.
* Greedy: token = argmax of logprobs (lowest id on ties); stop at end_id or
  after L tokens. Returned ids exclude the start and end tokens; score = the
  normalised score.
* Beam search with beam size K and num_hypotheses H <= K:
  alive = [([], 0.0)]. At each step t: the candidates (i, v) for each alive
  beam i (in order) and each vocab id v have score cum_i + logprob_i[v]. Sort
  the candidates by score descending, ties by (i, v) ascending. Walk the
  sorted list: if v == end_id, append to `finished` (tokens without the end,
  normalised score with length t+1); else append to the new alive list; stop
  walking when the new alive list has K entries. If t == L-1 (the last
  allowed step), move all new alive beams to finished (no end token,
  normalised with length L). The sentence is done when len(finished) >= K, or
  after step L-1. Result: finished sorted by normalised score descending
  (stable: earlier-finished first on ties), the first H.
  -inf candidates (the end token before m) sort last, so they are never
  selected unless nothing else exists.
* Each sentence of the batch is searched independently.

Robustness: kiln's float32 logits differ from PyTorch's by ~1e-6, so every
decision the search takes must have a margin > MIN_MARGIN (1e-4): in greedy,
top-1 minus top-2 logprob at every step; in beam search, the gaps between
consecutive candidates of the walked prefix of the sorted list and the gap
to the first candidate not walked (the K-th / K+1-th cut), and the gaps
between consecutive entries of the sorted finished list up to entry H+1.
Also, no token fed to the decoder may be pad_id (so whether an
implementation treats a generated pad_id as padding cannot matter). If a
source batch fails any check, the next seed is tried (reported in the
output). The whole search is also rerun with the float64 model: its ids must
be identical.

end_id choice (per model): greedy decoding of the batch without any end
token (L = 12) is run; end_id is the most frequent argmax token over the
steps t = 1..11 of the three sentences, excluding pad_id, start_id and any
token that is the argmax at step t = 0 for some sentence (so no greedy output
is empty); ties go to the lowest id. Then the cases must exercise the end
token: in greedy_a at least one sentence ends before L and in each beam case
at least one returned hypothesis ends with the end token; otherwise the next
seed is tried.

File layout (NAME_decode.safetensors):
  src                 I64 [B,S]    source ids, padded with pad_id at the end
  X.ids               I64 [B,H,L]  generated ids (no start/end), -1 padding
  X.lengths           I64 [B,H]    number of ids (end token not counted)
  X.scores            F32 [B,H]    normalised scores (float64 computed,
                                   rounded to F32: make_golden.py's writer
                                   has F32/I64 only; the exact float64
                                   values are in metadata "X.scores_f64")
  for X in greedy_a, greedy_b (H = 1), beam_c, beam_d.
  __metadata__ (all strings): config, pad_id, start_id, end_id, src_lengths,
  src_seed, cases, torch_version, and per case X: X.beam_size,
  X.num_hypotheses, X.max_decoding_length, X.min_decoding_length,
  X.length_penalty, X.scores_f64, X.min_margin.
"""

import collections
import hashlib
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_golden as mg  # noqa: E402

MIN_MARGIN = 1e-4
NEG_INF = float("-inf")

SRC_LENGTHS = [7, 4, 10]
SRC_SEED = {"tiny": 9100, "small": 9200}   # first seed tried
MAX_SEED_TRIES = 50
# start_id: the first id above pad_id (tiny: pad 0 -> 1; small: pad 1 -> 2).
END_PROBE_L = 12

# (name, beam_size, num_hypotheses, max_decoding_length, min_decoding_length,
#  length_penalty); beam_size 1 means greedy.
CASES = [
    ("greedy_a", 1, 1, 12, 0, 0.0),
    ("greedy_b", 1, 1, 12, 3, 1.0),
    ("beam_c", 3, 2, 10, 1, 0.6),
    ("beam_d", 4, 4, 8, 0, 0.0),
]


class Rejected(Exception):
    pass


# ----------------------------------------------------------------------------
# Model loading
# ----------------------------------------------------------------------------

def load_model(name):
    sd, meta = mg.read_safetensors(
        os.path.join(HERE, "%s.weights.safetensors" % name))
    cfg = collections.OrderedDict((k, int(meta[k])) for k in mg.CONFIG_KEYS)
    assert dict(cfg) == mg.CONFIGS[name], (name, cfg)
    model = mg.Transformer(cfg)
    model.load_state_dict(sd)
    model.eval()
    return model, cfg


def check_against_committed(name, model):
    """The loaded model reproduces the committed teacher-forced goldens."""
    for tag, _, _, _, _ in mg.BATCHES[name]:
        stem = "%s_%s" % (name, tag)
        inp, _ = mg.read_safetensors(os.path.join(HERE, stem + ".inputs.safetensors"))
        exp, _ = mg.read_safetensors(os.path.join(HERE, stem + ".expected.safetensors"))
        with torch.inference_mode():
            logits = model(inp["src"], inp["tgt"])
        d = (logits - exp["logits"]).abs().max().item()
        assert d <= 1e-5, (stem, d)


# ----------------------------------------------------------------------------
# Reference decoder step (no cache)
# ----------------------------------------------------------------------------

class Stepper:
    """logprobs of the next token for hypotheses of one sentence."""

    def __init__(self, model, src, memory, b):
        self.model = model
        self.src = src[b:b + 1]
        self.memory = memory[b:b + 1]
        self.fed = set()   # every token id fed to the decoder

    def logprobs(self, prefixes, start_id):
        """prefixes: list of generated-token lists, all of length t.
        Returns float64 [n, V] log_softmax of the logits at position t."""
        n = len(prefixes)
        rows = [[start_id] + list(p) for p in prefixes]
        for r in rows:
            self.fed.update(r)
        tgt = torch.tensor(rows, dtype=torch.int64)
        T = tgt.shape[1]
        m = self.model
        x = m._embed(m.tgt_embed, tgt)
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
        causal = causal.unsqueeze(0).unsqueeze(0).expand(n, 1, T, T)
        mem = self.memory.expand(n, -1, -1)
        src_mask = m._src_mask(self.src.expand(n, -1))
        with torch.inference_mode():
            h = m.decoder(x, mem, src_mask, causal)
            logits = m.generator(h[:, T - 1, :])
        return torch.log_softmax(logits.to(torch.float64), dim=-1)


def normalized(cum, length, lp):
    if lp == 0.0:
        return cum
    return cum / (float(length) ** lp)


# ----------------------------------------------------------------------------
# Greedy search
# ----------------------------------------------------------------------------

def greedy(stepper, start_id, end_id, L, m, lp, margins):
    """Returns (ids, score, ended). end_id None: never stops early."""
    toks = []
    cum = 0.0
    for t in range(L):
        lpv = stepper.logprobs([toks], start_id)[0].tolist()
        if end_id is not None and t < m:
            lpv[end_id] = NEG_INF
        # argmax, lowest id on ties
        best = max(range(len(lpv)), key=lambda v: (lpv[v], -v))
        second = max(lpv[v] for v in range(len(lpv)) if v != best)
        margins.append(lpv[best] - second)
        cum += lpv[best]
        if end_id is not None and best == end_id:
            return toks, normalized(cum, t + 1, lp), True
        toks.append(best)
    return toks, normalized(cum, L, lp), False


# ----------------------------------------------------------------------------
# Beam search
# ----------------------------------------------------------------------------

def gap(a, b):
    if a == NEG_INF and b == NEG_INF:
        return 0.0
    return a - b


def beam_search(stepper, start_id, end_id, K, H, L, m, lp, margins):
    """Returns a list of H (ids, score, ended), best first."""
    alive = [([], 0.0)]
    finished = []          # (tokens, normalised score, ended)
    for t in range(L):
        lpm = stepper.logprobs([a[0] for a in alive], start_id)
        if t < m:
            lpm[:, end_id] = NEG_INF
        V = lpm.shape[1]
        cands = []
        for i, (toks, cum) in enumerate(alive):
            row = lpm[i].tolist()
            for v in range(V):
                cands.append((cum + row[v], i, v))
        cands.sort(key=lambda c: (-c[0], c[1], c[2]))
        new_alive = []
        walked = 0
        for score, i, v in cands:
            walked += 1
            if v == end_id:
                finished.append((list(alive[i][0]),
                                 normalized(score, t + 1, lp), True))
            else:
                new_alive.append((alive[i][0] + [v], score))
            if len(new_alive) == K:
                break
        # margins of the walked prefix and of the cut after it
        for j in range(min(walked, len(cands) - 1)):
            margins.append(gap(cands[j][0], cands[j + 1][0]))
        if t == L - 1:
            for toks, cum in new_alive:
                finished.append((toks, normalized(cum, L, lp), False))
            new_alive = []
        alive = new_alive
        if len(finished) >= K or not alive:
            break
    order = sorted(range(len(finished)), key=lambda j: (-finished[j][1], j))
    ranked = [finished[j] for j in order]
    for j in range(min(H, len(ranked) - 1)):
        margins.append(gap(ranked[j][1], ranked[j + 1][1]))
    return ranked[:H]


# ----------------------------------------------------------------------------
# One model
# ----------------------------------------------------------------------------

def make_src(seed, cfg):
    g = torch.Generator().manual_seed(seed)
    B, S = len(SRC_LENGTHS), max(SRC_LENGTHS)
    src = torch.randint(3, cfg["src_vocab"], (B, S), generator=g,
                        dtype=torch.int64)
    assert (src != cfg["pad_id"]).all()
    for b, l in enumerate(SRC_LENGTHS):
        src[b, l:] = cfg["pad_id"]
    return src


def choose_end_id(model, src, memory, start_id, pad_id):
    counts = collections.Counter()
    first = set()
    seqs = []
    for b in range(src.shape[0]):
        st = Stepper(model, src, memory, b)
        toks, _, _ = greedy(st, start_id, None, END_PROBE_L, 0, 0.0, [])
        seqs.append(toks)
        first.add(toks[0])
        counts.update(toks[1:])
    excluded = first | {pad_id, start_id}
    best = sorted(((-c, v) for v, c in counts.items() if v not in excluded))
    if not best:
        raise Rejected("no end_id candidate")
    return best[0][1], seqs


def run_cases(model, src, memory, start_id, end_id, pad_id):
    """Returns {case: (list over b of list of (ids, score, ended)), margin}."""
    out = collections.OrderedDict()
    for name, K, H, L, m, lp in CASES:
        margins = []
        per_sent = []
        for b in range(src.shape[0]):
            st = Stepper(model, src, memory, b)
            if K == 1:
                per_sent.append([greedy(st, start_id, end_id, L, m, lp, margins)])
            else:
                per_sent.append(beam_search(st, start_id, end_id, K, H, L, m,
                                            lp, margins))
            if pad_id in st.fed:
                raise Rejected("%s: pad_id %d fed to the decoder (sentence %d)"
                               % (name, pad_id, b))
        out[name] = (per_sent, min(margins))
    return out


def search_all(name, model, model64, cfg):
    pad_id = cfg["pad_id"]
    start_id = pad_id + 1
    seed = SRC_SEED[name]
    for _ in range(MAX_SEED_TRIES):
        src = make_src(seed, cfg)
        try:
            with torch.inference_mode():
                memory = model.encode(src)
                memory64 = model64.encode(src)
            end_id, probe = choose_end_id(model, src, memory, start_id, pad_id)
            res = run_cases(model, src, memory, start_id, end_id, pad_id)
            for case, (per_sent, mm) in res.items():
                if mm <= MIN_MARGIN:
                    raise Rejected("%s: smallest margin %.3g <= %g"
                                   % (case, mm, MIN_MARGIN))
            ga = res["greedy_a"][0]
            if not any(h[2] for hyps in ga for h in hyps):
                raise Rejected("greedy_a: no sentence ends before L")
            for case in ("beam_c", "beam_d"):
                if not any(h[2] for hyps in res[case][0] for h in hyps):
                    raise Rejected("%s: no hypothesis ends with end_id" % case)
            res64 = run_cases(model64, src, memory64, start_id, end_id, pad_id)
            maxd = 0.0
            for case in res:
                a, b = res[case][0], res64[case][0]
                for ha, hb in zip(a, b):
                    if [(h[0], h[2]) for h in ha] != [(h[0], h[2]) for h in hb]:
                        raise Rejected("%s: float64 model gives other ids" % case)
                    for x, y in zip(ha, hb):
                        maxd = max(maxd, abs(x[1] - y[1]))
            return seed, src, start_id, end_id, probe, res, maxd
        except Rejected as e:
            print("  %s: seed %d rejected (%s); trying seed %d"
                  % (name, seed, e, seed + 1))
            seed += 1
    raise SystemExit("%s: no acceptable seed in %d tries" % (name, MAX_SEED_TRIES))


def fmt17(x):
    return repr(float(x))


def build_file(name, cfg, seed, src, start_id, end_id, res):
    B = src.shape[0]
    tensors = [("src", src)]
    meta = collections.OrderedDict([
        ("config", name),
        ("pad_id", str(cfg["pad_id"])),
        ("start_id", str(start_id)),
        ("end_id", str(end_id)),
        ("src_lengths", ",".join(map(str, SRC_LENGTHS))),
        ("src_seed", str(seed)),
        ("cases", ",".join(c[0] for c in CASES)),
        ("torch_version", torch.__version__),
    ])
    for case, K, H, L, m, lp in CASES:
        per_sent, mm = res[case]
        ids = torch.full((B, H, L), -1, dtype=torch.int64)
        lengths = torch.zeros((B, H), dtype=torch.int64)
        scores64 = []
        for b in range(B):
            assert len(per_sent[b]) == H, (case, b)
            for h, (toks, score, ended) in enumerate(per_sent[b]):
                assert len(toks) <= L and (ended or len(toks) == L)
                if toks:
                    ids[b, h, :len(toks)] = torch.tensor(toks, dtype=torch.int64)
                lengths[b, h] = len(toks)
                scores64.append(score)
        scores = torch.tensor(scores64, dtype=torch.float64).reshape(B, H)
        tensors += [(case + ".ids", ids), (case + ".lengths", lengths),
                    (case + ".scores", scores.to(torch.float32))]
        meta[case + ".beam_size"] = str(K)
        meta[case + ".num_hypotheses"] = str(H)
        meta[case + ".max_decoding_length"] = str(L)
        meta[case + ".min_decoding_length"] = str(m)
        meta[case + ".length_penalty"] = fmt17(lp)
        meta[case + ".scores_f64"] = ",".join(fmt17(s) for s in scores64)
        meta[case + ".min_margin"] = "%.6g" % mm
    return tensors, meta


def main():
    torch.set_default_dtype(torch.float32)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    for name in mg.CONFIGS:
        model, cfg = load_model(name)
        check_against_committed(name, model)
        model64 = mg.Transformer(cfg)
        model64.load_state_dict(model.state_dict())
        model64 = model64.double().eval()

        seed, src, start_id, end_id, probe, res, maxd = search_all(
            name, model, model64, cfg)
        print("%s: pad_id %d start_id %d end_id %d src seed %d "
              "(float64 model: same ids, max |score diff| %.3g)"
              % (name, cfg["pad_id"], start_id, end_id, seed, maxd))
        for b, toks in enumerate(probe):
            print("  probe greedy (no end) sentence %d: %s" % (b, toks))
        for case, K, H, L, m, lp in CASES:
            per_sent, mm = res[case]
            print("  %-8s K=%d H=%d L=%2d m=%d lp=%g  smallest margin %.4g"
                  % (case, K, H, L, m, lp, mm))
            for b, hyps in enumerate(per_sent):
                for h, (toks, score, ended) in enumerate(hyps):
                    print("    b=%d h=%d score %+.6f %s %s"
                          % (b, h, score, "end" if ended else "max", toks))

        tensors, meta = build_file(name, cfg, seed, src, start_id, end_id, res)
        path = os.path.join(HERE, "%s_decode.safetensors" % name)
        mg.write_and_check(path, tensors, meta)
        with open(path, "rb") as f:
            data = f.read()
        print("  %s %d bytes sha256 %s"
              % (os.path.basename(path), len(data),
                 hashlib.sha256(data).hexdigest()[:16]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
