#!/usr/bin/python3
"""W6's PyTorch peer (issue 26): the LLaMA-style twin of examples/models/llama.cpp
(examples/models/make_generate_golden.py's Llama) at d 768, 12 heads / 4 KV heads, SwiGLU 2048,
12 layers, vocab 32000, RoPE, with random weights from a fixed seed. Writes the checkpoint kiln
loads and times, with a KV cache, the prefill of a 128-token prompt and greedy decoding of 64
new tokens at batch 1 and 16 (eager, inference_mode, float32; and bf16 autocast with
--bf16). Debian's /usr/bin/python3 + python3-torch.

  llama_peer.py --weights-out /tmp/kiln-bench/llama_w6.safetensors --json-out /tmp/w6_torch.json
"""

import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples", "models"))
import make_generate_golden as twin  # noqa: E402

W6 = dict(vocab=32000, d_model=768, heads=12, kv_heads=4, d_ff=2048, layers=12,
          rope_theta=10000.0, eps=1e-5, eos_id=2)
PROMPT, NEW = 128, 64


def timed(fn, repeats):
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def run(model, batch, autocast):
    g = torch.Generator().manual_seed(6)
    ids = torch.randint(3, W6["vocab"], (batch, PROMPT), generator=g)

    def prefill():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return model(ids)

    def generate():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits, caches = model(ids)
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            for t in range(NEW - 1):
                logits, caches = model(nxt, PROMPT + t, caches)
                nxt = logits[:, -1].argmax(-1, keepdim=True)

    with torch.inference_mode():
        prefill()  # warm-up
        p = timed(prefill, 3)
        gen = timed(generate, 2)
    return {"prefill_ms": p * 1e3, "generate_ms": gen * 1e3,
            "decode_ms_per_step": (gen - p) * 1e3 / (NEW - 1),
            "decode_tok_s": batch * (NEW - 1) / (gen - p)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights-out", required=True)
    ap.add_argument("--json-out", required=True)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("KILN_BENCH_THREADS", 2)))
    ap.add_argument("--bf16", action="store_true", help="also time under bf16 autocast")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = twin.Llama(W6).eval()
    # Weights as a trained model's scale (std 0.02, norms 1): activations stay finite over 12
    # layers (the twin's test init, std 0.3, is for small models).
    g = torch.Generator().manual_seed(66)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    if not os.path.exists(a.weights_out):
        os.makedirs(os.path.dirname(a.weights_out) or ".", exist_ok=True)
        twin.write_safetensors(a.weights_out, model.state_dict())
    out = {"threads": a.threads, "torch": torch.__version__}
    for batch in (1, 16):
        out[f"f32_b{batch}"] = run(model, batch, False)
        if a.bf16:
            out[f"bf16_b{batch}"] = run(model, batch, True)
        print(batch, out[f"f32_b{batch}"], file=sys.stderr)
    with open(a.json_out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
