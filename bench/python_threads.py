#!/usr/bin/env python3
"""Python threads on one kiln model (issue 28): the kiln module releases the GIL while the
kernels run, so T Python threads calling one model run T calls at once. Times the same
calls from 1 thread and from T threads (the model's kernels on one thread each:
model.set_num_threads(1)), in one process, interleaved rounds, and prints calls/s and the
speed-up (T threads / 1 thread) as a Markdown row. A speed-up, not a timed test.

    python3 bench/python_threads.py LIBRARY WEIGHTS INPUTS [--threads 4] [--calls 200]

LIBRARY: a directory from kiln compile --emit=shared (e.g. the test suite's
build/tests/python_models/py_small); WEIGHTS its safetensors; INPUTS a safetensors file
with the forward entry point's inputs by name (e.g. tests/golden/small_b1.inputs.safetensors).
"""
import argparse
import json
import os
import struct
import sys
import threading
import time

import numpy as np

import kiln


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        dtype = {"F32": np.float32, "I64": np.int64}[info["dtype"]]
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + b:8 + n + e], dtype=dtype).reshape(info["shape"])
    return out


def timed(model, inputs, threads, calls):
    per = calls // threads
    start = threading.Barrier(threads + 1)

    def work():
        start.wait()
        for _ in range(per):
            model.forward(**inputs)
    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    return per * threads / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("library")
    ap.add_argument("weights")
    ap.add_argument("inputs")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    model = kiln.Model(args.library, args.weights, threads=1)
    inputs = read_safetensors(args.inputs)
    model.forward(**inputs)  # warm-up
    one, many = [], []
    for _ in range(args.rounds):
        one.append(timed(model, inputs, 1, args.calls))
        many.append(timed(model, inputs, args.threads, args.calls))
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print("| model | calls | 1 thread calls/s | %d threads calls/s | speed-up | CPU (cores) |" % args.threads)
    print("|---|---:|---:|---:|---:|---|")
    print("| %s forward | %d × %d rounds | %.1f | %.1f | %.2f× | %s (%d) |" % (
        model.name, args.calls, args.rounds, max(one), max(many), max(many) / max(one), cpu,
        os.cpu_count()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
