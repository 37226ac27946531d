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
  3. --onnx-dir: exports forward (src, tgt -> logits) and encode (src -> memory) with
     torch.onnx.export (TorchScript tracer, opset 17, dynamic batch and lengths) to
     forward.onnx and encode.onnx. A failure is recorded in the JSON with its reason.
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

Ids are drawn from torch's seeded generator, uniform in [1, vocab) (no padding): the
shapes match the other engines', the ids themselves do not (the cost does not depend on
them).
"""

import argparse
import collections
import json
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


def blas_probe(threads):
    """GFLOP/s of one 2048x512 @ 512x2048 matmul: tells a usable BLAS from netlib's."""
    a = torch.randn(2048, 512)
    b = torch.randn(512, 2048)
    a @ b
    t0 = time.perf_counter()
    a @ b
    dt = time.perf_counter() - t0
    return 2.0 * 2048 * 512 * 2048 / dt / 1e9


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
    probe = blas_probe(args.threads)
    out = {"blas": blas, "is_openblas": any("openblas" in b for b in blas),
           "probe_gflops": round(probe, 1), "torch_num_threads": torch.get_num_threads(),
           "load_ms": round(load_ms, 1), "rss_after_load_mib": round(rss_after_load, 1),
           "workloads": {}}
    slow = probe < args.slow_gflops
    for w in load_workloads():
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
        with torch.inference_mode():
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
    # Peak over the load and every workload run (ru_maxrss is in KiB on Linux).
    out["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)
    json.dump(out, sys.stdout)


def run_setting(args, name, env_changes):
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OMP_WAIT_POLICY", None)
    env["OPENBLAS_NUM_THREADS"] = str(args.threads)
    env["OMP_NUM_THREADS"] = str(args.threads)
    env.update(env_changes)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--weights", args.weights,
           "--threads", str(args.threads), "--runs", str(args.runs), "--warmup", str(args.warmup),
           "--slow-gflops", str(args.slow_gflops), "--max-seconds", str(args.max_seconds)]
    print("peers.py: PyTorch with %s" % name, file=sys.stderr)
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        return {"name": name, "env": env_changes, "error": "worker exited with %d" % p.returncode}
    res = json.loads(p.stdout)
    res["name"] = name
    res["env"] = env_changes
    return res


def bench(args, onnx_result):
    """Runs every BLAS setting, or with --only-settings-from FILE (an earlier pytorch.json)
    only the settings that were best there (bench/run.sh's later rounds)."""
    only = None
    if args.only_settings_from:
        with open(args.only_settings_from) as f:
            only = {b["setting"] for b in json.load(f).get("best", {}).values()}

    def run(name, env):
        if only is None or name in only:
            settings.append(run_setting(args, name, env))

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
    best = {}
    for w in load_workloads():
        key = w["key"]
        cands = [(s["workloads"][key]["median_ms"], s["name"]) for s in settings
                 if "workloads" in s and "median_ms" in s["workloads"].get(key, {})]
        if cands:
            ms, name = min(cands)
            best[key] = {"median_ms": ms, "setting": name}
    return {"engine": "pytorch", "torch_version": torch.__version__, "threads": args.threads,
            "runs": args.runs, "warmup": args.warmup, "settings": settings, "best": best,
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
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.weights = args.weights or args.weights_out
    if args.worker:
        return worker(args)
    if not args.weights:
        ap.error("give --weights-out (or --weights)")
    if args.weights_out and (args.force or not os.path.exists(args.weights_out)):
        write_weights(args.weights_out)
    if args.reference_out and (args.force or not os.path.exists(args.reference_out)):
        write_reference(args.weights, args.reference_out)
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
    if args.json_out:
        result = bench(args, onnx_result)
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=1)
        print("peers.py: wrote %s" % args.json_out, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
