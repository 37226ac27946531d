#!/usr/bin/env python3
"""PyTorch's kernels on gpu_kernel_bench's shapes (issue 30), on the same GPU, FP32 with TF32 off:

  gemm/<shape>/M<m>           torch.addmm(bias, x, W.t()) (cuBLAS SGEMM), ReLU after it for
                              k512_n2048_relu: bench/gemm_shapes.kir's shapes at M 32, 128,
                              256, 1024, 2048
  attention/<entry>/B<b>_L<l> torch.nn.functional.scaled_dot_product_attention on q, k, v
                              [B, 8, L, 64] views of [B, L, 512] tensors (as the model's
                              heads are), is_causal for "causal"; no mask

Each figure: 10 calls between two CUDA events, repeated for at least 0.2 s after 3 warm-up
calls; the median per call. Writes JSON ({"device_name", "torch_version", "results":
{name: {"s_per_call", "GFLOP/s"}}}) to --json-out; bench/report.py --gpu reads it beside
gpu_kernel_bench's JSON.
"""
import argparse
import json
import statistics
import sys
import time

import torch

GEMM_SHAPES = [("k512_n1536", 512, 1536), ("k512_n512", 512, 512), ("k512_n1024", 512, 1024),
               ("k512_n2048_relu", 512, 2048), ("k2048_n512", 2048, 512),
               ("k512_n32000", 512, 32000)]
GEMM_ROWS = [32, 128, 256, 1024, 2048]
ATTENTION = [("self", 1, 32, 32), ("causal", 1, 32, 32), ("cross", 1, 32, 32),
             ("self", 16, 128, 128), ("causal", 16, 128, 128), ("cross", 16, 128, 128),
             ("self", 1, 1024, 1024)]
CALLS = 10


def time_calls(fn, min_seconds=0.2):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per_call = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < min_seconds or len(per_call) < 5:
        start.record()
        for _ in range(CALLS):
            fn()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) / 1e3 / CALLS)
    return statistics.median(per_call)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json-out", required=True)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_kernels_peer.py: no CUDA device visible to PyTorch", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(30)
    results = {}
    with torch.inference_mode():
        for entry, K, N in GEMM_SHAPES:
            w = torch.rand(N, K, device=dev, generator=g) * 0.1 - 0.05
            b = torch.rand(N, device=dev, generator=g) * 0.1 - 0.05
            wt = w.t()
            relu = entry.endswith("_relu")
            for M in GEMM_ROWS:
                x = torch.rand(M, K, device=dev, generator=g) * 2 - 1
                out = torch.empty(M, N, device=dev)
                if relu:
                    fn = lambda: torch.relu_(torch.addmm(b, x, wt, out=out))
                else:
                    fn = lambda: torch.addmm(b, x, wt, out=out)
                s = time_calls(fn)
                results["gemm/%s/M%d" % (entry, M)] = {"s_per_call": s,
                                                      "GFLOP/s": 2.0 * M * N * K / s / 1e9}
                print("gpu_kernels_peer.py: gemm/%s/M%d %.1f us" % (entry, M, s * 1e6),
                      file=sys.stderr)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        for entry, B, Lq, Lk in ATTENTION:
            def heads(t, L):
                return t.view(B, L, 8, 64).transpose(1, 2)
            q = heads(torch.rand(B, Lq, 512, device=dev, generator=g) * 2 - 1, Lq)
            k = heads(torch.rand(B, Lk, 512, device=dev, generator=g) * 2 - 1, Lk)
            v = heads(torch.rand(B, Lk, 512, device=dev, generator=g) * 2 - 1, Lk)
            causal = entry == "causal"
            fn = lambda: sdpa(q, k, v, is_causal=causal, scale=0.125)
            s = time_calls(fn)
            name = "attention/%s/B%d_L%d" % (entry, B, Lq)
            results[name] = {"s_per_call": s, "GFLOP/s": 4.0 * B * 8 * Lq * Lk * 64 / s / 1e9}
            print("gpu_kernels_peer.py: %s %.1f us" % (name, s * 1e6), file=sys.stderr)
    out = {"device_name": torch.cuda.get_device_name(dev), "torch_version": torch.__version__,
           "results": results}
    with open(args.json_out, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
