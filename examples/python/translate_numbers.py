#!/usr/bin/env python3
"""The shipped number translator (examples/numbers: English number words -> digits) from
Python through the kiln module: the model compiled as a shared library (`kiln compile
--emit=shared`, as scripts/demo.sh does into out/numbers), its character vocabularies, beam
search, and each greedy token streamed as it is chosen.

    python3 examples/python/translate_numbers.py out/numbers "three hundred and twelve"
    echo "forty two" | python3 examples/python/translate_numbers.py out/numbers
"""
import os
import sys

import numpy as np

import kiln

HERE = os.path.dirname(os.path.abspath(__file__))
NUMBERS = os.path.join(HERE, "..", "numbers")


def main():
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    model = kiln.Model(sys.argv[1], os.path.join(NUMBERS, "numbers.weights.safetensors"))
    src_vocab = kiln.Tokenizer(os.path.join(NUMBERS, "vocab.src.txt"))
    tgt_vocab = kiln.Tokenizer(os.path.join(NUMBERS, "vocab.tgt.txt"))
    sentences = sys.argv[2:] or [line.strip() for line in sys.stdin if line.strip()]
    pad = int(model.config("pad_id"))
    ids = [src_vocab.encode(s) for s in sentences]
    src = np.full((len(ids), max(len(i) for i in ids)), pad, dtype=np.int64)
    for row, i in zip(src, ids):
        row[:len(i)] = i
    # Beam search over the whole batch.
    beam = model.generate(src, beam_size=4)
    for sentence, hyps in zip(sentences, beam["tokens"]):
        print("%s -> %s" % (sentence, tgt_vocab.decode(hyps[0])))
    # Greedy search on the first sentence, each token printed as it is chosen.
    print("streamed: ", end="", flush=True)
    model.generate(src[:1], on_token=lambda sentence, step, token: print(
        tgt_vocab.decode([token]), end="", flush=True))
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
