"""The kiln Python module (issue 28) on the golden models, compiled with kiln compile
--emit=shared by the build (tests/CMakeLists.txt: py_tiny, py_small). Run by ctest as
python_tests (Debian's /usr/bin/python3 -m pytest tests/python), with the environment:

  KILN_PYTHON_DIR   build/python (the module)
  KILN_PY_MODELS    the folder holding py_tiny/ and py_small/ (lib<name>.so each)
  KILN_RUN          kiln-run, the C++ API's generation for comparison (kiln generate)
  KILN_GOLDEN_DIR   tests/golden (PyTorch's outputs, weights and reference searches)
"""
import json
import os
import struct
import subprocess
import sys
import threading

import numpy as np
import pytest

sys.path.insert(0, os.environ.get("KILN_PYTHON_DIR", ""))
import kiln  # noqa: E402

MODELS = os.environ.get("KILN_PY_MODELS", "")
GOLDEN = os.environ.get("KILN_GOLDEN_DIR", "")
KILN_RUN = os.environ.get("KILN_RUN", "")
TOLERANCE = 1e-4  # the C++ golden tests' (tests/golden_checks.h)


def read_safetensors(path):
    """{name: numpy array} and the metadata of a safetensors file (F32, I64 only)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        dtype = {"F32": np.float32, "I64": np.int64}[info["dtype"]]
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + b:8 + n + e], dtype=dtype).reshape(info["shape"])
    return out, meta


def model(name, threads=2):
    cfg = name.split("_")[-1]
    return kiln.Model(os.path.join(MODELS, name), os.path.join(GOLDEN, cfg + ".weights.safetensors"),
                      threads=threads)


@pytest.fixture(scope="module")
def tiny():
    return model("py_tiny")


def test_entry_points_name_inputs_dtypes_and_symbolic_shapes(tiny):
    ep = tiny.entry_points
    assert set(ep) == {"forward", "encode", "prepare", "decode_step", "decode_step_restricted"}
    assert ep["decode_step_restricted"]["inputs"][-1] == {"name": "vocab", "dtype": "int64",
                                                          "shape": ["R"]}
    assert ep["decode_step_restricted"]["outputs"][0] == {"name": "logits", "dtype": "float32",
                                                          "shape": ["N", 1, "R"]}
    assert ep["forward"]["inputs"] == [{"name": "src", "dtype": "int64", "shape": ["B", "S"]},
                                       {"name": "tgt", "dtype": "int64", "shape": ["B", "T"]}]
    assert ep["forward"]["outputs"] == [{"name": "logits", "dtype": "float32",
                                         "shape": ["B", "T", 41]}]
    assert ep["encode"]["outputs"][0]["shape"] == ["B", "S", 24]
    assert tiny.name == "py_tiny"
    assert tiny.symbol_max("B") > 0 and tiny.symbol_max("nope") == -1
    assert tiny.config("nope") is None


@pytest.mark.parametrize("name,batches", [("py_tiny", ["tiny_b1", "tiny_b2"]),
                                          ("py_small", ["small_b1"])])
def test_golden_models_match_pytorch(name, batches):
    m = model(name)
    for batch in batches:
        inputs, _ = read_safetensors(os.path.join(GOLDEN, batch + ".inputs.safetensors"))
        want, _ = read_safetensors(os.path.join(GOLDEN, batch + ".expected.safetensors"))
        logits = m.forward(inputs["src"], inputs["tgt"])
        assert logits.dtype == np.float32 and logits.shape == want["logits"].shape
        err = float(np.abs(logits - want["logits"]).max())
        assert err <= TOLERANCE, (batch, err)
        # By name, through run(), and the encoder.
        same = m.run("forward", tgt=inputs["tgt"], src=inputs["src"])
        assert np.array_equal(same, logits)
        memory = m.encode(inputs["src"])
        err = float(np.abs(memory - want["memory"]).max())
        assert err <= TOLERANCE, (batch, "memory", err)
        print("[ python ] %s: forward max abs error %.3g" % (batch, err))


def test_int32_ids_and_non_contiguous_arrays_give_the_same_logits(tiny):
    inputs, _ = read_safetensors(os.path.join(GOLDEN, "tiny_b1.inputs.safetensors"))
    want = tiny.forward(inputs["src"], inputs["tgt"])
    got = tiny.forward(inputs["src"].astype(np.int32), inputs["tgt"].astype(np.int32))
    assert np.array_equal(got, want)
    src_f = np.asfortranarray(inputs["src"])
    assert np.array_equal(tiny.forward(src_f, inputs["tgt"]), want)
    assert np.array_equal(tiny.forward(inputs["src"].tolist(), inputs["tgt"].tolist()), want)


def cpp_generation(lib, weights, src, case_meta, end_id, tmp_path):
    """kiln generate (the C++ API through kiln-run) on the same sources: ids, lengths, scores."""
    out = os.path.join(str(tmp_path), "cpp.safetensors")
    pad = 0
    prompts = [" ".join(str(int(t)) for t in row if t != pad) for row in src]
    cmd = [KILN_RUN, "generate", "--compiled", lib, "--weights", weights, "-o", out,
           "--beam", case_meta["beam_size"], "--num-hypotheses", case_meta["num_hypotheses"],
           "--max-len", case_meta["max_decoding_length"],
           "--min-len", case_meta["min_decoding_length"],
           "--length-penalty", case_meta["length_penalty"], "--end-id", end_id] + prompts
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    got, _ = read_safetensors(out)
    return got


@pytest.mark.parametrize("case", ["greedy_a", "greedy_b", "beam_c", "beam_d"])
def test_generation_ids_equal_the_cpp_api_and_the_reference_search(tiny, case, tmp_path):
    ref, meta = read_safetensors(os.path.join(GOLDEN, "tiny_decode.safetensors"))
    opts = {k.split(".", 1)[1]: v for k, v in meta.items() if k.startswith(case + ".")}
    g = tiny.generate(ref["src"], beam_size=int(opts["beam_size"]),
                      num_hypotheses=int(opts["num_hypotheses"]),
                      max_decoding_length=int(opts["max_decoding_length"]),
                      min_decoding_length=int(opts["min_decoding_length"]),
                      length_penalty=float(opts["length_penalty"]),
                      start_id=int(meta["start_id"]), end_id=int(meta["end_id"]))
    want_ids = ref[case + ".ids"]
    L = min(g["ids"].shape[2], want_ids.shape[2])
    assert np.array_equal(g["lengths"], ref[case + ".lengths"])
    assert np.array_equal(g["ids"][:, :, :L], want_ids[:, :, :L])
    assert np.allclose(g["scores"], ref[case + ".scores"], atol=1e-4)
    for b, hyps in enumerate(g["tokens"]):
        for h, toks in enumerate(hyps):
            assert toks == [int(t) for t in g["ids"][b, h, :g["lengths"][b, h]]]
    cpp = cpp_generation(os.path.join(MODELS, "py_tiny"),
                         os.path.join(GOLDEN, "tiny.weights.safetensors"), ref["src"], opts,
                         meta["end_id"], tmp_path)
    assert np.array_equal(g["lengths"], cpp["lengths"])
    Lc = min(g["ids"].shape[2], cpp["ids"].shape[2])
    assert np.array_equal(g["ids"][:, :, :Lc], cpp["ids"][:, :, :Lc])
    assert np.array_equal(g["scores"], cpp["scores"])


def test_a_restricted_vocabulary_chooses_among_its_ids(tiny):
    ref, meta = read_safetensors(os.path.join(GOLDEN, "tiny_decode.safetensors"))
    start, end = int(meta["start_id"]), int(meta["end_id"])
    full = tiny.generate(ref["src"], beam_size=2, max_decoding_length=10, start_id=start,
                         end_id=end)
    # Every id: the unrestricted search.
    every = tiny.generate(ref["src"], beam_size=2, max_decoding_length=10, start_id=start,
                          end_id=end, vocabulary=list(range(41)))
    assert every["tokens"] == full["tokens"]
    assert np.allclose(every["scores"], full["scores"], atol=1e-4)
    # Without the ids the unrestricted search chose most, only the others (and the end token).
    used = sorted({t for hyps in full["tokens"] for toks in hyps for t in toks},
                  key=lambda t: -sum(toks.count(t) for hyps in full["tokens"] for toks in hyps))
    allowed = [v for v in range(41) if v not in used[:2]]
    some = tiny.generate(ref["src"], beam_size=2, max_decoding_length=10, start_id=start,
                         end_id=end, vocabulary=allowed)
    assert some["tokens"] != full["tokens"]
    assert all(t in allowed for hyps in some["tokens"] for toks in hyps for t in toks)
    with pytest.raises(kiln.Error, match="41"):
        tiny.generate(ref["src"], vocabulary=[3, 41])


def test_streaming_calls_back_each_token_in_order(tiny):
    ref, meta = read_safetensors(os.path.join(GOLDEN, "tiny_decode.safetensors"))
    src = ref["src"][:1]
    seen = []
    g = tiny.generate(src, max_decoding_length=12, start_id=int(meta["start_id"]),
                      end_id=int(meta["end_id"]),
                      on_token=lambda sentence, step, token: seen.append((sentence, step, token)))
    assert [t for _, _, t in seen] == g["tokens"][0][0]
    assert [s for _, s, _ in seen] == list(range(len(seen)))

    def fails(sentence, step, token):
        raise ValueError("stop here")
    with pytest.raises(ValueError, match="stop here"):
        tiny.generate(src, max_decoding_length=12, on_token=fails)
    # The model is still usable.
    assert tiny.generate(src, max_decoding_length=12, start_id=int(meta["start_id"]),
                         end_id=int(meta["end_id"]))["tokens"] == g["tokens"]


def test_four_threads_on_one_model_give_identical_results():
    m = model("py_small", threads=1)
    inputs, _ = read_safetensors(os.path.join(GOLDEN, "small_b1.inputs.safetensors"))
    want = m.forward(inputs["src"], inputs["tgt"])
    results, errors = [None] * 4, []

    def work(i):
        try:
            for _ in range(10):
                out = m.forward(inputs["src"], inputs["tgt"])
                if results[i] is None or np.array_equal(results[i], out):
                    results[i] = out
                else:
                    errors.append("thread %d: results differ between calls" % i)
        except Exception as e:  # noqa: BLE001: reported below
            errors.append(repr(e))
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for r in results:
        assert np.array_equal(r, want)


def test_errors_are_kiln_errors_with_kiln_messages(tiny):
    inputs, _ = read_safetensors(os.path.join(GOLDEN, "tiny_b1.inputs.safetensors"))
    bad = inputs["src"].copy()
    bad[0, 0] = 10**6
    with pytest.raises(kiln.Error, match="token id"):
        tiny.forward(bad, inputs["tgt"])
    assert issubclass(kiln.Error, RuntimeError)
    with pytest.raises(kiln.Error, match="takes 2 input"):
        tiny.forward(inputs["src"])
    with pytest.raises(kiln.Error, match="must be integer ids"):
        tiny.forward(inputs["src"].astype(np.float32), inputs["tgt"])
    with pytest.raises(kiln.Error, match="no entry point 'nope'"):
        tiny.run("nope", inputs["src"])
    with pytest.raises(kiln.Error, match="has no input 'source'"):
        tiny.run("forward", source=inputs["src"], tgt=inputs["tgt"])
    with pytest.raises(AttributeError):
        tiny.nope
    with pytest.raises(kiln.Error, match="does not exist"):
        kiln.Model("/nonexistent/lib", None)
    with pytest.raises(kiln.Error, match="cannot open safetensors file"):
        kiln.Model(os.path.join(MODELS, "py_tiny"), "/nonexistent.safetensors")
    with pytest.raises(kiln.Error, match="beam"):
        tiny.generate(inputs["src"], beam_size=0)
    # Nothing broke: the model still answers.
    assert tiny.forward(inputs["src"], inputs["tgt"]).shape == (3, 6, 41)


def test_laid_out_weights_give_the_checkpoints_logits_and_stale_ones_are_refused(tiny, tmp_path):
    """Model.save_weights (kiln pack-weights): the file, given as the weights, is mapped and
    gives the checkpoint's logits bit for bit; another model's is refused with kiln's message."""
    inputs, _ = read_safetensors(os.path.join(GOLDEN, "tiny_b1.inputs.safetensors"))
    packed = str(tmp_path / "tiny.kiln-weights")
    tiny.save_weights(packed)
    mapped = kiln.Model(os.path.join(MODELS, "py_tiny"), packed, threads=2)
    want = tiny.forward(inputs["src"], inputs["tgt"])
    assert np.array_equal(mapped.forward(inputs["src"], inputs["tgt"]), want)
    with pytest.raises(kiln.Error, match="were written for another model or weight layout"):
        kiln.Model(os.path.join(MODELS, "py_small"), packed)
    with pytest.raises(kiln.Error, match="cannot write laid-out weights"):
        tiny.save_weights("/nonexistent/dir/w.kiln-weights")


