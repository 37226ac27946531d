#!/usr/bin/python3
"""The paper's base Transformer imported from ONNX (`kiln import`) against the same model
written in kiln's DSL, on the forward workloads W1, W2 and W4, side by side in one run, as
ratios (issue 29: the imported model within 5% of the DSL's).

  /usr/bin/python3 bench/onnx_import_bench.py --kiln build/tools/kiln [--work /tmp/kiln-bench]
      [--rounds 5] [--repeat 10] [--threads 2] [--json-out FILE]

Needs bench/peers.py's files in --work: base.safetensors (the checkpoint every engine runs)
and forward.onnx / encode.onnx (torch.onnx.export of the same PyTorch model at opset 17 with
dynamic B, S, T; `bench/run.sh`, or `peers.py --weights-out W --onnx-dir DIR`, writes them).

  1. The DSL model: `kiln emit transformer --config base --set max_len=1024` (as model_bench
     compiles it), `kiln compile --emit=shared`.
  2. The imported model: `kiln import forward.onnx` and `encode.onnx` (--dim B=16 --dim
     S=1024 --dim T=1024: the DSL model's maxima), each compiled the same way. Both go through
     the same default pipeline; `kiln inspect --ops` of each is printed.
  3. Inputs of bench/workloads.json's forward workloads: random ids in [1, vocab).
  4. --rounds rounds; in each, every workload runs on both engines (which goes first
     alternates) as `kiln run --compiled DIR --repeat N --profile --threads T`; the time is the
     profile's "ms per run" (kernel time of N runs after loading, so the 375 MB load is not
     counted). Reported: the median per engine and workload, and imported / DSL.
"""

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "golden"))
import make_golden  # noqa: E402
VOCAB = 32000


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        name = re.search(r"model name\s*:\s*(.*)", info).group(1)
        family = re.search(r"cpu family\s*:\s*(\d+)", info).group(1)
        model = re.search(r"^model\s*:\s*(\d+)", info, re.M).group(1)
        return "%s (family %s, model %s)" % (name, family, model)
    except (OSError, AttributeError):
        return platform.processor()


def write_ids(path, tensors):
    """I64 ids by name, with the golden data's writer (tests/golden/make_golden.py)."""
    make_golden.write_safetensors(
        path, [(name, torch.from_numpy(np.ascontiguousarray(tensors[name], dtype=np.int64)))
               for name in sorted(tensors)])


