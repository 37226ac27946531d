"""kiln serve (issue 28, acceptance point 2) answered by real clients on loopback: curl, Python's
requests, a concurrent client checking every batched answer against the same input alone, the
documented errors (the server serving on after each), a full queue, SIGTERM under load, the
metrics, and two servers behind Debian's nginx with one SIGKILLed mid-run (acceptance point 3).
Each test starts its own servers (and nginx, with its own configuration and pid file in a
temporary folder) on 127.0.0.1 with free ports and stops them by PID. Run by
ctest as serve_tests (Debian's /usr/bin/python3 -m pytest tests/python/test_serve.py), with the
environment of python_tests (tests/python/test_kiln.py) and

  KILN_BIN          the kiln executable (kiln serve execs kiln-run serve)
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import requests

sys.path.insert(0, os.path.dirname(__file__))
from test_kiln import GOLDEN, MODELS, NUMBERS, TOLERANCE, kiln, read_safetensors  # noqa: E402

KILN = os.environ.get("KILN_BIN", "")
TINY = os.path.join(MODELS, "py_tiny")
TINY_WEIGHTS = os.path.join(GOLDEN, "tiny.weights.safetensors")
# A decoder-only model (examples/models/llama.cpp, the small config) as a shared library.
LLAMA = os.environ.get("KILN_LLAMA_LIB", "")
LLAMA_WEIGHTS = os.environ.get("KILN_LLAMA_WEIGHTS", "")


class Server:
    """A kiln serve process on a free loopback port (the first line it prints)."""

    def __init__(self, *args, lib=TINY, weights=TINY_WEIGHTS, port=0):
        self.proc = subprocess.Popen([KILN, "serve", "--compiled", lib, "--weights", weights,
                                      "--port", str(port)] + list(args),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.strip().isdigit():
            self.proc.kill()
            raise AssertionError("kiln serve did not print its port: %r %s" %
                                 (line, self.proc.stderr.read()))
        self.url = "http://127.0.0.1:%d" % int(line)

    def infer(self, body, model="py_tiny", **kw):
        data = body if isinstance(body, (str, bytes)) else json.dumps(body)
        return requests.post("%s/v2/models/%s/infer" % (self.url, model), data=data,
                             timeout=30, **kw)

    def stop(self):
        """SIGTERM; the exit status (0 for a drained server)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def server_factory():
    started = []

    def start(*args, **kw):
        s = Server(*args, **kw)
        started.append(s)
        return s
    yield start
    for s in started:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()


def tensor(name, array, datatype="INT64"):
    return {"name": name, "shape": list(array.shape), "datatype": datatype,
            "data": array.reshape(-1).tolist()}


def forward_body(src, tgt, **extra):
    return dict({"inputs": [tensor("src", src), tensor("tgt", tgt)]}, **extra)


def output(resp, name="logits"):
    assert resp.status_code == 200, resp.text
    for o in resp.json()["outputs"]:
        if o["name"] == name:
            dtype = {"FP32": np.float32, "INT64": np.int64, "BOOL": bool}[o["datatype"]]
            return np.array(o["data"], dtype=dtype).reshape(o["shape"])
    raise AssertionError("no output %r in %s" % (name, resp.text[:200]))


def metrics_when(server, name, value):
    """/metrics as {series: value} once `name` reaches `value` (a request is counted just after
    its answer is written, so a client can ask before its last answer is counted)."""
    for _ in range(200):
        text = requests.get(server.url + "/metrics", timeout=10).text
        values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
                  if line and not line.startswith("#")}
        if values.get(name) == value:
            return values
        time.sleep(0.01)
    raise AssertionError("%s is %s, not %s" % (name, values.get(name), value))


@pytest.fixture(scope="module")
def golden():
    inputs, _ = read_safetensors(os.path.join(GOLDEN, "tiny_b2.inputs.safetensors"))
    want, _ = read_safetensors(os.path.join(GOLDEN, "tiny_b2.expected.safetensors"))
    return inputs, want


@pytest.fixture(scope="module")
def tiny():
    return kiln.Model(TINY, TINY_WEIGHTS, threads=1)


