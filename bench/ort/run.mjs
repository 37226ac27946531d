// ONNX Runtime peer for kiln's model benchmarks: runs the models bench/peers.py exported
// (forward.onnx, encode.onnx) through onnxruntime-node (npm; CPU execution provider) with
// every graph optimization ('all') and 2 intra-op threads, on the workloads of
// bench/workloads.json. Prints JSON: median ms over --runs runs after --warmup runs.
//
//   (cd bench/ort && npm ci)     # once; .npmrc skips the CUDA download
//   node bench/ort/run.mjs --onnx-dir /tmp/kiln-bench \
//       [--reference /tmp/kiln-bench/reference.safetensors] [--runs 5] [--warmup 1] \
//       [--generation-reference /tmp/kiln-bench/gen_reference.safetensors] \
//       [--only forward|generation] [--generation-settings-from EARLIER.json] \
//       [--threads 2] [--json-out /tmp/kiln-bench/ort.json]
//
// Ids come from a seeded generator (mulberry32), uniform in [1, vocab): the shapes match
// the other engines', the ids do not. With --reference (W1-shaped ids and PyTorch's
// logits, from peers.py) it also reports ORT's largest difference from PyTorch.
// Generation (W3, W5): gen_encode.onnx and gen_step.onnx, see generation() below; with
// --generation-reference, how many of PyTorch's greedy and beam ids ORT reproduces.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { performance } from 'node:perf_hooks';
import ort from 'onnxruntime-node';

const here = path.dirname(fileURLToPath(import.meta.url));
const VOCAB = { src: 32000, tgt: 32000 };

function parseArgs(argv) {
  const a = { onnxDir: '/tmp/kiln-bench', reference: null, genReference: null, runs: 5, warmup: 1, threads: 2,
              jsonOut: null, only: null, genSettingsFrom: null };
  for (let i = 2; i < argv.length; ++i) {
    const k = argv[i], v = argv[i + 1];
    if (k === '--onnx-dir') a.onnxDir = v, ++i;
    else if (k === '--reference') a.reference = v, ++i;
    else if (k === '--generation-reference') a.genReference = v, ++i;
    else if (k === '--only') a.only = v, ++i;
    else if (k === '--generation-settings-from') a.genSettingsFrom = v, ++i;
    else if (k === '--runs') a.runs = Number(v), ++i;
    else if (k === '--warmup') a.warmup = Number(v), ++i;
    else if (k === '--threads') a.threads = Number(v), ++i;
    else if (k === '--json-out') a.jsonOut = v, ++i;
    else throw new Error(`unknown argument ${k}`);
  }
  return a;
}

