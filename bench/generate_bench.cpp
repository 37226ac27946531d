// Generation benchmark (issue 11): the paper's base Transformer compiled by kiln with
// max_batch 32 (kiln_add_model(bench_gen ... SET max_batch=32) in bench/CMakeLists.txt;
// max_beam 4, max_len 128) running kiln_generate, the runtime's search over the compiled
// `prepare` and `decode_step`, with KILN_BENCH_THREADS (default 2) threads; plus the
// machine's memory read bandwidth (`bandwidth`, bench/bandwidth.cpp) and FMA peak (`peak`)
// in the same process.
//
//   KILN_BENCH_WEIGHTS=/tmp/kiln-bench/base.safetensors generate_bench \
//       [--benchmark_repetitions=5 --benchmark_enable_random_interleaving=true]
//
// Workloads (bench/workloads.json "generation"; random source ids in [1, vocab) from a fixed
// seed, no padding; start_id 1, end_id 2):
//   W3  greedy,     batch 1,  source 32, 32 new tokens  (latency)
//   W5  beam 4,     batch 32, source 32, 32 new tokens  (batch translation; num_hypotheses 1)
//   W5_..._vocab4096: W5 choosing among 4096 target ids (kiln_search_options::vocabulary, as
//       a vocabulary map gives a batch; its steps compute only those generator rows)
// min_decoding_length = max_decoding_length = 32: the end token is never chosen, so every
// call runs exactly 32 decoder steps (the peers force the same). One call per iteration
// through the C ABI (kiln_generate + kiln_generation_free): prepare, the caches (allocated
// per call by the runtime), 32 decode_step runs and the search itself. One untimed warm-up
// call per workload first, which must return 32 tokens per sentence.
// Counters: tokens/s = target tokens (batch × 32, the best hypothesis of each sentence) per
// second; GFLOP, the call's arithmetic counted as model_bench counts it (generation_flops:
// prepare's encoder and cross-attention keys/values once, then every step for batch × beam
// hypotheses; report.py divides it by the FMA peak for the compute floor); for W3 also floor_ms,
// the weight bytes one decoder step must read × 32 steps over the bandwidth measured in this
// process (the highest so far; report.py recomputes it with the highest of the whole run).
//
// bf16 (issue 13): where the host has AVX512-BF16 (bench/CMakeLists.txt), the same model
// compiled with `WEIGHTS bf16` (bench_gen_bf16) runs the same workloads as bf16/W3_... and
// bf16/W5_..., interleaved with the f32 ones, loaded at its first workload; its W3 floor
// counts the linear weights in bf16 (2 bytes) and the rest (biases, LayerNorms, the embedding
// row) in f32: 77.15 MB per step. bf16/check_generate_vs_pytorch reports its ids against
// PyTorch's f32 ones (bf16 rounding may change a near-tie: informational).
//
// int8 (issue 27): where the host has AVX512-VNNI (KILN_BENCH_INT8), the same model compiled
// with `WEIGHTS int8` (bench_gen_int8: linear weights quantized per output row at load, inputs
// per row at run time) as int8/W3_..., int8/W5_... and int8/check_generate_vs_pytorch,
// interleaved with the others; its W3 floor counts the linear weights at 1 byte plus 8 bytes
// per output row (the row's f32 scale and i32 sum) and the rest in f32: 39.27 MB per step.
//
// With KILN_BENCH_GEN_REFERENCE (bench/peers.py --generation-reference-out: source ids and
// PyTorch's greedy and beam-4 ids), `check_generate_vs_pytorch` reports how many ids kiln
// reproduces. With KILN_BENCH_PROFILE_OUT=FILE, after the benchmarks the process runs W3
// five times and W5 once with kiln_model_set_profiling on and writes kiln_model_profile's
// text (per entry point and per kernel) to FILE; never during the timed runs. The f32 model
// first, then each other build the benchmarks loaded (bf16, int8), each section's header
// naming it ("== int8 W5_...").
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bench_gen.h"
#ifdef KILN_BENCH_BF16
#include "bench_gen_bf16.h"
#endif
#ifdef KILN_BENCH_INT8
#include "bench_gen_int8.h"
#endif
#include "peak.h"

