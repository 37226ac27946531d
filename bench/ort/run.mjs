// ONNX Runtime peer for kiln's model benchmarks: runs the models bench/peers.py exported
// (forward.onnx, encode.onnx) through onnxruntime-node (npm; CPU execution provider) with
// every graph optimization ('all') and 2 intra-op threads, on the workloads of
// bench/workloads.json. Prints JSON: median ms over --runs runs after --warmup runs.
//
//   (cd bench/ort && npm ci)     # once; .npmrc skips the CUDA download
//   node bench/ort/run.mjs --onnx-dir /tmp/kiln-bench \
//       [--reference /tmp/kiln-bench/reference.safetensors] [--runs 5] [--warmup 1] \
//       [--threads 2] [--json-out /tmp/kiln-bench/ort.json]
//
// Ids come from a seeded generator (mulberry32), uniform in [1, vocab): the shapes match
// the other engines', the ids do not. With --reference (W1-shaped ids and PyTorch's
// logits, from peers.py) it also reports ORT's largest difference from PyTorch.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { performance } from 'node:perf_hooks';
import ort from 'onnxruntime-node';

const here = path.dirname(fileURLToPath(import.meta.url));
const VOCAB = { src: 32000, tgt: 32000 };

function parseArgs(argv) {
  const a = { onnxDir: '/tmp/kiln-bench', reference: null, runs: 5, warmup: 1, threads: 2, jsonOut: null };
  for (let i = 2; i < argv.length; ++i) {
    const k = argv[i], v = argv[i + 1];
    if (k === '--onnx-dir') a.onnxDir = v, ++i;
    else if (k === '--reference') a.reference = v, ++i;
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
  for (const fn of ['forward', 'encode']) {
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
  for (const w of workloads) {
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
  // Peak over the sessions and every workload run (maxRSS is in KiB).
  result.peak_rss_mib = process.resourceUsage().maxRSS / 1024;
  const text = JSON.stringify(result, null, 1);
  if (args.jsonOut) fs.writeFileSync(args.jsonOut, text + '\n');
  else console.log(text);
}

main().catch((e) => { console.error(`ort/run.mjs: ${e.stack || e}`); process.exit(1); });
