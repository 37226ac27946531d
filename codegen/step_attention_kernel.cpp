// The single-query attention kernel of incremental decoding (kernels.h, StepAttentionKernel):
// one query row per hypothesis n attends to keys found through an index, either a cache laid
// out [T, C, H·dk] read at (position j, slot rows[n, j]) or encoder memory [B, S, H·dk] read
// at (sentence src_row[n], key j) with a key padding mask.
//
// Algorithm, per (head h, hypothesis n): s_j = (q · k_j) · scale (-1e9 where masked), then
// softmax over j and the weighted sum of v_j, as the interpreter computes them but in f32.
// The cache form skips keys whose row is -1 or that lie outside a sliding window (weight 0),
// with kv_heads reads key/value head h / (heads / kv_heads) (grouped-query attention), and
// with a bias adds bias(j, h, n) to the scaled score (T5's relative buckets, ALiBi).
// Indices are clamped into the buffers, so a bad index can never read outside them (the
// runtime refuses such inputs before any kernel runs).
//
// Schedule. Parallel over blocks of 4 hypotheses (scratch allocated once per block); per
// hypothesis the dot products of every head and key are computed into a small scratch buffer
// (H × keys floats), each vectorized over the channels when dk is a multiple of the vector
// width, then the scores and exponentials vectorized over the keys, the maxima and sums per
// head, and per head the output channels accumulated in registers over the keys (v is
// contiguous in its channel dimension). Measured at W5's shapes (128 hypotheses, 8 heads,
// d 64; one thread, AMD Zen 4, a JIT microbenchmark, two runs each): 533-564 -> 362-386 us
// for the encoder memory (32 keys), 344-376 -> 245-276 us for the cache at 16 keys, 2473 ->
// 1756 us at 32 keys, against the schedule that was parallel over single hypotheses, with a
// scratch per hypothesis and the accumulators in memory. Each dot product is summed in one
// vector of lanes (rfactor) and reduced across the lanes once, not once per vector of
// channels, and the maxima and sums of the scores are vectorized over the keys: at the same
// shapes (bench/attention_bench, 2 threads, Intel Emerald Rapids, medians of 5 interleaved)
// memory 446 -> 257 us, cache at 16 keys 220 -> 190 us, at 32 keys 471 -> 380 us. In W5 the
// keys and values come from L3 or memory (the linears' weights stream between the calls):
// the cache form reads 16 MB at 32 keys, which bounds it.
// On a GPU target the same algorithm has the schedule of schedule_gpu (below): the scores in a
// kernel of their own, then a GPU block per (head, hypothesis) with the maximum and sum reduced
// in shared memory and a thread per output channel.
#include <algorithm>
#include <vector>

#include "codegen/halide_kernels.h"
#include "support/error.h"

