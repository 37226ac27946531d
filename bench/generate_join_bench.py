#!/usr/bin/env python3
"""kiln serve's /generate on a decoder-only model under concurrent load (bench/README.md,
"kiln serve"): C client threads each post R requests (one prompt of 1 to 5 random ids,
max_decoding_length 4 to 24, greedy) with requests joining the running generation at step
boundaries (the default: kiln_generator_*, docs/generation.md) and each run alone
(--no-batching); prints a markdown row per setting: requests/s, generated tokens/s, the p50,
p99 and longest latency, and how many requests joined a running batch (/metrics). Every answer is
checked equal across the two settings (the same ids), so the speed compares like with like.

  bench/generate_join_bench.py KILN LIBRARY_DIR WEIGHTS [--clients C] [--requests R]
                               [--workers W]
  e.g. bench/generate_join_bench.py build/tools/kiln build/tests/generate_llama.kiln \\
       examples/models/golden/llama.weights.safetensors
"""
import argparse
import json
import os
import random
import subprocess
import threading
import time
import urllib.request

from serve_bench import cpu_name, metric  # the same CPU line and /metrics reading


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def run(args, name, extra, jobs):
    proc = subprocess.Popen([args.kiln, "serve", "--compiled", args.library, "--weights",
                             args.weights, "--port", "0", "--workers", str(args.workers)] + extra,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = "http://127.0.0.1:%d" % int(proc.stdout.readline())
        lib = args.library if not os.path.isdir(args.library) else [
            f for f in os.listdir(args.library) if f.startswith("lib") and f.endswith(".so")][0]
        gen = "%s/v2/models/%s/generate" % (url, os.path.basename(lib)[3:-3])
        post(gen, {"ids": [[5]], "max_decoding_length": 2})  # warm up
        latency, answers = [None] * len(jobs), [None] * len(jobs)

        def client(k):
            for n in range(k, len(jobs), args.clients):
                prompt, length = jobs[n]
                t0 = time.perf_counter()
                r = post(gen, {"ids": [prompt], "max_decoding_length": length})
                latency[n] = time.perf_counter() - t0
                answers[n] = r["results"][0]["hypotheses"][0]["ids"]
        threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        joined = metric(url, "kiln_generate_joined_total")
    finally:
        proc.terminate()
        proc.wait()
    lat = sorted(latency)
    tokens = sum(len(a) for a in answers)
    print("| %s | %.1f | %.0f | %.1f | %.1f | %.1f | %d of %d |" % (
        name, len(jobs) / wall, tokens / wall, 1e3 * lat[len(lat) // 2],
        1e3 * lat[min(len(lat) - 1, int(len(lat) * 0.99))], 1e3 * lat[-1], joined, len(jobs)),
        flush=True)
    return answers, len(jobs) / wall


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("kiln")
    p.add_argument("library")
    p.add_argument("weights")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=61, help="prompt ids are drawn from [3, vocab)")
    args = p.parse_args()
    rng = random.Random(5)
    jobs = [([rng.randrange(3, args.vocab) for _ in range(rng.randint(1, 5))],
             rng.randint(4, 24)) for _ in range(args.requests)]
    print("CPU: %s; %d clients, %d requests, --workers %d" % (cpu_name(), args.clients,
                                                             args.requests, args.workers))
    print("| setting | requests/s | tokens/s | p50 ms | p99 ms | max ms | joined |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    joined, rate_on = run(args, "joining (default)", [], jobs)
    alone, rate_off = run(args, "alone (--no-batching)", ["--no-batching"], jobs)
    if joined != alone:
        raise SystemExit("generate_join_bench: the two settings gave different ids")
    print("joining / alone: %.2fx the requests per second (same ids)" % (rate_on / rate_off))


if __name__ == "__main__":
    main()
