#!/usr/bin/python3
"""The table of bench/run.sh's results (python3 standard library only).

  bench/report.py RESULTS_DIR    # round*/{kiln,pytorch,ort,peak-*}.json, gemm.json,
                                 # machine.log, status.log (bench/run.sh writes them)
  bench/report.py --gpu RESULTS_DIR  # bench/run_gpu.sh's: kiln's CUDA build vs PyTorch eager
                                     # and torch.compile on the GPU (round*/{kiln,pytorch}.json)
Prints Markdown: per workload kiln / PyTorch / ONNX Runtime ms, ratios (peer ms / kiln
ms: above 1 = kiln is faster; each engine's best round), kiln's GFLOP/s and its share of
the highest FMA peak measured in the run, the issue's acceptance checks (met or MISSED),
every round's figures with the peak measured next to each engine, correctness against
PyTorch, every PyTorch BLAS setting, and kiln's GEMM kernel against oneDNN. bf16 (issue 13):
kiln's bf16 build beside its f32 one on W1, W2, W4 (and W3, W5), PyTorch under bf16
autocast, W1 against its memory-bandwidth floor in f32 and bf16, kiln's bf16 linear kernel
against oneDNN's bf16 matmul, and those acceptance checks. int8 (issue 27): kiln's int8 build
beside f32 and bf16 on W1–W5, every build's distance to its compute floor, peak RSS per build,
kiln's int8 linear kernel against oneDNN's int8 matmul, those acceptance checks, and a plot of
W3/W5 tokens/s per engine and dtype (bench/tokens_per_s.svg; python3-matplotlib, optional).
"""

import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def gbench_entries(doc):
    """{run_name: entry} preferring the median aggregate; errors kept."""
    out = {}
    if not doc:
        return out
    for b in doc.get("benchmarks", []):
        rn = b.get("run_name", b["name"])
        if b.get("error_occurred"):
            out.setdefault(rn, b)
        elif b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                out[rn] = b
        elif rn not in out or out[rn].get("error_occurred"):
            out[rn] = b
    return out


def gbench_repetitions(doc, prefix):
    """Every repetition of a benchmark (not the aggregates), errors left out."""
    for b in (doc or {}).get("benchmarks", []):
        rn = b.get("run_name", b["name"])
        if (rn == prefix or rn.startswith(prefix + "/")) and b.get("run_type") == "iteration" \
                and not b.get("error_occurred"):
            yield b


def gbench_min_ms(doc, prefix):
    """The fastest single repetition of a benchmark (its JSON has every repetition)."""
    return best_of(to_ms(b) for b in gbench_repetitions(doc, prefix))


def gbench_values(doc, prefix, counter):
    """`counter` of every repetition of a benchmark."""
    return [b[counter] for b in gbench_repetitions(doc, prefix) if b.get(counter) is not None]


def median(values):
    v = sorted(values)
    if not v:
        return None
    h = len(v) // 2
    return v[h] if len(v) % 2 else (v[h - 1] + v[h]) / 2


def find(entries, prefix):
    for rn, e in entries.items():
        if rn == prefix or rn.startswith(prefix + "/"):
            return e
    return None


def to_ms(e):
    unit = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[e.get("time_unit", "ns")]
    return e["real_time"] * unit


def fmt(x, nd=1):
    return "—" if x is None else ("%.*f" % (nd, x))


def safetensors_metadata(path):
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            return json.loads(f.read(n)).get("__metadata__", {})
    except (OSError, ValueError, struct.error):
        return {}


def peak_of(entries):
    e = find(entries, "peak")
    return e.get("GFLOP/s") if e and not e.get("error_occurred") else None


def load_round(d):
    kiln_doc = load(os.path.join(d, "kiln.json"))
    kiln = gbench_entries(kiln_doc)
    return {
        "dir": d,
        "kiln": kiln,
        "kiln_doc": kiln_doc,
        "pt": load(os.path.join(d, "pytorch.json")) or {},
        "ort": load(os.path.join(d, "ort.json")) or {},
        "kiln_memory": load(os.path.join(d, "kiln-memory.json")) or {},
        "peak_kiln": peak_of(kiln) or peak_of(gbench_entries(load(os.path.join(d, "peak-kiln.json")))),
        "peak_pt": peak_of(gbench_entries(load(os.path.join(d, "peak-pytorch.json")))),
        "peak_ort": peak_of(gbench_entries(load(os.path.join(d, "peak-ort.json")))),
    }


def round_times(rd, w, notes):
    """(kiln ms, kiln GFLOP, PyTorch best ms, its setting, ORT ms) of one round."""
    key = w["key"]
    e = find(rd["kiln"], w["kiln_name"])
    k_ms = gflop = None
    tag = os.path.basename(rd["dir"])
    if e is None:
        if rd["kiln"]:
            notes.append("%s kiln %s: no result" % (tag, key))
    elif e.get("error_occurred"):
        notes.append("%s kiln %s: skipped: %s" % (tag, key, e.get("error_message")))
    else:
        k_ms, gflop = to_ms(e), e.get("GFLOP")
    pb = (rd["pt"].get("best") or {}).get(key)
    ow = (rd["ort"].get("workloads") or {}).get(key, {})
    if ow and not ow.get("median_ms"):
        notes.append("%s ORT %s: %s" % (tag, key, ow.get("skipped") or ow.get("error")))
    # Fastest single run: kiln's best repetition, PyTorch's best run in any setting, ORT's.
    k_min = gbench_min_ms(rd.get("kiln_doc"), w["kiln_name"]) if k_ms else None
    p_min = best_of(s["workloads"][key].get("min_ms") for s in rd["pt"].get("settings", [])
                    if key in s.get("workloads", {}) and not s.get("bf16_autocast"))
    return (k_ms, gflop, pb["median_ms"] if pb else None, pb["setting"] if pb else None, ow.get("median_ms"),
            k_min, p_min, ow.get("min_ms"))


def best_of(values):
    values = [v for v in values if v is not None]
    return min(values) if values else None


def setup_and_memory(p, rd, compiled):
    """The table of load time and resident memory per engine (round `rd`)."""
    km = rd["kiln_memory"]
    pt = rd["pt"]
    ort = rd["ort"]
    # PyTorch: the process of the setting that was fastest on W2 (else the first that ran).
    best_w2 = (pt.get("best") or {}).get("W2", {}).get("setting")
    settings = [x for x in pt.get("settings", []) if not x.get("error") and not x.get("bf16_autocast")]
    ps = next((x for x in settings if x.get("name") == best_w2), settings[0] if settings else {})
    sessions = ort.get("sessions") or {}
    ort_load = sum(x.get("create_ms", 0) for x in sessions.values()) if sessions else None
    if not (km or ps or ort):
        return
    k_peak = km.get("peak_rss_mib")

    def vs_kiln(peak):
        return fmt(peak / k_peak, 2) + "×" if peak and k_peak else "—"

    p("### Setup and memory (round 1)")
    p("")
    p("| engine | ahead of time | load ms | RSS after load MiB | peak RSS MiB | peak RSS / kiln's |")
    p("|---|---|---:|---:|---:|---:|")
    aot = ("`kiln compile` %s s, library %s KiB" % (fmt(compiled.get("seconds"), 1),
                                                    fmt(compiled["library_bytes"] / 1024.0, 0))
           if compiled.get("seconds") is not None else "`kiln compile` (not timed in this run)")
    p("| kiln | %s | %s | %s | %s | %s |" % (aot, fmt(km.get("load_ms"), 0), fmt(km.get("rss_after_load_mib"), 0),
                                            fmt(k_peak, 0), vs_kiln(k_peak)))
    kb = load(os.path.join(rd["dir"], "kiln-memory-bf16.json")) or {}
    if kb.get("bf16_load_ms") is not None:
        p("| kiln, bf16 weights (converted from the f32 checkpoint at load) | `kiln compile --weights bf16` "
          "(not timed) | %s | %s | %s | %s |" % (fmt(kb.get("bf16_load_ms"), 0), fmt(kb.get("bf16_rss_after_load_mib"), 0),
                                                fmt(kb.get("peak_rss_mib"), 0), vs_kiln(kb.get("peak_rss_mib"))))
    ki = load(os.path.join(rd["dir"], "kiln-memory-int8.json")) or {}
    if ki.get("int8_load_ms") is not None:
        p("| kiln, int8 weights (quantized from the f32 checkpoint at load) | `kiln compile --weights int8` "
          "(not timed) | %s | %s | %s | %s |" % (fmt(ki.get("int8_load_ms"), 0), fmt(ki.get("int8_rss_after_load_mib"), 0),
                                                fmt(ki.get("peak_rss_mib"), 0), vs_kiln(ki.get("peak_rss_mib"))))
    if ps:
        p("| PyTorch (%s) | none (eager) | %s | %s | %s | %s |" % (
            ps.get("name", "?"), fmt(ps.get("load_ms"), 0), fmt(ps.get("rss_after_load_mib"), 0),
            fmt(ps.get("peak_rss_mib"), 0), vs_kiln(ps.get("peak_rss_mib"))))
    if ort:
        p("| ONNX Runtime | ONNX export (once, cached, not timed) | %s | %s | %s | %s |" % (
            fmt(ort_load, 0), fmt(ort.get("rss_after_load_mib"), 0), fmt(ort.get("peak_rss_mib"), 0),
            vs_kiln(ort.get("peak_rss_mib"))))
    p("")
    p("load: kiln, the generated class's constructor (read and check the safetensors, lay out "
      "the weights, allocate the arena); PyTorch, building the module and `load_state_dict`; "
      "ORT, `InferenceSession.create` of forward.onnx and encode.onnx (graph optimizations "
      "included; each session holds its own copy of the weights). Peak RSS: the whole "
      "process over the load and W1, W2, W4 (each engine also holds W2's 262 MB of logits).")
    p("")


# The bytes of weights one decoder step reads (base config, f32; generate_bench.cpp has the
# same formula): per decoder layer self-attention q, k, v, o and cross-attention q, o
# (weights and biases), the FFN, three LayerNorms; the final LayerNorm; the generator; one
# embedding row.
D_MODEL, D_FF, VOCAB, DEC_LAYERS = 512, 2048, 32000, 6
STEP_WEIGHT_BYTES = 4 * (DEC_LAYERS * (6 * (D_MODEL * D_MODEL + D_MODEL) + (D_MODEL * D_FF + D_FF)
                                       + (D_FF * D_MODEL + D_MODEL) + 3 * 2 * D_MODEL)
                         + 2 * D_MODEL + D_MODEL * VOCAB + VOCAB + D_MODEL)


# The same with bf16 linear weights (2 bytes; biases, norms, the embedding row stay f32).
STEP_LINEAR_WEIGHTS = DEC_LAYERS * (6 * D_MODEL * D_MODEL + 2 * D_MODEL * D_FF) + D_MODEL * VOCAB
STEP_WEIGHT_BYTES_BF16 = STEP_WEIGHT_BYTES - 2 * STEP_LINEAR_WEIGHTS
# With int8 linear weights: 1 byte each plus 8 per output row (its f32 scale and i32 row sum).
STEP_LINEAR_ROWS = DEC_LAYERS * (6 * D_MODEL + D_FF + D_MODEL) + VOCAB
STEP_WEIGHT_BYTES_INT8 = STEP_WEIGHT_BYTES - 3 * STEP_LINEAR_WEIGHTS + 8 * STEP_LINEAR_ROWS
ENC_LAYERS = 6


