// Tests for the compiled plan's weight layouts (runtime/plan.h): the linear-weight layout
// function against its definition written out for a small case, the layout's survival of
// serialization, and the rejection of inconsistent layouts in a deserialized plan; element
// types (the C ABI's kiln_dtype) and their codes in a serialized plan.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "error_of.h"
#include "runtime/model.h"
#include "runtime/plan.h"
#include "runtime/safetensors.h"

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

// An [in, out] source [K, N] (source_kn: GPT-2's Conv1D, an ONNX MatMul by an initializer) is
// transposed at load time: every layout (unpanelled, panels, bf16, int8) of it equals that of
// the same weight stored [N, K]; and source_kn survives serialization.
TEST(PlanWeights, AnInOutSourceIsTransposedAtLoadIntoEveryLayout) {
  const int64_t N = 128, K = 6;
  std::vector<float> nk(static_cast<size_t>(N * K)), kn(nk.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      nk[n * K + k] = static_cast<float>((n * 7 + k * 3) % 11) - 5.25f + 0.01f * n;
      kn[k * N + n] = nk[n * K + k];
    }
  const std::string path = ::testing::TempDir() + "plan_source_kn.safetensors";
  write_safetensors(path, {make_f32("w_nk", {N, K}, nk), make_f32("w_kn", {K, N}, kn)});
  struct Layout {
    int64_t panel;
    bool bf16, int8;
    std::vector<int64_t> shape;
  };
  for (const Layout& l :
       {Layout{0, false, false, {K, N}}, Layout{64, false, false, {N / 64, K, 64}},
        Layout{64, true, false, {N / 64, (K + 1) / 2, 64, 2}},
        Layout{64, false, true, {N / 64, (K + 3) / 4, 64, 4}}}) {
    Plan p;
    p.model = "m";
    WeightDesc a{"a", {"w_nk"}, {{N, K}}, true, l.panel, l.shape, l.bf16, l.int8};
    WeightDesc b{"b", {"w_kn"}, {{K, N}}, true, l.panel, l.shape, l.bf16, l.int8, true};
    p.weights = {a, b};
    std::vector<uint8_t> bytes = serialize_plan(p);
    Plan back = deserialize_plan(bytes.data(), bytes.size());
    ASSERT_EQ(back.weights.size(), 2u);
    EXPECT_FALSE(back.weights[0].source_kn);
    EXPECT_TRUE(back.weights[1].source_kn);
    const LoadedWeights loaded = load_weights(back, path);
    const std::vector<AlignedBytes>& w = loaded.buffers;
    ASSERT_EQ(w[0].size, w[1].size);
    EXPECT_EQ(std::memcmp(w[0].data.get(), w[1].data.get(), static_cast<size_t>(w[0].size)), 0)
        << "panel " << l.panel << " bf16 " << l.bf16 << " int8 " << l.int8;
  }
}

