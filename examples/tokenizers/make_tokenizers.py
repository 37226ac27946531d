#!/usr/bin/env python3
"""The demo tokenizers (issue 28), trained on the number translator's English side
(examples/numbers/heldout.tsv) and written beside this script:

  numbers.spm.model      SentencePiece (Debian's python3-sentencepiece), unigram, 320 pieces,
                         byte fallback on (any UTF-8 text round-trips), <pad> 0, <s> 1, </s> 2,
                         <unk> 3, as kiln's models number their special tokens; no
                         normalization (text is kept as it is)
  bpe/vocab.json, bpe/merges.txt
                         byte-level BPE in GPT-2's format (its byte-to-character map, 256 byte
                         tokens, then 64 merges learned here, then <|endoftext|>)

tests/tokenizer_test.cpp round-trips text through both. Regenerate with
  /usr/bin/python3 examples/tokenizers/make_tokenizers.py
(the outputs are deterministic for these inputs).
"""
import collections
import io
import json
import os

import sentencepiece as spm

HERE = os.path.dirname(os.path.abspath(__file__))
NUMBERS = os.path.join(HERE, "..", "numbers", "heldout.tsv")


def sentences():
    with open(NUMBERS, encoding="utf-8") as f:
        return [line.split("\t")[0] for line in f if line.strip()]


def bytes_to_unicode():
    """GPT-2's map from each byte to a printable character."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def train_bpe(texts, merges_wanted):
    byte_char = bytes_to_unicode()
    words = collections.Counter()
    for t in texts:
        for i, w in enumerate(t.split(" ")):
            words[(" " if i else "") + w] += 1
    corpus = {tuple(byte_char[b] for b in w.encode("utf-8")): c for w, c in words.items()}
    merges = []
    for _ in range(merges_wanted):
        pairs = collections.Counter()
        for w, c in corpus.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        new = {}
        for w, c in corpus.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new[tuple(out)] = c
        corpus = new
    vocab = {}
    for b in range(256):
        vocab[byte_char[b]] = len(vocab)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    vocab["<|endoftext|>"] = len(vocab)
    return vocab, merges


def main():
    texts = sentences()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_prefix=os.path.join(HERE, "numbers.spm"),
        vocab_size=320, model_type="unigram", byte_fallback=True, pad_id=0, bos_id=1, eos_id=2,
        unk_id=3, character_coverage=1.0, num_threads=1, minloglevel=2,
        normalization_rule_name="identity")
    os.remove(os.path.join(HERE, "numbers.spm.vocab"))
    vocab, merges = train_bpe(texts, 64)
    os.makedirs(os.path.join(HERE, "bpe"), exist_ok=True)
    with open(os.path.join(HERE, "bpe", "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False, indent=0)
    with open(os.path.join(HERE, "bpe", "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write("%s %s\n" % (a, b))
    print("wrote numbers.spm.model (%d pieces), bpe/vocab.json (%d tokens), bpe/merges.txt "
          "(%d merges)" % (320, len(vocab), len(merges)))


if __name__ == "__main__":
    main()