NUMBERS = os.environ.get("KILN_NUMBERS_DIR", "")


@pytest.fixture(scope="module")
def numbers():
    return (kiln.Model(os.path.join(MODELS, "py_numbers"),
                       os.path.join(NUMBERS, "numbers.weights.safetensors"), threads=2),
            kiln.Tokenizer(os.path.join(NUMBERS, "vocab.src.txt")),
            kiln.Tokenizer(os.path.join(NUMBERS, "vocab.tgt.txt")))


def heldout(n):
    with open(os.path.join(NUMBERS, "heldout.tsv"), encoding="utf-8") as f:
        return [line.rstrip("\n").split("\t") for line in f][:n]


def test_the_number_translator_from_python_equals_kiln_translate(numbers, tmp_path):
    model, src_vocab, tgt_vocab = numbers
    pairs = heldout(40)
    pad = int(model.config("pad_id"))
    ids = [src_vocab.encode(words) for words, _ in pairs]
    src = np.full((len(ids), max(len(i) for i in ids)), pad, dtype=np.int64)
    for row, i in zip(src, ids):
        row[:len(i)] = i
    got = []
    for start in range(0, len(ids), 16):  # the model's max_batch
        g = model.generate(src[start:start + 16], beam_size=4)
        got += [tgt_vocab.decode(h[0]) for h in g["tokens"]]
    assert got == [digits for _, digits in pairs]
    cmd = [KILN_RUN, "translate", "--compiled", os.path.join(MODELS, "py_numbers"), "--weights",
           os.path.join(NUMBERS, "numbers.weights.safetensors"), "--src-vocab",
           os.path.join(NUMBERS, "vocab.src.txt"), "--tgt-vocab",
           os.path.join(NUMBERS, "vocab.tgt.txt"), "--beam", "4"]
    out = subprocess.run(cmd, input="\n".join(w for w, _ in pairs) + "\n", check=True,
                         capture_output=True, text=True).stdout
    assert [line.split(" -> ")[1] for line in out.splitlines()] == got
    assert src_vocab.decode(src_vocab.encode("forty-two")) == "forty-two"
    with pytest.raises(kiln.Error, match="not in the vocabulary|no token"):
        src_vocab.encode("FORTY")
    with pytest.raises(kiln.Error):
        kiln.Tokenizer(os.path.join(str(tmp_path), "missing.txt"))


