#!/usr/bin/python3
"""Train kiln's example translation model: English number words -> digits.

    /usr/bin/python3 examples/numbers/train.py          (from anywhere)

Needs Debian's python3-torch and nothing else; downloads nothing. The model is
the reference post-norm encoder-decoder Transformer of
tests/golden/make_golden.py, imported from there (one definition), so the
checkpoint's tensor names and numerics are exactly the ones kiln compiles.

Task: "three hundred and twelve" -> "312", for every number 0..999999, written
in British English ("and" before the last part below one hundred, hyphenated
twenty-one..ninety-nine). Character level on both sides; the space character
is written as U+2581 ("\u2581") in vocab.src.txt. Source ids are the
characters only (no <s> or </s>); the decoder starts from <s> and the target
is the digits followed by </s>.

Writes next to this script:
  numbers.weights.safetensors  F32 state_dict; metadata = config (str->str)
  vocab.src.txt, vocab.tgt.txt one token per line, line number (from 0) = id
  heldout.tsv                  source<TAB>reference, numbers never trained on
  examples.txt                 a few source sentences for the README demo

Deterministic by construction: fixed seeds, one thread, deterministic
algorithms, so a rerun on the same torch build and CPU should give the same
weights. Training takes about 10 CPU-minutes (3000 steps of 64 sentences).

The SentencePiece variant (Debian's python3-sentencepiece too):

    /usr/bin/python3 examples/numbers/train.py --sentencepiece

trains the same model and task over SentencePiece vocabularies learned first
from training sentences only (never the held-out ones): the source a unigram
model of 64 pieces (whole words and parts of them: about 8 tokens a sentence
instead of 40 characters), the target a character model of the digits. It
writes numbers_spm.weights.safetensors, numbers.src.spm.model and
numbers.tgt.spm.model (and checks that its held-out numbers are heldout.tsv's);
kiln translate --src-vocab numbers.src.spm.model --tgt-vocab
numbers.tgt.spm.model translates with them. --steps N overrides the steps.
"""

import argparse
import collections
import importlib.util
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _import_reference():
    path = os.path.join(ROOT, "tests", "golden", "make_golden.py")
    spec = importlib.util.spec_from_file_location("kiln_make_golden", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ref = _import_reference()

# ----------------------------------------------------------------------------
# The task
# ----------------------------------------------------------------------------

MAX_NUMBER = 999999

ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight",
        "nine", "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen",
        "sixteen", "seventeen", "eighteen", "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy",
        "eighty", "ninety"]