namespace kiln_bench {
namespace {

constexpr int64_t kSrcVocab = 32000, kPadId = 0, kStartId = 1, kEndId = 2;

// The bytes of weights one decoder step reads (base config, f32): per decoder layer the
// self-attention q, k, v, o, the cross-attention q and o (its k and v of the source are
// projected once, in prepare), the FFN and three LayerNorms, weights and biases; the final
// LayerNorm; the generator 512×32000 + bias; the target embedding's one row.
constexpr double kD = 512, kFF = 2048, kVocab = 32000, kLayers = 6;
constexpr double kStepWeightFloats = kLayers * (6 * (kD * kD + kD)  // self q, k, v, o; cross q, o
                                                + (kD * kFF + kFF) + (kFF * kD + kD)  // FFN
                                                + 3 * 2 * kD)                         // norm1..3
                                     + 2 * kD                // decoder.norm
                                     + kD * kVocab + kVocab  // generator
                                     + kD;                   // one embedding row
constexpr double kStepWeightBytes = 4 * kStepWeightFloats;   // 153.96 MB
// The same with bf16 linear weights (2 bytes each; biases, norms, the embedding row f32).
constexpr double kStepLinearWeights = kLayers * (6 * kD * kD + 2 * kD * kFF) + kD * kVocab;
constexpr double kStepWeightBytesBf16 = kStepWeightBytes - 2 * kStepLinearWeights;  // 77.15 MB
// With int8 linear weights: 1 byte each, plus 8 bytes per output row (its f32 scale and i32
// row sum; every N here is a multiple of 64, so no padding rows).
constexpr double kStepLinearRows = kLayers * (6 * kD + kFF + kD) + kVocab;
constexpr double kStepWeightBytesInt8 =
    kStepWeightBytes - 3 * kStepLinearWeights + 8 * kStepLinearRows;  // 39.27 MB

// The weights' element type of a model library.
enum Dtype { kF32, kBf16, kInt8 };

struct GenWorkload {
  const char* name;
  int64_t batch, src_len, beam, new_tokens;
  uint64_t seed;
  // Vocabulary restriction (kiln_search_options::vocabulary): this many distinct target ids,
  // drawn from `seed`; 0: none.
  int64_t restrict_to = 0;
};

// The ids a restricted workload may choose from: `count` distinct ids of the target vocabulary
// (the end token among them, as the search adds it anyway).
std::vector<int64_t> restricted_ids(uint64_t seed, int64_t count) {
  std::vector<int64_t> all(static_cast<size_t>(kVocab));
  for (size_t v = 0; v < all.size(); ++v) all[v] = static_cast<int64_t>(v);
  std::mt19937_64 rng(seed);
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(static_cast<size_t>(count));
  if (std::find(all.begin(), all.end(), kEndId) == all.end()) all.back() = kEndId;
  std::sort(all.begin(), all.end());
  return all;
}

// The arithmetic of one kiln_generate call, counted as model_bench counts a forward (2·M·N·K
// per linear, 2·rows·H·Lk·dk each for QKᵀ and P·V; the rest not counted): `prepare` runs the 6
// encoder layers over batch·S tokens and projects the memory into every decoder layer's cross
// keys and values (2·n·d·2d each); then each of the new_tokens steps runs every hypothesis
// (step 0 one per sentence, later ones batch·beam; min = max decoding length: none finishes
// early) through the 6 decoder layers (self q, k, v, o, cross q, o, the FFN; self-attention
// over the t + 1 cached positions of step t, cross-attention over S) and the generator.
// W5 ≈ 355.1 GFLOP (309.6 of them in the steps), W3 ≈ 3.90.
double generation_flops(const GenWorkload& w) {
  constexpr double kHeads = 8, kDk = kD / kHeads;
  const double B = static_cast<double>(w.batch), S = static_cast<double>(w.src_len);
  const double n = B * S;
  const double encoder =
      kLayers * (2 * n * kD * (3 * kD + kD + 2 * kFF) + 2 * 2 * B * kHeads * S * S * kDk);
  const double cross_kv = kLayers * 2 * n * kD * 2 * kD;
  double steps = 0;
  for (int64_t t = 0; t < w.new_tokens; ++t) {
    const double vocab = static_cast<double>(w.restrict_to ? w.restrict_to : kVocab);
    const double linear = kLayers * 2 * kD * (3 * kD + kD + kD + kD + 2 * kFF) + 2 * kD * vocab;
    const double attention = kLayers * 2 * 2 * kHeads * kDk * (static_cast<double>(t + 1) + S);
    const double hyps = t == 0 ? B : B * static_cast<double>(w.beam);
    steps += hyps * (linear + attention);
  }
  return encoder + cross_kv + steps;
}

const GenWorkload kWorkloads[] = {
    {"W3_greedy_b1_s32_n32", 1, 32, 1, 32, 103},
    {"W5_beam4_b32_s32_n32", 32, 32, 4, 32, 105},
    // W5 choosing among 4096 of the 32000 target ids (issue 27's optional vocabulary
    // restriction, as CTranslate2's vmap gives a batch a few thousand candidates).
    {"W5_beam4_b32_s32_n32_vocab4096", 32, 32, 4, 32, 105, 4096},
};

kiln_search_options options_for(int64_t beam, int64_t new_tokens) {
  kiln_search_options o;
  kiln_search_options_init(&o);
  o.beam_size = static_cast<int32_t>(beam);
  o.num_hypotheses = 1;
  o.max_decoding_length = static_cast<int32_t>(new_tokens);
  o.min_decoding_length = static_cast<int32_t>(new_tokens);  // the end token is never chosen
  o.start_id = kStartId;
  o.end_id = kEndId;
  return o;
}

template <typename Model>
struct Loaded {
  std::unique_ptr<Model> model;
  std::string error;
};

// Whether the model of each Dtype was loaded (for write_profile).
bool g_loaded[3] = {false, false, false};

template <typename Model>
Loaded<Model>& loaded() {
  static Loaded<Model> l = [] {
    Loaded<Model> r;
    const char* path = std::getenv("KILN_BENCH_WEIGHTS");
    if (!path || !*path) {
      r.error =
          "KILN_BENCH_WEIGHTS is not set: point it at a base-config safetensors checkpoint "
          "(bench/peers.py --weights-out writes one; bench/run.sh does it all)";
      return r;
    }
    try {
      r.model = std::make_unique<Model>(path);
      r.model->set_num_threads(bench_threads());
    } catch (const std::exception& e) {
      r.error = std::string("cannot create the compiled model: ") + e.what();
    }
    return r;
  }();
  return l;
}

kiln_tensor ids_tensor(const std::vector<int64_t>& ids, int64_t rows, int64_t cols) {
  kiln_tensor t{};
  t.name = "src";
  t.dtype = KILN_I64;
  t.rank = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.data = const_cast<int64_t*>(ids.data());
  t.capacity = ids.size() * sizeof(int64_t);
  return t;
}

std::vector<int64_t> random_ids(uint64_t seed, int64_t count) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> dist(kPadId + 1, kSrcVocab - 1);
  std::vector<int64_t> ids(static_cast<size_t>(count));
  for (auto& id : ids) id = dist(rng);
  return ids;
}

// The highest bandwidth the `bandwidth` benchmark measured so far in this process (GB/s).
double g_best_bandwidth = 0;

template <typename Model>
void BM_generate(benchmark::State& state, const GenWorkload& w, Dtype dtype) {
  Loaded<Model>& l = loaded<Model>();
  if (!l.model) {
    state.SkipWithError(l.error.c_str());
    return;
  }
  g_loaded[dtype] = true;
  kiln_model* m = l.model->get();
  const std::vector<int64_t> ids = random_ids(w.seed, w.batch * w.src_len);
  const kiln_tensor src = ids_tensor(ids, w.batch, w.src_len);
  kiln_search_options o = options_for(w.beam, w.new_tokens);
  const std::vector<int64_t> vocabulary =
      w.restrict_to ? restricted_ids(w.seed, w.restrict_to) : std::vector<int64_t>{};
  o.vocabulary = vocabulary.empty() ? nullptr : vocabulary.data();
  o.num_vocabulary = static_cast<int32_t>(vocabulary.size());
  static std::set<std::pair<const GenWorkload*, Dtype>> warmed;
  if (warmed.insert({&w, dtype}).second) {
    kiln_generation g{};
    if (kiln_generate(m, &src, &o, &g) != 0) {
      state.SkipWithError(kiln_model_error(m));
      return;
    }
    bool ok = g.batch == w.batch;
    for (int64_t b = 0; ok && b < g.batch; ++b) ok = g.lengths[b * g.hypotheses] == w.new_tokens;
    kiln_generation_free(&g);
    if (!ok) {
      state.SkipWithError("kiln_generate did not return new_tokens tokens for every sentence");
      return;
    }
  }
  for (auto _ : state) {
    kiln_generation g{};
    if (kiln_generate(m, &src, &o, &g) != 0) {
      state.SkipWithError(kiln_model_error(m));
      break;
    }
    kiln_generation_free(&g);
  }
  const double tokens = static_cast<double>(w.batch * w.new_tokens);
  state.counters["tokens/s"] =
      benchmark::Counter(tokens, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["target_tokens"] = tokens;
  state.counters["GFLOP"] = generation_flops(w) / 1e9;
  state.counters["steps"] = static_cast<double>(w.new_tokens);
  state.counters["threads"] = bench_threads();
  if (w.beam == 1 && w.batch == 1) {
    const double bytes = dtype == kBf16   ? kStepWeightBytesBf16
                         : dtype == kInt8 ? kStepWeightBytesInt8
                                          : kStepWeightBytes;
    state.counters["step_weight_MB"] = bytes / 1e6;
    if (g_best_bandwidth > 0)
      state.counters["floor_ms"] =
          bytes * static_cast<double>(w.new_tokens) / (g_best_bandwidth * 1e9) * 1e3;
  }
}

// kiln against PyTorch on the same source ids: how many of PyTorch's greedy (W3 shape) and
// beam-4 (2 sentences, 32 tokens) ids kiln reproduces (the model is ill-conditioned: a
// float32 difference in a near-tie may change a token and everything after it).
template <typename Model>
void BM_check(benchmark::State& state) {
  const char* ref = std::getenv("KILN_BENCH_GEN_REFERENCE");
  Loaded<Model>& l = loaded<Model>();
  if (!ref || !*ref) {
    state.SkipWithError(
        "KILN_BENCH_GEN_REFERENCE is not set (bench/peers.py --generation-reference-out writes "
        "it)");
    return;
  }
  if (!l.model) {
    state.SkipWithError(l.error.c_str());
    return;
  }
  for (auto _ : state) {
    try {
      struct Case {
        const char* src;
        const char* ids;
        int64_t beam;
        const char* prefix;
      };
      for (const Case& c :
           {Case{"src", "greedy_ids", 1, "greedy"}, Case{"src_beam", "beam_ids", 4, "beam4"}}) {
        auto src = kiln::read_tensor<int64_t>(ref, c.src);
        auto want = kiln::read_tensor<int64_t>(ref, c.ids);
        const int64_t rows = want.shape[0], n = want.shape[1];
        kiln::SearchOptions o;
        static_cast<kiln_search_options&>(o) = options_for(c.beam, n);
        const std::vector<std::vector<kiln::Hypothesis>> got = l.model->generate(src, o);
        int64_t same = 0, prefix = 0;
        for (int64_t b = 0; b < rows; ++b) {
          const auto& h = got.at(static_cast<size_t>(b)).at(0).ids;
          bool run = true;
          for (int64_t j = 0; j < n; ++j) {
            const bool eq = j < static_cast<int64_t>(h.size()) && h[j] == want.data[b * n + j];
            same += eq;
            run = run && eq;
            prefix += run;
          }
        }
        state.counters[std::string(c.prefix) + "_same_ids"] = static_cast<double>(same);
        state.counters[std::string(c.prefix) + "_same_prefix"] = static_cast<double>(prefix);
        state.counters[std::string(c.prefix) + "_of"] = static_cast<double>(rows * n);
      }
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
    }
  }
}

// Records the best bandwidth for W3's floor counter: a reporter that sees every run.
class BandwidthWatcher : public benchmark::BenchmarkReporter {
 public:
  explicit BandwidthWatcher(benchmark::BenchmarkReporter* inner) : inner_(inner) {}
  bool ReportContext(const Context& c) override { return inner_->ReportContext(c); }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Iteration || r.error_occurred) continue;
      if (r.benchmark_name().rfind("bandwidth", 0) != 0) continue;
      auto it = r.counters.find("GB/s");
      if (it == r.counters.end()) continue;
      // Reporters get the counters finished: the rate itself.
      if (it->second.value > g_best_bandwidth) g_best_bandwidth = it->second.value;
    }
    inner_->ReportRuns(runs);
  }
  void Finalize() override { inner_->Finalize(); }

 private:
  benchmark::BenchmarkReporter* inner_;
};

