// The fused attention kernel (kernels.h, AttentionKernel): QKᵀ, scale, masks, softmax and ·V
// in one Halide pipeline that never stores the [B, H, Lq, Lk] score matrix.
//
// Algorithm. Query rows are grouped in blocks of kRowBlock (12) rows and keys in blocks of KB
// (two vectors: 32 keys with AVX-512, 16 with AVX2). The algorithm is written on these block
// coordinates (row i = io·12 + ii, key j = jb·KB + jj), so that the schedule can compute, per
// (batch, head, row block), the scores of the 12 rows against every key block they need into a
// scratch buffer (12 × Lk floats, reused by every block), then the row maxima, exponentials,
// row sums and the weighted sum of V. Scores are kept in base 2 (log2 e folded into the scale)
// for a cheap vectorized exponential. Keys past Lk (the last block's padding) score kNoKey,
// whose exponential is exactly 0; masked keys score -1e9 like the interpreter's masked_fill.
//
// Causal skipping. A causal row i needs keys j <= i only, so row block io needs only the first
// ceil(min(Lk, 12·io + 12) / KB) key blocks. The reductions run over every key block with a
// predicate on the block index, and read the scratch at a clamped block index, so bounds
// inference computes scores only for the blocks a row block needs. Skipping keys above the
// diagonal is exact whenever a row has an unmasked key: their -1e9 scores weigh exactly 0. A
// row whose keys are all masked (causal, and every key j <= i padded) must be, as in the
// interpreter, the uniform average of v over all Lk keys: such rows have the maximum -1e9 and
// take that average instead. (Without causal every key block is visited, and such rows come
// out uniform by themselves.)
//
// Query padding and -inf. A padded query (query_padding) masks its whole row, so its scores
// are not masked one by one: its output is replaced at the end by the average of v (-1e9) or
// NaN (fill_inf). With fill_inf, a row whose keys are all masked (every key padded, or with
// causal every key j <= i; causal alone always keeps key 0) is NaN, as PyTorch's softmax of a
// row of -inf: known exactly from the first unpadded key of the batch row, computed once per
// (batch, head); NaN is written through the bits, as Halide's fast math may drop a NaN
// constant. Other rows are those of -1e9, whose masked keys weigh exactly 0, like -inf's.
//
// Issue 26's variants. Grouped-query heads only change which columns of k and v a head reads
// (h / group). Soft-capping and the score bias are applied to the scores in natural units before
// the change to base 2; a sliding window is one more masking term. A window keeps the diagonal, so
// with Lq <= Lk rows are fully masked only where padding masks them, which the paragraphs above
// cover (with -1e9; the type rule leaves out a window with key padding and fill_inf, whose NaN
// rows this kernel could not tell); rows i >= Lk - 1 + W of a longer query have no key left: with
// -1e9 every key block is visited for them and they come out uniform by themselves, with fill_inf
// they are NaN by their index.
//
// Schedule. Parallel over (batch, head). Once per (batch, head), K is transposed into
// contiguous key blocks (kt) and V copied contiguous (vc). Per row block: the QK product in
// register tiles of 6 rows × KB keys with the dk reduction innermost (12 vector accumulators;
// bf16: 12 rows, 24),
// scale and masks applied on the way out; maxima and sums reduced across key blocks in vectors,
// then across the KB lanes by vector reductions; the exponentials vectorized; the V
// product in register tiles of 12 rows × EB channels (2 vectors with AVX-512: 24
// accumulators; 1 with AVX2), the keys outermost, one broadcast probability per (key, row).
//
// bf16 (AttentionKernel::bf16: a library with bf16 weights, dk even). Both products run on
// AVX512-BF16's vdpbf16ps, which sums pairs of bf16 products into f32 lanes: K is transposed
// into key blocks with pairs of channels adjacent and rounded to bf16 (to nearest even, as
// rt::f32_to_bf16), the row block's q rounded; the exponentials of the softmax are computed in
// f32 and rounded to bf16 (vcvtne2ps2bf16) into a scratch with pairs of keys adjacent, V is
// copied rounded with pairs of keys adjacent; the row sums add the rounded probabilities.
// The maxima, exponentials, sums and the normalization stay f32. The interpreter rounds the
// same way with InterpretOptions::bf16_attention. Measured (W4, 1024 positions, AMD EPYC Zen
// 4, 2 threads): 12.5-13.0 -> 7.3-7.6 ms per layer.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "codegen/halide_kernels.h"
#include "support/error.h"

