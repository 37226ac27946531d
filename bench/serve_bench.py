#!/usr/bin/env python3
"""kiln serve under load (bench/README.md, "kiln serve"): wrk posts one /infer request body over
C connections for D seconds, with dynamic batching on (--max-queue-delay-ms 0, the default, and
2; --max-batch the model's) and off (--no-batching); prints a markdown row per setting:
requests/s and the p50/p99 latency wrk measured, and the mean requests per model call
(/metrics).

  bench/serve_bench.py KILN LIBRARY_DIR WEIGHTS [--connections C] [--seconds D] [--rows R]
                       [--src-len N] [--tgt-len N]
  e.g. bench/serve_bench.py build/tools/kiln build/tests/python_models/py_tiny \\
       tests/golden/tiny.weights.safetensors
"""
import argparse
import json
import os
import re
import signal
import subprocess
import tempfile
import urllib.request


def cpu_name():
    """`model name` of /proc/cpuinfo, with the family and model numbers."""
    info = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    return "%s (family %s, model %s, %d CPUs)" % (info.get("model name", "unknown CPU"),
                                                  info.get("cpu family", "?"),
                                                  info.get("model", "?"), os.cpu_count())


def metric(url, name):
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def seconds(text):
    """wrk's latency ('812.00us', '1.20ms', '2.01s') in ms."""
    m = re.match(r"([\d.]+)(us|ms|s|m)$", text)
    if not m:
        raise SystemExit("serve_bench: cannot read wrk's latency %r" % text)
    value, unit = float(m.group(1)), m.group(2)
    return value * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[unit]


def run(args, name, extra, body_path):
    proc = subprocess.Popen([args.kiln, "serve", "--compiled", args.library, "--weights",
                             args.weights, "--port", "0"] + extra,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        port = int(proc.stdout.readline())
        url = "http://127.0.0.1:%d" % port
        model = os.path.basename(os.path.normpath(args.library))
        with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as lua:
            lua.write('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                      'local f = io.open("%s")\nwrk.body = f:read("*a")\nf:close()\n' % body_path)
        out = subprocess.run(["wrk", "-t", "2", "-c", str(args.connections), "-d",
                              "%ds" % args.seconds, "--latency", "-s", lua.name,
                              "%s/v2/models/%s/infer" % (url, model)],
                             capture_output=True, text=True, check=True).stdout
        os.unlink(lua.name)
        if "Requests/sec" not in out or "Latency Distribution" not in out:
            raise SystemExit("serve_bench: wrk printed no figures:\n" + out)
        rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
        p50 = seconds(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1))
        p99 = seconds(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1))
        errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
        calls = metric(url, "kiln_batch_size_count")
        reqs = metric(url, "kiln_batch_size_sum")
        print("| %s | %d | %.0f | %.2f | %.2f | %.2f | %s |" % (
            name, args.connections, rps, p50, p99, reqs / calls if calls else 0,
            errors.group(1) if errors else "0"))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("kiln")
    p.add_argument("library")
    p.add_argument("weights")
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--rows", type=int, default=1, help="batch rows of each request")
    p.add_argument("--src-len", type=int, default=8, help="source ids per row")
    p.add_argument("--tgt-len", type=int, default=6, help="target ids per row")
    args = p.parse_args()
    body = {"inputs": [
        # Ids in [3, 13): within every test model's vocabularies.
        {"name": "src", "datatype": "INT64", "shape": [args.rows, args.src_len],
         "data": [3 + i % 10 for i in range(args.src_len * args.rows)]},
        {"name": "tgt", "datatype": "INT64", "shape": [args.rows, args.tgt_len],
         "data": [3 + (i * 7) % 10 for i in range(args.tgt_len * args.rows)]}]}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(body, f)
    print("kiln serve, %s, %s, %d row(s) of %d source and %d target ids per request, %d s per "
          "setting" % (os.path.basename(os.path.normpath(args.library)), cpu_name(), args.rows,
                       args.src_len, args.tgt_len, args.seconds))
    print("| batching | connections | requests/s | p50 ms | p99 ms | requests per call | "
          "non-2xx |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    run(args, "on (default: --max-queue-delay-ms 0)", [], f.name)
    run(args, "on, --max-queue-delay-ms 2", ["--max-queue-delay-ms", "2"], f.name)
    run(args, "off (--no-batching)", ["--no-batching"], f.name)
    os.unlink(f.name)


if __name__ == "__main__":
    main()