def test_curl_answers_health_and_infer(server_factory, golden, tmp_path):
    s = server_factory()
    inputs, want = golden
    out = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", s.url + "/v2/health/live"],
                         capture_output=True, text=True, check=True).stdout.split("\n")
    assert out == ['{"live":true}', "200"]
    out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                          s.url + "/v2/health/ready"], capture_output=True, text=True).stdout
    assert out == "200"
    body = tmp_path / "infer.json"
    body.write_text(json.dumps(forward_body(inputs["src"], inputs["tgt"])))
    out = subprocess.run(["curl", "-s", "-f", "-H", "Content-Type: application/json",
                          "--data-binary", "@%s" % body, s.url + "/v2/models/py_tiny/infer"],
                         capture_output=True, text=True, check=True).stdout
    logits = json.loads(out)["outputs"][0]
    got = np.array(logits["data"], dtype=np.float32).reshape(logits["shape"])
    assert got.shape == want["logits"].shape
    assert float(np.abs(got - want["logits"]).max()) <= TOLERANCE
    assert s.stop() == 0


def test_requests_metadata_and_every_entry_point(server_factory, golden, tiny):
    s = server_factory()
    inputs, want = golden
    meta = requests.get(s.url + "/v2/models/py_tiny", timeout=10).json()
    assert meta["name"] == "py_tiny" and meta["platform"] == "kiln"
    assert meta["default_entry_point"] == "forward"
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("src", "INT64", [-1, -1]), ("tgt", "INT64", [-1, -1])]
    assert [(t["name"], t["datatype"], t["shape"], t["dims"]) for t in meta["outputs"]] == [
        ("logits", "FP32", [-1, -1, 41], ["B", "T", "41"])]
    assert set(meta["entry_points"]) == {"forward", "encode", "prepare", "decode_step",
                                         "decode_step_restricted"}
    assert meta["entry_points"]["forward"]["max_batch"] == 4
    assert meta["entry_points"]["decode_step"]["max_batch"] == 0  # updates caches: never batched
    assert meta["entry_points"]["decode_step_restricted"]["max_batch"] == 0
    assert requests.get(s.url + "/v2/models/py_tiny/ready", timeout=10).json()["ready"] is True
    # forward: PyTorch's logits (the golden file) and the Python module's, with the id echoed.
    r = s.infer(forward_body(inputs["src"], inputs["tgt"], id="req-7"))
    assert r.json()["id"] == "req-7" and r.json()["model_name"] == "py_tiny"
    logits = output(r)
    assert float(np.abs(logits - want["logits"]).max()) <= TOLERANCE
    assert np.array_equal(logits, tiny.forward(inputs["src"], inputs["tgt"]))
    # Another entry point through parameters.entry_point, one output asked for by name.
    r = s.infer({"inputs": [tensor("src", inputs["src"])], "parameters": {"entry_point": "encode"},
                 "outputs": [{"name": "memory"}]})
    assert r.json()["entry_point"] == "encode"
    memory = output(r, "memory")
    assert np.array_equal(memory, tiny.encode(inputs["src"]))
    assert float(np.abs(memory - want["memory"]).max()) <= TOLERANCE
    assert s.stop() == 0


def test_concurrent_clients_get_their_own_unbatched_results(server_factory, tiny):
    # A queue delay long enough that concurrent requests meet in a batch.
    s = server_factory("--max-queue-delay-ms", "20", "--workers", "2")
    rng = np.random.default_rng(7)
    cases = []
    for i in range(64):
        rows = int(rng.integers(1, 4))
        src = rng.integers(3, 37, size=(rows, 6)).astype(np.int64)
        tgt = rng.integers(3, 41, size=(rows, 5)).astype(np.int64)
        cases.append((src, tgt, tiny.forward(src, tgt)))
    failures, inexact = [], []

    def client(k):
        session = requests.Session()
        for i in range(k, len(cases), 8):
            src, tgt, want = cases[i]
            r = session.post(s.url + "/v2/models/py_tiny/infer", timeout=30,
                             data=json.dumps(forward_body(src, tgt, id=str(i))))
            got = output(r)
            if r.json()["id"] != str(i) or got.shape != want.shape or \
                    float(np.abs(got - want).max()) > 1e-5:
                failures.append((i, r.text[:200]))
            elif not np.array_equal(got, want):
                inexact.append(i)
    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    print("[ serve ] %d of %d batched answers differ from the unbatched call within 1e-5" % (
        len(inexact), len(cases)))
    values = metrics_when(s, 'kiln_requests_total{endpoint="infer",status="200"}', 64)
    assert values["kiln_batch_size_sum"] == 64
    assert values["kiln_batch_size_count"] < 64, "no two requests were batched"
    assert values['kiln_batch_size_bucket{le="1"}'] < values["kiln_batch_size_count"]
    assert values['kiln_request_duration_seconds_count{endpoint="infer"}'] == 64
    assert values["kiln_queue_depth"] == 0
    assert s.stop() == 0


