// Lost-fusion notes: what kiln tells a model's author, without any --debug flag, when an
// attention-shaped or norm-shaped subgraph stays unfused, at the line of the user's source.
//
// For pass authors. Where a fusion's predicate gives up on a subgraph that has the shape it
// fuses (a softmax over Q·Kᵀ that is not an attention, a reduce_mean of x·x feeding an rsqrt
// that is not an RMSNorm), call
//
//   passes::note_lost_fusion(f, anchor, kPass, "norm-shaped subgraph",
//                            fmt::format("the weight {} has another use", value_label(f, w)));
//
// `anchor` is the op whose location names the subgraph: its root (the op the fused op would
// replace). Note only what the user most likely wrote expecting a fused kernel, not every op
// a pattern looks at; the reason says what to change, in the user's terms where possible. The
// pass's debug log (`--debug-passes=PASS`, debug_log) stays the pass's own: log the reason
// there as well, in the pass's usual form.
//
// Notes are recorded by the innermost LostFusionCollector alive on the calling thread
// (run_passes keeps one for the passes it runs and returns what they noted; without a
// collector a note is dropped). `kiln compile` and `kiln opt` print them to stderr after
// the pipeline, deduplicated (an encoder built into two entry points is noted once) and sorted
// by place, one line each:
//
//   note: llama.cpp:41 (layers.0.input_layernorm): norm-shaped subgraph left unfused: the
//   weight %w has another use [fuse-rmsnorm]
//
// The place is the anchor's ir::SourceLoc (the DSL records file:line and scope for every op);
// for IR written by hand, its position in the .kir text (`model.kir:12:5`); else the function
// and value (`function 'forward', %7`).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ir/ir.h"

namespace kiln::passes {

// One note, as recorded; format_lost_fusions() turns them into lines.
struct LostFusion {
  std::string function;  // the function's name
  std::string value;     // value_label() of the anchor's result
  ir::SourceLoc src;     // the anchor's places
  ir::Loc loc;
  std::string pass;    // the pass that gave up ("fuse-attention")
  std::string what;    // "norm-shaped subgraph", "attention-shaped subgraph"
  std::string reason;  // why it stayed unfused
};

// Records a note with the innermost collector on this thread (none: the note is dropped).
void note_lost_fusion(const ir::Function& f, const ir::Op& anchor, const char* pass,
                      std::string_view what, std::string reason);

// Collects the notes recorded on this thread while it lives (nesting: the innermost one).
class LostFusionCollector {
 public:
  LostFusionCollector();
  ~LostFusionCollector();
  LostFusionCollector(const LostFusionCollector&) = delete;
  LostFusionCollector& operator=(const LostFusionCollector&) = delete;

  const std::vector<LostFusion>& notes() const { return notes_; }
  std::vector<LostFusion> take() { return std::move(notes_); }

 private:
  friend void note_lost_fusion(const ir::Function&, const ir::Op&, const char*, std::string_view,
                               std::string);
  std::vector<LostFusion> notes_;
  LostFusionCollector* outer_;
};

// The notes as lines "note: PLACE: WHAT left unfused: REASON [PASS]", deduplicated and sorted
// by place (file, then line, then text). `module` resolves source indices; `ir_file` names the
// .kir text the module was parsed from (for hand-written IR; may be empty).
std::vector<std::string> format_lost_fusions(const ir::Module& module,
                                             const std::vector<LostFusion>& notes,
                                             std::string_view ir_file);

}  // namespace kiln::passes
