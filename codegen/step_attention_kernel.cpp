// The single-query attention kernel of incremental decoding (kernels.h, StepAttentionKernel):
// one query row per hypothesis n attends to keys found through an index, either a cache laid
// out [T, C, H·dk] read at (position j, slot rows[n, j]) or encoder memory [B, S, H·dk] read
// at (sentence src_row[n], key j) with a key padding mask.
//
// Algorithm, per (head h, hypothesis n): s_j = (q · k_j) · scale (-1e9 where masked), then
// softmax over j and the weighted sum of v_j, as the interpreter computes them but in f32.
// Indices are clamped into the buffers, so a bad index can never read outside them (the
// runtime refuses such inputs before any kernel runs).
//
// Schedule. Parallel over hypotheses; per hypothesis the scores of every head and key are
// computed into a small scratch buffer (H × keys floats), each dot product vectorized over
// the channels when dk is a multiple of the vector width, then the maxima and sums per head,
// and the output channels vectorized (v is contiguous in its channel dimension). At Lq = 1
// the work is small next to the decoder step's projections, which read every weight once.
#include "codegen/halide_kernels.h"
#include "support/error.h"

namespace kiln::codegen {

using Halide::Expr;
using Halide::Func;
using Halide::ImageParam;
using Halide::RDom;
using Halide::Var;

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

  RDom rd(0, dk, "rd");
  Func dot("step_dot");
  dot(j, h, n) = 0.0f;
  dot(j, h, n) += q(h * dk + rd, n) * k(h * dk + rd, a1(j, n), a0(j, n));
  Expr scaled = dot(j, h, n) * static_cast<float>(spec.scale);
  Func score("step_score");
  if (memory)
    score(j, h, n) = Halide::select(mask(a1(j, n), a0(j, n)) != 0, -1e9f, scaled);
  else
    score(j, h, n) = scaled;

  RDom rj(0, keys, "rj");
  Func mx("step_max"), e("step_exp"), total("step_sum"), out("step_attention_out");
  mx(h, n) = -3.0e38f;
  mx(h, n) = Halide::max(mx(h, n), score(rj, h, n));
  e(j, h, n) = Halide::exp(score(j, h, n) - mx(h, n));
  total(h, n) = 0.0f;
  total(h, n) += e(rj, h, n);
  // Per head: acc(ce, h, n) for channel h·dv + ce, so a vector of channels reads one head's
  // weight e (a broadcast), not a gather of e over c / dv.
  Var ce("ce");
  Func acc("step_acc");
  acc(ce, h, n) = 0.0f;
  acc(ce, h, n) += e(rj, h, n) * v(h * dv + ce, a1(rj, n), a0(rj, n));
  out(c, n) = acc(c % dv, c / dv, n) / total(c / dv, n);

  // Schedule (see the top of the file). out's channels split by head (c = ch·dv + ce), so
  // the simplifier sees c / dv = ch and c % dv = ce.
  Var ch("ch");
  out.split(c, ch, ce, dv, Halide::TailStrategy::RoundUp).parallel(n);
  const int out_lanes = dv % lanes == 0 ? lanes : 1;
  if (out_lanes > 1) out.vectorize(ce, out_lanes);
  acc.compute_at(out, n);
  if (out_lanes > 1) {
    acc.vectorize(ce, out_lanes);
    acc.update().vectorize(ce, out_lanes);
  }
  for (Func f : {score, e}) f.compute_at(out, n);
  dot.compute_at(score, j);
  // The q·k reduction over the head's channels in vector lanes (a horizontal sum at the end):
  // at batch × beam rows (W5: 128 hypotheses, 8 heads, dk 64) the scalar loop made this
  // kernel 10-15% of a decoder step.
  if (dk % lanes == 0) dot.update().atomic().vectorize(rd, lanes);
  for (Func f : {mx, total}) f.compute_at(out, n);
  a1.compute_at(out, n);
  a0.compute_at(out, n);

  q.dim(0).set_stride(1);
  k.dim(0).set_stride(1);
  v.dim(0).set_stride(1);
  out.output_buffer().dim(0).set_bounds(0, static_cast<int>(spec.heads) * dv).set_stride(1);
  std::vector<Halide::Argument> args = {q, k, v, index};
  if (memory) args.push_back(mask);
  return {Halide::Pipeline(out), args};
}

}  // namespace kiln::codegen