def test_greedy_streaming_never_calls_back_a_token_after_the_end(numbers):
    # Regression: when the end token was the best choice, greedy search used to call back
    # the runner-up token too (runtime/generate.cpp), one token the output does not have.
    model, src_vocab, tgt_vocab = numbers
    for words, _ in heldout(30) + [["forty two", ""]]:
        seen = []
        g = model.generate(np.array([src_vocab.encode(words)]),
                           on_token=lambda s, step, token: seen.append(token))
        assert seen == g["tokens"][0][0], words


def test_the_python_example_runs(tmp_path):
    example = os.path.join(os.environ.get("KILN_EXAMPLES_DIR", ""), "translate_numbers.py")
    env = dict(os.environ, PYTHONPATH=os.environ.get("KILN_PYTHON_DIR", ""))
    out = subprocess.run([sys.executable, example, os.path.join(MODELS, "py_numbers"),
                          "three hundred and twelve thousand and one"], check=True,
                         capture_output=True, text=True, env=env).stdout
    assert out.splitlines() == ["three hundred and twelve thousand and one -> 312001",
                                "streamed: 312001"]


EXAMPLES = os.path.join(NUMBERS, "..")


@pytest.mark.parametrize("path,kind", [("tokenizers/numbers.spm.model", "sentencepiece"),
                                       ("tokenizers/bpe/vocab.json", "bpe"),
                                       ("numbers/vocab.src.txt", "chars")])