def _below_100(n):
    if n < 20:
        return ONES[n]
    return TENS[n // 10] + ("-" + ONES[n % 10] if n % 10 else "")


def _below_1000(n):
    h, r = divmod(n, 100)
    if h == 0:
        return _below_100(r)
    s = ONES[h] + " hundred"
    return s + (" and " + _below_100(r) if r else "")


def number_to_words(n):
    """British English: 2005 -> "two thousand and five"."""
    assert 0 <= n <= MAX_NUMBER
    if n < 1000:
        return _below_1000(n)
    th, r = divmod(n, 1000)
    s = _below_1000(th) + " thousand"
    if r == 0:
        return s
    return s + (" and " if r < 100 else " ") + _below_1000(r)


PAD, BOS, EOS = 0, 1, 2
SPECIALS = ["<pad>", "<s>", "</s>"]
SPACE_TOKEN = "\u2581"  # how " " is written in vocab.src.txt

SRC_CHARS = sorted(set("".join(number_to_words(n) for n in range(1000)) +
                       " thousand"))
TGT_CHARS = list("0123456789")
SRC_VOCAB = SPECIALS + [SPACE_TOKEN if c == " " else c for c in SRC_CHARS]
TGT_VOCAB = SPECIALS + TGT_CHARS
SRC_ID = {c: i + len(SPECIALS) for i, c in enumerate(SRC_CHARS)}
TGT_ID = {c: i + len(SPECIALS) for i, c in enumerate(TGT_CHARS)}

LONGEST_SRC = max(len(number_to_words(n)) for n in range(MAX_NUMBER + 1))

CONFIG = collections.OrderedDict([
    ("src_vocab", len(SRC_VOCAB)),
    ("tgt_vocab", len(TGT_VOCAB)),
    ("d_model", 64),
    ("heads", 4),
    ("d_ff", 256),
    ("enc_layers", 3),
    ("dec_layers", 2),
    ("pad_id", PAD),
    ("max_len", 80),
    ("max_batch", 32),
])
assert list(CONFIG.keys()) == ref.CONFIG_KEYS
# Room for <s> and </s> too, should an application add them to the source.
assert LONGEST_SRC + 2 <= CONFIG["max_len"], LONGEST_SRC

TRAIN_SEED = 20240611
DATA_SEED = 7
STEPS = 3000
BATCH = 64
POOL_BATCHES = 32  # batches drawn at once and bucketed by source length
EVAL_EVERY = 500
LR = 1e-3
WARMUP = 300
N_HELDOUT = 500
N_EVAL = 3000  # second held-out sample, not written, for a tighter estimate

SPARSE_SHARE = 0.2  # of training sentences drawn by draw_sparse

# For the README demo (chosen by hand, not held out: some may be trained on).
EXAMPLES = [312, 2005, 40017, 100000, 613048, 777777, 999999]


def encode_src(words):
    return [SRC_ID[c] for c in words]


def encode_tgt(digits):
    return [TGT_ID[c] for c in digits]


def decode_tgt(ids):
    return "".join(TGT_VOCAB[t] if t >= len(SPECIALS) else "<%d>" % t for t in ids)


# ----------------------------------------------------------------------------
# The SentencePiece variant (--sentencepiece)
# ----------------------------------------------------------------------------

SPM_SEED = 11
SPM_SENTENCES = 20000  # training sentences the source vocabulary is learned from
SPM_SRC_PIECES = 64


def use_sentencepiece(never_train):
    """Learns the variant's vocabularies (from training numbers only) and makes
    encode_src, encode_tgt, decode_tgt and CONFIG use them. Returns the paths of
    the two .model files written beside this script."""
    import sentencepiece as spm  # Debian's python3-sentencepiece

    global encode_src, encode_tgt, decode_tgt
    rng = random.Random(SPM_SEED)
    numbers = []
    while len(numbers) < SPM_SENTENCES:
        n = draw_training_number(rng)
        if n not in never_train:
            numbers.append(n)
    numbers += list(range(1000))  # every word and every number below 1000
    common = dict(pad_id=PAD, bos_id=BOS, eos_id=EOS, unk_id=3, num_threads=1,
                  minloglevel=2, normalization_rule_name="identity",
                  character_coverage=1.0)
    src_prefix = os.path.join(HERE, "numbers.src.spm")
    tgt_prefix = os.path.join(HERE, "numbers.tgt.spm")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([number_to_words(n) for n in numbers]),
        model_prefix=src_prefix, vocab_size=SPM_SRC_PIECES, model_type="unigram",
        **common)
    # The digits, one token each (no leading "▁": the target is one word).
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([str(n) for n in numbers]), model_prefix=tgt_prefix,
        vocab_size=len(SPECIALS) + 1 + len(TGT_CHARS), model_type="char",
        add_dummy_prefix=False, **common)
    for prefix in (src_prefix, tgt_prefix):
        os.remove(prefix + ".vocab")
    src = spm.SentencePieceProcessor(model_file=src_prefix + ".model")
    tgt = spm.SentencePieceProcessor(model_file=tgt_prefix + ".model")
    encode_src = lambda words: src.encode(words)
    encode_tgt = lambda digits: tgt.encode(digits)
    decode_tgt = lambda ids: tgt.decode(ids)
    CONFIG["src_vocab"] = src.get_piece_size()
    CONFIG["tgt_vocab"] = tgt.get_piece_size()
    print("SentencePiece: source %d pieces (unigram), target %d (characters); "
          "longest source %d tokens" % (
              src.get_piece_size(), tgt.get_piece_size(),
              max(len(src.encode(number_to_words(n))) for n in range(0, MAX_NUMBER + 1, 7))))
    return src_prefix + ".model", tgt_prefix + ".model"