def forward_weight_bytes(batch, src_len, tgt_len, linear_bytes, per_row=0):
    """The bytes of weights a forward call reads at least once (model_bench.cpp has the same
    formula): every linear's weight (`linear_bytes` per element, plus `per_row` bytes per output
    row: 8 for int8's scale and row sum) and bias, every LayerNorm, the generator, one embedding
    row per token; f32 but the linear weights."""
    d, ff = D_MODEL, D_FF
    weights = ENC_LAYERS * (4 * d * d + 2 * d * ff) + DEC_LAYERS * (8 * d * d + 2 * d * ff) + VOCAB * d
    rows = ENC_LAYERS * (4 * d + ff + d) + DEC_LAYERS * (8 * d + ff + d) + VOCAB
    f32s = ENC_LAYERS * (4 * d + ff + d + 4 * d) + DEC_LAYERS * (8 * d + ff + d + 6 * d) + 4 * d + VOCAB \
        + (batch * src_len + batch * tgt_len) * d
    return linear_bytes * weights + per_row * rows + 4 * f32s


def bandwidth_of(entries):
    e = find(entries, "bandwidth")
    return e.get("GB/s") if e and not e.get("error_occurred") else None


def load_generation_round(d):
    doc = load(os.path.join(d, "kiln-gen.json"))
    entries = gbench_entries(doc)
    bw = {"kiln": bandwidth_of(entries)}
    for eng, name in (("pt", "peak-pytorch.json"), ("ort", "peak-ort.json")):
        bw[eng] = bandwidth_of(gbench_entries(load(os.path.join(d, name))))
    bw_all = [b["GB/s"] for b in gbench_repetitions(doc, "bandwidth") if b.get("GB/s")]
    return {"entries": entries, "doc": doc, "bw": bw, "bw_reps": bw_all, "peak": peak_of(entries)}


def parse_profile(path, top=8):
    """{workload: {"call_ms", "entry": {name: (runs, ms per run)}, "kernels": [(name, calls,
    total ms, ms per call, share)]}} from generate_bench's KILN_BENCH_PROFILE_OUT text."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return {}
    out, cur = {}, None
    for line in text.splitlines():
        if line.startswith("== "):
            name = line[3:].split(":")[0]
            cur = out.setdefault(name, {"entry": {}, "kernels": [], "call_ms": None})
            try:
                cur["call_ms"] = float(line.split(" ms per call")[0].split()[-1])
            except ValueError:
                pass
        elif cur is not None and line.startswith("kiln profile: '"):
            name = line.split("'")[1]
            try:
                runs = int(line.split(" ran ")[1].split()[0])
                ms = float(line.split(", ")[-1].split()[0])
                cur["entry"][name] = (runs, ms)
            except (IndexError, ValueError):
                pass
        elif cur is not None and line and not line.startswith("kernel") and len(line.split()) == 5:
            k = line.split()
            try:
                cur["kernels"].append((k[0], int(k[1]), float(k[2]), float(k[3]), k[4]))
            except ValueError:
                pass
    return out


def run_bandwidth(rounds):
    """The highest memory read bandwidth measured anywhere in the run (GB/s): model_bench's and
    generate_bench's `bandwidth` repetitions and peak_bench's probes before the peers."""
    bws = []
    for rd in rounds:
        for name in ("kiln.json", "kiln-gen.json", "peak-pytorch.json", "peak-ort.json", "peak-kiln.json"):
            doc = load(os.path.join(rd["dir"], name))
            bws += [b["GB/s"] for b in gbench_repetitions(doc, "bandwidth") if b.get("GB/s")]
            e = bandwidth_of(gbench_entries(doc))
            if e:
                bws.append(e)
    return max(bws) if bws else None


def bf16_section(p, rounds, workloads, per_round, rows, res):
    """kiln's bf16 build beside the f32 one (model_bench bf16/...), PyTorch under bf16 autocast,
    W1 against its bandwidth floor, and issue 13's acceptance checks 2 and 3."""
    kb, ki = {}, {}  # key -> [(median ms, fastest repetition ms, floor_weight_MB) per round]: bf16, int8
    for w in workloads:
        for prefix, into in (("bf16/", kb), ("int8/", ki)):
            name = prefix + w["kiln_name"]
            into[w["key"]] = []
            for rd in rounds:
                e = find(rd["kiln"], name)
                ok = e is not None and not e.get("error_occurred")
                into[w["key"]].append((to_ms(e) if ok else None,
                                       gbench_min_ms(rd.get("kiln_doc"), name) if ok else None,
                                       e.get("floor_weight_MB") if ok else None))
    pb = {w["key"]: [((rd["pt"].get("best_bf16") or {}).get(w["key"]) or {}) for rd in rounds] for w in workloads}
    have = any(t[0] for v in kb.values() for t in v) or any(x for v in pb.values() for x in v)
    errors = sorted({"%s: %s" % (os.path.basename(rd["dir"]), e.get("error_message"))
                     for rd in rounds for rn, e in rd["kiln"].items()
                     if rn.startswith("bf16/") and e.get("error_occurred")})
    p("### bf16 weights (issue 13): kiln's bf16 build beside its f32 one")
    p("")
    if not have:
        p("No bf16 numbers in this run (model_bench built without bf16 rows: no AVX512-BF16 on the build "
          "host, or KILN_BENCH_BF16=0)%s." % ("; " + "; ".join(errors) if errors else ""))
        p("")
    else:
        p("| workload | kiln f32 ms | kiln bf16 ms | kiln f32 / bf16 | PyTorch bf16 autocast ms | PyTorch bf16 / kiln bf16 "
          "| kiln bf16 GFLOP/s | kiln f32 min / bf16 min |")
        p("|---|---:|---:|---:|---:|---:|---:|---:|")
        ratios = {}
        for w in workloads:
            key = w["key"]
            f = rows[key]["k_ms"]
            b = best_of(t[0] for t in kb[key])
            fmin = best_of(t[5] for t in per_round[key])
            bmin = best_of(t[1] for t in kb[key])
            pt = best_of(x.get("median_ms") for x in pb[key])
            gflop = next((t[1] for t in per_round[key] if t[1]), None)
            ratios[key] = f / b if f and b else None
            p("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                key, fmt(f), fmt(b), fmt(ratios[key], 2) + "×" if ratios[key] else "—", fmt(pt),
                fmt(pt / b, 2) + "×" if pt and b else "—", fmt(gflop / (b / 1e3) if gflop and b else None),
                fmt(fmin / bmin, 2) + "×" if fmin and bmin else "—"))
        p("")
        p("kiln f32 / bf16: kiln's f32 median over its bf16 median, each the best round (both models run in "
          "one model_bench process, their repetitions interleaved). PyTorch bf16: torch.autocast('cpu', "
          "bfloat16), its best setting per workload (%s)." % (", ".join(sorted({
              x["setting"] for v in pb.values() for x in v if x.get("setting")})) or "not run"))
        p("")
        p("| round | " + " | ".join("%s kiln f32 / bf16 (ratio)" % w["key"] for w in workloads) + " | PyTorch bf16 "
          + " / ".join(w["key"] for w in workloads) + " |")
        p("|---|" + "---|" * (len(workloads) + 1))
        for i, rd in enumerate(rounds):
            cells = []
            for w in workloads:
                f, b = per_round[w["key"]][i][0], kb[w["key"]][i][0]
                cells.append("%s / %s (%s)" % (fmt(f), fmt(b), fmt(f / b, 2) + "×" if f and b else "—"))
            p("| %s | %s | %s |" % (os.path.basename(rd["dir"]), " | ".join(cells), " / ".join(
                fmt(pb[w["key"]][i].get("median_ms")) for w in workloads)))
        p("")
        for e in errors:
            p("- kiln bf16 skipped: %s" % e)
        if errors:
            p("")

    # W1's floor (acceptance point 3).
    bw = run_bandwidth(rounds)
    w1 = next((w for w in workloads if w["key"] == "W1"), None)
    floor = {}
    if w1:
        p("### W1 against its memory-bandwidth floor (issue 13)")
        p("")
        p("| weights | bytes read per call MB | floor ms | kiln W1 ms | kiln / floor | fastest repetition ms | "
          "fastest / floor | kiln / floor at kiln's own bandwidth, per round |")
        p("|---|---:|---:|---:|---:|---:|---:|---|")
        for tag, lb, k_ms, k_min, own_ms in (
                ("f32", 4, rows["W1"]["k_ms"], best_of(t[5] for t in per_round["W1"]),
                 [t[0] for t in per_round["W1"]]),
                ("bf16", 2, best_of(t[0] for t in kb["W1"]), best_of(t[1] for t in kb["W1"]),
                 [t[0] for t in kb["W1"]]),
                ("int8", 1, best_of(t[0] for t in ki["W1"]), best_of(t[1] for t in ki["W1"]),
                 [t[0] for t in ki["W1"]])):
            if tag == "int8" and not k_ms:
                continue
            mb = forward_weight_bytes(w1["batch"], w1["src_len"], w1["tgt_len"], lb, 8 if tag == "int8" else 0) / 1e6
            fl = mb * 1e6 / (bw * 1e9) * 1e3 if bw else None
            floor[tag] = k_ms / fl if k_ms and fl else None
            own = []
            for i, rd in enumerate(rounds):
                b = bandwidth_of(rd["kiln"])
                own.append("%s %s" % (os.path.basename(rd["dir"]), fmt(own_ms[i] / (mb * 1e6 / (b * 1e9) * 1e3), 2)
                                      + "×" if own_ms[i] and b else "—"))
            p("| %s | %.2f | %s | %s | %s | %s | %s | %s |" % (
                tag, mb, fmt(fl), fmt(k_ms), fmt(floor[tag], 2) + "×" if floor[tag] else "—", fmt(k_min),
                fmt(k_min / fl, 2) + "×" if k_min and fl else "—", ", ".join(own)))
        p("")
        p("W1 (forward, batch 1, 32 + 32 tokens) reads every weight once per call: every linear's weight "
          "and bias (linear weights 4 bytes in f32, 2 in bf16, 1 in int8 plus 8 per output row), the LayerNorms, the generator 512×32000, "
          "and one embedding row per token (not the whole tables). Floor = those bytes over the highest "
          "memory read bandwidth measured in the run, %s GB/s (`bandwidth`: 2 threads streaming 512 MiB, "
          "in model_bench between the workloads' repetitions, in generate_bench, and before each peer). "
          "The last column divides by the bandwidth model_bench measured in the same round (median of "
          "its repetitions), under the same load." % fmt(bw))
        p("")

    def check(cond, text):
        if cond is None:
            return "- n/a: %s (missing numbers)" % text
        return "- %s: %s" % ("met" if cond else "MISSED", text)

    p("### Acceptance (issue 13, points 2 and 3; on the medians above)")
    r2 = (rows["W2"]["k_ms"] / best_of(t[0] for t in kb["W2"])) if rows["W2"]["k_ms"] and \
        best_of(t[0] for t in kb["W2"]) else None
    p(check(None if r2 is None else r2 >= 1.7, "bf16 W2 at least 1.7× kiln's FP32 W2 (%s×)" % fmt(r2, 2)))
    if w1:
        p(check(None if floor.get("f32") is None else floor["f32"] <= 1.3,
                "W1 in FP32 within 1.3× of its floor (%s×)" % fmt(floor.get("f32"), 2)))
        p(check(None if floor.get("bf16") is None else floor["bf16"] <= 1.3,
                "W1 in bf16 within 1.3× of the bf16 floor (%s×)" % fmt(floor.get("bf16"), 2)))
    p("- the GEMM check (bf16 linear at >= 95% of oneDNN's bf16 matmul): under \"GEMM, bf16\" below")
    p("")