namespace kiln::codegen {

using Halide::Expr;
using Halide::Func;
using Halide::ImageParam;
using Halide::RDom;
using Halide::Var;

namespace {

constexpr int kThreads = 64;  // threads per GPU block

// The GPU schedule (the target has a GPU feature) of the pipeline build_step_attention defines:
// first a kernel of its own computes every score (the dk-long dot product of one key and head
// per thread, 64 keys per block) into a device buffer of keys × H × N floats; then one GPU block
// per (head h, hypothesis n) with 64 threads: the maximum and the sum of the exponentials over
// the keys, each thread reducing every 64th key into shared memory (rfactor) and one thread
// adding the 64 partials in order; then a thread per output channel of the head (more than 64
// in serial passes) sums its channel over all keys, the exponential recomputed from the stored
// score. Any number of keys and hypotheses: no buffer size depends on them but the scores'.
KernelPipeline schedule_gpu(Func out, Func score, Func dot, Func mx, Func total, Func acc,
                            const RDom& rj, int dv, std::vector<Halide::Argument> args) {
  using Halide::TailStrategy;
  Var c = out.args()[0], n = out.args()[1];
  Var j = score.args()[0], h = score.args()[1], sn = score.args()[2];
  Var ch("ch"), ce("ce"), eo("eo"), ei("ei"), jo("jo"), ji("ji"), u("u");
  const int te = std::min(dv, kThreads);
  out.split(c, ch, ce, dv)
      .split(ce, eo, ei, te, TailStrategy::GuardWithIf)
      .reorder(ei, eo, ch, n)
      .gpu_blocks(ch, n)
      .gpu_threads(ei);
  acc.compute_at(out, ei);

  score.compute_root()
      .split(j, jo, ji, kThreads, TailStrategy::GuardWithIf)
      .reorder(ji, jo, h, sn)
      .gpu_blocks(jo, h, sn)
      .gpu_threads(ji);
  dot.compute_at(score, ji);

  // Per block: partials of the maximum and of the sum in shared memory, one per thread.
  for (Func f : {mx, total}) {
    Halide::RVar ko("ko"), ki("ki");
    Func partial =
        f.update(0).split(rj.x, ko, ki, kThreads, TailStrategy::GuardWithIf).rfactor(ki, u);
    partial.compute_at(out, ch).store_in(Halide::MemoryType::GPUShared).gpu_threads(u);
    partial.update(0).gpu_threads(u);
    f.compute_at(out, ch).store_in(Halide::MemoryType::GPUShared);
  }

  KernelPipeline kp{Halide::Pipeline(out), std::move(args)};
  kp.gpu_threads = kThreads;
  // Two rows of partials and the head's maximum and sum.
  kp.gpu_shared_bytes = 2 * kThreads * 4 + 2 * 4;
  return kp;
}

}  // namespace

KernelPipeline build_step_attention(const StepAttentionKernel& spec, const Halide::Target& target) {
  KILN_ASSERT(spec.heads >= 1 && spec.dk >= 1 && spec.dv >= 1, "step attention kernel spec");
  KILN_ASSERT(spec.heads * std::max(spec.dk, spec.dv) < (int64_t{1} << 24),
              "step attention kernel feature size");
  const int dk = static_cast<int>(spec.dk), dv = static_cast<int>(spec.dv);
  const int lanes = vector_lanes(target);
  const bool memory = spec.memory;

  ImageParam q(Halide::Float(32), 2, "q"), k(Halide::Float(32), 3, "k");
  ImageParam v(Halide::Float(32), 3, "v");
  ImageParam index(Halide::Int(64), memory ? 1 : 2, "index");
  ImageParam mask(Halide::UInt(8), 2, "mask");
  ImageParam bias(Halide::Float(32), 4, "bias");

  // Keys per hypothesis: the row table's width (positions so far) or the source length.
  const Expr keys = memory ? k.dim(1).extent() : index.dim(0).extent();
  Var j("j"), h("h"), n("n"), c("c");

  // Where key j of hypothesis n lives in k and v: (a1, a0) = (slot, position) or (key, sentence).
  Func a1("step_a1"), a0("step_a0");
  if (memory) {
    a1(j, n) = Halide::clamp(j, 0, k.dim(1).extent() - 1);
    a0(j, n) = Halide::cast<int>(
        Halide::clamp(index(n), Expr(int64_t{0}), Halide::cast<int64_t>(k.dim(2).extent() - 1)));
  } else {
    a1(j, n) = Halide::cast<int>(
        Halide::clamp(index(j, n), Expr(int64_t{0}), Halide::cast<int64_t>(k.dim(1).extent() - 1)));
    a0(j, n) = Halide::clamp(j, 0, k.dim(2).extent() - 1);
  }

  // Grouped-query attention: query head h reads key/value head g = h / rep.
  const int rep = spec.kv_heads > 0 ? static_cast<int>(spec.heads / spec.kv_heads) : 1;
  Expr g = rep == 1 ? Expr(h) : h / rep;
  RDom rd(0, dk, "rd");
  Func dot("step_dot");
  dot(j, h, n) = 0.0f;
  dot(j, h, n) += q(h * dk + rd, n) * k(g * dk + rd, a1(j, n), a0(j, n));
  Expr scaled = dot(j, h, n) * static_cast<float>(spec.scale);
  if (spec.bias && !memory)  // broadcast over its head and row dims of extent 1
    scaled += bias(j, 0, Halide::min(h, bias.dim(2).extent() - 1),
                   Halide::min(n, bias.dim(3).extent() - 1));
  // Keys to skip (cache form): a row of -1 (padding), or outside the window.
  Expr skip = Halide::Internal::const_false();
  if (!memory) {
    skip = index(j, n) == Expr(int64_t{-1});
    if (spec.window > 0) skip = skip || keys - 1 - j >= static_cast<int>(spec.window);
  }
  Func score("step_score");
  if (memory)
    score(j, h, n) = Halide::select(mask(a1(j, n), a0(j, n)) != 0, -1e9f, scaled);
  else  // a skipped key never raises the maximum; its weight is 0 (below)
    score(j, h, n) = Halide::select(skip, -3.0e38f, scaled);

  RDom rj(0, keys, "rj");
  Func mx("step_max"), e("step_exp"), total("step_sum"), out("step_attention_out");
  mx(h, n) = -3.0e38f;
  mx(h, n) = Halide::max(mx(h, n), score(rj, h, n));
  e(j, h, n) = memory ? Halide::exp(score(j, h, n) - mx(h, n))
                      : Halide::select(skip, 0.0f, Halide::exp(score(j, h, n) - mx(h, n)));
  total(h, n) = 0.0f;
  total(h, n) += e(rj, h, n);
  // Per head: acc(ce, h, n) for channel h·dv + ce, so a vector of channels reads one head's
  // weight e (a broadcast), not a gather of e over c / dv.
  Var ce("ce");
  Func acc("step_acc");
  acc(ce, h, n) = 0.0f;
  Expr gr = rep == 1 ? Expr(h) : h / rep;
  acc(ce, h, n) += e(rj, h, n) * v(gr * dv + ce, a1(rj, n), a0(rj, n));
  out(c, n) = acc(c % dv, c / dv, n) / total(c / dv, n);

  q.dim(0).set_stride(1);
  k.dim(0).set_stride(1);
  v.dim(0).set_stride(1);
  out.output_buffer().dim(0).set_bounds(0, static_cast<int>(spec.heads) * dv).set_stride(1);
  std::vector<Halide::Argument> args = {q, k, v, index};
  if (memory) args.push_back(mask);
  if (spec.bias && !memory) {
    args.push_back(bias);
    bias.dim(0).set_min(0).set_stride(1);
    for (int d = 1; d < 4; ++d) bias.dim(d).set_min(0);
  }

  // Schedule (see the top of the file). out's channels split by head (c = ch·dv + ce), so
  // the simplifier sees c / dv = ch and c % dv = ce.
  Var ch("ch");
  if (target.has_gpu_feature())
    return schedule_gpu(out, score, dot, mx, total, acc, rj, dv, std::move(args));
  // Hypotheses in blocks of 4, the blocks parallel: each block's scratch (dot products,
  // scores, maxima, sums) is allocated once, not once per hypothesis.
  Var no("no"), ni("ni");
  out.split(c, ch, ce, dv, Halide::TailStrategy::RoundUp)
      .split(n, no, ni, 4, Halide::TailStrategy::GuardWithIf)
      .parallel(no);
  const int out_lanes = dv % lanes == 0 ? lanes : 1;
  if (out_lanes > 1) out.vectorize(ce, out_lanes);
  // One head's accumulators (dv floats) at a time, in registers over its keys.
  acc.compute_at(out, ch);
  if (out_lanes > 1) {
    acc.vectorize(ce, out_lanes);
    acc.update().reorder(ce, h, rj).vectorize(ce, out_lanes);
    if (dv <= 4 * out_lanes) acc.unroll(ce).update().unroll(ce);
  }
  dot.compute_at(out, ni).store_at(out, no);
  if (dk % lanes == 0) {
    Var l("l");
    Halide::RVar rdo("rdo"), rdi("rdi");
    Func part = dot.update().split(rd, rdo, rdi, lanes).rfactor(rdi, l);
    dot.update().atomic().vectorize(rdi);
    part.compute_at(dot, j).vectorize(l);
    part.update().vectorize(l).unroll(rdo);
  }
  for (Func f : {score, e})
    f.compute_at(out, ni).store_at(out, no).vectorize(j, lanes, Halide::TailStrategy::GuardWithIf);
  for (Func f : {mx, total}) {
    f.compute_at(out, ni).store_at(out, no);
    f.update().atomic().vectorize(rj.x, lanes, Halide::TailStrategy::GuardWithIf);
  }
  a1.compute_at(out, ni).store_at(out, no);
  a0.compute_at(out, ni).store_at(out, no);
  return {Halide::Pipeline(out), args};
}

}  // namespace kiln::codegen
