#!/usr/bin/python3
"""The table of bench/run.sh's results (python3 standard library only).

  bench/report.py RESULTS_DIR        # kiln.json (or peak.json), pytorch.json, ort.json,
                                     # gemm.json, machine.log, status.log
Prints Markdown: per workload kiln / PyTorch / ONNX Runtime ms, ratios (peer ms / kiln
ms: above 1 = kiln is faster), kiln's GFLOP/s and its share of the FMA peak measured in
the same run, the issue's acceptance checks (met or MISSED), correctness against
PyTorch, every PyTorch BLAS setting, and kiln's GEMM kernel against oneDNN.
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


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    res = sys.argv[1]
    with open(os.path.join(HERE, "workloads.json")) as f:
        workloads = json.load(f)["workloads"]
    kiln_doc = load(os.path.join(res, "kiln.json"))
    kiln = gbench_entries(kiln_doc)
    if not kiln:
        kiln = gbench_entries(load(os.path.join(res, "peak.json")))
    pt = load(os.path.join(res, "pytorch.json")) or {}
    ort = load(os.path.join(res, "ort.json")) or {}
    lines = []
    p = lines.append

    peak_e = find(kiln, "peak")
    peak = peak_e.get("GFLOP/s") if peak_e and not peak_e.get("error_occurred") else None
    threads = os.environ.get("KILN_BENCH_THREADS", "2")
    p("## kiln vs PyTorch vs ONNX Runtime (%s threads each)" % threads)
    p("")
    p("| workload | GFLOP | kiln ms | PyTorch best ms | ORT ms | PyTorch/kiln | ORT/kiln "
      "| kiln GFLOP/s | % of peak |")
    p("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = {}
    notes = []
    for w in workloads:
        key = w["key"]
        e = find(kiln, w["kiln_name"])
        k_ms = k_gf = gflop = None
        if e is None:
            notes.append("kiln %s: no result (model_bench not run or filtered)" % key)
        elif e.get("error_occurred"):
            notes.append("kiln %s: skipped: %s" % (key, e.get("error_message")))
        else:
            k_ms, k_gf, gflop = to_ms(e), e.get("GFLOP/s"), e.get("GFLOP")
        pb = (pt.get("best") or {}).get(key)
        p_ms = pb["median_ms"] if pb else None
        ow = (ort.get("workloads") or {}).get(key, {})
        o_ms = ow.get("median_ms")
        if not o_ms and ow:
            notes.append("ORT %s: %s" % (key, ow.get("skipped") or ow.get("error")))
        rp = p_ms / k_ms if p_ms and k_ms else None
        ro = o_ms / k_ms if o_ms and k_ms else None
        pct = 100.0 * k_gf / peak if k_gf and peak else None
        rows[key] = dict(k_ms=k_ms, p_ms=p_ms, o_ms=o_ms, rp=rp, ro=ro, pct=pct)
        shape = "%s B=%d S=%d" % (w["function"], w["batch"], w["src_len"]) + \
            (" T=%d" % w["tgt_len"] if w["function"] == "forward" else "")
        p("| %s %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            key, shape, fmt(gflop, 2), fmt(k_ms), fmt(p_ms), fmt(o_ms),
            fmt(rp, 2) + ("×" if rp else ""), fmt(ro, 2) + ("×" if ro else ""), fmt(k_gf), fmt(pct)))
    p("")
    p("Peak (FP32 FMA, measured in the same process as kiln): %s GFLOP/s%s." % (
        fmt(peak), " (%s)" % peak_e.get("label", "") if peak_e else ""))
    for key, b in sorted((pt.get("best") or {}).items()):
        p("PyTorch best for %s: %s." % (key, b["setting"]))
    p("")

    # Acceptance.
    def check(cond, text):
        if cond is None:
            return "- n/a: %s (missing numbers)" % text
        return "- %s: %s" % ("met" if cond else "MISSED", text)

    def gt1(x):
        return None if x is None else x > 1.0

    p("### Acceptance (issue)")
    p(check(gt1(rows["W2"]["rp"]), "W2 kiln faster than PyTorch (ratio %s)" % fmt(rows["W2"]["rp"], 2)))
    p(check(gt1(rows["W2"]["ro"]), "W2 kiln faster than ONNX Runtime (ratio %s)" % fmt(rows["W2"]["ro"], 2)))
    p(check(gt1(rows["W4"]["rp"]), "W4 kiln faster than PyTorch (ratio %s)" % fmt(rows["W4"]["rp"], 2)))
    p(check(gt1(rows["W4"]["ro"]), "W4 kiln faster than ONNX Runtime (ratio %s)" % fmt(rows["W4"]["ro"], 2)))
    p(check(gt1(rows["W1"]["rp"]), "W1 kiln faster than PyTorch (ratio %s)" % fmt(rows["W1"]["rp"], 2)))
    pct = rows["W2"]["pct"]
    p(check(None if pct is None else pct >= 60.0, "W2 at >= 60%% of the measured peak (%s%%)" % fmt(pct)))
    p("")

    # Correctness on the same ids (W1 shape).
    p("### Same ids, W1 shape: logits against PyTorch")
    meta = safetensors_metadata(os.path.join(os.path.dirname(os.path.abspath(res)), "reference.safetensors"))
    ce = find(kiln, "check_vs_pytorch")
    if ce and not ce.get("error_occurred"):
        p("- kiln: max |Δ| vs PyTorch f32 %.3g, vs f64 %.3g (max |logit| %.3g)" % (
            ce["max_abs_err"], ce["max_abs_err_f64"], ce["max_abs_logit"]))
    elif ce:
        p("- kiln: not checked: %s" % ce.get("error_message"))
    oc = ort.get("check_vs_pytorch")
    if oc:
        p("- ONNX Runtime: max |Δ| vs PyTorch f32 %.3g, vs f64 %.3g" % (oc["max_abs_err"], oc["max_abs_err_f64"]))
    if "pytorch_f32_vs_f64_max_abs" in meta:
        p("- PyTorch f32 itself vs f64: %s (the golden-style init makes this model ill-conditioned)"
          % meta["pytorch_f32_vs_f64_max_abs"])
    p("")

    # Every PyTorch setting.
    if pt.get("settings"):
        p("### PyTorch %s, every BLAS setting (median ms)" % pt.get("torch_version", ""))
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
        skipped = {r.get("skipped") for s in pt["settings"] for r in s.get("workloads", {}).values()
                   if r.get("skipped")}
        for reason in sorted(skipped):
            p("")
            p("skipped: %s" % reason)
        p("")
    ox = pt.get("onnx_export") or {}
    if ox.get("errors"):
        for k, v in ox["errors"].items():
            p("- ONNX export of %s failed: %s" % (k, v))
    if ort:
        p("ONNX Runtime: onnxruntime-node %s, graphOptimizationLevel 'all', intraOpNumThreads %s." % (
            (ort.get("version") or {}).get("node", "?"), ort.get("threads")))
    p("")

    # GEMM.
    gemm = gbench_entries(load(os.path.join(res, "gemm.json")))
    if gemm:
        p("### GEMM: kiln's linear kernel vs oneDNN (gemm_bench, GFLOP/s)")
        p("")
        p("| shape | kiln | oneDNN | kiln/oneDNN | kiln % of peak |")
        p("|---|---:|---:|---:|---:|")
        shapes = sorted({rn.split("/")[1] for rn in gemm if rn.startswith("kiln/")},
                        key=lambda s: [int(t[1:]) if t[1:].isdigit() else 0 for t in s.split("_")[:3]])
        for s in shapes:
            k = find(gemm, "kiln/" + s)
            d = find(gemm, "onednn/" + s)
            kg = k.get("GFLOP/s") if k and not k.get("error_occurred") else None
            dg = d.get("GFLOP/s") if d and not d.get("error_occurred") else None
            p("| %s | %s | %s | %s | %s |" % (s, fmt(kg), fmt(dg), fmt(kg / dg * 100 if kg and dg else None) + "%",
                                             fmt(kg / peak * 100 if kg and peak else None) + "%"))
        p("")

    # Machine and problems.
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
    if notes:
        p("### Notes")
        for n in notes:
            p("- " + n)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
