#!/usr/bin/python3
"""kiln translate on a whole file (issue 27): tokens/s of the batcher's settings against one
batch at a time, with the same translations.

    /usr/bin/python3 bench/translate_file.py [--kiln-run PATH] [--model DIR]
        [--baseline-run PATH] [--rounds N] [--sentences N] [--grid]

Makes a file of --sentences (2000) number sentences of mixed lengths (numbers of 1 to 6
digits, as many of each, seed 27) with the number-to-words rules of examples/numbers/train.py
(copied here: the script needs only the standard library; the copy is checked against
examples/numbers/heldout.tsv), translates it with the number translator of examples/numbers
(the shared library the test build compiles: build/tests/translate_numbers.kiln) at each
setting, --rounds times each, the settings alternated within a round, and prints a table:
the median wall time, target tokens per second (each sentence's digits and its end token),
the ratio to one batch at a time, and whether the output equals the baseline's, line for
line. Settings:

  one batch at a time   --baseline-run: a kiln-run from before the batcher (every sentence
                        in one batch padded to the file's longest, max_batch rows at a time);
                        without it the row is left out
  default               kiln translate's defaults
  --inter-threads 1     the default token budget, one worker
  (--grid)              every --max-batch-tokens of 256..8192 with --inter-threads 1 and 2

Builds nothing: build kiln-run and the model first
(cmake --build build --target kiln-run translate_numbers). A kiln-run from before the batcher:
    git worktree add --detach /tmp/kiln-old 91685cb
    cmake -S /tmp/kiln-old -B /tmp/kiln-old/build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
    cmake --build /tmp/kiln-old/build --target kiln-run
"""

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUMBERS = os.path.join(ROOT, "examples", "numbers")

# The rules of examples/numbers/train.py (British English: "and" before the last part below
# one hundred, hyphenated twenty-one..ninety-nine).
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
    if n < 1000:
        return _below_1000(n)
    th, r = divmod(n, 1000)
    s = _below_1000(th) + " thousand"
    if r == 0:
        return s
    return s + (" and " if r < 100 else " ") + _below_1000(r)


def check_rules():
    with open(os.path.join(NUMBERS, "heldout.tsv"), encoding="utf-8") as f:
        for line in f:
            words, digits = line.rstrip("\n").split("\t")
            assert number_to_words(int(digits)) == words, (digits, words)


def sentences(count, seed=27):
    rng = random.Random(seed)
    out = []
    for i in range(count):
        digits = i % 6 + 1
        out.append(number_to_words(rng.randrange(10 ** (digits - 1) if digits > 1 else 0,
                                                 10 ** digits)))
    rng.shuffle(out)
    return out


def translate(kiln_run, model, path, args):
    cmd = [kiln_run, "translate", "--compiled", model,
           "--weights", os.path.join(NUMBERS, "numbers.weights.safetensors"),
           "--src-vocab", os.path.join(NUMBERS, "vocab.src.txt"),
           "--tgt-vocab", os.path.join(NUMBERS, "vocab.tgt.txt")] + args
    with open(path, "rb") as stdin:
        start = time.perf_counter()
        r = subprocess.run(cmd, stdin=stdin, capture_output=True, check=False)
        seconds = time.perf_counter() - start
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.decode()}")
    return seconds, r.stdout.decode()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kiln-run", default=os.path.join(ROOT, "build", "tools", "kiln-run"))
    p.add_argument("--model", default=os.path.join(ROOT, "build", "tests",
                                                   "translate_numbers.kiln"))
    p.add_argument("--baseline-run", help="a kiln-run from before the batcher")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--sentences", type=int, default=2000)
    p.add_argument("--grid", action="store_true", help="also every --max-batch-tokens "
                   "of 256..8192 with --inter-threads 1 and 2")
    a = p.parse_args()
    check_rules()
    lines = sentences(a.sentences)
    settings = []  # (name, kiln-run, args)
    if a.baseline_run:
        settings.append(("one batch at a time (before the batcher)", a.baseline_run,
                         ["--threads", "2"]))
    settings.append(("default", a.kiln_run, []))
    settings.append(("--inter-threads 1", a.kiln_run, ["--inter-threads", "1"]))
    if a.grid:
        for tokens in [256, 512, 1024, 2048, 4096, 8192]:
            for inter in [1, 2]:
                settings.append((f"--max-batch-tokens {tokens} --inter-threads {inter}",
                                 a.kiln_run, ["--max-batch-tokens", str(tokens),
                                              "--inter-threads", str(inter)]))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "sentences.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(s + "\n" for s in lines))
        times = {name: [] for name, _, _ in settings}
        outputs = {}
        for _ in range(a.rounds):
            for name, binary, args in settings:
                seconds, out = translate(binary, a.model, path, args)
                times[name].append(seconds)
                if outputs.setdefault(name, out) != out:
                    sys.exit(f"{name}: the output differs between rounds")
    reference = outputs[settings[0][0]]
    # Target tokens: each translation's digits and its end token.
    got = [line.split(" -> ", 1)[1] for line in reference.splitlines()]
    assert len(got) == len(lines)
    tokens = sum(len(t) + 1 for t in got)
    exact = sum(t.isdigit() and str(int(t)) == t and int(t) <= 999999 and
                number_to_words(int(t)) == s for s, t in zip(lines, got))
    cpu = "unknown CPU"
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    base = statistics.median(times[settings[0][0]])
    print(f"{len(lines)} sentences ({sum(len(s) for s in lines)} source characters, "
          f"{tokens} target tokens; {exact} translated exactly), {a.rounds} rounds, "
          f"{os.cpu_count()} CPUs: {cpu}")
    print()
    print("| setting | median s | target tokens/s | vs first row | same output |")
    print("|---|---:|---:|---:|---|")
    for name, _, _ in settings:
        t = statistics.median(times[name])
        same = "yes" if outputs[name] == reference else "NO"
        print(f"| {name} | {t:.3f} | {tokens / t:.0f} | {base / t:.2f}x | {same} |")
    if any(outputs[name] != reference for name, _, _ in settings):
        sys.exit("some setting's translations differ from the first row's")


if __name__ == "__main__":
    main()
