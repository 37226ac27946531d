// Tests for the compiled plan's weight layouts (runtime/plan.h): the linear-weight layout
// function against its definition written out for a small case, the layout's survival of
// serialization, and the rejection of inconsistent layouts in a deserialized plan; element
// types (the C ABI's kiln_dtype) and their codes in a serialized plan.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "error_of.h"
#include "runtime/plan.h"

namespace kiln::rt {
namespace {

using kiln::testing::error_of;
using ::testing::HasSubstr;

// W[N=4, K=3] with W[n, k] = 10·n + k, so every output element names its source.
std::vector<float> small_weight() {
  std::vector<float> w;
  for (int n = 0; n < 4; ++n)
    for (int k = 0; k < 3; ++k) w.push_back(static_cast<float>(10 * n + k));
  return w;
}

TEST(LinearWeightLayout, TransposedIsKByN) {
  std::vector<float> wt(12, -1.0f);
  lay_out_linear_weight(small_weight().data(), 4, 3, 0, wt.data());
  EXPECT_EQ(wt, (std::vector<float>{0, 10, 20, 30, 1, 11, 21, 31, 2, 12, 22, 32}));
}

TEST(LinearWeightLayout, PanelsAreContiguousKByPanelStrips) {
  std::vector<float> wt(12, -1.0f);
  lay_out_linear_weight(small_weight().data(), 4, 3, 2, wt.data());
  // Panel 0 holds columns n = 0, 1 for k = 0, 1, 2; panel 1 columns n = 2, 3.
  EXPECT_EQ(wt, (std::vector<float>{0, 10, 1, 11, 2, 12, 20, 30, 21, 31, 22, 32}));
  // One panel as wide as N is the transposed layout.
  std::vector<float> one(12), transposed(12);
  lay_out_linear_weight(small_weight().data(), 4, 3, 4, one.data());
  lay_out_linear_weight(small_weight().data(), 4, 3, 0, transposed.data());
  EXPECT_EQ(one, transposed);
}

// Row blocks laid out one at a time (as the runtime does for a weight concatenated from
// several tensors, read from unaligned file bytes) give the whole weight's layout.
TEST(LinearWeightLayout, RowBlocksFromUnalignedBytes) {
  const std::vector<float> w = small_weight();  // N=4, K=3
  for (int64_t panel : {0, 2}) {
    std::vector<float> whole(12), blocks(12, -1.0f);
    lay_out_linear_weight(w.data(), 4, 3, panel, whole.data());
    std::vector<uint8_t> bytes(1 + w.size() * 4);  // one byte in: misaligned for floats
    std::memcpy(bytes.data() + 1, w.data(), w.size() * 4);
    lay_out_linear_weight_rows(bytes.data() + 1, 0, 1, 4, 3, panel, blocks.data());  // row 0
    lay_out_linear_weight_rows(bytes.data() + 1 + 3 * 4, 1, 3, 4, 3, panel,
                               blocks.data());  // rows 1-3
    EXPECT_EQ(blocks, whole) << "panel " << panel;
  }
}

Plan plan_with_weight(WeightDesc w) {
  Plan p;
  p.model = "m";
  p.weights.push_back(std::move(w));
  return p;
}

TEST(PlanWeights, PackedLayoutRoundTrips) {
  WeightDesc w{"proj", {"a.weight", "b.weight"}, {{64, 8}, {64, 8}}, true, 64, {2, 8, 64}};
  std::vector<uint8_t> bytes = serialize_plan(plan_with_weight(w));
  Plan back = deserialize_plan(bytes.data(), bytes.size());
  ASSERT_EQ(back.weights.size(), 1u);
  EXPECT_EQ(back.weights[0].name, "proj");
  EXPECT_EQ(back.weights[0].sources, w.sources);
  EXPECT_EQ(back.weights[0].source_shapes, w.source_shapes);
  EXPECT_TRUE(back.weights[0].transpose);
  EXPECT_EQ(back.weights[0].panel, 64);
  EXPECT_EQ(back.weights[0].shape, w.shape);
}

TEST(PlanWeights, InconsistentLayoutsAreRejected) {
  auto error_for = [](WeightDesc w) {
    std::vector<uint8_t> bytes = serialize_plan(plan_with_weight(std::move(w)));
    return error_of([&] { deserialize_plan(bytes.data(), bytes.size()); });
  };
  // Panels on a weight that is not a linear's, a shape that is not [N/panel, K, panel],
  // a negative panel, a transposed weight that is not 2-D.
  EXPECT_THAT(error_for({"w", {"w"}, {{64, 8}}, false, 64, {1, 8, 64}}),
              HasSubstr("weight 'w' has a bad layout (panel 64, shape [1,8,64])"));
  EXPECT_THAT(error_for({"w", {"w"}, {{64, 8}}, true, 64, {8, 64}}),
              HasSubstr("weight 'w' has a bad layout (panel 64, shape [8,64])"));
  EXPECT_THAT(error_for({"w", {"w"}, {{64, 8}}, true, 32, {1, 8, 64}}),
              HasSubstr("weight 'w' has a bad layout"));
  EXPECT_THAT(error_for({"w", {"w"}, {{64, 8}}, true, -1, {8, 64}}),
              HasSubstr("weight 'w' has a bad layout (panel -1"));
  EXPECT_THAT(error_for({"w", {"w"}, {{64, 8}}, true, 0, {512}}),
              HasSubstr("weight 'w' has a bad layout (panel 0, shape [512])"));
}

// A plan's element types are kiln_dtype values; serialized, they keep the codes of plan
// format 8 (f32 0, i64 1, bool 2, bf16 3), so libraries compiled before read the same.
TEST(PlanTypes, ElementTypesKeepTheirSerializedCodes) {
  Plan p;
  p.model = "m";
  FunctionDesc f;
  f.name = "forward";
  for (auto [name, type] :
       {std::pair{"x_f32", KILN_F32}, {"ids_i64", KILN_I64}, {"mask_bool", KILN_BOOL}}) {
    TensorDesc t;
    t.name = name;
    t.type = type;
    f.params.push_back(t);
  }
  p.functions.push_back(f);
  std::vector<uint8_t> bytes = serialize_plan(p);
  // Each tensor's code follows its name.
  auto code_after = [&](const std::string& name) {
    auto at = std::search(bytes.begin(), bytes.end(), name.begin(), name.end());
    EXPECT_NE(at, bytes.end()) << name;
    int64_t code = -1;
    std::memcpy(&code, &*(at + static_cast<ptrdiff_t>(name.size())), 8);
    return code;
  };
  EXPECT_EQ(code_after("x_f32"), 0);
  EXPECT_EQ(code_after("ids_i64"), 1);
  EXPECT_EQ(code_after("mask_bool"), 2);
  Plan back = deserialize_plan(bytes.data(), bytes.size());
  ASSERT_EQ(back.functions.size(), 1u);
  ASSERT_EQ(back.functions[0].params.size(), 3u);
  EXPECT_EQ(back.functions[0].params[0].type, KILN_F32);
  EXPECT_EQ(back.functions[0].params[1].type, KILN_I64);
  EXPECT_EQ(back.functions[0].params[2].type, KILN_BOOL);

  // bf16 is a weight's type only: a plan with a bf16 tensor is refused.
  p.functions[0].params[0].type = KILN_BF16;
  bytes = serialize_plan(p);
  EXPECT_EQ(code_after("x_f32"), 3);
  EXPECT_THAT(error_of([&] { deserialize_plan(bytes.data(), bytes.size()); }),
              HasSubstr("compiled plan: tensor 'x_f32' of 'forward' is bf16 (only weights are)"));
  // A code past bf16 is refused too.
  const std::string x = "x_f32";
  auto at = std::search(bytes.begin(), bytes.end(), x.begin(), x.end());
  const int64_t unknown = 4;
  std::memcpy(&*(at + 5), &unknown, 8);
  EXPECT_THAT(error_of([&] { deserialize_plan(bytes.data(), bytes.size()); }),
              HasSubstr("compiled plan has an unknown element type 4"));
}

// A symbol derived from another (an IR dim T+1 or 2*T-1) keeps its base, scale and offset
// through serialization; one that contradicts its base's maximum, derives from a missing or
// derived symbol, or could be below 1 is refused.
TEST(PlanSymbols, DerivedSymbolsRoundTripAndAreChecked) {
  Plan p;
  p.model = "m";
  p.symbols = {
      {"B", 4, -1, 1, 0}, {"T", 8, -1, 1, 0}, {"T+1", 9, 1, 1, 1}, {"2*T-1", 15, 1, 2, -1}};
  std::vector<uint8_t> bytes = serialize_plan(p);
  Plan back = deserialize_plan(bytes.data(), bytes.size());
  ASSERT_EQ(back.symbols.size(), 4u);
  EXPECT_EQ(back.symbols[2].name, "T+1");
  EXPECT_EQ(back.symbols[2].base, 1);
  EXPECT_EQ(back.symbols[3].scale, 2);
  EXPECT_EQ(back.symbols[3].offset, -1);
  EXPECT_EQ(back.symbols[3].max, 15);
  EXPECT_EQ(back.symbols[0].base, -1);
  auto error_for = [&](SymbolDesc s) {
    Plan q = p;
    q.symbols.push_back(std::move(s));
    std::vector<uint8_t> b = serialize_plan(q);
    return error_of([&] { deserialize_plan(b.data(), b.size()); });
  };
  EXPECT_THAT(error_for({"T+2", 11, 1, 1, 2}),
              HasSubstr("symbol 'T+2' has a bad derivation (1*#1+2, maximum 11)"));
  EXPECT_THAT(error_for({"T-1", 7, 1, 1, -1}), HasSubstr("symbol 'T-1' has a bad derivation"));
  EXPECT_THAT(error_for({"X+1", 9, 7, 1, 1}),
              HasSubstr("symbol 'X+1' derives from missing symbol 7"));
  EXPECT_THAT(error_for({"T+1+1", 10, 2, 1, 1}),
              HasSubstr("symbol 'T+1+1' derives from missing symbol 2"));
  EXPECT_THAT(error_for({"U", 9, -1, 2, 0}), HasSubstr("symbol 'U' has a bad derivation"));
}

}  // namespace
}  // namespace kiln::rt
