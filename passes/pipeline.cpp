// The pass registry and the default pipeline: one flat list, one line per pass.
#include "passes/pipeline.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ir/printer.h"
#include "ir/verifier.h"
#include "passes/canonicalize.h"
#include "passes/fuse_add_layernorm.h"
#include "passes/fuse_attention.h"
#include "passes/fuse_elementwise.h"
#include "passes/fuse_gelu.h"
#include "passes/fuse_layernorm.h"
#include "passes/fuse_linear.h"
#include "passes/fuse_rmsnorm.h"
#include "passes/merge_projections.h"
#include "passes/plan_memory.h"
#include "passes/restrict_vocabulary.h"
#include "passes/schedule.h"
#include "passes/shape_inference.h"
#include "passes/unmerge_heads.h"
#include "support/error.h"

namespace kiln::passes {

const std::vector<PassInfo>& all_passes() {
  static const std::vector<PassInfo> passes = {
      // Types first: every later pass relies on each value's type being right.
      {"shape-inference", shape_inference, "check and propagate every value's type"},
      // Folding first so the fusions see one constant per scalar and no reshape chains.
      {"canonicalize", canonicalize, "dead code, CSE, constant folding, reshape/transpose chains"},
      // Before fuse-linear: the attention pattern starts at the projections' outputs,
      // whatever form they take, and needs the head reshapes/transposes intact.
      // Sequence-first attention over merged batch*heads (nn.MultiheadAttention) first.
      {"unmerge-heads", unmerge_heads, "[L,H*B,d] attention (nn.MultiheadAttention) -> [B,H,L,d]"},
      {"canonicalize", canonicalize, "dead code, CSE, constant folding, reshape/transpose chains"},
      {"fuse-attention", fuse_attention, "Q·Kᵀ, scale, mask, softmax, ·V -> attention"},
      // After canonicalize (one constant per eps, identity chains folded) and before
      // fuse-add-layernorm, which then absorbs a residual add into the RMSNorm it makes.
      // Imported graphs (kiln import) and hand-written norms: LayerNorm written out. Before
      // fuse-rmsnorm, which would take the centered x's RMS for an RMSNorm of its own.
      {"fuse-layernorm", fuse_layernorm, "(x - mean) / sqrt(var + eps) * w + b -> layernorm"},
      {"fuse-rmsnorm", fuse_rmsnorm, "x * rsqrt(mean(x*x) + eps) * w -> layernorm {rms}"},
      {"fuse-add-layernorm", fuse_add_layernorm, "layernorm(x + y) -> add_layernorm"},
      // After fuse-attention: the residual adds it must not absorb are now unambiguous.
      // GELU written out (erf or tanh) becomes one op, which fuse-linear absorbs.
      {"fuse-gelu", fuse_gelu, "x * 0.5 * (1 + erf(x / sqrt 2)) -> gelu (and the tanh form)"},
      {"fuse-linear", fuse_linear, "matmul(x, Wᵀ) + b [relu] -> linear"},
      // Needs fuse-linear's linear ops to find projections sharing an input.
      {"merge-projections", merge_projections, "Q/K/V linears of one input -> one linear"},
      // Needs fuse-linear's linear ops (an imported head is a matmul and an add before it).
      {"restrict-vocabulary", restrict_vocabulary,
       "take_along_axis(linear(x, W), ids) -> linear_rows(x, W, ids)"},
      // Clean up what the fusions left dead or duplicated.
      {"canonicalize", canonicalize, "dead code, CSE, constant folding, reshape/transpose chains"},
      // Order, then memory: the plan's liveness is computed over the chosen order.
      {"schedule", schedule, "execution order that keeps peak live memory low"},
      // After the last canonicalize (which changes readers and drops the marks) and before
      // plan-memory: the plan's liveness reads the marks (a fused op's operands are read
      // when its group's kernel runs), as lowering does.
      {"fuse-elementwise", fuse_elementwise, "mark pointwise ops computed in their user's kernel"},
      {"plan-memory", plan_memory, "arena offsets for every intermediate"},
  };
  return passes;
}

std::vector<std::string> default_pipeline() {
  std::vector<std::string> names;
  for (const PassInfo& p : all_passes()) names.push_back(p.name);
  return names;
}

static const PassInfo* find_pass(const std::string& name) {
  for (const PassInfo& p : all_passes())
    if (name == p.name) return &p;
  return nullptr;
}

std::vector<std::string> parse_pass_list(const std::string& spec) {
  if (spec == "default") return default_pipeline();
  std::vector<std::string> names;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t comma = spec.find(',', start);
    std::string name =
        spec.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (name.empty()) fail("empty pass name in '{}'", spec);
    if (!find_pass(name)) {
      std::vector<std::string> known;
      for (const PassInfo& p : all_passes())
        if (std::find(known.begin(), known.end(), p.name) == known.end()) known.push_back(p.name);
      fail("unknown pass '{}' (known: {})", name, fmt::join(known, ", "));
    }
    names.push_back(name);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return names;
}

std::vector<LostFusion> run_passes(ir::Module& module, const std::vector<std::string>& names,
                                   const PipelineOptions& options) {
  LostFusionCollector notes;
  for (const std::string& name : names) {
    const PassInfo* pass = find_pass(name);
    if (!pass) fail("unknown pass '{}'", name);
    auto start = std::chrono::steady_clock::now();
    bool changed = pass->run(module);
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (options.time_passes)
      fmt::print(options.dump, "pass {:<20} {:9.3f} ms{}\n", name, ms,
                 changed ? "" : "  (no change)");
    if (options.verify_each) {
      std::vector<ir::Diagnostic> diags = ir::verify(module);
      KILN_ASSERT(diags.empty(), fmt::format("pass '{}' produced an invalid module: {}", name,
                                             diags.empty() ? "" : ir::format_diagnostic(diags[0])));
    }
    if ((options.print_ir_after_all && changed) || options.print_ir_after.count(name)) {
      fmt::print(options.dump, "// ----- IR after {}{} -----\n{}", name,
                 changed ? "" : " (no change)", ir::print_module(module));
    }
  }
  ir::verify_or_throw(module, "<after passes>");
  return notes.take();
}

}  // namespace kiln::passes