def generation_bf16(p, gen, rounds, grounds, per_round, bw):
    """W3/W5 with kiln's bf16 build (generate_bench bf16/...) and PyTorch under bf16 autocast."""
    kb = {w["key"]: [to_ms(e) if e and not e.get("error_occurred") else None
                     for e in (find(g["entries"], "bf16/" + w["kiln_name"]) for g in grounds)] for w in gen}
    pb = {w["key"]: [((rd["pt"].get("best_generation_bf16") or {}).get(w["key"]) or {}) for rd in rounds]
          for w in gen}
    if not any(v for w in gen for v in kb[w["key"]]) and not any(x for w in gen for x in pb[w["key"]]):
        return
    p("#### Generation with bf16 weights (issue 13)")
    p("")
    p("| workload | kiln f32 ms | kiln bf16 ms | kiln f32 / bf16 | PyTorch bf16 autocast ms | PyTorch bf16 / kiln bf16 "
      "| kiln bf16 tok/s |")
    p("|---|---:|---:|---:|---:|---:|---:|")
    for w in gen:
        key = w["key"]
        f = best_of(t["k"] for t in per_round[key])
        b = best_of(kb[key])
        pt = best_of(x.get("median_ms") for x in pb[key])
        n = w["batch"] * w["new_tokens"]
        p("| %s | %s | %s | %s | %s | %s | %s |" % (
            key, fmt(f), fmt(b), fmt(f / b, 2) + "×" if f and b else "—", fmt(pt),
            fmt(pt / b, 2) + "×" if pt and b else "—", fmt(n / (b / 1e3) if b else None)))
    p("")
    w3 = next((w for w in gen if w["key"] == "W3"), None)
    if w3 and bw:
        floor_ms = STEP_WEIGHT_BYTES_BF16 * w3["new_tokens"] / (bw * 1e9) * 1e3
        b = best_of(kb["W3"])
        p("W3 bf16's floor: %.2f MB of weights per step (linear weights in bf16, the rest f32) × %d steps over "
          "%s GB/s = %s ms; kiln's bf16 W3 %s ms = %s× that floor (informational; no acceptance line)." % (
              STEP_WEIGHT_BYTES_BF16 / 1e6, w3["new_tokens"], fmt(bw), fmt(floor_ms), fmt(b),
              fmt(b / floor_ms if b else None, 2)))
    p("Every round, kiln f32 / bf16 (same process, interleaved): " + "; ".join(
        "%s %s" % (os.path.basename(rd["dir"]), ", ".join(
            "%s %s / %s" % (w["key"], fmt(per_round[w["key"]][i]["k"]), fmt(kb[w["key"]][i])) for w in gen))
        for i, rd in enumerate(rounds)) + ".")
    settings = [x.get("setting") for w in gen for x in pb[w["key"]] if x.get("setting")]
    if settings:
        p("PyTorch bf16 best: %s." % ", ".join(sorted(set(settings))))
    ce = find(grounds[0]["entries"], "bf16/check_generate_vs_pytorch")
    if ce and not ce.get("error_occurred"):
        p("kiln bf16 vs PyTorch f32 on the same source ids (bf16 rounding may flip a near-tie; informational): "
          "greedy %d/%d ids equal (%d leading), beam 4 %d/%d (%d leading)." % (
              ce.get("greedy_same_ids", 0), ce.get("greedy_of", 0), ce.get("greedy_same_prefix", 0),
              ce.get("beam4_same_ids", 0), ce.get("beam4_of", 0), ce.get("beam4_same_prefix", 0)))
    p("")