def test_bad_requests_get_the_documented_status_and_the_server_serves_on(server_factory,
                                                                         golden):
    s = server_factory("--max-body-bytes", "8K")
    inputs, want = golden
    src, tgt = inputs["src"], inputs["tgt"]
    good = forward_body(src, tgt)

    def check(resp, status, message):
        assert resp.status_code == status, resp.text
        assert resp.headers["Content-Type"] == "application/json"
        assert message in resp.json()["error"], resp.json()["error"]
        # Still serving, and still right.
        assert float(np.abs(output(s.infer(good)) - want["logits"]).max()) <= TOLERANCE

    check(s.infer('{"inputs": [ {"name": "src",'), 400, "malformed JSON")
    check(s.infer("[1, 2]"), 400, "the request body must be a JSON object, got array")
    check(s.infer({"input": []}), 400, "missing field 'inputs'")
    check(s.infer({"inputs": [tensor("src", src)]}), 400,
          "inputs: entry point 'forward' needs input 'tgt'")
    check(s.infer({"inputs": [tensor("src", src), {"name": "tgt", "shape": [1, 2],
                                                   "datatype": "INT64"}]}), 400,
          "inputs[1]: missing field 'data'")
    check(s.infer(forward_body(src, tgt.astype(np.float32))), 400,
          "inputs[1].data[0]: expected an integer (INT64), got %s" % json.dumps(float(tgt[0, 0])))
    bad_dtype = forward_body(src, tgt)
    bad_dtype["inputs"][1]["datatype"] = "FP32"
    check(s.infer(bad_dtype), 400, "inputs[1].datatype: input 'tgt' of 'forward' is INT64, "
                                   "got 'FP32'")
    floats = forward_body(src, tgt)
    floats["inputs"][0]["data"][2] = 1.5
    check(s.infer(floats), 400, "inputs[0].data[2]: expected an integer (INT64), got 1.5")
    nested = forward_body(src, tgt)
    nested["inputs"][0]["data"] = [[[[1]]]]
    deeper = "inputs[0].data: the lists are nested deeper than the shape's 2 dims"
    check(s.infer(nested), 400, deeper)
    check(s.infer(json.dumps(nested).replace("[[[[1]]]]", "[" * 3000 + "1" + "]" * 3000)), 400,
          deeper)
    long = forward_body(src, tgt)
    long["inputs"][0]["data"][0] = "x" * 3000
    check(s.infer(long), 400, "inputs[0].data[0]: expected an integer (INT64), got \"%s..." % (
        "x" * 76))
    rank = forward_body(src, tgt)
    rank["inputs"][0]["shape"] = [int(np.prod(src.shape))]
    check(s.infer(rank), 400, "inputs[0].shape: input 'src' of 'forward' has rank 2 ([B, S])")
    count = forward_body(src, tgt)
    count["inputs"][1]["data"] = count["inputs"][1]["data"][:-1]
    check(s.infer(count), 400, "inputs[1].data: shape %s holds %d values, got %d" % (
        json.dumps(list(tgt.shape)).replace(" ", ""), tgt.size, tgt.size - 1))
    out_of_range = forward_body(src, tgt)
    out_of_range["inputs"][0]["data"][0] = 1000
    check(s.infer(out_of_range), 400, "1000")
    check(s.infer({"inputs": [tensor("nope", src)]}), 400,
          "inputs[0].name: entry point 'forward' has no input 'nope' (its inputs: src, tgt)")
    check(s.infer(dict(good, parameters={"entry_point": "backward"})), 400,
          "parameters.entry_point: model 'py_tiny' has no entry point 'backward'")
    check(s.infer(dict(good, outputs=[{"name": "probs"}])), 400,
          "outputs[0].name: entry point 'forward' has no output 'probs'")
    big = forward_body(np.ones((4, 400), dtype=np.int64), np.ones((4, 400), dtype=np.int64))
    check(s.infer(big), 413, "the request body is larger than 8192 bytes (--max-body-bytes)")
    check(s.infer(good, model="py_other"), 404, "unknown model 'py_other' (this server serves "
                                                "'py_tiny')")
    check(requests.get(s.url + "/v2/nothing", timeout=10), 404, "no such path: GET /v2/nothing")
    assert s.stop() == 0