def draw_sparse(rng):
    """A number with many zero digits: 100000, 2005, 40017, 300600... Rare in
    uniform draws, and the first numbers a reader tries."""
    k = rng.randint(1, 6)
    digits = [rng.randint(1, 9)]
    for _ in range(k - 1):
        digits.append(0 if rng.random() < 0.7 else rng.randint(1, 9))
    return int("".join(map(str, digits)))


def draw_training_number(rng):
    return draw_sparse(rng) if rng.random() < SPARSE_SHARE else draw_number(rng)


def draw_number(rng):
    """Half uniform over 0..999999, half with a uniform number of digits, so
    that short numbers (a tenth of a percent of the range) are seen too."""
    if rng.random() < 0.5:
        return rng.randint(0, MAX_NUMBER)
    k = rng.randint(1, 6)
    return rng.randint(0 if k == 1 else 10 ** (k - 1), 10 ** k - 1)


def init_weights(model):
    """Xavier-uniform matrices, zero biases, and embeddings of standard
    deviation d_model^-1/2, so that emb * sqrt(d_model) is of the same size as
    the sinusoidal positions (torch's default N(0,1) embeddings would drown
    them by a factor of sqrt(d_model), and this task is all about order)."""
    d = CONFIG["d_model"]
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("_embed.weight"):
                torch.nn.init.normal_(p, 0.0, d ** -0.5)
            elif p.dim() == 2:
                torch.nn.init.xavier_uniform_(p)
            elif ".norm" in name or name.startswith(("encoder.norm",
                                                     "decoder.norm")):
                pass  # LayerNorm: weight 1, bias 0 already
            else:
                torch.nn.init.zeros_(p)


def make_heldout(rng, count, exclude):
    """Numbers of 4 to 6 digits drawn by draw_number, never trained on. (Below 1000 there are only 1000 sentences, all of them needed in
    training: holding out "nine" would leave the model never seeing it.)"""
    out = []
    seen = set(exclude)
    while len(out) < count:
        n = draw_number(rng)
        if n >= 1000 and n not in seen:
            seen.add(n)
            out.append(n)
    return out


def pad_batch(seqs):
    L = max(len(s) for s in seqs)
    t = torch.full((len(seqs), L), PAD, dtype=torch.int64)
    for i, s in enumerate(seqs):
        t[i, :len(s)] = torch.tensor(s, dtype=torch.int64)
    return t


def make_batch(numbers):
    src = pad_batch([encode_src(number_to_words(n)) for n in numbers])
    tgt = [encode_tgt(str(n)) for n in numbers]
    dec_in = pad_batch([[BOS] + t for t in tgt])
    labels = pad_batch([t + [EOS] for t in tgt])
    return src, dec_in, labels


# ----------------------------------------------------------------------------
# Training speed: Debian's torch links the reference BLAS (a few GFLOPS), so
# while training, nn.Linear runs its three matrix products through oneDNN
# (mkldnn_linear, about ten times faster here). Same math, different rounding;
# the accuracy below is measured with the plain reference model.
# ----------------------------------------------------------------------------

def _dnnl_mm(a, b_t):
    """a [M,K] @ b_t^T, b_t [N,K] -> [M,N] by oneDNN."""
    return torch._C._nn.mkldnn_linear(a.contiguous().to_mkldnn(),
                                      b_t.contiguous().to_mkldnn()).to_dense()


class _DnnlLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b):
        x2 = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(x2, w)
        y = _dnnl_mm(x2, w) + b
        return y.view(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, gy):
        x2, w = ctx.saved_tensors
        g2 = gy.reshape(-1, w.shape[0])
        gx = _dnnl_mm(g2, w.t())
        gw = _dnnl_mm(g2.t(), x2.t())
        return gx.view(*gy.shape[:-1], w.shape[1]), gw, g2.sum(0)


_PLAIN_LINEAR_FORWARD = torch.nn.Linear.forward


def use_dnnl_linear(on):
    def fast(self, x):
        return _DnnlLinear.apply(x, self.weight, self.bias)
    torch.nn.Linear.forward = fast if on else _PLAIN_LINEAR_FORWARD