function mulberry32(seed) {
  return () => {
    seed |= 0; seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function randomIds(rng, batch, len, vocab) {
  const ids = new BigInt64Array(batch * len);
  for (let i = 0; i < ids.length; ++i) ids[i] = BigInt(1 + Math.floor(rng() * (vocab - 1)));
  return new ort.Tensor('int64', ids, [batch, len]);
}

// Minimal safetensors reader (F32, I64).
function readSafetensors(file) {
  const buf = fs.readFileSync(file);
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString('utf8'));
  const out = {};
  for (const [name, info] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const [b, e] = info.data_offsets;
    const bytes = buf.subarray(8 + n + b, 8 + n + e);
    const copy = new Uint8Array(bytes).buffer;  // aligned copy
    const data = info.dtype === 'F32' ? new Float32Array(copy) : info.dtype === 'I64' ? new BigInt64Array(copy) : null;
    if (!data) throw new Error(`${file}: ${name} has dtype ${info.dtype}`);
    out[name] = { shape: info.shape, data };
  }
  return out;
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

// Generation (W3, W5 of workloads.json "generation"): gen_encode.onnx once per batch (the
// encoder and every decoder layer's cross-attention keys/values), then gen_step.onnx once
// per step: past keys/values in, present out; the beam reordering is a Gather of the past
// by beam_idx inside the graph, and log_softmax + topk run in the graph too (the logits
// never leave ORT). The loop (tokens, scores, history, beam_idx) is here.
const GEN = { layers: 6, heads: 8, dk: 64, vocab: 32000 };

async function decode(enc, step, src, batch, beam, steps, minLen, ids) {
  const { layers, heads, dk, vocab } = GEN;
  const e = await enc.run({ src });
  const mem = {};
  for (let l = 0; l < layers; ++l) { mem[`mem_k${l}`] = e[`mem_k${l}`]; mem[`mem_v${l}`] = e[`mem_v${l}`]; }
  let K = 1;
  let tok = new BigInt64Array(batch).fill(BigInt(ids.start_id));
  let cum = new Float32Array(batch);
  let beamIdx = new BigInt64Array(batch);
  for (let b = 0; b < batch; ++b) beamIdx[b] = BigInt(b);
  let past = {};
  for (let l = 0; l < layers; ++l) {
    past[`past_k${l}`] = new ort.Tensor('float32', new Float32Array(0), [batch, heads, 0, dk]);
    past[`past_v${l}`] = new ort.Tensor('float32', new Float32Array(0), [batch, heads, 0, dk]);
  }
  const masked = new Float32Array(vocab); masked[ids.end_id] = -Infinity;
  const open = new Float32Array(vocab);
  const endMasked = new ort.Tensor('float32', masked, [vocab]);
  const endOpen = new ort.Tensor('float32', open, [vocab]);
  const kout = new ort.Tensor('float32', new Float32Array(beam), [beam]);
  let hist = Array.from({ length: batch }, () => []);
  for (let t = 0; t < steps; ++t) {
    const feeds = {
      tok: new ort.Tensor('int64', tok, [batch, K]),
      pos: new ort.Tensor('int64', BigInt64Array.from([BigInt(t)]), [1]),
      beam_idx: new ort.Tensor('int64', beamIdx, [batch * K]),
      cum: new ort.Tensor('float32', cum, [batch, K]),
      end_bias: t < minLen ? endMasked : endOpen,
      kout, src_bias: e.src_bias, ...past, ...mem,
    };
    const out = await step.run(feeds);
    const index = out.index.data, scores = out.scores.data;
    const ntok = new BigInt64Array(batch * beam), nidx = new BigInt64Array(batch * beam);
    const nhist = new Array(batch * beam);
    let allEnded = true;
    for (let b = 0; b < batch; ++b) {
      for (let j = 0; j < beam; ++j) {
        const i = Number(index[b * beam + j]);
        const parent = Math.floor(i / vocab), token = i - parent * vocab;
        const row = b * beam + j;
        ntok[row] = BigInt(token);
        nidx[row] = BigInt(b * K + parent);
        nhist[row] = hist[b * K + parent].concat(token);
        if (token !== ids.end_id) allEnded = false;
      }
    }
    tok = ntok; beamIdx = nidx; hist = nhist; cum = Float32Array.from(scores);
    past = {};
    for (let l = 0; l < layers; ++l) {
      past[`past_k${l}`] = out[`present_k${l}`];
      past[`past_v${l}`] = out[`present_v${l}`];
    }
    K = beam;
    if (beam === 1 && allEnded) break;  // greedy: every sentence produced the end token
  }
  // The best hypothesis of each sentence (topk keeps them sorted, best first).
  return { ids: Array.from({ length: batch }, (_, b) => hist[b * beam]),
           cum: Array.from({ length: batch }, (_, b) => cum[b * beam]) };
}

async function createGenSessions(args, result, options, tag) {
  const sessions = {};
  for (const name of ['gen_encode', 'gen_step']) {
    const file = path.join(args.onnxDir, `${name}.onnx`);
    if (!fs.existsSync(file)) { result.sessions[name] = { error: `${file} does not exist (ONNX export failed?)` }; continue; }
    const t0 = performance.now();
    try {
      sessions[name] = await ort.InferenceSession.create(file, options);
      result.sessions[`${name} (${tag})`] = { file, create_ms: performance.now() - t0 };
    } catch (err) {
      result.sessions[name] = { file, error: String(err.message || err) };
    }
  }
  return sessions;
}

// Generation runs under two settings of ORT's intra-op thread pool, as PyTorch's under
// OMP_WAIT_POLICY unset and PASSIVE: spinning between ops (ORT's default) and not
// (session.intra_op.allow_spinning = 0): with 18 small ops per layer and step and neighbours
// on the 2 cores, spinning cost W3 25-40% in a probe on the loaded machine. Each workload
// reports its faster setting; with --generation-settings-from (an earlier run's JSON) only
// that one runs.
const SPIN_SETTINGS = ['spinning', 'no spinning'];

async function generation(args, result) {
  const doc = JSON.parse(fs.readFileSync(path.join(here, '..', 'workloads.json'), 'utf8'));
  const gen = doc.generation || [];
  const ids = doc.generation_ids;
  result.generation = {};
  result.generation_settings = {};
  let chosen = null;
  if (args.genSettingsFrom && fs.existsSync(args.genSettingsFrom)) {
    const prev = JSON.parse(fs.readFileSync(args.genSettingsFrom, 'utf8')).generation || {};
    chosen = Object.fromEntries(Object.entries(prev).filter(([, v]) => v.setting).map(([k, v]) => [k, v.setting]));
  }
  let checkSessions = null;
  for (const setting of SPIN_SETTINGS) {
    const todo = gen.filter((w) => !chosen || !chosen[w.key] || chosen[w.key] === setting);
    if (!todo.length) continue;
    const options = { ...result.session_options,
                      extra: { session: { intra_op: { allow_spinning: setting === 'spinning' ? '1' : '0' } } } };
    const sessions = await createGenSessions(args, result, options, setting);
    if (!sessions.gen_encode || !sessions.gen_step) {
      for (const w of todo) result.generation[w.key] = { skipped: 'no gen_encode/gen_step session' };
      return;
    }
    const per = result.generation_settings[setting] = {};
    for (const w of todo) {
      const rng = mulberry32(2000 + Number(w.key.slice(1)));
      const src = randomIds(rng, w.batch, w.src_len, VOCAB.src);
      const run = () => decode(sessions.gen_encode, sessions.gen_step, src, w.batch, w.beam, w.new_tokens,
                               w.new_tokens, ids);
      try {
        for (let i = 0; i < args.warmup; ++i) {
          const r = await run();
          if (r.ids.some((h) => h.length !== w.new_tokens)) throw new Error('a hypothesis has the wrong length');
        }
        const times = [];
        for (let i = 0; i < args.runs; ++i) {
          const t0 = performance.now();
          await run();
          times.push(performance.now() - t0);
        }
        const med = median(times);
        per[w.key] = { median_ms: med, min_ms: Math.min(...times), runs_ms: times.map((t) => Number(t.toFixed(3))),
                       runs: args.runs, target_tokens: w.batch * w.new_tokens,
                       tokens_per_s: w.batch * w.new_tokens / (med / 1e3), setting };
        console.error(`ort/run.mjs: ${w.key} (${setting}) ${med.toFixed(1)} ms (median of ${args.runs})`);
        const best = result.generation[w.key];
        if (!best || !best.median_ms || med < best.median_ms) result.generation[w.key] = per[w.key];
      } catch (err) {
        per[w.key] = { error: String(err.stack || err.message || err) };
        if (!result.generation[w.key]) result.generation[w.key] = per[w.key];
      }
    }
    if (!checkSessions) checkSessions = sessions;
    else { await sessions.gen_encode.release(); await sessions.gen_step.release(); }
  }
  if (!checkSessions) return;
  const sessions = checkSessions;
  // The same source ids as PyTorch's generation reference: how many ids ORT reproduces.
  if (args.genReference && fs.existsSync(args.genReference)) {
    const ref = readSafetensors(args.genReference);
    const n = ref.greedy_ids.shape[1];
    const check = {};
    const cmp = (got, want, rows) => {
      let same = 0, prefix = 0;
      for (let b = 0; b < rows; ++b) {
        let p = 0;
        while (p < n && BigInt(got[b][p]) === want[b * n + p]) ++p;
        prefix += p;
        for (let j = 0; j < n; ++j) if (BigInt(got[b][j]) === want[b * n + j]) ++same;
      }
      return { same_ids: same, same_prefix: prefix, of: rows * n };
    };
    const g = await decode(sessions.gen_encode, sessions.gen_step,
                           new ort.Tensor('int64', ref.src.data, ref.src.shape), 1, 1, n, n, ids);
    check.greedy = cmp(g.ids, ref.greedy_ids.data, 1);
    const bm = await decode(sessions.gen_encode, sessions.gen_step,
                            new ort.Tensor('int64', ref.src_beam.data, ref.src_beam.shape), 2, 4, n, n, ids);
    check.beam4 = cmp(bm.ids, ref.beam_ids.data, 2);
    result.generation_check_vs_pytorch = check;
  }
}

async function main() {
  const args = parseArgs(process.argv);
  const { workloads } = JSON.parse(fs.readFileSync(path.join(here, '..', 'workloads.json'), 'utf8'));
  const options = {
    executionProviders: ['cpu'],
    graphOptimizationLevel: 'all',
    intraOpNumThreads: args.threads,
    interOpNumThreads: 1,
    executionMode: 'sequential',
  };
  const result = {
    engine: 'onnxruntime-node', version: ort.env.versions, threads: args.threads, runs: args.runs,
    warmup: args.warmup, session_options: options, workloads: {}, sessions: {},
    ids: 'mulberry32 seeded, uniform in [1, vocab): same shapes as kiln\'s, not the same ids',
  };
  const sessions = {};
  for (const fn of args.only === 'generation' ? [] : ['forward', 'encode']) {
    const file = path.join(args.onnxDir, `${fn}.onnx`);
    if (!fs.existsSync(file)) { result.sessions[fn] = { error: `${file} does not exist (ONNX export failed?)` }; continue; }
    const t0 = performance.now();
    try {
      sessions[fn] = await ort.InferenceSession.create(file, options);
      result.sessions[fn] = { file, create_ms: performance.now() - t0 };
    } catch (e) {
      result.sessions[fn] = { file, error: String(e.message || e) };
    }
  }
  result.rss_after_load_mib = process.memoryUsage().rss / 1048576;
  for (const w of args.only === 'generation' ? [] : workloads) {
    const s = sessions[w.function];
    if (!s) { result.workloads[w.key] = { skipped: `no ${w.function} session: ${result.sessions[w.function].error}` }; continue; }
    const rng = mulberry32(1000 + Number(w.key.slice(1)));
    const feeds = { src: randomIds(rng, w.batch, w.src_len, VOCAB.src) };
    if (w.function === 'forward') feeds.tgt = randomIds(rng, w.batch, w.tgt_len, VOCAB.tgt);
    try {
      for (let i = 0; i < args.warmup; ++i) {
        const out = await s.run(feeds);
        const y = Object.values(out)[0];
        if (!y.data.every(Number.isFinite)) throw new Error('output has NaN or Inf');
      }
      const times = [];
      for (let i = 0; i < args.runs; ++i) {
        const t0 = performance.now();
        await s.run(feeds);
        times.push(performance.now() - t0);
      }
      result.workloads[w.key] = { median_ms: median(times), min_ms: Math.min(...times),
                                  runs_ms: times.map((t) => Number(t.toFixed(3))), runs: args.runs };
      console.error(`ort/run.mjs: ${w.key} ${median(times).toFixed(1)} ms (median of ${args.runs})`);
    } catch (e) {
      result.workloads[w.key] = { error: String(e.message || e) };
    }
  }
  if (args.reference && sessions.forward) {
    const ref = readSafetensors(args.reference);
    const feeds = {
      src: new ort.Tensor('int64', ref.src.data, ref.src.shape),
      tgt: new ort.Tensor('int64', ref.tgt.data, ref.tgt.shape),
    };
    const out = (await sessions.forward.run(feeds)).logits;
    let err = 0, err64 = 0, scale = 0;
    for (let i = 0; i < out.data.length; ++i) {
      err = Math.max(err, Math.abs(out.data[i] - ref.logits.data[i]));
      err64 = Math.max(err64, Math.abs(out.data[i] - ref.logits_f64.data[i]));
      scale = Math.max(scale, Math.abs(ref.logits_f64.data[i]));
    }
    result.check_vs_pytorch = { max_abs_err: err, max_abs_err_f64: err64, max_abs_logit: scale,
                                shape_ok: JSON.stringify(out.dims) === JSON.stringify(ref.logits.shape) };
  }
  // Peak over the sessions and every workload run (maxRSS is in KiB); generation (its own
  // two sessions) after it, with its own figure.
  result.peak_rss_mib = process.resourceUsage().maxRSS / 1024;
  if (args.only !== 'forward') {
    await generation(args, result);
    result.peak_rss_with_generation_mib = process.resourceUsage().maxRSS / 1024;
  }
  const text = JSON.stringify(result, null, 1);
  if (args.jsonOut) fs.writeFileSync(args.jsonOut, text + '\n');
  else console.log(text);
}

main().catch((e) => { console.error(`ort/run.mjs: ${e.stack || e}`); process.exit(1); });