def test_a_full_queue_gets_503_with_retry_after(server_factory, golden):
    # One worker holds a batch open for a second: the queue (2) fills at once.
    s = server_factory("--max-queue", "2", "--workers", "1", "--max-queue-delay-ms", "1000")
    inputs, want = golden
    body = json.dumps(forward_body(inputs["src"][:1], inputs["tgt"][:1]))
    results = [None] * 10

    def client(i):
        results[i] = s.infer(body)
    threads = [threading.Thread(target=client, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(r.status_code for r in results)
    # The two admitted wait out the second; the others come within it (on a busy machine a
    # late thread may find the queue free again, so not all need to be refused).
    assert codes.count(503) >= 1 and set(codes) == {200, 503}, codes
    for r in results:
        if r.status_code == 503:
            assert r.headers["Retry-After"] == "1"
            assert "the request queue is full (2 requests waiting or running, --max-queue)" in \
                r.json()["error"]
        else:
            assert float(np.abs(output(r) - want["logits"][:1]).max()) <= TOLERANCE
    assert s.infer(body).status_code == 200
    assert s.stop() == 0


def test_a_request_past_the_time_limit_gets_504(server_factory, golden):
    # The batch waits a second for company; the request's limit is 100 ms.
    s = server_factory("--request-timeout-ms", "100", "--max-queue-delay-ms", "1000")
    inputs, _ = golden
    body = forward_body(inputs["src"][:1], inputs["tgt"][:1])
    r = s.infer(body)
    assert r.status_code == 504, r.text
    assert r.json()["error"] == "the request took longer than 100 ms (--request-timeout-ms)"
    metrics_when(s, 'kiln_requests_total{endpoint="infer",status="504"}', 1)
    assert s.stop() == 0


def test_bearer_token(server_factory, golden):
    s = server_factory("--auth-token", "s3cret")
    inputs, _ = golden
    body = forward_body(inputs["src"], inputs["tgt"])
    r = s.infer(body)
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    assert "missing 'Authorization: Bearer TOKEN'" in r.json()["error"]
    r = s.infer(body, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401 and r.json()["error"] == "the bearer token is wrong"
    assert s.infer(body, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert requests.get(s.url + "/v2/health/ready", timeout=10).status_code == 200
    assert requests.get(s.url + "/metrics", timeout=10).status_code == 401
    assert s.stop() == 0


def test_generate_text_and_streamed_tokens_equal_the_python_module(server_factory):
    lib = os.path.join(MODELS, "py_numbers")
    weights = os.path.join(NUMBERS, "numbers.weights.safetensors")
    s = server_factory("--src-vocab", os.path.join(NUMBERS, "vocab.src.txt"), "--tgt-vocab",
                       os.path.join(NUMBERS, "vocab.tgt.txt"), lib=lib, weights=weights)
    model = kiln.Model(lib, weights, threads=1)
    src_vocab = kiln.Tokenizer(os.path.join(NUMBERS, "vocab.src.txt"))
    tgt_vocab = kiln.Tokenizer(os.path.join(NUMBERS, "vocab.tgt.txt"))
    words = ["forty-two", "three hundred and seven", "nine"]
    url = s.url + "/v2/models/py_numbers/generate"
    r = requests.post(url, json={"text": words, "beam_size": 4, "num_hypotheses": 2}, timeout=30)
    assert r.status_code == 200, r.text
    for w, result in zip(words, r.json()["results"]):
        g = model.generate(np.array([src_vocab.encode(w)]), beam_size=4, num_hypotheses=2)
        assert [h["ids"] for h in result["hypotheses"]] == g["tokens"][0]
        assert [h["text"] for h in result["hypotheses"]] == [tgt_vocab.decode(t)
                                                             for t in g["tokens"][0]]
    assert r.json()["results"][0]["hypotheses"][0]["text"] == "42"
    # Ids in, and streamed: one event per token, then the whole result.
    ids = src_vocab.encode("one hundred and five")
    want = model.generate(np.array([ids]))["tokens"][0][0]
    r = requests.post(url, json={"ids": [ids]}, timeout=30)
    assert r.json()["results"][0]["hypotheses"][0]["ids"] == want
    r = requests.post(url, json={"ids": [ids], "stream": True}, timeout=30, stream=True)
    assert r.status_code == 200 and r.headers["Content-Type"] == "text/event-stream"
    events = [e for e in r.text.split("\n\n") if e]
    tokens = [json.loads(e[len("data: "):])["token"] for e in events[:-1]]
    assert tokens == want
    # The streamed text (whole characters, tokenizers/tokenizer.h's StreamDecoder) adds up.
    assert "".join(json.loads(e[len("data: "):])["text"] for e in events[:-1]) == "105"
    assert events[-1].startswith("event: done\ndata: ")
    assert json.loads(events[-1].split("data: ", 1)[1])["results"][0]["hypotheses"][0]["text"] \
        == "105"
    # Errors name the field; the server serves on.
    for body, message in [({"ids": [[1, 5000]]}, "ids[0][1]: token id 5000 is out of range"),
                          ({"text": "x", "beam": 2}, "unknown field 'beam'"),
                          ({"ids": [ids], "beam_size": 0}, "beam_size: expected an integer"),
                          ({"ids": [ids, ids], "stream": True}, "streaming needs one sentence"),
                          ({"text": "FORTY"}, "text[0]: ")]:
        r = requests.post(url, json=body, timeout=30)
        assert r.status_code == 400 and message in r.json()["error"], (body, r.text)
    assert requests.post(url, json={"ids": [ids]}, timeout=30).status_code == 200
    assert s.stop() == 0


def test_generate_with_a_restricted_vocabulary(server_factory):
    """/generate's `vocabulary` (CTranslate2's vocabulary restriction): the ids the Python module
    gives with the same restriction, which leaves out a token the unrestricted answer uses, so
    the answer changes; concurrent requests with other restrictions or none are batched only
    with their own kind (each gets its answer alone); bad restrictions name the field; a
    decoder-only model refuses it."""
    lib = os.path.join(MODELS, "py_numbers")
    weights = os.path.join(NUMBERS, "numbers.weights.safetensors")
    s = server_factory("--max-queue-delay-ms", "50", lib=lib, weights=weights)
    model = kiln.Model(lib, weights, threads=1)
    src_vocab = kiln.Tokenizer(os.path.join(NUMBERS, "vocab.src.txt"))
    tgt_vocab = kiln.Tokenizer(os.path.join(NUMBERS, "vocab.tgt.txt"))
    ids = [src_vocab.encode(w) for w in ["forty-two", "three hundred and seven", "nine"]]
    free = model.generate(np.array([ids[0]]), beam_size=2)["tokens"][0][0]
    # Every target token but the first one the unrestricted translation of "forty-two" uses.
    allowed = [t for t in range(tgt_vocab.size) if t != free[0]]
    url = s.url + "/v2/models/py_numbers/generate"
    jobs = [(ids[n % 3], None if n % 2 else allowed) for n in range(8)]
    want = []
    for src, vocabulary in jobs:
        kw = {"vocabulary": vocabulary} if vocabulary else {}
        want.append(model.generate(np.array([src]), beam_size=2, **kw)["tokens"][0][0])
    assert want[0] != free and free[0] not in want[0], (want[0], free)
    got = [None] * len(jobs)

    def client(n):
        src, vocabulary = jobs[n]
        body = {"ids": [src], "beam_size": 2}
        if vocabulary:
            body["vocabulary"] = vocabulary
        r = requests.post(url, json=body, timeout=30)
        got[n] = r.json()["results"][0]["hypotheses"][0]["ids"] if r.status_code == 200 \
            else r.text
    threads = [threading.Thread(target=client, args=(n,)) for n in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want
    for body, message in [
            ({"ids": [ids[0]], "vocabulary": []}, "vocabulary: expected a non-empty array"),
            ({"ids": [ids[0]], "vocabulary": [3, 5000]},
             "vocabulary[1]: token id 5000 is out of range [0, %d)" % tgt_vocab.size),
            ({"ids": [ids[0]], "vocabulary": [3, "x"]}, "vocabulary[1]: expected a token id"),
            ({"ids": [ids[0]], "vocabulary": 3}, "vocabulary: expected a non-empty array")]:
        r = requests.post(url, json=body, timeout=30)
        assert r.status_code == 400 and message in r.json()["error"], (body, r.text)
    assert requests.post(url, json={"ids": [ids[0]]}, timeout=30).status_code == 200
    assert s.stop() == 0
    llama = server_factory(lib=LLAMA, weights=LLAMA_WEIGHTS)
    r = requests.post(llama.url + "/v2/models/llama/generate",
                      json={"ids": [[3, 4]], "vocabulary": [3, 4]}, timeout=30)
    assert r.status_code == 400 and "needs an encoder–decoder model" in r.json()["error"], r.text
    assert llama.stop() == 0


def differences(n, results, want):
    """Request n's /generate results against the Python module's generation `want`: for each
    sentence whose ids or scores (within 1e-4) differ, (n, sentence, got, wanted)."""
    out = []
    for b, result in enumerate(results):
        got = [h["ids"] for h in result["hypotheses"]]
        scores = [h["score"] for h in result["hypotheses"]]
        if got != want["tokens"][b] or not np.allclose(scores, want["scores"][b], atol=1e-4):
            out.append((n, b, got, want["tokens"][b]))
    return out


def test_concurrent_generation_is_batched_and_equals_each_request_alone(server_factory):
    lib = os.path.join(MODELS, "py_numbers")
    weights = os.path.join(NUMBERS, "numbers.weights.safetensors")
    s = server_factory("--max-queue-delay-ms", "20", lib=lib, weights=weights)
    model = kiln.Model(lib, weights, threads=1)
    src_vocab = kiln.Tokenizer(os.path.join(NUMBERS, "vocab.src.txt"))
    with open(os.path.join(NUMBERS, "heldout.tsv"), encoding="utf-8") as f:
        words = [line.split("\t")[0] for line in f][:48]
    requests_, at = [], 0
    while at < len(words):  # 24 requests of 1 to 3 sentences
        requests_.append(words[at:at + 1 + len(requests_) % 3])
        at += len(requests_[-1])
    want = []
    for sentences in requests_:
        ids = [src_vocab.encode(w) for w in sentences]
        src = np.zeros((len(ids), max(len(i) for i in ids)), dtype=np.int64)  # pad_id 0
        for row, i in zip(src, ids):
            row[:len(i)] = i
        want.append(model.generate(src, beam_size=2, num_hypotheses=2))
    failures = []

    def client(k):
        for n in range(k, len(requests_), 8):
            ids = [src_vocab.encode(w) for w in requests_[n]]
            r = requests.post(s.url + "/v2/models/py_numbers/generate", timeout=30,
                              json={"ids": ids, "beam_size": 2, "num_hypotheses": 2})
            if r.status_code != 200:
                failures.append(r.text)
                continue
            failures.extend(differences(n, r.json()["results"], want[n]))
    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    values = metrics_when(s, 'kiln_requests_total{endpoint="generate",status="200"}',
                          len(requests_))
    assert values['kiln_batch_size_sum{endpoint="generate"}'] == len(requests_)
    assert values['kiln_batch_size_count{endpoint="generate"}'] < len(requests_)
    assert values['kiln_batch_rows_total{endpoint="generate"}'] == len(words)
    assert s.stop() == 0


def test_generation_requests_join_a_running_batch(server_factory):
    """A decoder-only model's /generate requests join the running generation at a step
    boundary (kiln_generator_*) instead of waiting for it to finish: with one worker, 6 clients
    whose requests of different lengths overlap, some join a running batch, and each gets the
    tokens and scores it gets alone, a streamed one its tokens as they come."""
    s = server_factory("--workers", "1", lib=LLAMA, weights=LLAMA_WEIGHTS)
    model = kiln.Model(LLAMA, LLAMA_WEIGHTS, threads=1)
    rng = np.random.default_rng(7)
    jobs = []  # (prompts, max_decoding_length, beam_size)
    for n in range(36):
        prompts = [rng.integers(3, 61, size=int(rng.integers(1, 6))).tolist()
                   for _ in range(1 + n % 2)]
        jobs.append((prompts, int(rng.integers(4, 13)), 1 + (n % 3 == 0)))
    want = []
    for prompts, length, beam in jobs:
        src = np.full((len(prompts), max(len(p) for p in prompts)), -1, dtype=np.int64)
        for row, p in zip(src, prompts):
            row[:len(p)] = p
        want.append(model.generate(src, beam_size=beam, num_hypotheses=beam,
                                   max_decoding_length=length))
    url = s.url + "/v2/models/llama/generate"
    failures = []

    def client(k):
        for n in range(k, len(jobs), 6):
            prompts, length, beam = jobs[n]
            body = {"ids": prompts, "max_decoding_length": length, "beam_size": beam,
                    "num_hypotheses": beam}
            if len(prompts) == 1 and beam == 1 and n % 4 == 1:
                r = requests.post(url, json=dict(body, stream=True), timeout=60, stream=True)
                events = [e for e in r.text.split("\n\n") if e]
                tokens = [json.loads(e[len("data: "):])["token"] for e in events[:-1]]
                if tokens != want[n]["tokens"][0][0]:
                    failures.append(("streamed", n, tokens, want[n]["tokens"][0][0]))
                result = json.loads(events[-1].split("data: ", 1)[1])["results"]
            else:
                r = requests.post(url, json=body, timeout=60)
                if r.status_code != 200:
                    failures.append((n, r.text))
                    continue
                result = r.json()["results"]
            failures.extend(differences(n, result, want[n]))
    threads = [threading.Thread(target=client, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    values = metrics_when(s, 'kiln_requests_total{endpoint="generate",status="200"}', len(jobs))
    joined = values["kiln_generate_joined_total"]
    print("[ serve ] llama: %d of %d /generate requests joined a running batch" % (joined,
                                                                                  len(jobs)))
    assert joined > 0
    assert values['kiln_batch_rows_total{endpoint="generate"}'] == \
        sum(len(p) for p, _, _ in jobs)
    assert s.stop() == 0


def test_sigterm_under_load_loses_no_accepted_request(server_factory, golden):
    s = server_factory("--shutdown-grace-ms", "300", "--max-queue-delay-ms", "5")
    inputs, want = golden
    body = json.dumps(forward_body(inputs["src"], inputs["tgt"]))
    outcomes = []
    lock = threading.Lock()
    stop = threading.Event()

    def client():
        while not stop.is_set():
            try:
                # A fresh connection each time (as a load balancer's retries would).
                r = requests.post(s.url + "/v2/models/py_tiny/infer", data=body, timeout=30,
                                  headers={"Connection": "close"})
            except requests.exceptions.ConnectionError as e:
                refused = "Connection refused" in str(e)
                with lock:
                    outcomes.append(("refused" if refused else "dropped: %s" % e, time.time()))
                return
            if r.status_code == 200:
                ok = float(np.abs(output(r) - want["logits"]).max()) <= TOLERANCE
                with lock:
                    outcomes.append(("200" if ok else "wrong result", time.time()))
            else:
                with lock:
                    outcomes.append(("%d %s" % (r.status_code, r.json().get("error")),
                                     time.time()))
                if r.status_code == 503:
                    return
    threads = [threading.Thread(target=client) for _ in range(6)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    sigterm_at = time.time()
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(timeout=30) == 0
    stop.set()
    for t in threads:
        t.join()
    kinds = {k for k, _ in outcomes}
    print("[ serve ] SIGTERM under load: %d answered 200 before it, %d after; %s" % (
        sum(1 for k, at in outcomes if k == "200" and at < sigterm_at),
        sum(1 for k, at in outcomes if k == "200" and at >= sigterm_at),
        sorted((k, sum(1 for o in outcomes if o[0] == k)) for k in kinds if k != "200")))
    shutting = "503 the server is shutting down (SIGTERM); retry on another"
    assert kinds <= {"200", shutting, "refused"}, kinds
    assert sum(1 for k, at in outcomes if k == "200" and at < sigterm_at) > 0
    assert shutting in kinds or "refused" in kinds
    assert "drained, exiting" in s.proc.stderr.read()


def options_help(text):
    """{option: its help, continuation lines joined} of a --help text."""
    options, name = {}, None
    for line in text.splitlines():
        if line.startswith("  -"):
            name = line.split()[0]
            options[name] = line
        elif name and line.startswith("    "):
            options[name] += " " + line.strip()
        else:
            name = None
    return options


def test_help_lists_every_option_with_its_default():
    out = subprocess.run([KILN, "serve", "--help"], capture_output=True, text=True,
                         check=True).stdout
    for option, default in [("--host", "127.0.0.1"), ("--port", "8080"), ("--max-batch", "0"),
                            ("--max-batch-tokens", "1024"),
                            ("--max-queue-delay-ms", "0"), ("--max-queue", "64"),
                            ("--max-body-bytes", "16M"), ("--request-timeout-ms", "30000"),
                            ("--workers", "2"), ("--http-threads", "16"),
                            ("--shutdown-grace-ms", "500")]:
        entry = " ".join(options_help(out)[option].split())
        assert "(default: %s)" % default in entry, entry
    for option in ["--no-batching", "--auth-token", "--src-vocab", "--tgt-vocab", "--threads"]:
        assert option in out
    r = subprocess.run([KILN, "serve", "--compiled", TINY], capture_output=True, text=True)
    assert r.returncode == 1 and "--weights" in r.stderr


NGINX_CONF = """
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
{user}
events {{ worker_connections 256; }}
http {{
    log_format upstream '$status $upstream_addr $upstream_status';
    access_log {tmp}/access.log upstream;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    client_max_body_size 16m;
    upstream kiln {{
        server 127.0.0.1:{port1} max_fails=1 fail_timeout=1s;
        server 127.0.0.1:{port2} max_fails=1 fail_timeout=1s;
        keepalive 16;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://kiln;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            # A POST is retried on the other server too (non_idempotent): an inference
            # request has no side effect, and one whose server died must not be lost.
            proxy_next_upstream error timeout http_502 http_503 http_504 non_idempotent;
            proxy_next_upstream_tries 2;
            proxy_buffering off;
        }}
    }}
}}
"""


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_servers_behind_nginx_lose_no_request_when_one_is_killed(server_factory, golden,
                                                                      tmp_path):
    import shutil
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx")
                                      else None)
    if not nginx:
        pytest.skip("Debian's nginx is not installed (scripts/setup.sh installs it)")
    servers = [server_factory(), server_factory()]
    ports = [s.url.rsplit(":", 1)[1] for s in servers]
    port = free_port()
    conf = tmp_path / "nginx.conf"
    conf.write_text(NGINX_CONF.format(
        tmp=tmp_path, port=port, port1=ports[0], port2=ports[1],
        user="user root;" if os.geteuid() == 0 else ""))
    proc = subprocess.Popen([nginx, "-p", str(tmp_path), "-e", str(tmp_path / "error.log"),
                             "-c", str(conf), "-g", "daemon off;"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = "http://127.0.0.1:%d" % port
        for _ in range(100):
            try:
                if requests.get(url + "/v2/health/ready", timeout=2).status_code == 200:
                    break
            except requests.exceptions.ConnectionError:
                time.sleep(0.05)
        else:
            raise AssertionError("nginx did not come up: %s" % (tmp_path / "error.log").read_text())
        inputs, want = golden
        body = json.dumps(forward_body(inputs["src"], inputs["tgt"]))
        outcomes, lock, stop = [], threading.Lock(), threading.Event()

        def client():
            session = requests.Session()
            while not stop.is_set():
                try:
                    r = session.post(url + "/v2/models/py_tiny/infer", data=body, timeout=30)
                    if r.status_code == 200 and \
                            len(r.content) < int(r.headers["Content-Length"]):
                        # Cut short: nginx had begun to forward an answer the killed server
                        # had not finished. kiln serve writes an answer whole or not at all
                        # (tools/serve.cpp, "Whole replies"), so none may be.
                        kind = "cut short"
                    else:
                        ok = r.status_code == 200 and \
                            float(np.abs(output(r) - want["logits"]).max()) <= TOLERANCE
                        kind = "200" if ok else "%d %s" % (r.status_code, r.text[:100])
                except requests.exceptions.RequestException as e:
                    kind = "error: %s" % e
                with lock:
                    outcomes.append(kind)
        threads = [threading.Thread(target=client) for _ in range(6)]
        for t in threads:
            t.start()
        # Four kills mid-run, of each server in turn; each comes back on its port, and nginx
        # sends it requests again once its fail_timeout (1 s) is over.
        kills, answered = 4, []
        time.sleep(0.7)
        for k in range(kills):
            victim = k % 2
            servers[victim].proc.kill()  # SIGKILL, mid-run
            servers[victim].proc.wait()
            with lock:
                at_kill = len(outcomes)
            time.sleep(0.5)
            with lock:
                answered.append(len(outcomes) - at_kill)
            servers[victim] = server_factory(port=int(ports[victim]))
            # Before the next kill, nginx sends the restarted server requests again (after
            # its fail_timeout, 1 s), so that the other always has somewhere to retry.
            seen = len((tmp_path / "access.log").read_text().splitlines())
            for _ in range(100):
                time.sleep(0.05)
                log = (tmp_path / "access.log").read_text().splitlines()[seen:]
                if any(line.startswith("200 127.0.0.1:%s" % ports[victim]) for line in log):
                    break
            else:
                raise AssertionError("nginx sent the restarted server nothing in 5 s")
            time.sleep(0.3)
        stop.set()
        for t in threads:
            t.join()
        failed = [k for k in outcomes if k != "200"]
        assert failed == [], failed[:5]
        assert all(n > 0 for n in answered), answered  # the other server took the load
        # The load was spread over both servers, and nginx retried requests of a killed one.
        log = (tmp_path / "access.log").read_text().splitlines()
        upstreams = {line.split()[1].split(",")[0] for line in log if line.startswith("200 ")}
        assert {"127.0.0.1:" + p for p in ports} <= upstreams, upstreams
        retried = sum(1 for line in log if "," in line)
        print("[ serve ] nginx: %d requests, %d SIGKILLs of a server mid-run (each restarted), "
              "%s answered in the 0.5 s after each; %d retried by nginx on the other; %d cut "
              "short; all %d answered 200 with the right logits" % (
                  len(outcomes), kills, answered, retried, outcomes.count("cut short"),
                  outcomes.count("200")))
        for s in servers:
            assert s.stop() == 0
    finally:
        proc.terminate()
        proc.wait(timeout=10)