def dnnl_available():
    try:
        x = torch.randn(3, 5)
        w = torch.randn(4, 5)
        return torch.allclose(_dnnl_mm(x, w), x @ w.t(), atol=1e-5)
    except RuntimeError:
        return False


# ----------------------------------------------------------------------------
# Greedy decoding (no cache: the decoder re-runs on the whole prefix)
# ----------------------------------------------------------------------------

def greedy(model, src, max_steps):
    """src: I64 [B,S]. Returns a list of id lists (without <s>/</s>)."""
    B = src.shape[0]
    with torch.inference_mode():
        memory = model.encode(src)
        ys = torch.full((B, 1), BOS, dtype=torch.int64)
        done = torch.zeros(B, dtype=torch.bool)
        for _ in range(max_steps):
            logits = model.generator(model.decode(memory, src, ys))[:, -1]
            nxt = logits.argmax(-1)
            nxt = torch.where(done, torch.full_like(nxt, PAD), nxt)
            ys = torch.cat([ys, nxt.unsqueeze(1)], 1)
            done |= nxt == EOS
            if bool(done.all()):
                break
    out = []
    for row in ys[:, 1:].tolist():
        ids = []
        for t in row:
            if t in (EOS, PAD):
                break
            ids.append(t)
        out.append(ids)
    return out


def translate(model, sentences, batch=32):
    res = []
    for i in range(0, len(sentences), batch):
        chunk = sentences[i:i + batch]
        src = pad_batch([encode_src(s) for s in chunk])
        for ids in greedy(model, src, CONFIG["max_len"] - 1):
            res.append(decode_tgt(ids))
    return res


def accuracy(model, numbers):
    srcs = [number_to_words(n) for n in numbers]
    hyps = translate(model, srcs)
    wrong = [(s, str(n), h) for s, n, h in zip(srcs, numbers, hyps)
             if h != str(n)]
    return 1.0 - len(wrong) / len(numbers), wrong


# ----------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------