// int8: each row quantized by its largest magnitude (support/int8.h), packed as [Np/64, Kp/4,
// 64, 4] with the padding 0, then the f32 scales and the i32 row sums; written in two blocks
// of rows as from two sources; a row with a non-finite value is reported, not packed.
TEST(PlanWeights, Int8LayoutQuantizesEachRow) {
  const int64_t N = 70, K = 6, Np = 128, Kp = 8;
  std::vector<float> w(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) w[n * K + k] = (n == 3 ? 0.0f : (k - 2.5f) * (n + 1) * 0.25f);
  std::vector<uint8_t> bytes(static_cast<size_t>(Np * Kp + 8 * Np), 0);
  const auto* rows = reinterpret_cast<const uint8_t*>(w.data());
  EXPECT_EQ(lay_out_linear_weight_int8_rows(rows, 0, 40, N, K, bytes.data()), -1);
  EXPECT_EQ(lay_out_linear_weight_int8_rows(rows + 40 * K * 4, 40, 30, N, K, bytes.data()), -1);
  for (int64_t n = 0; n < N; ++n) {
    float absmax = 0;
    for (int64_t k = 0; k < K; ++k) absmax = std::max(absmax, std::abs(w[n * K + k]));
    float scale;
    int32_t sum;
    std::memcpy(&scale, &bytes[Np * Kp + 4 * n], 4);
    std::memcpy(&sum, &bytes[Np * Kp + 4 * Np + 4 * n], 4);
    EXPECT_EQ(scale, absmax * (1.0f / 127.0f)) << n;
    int32_t want_sum = 0;
    for (int64_t k = 0; k < Kp; ++k) {
      const int8_t q =
          static_cast<int8_t>(bytes[(n / 64) * Kp * 64 + (k / 4) * 256 + (n % 64) * 4 + k % 4]);
      if (k >= K) {
        EXPECT_EQ(q, 0) << "padding at n " << n << " k " << k;
        continue;
      }
      want_sum += q;
      // Within half a step of the value, and the largest magnitude is exactly ±127.
      EXPECT_LE(std::abs(q * scale - w[n * K + k]), scale / 2 * 1.0001f) << n << "," << k;
      if (absmax > 0 && std::abs(w[n * K + k]) == absmax) EXPECT_EQ(std::abs(q), 127);
    }
    EXPECT_EQ(sum, want_sum) << n;
  }
  // Row 3 is all zero: scale 0, q 0.
  float scale3;
  std::memcpy(&scale3, &bytes[Np * Kp + 4 * 3], 4);
  EXPECT_EQ(scale3, 0.0f);
  w[5 * K + 2] = NAN;
  EXPECT_EQ(lay_out_linear_weight_int8_rows(rows, 0, 40, N, K, bytes.data()), 5);
  WeightDesc d{"proj", {"w"}, {{N, K}}, true, 64, {2, 2, 64, 4}};
  d.int8 = true;
  EXPECT_EQ(weight_bytes(d), Np * Kp + 8 * Np);
  std::vector<uint8_t> plan = serialize_plan(plan_with_weight(d));
  Plan back = deserialize_plan(plan.data(), plan.size());
  EXPECT_TRUE(back.weights[0].int8);
  EXPECT_FALSE(back.weights[0].bf16);
  EXPECT_EQ(back.weights[0].shape, d.shape);
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
  // int8: [Np/64, Kp/4, 64, 4] with panel 64.
  WeightDesc q{"w", {"w"}, {{64, 8}}, true, 64, {1, 2, 64, 2}};
  q.int8 = true;
  EXPECT_THAT(error_for(q), HasSubstr("weight 'w' has a bad layout (panel 64, shape [1,2,64,2])"));
  q.shape = {1, 2, 64, 4};
  q.panel = 0;
  EXPECT_THAT(error_for(q), HasSubstr("weight 'w' has a bad layout (panel 0, shape [1,2,64,4])"));
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
  // So are i8 and i32 (int8 weights and their row sums; format 12's codes 4 and 5).
  p.functions[0].params[0].type = KILN_I8;
  bytes = serialize_plan(p);
  EXPECT_EQ(code_after("x_f32"), 4);
  EXPECT_THAT(error_of([&] { deserialize_plan(bytes.data(), bytes.size()); }),
              HasSubstr("compiled plan: tensor 'x_f32' of 'forward' is i8 (only weights are)"));
  p.functions[0].params[0].type = KILN_I32;
  bytes = serialize_plan(p);
  EXPECT_EQ(code_after("x_f32"), 5);
  // A code past i32 is refused too.
  const std::string x = "x_f32";
  auto at = std::search(bytes.begin(), bytes.end(), x.begin(), x.end());
  const int64_t unknown = 6;
  std::memcpy(&*(at + 5), &unknown, 8);
  EXPECT_THAT(error_of([&] { deserialize_plan(bytes.data(), bytes.size()); }),
              HasSubstr("compiled plan has an unknown element type 6"));
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

// A bf16 library compiled with --bf16-products auto carries its entry points twice (plan format
// 14: Plan::fma_functions): the FMA form round-trips with its own steps, and one whose entry
// points differ from the others' (a name, a parameter) is refused, as a step calling a kernel
// the library lacks is.
TEST(PlanFmaForm, RoundTripsAndMustMatchTheEntryPoints) {
  Plan p;
  p.model = "m";
  p.kernel_names = {"k_bf16", "k_bf16fma"};
  FunctionDesc f;
  f.name = "forward";
  TensorDesc x;
  x.name = "x";
  f.params.push_back(x);
  f.steps.push_back({0, "linear %1", {}});
  p.functions.push_back(f);
  f.steps[0].kernel = 1;
  p.fma_functions.push_back(f);
  std::vector<uint8_t> bytes = serialize_plan(p);
  Plan back = deserialize_plan(bytes.data(), bytes.size());
  ASSERT_EQ(back.functions.size(), 1u);
  ASSERT_EQ(back.fma_functions.size(), 1u);
  EXPECT_EQ(back.functions[0].steps[0].kernel, 0);
  EXPECT_EQ(back.fma_functions[0].steps[0].kernel, 1);
  EXPECT_EQ(back.fma_functions[0].name, "forward");
  // A plan without the FMA form reads back without one.
  Plan one = p;
  one.fma_functions.clear();
  bytes = serialize_plan(one);
  EXPECT_TRUE(deserialize_plan(bytes.data(), bytes.size()).fma_functions.empty());

  auto error_for = [](const Plan& q) {
    std::vector<uint8_t> b = serialize_plan(q);
    return error_of([&] { deserialize_plan(b.data(), b.size()); });
  };
  const std::string mismatch = "its FMA form of the bf16 entry points does not match";
  Plan renamed = p;
  renamed.fma_functions[0].name = "encode";
  EXPECT_THAT(error_for(renamed), HasSubstr(mismatch));
  Plan extra_param = p;
  extra_param.fma_functions[0].params.push_back(x);
  EXPECT_THAT(error_for(extra_param), HasSubstr(mismatch));
  Plan other_shape = p;
  other_shape.fma_functions[0].params[0].shape = {DimExpr::constant(3)};
  EXPECT_THAT(error_for(other_shape), HasSubstr(mismatch));
  Plan two = p;
  two.fma_functions.push_back(f);
  EXPECT_THAT(error_for(two), HasSubstr(mismatch));
  Plan missing_kernel = p;
  missing_kernel.fma_functions[0].steps[0].kernel = 2;
  EXPECT_THAT(error_for(missing_kernel),
              HasSubstr("compiled plan: step 'linear %1' calls missing kernel 2"));
}

}  // namespace
}  // namespace kiln::rt