def generation_section(p, rounds, res):
    """W3/W5: kiln_generate vs PyTorch's hand-written incremental decoder vs ORT's
    past/present decoder; W3 against its bandwidth floor. Returns False if no numbers."""
    with open(os.path.join(HERE, "workloads.json")) as f:
        gen = json.load(f).get("generation", [])
    if not gen:
        return False
    grounds = [load_generation_round(rd["dir"]) for rd in rounds]
    have = any(g["entries"] for g in grounds) or any(rd["pt"].get("best_generation") for rd in rounds) \
        or any(rd["ort"].get("generation") for rd in rounds)
    if not have:
        return False
    notes = []

    def times(i, w):
        rd, g = rounds[i], grounds[i]
        tag = os.path.basename(rd["dir"])
        e = find(g["entries"], w["kiln_name"])
        k = None
        if e is not None and e.get("error_occurred"):
            notes.append("%s kiln %s: skipped: %s" % (tag, w["key"], e.get("error_message")))
        elif e is not None:
            k = to_ms(e)
        pb = (rd["pt"].get("best_generation") or {}).get(w["key"])
        og = (rd["ort"].get("generation") or {}).get(w["key"], {})
        if og and not og.get("median_ms"):
            notes.append("%s ORT %s: %s" % (tag, w["key"], og.get("skipped") or og.get("error")))
        k_min = gbench_min_ms(g["doc"], w["kiln_name"]) if k else None
        p_min = best_of(s.get("generation", {}).get(w["key"], {}).get("min_ms") for s in rd["pt"].get("settings", [])
                        if not s.get("bf16_autocast"))
        o_min = best_of(v.get(w["key"], {}).get("min_ms") for v in (rd["ort"].get("generation_settings") or {}).values())
        return dict(k=k, p=pb["median_ms"] if pb else None, ps=pb["setting"] if pb else None,
                    o=og.get("median_ms"), os=og.get("setting"), k_min=k_min, p_min=p_min,
                    o_min=o_min or og.get("min_ms"))

    bws = [b for g in grounds for b in list(g["bw"].values()) + g["bw_reps"] if b]
    bw = max(bws) if bws else None
    threads = os.environ.get("KILN_BENCH_THREADS", "2")
    p("## Generation: kiln vs PyTorch vs ONNX Runtime (%s threads each; best of %d round%s)" % (
        threads, len(rounds), "s" if len(rounds) > 1 else ""))
    p("")
    p("| workload | target tokens | kiln ms | PyTorch best ms | ORT ms | kiln tok/s | PyTorch tok/s "
      "| ORT tok/s | PyTorch/kiln | ORT/kiln |")
    p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows, per_round = {}, {}
    for w in gen:
        key = w["key"]
        ts = [times(i, w) for i in range(len(rounds))]
        per_round[key] = ts
        k, pm, om = (best_of(t[x] for t in ts) for x in ("k", "p", "o"))
        n = w["batch"] * w["new_tokens"]

        def tps(ms):
            return n / (ms / 1e3) if ms else None
        rp = pm / k if pm and k else None
        ro = om / k if om and k else None
        rows[key] = dict(k=k, p=pm, o=om, rp=rp, ro=ro, setting=next((t["ps"] for t in ts if t["p"] == pm), None),
                         osetting=next((t["os"] for t in ts if t["o"] == om), None))
        what = "greedy" if w["beam"] == 1 else "beam %d" % w["beam"]
        p("| %s %s B=%d S=%d, %d new tokens | %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            key, what, w["batch"], w["src_len"], w["new_tokens"], n, fmt(k), fmt(pm), fmt(om),
            fmt(tps(k)), fmt(tps(pm)), fmt(tps(om)), fmt(rp, 2) + ("×" if rp else ""),
            fmt(ro, 2) + ("×" if ro else "")))
    p("")
    p("ms: a whole search per call (encoder and cross-attention keys/values once, %s decoder "
      "steps with the end token forbidden, the search itself); each engine's median per round, "
      "best round shown. tok/s: target tokens (batch × new tokens, the best hypothesis of each "
      "sentence) per second." % gen[0]["new_tokens"])
    for w in gen:
        if rows[w["key"]]["setting"]:
            p("PyTorch best for %s: %s." % (w["key"], rows[w["key"]]["setting"]))
        if rows[w["key"]]["osetting"]:
            p("ORT best for %s: intra-op thread pool %s." % (w["key"], rows[w["key"]]["osetting"]))
    ogs = rounds[0]["ort"].get("generation_settings") or {}
    if ogs:
        p("ORT, both thread-pool settings (round 1, median ms): " + "; ".join(
            "%s: %s" % (name, ", ".join("%s %s" % (k, fmt(v.get("median_ms"))) for k, v in per.items()))
            for name, per in ogs.items()) + ".")
    p("")
    p("Fastest single run (kiln: fastest repetition; peers: fastest call):")
    p("")
    p("| workload | kiln min ms | PyTorch min ms | ORT min ms | PyTorch/kiln | ORT/kiln |")
    p("|---|---:|---:|---:|---:|---:|")
    for w in gen:
        ts = per_round[w["key"]]
        k, pm, om = (best_of(t[x] for t in ts) for x in ("k_min", "p_min", "o_min"))
        p("| %s | %s | %s | %s | %s | %s |" % (w["key"], fmt(k), fmt(pm), fmt(om),
                                                fmt(pm / k if pm and k else None, 2) + ("×" if pm and k else ""),
                                                fmt(om / k if om and k else None, 2) + ("×" if om and k else "")))
    p("")

    generation_bf16(p, gen, rounds, grounds, per_round, bw)

    # W3's floor.
    w3 = next((w for w in gen if w["key"] == "W3"), None)
    floor_ratio = None
    if w3:
        floor_ms = STEP_WEIGHT_BYTES * w3["new_tokens"] / (bw * 1e9) * 1e3 if bw else None
        k = rows["W3"]["k"]
        k_min = best_of(t["k_min"] for t in per_round["W3"])
        floor_ratio = k / floor_ms if k and floor_ms else None
        p("**W3's floor**: one decoder step reads %.2f MB of weights (f32: every decoder layer's "
          "self-attention q, k, v, o, cross-attention q and o, FFN and LayerNorms, the final "
          "LayerNorm, the generator 512×32000, one embedding row; the cross-attention keys and "
          "values of the source are computed once, in prepare); × %d steps = %.3f GB, over the "
          "highest memory read bandwidth measured in the run, %s GB/s (2 threads streaming 512 MiB), "
          "is **%s ms**. kiln's W3: %s ms median = **%s× the floor** (fastest repetition %s ms = %s×)." % (
              STEP_WEIGHT_BYTES / 1e6, w3["new_tokens"], STEP_WEIGHT_BYTES * w3["new_tokens"] / 1e9,
              fmt(bw), fmt(floor_ms), fmt(k), fmt(floor_ratio, 2), fmt(k_min),
              fmt(k_min / floor_ms if k_min and floor_ms else None, 2)))
        p("")

    def check(cond, text):
        if cond is None:
            return "- n/a: %s (missing numbers)" % text
        return "- %s: %s" % ("met" if cond else "MISSED", text)

    def gt1(x):
        return None if x is None else x > 1.0

    p("### Acceptance (issue 11, point 4; on the medians above)")
    for w in gen:
        key = w["key"]
        p(check(gt1(rows[key]["rp"]), "%s kiln faster than PyTorch (ratio %s)" % (key, fmt(rows[key]["rp"], 2))))
        p(check(gt1(rows[key]["ro"]), "%s kiln faster than ONNX Runtime (ratio %s)" % (key, fmt(rows[key]["ro"], 2))))
    if w3:
        p(check(None if floor_ratio is None else floor_ratio <= 1.5,
                "W3 within 1.5× of its bandwidth floor (%s×)" % fmt(floor_ratio, 2)))
    p("")

    p("### Generation, every round (median ms; memory bandwidth GB/s measured next to each engine)")
    p("")
    p("| round | " + " | ".join("%s kiln / PyTorch / ORT" % w["key"] for w in gen)
      + " | bandwidth at kiln (range) / PyTorch / ORT | W3 kiln / floor at kiln's bandwidth | peak GFLOP/s at kiln |")
    p("|---|" + "---|" * (len(gen) + 3))
    for i, rd in enumerate(rounds):
        cells = ["%s / %s / %s" % (fmt(per_round[w["key"]][i]["k"]), fmt(per_round[w["key"]][i]["p"]),
                                   fmt(per_round[w["key"]][i]["o"])) for w in gen]
        g = grounds[i]
        rng = "%s–%s" % (fmt(min(g["bw_reps"])), fmt(max(g["bw_reps"]))) if g["bw_reps"] else "—"
        k3 = per_round["W3"][i]["k"] if w3 else None
        own = k3 / (STEP_WEIGHT_BYTES * w3["new_tokens"] / (g["bw"]["kiln"] * 1e9) * 1e3) \
            if k3 and g["bw"]["kiln"] else None
        p("| %s | %s | %s (%s) / %s / %s | %s | %s |" % (
            os.path.basename(rd["dir"]), " | ".join(cells), fmt(g["bw"]["kiln"]), rng, fmt(g["bw"]["pt"]),
            fmt(g["bw"]["ort"]), fmt(own, 2) + ("×" if own else ""), fmt(g["peak"], 0)))
    p("")
    if w3:
        p("W3 kiln / floor at kiln's bandwidth: kiln's W3 median over the floor computed with the "
          "bandwidth measured in the same process, interleaved with W3's repetitions (median of "
          "its repetitions), i.e. under the same load; the headline ratio uses the highest "
          "bandwidth of the whole run.")
        p("")

    # PyTorch's settings.
    pt = rounds[0]["pt"]
    if any(s.get("generation") for s in pt.get("settings", [])):
        p("PyTorch, every BLAS setting (round 1, median ms): " + "; ".join(
            "%s: %s" % (s["name"], ", ".join(
                "%s %s%s" % (w["key"], fmt(s["generation"][w["key"]].get("median_ms"))
                             if "median_ms" in s["generation"].get(w["key"], {}) else "skipped",
                             " (warm-up only)" if s["generation"].get(w["key"], {}).get("runs") == 0 else "")
                for w in gen))
            for s in pt.get("settings", []) if s.get("generation")) + ".")
        p("")

    # Same ids.
    p("### Generation: same source ids as PyTorch")
    meta = safetensors_metadata(os.environ.get("KILN_BENCH_GEN_REFERENCE") or os.path.join(
        os.path.dirname(os.path.abspath(res)), "gen_reference.safetensors"))
    if meta:
        p("- PyTorch's incremental decoder (the peer) vs the reference model without a cache: greedy "
          "ids %s equal, every step's logits within %s of forward()'s" % (
              meta.get("incremental_vs_full_greedy_same_ids", "?"),
              meta.get("incremental_vs_forward_max_abs_logit_diff", "?")))
    ce = find(grounds[0]["entries"], "check_generate_vs_pytorch")
    if ce and not ce.get("error_occurred"):
        p("- kiln: greedy %d/%d ids equal to PyTorch's (%d leading), beam 4 (2 sentences) %d/%d (%d leading)" % (
            ce.get("greedy_same_ids", 0), ce.get("greedy_of", 0), ce.get("greedy_same_prefix", 0),
            ce.get("beam4_same_ids", 0), ce.get("beam4_of", 0), ce.get("beam4_same_prefix", 0)))
    elif ce:
        p("- kiln: not checked: %s" % ce.get("error_message"))
    oc = rounds[0]["ort"].get("generation_check_vs_pytorch")
    if oc:
        p("- ONNX Runtime: greedy %d/%d ids equal (%d leading), beam 4 %d/%d (%d leading)" % (
            oc["greedy"]["same_ids"], oc["greedy"]["of"], oc["greedy"]["same_prefix"],
            oc["beam4"]["same_ids"], oc["beam4"]["of"], oc["beam4"]["same_prefix"]))
    p("")

    # kiln's profile.
    prof = parse_profile(os.path.join(rounds[0]["dir"], "kiln-gen-profile.txt"))
    if prof:
        p("### kiln's profile (round 1, after the timed runs; kiln_model_set_profiling)")
        p("")
        for name, pr in prof.items():
            kernel_ms = sum(ms * runs for runs, ms in pr["entry"].values())
            calls = pr["entry"].get("prepare", (1, 0))[0] or 1
            per_call = kernel_ms / calls
            p("%s: %s ms per kiln_generate call with profiling on; entry points %s; the runtime's "
              "search (log_softmax, top-k, bookkeeping, cache allocation) the remaining %s ms (%s%%)." % (
                  name, fmt(pr["call_ms"]), ", ".join("%s %s ms × %d" % (n, fmt(ms, 2), r // calls)
                                                       for n, (r, ms) in pr["entry"].items()),
                  fmt(pr["call_ms"] - per_call if pr["call_ms"] else None),
                  fmt(100 * (pr["call_ms"] - per_call) / pr["call_ms"] if pr["call_ms"] else None)))
            p("")
            p("| kernel | calls per generate | ms per call | ms per generate | share of kernel time |")
            p("|---|---:|---:|---:|---:|")
            for kname, kc, total, per, share in pr["kernels"][:8]:
                p("| %s | %d | %s | %s | %s |" % (kname, kc // calls, fmt(per, 3), fmt(total / calls, 1), share))
            p("")
    for n in notes:
        p("- " + n)
    if notes:
        p("")
    return True


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    res = sys.argv[1]
    with open(os.path.join(HERE, "workloads.json")) as f:
        workloads = json.load(f)["workloads"]
    dirs = sorted((os.path.join(res, d) for d in os.listdir(res) if d.startswith("round")),
                  key=lambda d: int(os.path.basename(d)[5:] or 0))
    rounds = [load_round(d) for d in (dirs or [res])]
    first = rounds[0]
    kiln, pt, ort = first["kiln"], first["pt"], first["ort"]
    lines = []
    p = lines.append
    notes = []

    have_forward = any(find(rd["kiln"], w["kiln_name"]) for rd in rounds for w in workloads) or \
        any(rd["pt"].get("best") for rd in rounds) or any(rd["ort"].get("workloads") for rd in rounds)
    if not have_forward:  # KILN_BENCH_GENERATION=only
        generation_section(p, rounds, res)
        int8_section(p, rounds, [], {}, res)
        machine_and_problems(p, res)
        print("\n".join(lines))
        return 0

    peaks = [x for rd in rounds for x in (rd["peak_kiln"], rd["peak_pt"], rd["peak_ort"]) if x]
    peak = max(peaks) if peaks else None
    peak_label = next((find(rd["kiln"], "peak").get("label", "") for rd in rounds if find(rd["kiln"], "peak")), "")
    threads = os.environ.get("KILN_BENCH_THREADS", "2")
    p("## kiln vs PyTorch vs ONNX Runtime (%s threads each; best of %d round%s)" % (
        threads, len(rounds), "s" if len(rounds) > 1 else ""))
    p("")
    p("| workload | GFLOP | kiln ms | PyTorch best ms | ORT ms | PyTorch/kiln | ORT/kiln "
      "| kiln GFLOP/s | % of peak |")
    p("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = {}
    per_round = {}
    for w in workloads:
        key = w["key"]
        times = [round_times(rd, w, notes) for rd in rounds]
        per_round[key] = times
        k_ms = best_of(t[0] for t in times)
        gflop = next((t[1] for t in times if t[1]), None)
        p_ms = best_of(t[2] for t in times)
        o_ms = best_of(t[4] for t in times)
        k_gf = gflop / (k_ms / 1e3) if gflop and k_ms else None
        rp = p_ms / k_ms if p_ms and k_ms else None
        ro = o_ms / k_ms if o_ms and k_ms else None
        pct = 100.0 * k_gf / peak if k_gf and peak else None
        rows[key] = dict(k_ms=k_ms, p_ms=p_ms, o_ms=o_ms, rp=rp, ro=ro, pct=pct)
        rows[key]["setting"] = next((t[3] for t in times if t[2] == p_ms), None)
        shape = "%s B=%d S=%d" % (w["function"], w["batch"], w["src_len"]) + \
            (" T=%d" % w["tgt_len"] if w["function"] == "forward" else "")
        p("| %s %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            key, shape, fmt(gflop, 2), fmt(k_ms), fmt(p_ms), fmt(o_ms),
            fmt(rp, 2) + ("×" if rp else ""), fmt(ro, 2) + ("×" if ro else ""), fmt(k_gf), fmt(pct)))
    p("")
    p("ms: each engine's median per round, best round shown. Peak: the highest FP32 FMA peak "
      "measured in the run, %s GFLOP/s (%s); %% of peak = kiln GFLOP/s / that." % (fmt(peak), peak_label))
    for w in workloads:
        if rows[w["key"]]["setting"]:
            p("PyTorch best for %s: %s." % (w["key"], rows[w["key"]]["setting"]))
    p("")
    p("The same from each engine's fastest single run (kiln: fastest repetition, itself a mean "
      "over ≥0.5 s; peers: fastest call), which load hurts least:")
    p("")
    p("| workload | kiln min ms | PyTorch min ms | ORT min ms | PyTorch/kiln | ORT/kiln | kiln GFLOP/s | % of peak |")
    p("|---|---:|---:|---:|---:|---:|---:|---:|")
    for w in workloads:
        times = per_round[w["key"]]
        k = best_of(t[5] for t in times)
        pm = best_of(t[6] for t in times)
        o = best_of(t[7] for t in times)
        gflop = next((t[1] for t in times if t[1]), None)
        gf = gflop / (k / 1e3) if gflop and k else None
        p("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            w["key"], fmt(k), fmt(pm), fmt(o), fmt(pm / k if pm and k else None, 2) + ("×" if pm and k else ""),
            fmt(o / k if o and k else None, 2) + ("×" if o and k else ""), fmt(gf),
            fmt(100 * gf / peak if gf and peak else None)))
    p("")

    # Acceptance.
    def check(cond, text):
        if cond is None:
            return "- n/a: %s (missing numbers)" % text
        return "- %s: %s" % ("met" if cond else "MISSED", text)

    def gt1(x):
        return None if x is None else x > 1.0

    p("### Acceptance (issue; on the medians above)")
    p(check(gt1(rows["W2"]["rp"]), "W2 kiln faster than PyTorch (ratio %s)" % fmt(rows["W2"]["rp"], 2)))
    p(check(gt1(rows["W2"]["ro"]), "W2 kiln faster than ONNX Runtime (ratio %s)" % fmt(rows["W2"]["ro"], 2)))
    p(check(gt1(rows["W4"]["rp"]), "W4 kiln faster than PyTorch (ratio %s)" % fmt(rows["W4"]["rp"], 2)))
    p(check(gt1(rows["W4"]["ro"]), "W4 kiln faster than ONNX Runtime (ratio %s)" % fmt(rows["W4"]["ro"], 2)))
    p(check(gt1(rows["W1"]["rp"]), "W1 kiln faster than PyTorch (ratio %s)" % fmt(rows["W1"]["rp"], 2)))
    pct = rows["W2"]["pct"]
    p(check(None if pct is None else pct >= 60.0, "W2 at >= 60%% of the measured peak (%s%%)" % fmt(pct)))
    p("")

    # Every round: the noise.
    p("### Every round (median ms; peak GFLOP/s measured just before each engine)")
    p("")
    p("| round | " + " | ".join("%s kiln / PyTorch / ORT" % w["key"] for w in workloads)
      + " | peak at kiln / PyTorch / ORT |")
    p("|---|" + "---|" * (len(workloads) + 1))
    for i, rd in enumerate(rounds):
        cells = []
        for w in workloads:
            t = per_round[w["key"]][i]
            cells.append("%s / %s / %s" % (fmt(t[0]), fmt(t[2]), fmt(t[4])))
        p("| %s | %s | %s / %s / %s |" % (os.path.basename(rd["dir"]), " | ".join(cells),
                                           fmt(rd["peak_kiln"], 0), fmt(rd["peak_pt"], 0), fmt(rd["peak_ort"], 0)))
    p("")

    # bf16 weights and W1's floor (issue 13).
    bf16_section(p, rounds, workloads, per_round, rows, res)

    # Generation (W3, W5).
    generation_section(p, rounds, res)

    # Setup and memory (round 1: every engine's first process).
    setup_and_memory(p, first, load(os.path.join(res, "compile.json")) or {})

    # Correctness on the same ids (W1 shape).
    p("### Same ids, W1 shape: logits against PyTorch")
    meta = safetensors_metadata(os.environ.get("KILN_BENCH_REFERENCE") or os.path.join(
        os.path.dirname(os.path.abspath(res)), "reference.safetensors"))
    ce = find(kiln, "check_vs_pytorch")
    if ce and not ce.get("error_occurred"):
        p("- kiln: max |Δ| vs PyTorch f32 %.3g, vs f64 %.3g (max |logit| %.3g)" % (
            ce["max_abs_err"], ce["max_abs_err_f64"], ce["max_abs_logit"]))
    elif ce:
        p("- kiln: not checked: %s" % ce.get("error_message"))
    cb = find(kiln, "bf16/check_vs_pytorch")
    if cb and not cb.get("error_occurred"):
        p("- kiln, bf16 weights: max |Δ| vs PyTorch f32 %.3g, vs f64 %.3g (bf16 rounding of every linear's "
          "inputs; tests/bf16_test.cpp states the tolerance)" % (cb["max_abs_err"], cb["max_abs_err_f64"]))
    elif cb:
        p("- kiln, bf16 weights: not checked: %s" % cb.get("error_message"))
    oc = ort.get("check_vs_pytorch")
    if oc:
        p("- ONNX Runtime: max |Δ| vs PyTorch f32 %.3g, vs f64 %.3g" % (oc["max_abs_err"], oc["max_abs_err_f64"]))
    if "pytorch_f32_vs_f64_max_abs" in meta:
        p("- PyTorch f32 itself vs f64: %s (the golden-style init makes this model ill-conditioned)"
          % meta["pytorch_f32_vs_f64_max_abs"])
    p("")

    # Every PyTorch setting.
    if pt.get("settings"):
        p("### PyTorch %s, every BLAS setting (round 1, median ms)" % pt.get("torch_version", ""))
        p("")
        p("| setting | BLAS probe GFLOP/s | " + " | ".join(w["key"] for w in workloads) + " |")
        p("|---|---:|" + "---:|" * len(workloads))
        for s in pt["settings"]:
            if "error" in s:
                p("| %s | — | %s |" % (s["name"], s["error"]))
                continue
            cells = []
            for w in workloads:
                r = s["workloads"].get(w["key"], {})
                cells.append(fmt(r.get("median_ms")) if "median_ms" in r else "skipped")
            p("| %s | %s | %s |" % (s["name"], fmt(s.get("probe_gflops")), " | ".join(cells)))
        for s in pt["settings"]:
            reasons = sorted({r["skipped"] for r in s.get("workloads", {}).values() if r.get("skipped")})
            for reason in reasons:
                p("")
                p("%s: %s" % (s["name"], reason))
        p("")
    ox = pt.get("onnx_export") or {}
    if ox.get("errors"):
        for k, v in ox["errors"].items():
            p("- ONNX export of %s failed: %s" % (k, v))
    if ort:
        p("ONNX Runtime: onnxruntime-node %s, graphOptimizationLevel 'all', intraOpNumThreads %s." % (
            (ort.get("version") or {}).get("node", "?"), ort.get("threads")))
    p("")

    # GEMM: gemm_bench once per round (round*/gemm.json; older runs: one gemm.json). The
    # libraries' GFLOP/s: as for the models, each one's best round per shape (its highest
    # median). The ratio the acceptance reads: gemm_bench's paired benchmark (kiln and
    # oneDNN alternating in 20 ms blocks, oneDNN time over kiln time per block pair), the
    # median over every pair of every round; runs from before it existed fall back to the
    # ratio of the best rounds.
    gemm_docs = [(os.path.basename(r["dir"]), load(os.path.join(r["dir"], "gemm.json"))) for r in rounds]
    gemm_docs = [(name, d) for name, d in gemm_docs if gbench_entries(d)]
    if not gemm_docs:
        single = load(os.path.join(res, "gemm.json"))
        if gbench_entries(single):
            gemm_docs = [("run", single)]
    gemm_rounds = [(name, gbench_entries(d)) for name, d in gemm_docs]
    if gemm_rounds:
        def gflops(g, name):
            e = find(g, name)
            return e.get("GFLOP/s") if e and not e.get("error_occurred") else None

        def paired(g, name):
            e = find(g, name)
            return e.get("kiln/oneDNN") if e and not e.get("error_occurred") else None

        def pct(a, b=1.0):
            return fmt(a / b * 100) + "%" if a and b else "—"

        multi = len(gemm_rounds) > 1
        names = set()
        for _, g in gemm_rounds:
            names |= {rn.split("/")[1] for rn in g if rn.startswith("kiln/")}
        shapes = sorted(names, key=lambda s: [int(t[1:]) if t[1:].isdigit() else 0 for t in s.split("_")[:3]])
        best = {}  # shape -> (kiln, oneDNN) best-round GFLOP/s
        pooled = {}  # shape -> paired ratio over every round
        per_round = {}  # shape -> [(kiln GFLOP/s, oneDNN GFLOP/s, paired ratio) per round]
        for s in shapes:
            ks = [gflops(g, "kiln/" + s) for _, g in gemm_rounds]
            ds = [gflops(g, "onednn/" + s) for _, g in gemm_rounds]
            ps = [paired(g, "paired/" + s) for _, g in gemm_rounds]
            per_round[s] = list(zip(ks, ds, ps))
            best[s] = (max([v for v in ks if v], default=None), max([v for v in ds if v], default=None))
            pooled[s] = median([v for _, d in gemm_docs for v in gbench_values(d, "paired/" + s, "kiln/oneDNN")])
        any_paired = any(v is not None for v in pooled.values())
        ratios = {s: pooled[s] if any_paired else (best[s][0] / best[s][1] if all(best[s]) else None)
                  for s in shapes}  # what the acceptance reads

        p("### GEMM: kiln's linear kernel vs oneDNN (gemm_bench)")
        p("")
        head = "| shape | kiln GFLOP/s | oneDNN GFLOP/s | kiln/oneDNN%s |%s kiln %% of peak |" % (
            ", best rounds" if any_paired else "", " kiln/oneDNN, paired |" if any_paired else "")
        rule = "|---|---:|---:|---:|%s---:|" % ("---:|" if any_paired else "")
        if multi:
            head += "".join(" %s%s |" % (n, ": apart; paired" if any_paired else " kiln / oneDNN")
                            for n, _ in gemm_rounds)
            rule += "---:|" * len(gemm_rounds)
        p(head)
        p(rule)
        for s in shapes:
            kg, dg = best[s]
            row = "| %s | %s | %s | %s |%s %s |" % (s, fmt(kg), fmt(dg), pct(kg, dg),
                                                   " %s |" % pct(pooled[s]) if any_paired else "", pct(kg, peak))
            if multi:
                row += "".join(" %s%s |" % (pct(k, d), "; " + pct(pr) if any_paired else "")
                               for k, d, pr in per_round[s])
            p(row)
        p("")
        repeated = any(e.get("run_type") == "aggregate" for _, g in gemm_rounds for e in g.values())
        p("GFLOP/s: %s%s.%s" % (
            "medians over the repetitions" if repeated else "one run per shape",
            ", each library's best round" if multi else "",
            " Paired: the two libraries alternating in one loop, oneDNN's time over kiln's per "
            "pair of 20 ms blocks, median over every pair%s (see gemm_bench.cpp)." % (
                " of every round; in the round columns, that round's" if multi else "")
            if any_paired else ""))
        missed = [s for s, r in ratios.items() if r is None or r < 0.9]
        if ratios:
            p("- %s: kiln's linear at >= 90%% of oneDNN on every model shape (%s)%s" % (
                "met" if not missed else "NOT met",
                "paired ratios" if any_paired else "best rounds' GFLOP/s",
                "" if not missed else ": below: %s" % ", ".join(
                    "%s %s%%" % (s, fmt(ratios[s] * 100 if ratios[s] else None)) for s in missed)))
            apart = [s for s in shapes if not (all(best[s]) and best[s][0] >= 0.9 * best[s][1])]
            if any_paired:
                p("- from the libraries' separate best-round medians: %s" % (
                    "every shape >= 90%" if not apart else "below 90%: " + ", ".join(apart)))
            if multi:
                for i, (name, _) in enumerate(gemm_rounds):
                    below = [s for s in shapes
                             if not (per_round[s][i][0] and per_round[s][i][1]
                                     and per_round[s][i][0] >= 0.9 * per_round[s][i][1])]
                    below_p = [s for s in shapes if per_round[s][i][2] is not None and per_round[s][i][2] < 0.9]
                    p("- %s alone%s: %s%s" % (
                        name, ", apart" if any_paired else "", "every shape >= 90%" if not below else "below 90%: " + ", ".join(below),
                        "; paired: " + ("every shape >= 90%" if not below_p else "below 90%: " + ", ".join(below_p))
                        if any_paired else ""))
        p("")

    gemm_packed_section(p, gemm_docs, "bf16")
    gemm_packed_section(p, gemm_docs, "bf16fma")
    int8_gemm = gemm_packed_section(p, gemm_docs, "int8")

    # int8 weights (issue 27): every workload in the three dtypes, the floors, the plot.
    int8_section(p, rounds, workloads, int8_gemm, res)

    machine_and_problems(p, res)
    if notes:
        p("### Notes")
        for n in notes:
            p("- " + n)
    print("\n".join(lines))
    return 0


GEMM_PACKED = {
    "bf16": dict(
        issue="13", needs="AVX512-BF16", onednn="oneDNN's bf16 matmul",
        what="oneDNN: the matmul primitive (src bf16, weights bf16 with format_tag::any reordered once "
             "outside the timing, bias f32 and ReLU post-op as kiln's, dst f32; oneDNN 2.6 has no "
             "dnnl_gemm_bf16bf16f32). kiln reads x in f32 and rounds it as it reads; oneDNN gets it in bf16."),
    "bf16fma": dict(
        issue="13", needs="AVX512-BF16", onednn="oneDNN's bf16 matmul", onednn_family="bf16",
        what="kiln: the FMA form of its bf16 kernel (`*_bf16fma`: the packed bf16 weights widened to "
             "f32 and multiplied on FMAs, the form a bf16 library runs where vdpbf16ps does fewer "
             "products per ns, as on Intel without AMX). oneDNN: its bf16 matmul, as above "
             "(onednn_bf16/)."),
    "int8": dict(
        issue="27", needs="AVX512-VNNI", onednn="oneDNN's int8 matmul",
        what="oneDNN: the matmul primitive as CTranslate2 uses it (src u8 [M, K] quantized once outside "
             "the timing, weights s8 with format_tag::any reordered once, per-column output scales "
             "(mask 2), bias f32 with the zero point's compensation folded in, ReLU post-op, dst f32; "
             "oneDNN at its default ISA). kiln reads x in f32 and quantizes each row (u8 with a zero "
             "point) inside its timing; oneDNN gets x already in u8."),
}


def gemm_packed_section(p, gemm_docs, dtype):
    """gemm_bench's benchmarks of one packed weight type (kiln_DTYPE/, onednn_DTYPE/,
    paired_DTYPE/; bf16 or int8): kiln's linear kernel of that type against oneDNN's matmul of the
    same type, and the issue's >= 95% check on the paired ratios. Returns {shape: paired ratio}."""
    info = GEMM_PACKED[dtype]
    rounds = [(name, gbench_entries(d), d) for name, d in gemm_docs]
    names = set()
    for _, g, _ in rounds:
        names |= {rn.split("/")[1] for rn in g if rn.startswith("kiln_%s/" % dtype)}
    title = "### GEMM, %s: kiln's %s linear kernel vs %s (gemm_bench)" % (dtype, dtype, info["onednn"])
    if not names:
        p(title)
        family = info.get("onednn_family", dtype)
        p("- n/a: kiln's %s linear at >= 95%% of %s on every model shape (no %s results from gemm_bench: "
          "%s)" % (dtype, info["onednn"], dtype, "not run (needs libdnnl-dev; KILN_BENCH_GEMM=0?)" if not rounds
                   else "built without %s (no %s) or KILN_BENCH_%s=0%s" % (
                       family, info["needs"], family.upper(),
                       "; or a gemm_bench from before the FMA form's family" if family != dtype else "")))
        p("")
        return {}
    shapes = sorted(names, key=lambda s: [int(t[1:]) if t[1:].isdigit() else 0 for t in s.split("_")[:3]])

    def value(g, name, counter):
        e = find(g, name)
        return e.get(counter) if e and not e.get("error_occurred") else None

    def pct(a, b=1.0):
        return fmt(a / b * 100) + "%" if a and b else "—"

    multi = len(rounds) > 1
    p(title)
    p("")
    int8 = dtype == "int8"
    head = "| shape | kiln %s GFLOP/s | oneDNN %s GFLOP/s | kiln/oneDNN, best rounds | kiln/oneDNN, paired " \
        "| kiln %s / kiln f32 |" % (dtype, info.get("onednn_family", dtype), dtype) + (
            " kiln int8 / kiln bf16 |" if int8 else "")
    rule = "|---|---:|---:|---:|---:|---:|" + ("---:|" if int8 else "")
    if multi:
        head += "".join(" %s: apart; paired |" % n for n, _, _ in rounds)
        rule += "---:|" * len(rounds)
    p(head)
    p(rule)
    pooled, best, per_round = {}, {}, {}
    for s in shapes:
        ks = [value(g, "kiln_%s/" % dtype + s, "GFLOP/s") for _, g, _ in rounds]
        ds = [value(g, "onednn_%s/" % info.get("onednn_family", dtype) + s, "GFLOP/s")
              for _, g, _ in rounds]
        ps = [value(g, "paired_%s/" % dtype + s, "kiln/oneDNN") for _, g, _ in rounds]
        fs = [value(g, "kiln/" + s, "GFLOP/s") for _, g, _ in rounds]
        bs = [value(g, "kiln_bf16/" + s, "GFLOP/s") for _, g, _ in rounds]
        per_round[s] = list(zip(ks, ds, ps))
        best[s] = (max([v for v in ks if v], default=None), max([v for v in ds if v], default=None))
        kf = max([v for v in fs if v], default=None)
        kb = max([v for v in bs if v], default=None)
        pooled[s] = median([v for _, _, d in rounds
                            for v in gbench_values(d, "paired_%s/" % dtype + s, "kiln/oneDNN")])
        row = "| %s | %s | %s | %s | %s | %s |" % (
            s, fmt(best[s][0]), fmt(best[s][1]), pct(*best[s]), pct(pooled[s]),
            fmt(best[s][0] / kf, 2) + "×" if best[s][0] and kf else "—")
        if int8:
            row += " %s |" % (fmt(best[s][0] / kb, 2) + "×" if best[s][0] and kb else "—")
        if multi:
            row += "".join(" %s; %s |" % (pct(k, d), pct(pr)) for k, d, pr in per_round[s])
        p(row)
    p("")
    p("GFLOP/s (2·M·N·K per call): medians over the repetitions, each library's best round. %s "
      "Paired: as for f32, the median over every pair of 20 ms blocks of every round. kiln %s / kiln "
      "f32: kiln's best-round GFLOP/s of its %s kernel over its f32 one%s." % (
          info["what"], dtype, dtype, " (and over its bf16 one)" if int8 else ""))
    missed = [s for s in shapes if pooled[s] is None or pooled[s] < 0.95]
    p("- %s: kiln's %s linear at >= 95%% of %s on every model shape (paired ratios; issue %s)%s" % (
        "met" if not missed else "NOT met", dtype, info["onednn"], info["issue"],
        "" if not missed else ": below: %s" % ", ".join(
            "%s %s%%" % (s, fmt(pooled[s] * 100 if pooled[s] else None)) for s in missed)))
    apart = [s for s in shapes if not (all(best[s]) and best[s][0] >= 0.95 * best[s][1])]
    p("- from the libraries' separate best-round medians: %s" % (
        "every shape >= 95%" if not apart else "below 95%: " + ", ".join(apart)))
    if multi:
        for i, (name, _, _) in enumerate(rounds):
            below = [s for s in shapes if not (per_round[s][i][0] and per_round[s][i][1]
                                               and per_round[s][i][0] >= 0.95 * per_round[s][i][1])]
            below_p = [s for s in shapes if per_round[s][i][2] is not None and per_round[s][i][2] < 0.95]
            p("- %s alone, apart: %s; paired: %s" % (
                name, "every shape >= 95%" if not below else "below 95%: " + ", ".join(below),
                "every shape >= 95%" if not below_p else "below 95%: " + ", ".join(below_p)))
    p("")
    return pooled


DTYPES = (("f32", "", 1), ("bf16", "bf16/", 2), ("int8", "int8/", 4))  # name, prefix, × FMA peak


def int8_section(p, rounds, workloads, int8_gemm, res):
    """Issue 27: kiln's f32, bf16 and int8 builds side by side on W1–W5 (model_bench and
    generate_bench, each dtype's best round), their distance to the compute floor (the
    workload's GFLOP over the highest FMA peak measured in the run, × 2 for bf16, × 4 for int8),
    peak RSS per dtype, the acceptance lines of points 2 and 3, and the tokens/s plot."""
    with open(os.path.join(HERE, "workloads.json")) as f:
        gen = json.load(f).get("generation", [])
    grounds = [load_generation_round(rd["dir"]) for rd in rounds]
    peaks = [x for rd in rounds for x in (rd["peak_kiln"], rd["peak_pt"], rd["peak_ort"]) if x]
    peaks += [g["peak"] for g in grounds if g["peak"]]
    peak = max(peaks) if peaks else None
    rows = []  # (key, is_generation, n tokens or None, {dtype: (ms, GFLOP)})
    for w in workloads:
        rows.append((w["key"], False, None, w["kiln_name"], [rd["kiln"] for rd in rounds]))
    for w in gen:
        rows.append((w["key"], True, w["batch"] * w["new_tokens"], w["kiln_name"], [g["entries"] for g in grounds]))
    table = {}
    for key, is_gen, n, name, entries in rows:
        table[key] = {}
        for dt, prefix, mult in DTYPES:
            ms, gflop = [], None
            for ents in entries:  # one per round: None where it did not run
                e = find(ents, prefix + name)
                ok = e is not None and not e.get("error_occurred")
                ms.append(to_ms(e) if ok else None)
                gflop = gflop or (e.get("GFLOP") if ok else None)
            table[key][dt] = (best_of(ms), gflop, ms)
    if not any(table[k]["int8"][0] for k in table):
        p("### int8 weights (issue 27)")
        p("")
        p("No int8 numbers in this run (benches built without int8 rows: no AVX512-VNNI on the build host, "
          "or KILN_BENCH_INT8=0).")
        p("")
        return

    def ratio(a, b):
        return a / b if a and b else None

    def x(v, nd=2):
        return fmt(v, nd) + "×" if v else "—"

    p("### int8 weights (issue 27): kiln's f32, bf16 and int8 builds")
    p("")
    p("| workload | kiln f32 ms | kiln bf16 ms | kiln int8 ms | f32 / bf16 | f32 / int8 | bf16 / int8 | "
      "target tok/s f32 / bf16 / int8 | GFLOP | f32 / floor | bf16 / bf16 floor | int8 / int8 floor |")
    p("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    floors, f32_floor_ms = {}, {}
    for key, is_gen, n, name, _ in rows:
        t = table[key]
        f, b, i = (t[dt][0] for dt, _, _ in DTYPES)
        gflop = next((t[dt][1] for dt, _, _ in DTYPES if t[dt][1]), None)
        floors[key] = {}
        f32_floor_ms[key] = gflop / peak * 1e3 if gflop and peak else None
        for dt, _, mult in DTYPES:
            floor_ms = gflop / (peak * mult) * 1e3 if gflop and peak else None
            floors[key][dt] = ratio(t[dt][0], floor_ms)
        tps = " / ".join(fmt(n / (v / 1e3) if v else None, 0) for v in (f, b, i)) if n else "—"
        p("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            key, fmt(f), fmt(b), fmt(i), x(ratio(f, b)), x(ratio(f, i)), x(ratio(b, i)), tps, fmt(gflop, 2),
            x(floors[key]["f32"]), x(floors[key]["bf16"]), x(floors[key]["int8"])))
    p("")
    p("ms: each build's median per round, best round shown (f32, bf16 and int8 run in one model_bench / "
      "generate_bench process, their repetitions interleaved with each other and with the FMA peak). "
      "Ratios above 1: the second build is faster. Compute floor: the workload's GFLOP (model_bench's "
      "count; generate_bench's: prepare's encoder and cross keys/values once, then every step for every "
      "hypothesis, step 0 one per sentence) over the highest FP32 FMA peak measured in the run, %s "
      "GFLOP/s; the bf16 floor divides by 2× that peak (vdpbf16ps: 32 products per instruction against "
      "16 FMAs), the int8 floor by 4× (vpdpbusd: 64). The floors count only the linear layers and "
      "attention products; everything else a call does (norms, softmax, the search, quantizing "
      "activations) is above them." % fmt(peak))
    p("")
    # A library built with `--bf16-products auto` runs FMAs where vdpbf16ps does fewer products
    # per cycle (Intel Sapphire/Emerald Rapids without AMX); the profile's kernel names say which.
    fma = False
    for rd in rounds:
        prof = os.path.join(rd["dir"], "kiln-gen-profile.txt")
        if os.path.exists(prof):
            with open(prof) as f:
                fma = fma or "_bf16fma" in f.read()
    if fma:
        p("This run's bf16 builds ran their products on f32 FMAs (kernels `*_bf16fma`: the library, "
          "built with `--bf16-products auto`, measured vdpbf16ps doing fewer products per ns than FMAs "
          "on this CPU when it loaded; attention f32): their floor at the FMA rate is the f32 floor, and against it bf16 is at " +
          ", ".join("%s %s" % (key, x(ratio(table[key]["bf16"][0], f32_floor_ms[key])))
                    for key, _, _, _, _ in rows) + ".")
        p("")
    # An int8 library built with `--bf16-products auto` holds attention in bf16 and in f32 and
    # runs bf16 where vdpbf16ps is the faster (and the CPU has AVX512-BF16): the profile's fused
    # attention kernel of the int8 build ends in "_bf16" (or "_bf16_..."), or not.
    int8_attention = set()
    for rd in rounds:
        prof = os.path.join(rd["dir"], "kiln-gen-profile.txt")
        if os.path.exists(prof):
            with open(prof) as f:
                for line in f:
                    name = line.split()[0] if line.split() else ""
                    if "_int8_kiln_attention_" in name:
                        int8_attention.add("bf16" if "_bf16" in name else "f32")
    if int8_attention:
        p("This run's int8 build ran attention in %s (its library holds both forms, built with "
          "`--bf16-products auto`, and runs bf16 where the CPU does more products per ns with "
          "vdpbf16ps than with FMAs; the fused attention kernel's name ends in `_bf16` then)."
          % " and ".join(sorted(int8_attention)))
        p("")
    p("Every round (median ms f32 / bf16 / int8): " + "; ".join(
        "%s %s" % (os.path.basename(rd["dir"]), ", ".join(
            "%s %s" % (key, " / ".join(fmt(table[key][dt][2][ri] if ri < len(table[key][dt][2]) else None)
                                       for dt, _, _ in DTYPES)) for key, _, _, _, _ in rows))
        for ri, rd in enumerate(rounds)) + ".")
    p("")

    # W3's bandwidth floor per build (generation_section has f32's, generation_bf16 bf16's): over
    # the same bandwidth as theirs, the highest generate_bench and the peers' probes measured.
    bws = [v for g in grounds for v in list(g["bw"].values()) + g["bw_reps"] if v]
    bw = max(bws) if bws else None
    w3g = next((w for w in gen if w["key"] == "W3"), None)
    if w3g and bw and "W3" in table:
        cells = []
        for dt, step in (("f32", STEP_WEIGHT_BYTES), ("bf16", STEP_WEIGHT_BYTES_BF16), ("int8", STEP_WEIGHT_BYTES_INT8)):
            floor_ms = step * w3g["new_tokens"] / (bw * 1e9) * 1e3
            cells.append("%s %.2f MB per step, floor %s ms, kiln %s ms = %s" % (
                dt, step / 1e6, fmt(floor_ms), fmt(table["W3"][dt][0]), x(ratio(table["W3"][dt][0], floor_ms))))
        p("W3 against its memory-bandwidth floor (weight bytes per step × %d steps over %s GB/s, as in the "
          "generation section): %s." % (w3g["new_tokens"], fmt(bw), "; ".join(cells)))
        p("")

    # Peak RSS per dtype (model_bench's memory runs: one process per build, W1, W2, W4 once).
    mem = []
    for dt, suffix in (("f32", ""), ("bf16", "-bf16"), ("int8", "-int8")):
        m = load(os.path.join(rounds[0]["dir"], "kiln-memory%s.json" % suffix)) or {}
        pre = "" if dt == "f32" else dt + "_"
        if m.get(pre + "load_ms") is not None:
            mem.append("%s: load %s ms, RSS after load %s MiB, peak %s MiB" % (
                dt, fmt(m.get(pre + "load_ms"), 0), fmt(m.get(pre + "rss_after_load_mib"), 0),
                fmt(m.get("peak_rss_mib"), 0)))
    if mem:
        p("kiln's memory per build (model_bench, one process per build over W1, W2, W4 once): " + "; ".join(mem) + ".")
        p("")
    for name, what in (("int8/check_vs_pytorch", "forward, W1 shape"),):
        ce = find(rounds[0]["kiln"], name)
        if ce and not ce.get("error_occurred"):
            p("kiln int8 vs PyTorch f32 (%s): max |Δ| %.3g, vs f64 %.3g, max |logit| %.3g (quantization of "
              "every linear's weights and inputs)." % (what, ce["max_abs_err"], ce["max_abs_err_f64"],
                                                       ce["max_abs_logit"]))
    ce = find(grounds[0]["entries"], "int8/check_generate_vs_pytorch") if grounds else None
    if ce and not ce.get("error_occurred"):
        p("kiln int8 vs PyTorch f32 on the same source ids (informational): greedy %d/%d ids equal (%d leading), "
          "beam 4 %d/%d (%d leading)." % (
              ce.get("greedy_same_ids", 0), ce.get("greedy_of", 0), ce.get("greedy_same_prefix", 0),
              ce.get("beam4_same_ids", 0), ce.get("beam4_of", 0), ce.get("beam4_same_prefix", 0)))
    p("")

    def check(cond, text):
        if cond is None:
            return "- n/a: %s (missing numbers)" % text
        return "- %s: %s" % ("met" if cond else "MISSED", text)

    def at_least(v, bar):
        return None if v is None else v >= bar

    def at_most(v, bar):
        return None if v is None else v <= bar

    t = table
    w5 = t.get("W5", {})
    w3 = t.get("W3", {})
    r5i = ratio(w5.get("f32", (None,))[0], w5.get("int8", (None,))[0]) if w5 else None
    r5b = ratio(w5.get("f32", (None,))[0], w5.get("bf16", (None,))[0]) if w5 else None
    r3 = ratio(w3.get("bf16", (None,))[0], w3.get("int8", (None,))[0]) if w3 else None
    p("### Acceptance (issue 27, points 2 and 3; on the medians above)")
    p(check(at_least(r5i, 2.0), "W5 int8 at least 2× kiln's f32 W5 (%s)" % x(r5i)))
    p(check(at_least(r5b, 1.6), "W5 bf16 at least 1.6× kiln's f32 W5 (%s)" % x(r5b)))
    p(check(None if r3 is None else r3 > 1.0, "W3 int8 faster than W3 bf16 (bf16 / int8 %s)" % x(r3)))
    missed = sorted(s for s, v in int8_gemm.items() if v is None or v < 0.95)
    p(check(None if not int8_gemm else not missed,
            "int8 linear at least 95%% of oneDNN's int8 matmul on every model shape (paired; lowest %s%s)" % (
                fmt(100 * min(v for v in int8_gemm.values() if v) if any(int8_gemm.values()) else None) + "%",
                "; below: " + ", ".join(missed) if missed else "")))
    fl = lambda key, dt: floors.get(key, {}).get(dt)  # noqa: E731
    p(check(at_most(fl("W1", "f32"), 1.15), "W1 f32 within 1.15× of its compute floor (%s)" % x(fl("W1", "f32"))))
    p(check(at_most(fl("W4", "f32"), 1.1), "W4 f32 within 1.1× of its compute floor (%s)" % x(fl("W4", "f32"))))
    p(check(at_most(fl("W5", "f32"), 1.3), "W5 f32 within 1.3× of its compute floor (%s)" % x(fl("W5", "f32"))))
    p(check(at_most(fl("W2", "bf16"), 1.15), "W2 bf16 within 1.15× of the bf16 floor (%s)" % x(fl("W2", "bf16"))))
    p(check(at_most(fl("W4", "bf16"), 1.15), "W4 bf16 within 1.15× of the bf16 floor (%s)" % x(fl("W4", "bf16"))))
    p("- int8's distance to its floor (report only): " + ", ".join(
        "%s %s" % (key, x(fl(key, "int8"))) for key, _, _, _, _ in rows))
    p("")
    restricted_section(p, grounds, table)
    plot_tokens(p, rounds, gen, table, res)


RESTRICTED = "W5_beam4_b32_s32_n32_vocab4096"


def restricted_section(p, grounds, table):
    """W5 with the search restricted to 4096 target ids (kiln_search_options::vocabulary:
    decode_step_restricted, the generator's rows of those ids only) beside W5, per build."""
    ms = {}
    for dt, prefix, _ in DTYPES:
        times = []
        for g in grounds:
            e = find(g["entries"], prefix + RESTRICTED)
            times.append(to_ms(e) if e is not None and not e.get("error_occurred") else None)
        ms[dt] = best_of(times)
    if not any(ms.values()):
        return
    w5 = table.get("W5", {})
    p("### Vocabulary restriction (issue 27, optional): W5 choosing among 4096 of 32000 target ids")
    p("")
    p("| build | W5 ms | W5 restricted ms | W5 / restricted | target tok/s W5 / restricted |")
    p("|---|---:|---:|---:|---|")
    for dt, _, _ in DTYPES:
        full = w5.get(dt, (None,))[0]
        r = ms[dt]
        if not full and not r:
            continue
        p("| %s | %s | %s | %s | %s / %s |" % (
            dt, fmt(full), fmt(r), fmt(full / r, 2) + "×" if full and r else "—",
            fmt(1024 / (full / 1e3) if full else None, 0), fmt(1024 / (r / 1e3) if r else None, 0)))
    p("")
    p("Each build's median per round, best round shown. The restricted search runs "
      "decode_step_restricted: restrict-vocabulary turns the generator into linear_rows over the "
      "4096 ids' rows of its weight (each build's: f32, the packed bf16 weight with the library's "
      "form of the products, the packed int8 weight); random ids from a fixed "
      "seed, the end token among them (the outputs differ from W5's, the work per step does not "
      "depend on which ids).")
    p("")


def plot_tokens(p, rounds, gen, table, res):
    """The tokens/s of W3 and W5 per engine and dtype as an SVG (python3-matplotlib; skipped
    without it): KILN_BENCH_PLOT names the file (default bench/tokens_per_s.svg; "0": none)."""
    out = os.environ.get("KILN_BENCH_PLOT", os.path.join(HERE, "tokens_per_s.svg"))
    if out == "0" or not gen:
        return
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        p("(no plot: python3-matplotlib is not installed)")
        p("")
        return
    bars = []  # (label, {key: tokens/s})
    for dt, _, _ in DTYPES:
        bars.append(("kiln " + dt, {w["key"]: table[w["key"]][dt][0] for w in gen}))
    for label, field in (("PyTorch f32", "best_generation"), ("PyTorch bf16 autocast", "best_generation_bf16")):
        bars.append((label, {w["key"]: best_of(((rd["pt"].get(field) or {}).get(w["key"]) or {}).get("median_ms")
                                               for rd in rounds) for w in gen}))
    bars.append(("ONNX Runtime f32", {w["key"]: best_of(((rd["ort"].get("generation") or {}).get(w["key"]) or {})
                                                        .get("median_ms") for rd in rounds) for w in gen}))
    bars = [(label, ms) for label, ms in bars if any(ms.values())]
    fig, axes = plt.subplots(1, len(gen), figsize=(5 * len(gen), 3.6))
    axes = axes if len(gen) > 1 else [axes]
    cpu = ""
    try:
        with open(os.path.join(res, "machine.log")) as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    for ax, w in zip(axes, gen):
        n = w["batch"] * w["new_tokens"]
        labels = [label for label, _ in bars]
        values = [n / (ms[w["key"]] / 1e3) if ms.get(w["key"]) else 0 for _, ms in bars]
        colors = ["#1f77b4" if lb.startswith("kiln") else "#999999" for lb in labels]
        ax.barh(labels[::-1], values[::-1], color=colors[::-1])
        for y, v in enumerate(values[::-1]):
            ax.text(v, y, " %.0f" % v if v else " —", va="center", fontsize=8)
        what = "greedy" if w["beam"] == 1 else "beam %d" % w["beam"]
        ax.set_title("%s: %s, batch %d, %d new tokens" % (w["key"], what, w["batch"], w["new_tokens"]), fontsize=9)
        ax.set_xlabel("target tokens/s (higher is better)", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.set_xlim(0, max(values + [1]) * 1.18)
    fig.suptitle("kiln vs peers, 2 threads%s" % (" (" + cpu + ")" if cpu else ""), fontsize=9)
    fig.tight_layout()
    svg = out.endswith(".svg")
    fig.savefig(out, format="svg" if svg else None, metadata={"Date": None} if svg else None)
    plt.close(fig)
    shown = os.path.relpath(out, os.path.dirname(HERE))
    p("Plot: %s (target tokens/s per engine and dtype, each one's best round)." % (
        out if shown.startswith("..") else shown))
    p("")


def machine_and_problems(p, res):
    for name in ("machine.log", "status.log"):
        try:
            with open(os.path.join(res, name)) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text:
            p("### %s" % ("Machine" if name == "machine.log" else "Problems"))
            p("")
            p("```")
            p(text)
            p("```")
            p("")


def gpu_kernels(p, notes, res):
    """gpu_kernel_bench (kernels-kiln.json) against gpu_kernels_peer.py (kernels-pytorch.json):
    per GEMM shape and attention case, PyTorch's µs over kiln's default schedule's (above 1:
    kiln is faster), the schedule before issue 30 (legacy) and the fastest variant measured."""
    kd = load(os.path.join(res, "kernels-kiln.json"))
    pd = load(os.path.join(res, "kernels-pytorch.json")) or {}
    if not kd:
        return
    kiln = {}
    for b in kd.get("benchmarks", []):
        name = b["name"].split("/min_time")[0].split("/real_time")[0]
        if b.get("error_occurred"):
            notes.append("kiln kernel %s: skipped: %s" % (name, b.get("error_message")))
        elif "s_per_call" in b:
            kiln[name] = b["s_per_call"] * 1e6
    peer = {k: v["s_per_call"] * 1e6 for k, v in (pd.get("results") or {}).items()}
    for kind, title in (("gemm", "GEMM: kiln `linear` vs torch.addmm (cuBLAS SGEMM)"),
                        ("attention", "Attention: kiln's fused attention vs scaled_dot_product_attention")):
        cases, variants = [], []
        for n in kiln:
            parts = n.split("/")
            if parts[0] != kind:
                continue
            case = "/".join(parts[2:])
            if case not in cases:
                cases.append(case)
            if parts[1] not in variants:
                variants.append(parts[1])
        if not cases:
            continue
        p("### %s, µs per call" % title)
        p("")
        p("| %s | PyTorch µs | kiln µs | PyTorch/kiln | kiln GFLOP/s | legacy µs | fastest variant (µs) |" % (
            "shape" if kind == "gemm" else "case"))
        p("|---|---:|---:|---:|---:|---:|---|")
        for case in cases:
            t = peer.get("%s/%s" % (kind, case))
            k = kiln.get("%s/default/%s" % (kind, case))
            lg = kiln.get("%s/legacy/%s" % (kind, case))
            best = min(((kiln[n], n.split("/")[1]) for n in kiln
                        if n.startswith(kind + "/") and n.endswith("/" + case)), default=None)
            gflop = None
            for b in kd.get("benchmarks", []):
                if b["name"].startswith("%s/default/%s/" % (kind, case)) and "GFLOP/s" in b:
                    gflop = b["GFLOP/s"]
            p("| %s | %s | %s | %s | %s | %s | %s |" % (
                case, fmt(t), fmt(k), fmt(t / k if t and k else None, 2) + ("×" if t and k else ""),
                fmt(gflop, 0), fmt(lg), "%s (%.1f)" % (best[1], best[0]) if best else "—"))
        p("")
        if len(variants) > 2:
            p("Every variant (µs; columns as bench/CMakeLists.txt names them):")
            p("")
            p("| case | " + " | ".join(variants) + " |")
            p("|---|" + "---:|" * len(variants))
            for case in cases:
                p("| %s | %s |" % (case, " | ".join(
                    fmt(kiln.get("%s/%s/%s" % (kind, v, case))) for v in variants)))
            p("")


def gpu_main(res):
    """bench/run_gpu.sh's report: the CUDA tests, kiln's CUDA build against PyTorch eager FP32
    and torch.compile on the same GPU (round*/kiln.json, round*/pytorch.json), the kernels
    on their own (kernels-*.json) and kiln's per-kernel profile (round1/kiln-profile.txt)."""
    with open(os.path.join(HERE, "workloads.json")) as f:
        workloads = json.load(f)["workloads"]
    dirs = sorted((os.path.join(res, d) for d in os.listdir(res) if d.startswith("round")),
                  key=lambda d: int(os.path.basename(d)[5:] or 0))
    rounds = []
    for d in dirs or [res]:
        doc = load(os.path.join(d, "kiln.json"))
        rounds.append({"dir": d, "kiln": gbench_entries(doc), "kiln_doc": doc,
                       "pt": load(os.path.join(d, "pytorch.json")) or {}})
    lines = []
    p = lines.append
    notes = []

    def peer_ms(rd, key, compiled):
        for s in rd["pt"].get("settings", []):
            if bool(s.get("torch_compile")) == compiled and not s.get("error"):
                return (s.get("workloads") or {}).get(key, {}).get("median_ms")
        return None

    def kiln_ms(rd, name, key, tag):
        e = find(rd["kiln"], name)
        if e is None:
            notes.append("%s kiln %s (%s): no result" % (tag, key, name))
        elif e.get("error_occurred"):
            notes.append("%s kiln %s: skipped: %s" % (tag, name, e.get("error_message")))
        else:
            return to_ms(e), e.get("GFLOP")
        return None, None

    device = next((s.get("device_name") for rd in rounds for s in rd["pt"].get("settings", [])
                   if s.get("device_name")), None)
    tests = []
    for log in ("device_tests.log", "gpu_models_tests.log"):
        try:
            with open(os.path.join(res, log)) as f:
                text = f.read()
        except OSError:
            continue
        tests.append((log, [l for l in text.splitlines()
                            if l.startswith(("[       OK", "[  FAILED", "[  PASSED", "[  SKIPPED ]", "[ cuda ]"))
                            and "listed below" not in l]))
    if tests:
        p("## CUDA tests on %s" % (device or "the GPU"))
        p("")
        for log, ls in tests:
            p("%s:" % log)
            p("")
            p("```")
            p("\n".join(ls))
            p("```")
            p("")
    p("## kiln (CUDA build) vs PyTorch eager FP32 vs torch.compile on %s (best of %d round%s)" % (
        device or "the GPU", len(rounds), "s" if len(rounds) > 1 else ""))
    p("")
    p("| workload | GFLOP | kiln ms (device tensors) | kiln ms (host I/O) | kiln legacy GEMM ms | "
      "PyTorch eager ms | torch.compile ms | eager/kiln | compile/kiln | kiln GFLOP/s |")
    p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = {}
    per_round = {}
    for w in workloads:
        key = w["key"]
        times = []
        for rd in rounds:
            tag = os.path.basename(rd["dir"])
            d_ms, gflop = kiln_ms(rd, "device/" + w["kiln_name"], key, tag)
            h_ms, _ = kiln_ms(rd, w["kiln_name"], key, tag)
            l_ms, _ = kiln_ms(rd, "legacy/" + w["kiln_name"], key, tag)
            times.append((d_ms, gflop, peer_ms(rd, key, False), peer_ms(rd, key, True), h_ms, l_ms))
        per_round[key] = times
        k_ms = best_of(t[0] for t in times)
        gflop = next((t[1] for t in times if t[1]), None)
        e_ms = best_of(t[2] for t in times)
        c_ms = best_of(t[3] for t in times)
        h_ms = best_of(t[4] for t in times)
        l_ms = best_of(t[5] for t in times)
        re = e_ms / k_ms if e_ms and k_ms else None
        rc = c_ms / k_ms if c_ms and k_ms else None
        rows[key] = dict(re=re, rc=rc, k=k_ms, l=l_ms)
        shape = "%s B=%d S=%d" % (w["function"], w["batch"], w["src_len"]) + \
            (" T=%d" % w["tgt_len"] if w["function"] == "forward" else "")
        p("| %s %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            key, shape, fmt(gflop, 2), fmt(k_ms, 2), fmt(h_ms, 2), fmt(l_ms, 2), fmt(e_ms, 2),
            fmt(c_ms, 2), fmt(re, 2) + ("×" if re else ""), fmt(rc, 2) + ("×" if rc else ""),
            fmt(gflop / (k_ms / 1e3) if gflop and k_ms else None)))
    p("")
    p("ms: each engine's median per round, best round shown; ratios are peer ms / kiln ms with device "
      "tensors (above 1: kiln is faster). kiln, device tensors: ids uploaded once, logits left on the "
      "device (kiln_model_run_device), each call ended by a device sync, as PyTorch's calls (device "
      "tensors, torch.cuda.synchronize()); host I/O: host ids in and host logits out through "
      "kiln_model_run, as an application without device tensors calls it; legacy GEMM: the same model "
      "compiled with the GPU GEMM schedule before issue 30 (KILN_GPU_LINEAR=legacy), device tensors. "
      "FP32 everywhere (TF32 off in PyTorch; kiln's kernels use no tensor cores).")
    p("")

    def check(cond, text):
        return "- n/a: %s (missing numbers)" % text if cond is None else "- %s: %s" % (
            "met" if cond else "MISSED", text)
    p("### Acceptance (issue 30; device tensors, on the medians above)")
    for key in ("W2", "W4"):
        r = rows.get(key, {}).get("re")
        p(check(None if r is None else r > 1.0, "%s kiln faster than PyTorch eager (ratio %s)" % (key, fmt(r, 2))))
    for key in ("W1", "W2", "W4"):
        r = rows.get(key, {})
        if r.get("k") and r.get("l"):
            p("- %s: GEMM schedule before issue 30 %.2f ms, now %.2f ms (%.2f×)" % (
                key, r["l"], r["k"], r["l"] / r["k"]))
    p("")
    p("### Every round (median ms: kiln device / eager / torch.compile)")
    p("")
    p("| round | " + " | ".join(w["key"] for w in workloads) + " |")
    p("|---|" + "---|" * len(workloads))
    for i, rd in enumerate(rounds):
        p("| %s | %s |" % (os.path.basename(rd["dir"]), " | ".join(
            "%s / %s / %s" % tuple(fmt(x, 2) for x in per_round[w["key"]][i][0:1] + per_round[w["key"]][i][2:4])
            for w in workloads)))
    p("")
    p("### Same ids, W1 shape: logits against PyTorch (CPU reference)")
    for label, name in (("kiln (CUDA)", "check_vs_pytorch"), ("kiln (CUDA, legacy GEMM)", "legacy/check_vs_pytorch")):
        ce = find(rounds[0]["kiln"], name)
        if ce and not ce.get("error_occurred"):
            p("- %s: max |Δ| vs PyTorch f32 %.3g, vs f64 %.3g (max |logit| %.3g)" % (
                label, ce["max_abs_err"], ce["max_abs_err_f64"], ce["max_abs_logit"]))
        else:
            p("- %s: not checked: %s" % (label, ce.get("error_message") if ce else "no result"))
    p("")
    for rd in rounds[:1]:
        for s in rd["pt"].get("settings", []):
            if s.get("error"):
                notes.append("PyTorch %s: %s" % (s.get("name"), s["error"]))
            elif s.get("torch_compile"):
                p("torch.compile warm-up (compiles included), round 1: " + ", ".join(
                    "%s %s ms" % (k, fmt(v.get("warmup_ms"), 0)) for k, v in s.get("workloads", {}).items()))
                p("")
    gpu_kernels(p, notes, res)
    prof = os.path.join(dirs[0] if dirs else res, "kiln-profile.txt")
    try:
        with open(prof) as f:
            text = f.read().strip()
    except OSError:
        text = ""
    if text:
        p("### kiln's per-kernel profile (device tensors, each kernel synced; round 1)")
        p("")
        p("```")
        p(text)
        p("```")
        p("")
    if notes:
        p("### Notes")
        p("")
        for n in notes:
            p("- " + n)
        p("")
    machine_and_problems(p, res)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--gpu":
        sys.exit(gpu_main(sys.argv[2]))
    sys.exit(main())