def main():
    global STEPS
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sentencepiece", action="store_true",
                        help="the SentencePiece variant (see the module's help)")
    parser.add_argument("--steps", type=int, default=STEPS, help="training steps")
    args = parser.parse_args()
    STEPS = args.steps
    torch.set_default_dtype(torch.float32)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(TRAIN_SEED)

    rng = random.Random(DATA_SEED)
    heldout = make_heldout(rng, N_HELDOUT, [])
    evalset = make_heldout(rng, N_EVAL, heldout)
    never_train = set(heldout) | set(evalset)
    if args.sentencepiece:
        spm_models = use_sentencepiece(never_train)
        shipped = os.path.join(HERE, "heldout.tsv")
        if os.path.exists(shipped):
            with open(shipped, encoding="utf-8") as f:
                assert [int(line.split("\t")[1]) for line in f] == heldout, \
                    "the held-out numbers differ from heldout.tsv's"

    print("config:", dict(CONFIG))
    print("longest source: %d characters; src vocab %d, tgt vocab %d"
          % (LONGEST_SRC, CONFIG["src_vocab"], CONFIG["tgt_vocab"]))

    model = ref.Transformer(CONFIG)
    init_weights(model)
    sd_keys = list(model.state_dict().keys())
    assert sd_keys == ref.expected_state_dict_keys(CONFIG)
    nparams = sum(p.numel() for p in model.parameters())
    print("parameters: %d (%.2f MB as F32)" % (nparams, nparams * 4 / 1e6))

    opt = torch.optim.Adam(model.parameters(), lr=LR, betas=(0.9, 0.98),
                           eps=1e-9)

    def lr_at(step):  # linear warm-up, cosine decay to 2% of LR
        if step < WARMUP:
            return LR * (step + 1) / WARMUP
        p = (step - WARMUP) / max(1, STEPS - WARMUP)
        return LR * (0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * p)))

    fast = dnnl_available()
    print("oneDNN matrix products while training: %s" % ("yes" if fast else "no"))

    def batches():
        """Endless stream of batches of similar source length (less padding,
        and attention's cost grows with the square of the padded length)."""
        while True:
            pool = []
            while len(pool) < BATCH * POOL_BATCHES:
                n = draw_training_number(rng)
                if n not in never_train:
                    pool.append(n)
            pool.sort(key=lambda n: len(number_to_words(n)))
            chunks = [pool[i:i + BATCH] for i in range(0, len(pool), BATCH)]
            rng.shuffle(chunks)
            for c in chunks:
                yield make_batch(c)

    t0 = time.time()
    c0 = time.process_time()
    use_dnnl_linear(fast)
    model.train()
    running = 0.0
    stream = batches()
    for step in range(STEPS):
        src, dec_in, labels = next(stream)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        logits = model(src, dec_in)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                               labels.reshape(-1), ignore_index=PAD)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        running = loss.item() if step == 0 else 0.98 * running + 0.02 * loss.item()
        if (step + 1) % 100 == 0 or step == 0:
            print("step %5d/%d  loss %.4f  lr %.2e  %.0f s"
                  % (step + 1, STEPS, running, lr_at(step), time.time() - t0),
                  flush=True)
        if (step + 1) % EVAL_EVERY == 0 and step + 1 < STEPS:
            model.eval()
            acc, _ = accuracy(model, heldout[:200])
            print("  held-out (first 200) exact match %.1f%%" % (100 * acc),
                  flush=True)
            model.train()
    train_s = time.time() - t0
    train_cpu_s = time.process_time() - c0
    use_dnnl_linear(False)
    model.eval()

    acc, wrong = accuracy(model, heldout)
    acc_eval, wrong_eval = accuracy(model, evalset)
    acc_small, wrong_small = accuracy(model, list(range(1000)))
    round_numbers = sorted(n for n in range(MAX_NUMBER + 1)
                           if sum(c != "0" for c in str(n)) <= 2)
    acc_round, wrong_round = accuracy(model, round_numbers)
    print("training: %d steps x %d sentences in %.0f s wall, %.0f s CPU"
          % (STEPS, BATCH, train_s, train_cpu_s))
    print("held-out exact match: %.2f%% (%d/%d)"
          % (100 * acc, len(heldout) - len(wrong), len(heldout)))
    print("second held-out sample: %.2f%% (%d/%d)"
          % (100 * acc_eval, len(evalset) - len(wrong_eval), len(evalset)))
    print("0..999 (all trained on): %.2f%%" % (100 * acc_small))
    print("the %d numbers with at most two non-zero digits: %.2f%% (%d wrong)"
          % (len(round_numbers), 100 * acc_round, len(wrong_round)))
    for s, want, got in (wrong + wrong_eval + wrong_small + wrong_round)[:20]:
        print("  wrong: %-75s want %-7s got %s" % (s, want, got))

    ex_src = [number_to_words(n) for n in EXAMPLES]
    for s, h in zip(ex_src, translate(model, ex_src)):
        print("  %-75s -> %s" % (s, h))

    # Outputs.
    sd = model.state_dict()
    assert all(v.dtype == torch.float32 for v in sd.values())
    meta = collections.OrderedDict((k, str(CONFIG[k])) for k in ref.CONFIG_KEYS)
    if args.sentencepiece:
        wpath = os.path.join(HERE, "numbers_spm.weights.safetensors")
        ref.write_and_check(wpath, list(sd.items()), meta)
        print("wrote %s (%d bytes), %s, %s" % (wpath, os.path.getsize(wpath), *spm_models))
        return 0
    wpath = os.path.join(HERE, "numbers.weights.safetensors")
    ref.write_and_check(wpath, list(sd.items()), meta)
    for name, vocab in (("vocab.src.txt", SRC_VOCAB), ("vocab.tgt.txt", TGT_VOCAB)):
        with open(os.path.join(HERE, name), "w", encoding="utf-8") as f:
            f.write("".join(t + "\n" for t in vocab))
    with open(os.path.join(HERE, "heldout.tsv"), "w", encoding="utf-8") as f:
        for n in heldout:
            f.write("%s\t%d\n" % (number_to_words(n), n))
    with open(os.path.join(HERE, "examples.txt"), "w", encoding="utf-8") as f:
        for s in ex_src:
            f.write(s + "\n")
    print("wrote %s (%d bytes)" % (wpath, os.path.getsize(wpath)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