def run(argv, **kw):
    r = subprocess.run(argv, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit("onnx_import_bench.py: %s failed:\n%s%s" % (" ".join(argv), r.stdout, r.stderr))
    return r


def newer(path, *sources):
    return os.path.exists(path) and all(os.path.getmtime(path) >= os.path.getmtime(s)
                                        for s in sources)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--work", default="/tmp/kiln-bench")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json-out")
    a = ap.parse_args()
    kiln = os.path.abspath(a.kiln)
    work = a.work
    out = os.path.join(work, "onnx_import")
    os.makedirs(out, exist_ok=True)
    weights = os.path.join(work, "base.safetensors")
    for f in (weights, os.path.join(work, "forward.onnx"), os.path.join(work, "encode.onnx")):
        if not os.path.exists(f):
            sys.exit("onnx_import_bench.py: %s is missing: run bench/run.sh (or peers.py "
                     "--weights-out %s --onnx-dir %s) first" % (f, weights, work))

    # 1. The DSL model.
    dsl_kir = os.path.join(out, "dsl.kir")
    dsl_lib = os.path.join(out, "dsl")
    if not newer(os.path.join(dsl_lib, "libbase.so"), kiln):
        run([kiln, "emit", "transformer", "--config", "base", "--set", "max_len=1024", "-o", dsl_kir])
        run([kiln, "compile", dsl_kir, "--emit=shared", "--name", "base", "-o", dsl_lib])
    # 2. The imported model (forward and encode).
    libs = {"dsl": {"forward": (dsl_lib, weights), "encode": (dsl_lib, weights)}, "imported": {}}
    for fn in ("forward", "encode"):
        onnx = os.path.join(work, fn + ".onnx")
        kir = os.path.join(out, "imported_%s.kir" % fn)
        w = os.path.join(out, "imported_%s.safetensors" % fn)
        lib = os.path.join(out, "imported_" + fn)
        dims = ["--dim", "B=16", "--dim", "S=1024"] + (["--dim", "T=1024"] if fn == "forward" else [])
        if not newer(os.path.join(lib, "libimported_%s.so" % fn), kiln, onnx):
            run([kiln, "import", onnx, "-o", kir, "--weights-out", w, "--function", fn] + dims)
            run([kiln, "compile", kir, "--emit=shared", "--name", "imported_" + fn, "-o", lib])
        libs["imported"][fn] = (lib, w)
    for name, kir in (("DSL", dsl_kir), ("imported forward", os.path.join(out, "imported_forward.kir"))):
        opt = kir.replace(".kir", ".opt.kir")
        run([kiln, "opt", kir, "-o", opt])
        ops = run([kiln, "inspect", "--ops", opt]).stdout.split("\n")
        fused = [l for l in ops if l.startswith("forward") and
                 any(k in l for k in (" attention ", " add_layernorm ", " layernorm ", " linear ", " softmax "))]
        print("%s: %s" % (name, ", ".join(" ".join(l.split()[1:]) for l in fused)))

    # 3. Inputs.
    with open(os.path.join(HERE, "workloads.json")) as f:
        workloads = json.load(f)["workloads"]
    rng = np.random.default_rng(29)
    inputs = {}
    for w in workloads:
        t = {"src": rng.integers(1, VOCAB, (w["batch"], w["src_len"]))}
        if w["function"] == "forward":
            t["tgt"] = rng.integers(1, VOCAB, (w["batch"], w["tgt_len"]))
        path = os.path.join(out, w["key"] + ".inputs.safetensors")
        write_ids(path, t)
        inputs[w["key"]] = path

    # 4. Rounds.
    times = {(w["key"], e): [] for w in workloads for e in ("dsl", "imported")}
    for r in range(a.rounds):
        for w in workloads:
            order = ("dsl", "imported") if r % 2 == 0 else ("imported", "dsl")
            for engine in order:
                lib, wts = libs[engine][w["function"]]
                res = run([kiln, "run", "--compiled", lib, "--weights", wts, "--inputs",
                           inputs[w["key"]], "--function", w["function"], "--repeat",
                           str(a.repeat), "--profile", "--threads", str(a.threads)])
                m = re.search(r"ran \d+ time\(s\), ([0-9.]+) ms per run", res.stderr)
                if not m:
                    sys.exit("onnx_import_bench.py: no profile line in:\n" + res.stderr)
                times[(w["key"], engine)].append(float(m.group(1)))
        print("round %d/%d done" % (r + 1, a.rounds), file=sys.stderr)

    print("\nCPU: %s; %d threads; %d rounds of %d runs; median ms per run (kernel time)"
          % (cpu_name(), a.threads, a.rounds, a.repeat))
    print("| workload | DSL ms | imported ms | imported / DSL |")
    print("| --- | ---: | ---: | ---: |")
    result = {"cpu": cpu_name(), "threads": a.threads, "rounds": a.rounds, "repeat": a.repeat,
              "workloads": {}}
    for w in workloads:
        d = statistics.median(times[(w["key"], "dsl")])
        i = statistics.median(times[(w["key"], "imported")])
        print("| %s | %.2f | %.2f | %.3f |" % (w["kiln_name"], d, i, i / d))
        result["workloads"][w["key"]] = {"dsl_ms": times[(w["key"], "dsl")],
                                         "imported_ms": times[(w["key"], "imported")],
                                         "ratio": i / d}
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
