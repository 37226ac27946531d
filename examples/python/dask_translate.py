#!/usr/bin/env python3
"""An offline batch job scaled out with Dask (Debian's python3-distributed): translates a file of
sentences with the shipped number translator over a LocalCluster of worker processes, each
loading the compiled model once through the kiln module (`kiln.Model`), and writes the
translations in the input's order, one per line, as `kiln translate` prints them
("SOURCE -> TRANSLATION").

    python3 examples/python/dask_translate.py out/numbers sentences.txt [-o out.txt]
        [--workers 2] [--chunk 64] [--beam 4]

LIBRARY is the folder `kiln compile --emit=shared` wrote (scripts/demo.sh: out/numbers). On a
real cluster, replace LocalCluster with the scheduler's address (distributed.Client(ADDRESS)):
each worker needs the library, the weights and the vocabularies at the same paths.
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
NUMBERS = os.path.join(HERE, "..", "numbers")

_model = None  # one per worker process, loaded by its first chunk


def translate_chunk(library, beam, lines):
    """Runs in a worker: the chunk's translations (the model and tokenizers loaded once)."""
    global _model
    import kiln
    if _model is None:
        _model = (kiln.Model(library, os.path.join(NUMBERS, "numbers.weights.safetensors"),
                             threads=1),
                  kiln.Tokenizer(os.path.join(NUMBERS, "vocab.src.txt")),
                  kiln.Tokenizer(os.path.join(NUMBERS, "vocab.tgt.txt")))
    model, src_vocab, tgt_vocab = _model
    pad = int(model.config("pad_id"))
    max_batch = int(model.symbol_max("B"))
    out = []
    for start in range(0, len(lines), max_batch):
        part = lines[start:start + max_batch]
        ids = [src_vocab.encode(s) for s in part]
        src = np.full((len(ids), max(len(i) for i in ids)), pad, dtype=np.int64)
        for row, i in zip(src, ids):
            row[:len(i)] = i
        g = model.generate(src, beam_size=beam)
        out += ["%s -> %s" % (s, tgt_vocab.decode(h[0])) for s, h in zip(part, g["tokens"])]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("library")
    ap.add_argument("sentences")
    ap.add_argument("-o", "--output", default="-")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--chunk", type=int, default=64, help="sentences per task (default 64)")
    ap.add_argument("--beam", type=int, default=1, help="beam size (default 1: greedy)")
    args = ap.parse_args()
    if args.workers < 1 or args.chunk < 1 or args.beam < 1:
        ap.error("--workers, --chunk and --beam must be at least 1")
    from distributed import Client, LocalCluster
    with open(args.sentences, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f if line.strip()]
    chunks = [lines[i:i + args.chunk] for i in range(0, len(lines), args.chunk)]
    library = os.path.abspath(args.library)
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        futures = client.map(translate_chunk, [library] * len(chunks), [args.beam] * len(chunks),
                             chunks, pure=False)
        results = client.gather(futures)
    text = "".join(line + "\n" for chunk in results for line in chunk)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
