// Tests of the lost-fusion notes (passes/notes.h): the place of an op written with the DSL
// (file:line and scope) survives the passes and the .kir text, and a norm-shaped subgraph
// left unfused gives one note with that place and the reason, deduplicated across entry
// points, sorted, for IR written by hand at its .kir position.
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "frontend/dsl.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/notes.h"
#include "passes/pipeline.h"
#include "passes/rewrite.h"

namespace kiln {
namespace {

using namespace kiln::dsl;

int norm_line = 0;  // the line of the layernorm in pre_norm_block

// x + y read by a relu before the layernorm of it: the sum cannot be the add_layernorm's
// second output (it would be needed before the fused op runs), so nothing fuses.
Tensor pre_norm_block(FunctionBuilder& f, Tensor x, Tensor y) {
  ScopeGuard scope(f, "layers.0.input_layernorm");
  Tensor sum = x + y;
  Tensor early = relu(sum);
  Tensor g = f.weight("layers.0.input_layernorm.weight", {8});
  Tensor b = f.weight("layers.0.input_layernorm.bias", {8});
  norm_line = __LINE__ + 1;
  Tensor n = layernorm(sum, g, b, 1e-5);
  return n + early;
}

ir::Module two_entry_points() {
  ModelBuilder mb("notes");
  Dim B = mb.symbol("B", 2);
  for (const char* name : {"forward", "encode"}) {
    FunctionBuilder& f = mb.function(name);
    Tensor x = f.input("x", DType::f32, {B, Dim::constant(8)});
    Tensor y = f.input("y", DType::f32, {B, Dim::constant(8)});
    f.output(pre_norm_block(f, x, y), "out");
  }
  return mb.finish();
}

TEST(SourceLoc, TheDslRecordsFileLineAndScope) {
  const ir::Module m = two_entry_points();
  const ir::Function& f = m.functions.at(0);
  const ir::Op* norm = nullptr;
  for (const ir::Op& op : f.ops)
    if (op.kind == ir::OpKind::layernorm) norm = &op;
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(m.source_text(norm->src),
            fmt::format("fusion_notes_test.cpp:{} (layers.0.input_layernorm)", norm_line));
}

TEST(SourceLoc, SurvivesTheTextForm) {
  const ir::Module m = two_entry_points();
  const std::string text = ir::print_module(m);
  EXPECT_NE(text.find("  source 0 = \"fusion_notes_test.cpp\"\n"), std::string::npos) << text;
  EXPECT_NE(text.find(fmt::format(" src(0:{}, 1)\n", norm_line)), std::string::npos) << text;
  const ir::Module back = ir::parse_and_verify(text, "notes.kir");
  EXPECT_EQ(back.sources, m.sources);
  ASSERT_EQ(back.functions.size(), m.functions.size());
  for (size_t i = 0; i < m.functions.size(); ++i) {
    ASSERT_EQ(back.functions[i].ops.size(), m.functions[i].ops.size());
    for (size_t k = 0; k < m.functions[i].ops.size(); ++k)
      EXPECT_EQ(back.functions[i].ops[k].src, m.functions[i].ops[k].src) << k;
  }
  EXPECT_EQ(ir::print_module(back), text);
}

TEST(LostFusionNotes, ANormLeftUnfusedIsNotedOnceAtTheUsersLine) {
  ir::Module m = two_entry_points();
  const std::vector<passes::LostFusion> lost =
      passes::run_passes(m, passes::default_pipeline(), passes::PipelineOptions{});
  // One per entry point as recorded, one line once formatted: both are the same source line.
  ASSERT_EQ(lost.size(), 2u);
  EXPECT_EQ(lost[0].function, "forward");
  EXPECT_EQ(lost[1].function, "encode");
  // The relu's label is a value number the passes chose; the rest is exact.
  std::smatch relu;
  ASSERT_TRUE(std::regex_search(lost[0].reason, relu, std::regex("\\(by relu (%[0-9]+)\\)")))
      << lost[0].reason;
  const std::vector<std::string> lines = passes::format_lost_fusions(m, lost, "notes.kir");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            fmt::format("note: fusion_notes_test.cpp:{} (layers.0.input_layernorm): norm-shaped "
                        "subgraph left unfused: the residual sum is also read before the norm "
                        "(by relu {}), and add_layernorm gives its sum only to later ops "
                        "[fuse-add-layernorm]",
                        norm_line, relu[1].str()));
}

// Hand-written IR: the place is the .kir position; with neither, the function and value.
// Notes sort by file and line as numbers (line 9 before line 10), then by text.
TEST(LostFusionNotes, HandWrittenIrIsPlacedByItsTextPosition) {
  ir::Module m = ir::parse_and_verify(R"(module @m {
  symbol B max 2
  func @f(%x: f32[B,8], %y: f32[B,1], %g: f32[8]) -> (f32[B,8], f32[B,8]) {
    %s = add(%x, %y) : f32[B,8]
    %n = layernorm(%s, %g, %g) {eps = 1e-05} : f32[B,8]
    %t = add(%x, %x) : f32[B,8]
    %e = relu(%t) : f32[B,8]
    %m = layernorm(%t, %g, %g) {eps = 1e-05} : f32[B,8]
    %r = add(%e, %m) : f32[B,8]
    return %n, %r
  }
}
)",
                                      "hand.kir");
  std::vector<passes::LostFusion> lost =
      passes::run_passes(m, {"fuse-add-layernorm"}, passes::PipelineOptions{});
  ASSERT_EQ(lost.size(), 2u);
  std::vector<std::string> lines = passes::format_lost_fusions(m, lost, "hand.kir");
  EXPECT_EQ(lines, (std::vector<std::string>{
                       "note: hand.kir:5:5: norm-shaped subgraph left unfused: the residual add "
                       "of f32[B,8] and f32[B,1] broadcasts other than over leading dims "
                       "[fuse-add-layernorm]",
                       "note: hand.kir:8:5: norm-shaped subgraph left unfused: the residual sum "
                       "is also read before the norm (by relu %e), and add_layernorm gives its "
                       "sum only to later ops [fuse-add-layernorm]"}));
  // Line 10 sorts after line 9 (as numbers), and a note without any place names the value.
  lost[0].loc = ir::Loc{10, 1};
  lost[1].loc = ir::Loc{9, 1};
  passes::LostFusion nowhere = lost[0];
  nowhere.loc = ir::Loc{};
  lost.push_back(nowhere);
  lines = passes::format_lost_fusions(m, lost, "");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].substr(0, 33), "note: function 'f', %n: norm-shap");
  EXPECT_EQ(lines[1].substr(0, 21), "note: line 9:1: norm-");
  EXPECT_EQ(lines[2].substr(0, 22), "note: line 10:1: norm-");
}

TEST(LostFusionNotes, TheInnermostCollectorRecords) {
  ir::Function f;
  f.name = "f";
  f.add_param("x", ir::TensorType{ir::DType::f32, {ir::Dim::constant(2)}});
  const ir::ValueId r =
      f.add_op(ir::OpKind::relu, {0}, ir::TensorType{ir::DType::f32, {ir::Dim::constant(2)}});
  const ir::Op& op = f.ops.back();
  ASSERT_EQ(op.result, r);
  passes::note_lost_fusion(f, op, "p", "thing", "nobody listens");  // no collector: dropped
  passes::LostFusionCollector outer;
  {
    passes::LostFusionCollector inner;
    passes::note_lost_fusion(f, op, "p", "thing", "inner");
    ASSERT_EQ(inner.notes().size(), 1u);
    EXPECT_EQ(inner.notes()[0].reason, "inner");
    EXPECT_EQ(inner.notes()[0].value, "%1");
  }
  passes::note_lost_fusion(f, op, "p", "thing", "outer");
  ASSERT_EQ(outer.notes().size(), 1u);
  EXPECT_EQ(outer.notes()[0].reason, "outer");
}

}  // namespace
}  // namespace kiln