// The profile of one build's W3 and W5 (`label`: "" for f32, "bf16 ", "int8 "), appended to text.
template <typename Model>
void profile_model(const char* label, std::string& text) {
  Loaded<Model>& l = loaded<Model>();
  if (!l.model) return;
  for (const GenWorkload& w : kWorkloads) {
    const std::vector<int64_t> ids = random_ids(w.seed, w.batch * w.src_len);
    const kiln_tensor src = ids_tensor(ids, w.batch, w.src_len);
    kiln_search_options o = options_for(w.beam, w.new_tokens);
    const std::vector<int64_t> vocabulary =
        w.restrict_to ? restricted_ids(w.seed, w.restrict_to) : std::vector<int64_t>{};
    o.vocabulary = vocabulary.empty() ? nullptr : vocabulary.data();
    o.num_vocabulary = static_cast<int32_t>(vocabulary.size());
    const int calls = w.beam == 1 ? 5 : 1;
    kiln_model* m = l.model->get();
    kiln_model_set_profiling(m, 1);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) {
      kiln_generation g{};
      if (kiln_generate(m, &src, &o, &g) != 0) {
        text += std::string(w.name) + ": " + kiln_model_error(m) + "\n";
        break;
      }
      kiln_generation_free(&g);
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    text += "== " + std::string(label) + w.name + ": " + std::to_string(calls) +
            " kiln_generate call(s), " + std::to_string(ms / calls) +
            " ms per call with profiling on (kernel times below; the rest of a call is the "
            "runtime's search)\n";
    text += kiln_model_profile(m);
    text += "\n";
    kiln_model_set_profiling(m, 0);
  }
}