namespace kiln::codegen {

namespace {

using Halide::Expr;
using Halide::Func;
using Halide::ImageParam;
using Halide::RDom;
using Halide::TailStrategy;
using Halide::Var;

constexpr int kRowBlock = 12;          // query rows per block (score scratch rows)
constexpr int kRowTile = 6;            // rows per QK register tile (f32)
constexpr float kMaskedScore = -1e9f;  // the interpreter's masked_fill value
constexpr float kNoKey = -1e30f;       // keys past Lk: exp(kNoKey - max) is exactly 0
constexpr float kLowest = -3.0e38f;    // start of a running maximum
// Sequences from which the CPU kernel runs one task per sequence rather than per head.
constexpr int kBatchTasks = 16;

// 2^x for x <= 0, vectorizable (Halide's exp calls scalar expf): x = n + r with n an integer
// and |r| <= 1/2, 2^r by its Taylor polynomial of degree 6 in r·ln2 (relative error 2.2e-7
// with rounding), 2^n built in the exponent bits. Inputs at or below -127 give exactly 0 (n = -127
// has a zero exponent field).
Expr exp2_nonpositive(Expr x) {
  x = Halide::max(x, -127.0f);
  Expr n = Halide::cast<int32_t>(x - 0.5f);  // rounds toward zero: n = ceil(x - 1/2)
  Expr r = x - Halide::cast<float>(n);
  const double ln2 = 0.69314718055994530942;
  double coeff = 1;
  for (int k = 1; k <= 6; ++k) coeff *= ln2 / k;
  Expr p = static_cast<float>(coeff);  // ln2^6 / 6!
  for (int k = 5; k >= 0; --k) {
    coeff = 1;
    for (int j = 1; j <= k; ++j) coeff *= ln2 / j;
    p = p * r + static_cast<float>(coeff);
  }
  return p * Halide::reinterpret<float>((n + 127) << 23);
}

// The largest of vector_lanes, its halves, ..., 1 that divides n.
int lanes_dividing(int n, int lanes) {
  while (lanes > 1 && n % lanes != 0) lanes /= 2;
  return lanes;
}

// The kernel's buffer shapes: channel extents are the spec's, all mins 0, the batch and the
// lengths shared between the tensors.
void constrain_buffers(ImageParam& q, ImageParam& k, ImageParam& v, ImageParam& mask,
                       ImageParam& qmask, ImageParam& bias, Func& out, int heads, int kv_heads,
                       int dk, int dv) {
  const Expr lq = q.dim(1).extent(), lk = k.dim(1).extent(), batch = q.dim(2).extent();
  q.dim(0).set_bounds(0, heads * dk);
  q.dim(1).set_min(0);
  q.dim(2).set_min(0);
  k.dim(0).set_bounds(0, kv_heads * dk);
  k.dim(1).set_min(0);
  k.dim(2).set_bounds(0, batch);
  v.dim(0).set_bounds(0, kv_heads * dv);
  v.dim(1).set_bounds(0, lk);
  v.dim(2).set_bounds(0, batch);
  mask.dim(0).set_bounds(0, lk);
  mask.dim(1).set_bounds(0, batch);
  qmask.dim(0).set_bounds(0, lq);
  qmask.dim(1).set_bounds(0, batch);
  for (int d = 0; d < 4; ++d) bias.dim(d).set_min(0);
  out.output_buffer().dim(0).set_bounds(0, heads * dv);
  out.output_buffer().dim(1).set_bounds(0, lq);
  out.output_buffer().dim(2).set_bounds(0, batch);
}

// first_key(b): the first key of batch row b that is not padding, Lk if none.
void define_first_key(Func& first_key, const ImageParam& mask, const Expr& lk, const Var& b) {
  RDom rf(0, lk, "rf");
  first_key(b) = lk;
  first_key(b) = Halide::min(first_key(b), Halide::select(mask(rf, b) != 0, lk, rf));
}

// `result`, NaN where `where`: through the bits (exponent all ones and the quiet bit), as
// Halide's fast math may drop a NaN constant.
Expr nan_where(const Expr& where, const Expr& result) {
  const Expr bits = Halide::reinterpret(Halide::UInt(32), result);
  return Halide::reinterpret(
      Halide::Float(32),
      bits | Halide::select(where, Expr(uint32_t{0x7fc00000}), Expr(uint32_t{0})));
}

// The score of key `key` for query row `row` of head h, batch b, in base 2 (times log2 e),
// from the dot product: scaled, soft-capped (tanh(s / softcap) · softcap), plus the bias
// (read at clamped indices: a dim of extent 1 broadcasts, and rows and keys past the ends
// read the last ones). Without softcap or bias, log2 e is folded into the scale.
Expr base2_score(const AttentionKernel& spec, const Expr& dot, const ImageParam& bias,
                 const Expr& key, const Expr& row, const Expr& h, const Expr& b) {
  const double log2e = 1.44269504088896340736;
  if (spec.softcap == 0 && !spec.bias) return dot * static_cast<float>(spec.scale * log2e);
  Expr s = dot * static_cast<float>(spec.scale);
  if (spec.softcap != 0) {
    const float cap = static_cast<float>(spec.softcap);
    s = Halide::tanh(s / cap) * cap;
  }
  if (spec.bias) {
    auto at = [&](int dim, const Expr& x) { return Halide::min(x, bias.dim(dim).extent() - 1); };
    s = s + bias(at(0, key), at(1, row), at(2, h), at(3, b));
  }
  return s * static_cast<float>(log2e);
}

// Tile sizes of the GPU form: qt query rows per block, kt keys per tile.
struct GpuAttentionTiles {
  int qt, kt;
  int64_t shared_bytes;
};

// Shared memory of the GPU form per block: a key tile (kt × dk), a value tile (kt × dv), the
// tile's scores and probabilities (2 × kt × qt), their row maxima and sums (2 × qt) and the
// running state (maximum, sum and accumulator per row and channel: 3 × qt × dv). The largest
// tiles (16 rows, 32 keys) that fit in a GPU's 48 KiB. (The queries are read from global memory,
// where a GPU's caches keep them: Halide 14 pools a block's shared allocations and lets one that
// is used only inside the key-tile loop reuse the space of one live across it, which staging
// the queries there broke.)
GpuAttentionTiles gpu_attention_tiles(int dk, int dv) {
  auto bytes = [&](int qt, int kt) {
    return int64_t{4} * (int64_t{kt} * dk + int64_t{kt} * dv + 2 * int64_t{kt} * qt + 2 * qt +
                         3 * int64_t{qt} * dv);
  };
  int qt = 16, kt = 32;
  // An experiment's tiles (KILN_GPU_ATTENTION="qt,kt" when `kiln compile` runs: the GPU
  // kernel bench's variants, bench/CMakeLists.txt; not for production builds).
  if (const char* env = std::getenv("KILN_GPU_ATTENTION"); env && *env) {
    KILN_ASSERT(
        std::sscanf(env, "%d,%d", &qt, &kt) == 2 && qt >= 1 && kt >= 4 && qt <= 64 && kt <= 128,
        "KILN_GPU_ATTENTION must be 'qt,kt' (query rows and keys per tile)");
  }
  while (bytes(qt, kt) > kGpuMaxSharedBytesPerBlock && (qt > 1 || kt > 4)) {
    if (kt > qt && kt > 4)
      kt /= 2;
    else
      qt /= 2;
  }
  return {qt, kt, bytes(qt, kt)};
}

// The GPU form (the target has a GPU feature): flash attention. One GPU block per (block of qt
// query rows, head, batch); the keys are visited in tiles of kt: each tile's keys and values are
// staged in shared memory, the tile's scores computed by the block's threads (a dk-long dot product
// each), and folded into a running softmax per row (online softmax): with the tile's row maximum
// mt, its sum l_t = Σ 2^(s - mt) and its weighted values a_t = Σ 2^(s - mt)·v, the state (m, l, a)
// becomes m' = max(m, mt), l' = l·2^(m - m') + l_t·2^(mt - m'), a' = a·2^(m - m') + a_t·2^(mt -
// m'); the output is a / l. The [Lq, Lk] score matrix is never stored, each score is computed once.
// Causal: a block of rows needs only the key tiles up to its last row; the others are skipped.
// Masks and rows whose keys are all masked are as in the CPU form (see the top of this file).
KernelPipeline build_attention_gpu(const AttentionKernel& spec) {
  const int heads = static_cast<int>(spec.heads);
  const int dk = static_cast<int>(spec.dk), dv = static_cast<int>(spec.dv);
  const bool causal = spec.causal, padded = spec.key_padding;
  const bool query_padded = spec.query_padding, fill_inf = spec.fill_inf;
  const int kv_heads = static_cast<int>(spec.kv_heads ? spec.kv_heads : spec.heads);
  const int group = heads / kv_heads;
  const GpuAttentionTiles tiles = gpu_attention_tiles(dk, dv);
  const int qt = tiles.qt, kt = tiles.kt;

  ImageParam q(Halide::Float(32), 3, "q"), k(Halide::Float(32), 3, "k");
  ImageParam v(Halide::Float(32), 3, "v");
  ImageParam mask(Halide::UInt(8), 2, "mask"), qmask(Halide::UInt(8), 2, "qmask");
  ImageParam bias(Halide::Float(32), 4, "bias");
  Func out("attention_out");

  const Expr lq = q.dim(1).extent(), lk = k.dim(1).extent();
  Var d("d"), e("e"), jj("jj"), ii("ii"), io("io"), t("t"), h("h"), b("b"), c("c"), i("i");
  // Row io·qt + ii and key t·kt + jj; rows and keys past the ends read the last ones.
  const Expr row = io * qt + ii, key = t * kt + jj;
  const Expr qrow = Halide::min(row, lq - 1), kkey = Halide::min(key, lk - 1);

  Func qs("attention_qs"), ks("attention_ks"), vs("attention_vs");
  qs(d, ii, io, h, b) = q(h * dk + d, qrow, b);
  ks(d, jj, t, h, b) = k(h / group * dk + d, kkey, b);
  vs(e, jj, t, h, b) = v(h / group * dv + e, kkey, b);

  RDom rd(0, dk, "rd");
  Func dot("attention_dot");
  dot(jj, ii, t, io, h, b) = 0.0f;
  dot(jj, ii, t, io, h, b) += qs(rd, ii, io, h, b) * ks(rd, jj, t, h, b);
  Expr is_masked;
  auto either_mask = [&](const Expr& m) { is_masked = is_masked.defined() ? is_masked || m : m; };
  if (causal) either_mask(key > row);
  if (spec.window) either_mask(row - key >= static_cast<int>(spec.window));
  if (padded) either_mask(mask(kkey, b) != 0);
  if (query_padded) either_mask(qmask(qrow, b) != 0);
  // Scores in base 2; keys past Lk weigh exactly 0.
  const Expr scaled = base2_score(spec, dot(jj, ii, t, io, h, b), bias, key, row, h, b);
  Func score("attention_score");
  score(jj, ii, t, io, h, b) =
      is_masked.defined() ? Halide::select(key >= lk, kNoKey, is_masked, kMaskedScore, scaled)
                          : Halide::select(key >= lk, kNoKey, scaled);

  // Per tile: the row maxima, the probabilities against them, their sums.
  RDom rm(0, kt, "rm");
  Func tile_max("attention_tile_max");
  tile_max(ii, t, io, h, b) = kLowest;
  tile_max(ii, t, io, h, b) = Halide::max(tile_max(ii, t, io, h, b), score(rm, ii, t, io, h, b));
  Func prob("attention_prob");
  prob(jj, ii, t, io, h, b) =
      exp2_nonpositive(score(jj, ii, t, io, h, b) - tile_max(ii, t, io, h, b));
  RDom rs(0, kt, "rs");
  Func tile_sum("attention_tile_sum");
  tile_sum(ii, t, io, h, b) = 0.0f;
  tile_sum(ii, t, io, h, b) += prob(rs, ii, t, io, h, b);
  RDom rv(0, kt, "rv");
  Func tile_pv("attention_tile_pv");
  tile_pv(e, ii, t, io, h, b) = 0.0f;
  tile_pv(e, ii, t, io, h, b) += prob(rv, ii, t, io, h, b) * vs(e, rv, t, h, b);

  // The running softmax over the key tiles the block needs (causal: up to its last row).
  const Expr key_tiles = (lk + kt - 1) / kt;
  const Expr tiles_io =
      causal ? Halide::min(key_tiles, (Halide::min(lk, (io + 1) * qt) + kt - 1) / kt) : key_tiles;
  RDom rt(0, key_tiles, "rt");
  if (causal) rt.where(rt < tiles_io);
  const Expr tt = causal ? Halide::min(rt.x, tiles_io - 1) : Expr(rt.x);
  Func state("attention_state");
  state(e, ii, io, h, b) = {kLowest, 0.0f, 0.0f};
  {
    const Expr m = state(e, ii, io, h, b)[0], l = state(e, ii, io, h, b)[1];
    const Expr a = state(e, ii, io, h, b)[2];
    const Expr mt = tile_max(ii, tt, io, h, b);
    const Expr m2 = Halide::max(m, mt);
    const Expr alpha = exp2_nonpositive(m - m2), beta = exp2_nonpositive(mt - m2);
    state(e, ii, io, h, b) = {m2, l * alpha + tile_sum(ii, tt, io, h, b) * beta,
                              a * alpha + tile_pv(e, ii, tt, io, h, b) * beta};
  }

  const Expr out_h = c / dv, out_e = c % dv, out_ii = i % qt, out_io = i / qt;
  const Expr final_m = state(out_e, out_ii, out_io, out_h, b)[0];
  Expr result =
      state(out_e, out_ii, out_io, out_h, b)[2] / state(out_e, out_ii, out_io, out_h, b)[1];
  Expr all_masked;
  auto either = [&](const Expr& m) { all_masked = all_masked.defined() ? all_masked || m : m; };
  if (query_padded) either(qmask(Halide::min(i, lq - 1), b) != 0);
  Func mean_v("attention_mean_v"), first_key("attention_first_key");
  if (fill_inf) {
    if (padded) {  // the first key that is not padding, Lk if none
      define_first_key(first_key, mask, lk, b);
      either(first_key(b) > (causal ? Halide::min(i, lk - 1) : lk - 1));
    }
    // A window leaves a row no key when even the last key is too far (rows past Lk + W - 1).
    if (spec.window) either(i - (lk - 1) >= static_cast<int>(spec.window));
    if (all_masked.defined()) result = nan_where(all_masked, result);
  } else {
    // Causal skipping leaves out keys that a row whose keys are all masked must average over.
    if (causal && padded) either(final_m <= 0.5f * kMaskedScore);
    if (all_masked.defined()) {  // the uniform average of v over all Lk keys
      RDom rk(0, lk, "rk");
      mean_v(e, h, b) = 0.0f;
      mean_v(e, h, b) += v(h / group * dv + e, rk, b);
      result =
          Halide::select(all_masked, mean_v(out_e, out_h, b) / Halide::cast<float>(lk), result);
    }
  }
  out(c, i, b) = result;

  constrain_buffers(q, k, v, mask, qmask, bias, out, heads, kv_heads, dk, dv);

  // Schedule. Threads: x over up to 16 channels (or head dims, or keys), y over up to 16 rows
  // (or keys); every stage of a block uses at most tx × ty of them.
  const int te = std::min(dv, 16), td = std::min(dk, 16), tj = std::min(kt, 16);
  const int tx = std::max({te, td, tj, qt}), ty = std::max(qt, tj);
  const auto G = TailStrategy::GuardWithIf;
  Var ch("ch"), ce("ce"), eo("eo"), ei("ei"), o("o"), p("p"), x("x"), y("y");
  out.split(c, ch, ce, dv)
      .split(ce, eo, ei, te, G)
      .split(i, io, ii, qt, G)
      .reorder(ei, ii, eo, io, ch, b)
      .gpu_blocks(io, ch, b)
      .gpu_threads(ei, ii);
  const auto shared = Halide::MemoryType::GPUShared;
  // Once per block: the running state (in shared memory) over the key tiles, the key tile loop
  // outermost so that the block's threads stage and score each tile together.
  state.compute_at(out, io).store_in(shared);
  state.split(e, eo, ei, te, G).reorder(ei, ii, eo).gpu_threads(ei, ii);
  state.update().split(e, eo, ei, te, G).reorder(ei, ii, eo, rt).gpu_threads(ei, ii);
  if (mean_v.defined()) {
    mean_v.compute_at(out, io).split(e, o, x, te, G).gpu_threads(x);
    mean_v.update().split(e, o, x, te, G).gpu_threads(x);
  }
  if (first_key.defined()) first_key.compute_at(out, io);
  // Per key tile (the loop rt of the state's update, stage 1).
  const Halide::LoopLevel per_tile(state, rt.x), per_thread(state, ei);
  ks.compute_at(per_tile).store_in(shared);
  ks.split(d, o, x, td, G).split(jj, p, y, tj, G).reorder(x, y, o, p).gpu_threads(x, y);
  vs.compute_at(per_tile).store_in(shared);
  vs.split(e, o, x, te, G).split(jj, p, y, tj, G).reorder(x, y, o, p).gpu_threads(x, y);
  for (Func f : {score, prob}) {
    f.compute_at(per_tile).store_in(shared);
    f.split(jj, o, x, tj, G).reorder(x, ii, o).gpu_threads(x, ii);
  }
  dot.compute_at(score, x);
  for (Func f : {tile_max, tile_sum}) {
    f.compute_at(per_tile).store_in(shared).gpu_threads(ii);
    f.update().gpu_threads(ii);
  }
  tile_pv.compute_at(per_thread);  // per thread: its row and channel over the tile's keys

  std::vector<Halide::Argument> args = {q, k, v};
  if (padded) args.push_back(mask);
  if (query_padded) args.push_back(qmask);
  if (spec.bias) args.push_back(bias);
  KernelPipeline kp{Halide::Pipeline(out), args};
  kp.gpu_threads = tx * ty;
  kp.gpu_shared_bytes = tiles.shared_bytes + (first_key.defined() ? 4 : 0);
  return kp;
}

}  // namespace

KernelPipeline build_attention(const AttentionKernel& spec, const Halide::Target& target) {
  KILN_ASSERT(spec.heads >= 1 && spec.dk >= 1 && spec.dv >= 1, "attention kernel spec");
  KILN_ASSERT(spec.heads * std::max(spec.dk, spec.dv) < (int64_t{1} << 24),
              "attention kernel feature size");
  KILN_ASSERT(spec.kv_heads >= 0 && spec.heads % (spec.kv_heads ? spec.kv_heads : spec.heads) == 0,
              "attention kernel kv heads");
  KILN_ASSERT(spec.window == 0 || spec.causal, "attention kernel window without causal");
  const bool bf16_io = spec.q_bf16 || spec.k_bf16 || spec.v_bf16 || spec.out_bf16;
  KILN_ASSERT(spec.bf16 || !bf16_io, "attention kernel with bf16 activations but f32 products");
  if (target.has_gpu_feature()) {
    KILN_ASSERT(!bf16_io, "attention kernel with bf16 activations on a GPU target");
    return build_attention_gpu(spec);
  }
  const int heads = static_cast<int>(spec.heads);
  const int dk = static_cast<int>(spec.dk), dv = static_cast<int>(spec.dv);
  const int lanes = vector_lanes(target);
  const int kb = 2 * lanes;  // keys per block
  const bool causal = spec.causal, padded = spec.key_padding;
  const bool query_padded = spec.query_padding, fill_inf = spec.fill_inf;
  const int kv_heads = static_cast<int>(spec.kv_heads ? spec.kv_heads : spec.heads);
  const int group = heads / kv_heads;

  auto io_type = [](bool bf16) { return bf16 ? Halide::BFloat(16) : Halide::Float(32); };
  ImageParam q(io_type(spec.q_bf16), 3, "q"), k(io_type(spec.k_bf16), 3, "k");
  ImageParam v(io_type(spec.v_bf16), 3, "v");
  ImageParam mask(Halide::UInt(8), 2, "mask"), qmask(Halide::UInt(8), 2, "qmask");
  ImageParam bias(Halide::Float(32), 4, "bias");
  Func out("attention_out");

  const Expr lq = q.dim(1).extent(), lk = k.dim(1).extent(), batch = q.dim(2).extent();
  const Expr key_blocks = (lk + kb - 1) / kb;
  // Key blocks that rows [0, end) need.
  auto blocks_for_rows = [&](const Expr& end) -> Expr {
    if (!causal) return key_blocks;
    return Halide::min(key_blocks, (Halide::min(lk, end) + kb - 1) / kb);
  };

  Var jj("jj"), d("d"), jb("jb"), ii("ii"), io("io"), h("h"), b("b");
  Var e("e"), c("c"), i("i"), jp("jp");

  // K transposed per (batch, head) into key blocks: kt(jj, d, jb) = k[jb·KB + jj][d].
  Func kt("attention_kt");
  kt(jj, d, jb, h, b) = k(h / group * dk + d, Halide::min(Halide::likely(jb * kb + jj), lk - 1), b);

  // The row block's queries, copied so that the QK tiles broadcast them from fixed offsets.
  const Expr row = io * kRowBlock + ii, key = jb * kb + jj;
  Func qb("attention_q");
  qb(d, ii, io, h, b) = q(h * dk + d, Halide::min(row, lq - 1), b);

  const bool bf = spec.bf16;
  KILN_ASSERT(!bf || (dk % 2 == 0 && lanes == 16 &&
                      target.has_feature(Halide::Target::AVX512_SapphireRapids)),
              "bf16 attention kernel needs an even dk and a target with AVX512-BF16");
  auto bf16_of = [](const Expr& f) {
    return Halide::reinterpret(Halide::BFloat(16), round_to_bf16_bits(f));
  };
  // bf16: q and K rounded, K's pairs of channels adjacent (kt2(pair, jj, dp, jb) = k[jb·KB +
  // jj][2·dp + pair]), as vdpbf16ps reads them. An input stored in bf16 is already rounded.
  Func qb2("attention_q_bf16"), kt2("attention_kt_bf16");
  Var pr("pr"), dp("dp");
  if (bf) {
    qb2(d, ii, io, h, b) = spec.q_bf16 ? qb(d, ii, io, h, b) : bf16_of(qb(d, ii, io, h, b));
    const Expr kk =
        k(h / group * dk + 2 * dp + pr, Halide::min(Halide::likely(jb * kb + jj), lk - 1), b);
    kt2(pr, jj, dp, jb, h, b) = spec.k_bf16 ? kk : bf16_of(kk);
  }
  RDom rd(0, dk, "rd");
  RDom rd2(0, 2, 0, dk / 2, "rd2");
  Func dot("attention_dot");
  dot(jj, ii, jb, io, h, b) = 0.0f;
  if (bf)
    dot(jj, ii, jb, io, h, b) += Halide::cast<float>(qb2(2 * rd2.y + rd2.x, ii, io, h, b)) *
                                 Halide::cast<float>(kt2(rd2.x, jj, rd2.y, jb, h, b));
  else
    dot(jj, ii, jb, io, h, b) += qb(rd, ii, io, h, b) * kt(jj, rd, jb, h, b);

  Expr is_masked;
  if (causal) is_masked = key > row;
  if (spec.window) {
    Expr outside = row - key >= static_cast<int>(spec.window);
    is_masked = is_masked.defined() ? (is_masked || outside) : outside;
  }
  if (padded) {
    Expr pad = mask(Halide::min(key, lk - 1), b) != 0;
    is_masked = is_masked.defined() ? (is_masked || pad) : pad;
  }
  // Scores in base 2: exp(s - max) = 2^((s - max)·log2 e), with log2 e folded into the scale.
  // Masked scores are -1e9 in either base: a masked key weighs exactly 0 unless every key of
  // the row is masked, and then all weigh the same, as in the interpreter.
  Expr scaled = base2_score(spec, dot(jj, ii, jb, io, h, b), bias, key, row, h, b);
  Func score("attention_score");
  score(jj, ii, jb, io, h, b) =
      is_masked.defined() ? Halide::select(key >= lk, kNoKey, is_masked, kMaskedScore, scaled)
                          : Halide::select(key >= lk, kNoKey, scaled);

  // A reduction over the key blocks row block `io` needs: (RDom, block index to read).
  const Expr blocks_io = blocks_for_rows((io + 1) * kRowBlock);
  auto block_domain = [&](const char* name) {
    RDom r(0, key_blocks, name);
    if (causal) r.where(r < blocks_io);
    return std::pair<RDom, Expr>(r, causal ? Halide::min(r.x, blocks_io - 1) : Expr(r.x));
  };

  // Row maxima: across key blocks per lane, then across the KB lanes.
  auto [rm, mb] = block_domain("rm");
  Func max_lanes("attention_max_lanes");
  max_lanes(jj, ii, io, h, b) = kLowest;
  max_lanes(jj, ii, io, h, b) =
      Halide::max(max_lanes(jj, ii, io, h, b), score(jj, ii, mb, io, h, b));
  RDom rml(0, kb, "rml");
  Func row_max("attention_row_max");
  row_max(ii, io, h, b) = kLowest;
  row_max(ii, io, h, b) = Halide::max(row_max(ii, io, h, b), max_lanes(rml, ii, io, h, b));

  Func prob("attention_prob");  // unnormalized
  prob(jj, ii, jb, io, h, b) =
      exp2_nonpositive(score(jj, ii, jb, io, h, b) - row_max(ii, io, h, b));

  // bf16: the probabilities as the V product reads them (rounded), pairs of keys adjacent;
  // the row sums add the rounded values, so that the weights still sum to 1.
  Func prob2("attention_prob_bf16");
  if (bf)  // vcvtne2ps2bf16 (32 at a time, below): round_to_bf16_bits' rounding
    prob2(pr, jp, ii, jb, io, h, b) =
        Halide::cast(Halide::BFloat(16), prob(2 * jp + pr, ii, jb, io, h, b));
  auto [rs, sb] = block_domain("rs");
  Func sum_lanes("attention_sum_lanes");
  sum_lanes(jj, ii, io, h, b) = 0.0f;
  sum_lanes(jj, ii, io, h, b) += bf ? Halide::cast<float>(prob2(jj % 2, jj / 2, ii, sb, io, h, b))
                                    : prob(jj, ii, sb, io, h, b);
  RDom rsl(0, kb, "rsl");
  Func row_sum("attention_row_sum");
  row_sum(ii, io, h, b) = 0.0f;
  row_sum(ii, io, h, b) += sum_lanes(rsl, ii, io, h, b);

  // V per (batch, head), copied contiguous: rows of v are 3·D apart in a merged QKV tensor,
  // and such power-of-two-ish strides make every row of one head compete for a few cache sets.
  Func vc("attention_v");
  // bf16: vc(pair, e, jp, jb) = v[jb·KB + 2·jp + pair][e] rounded, pairs of keys adjacent.
  if (bf) {
    const Expr vv =
        v(h / group * dv + e, Halide::min(Halide::likely(jb * kb + 2 * jp + pr), lk - 1), b);
    vc(pr, e, jp, jb, h, b) = spec.v_bf16 ? vv : bf16_of(vv);
  } else {
    vc(e, jj, jb, h, b) = v(h / group * dv + e, Halide::min(jb * kb + jj, lk - 1), b);
  }
  // The V product of a row block, over the key blocks it needs.
  RDom rv(0, kb, 0, key_blocks, "rv");
  RDom rv2(0, 2, 0, kb / 2, 0, key_blocks, "rv2");
  if (causal) rv.where(rv.y < blocks_io);
  if (causal) rv2.where(rv2.z < blocks_io);
  const Expr vb = causal ? Halide::min(rv.y, blocks_io - 1) : Expr(rv.y);
  const Expr vb2 = causal ? Halide::min(rv2.z, blocks_io - 1) : Expr(rv2.z);
  Func pv("attention_pv");
  pv(e, ii, io, h, b) = 0.0f;
  if (bf)
    pv(e, ii, io, h, b) += Halide::cast<float>(prob2(rv2.x, rv2.y, ii, vb2, io, h, b)) *
                           Halide::cast<float>(vc(rv2.x, e, rv2.y, vb2, h, b));
  else
    pv(e, ii, io, h, b) += prob(rv.x, ii, vb, io, h, b) * vc(e, rv.x, vb, h, b);

  const Expr out_h = c / dv, out_e = c % dv;
  const Expr out_ii = i % kRowBlock, out_io = i / kRowBlock;
  Expr result = pv(out_e, out_ii, out_io, out_h, b) / row_sum(out_ii, out_io, out_h, b);
  // Rows whose keys are all masked (undefined: no row is): padded queries, and rows of padded
  // keys as the paragraphs above say.
  Expr all_masked;
  auto either = [&](const Expr& m) { all_masked = all_masked.defined() ? all_masked || m : m; };
  if (query_padded) either(qmask(i, b) != 0);
  Func mean_v("attention_mean_v"), first_key("attention_first_key");
  if (fill_inf) {
    if (padded) {  // the first key that is not padding, Lk if none
      define_first_key(first_key, mask, lk, b);
      either(first_key(b) > (causal ? Halide::min(i, lk - 1) : lk - 1));
    }
    // A window leaves a row no key when even the last key is too far (rows past Lk + W - 1).
    if (spec.window) either(i - (lk - 1) >= static_cast<int>(spec.window));
    if (all_masked.defined()) result = nan_where(all_masked, result);
  } else {
    if (causal && padded) either(row_max(out_ii, out_io, out_h, b) <= 0.5f * kMaskedScore);
    if (all_masked.defined()) {
      // The uniform average of v over all Lk keys.
      RDom rk(0, lk, "rk");
      mean_v(e, h, b) = 0.0f;
      // bf16: of v rounded, as the V product reads it (each key's weight is then exactly 1).
      const Expr vk = v(h / group * dv + e, rk, b);
      mean_v(e, h, b) += bf ? Halide::cast<float>(spec.v_bf16 ? vk : bf16_of(vk)) : vk;
      result =
          Halide::select(all_masked, mean_v(out_e, out_h, b) / Halide::cast<float>(lk), result);
    }
  }
  // Stored in bf16: rounded as the kernel that reads it would round it.
  out(c, i, b) = spec.out_bf16 ? bf16_of(result) : result;

  constrain_buffers(q, k, v, mask, qmask, bias, out, heads, kv_heads, dk, dv);

  // Schedule.
  const int ve = lanes_dividing(dv, lanes);  // vector width over V channels
  // Channels per V-product tile: 12 rows × 2 (AVX-512: 24 of 32 registers) or 1 vector.
  const int eb = (lanes >= 16 && (dv / ve) % 2 == 0 ? 2 : 1) * ve;

  Var ch("ch"), ce("ce"), hb("hb");
  // Parallel over (head, sequence) pairs; from kBatchTasks sequences on, over sequences, each
  // task every head of its sequence (the loop still named hb, where K and V are copied): the
  // copies then read each key's row across all heads, contiguous, instead of one head's 64
  // values (256 bytes in f32) every 3·D. W2 (16 sequences of 128, 2 threads): the encoder's
  // attention 1.09–1.12 ms against 1.38–1.50 in bf16, 1.86 against 1.95–2.12 in f32 (alternated
  // runs, AMD Zen 5). Fewer sequences keep the heads parallel (W4: one sequence, 8 tasks).
  out.specialize(batch >= kBatchTasks)
      .split(c, ch, ce, dv)
      .split(i, io, ii, kRowBlock, TailStrategy::GuardWithIf)
      .reorder(ce, ii, io, ch, b)
      .vectorize(ce, ve)
      .rename(b, hb)
      .parallel(hb);
  out.split(c, ch, ce, dv)
      .split(i, io, ii, kRowBlock, TailStrategy::GuardWithIf)
      .reorder(ce, ii, io, ch, b)
      .vectorize(ce, ve)
      .fuse(ch, b, hb)
      .parallel(hb);

  // The copies go key block by key block, every head of a block before the next (one head
  // where the task is one).
  if (bf) {
    kt2.compute_at(out, hb).reorder(pr, jj, dp, h, jb).vectorize(pr).vectorize(jj, lanes);
    // V's pairs of keys unrolled and the channels vectorized: two dense loads of 16 channels
    // and one interleave (vpermt2w) per 32 values. With the pair vectorized too, Halide read
    // every value alone (the key's clamp depends on the pair: 32 scalar loads per 32 values),
    // 0.20 of W4's 2.9 ms per layer in Halide's profiler, then 0.01.
    vc.compute_at(out, hb).reorder(pr, e, h, jp, jb).unroll(pr).vectorize(e, ve);
  } else {
    kt.compute_at(out, hb).reorder(jj, d, h, jb).vectorize(jj, lanes);
    vc.compute_at(out, hb).reorder(e, h, jj, jb).vectorize(e, ve);
  }
  if (mean_v.defined()) {
    mean_v.compute_at(out, hb).vectorize(e, ve);
    mean_v.update().vectorize(e, ve);
  }
  if (first_key.defined()) first_key.compute_at(out, hb);

  // Per row block (loop io of out). bound_extent(io, 1): one block per computation, so that the
  // small buffers have constant sizes (on the stack, in registers after unrolling); the score
  // and probability scratch are allocated once per (batch, head) and reused by every block.
  for (Func f : {qb, max_lanes, row_max, sum_lanes, row_sum, pv}) f.compute_at(out, io);
  // bf16: the probabilities are computed straight into their rounded copy (prob inlined).
  score.store_at(out, hb).fold_storage(io, 1).compute_at(out, io);
  if (!bf) prob.store_at(out, hb).fold_storage(io, 1).compute_at(out, io);
  for (Func f : {qb, max_lanes, row_max, sum_lanes, row_sum, pv}) f.bound_extent(io, 1);

  qb.vectorize(d, lanes_dividing(dk, lanes));
  if (bf) {
    qb2.compute_at(out, io).bound_extent(io, 1).vectorize(d, lanes_dividing(dk, lanes));
    prob2.store_at(out, hb).fold_storage(io, 1).compute_at(out, io);
    prob2.reorder(pr, jp, ii, jb).vectorize(pr).vectorize(jp, lanes);
  }
  // Scores: 6 × KB register tiles, the dk reduction innermost (12 accumulators); bf16: the
  // whole row block, 12 × KB (24): vdpbf16ps needs more in flight than 12 to issue at its rate
  // (on AMD Zen 5, 2 per cycle: 224–253 products per ns from 12 independent chains, 272 from
  // 24), and the W4 attention (1024 positions, 2 threads) took 3.18–3.29 ms per layer against
  // 3.33–3.42 with 6 rows (4 alternated runs each). f32 measured the same either way.
  Var ito("ito"), iti("iti");
  score.split(ii, ito, iti, bf ? kRowBlock : kRowTile)
      .reorder(jj, iti, ito, jb)
      .vectorize(jj, lanes)
      .unroll(jj)
      .unroll(iti);
  // bound: the masks' selects would otherwise trim the tile at Lk to a non-constant size.
  dot.compute_at(score, ito).bound(jj, 0, kb).vectorize(jj, lanes).unroll(jj).unroll(ii);
  if (bf)  // vdpbf16ps: the pair of channels vectorized atomically
    dot.update()
        .reorder(rd2.x, jj, ii, rd2.y)
        .atomic()
        .vectorize(rd2.x)
        .vectorize(jj, lanes)
        .unroll(jj)
        .unroll(ii);
  else
    dot.update().reorder(jj, ii, rd).vectorize(jj, lanes).unroll(jj).unroll(ii);

  // Maxima and sums: across key blocks in vectors, then across the lanes.
  max_lanes.vectorize(jj, lanes).unroll(jj);
  max_lanes.update().reorder(jj, ii, rm.x).vectorize(jj, lanes).unroll(jj).unroll(ii);
  sum_lanes.vectorize(jj, lanes).unroll(jj);
  sum_lanes.update().reorder(jj, ii, rs.x).vectorize(jj, lanes).unroll(jj).unroll(ii);
  row_max.update().atomic().vectorize(rml);  // across lanes: vector reductions (shuffles)
  row_sum.update().atomic().vectorize(rsl);
  if (!bf) prob.reorder(jj, ii, jb).vectorize(jj, lanes).unroll(jj);

  // The V product: 12 rows × eb channels of accumulators per pass over the keys. The passes are
  // unrolled too (constant accumulator addresses stay in registers) unless there are many.
  Var eo("eo"), ei("ei");
  pv.vectorize(e, ve);
  if (bf)
    pv.update()
        .split(e, eo, ei, eb)
        .reorder(rv2.x, ei, ii, rv2.y, rv2.z, eo)
        .atomic()
        .vectorize(rv2.x)
        .vectorize(ei, ve)
        .unroll(ei)
        .unroll(ii);
  else
    pv.update()
        .split(e, eo, ei, eb)
        .reorder(ei, ii, rv.x, rv.y, eo)
        .vectorize(ei, ve)
        .unroll(ei)
        .unroll(ii);
  if (dv / eb <= 16) pv.update().unroll(eo);

  std::vector<Halide::Argument> args = {q, k, v};
  if (padded) args.push_back(mask);
  if (query_padded) args.push_back(qmask);
  if (spec.bias) args.push_back(bias);
  return {Halide::Pipeline(out), args};
}

}  // namespace kiln::codegen
