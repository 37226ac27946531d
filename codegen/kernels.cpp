// Kernel names, signatures, and AOT compilation of kernels and the Halide runtime.
#include "codegen/kernels.h"

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "codegen/halide_kernels.h"
#include "runtime/cpu_features.h"
#include "support/error.h"

namespace kiln::codegen {

int vector_lanes(const Halide::Target& t) {
  if (t.has_feature(Halide::Target::AVX512)) return 16;
  if (t.has_feature(Halide::Target::AVX2) || t.has_feature(Halide::Target::AVX)) return 8;
  return 4;
}

Halide::Expr is_nan_bits(const Halide::Expr& x) {
  const Halide::Expr bits = Halide::reinterpret(Halide::UInt(32, x.type().lanes()), x);
  return (bits & Halide::Expr(uint32_t{0x7fffffff})) > Halide::Expr(uint32_t{0x7f800000});
}

Halide::Expr relu_keeping_nan(const Halide::Expr& x) {
  return Halide::select(is_nan_bits(x), x, Halide::max(x, 0.0f));
}

namespace {

// tanh without Halide::tanh (a scalar libm call per lane): the odd Taylor series through
// x^13 where |x| < 0.4 (truncation error below 4e-9 relative there), else
// sign(x)·(1 - e)/(1 + e) with e = exp(-2|x|), whose cancellation in 1 - e costs at most
// about one ulp of e relative to 1 - e ≥ 0.55 when |x| ≥ 0.4.
Halide::Expr tanh_accurate(const Halide::Expr& x) {
  const Halide::Expr ax = Halide::abs(x);
  const Halide::Expr x2 = x * x;
  // tanh x = x - x^3/3 + 2x^5/15 - 17x^7/315 + 62x^9/2835 - 1382x^11/155925
  //          + 21844x^13/6081075 - ...
  Halide::Expr p = 21844.0f / 6081075.0f;
  p = p * x2 + (-1382.0f / 155925.0f);
  p = p * x2 + (62.0f / 2835.0f);
  p = p * x2 + (-17.0f / 315.0f);
  p = p * x2 + (2.0f / 15.0f);
  p = p * x2 + (-1.0f / 3.0f);
  const Halide::Expr series = x + x * x2 * p;
  const Halide::Expr e = Halide::exp(Halide::max(-2.0f * ax, -200.0f));  // inf: e = 0
  const Halide::Expr t = (1.0f - e) / (1.0f + e);
  return Halide::select(ax < 0.4f, series, Halide::select(x < 0.0f, -t, t));
}

// float_function for a non-NaN x. Halide's exp and erf give garbage at ±inf (their range
// reduction converts inf to an integer), so their arguments are clamped to where the
// function has saturated in f32: exp(±200) is inf and 0, erf(±10) is ±1.
Halide::Expr finite_function(const std::string& op, const Halide::Expr& x) {
  constexpr float kSqrtHalf = 0.70710678118654752440f;     // 1/√2
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;  // √(2/π)
  const auto exp = [](const Halide::Expr& v) {
    return Halide::exp(Halide::clamp(v, -200.0f, 200.0f));
  };
  const auto erf = [](const Halide::Expr& v) {
    return Halide::erf(Halide::clamp(v, -10.0f, 10.0f));
  };
  if (op == "exp") return exp(x);
  if (op == "log") return Halide::log(x);
  if (op == "sqrt") return Halide::sqrt(x);
  if (op == "tanh") return tanh_accurate(x);
  if (op == "sin") return Halide::sin(x);
  if (op == "cos") return Halide::cos(x);
  if (op == "rsqrt") return 1.0f / Halide::sqrt(x);
  if (op == "erf") return erf(x);
  // 1/(1 + exp(-x)): exp overflows to inf for x < -88, giving 0 as it should.
  if (op == "sigmoid") return 1.0f / (1.0f + exp(-x));
  if (op == "silu") return x / (1.0f + exp(-x));
  if (op == "gelu") return 0.5f * x * (1.0f + erf(x * kSqrtHalf));
  // 0.5·x·(1 + tanh(u)) = x·sigmoid(2u): the same function without the cancellation of
  // 1 + tanh(u) for negative u.
  if (op == "gelu_tanh") {
    const Halide::Expr u = kSqrt2OverPi * (x + 0.044715f * x * x * x);
    return x / (1.0f + exp(-2.0f * u));
  }
  KILN_ASSERT(false, "no f32 function named " + op);
  return {};
}

}  // namespace

Halide::Expr float_function(const std::string& op, const Halide::Expr& x) {
  if (op == "relu") return relu_keeping_nan(x);
  // NaN in, NaN out (Halide's log and erf, and the selects below, would not keep it).
  return Halide::select(is_nan_bits(x), x, finite_function(op, x));
}

std::string ElementwiseKernel::signature() const {
  std::string s = fmt::format("r{}", out_rank);
  for (const Node& n : nodes) {
    using Kind = Node::Kind;
    const bool is_op = n.kind == Kind::op;
    const char* name = n.kind == Kind::input      ? "input"
                       : n.kind == Kind::constant ? "constant"
                                                  : ir::op_name(n.op);
    s += fmt::format(";{}:{}:{}", name, static_cast<int>(n.dtype), n.rank);
    for (int o : n.operands) s += fmt::format(",{}", o);
    s += ":";
    for (bool b : n.broadcast) s += b ? '1' : '0';
    if (n.kind == Kind::input) s += fmt::format(":i{}", n.input);
    if (n.kind == Kind::constant) s += fmt::format(":v{}", n.value);
    if (is_op && (n.op == ir::OpKind::iota || n.op == ir::OpKind::take_along_axis))
      s += fmt::format(":a{}", n.axis);
    if (is_op && n.op == ir::OpKind::gather) s += fmt::format(":t{}", n.table_rows);
    if (is_op && n.op == ir::OpKind::transpose)
      for (int64_t p : n.perm) s += fmt::format(":p{}", p);
  }
  return s;
}

namespace {
// FNV-1a, for short stable names of elementwise kernels.
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string scale_tag(double scale) {
  // Exact bits of the scale, so kernels differing in scale never share a name.
  uint64_t bits;
  std::memcpy(&bits, &scale, sizeof bits);
  return fmt::format("{:016x}", bits);
}
}  // namespace

std::string kernel_name(const KernelSpec& spec) {
  if (const auto* k = std::get_if<LinearKernel>(&spec))
    return fmt::format("kiln_linear{}_k{}_n{}{}{}{}{}{}{}", k->rows ? "_rows" : "", k->K, k->N,
                       k->has_bias ? "" : "_nobias", k->act == "none" ? "" : "_" + k->act,
                       k->panel ? fmt::format("_p{}", k->panel) : "",
                       k->bf16_fma ? "_bf16fma"
                       : k->bf16   ? "_bf16"
                       : k->int8   ? "_int8"
                                   : "",
                       k->x_bf16 ? "_xb" : "", k->out_bf16 ? "_ob" : "");
  if (const auto* k = std::get_if<AttentionKernel>(&spec))
    return fmt::format(
        "kiln_attention_h{}_dk{}_dv{}{}{}{}{}{}{}{}{}_s{}{}{}", k->heads, k->dk, k->dv,
        k->causal ? "_causal" : "", k->key_padding ? "_kpad" : "", k->query_padding ? "_qpad" : "",
        k->fill_inf ? "_inf" : "",
        k->kv_heads && k->kv_heads != k->heads ? fmt::format("_kv{}", k->kv_heads) : "",
        k->bias ? "_bias" : "", k->window ? fmt::format("_w{}", k->window) : "",
        k->softcap ? "_cap" + scale_tag(k->softcap) : "", scale_tag(k->scale),
        k->bf16 ? "_bf16" : "",
        k->q_bf16 || k->k_bf16 || k->v_bf16 || k->out_bf16
            ? fmt::format("_b{}{}{}{}", k->q_bf16 ? "q" : "", k->k_bf16 ? "k" : "",
                          k->v_bf16 ? "v" : "", k->out_bf16 ? "o" : "")
            : "");
  if (const auto* k = std::get_if<StepAttentionKernel>(&spec))
    return fmt::format("kiln_{}_attention_h{}{}_dk{}_dv{}{}{}_s{}", k->memory ? "memory" : "cache",
                       k->heads, k->kv_heads ? fmt::format("_g{}", k->kv_heads) : "", k->dk, k->dv,
                       k->window ? fmt::format("_w{}", k->window) : "", k->bias ? "_bias" : "",
                       scale_tag(k->scale));
  if (const auto* k = std::get_if<LayerNormKernel>(&spec))
    return fmt::format("kiln_{}{}{}{}{}_d{}_e{}",
                       k->with_sum   ? "add_sum_"
                       : k->with_add ? "add_"
                                     : "",
                       k->rms ? "rmsnorm" : "layernorm", k->broadcast_y ? "_bcast" : "",
                       k->unbiased ? "_unbiased" : "", k->eps_outside ? "_epsout" : "", k->D,
                       scale_tag(k->eps));
  auto flags = [](const std::vector<bool>& v) {
    std::string s;
    for (bool b : v) s += b ? '1' : '0';
    return s;
  };
  if (const auto* k = std::get_if<ReduceKernel>(&spec)) {
    static const char* const kOps[] = {"sum", "mean", "max", "argmax"};
    return fmt::format("kiln_reduce_{}_{}_r{}", kOps[static_cast<int>(k->op)],
                       k->i64 ? "i64" : "f32", flags(k->reduced));
  }
  if (const auto* k = std::get_if<SoftmaxKernel>(&spec))
    return fmt::format("kiln_softmax_r{}_a{}", k->rank, k->axis);
  if (const auto* k = std::get_if<MatmulKernel>(&spec))
    return fmt::format("kiln_matmul_a{}_{}_b{}_{}_o{}{}{}{}{}", k->a_rank, flags(k->a_broadcast),
                       k->b_rank, flags(k->b_broadcast), k->out_rank, k->transpose_b ? "_bt" : "",
                       k->has_bias ? "_bias" : "", k->act == "none" ? "" : "_" + k->act,
                       k->gather_b ? "_rows" : "");
  if (const auto* k = std::get_if<TopkKernel>(&spec))
    return fmt::format("kiln_topk_k{}_{}", k->k, k->i64 ? "i64" : "f32");
  if (const auto* k = std::get_if<ScatterAddKernel>(&spec))
    return fmt::format("kiln_scatter_add_r{}_a{}_{}", k->rank, k->axis, k->i64 ? "i64" : "f32");
  const auto& k = std::get<ElementwiseKernel>(spec);
  return fmt::format("kiln_elementwise_{:016x}", fnv1a(k.signature()));
}

Halide::Target host_target() {
  Halide::Target t = Halide::get_host_target();
  const std::pair<Halide::Target::Feature, const char*> x86[] = {
      {Halide::Target::AVX512_SapphireRapids, "avx512_sapphirerapids"},
      {Halide::Target::AVX512_Cannonlake, "avx512_cannonlake"},
      {Halide::Target::AVX512_Skylake, "avx512_skylake"},
      {Halide::Target::AVX512_KNL, "avx512_knl"},
      {Halide::Target::AVX512, "avx512"},
      {Halide::Target::FMA4, "fma4"},
  };
  for (const auto& [feature, name] : x86)
    if (t.has_feature(feature) && !rt::missing_cpu_features(name).empty())
      t = t.without_feature(feature);
  return t;
}

namespace {
// "host" and "host-<features>" (e.g. host-opencl) start from host_target(), not from
// Halide's own host detection (see host_target).
Halide::Target parse_target(const std::string& target) {
  if (target == "host") return host_target();
  std::string full = target;
  if (target.rfind("host-", 0) == 0) full = host_target().to_string() + target.substr(4);
  if (!Halide::Target::validate_target_string(full))
    fail("invalid target '{}' (Halide target strings look like x86-64-linux-avx2-fma)", target);
  return Halide::Target(full);
}

}  // namespace

std::string resolve_target(const std::string& target) {
  try {
    return parse_target(target).to_string();
  } catch (const kiln::Error&) {
    throw;
  } catch (const std::exception& e) {
    fail("invalid target '{}': {}", target, e.what());
  }
}

std::string gpu_api(const std::string& target) {
  const Halide::Target t = parse_target(target);
  if (!t.has_gpu_feature()) return "";
  const bool opencl = t.has_feature(Halide::Target::OpenCL);
  const bool cuda = t.has_feature(Halide::Target::CUDA);
  if (opencl && !cuda) return "opencl";
  if (cuda && !opencl) return "cuda";
  fail(
      "target '{}': kiln runs kernels on one GPU API, opencl or cuda (it has no schedules for "
      "the others)",
      target);
}

int kernel_num_outputs(const KernelSpec& spec) {
  const auto* k = std::get_if<LayerNormKernel>(&spec);
  return k && k->with_sum ? 2 : 1;
}

std::string kind_without_gpu_schedule(const KernelSpec& spec) {
  struct Kind {
    std::string operator()(const LinearKernel& k) const {
      return k.bf16 ? "bf16 linear" : k.int8 ? "int8 linear" : "";
    }
    std::string operator()(const AttentionKernel& k) const {
      return k.bf16 ? "bf16 attention" : "";
    }
    std::string operator()(const StepAttentionKernel&) const { return ""; }
    std::string operator()(const LayerNormKernel&) const { return ""; }
    std::string operator()(const ElementwiseKernel&) const { return ""; }
    std::string operator()(const ReduceKernel&) const { return ""; }
    std::string operator()(const SoftmaxKernel&) const { return ""; }
    std::string operator()(const MatmulKernel&) const { return ""; }
    std::string operator()(const TopkKernel&) const { return ""; }
    std::string operator()(const ScatterAddKernel&) const { return ""; }
  };
  return std::visit(Kind{}, spec);
}

KernelPipeline build_kernel(const KernelSpec& spec, const Halide::Target& t) {
  if (const auto* k = std::get_if<LinearKernel>(&spec)) {
    KILN_ASSERT(k->bf16 || !(k->x_bf16 || k->out_bf16),
                "linear kernel with bf16 activations but not bf16 weights");
    return k->bf16   ? build_linear_bf16(*k, t)
           : k->int8 ? build_linear_int8(*k, t)
                     : build_linear(*k, t);
  }
  if (const auto* k = std::get_if<AttentionKernel>(&spec)) return build_attention(*k, t);
  if (const auto* k = std::get_if<StepAttentionKernel>(&spec)) return build_step_attention(*k, t);
  if (const auto* k = std::get_if<LayerNormKernel>(&spec)) return build_layernorm(*k, t);
  if (const auto* k = std::get_if<ReduceKernel>(&spec)) return build_reduce(*k, t);
  if (const auto* k = std::get_if<SoftmaxKernel>(&spec)) return build_softmax(*k, t);
  if (const auto* k = std::get_if<MatmulKernel>(&spec)) return build_matmul(*k, t);
  if (const auto* k = std::get_if<TopkKernel>(&spec)) return build_topk(*k, t);
  if (const auto* k = std::get_if<ScatterAddKernel>(&spec)) return build_scatter_add(*k, t);
  return build_elementwise(std::get<ElementwiseKernel>(spec), t);
}

namespace {
// Why weights of `kind` ("bf16", needing `what` = "AVX512-BF16", kiln feature `feature`) cannot
// be compiled for `target`, or "".
std::string packed_weights_problem(const std::string& target, const char* kind, const char* what,
                                   const char* feature) {
  Halide::Target t = parse_target(target);
  if (t.arch != Halide::Target::X86 || t.bits != 64 ||
      !t.has_feature(Halide::Target::AVX512_Skylake))
    return fmt::format(
        "{} weights need an x86-64 target with AVX-512 (avx512_skylake or "
        "higher) on a CPU with {}; target '{}' has no avx512_skylake",
        kind, what, t.to_string());
  if (target == "host" && !rt::missing_cpu_features(feature).empty())
    return fmt::format(
        "{} weights need {}, which this CPU lacks ({}); compile with "
        "f32 weights, or for another machine's target",
        kind, what, fmt::join(rt::missing_cpu_features(feature), ", "));
  return "";
}
}  // namespace

std::string bf16_target_problem(const std::string& target) {
  return packed_weights_problem(target, "bf16", "AVX512-BF16", kBf16Feature);
}

std::string int8_target_problem(const std::string& target) {
  return packed_weights_problem(target, "int8", "AVX512-VNNI", kInt8Feature);
}

std::vector<int64_t> gpu_block_threads(const Halide::Module& module) {
  using namespace Halide::Internal;
  // The host code launches each kernel through halide_<api>_run(state, entry, blocks x, y, z,
  // threads x, y, z, shared bytes, ...).
  class Visitor : public IRVisitor {
   public:
    std::vector<int64_t> threads;

   private:
    using IRVisitor::visit;
    void visit(const Call* op) override {
      IRVisitor::visit(op);
      const std::string& n = op->name;
      if (op->call_type != Call::Extern || n.rfind("halide_", 0) != 0 || n.size() < 4 ||
          n.compare(n.size() - 4, 4, "_run") != 0 || op->args.size() < 9)
        return;
      int64_t product = 1;
      for (int d = 5; d < 8; ++d) {
        const Halide::Expr bound = find_constant_bound(simplify(op->args[d]), Direction::Upper);
        const int64_t* v = bound.defined() ? as_const_int(bound) : nullptr;
        if (!v) {
          product = -1;
          break;
        }
        product *= *v;
      }
      threads.push_back(product);
    }
  } v;
  for (const LoweredFunc& f : module.functions()) f.body.accept(&v);
  return v.threads;
}

namespace {

// Rewrites LLVM assembly's prefetches from Halide 14's locality 0 (prefetchnta) to 3
// (prefetcht0): `call void @llvm.prefetch...(ptr, i32 0, i32 0, i32 1)`, rw 0 and the data
// cache kept. A pipeline with prefetches whose IR has none of that form is Halide's change
// to notice, not to compile silently without them.
void raise_prefetch_locality(const std::string& path, const std::string& function_name) {
  std::string text;
  {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream all;
    all << in.rdbuf();
    text = all.str();
  }
  static constexpr std::string_view kCall = "call void @llvm.prefetch";
  static constexpr std::string_view kFrom = ", i32 0, i32 0, i32 1)",
                                    kTo = ", i32 0, i32 3, i32 1)";
  int rewritten = 0;
  for (size_t at = text.find(kCall); at != std::string::npos; at = text.find(kCall, at + 1)) {
    const size_t end = text.find('\n', at);
    const size_t hint = text.find(kFrom, at);
    if (hint == std::string::npos || hint > end) continue;
    text.replace(hint, kFrom.size(), kTo);
    ++rewritten;
  }
  if (rewritten == 0)
    fail(
        "kernel {}: its schedule prefetches, but Halide's LLVM IR has no prefetch of locality 0 "
        "to raise (a Halide version kiln does not know?)",
        function_name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.flush()) fail("cannot write {}", path);
}

}  // namespace

KernelOutput compile_kernel(const KernelSpec& spec, const std::string& target,
                            const std::string& function_name, const std::string& object_path) {
  Halide::Target t = parse_target(target).with_feature(Halide::Target::NoRuntime);
  try {
    const auto* linear = std::get_if<LinearKernel>(&spec);
    const auto* attention = std::get_if<AttentionKernel>(&spec);
    const bool sapphire_only =
        (linear && (linear->bf16 || linear->int8)) || (attention && attention->bf16);
    if (sapphire_only) {
      const std::string problem =
          linear && linear->int8 ? int8_target_problem(target) : bf16_target_problem(target);
      if (!problem.empty()) fail("{}", problem);
      // LLVM IR for avx512_sapphirerapids (it names no CPU), compiled by llc for cooperlake:
      // AVX-512 with BF16 and VNNI, no FP16, no AMX (see KernelOutput). Halide 14 emits
      // vdpbf16ps and vpdpbusd only for avx512_sapphirerapids.
      t = t.with_feature(Halide::Target::AVX512_SapphireRapids);
    }
    KernelPipeline kp = build_kernel(spec, t);
    // Through LLVM IR: the kernels above, and those that prefetch (for the CPU they name; a
    // sapphirerapids target's is cooperlake too).
    if (sapphire_only || !kp.prefetch_llc_cpu.empty()) {
      KernelOutput out{object_path + ".ll",
                       sapphire_only ? std::string("cooperlake") : kp.prefetch_llc_cpu};
      kp.pipeline.compile_to_llvm_assembly(out.llvm_assembly, kp.args, function_name, t);
      if (!kp.prefetch_llc_cpu.empty()) raise_prefetch_locality(out.llvm_assembly, function_name);
      return out;
    }
    if (t.has_gpu_feature()) {
      const std::string kind = kind_without_gpu_schedule(spec);
      if (!kind.empty())
        fail("kernel {}: {} kernels have no GPU schedule yet (target {})", function_name, kind,
             t.to_string());
      KILN_ASSERT(kp.gpu_threads > 0, "kernel " + function_name + ": no GPU schedule");
      if (kp.gpu_threads > kGpuMaxThreadsPerBlock ||
          kp.gpu_shared_bytes > kGpuMaxSharedBytesPerBlock)
        fail(
            "kernel {}: its GPU schedule uses {} threads and {} bytes of shared memory per block, "
            "more than the {} and {} a GPU allows",
            function_name, kp.gpu_threads, kp.gpu_shared_bytes, kGpuMaxThreadsPerBlock,
            kGpuMaxSharedBytesPerBlock);
    }
    const Halide::Module module = kp.pipeline.compile_to_module(kp.args, function_name, t);
    if (t.has_gpu_feature()) {
      // What Halide launches, not what the schedule meant to (a launch over the limit fails
      // only on a real GPU: OpenCL on pocl runs it).
      for (const int64_t threads : gpu_block_threads(module))
        if (threads < 0 || threads > kGpuMaxThreadsPerBlock)
          fail(
              "kernel {}: its GPU schedule launches blocks of {} threads, more than the {} a GPU "
              "allows (Halide sizes a block by each thread dimension's largest extent in any "
              "stage)",
              function_name, threads < 0 ? "an unbounded number of" : std::to_string(threads),
              kGpuMaxThreadsPerBlock);
    }
    module.compile({{Halide::OutputFileType::object, object_path}});
    return {};
  } catch (const Halide::CompileError& e) {
    fail("halide failed to compile kernel {}: {}", function_name, e.what());
  } catch (const Halide::InternalError& e) {
    fail("halide internal error compiling kernel {}: {}", function_name, e.what());
  }
}

void compile_runtime(const std::string& target, const std::string& object_path) {
  Halide::compile_standalone_runtime(object_path, parse_target(target));
}

}  // namespace kiln::codegen