void write_profile(const char* path) {
  std::string text;
  profile_model<kiln_models::bench_gen>("", text);
#ifdef KILN_BENCH_BF16
  if (g_loaded[kBf16]) profile_model<kiln_models::bench_gen_bf16>("bf16 ", text);
#endif
#ifdef KILN_BENCH_INT8
  if (g_loaded[kInt8]) profile_model<kiln_models::bench_gen_int8>("int8 ", text);
#endif
  if (text.empty()) return;
  if (std::FILE* f = std::fopen(path, "w")) {
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }
}

const bool registered = [] {
  using F32 = kiln_models::bench_gen;
  for (const GenWorkload& w : kWorkloads)
    benchmark::RegisterBenchmark(w.name,
                                 [&w](benchmark::State& s) { BM_generate<F32>(s, w, kF32); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("check_generate_vs_pytorch", BM_check<F32>)
      ->Iterations(1)
      ->Unit(benchmark::kMillisecond);
#ifdef KILN_BENCH_BF16
  using Bf16 = kiln_models::bench_gen_bf16;
  for (const GenWorkload& w : kWorkloads)
    benchmark::RegisterBenchmark((std::string("bf16/") + w.name).c_str(),
                                 [&w](benchmark::State& s) { BM_generate<Bf16>(s, w, kBf16); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("bf16/check_generate_vs_pytorch", BM_check<Bf16>)
      ->Iterations(1)
      ->Unit(benchmark::kMillisecond);
#endif
#ifdef KILN_BENCH_INT8
  using Int8 = kiln_models::bench_gen_int8;
  for (const GenWorkload& w : kWorkloads)
    benchmark::RegisterBenchmark((std::string("int8/") + w.name).c_str(),
                                 [&w](benchmark::State& s) { BM_generate<Int8>(s, w, kInt8); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("int8/check_generate_vs_pytorch", BM_check<Int8>)
      ->Iterations(1)
      ->Unit(benchmark::kMillisecond);
#endif
  return true;
}();

}  // namespace
}  // namespace kiln_bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  std::unique_ptr<benchmark::BenchmarkReporter> display(benchmark::CreateDefaultDisplayReporter());
  kiln_bench::BandwidthWatcher watcher(display.get());
  benchmark::RunSpecifiedBenchmarks(&watcher);
  benchmark::Shutdown();
  if (const char* out = std::getenv("KILN_BENCH_PROFILE_OUT"); out && *out)
    kiln_bench::write_profile(out);
  return 0;
}