def test_tokenizers_round_trip_and_stream_whole_characters(path, kind):
    t = kiln.Tokenizer(os.path.join(EXAMPLES, path))
    assert t.kind == kind
    texts = [w for w, _ in heldout(20)]
    if kind != "chars":
        texts += ["héllo wörld", "数字 ✓ 🙂"]
    for text in texts:
        ids = t.encode(text)
        assert t.decode(ids) == text
        d = t.stream()
        streamed = "".join(d.push(i) for i in ids) + d.finish()
        assert streamed == text
    with pytest.raises(kiln.Error, match="does not exist"):
        kiln.Tokenizer(os.path.join(EXAMPLES, "no_such.model"))


def test_the_dask_example_translates_the_heldout_file_as_the_cli(tmp_path):
    # examples/python/dask_translate.py: a LocalCluster of 2 worker processes (dashboard off),
    # each with the model loaded once through the module; the same lines as kiln translate.
    src = os.path.join(str(tmp_path), "heldout.txt")
    with open(src, "w", encoding="utf-8") as f:
        f.write("".join(words + "\n" for words, _ in heldout(500)))
    lib = os.path.join(MODELS, "py_numbers")
    env = dict(os.environ, PYTHONPATH=os.environ.get("KILN_PYTHON_DIR", ""))
    example = os.path.join(os.environ.get("KILN_EXAMPLES_DIR", ""), "dask_translate.py")
    dask = subprocess.run([sys.executable, example, lib, src, "--workers", "2", "--chunk", "50"],
                          check=True, capture_output=True, text=True, env=env, timeout=300).stdout
    with open(src, encoding="utf-8") as f:
        cli = subprocess.run([KILN_RUN, "translate", "--compiled", lib, "--weights",
                              os.path.join(NUMBERS, "numbers.weights.safetensors"), "--src-vocab",
                              os.path.join(NUMBERS, "vocab.src.txt"), "--tgt-vocab",
                              os.path.join(NUMBERS, "vocab.tgt.txt")],
                             stdin=f, check=True, capture_output=True, text=True).stdout
    assert len(dask.splitlines()) == 500
    assert dask.splitlines() == cli.splitlines()
    right = sum(line.split(" -> ")[1] == digits
                for line, (_, digits) in zip(dask.splitlines(), heldout(500)))
    print("[ python ] Dask example: 500 held-out sentences, %d translated exactly" % right)
