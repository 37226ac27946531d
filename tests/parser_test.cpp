// Tests of the IR text parser (ir/parser.h): canonical round trips covering every op kind,
// exact doubles, value naming and locations, and exact diagnostics for malformed input.
#include "ir/parser.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ir/printer.h"
#include "ir/verifier.h"
#include "support/error.h"

namespace kiln::ir {
namespace {

using ::testing::HasSubstr;

std::string diagnostics_text(const std::vector<Diagnostic>& diags) {
  std::string out;
  for (const Diagnostic& d : diags) out += format_diagnostic(d) + "\n";
  return out;
}

// Returns the message of the kiln::Error that parsing `text` throws, or "<no error>".
std::string parse_error(std::string_view text, const std::string& file = "<input>") {
  try {
    parse_module(text, file);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

// ---------------------------------------------------------------------------------------
// Round trips: each text is canonical (exactly what the printer produces) and valid.

struct RoundTripCase {
  const char* name;
  const char* text;
};

const RoundTripCase kRoundTrips[] = {
    {"Sources", R"kir(module @sources {
  weight @emb : f32[10,4]
  func @f() -> (f32[10,4], f32[], f32[16,4], i64[3,5], i32[2]) {
    %0 = weight() {name = "emb"} : f32[10,4]
    %1 = constant() {value = 0.5} : f32[]
    %2 = sinusoid_table() : f32[16,4]
    %3 = iota() {axis = 1} : i64[3,5]
    %4 = constant() {value = -3} : i32[2]
    return %0, %1, %2, %3, %4
  }
}
)kir"},
    {"Arithmetic", R"kir(module @arith {
  symbol B max 4
  func @f(%x: f32[B,3], %y: f32[3]) -> (f32[B,3]) {
    %0 = add(%x, %y) : f32[B,3]
    %1 = sub(%0, %y) : f32[B,3]
    %2 = mul(%1, %x) : f32[B,3]
    %3 = div(%2, %y) : f32[B,3]
    %4 = maximum(%3, %x) : f32[B,3]
    %5 = relu(%4) : f32[B,3]
    %6 = neg(%5) : f32[B,3]
    %7 = exp(%6) : f32[B,3]
    %8 = sqrt(%7) : f32[B,3]
    return %8
  }
}
)kir"},
    {"Comparisons", R"kir(module @compare {
  func @f(%a: i64[2,3], %b: i64[3], %x: f32[2,3]) -> (f32[2,3], i32[2,3]) {
    %0 = eq(%a, %b) : bool[2,3]
    %1 = ne(%a, %b) : bool[2,3]
    %2 = lt(%a, %b) : bool[2,3]
    %3 = le(%a, %b) : bool[2,3]
    %4 = gt(%a, %b) : bool[2,3]
    %5 = ge(%a, %b) : bool[2,3]
    %6 = logical_and(%0, %1) : bool[2,3]
    %7 = logical_or(%6, %2) : bool[2,3]
    %8 = logical_not(%7) : bool[2,3]
    %9 = constant() {value = -1000000000.0} : f32[]
    %10 = select(%8, %x, %9) : f32[2,3]
    %11 = cast(%a) : i32[2,3]
    return %10, %11
  }
}
)kir"},
    {"DataMovement", R"kir(module @movement {
  symbol B max 2
  symbol S max 8
  weight @table : f32[37,6]
  func @f(%ids: i64[B,S]) -> (f32[B,6,S], f32[B,S,2,3], f32[B,S,4], f32[B,S,12]) {
    %0 = weight() {name = "table"} : f32[37,6]
    %1 = gather(%0, %ids) : f32[B,S,6]
    %2 = transpose(%1) {perm = [0, 2, 1]} : f32[B,6,S]
    %3 = reshape(%1) : f32[B,S,2,3]
    %4 = slice(%1) {axis = 2, start = 2} : f32[B,S,4]
    %5 = concat(%1, %1) {axis = -1} : f32[B,S,12]
    return %2, %3, %4, %5
  }
}
)kir"},
    {"Reductions", R"kir(module @reduce {
  symbol B max 2
  weight @w : f32[4,5]
  weight @g : f32[5]
  weight @b : f32[5]
  func @f(%x: f32[B,3,4]) -> (f32[B,3,5], f32[B,1,5], f32[B], f32[B,5], i64[B,3]) {
    %0 = weight() {name = "w"} : f32[4,5]
    %1 = matmul(%x, %0) : f32[B,3,5]
    %2 = softmax(%1) {axis = -1} : f32[B,3,5]
    %3 = weight() {name = "g"} : f32[5]
    %4 = weight() {name = "b"} : f32[5]
    %5 = layernorm(%2, %3, %4) {eps = 1e-05} : f32[B,3,5]
    %6 = reduce_sum(%5) {axes = [1], keepdims = 1} : f32[B,1,5]
    %7 = reduce_max(%5) {axes = [1, 2], keepdims = 0} : f32[B]
    %8 = reduce_mean(%5) {axes = [-2]} : f32[B,5]
    %9 = argmax(%5) {axis = 2} : i64[B,3]
    return %5, %6, %7, %8, %9
  }
}
)kir"},
    {"Fused", R"kir(module @fused {
  config {d_model = "8", heads = "2", note = "tab\there \"quoted\" back\\slash\nnewline \x01"}
  symbol B max 2
  symbol S max 16
  symbol T max 16
  weight @w_q : f32[8,8]
  weight @w_k : f32[8,8]
  weight @w_v : f32[8,8]
  weight @w_qkv : f32[24,8] = concat(@w_q, @w_k, @w_v) {axis = 0}
  weight @b_qkv : f32[24]
  weight @ln.weight : f32[8]
  weight @ln.bias : f32[8]
  func @encode(%x: f32[B,S,8], %pad: bool[B,S]) -> (f32[B,S,8]) {
    %0 = weight() {name = "w_qkv"} : f32[24,8]
    %1 = weight() {name = "b_qkv"} : f32[24]
    %qkv = linear(%x, %0, %1) {act = "none"} : f32[B,S,24]
    %q = slice(%qkv) {axis = 2, start = 0} : f32[B,S,8]
    %k = slice(%qkv) {axis = 2, start = 8} : f32[B,S,8]
    %v = slice(%qkv) {axis = 2, start = 16} : f32[B,S,8]
    %2 = attention(%q, %k, %v, %pad) {causal = 0, heads = 2, scale = 0.5} : f32[B,S,8]
    %3 = weight() {name = "ln.weight"} : f32[8]
    %4 = weight() {name = "ln.bias"} : f32[8]
    %memory = add_layernorm(%x, %2, %3, %4) {eps = 1e-05} : f32[B,S,8]
    return %memory
  }
  func @decode(%y: f32[B,T,8], %memory: f32[B,S,8]) -> (f32[B,T,8], f32[B,T,8]) {
    %0 = weight() {name = "w_q"} : f32[8,8]
    %1 = linear(%y, %0) {act = "relu"} : f32[B,T,8]
    %2 = attention(%1, %1, %1) {causal = 1, heads = 2, scale = 0.35355339059327373} : f32[B,T,8]
    %3 = attention(%2, %memory, %memory) {causal = 0, heads = 4, scale = 0.125} : f32[B,T,8]
    return %2, %3
  }
  func @restricted(%y: f32[B,T,8], %ids: i64[S]) -> (f32[B,T,S]) {
    %0 = weight() {name = "w_q"} : f32[8,8]
    %1 = linear_rows(%y, %0, %ids) {act = "relu"} : f32[B,T,S]
    return %1
  }
}
)kir"},
    {"Decoding", R"kir(module @decoding {
  symbol B max 2
  symbol S max 5
  symbol T max 6
  symbol N max 4
  symbol P max 6
  symbol C max 4
  func @step(%q: f32[N,1,8], %x: f32[N,1,8], %pos: i64[1], %rows: i64[N,P], %src_row: i64[N], %mem: f32[B,S,8], %pad: bool[B,S], %cache: f32[T,C,8]) -> (f32[N,1,8], f32[N,1,8], f32[T,C,8]) {
    %k = cache_write(%cache, %x, %pos) : f32[T,C,8]
    %0 = cache_attention(%q, %k, %k, %rows) {heads = 2, scale = 0.5} : f32[N,1,8]
    %1 = memory_attention(%0, %mem, %mem, %src_row, %pad) {heads = 4, scale = 0.7071067811865476} : f32[N,1,8]
    return %0, %1, %k
  }
}
)kir"},
    {"MemoryPlan", R"kir(module @planned {
  symbol B max 2
  func @f(%x: f32[B,4]) -> (f32[B,4]) arena 128 {
    %0 = relu(%x) : f32[B,4] at 0
    %1 = neg(%0) : f32[B,4] at 64
    %2 = exp(%1) : f32[B,4]
    return %2
  }
  func @g(%x: f32[2]) -> (f32[2]) arena 0 {
    return %x
  }
}
)kir"},
    {"SourceLocations", R"kir(module @located {
  source 0 = "llama.cpp"
  source 1 = "layers.0.input_layernorm"
  source 2 = "a \"quoted\" name"
  func @f(%x: f32[4]) -> (f32[4]) {
    %0 = relu(%x) : f32[4] src(0:41, 1)
    %1 = neg(%0) : f32[4] fused at 0 src(2:7)
    %2 = exp(%1) : f32[4]
    return %2
  }
}
)kir"},
    {"UnnamedParameters", R"kir(module @unnamed {
  func @f(%0: f32[2], %x: f32[2], %1: f32[2]) -> (f32[2], f32[2]) {
    %2 = add(%0, %1) : f32[2]
    %y = add(%2, %x) : f32[2]
    return %y, %0
  }
}
)kir"},
    {"Activations", R"kir(module @activations {
  func @f(%x: f32[2,3]) -> (f32[2,3]) {
    %0 = log(%x) : f32[2,3]
    %1 = tanh(%0) : f32[2,3]
    %2 = erf(%1) : f32[2,3]
    %3 = sigmoid(%2) : f32[2,3]
    %4 = gelu(%3) : f32[2,3]
    %5 = gelu_tanh(%4) : f32[2,3]
    %6 = silu(%5) : f32[2,3]
    %7 = sign(%6) : f32[2,3]
    %8 = sin(%7) : f32[2,3]
    %9 = cos(%8) : f32[2,3]
    %10 = rsqrt(%9) : f32[2,3]
    %11 = abs(%10) : f32[2,3]
    %12 = minimum(%11, %10) : f32[2,3]
    return %12
  }
}
)kir"},
    {"PreNorm", R"kir(module @prenorm {
  symbol B max 2
  func @f(%x: f32[B,4], %y: f32[B,4], %g: f32[4], %b: f32[4]) -> (f32[B,4], f32[B,4]) {
    %n = add_layernorm(%x, %y, %g, %b) {eps = 1e-05} : f32[B,4]
    %h = add_layernorm_sum(%n) : f32[B,4]
    return %n, %h
  }
}
)kir"},
    // Issue 26: expand (broadcast to the declared shape), and attention's grouped-query,
    // bias, window and soft-cap attributes (the bias the last operand, after the paddings).
    {"TodaysAttention", R"kir(module @todays {
  symbol B max 2
  symbol S max 8
  func @f(%q: f32[B,S,8], %k: f32[B,S,4], %v: f32[B,S,4], %pad: bool[B,S], %bias: f32[1,4,S,S], %x: f32[B,2,1,S,2]) -> (f32[B,S,8], f32[B,S,8], f32[B,2,2,S,2]) {
    %0 = attention(%q, %k, %v, %pad, %bias) {bias = 1, causal = 1, heads = 4, kv_heads = 2, scale = 0.5, softcap = 30.0, window = 4} : f32[B,S,8]
    %1 = attention(%q, %k, %v) {causal = 0, heads = 4, kv_heads = 2, scale = 0.5} : f32[B,S,8]
    %2 = expand(%x) : f32[B,2,2,S,2]
    return %0, %1, %2
  }
}
)kir"},
    // Issue 26: indexing by computed indices and the sparse mixture of experts.
    {"IndexingAndMoE", R"kir(module @moe {
  symbol T max 8
  func @f(%x: f32[T,4], %w1: f32[3,4], %w3: f32[3,4], %w2: f32[4,3], %p: f32[T,2]) -> (f32[T,4], f32[T,2], f32[T,4]) {
    %ids = topk(%p) {k = 2} : i64[T,2]
    %g = take_along_axis(%p, %ids) {axis = -1} : f32[T,2]
    %y = moe_ffn(%x, %ids, %g, %w1, %w3, %w2, %w1, %w3, %w2) {experts = 2} : f32[T,4]
    %s = scatter_add(%x, %ids, %g) {axis = 1} : f32[T,4]
    return %y, %g, %s
  }
}
)kir"},
    // The layernorm variants' attributes (ir.h): each flag alone, both (the Annotated
    // Transformer's LayerNorm), and an explicit 0, printed in key order.
    {"LayerNormVariants", R"kir(module @variants {
  symbol B max 2
  func @f(%x: f32[B,4], %y: f32[B,4], %g: f32[4], %b: f32[4]) -> (f32[B,4], f32[B,4], f32[B,4], f32[B,4]) {
    %0 = layernorm(%x, %g, %b) {eps = 1e-06, unbiased = 1} : f32[B,4]
    %1 = layernorm(%x, %g, %b) {eps = 1e-06, eps_outside = 1} : f32[B,4]
    %2 = layernorm(%x, %g, %b) {eps = 1e-06, eps_outside = 0, unbiased = 0} : f32[B,4]
    %n = add_layernorm(%x, %y, %g, %b) {eps = 1e-06, eps_outside = 1, unbiased = 1} : f32[B,4]
    %h = add_layernorm_sum(%n) : f32[B,4]
    return %0, %1, %n, %h
  }
}
)kir"},
};

class RoundTripTest : public testing::TestWithParam<RoundTripCase> {};

TEST_P(RoundTripTest, PrintsBackIdentically) {
  const std::string text = GetParam().text;
  const Module m = parse_module(text, "roundtrip.kir");
  EXPECT_EQ(print_module(m), text);
  EXPECT_EQ(diagnostics_text(verify(m)), "");
  // Printing is a fixed point, and parse_and_verify accepts the text too.
  EXPECT_EQ(print_module(parse_and_verify(print_module(m))), text);
}

INSTANTIATE_TEST_SUITE_P(AllOps, RoundTripTest, testing::ValuesIn(kRoundTrips),
                         [](const testing::TestParamInfo<RoundTripCase>& tpi) {
                           return std::string(tpi.param.name);
                         });

TEST(RoundTripCoverage, EveryOpKindAppearsInSomeCase) {
  std::set<OpKind> used;
  for (const RoundTripCase& c : kRoundTrips) {
    const Module m = parse_module(c.text);
    for (const Function& f : m.functions)
      for (const Op& op : f.ops) used.insert(op.kind);
  }
  const int first = static_cast<int>(OpKind::weight);
  const int last = static_cast<int>(OpKind::memory_attention);
  for (int k = first; k <= last; ++k) {
    const auto kind = static_cast<OpKind>(k);
    const std::string name = op_name(kind);
    ASSERT_NE(name, "?") << "OpKind " << k << " has no name";
    EXPECT_EQ(parse_op_kind(name), kind) << name;
    EXPECT_TRUE(used.count(kind)) << "no round-trip case uses op '" << name << "'";
  }
  // `memory_attention` must stay the last kind, or this loop misses the new ones: extend it.
  EXPECT_STREQ(op_name(static_cast<OpKind>(last + 1)), "?")
      << "a new OpKind follows 'memory_attention': add it to the round-trip cases and this loop";
}

// ---------------------------------------------------------------------------------------
// Doubles, integers and strings in attributes.

std::string constant_module(const std::string& value) {
  return "module @m {\n  func @f() -> (f32[]) {\n    %0 = constant() {value = " + value +
         "} : f32[]\n    return %0\n  }\n}\n";
}

double parsed_constant(const Module& m) {
  return std::get<double>(m.functions.at(0).ops.at(0).attrs.at("value"));
}

TEST(ParserDoubles, RoundTripBitExactly) {
  const double values[] = {1e-05,
                           -1e+09,
                           0.125,
                           0.35355339059327373,
                           2.0,
                           0.1,
                           -0.0,
                           1e+16,
                           1e+300,
                           5e-324,
                           std::numeric_limits<double>::max(),
                           std::numeric_limits<double>::min(),
                           1.0000000000000001e-05,
                           std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity()};
  for (double d : values) {
    const std::string text = constant_module(print_attr_value(d));
    const Module m = parse_module(text);
    EXPECT_EQ(std::bit_cast<uint64_t>(parsed_constant(m)), std::bit_cast<uint64_t>(d))
        << print_attr_value(d);
    EXPECT_EQ(print_module(m), text);
  }
  const Module m = parse_module(constant_module("nan"));
  EXPECT_TRUE(std::isnan(parsed_constant(m)));
  EXPECT_EQ(print_module(m), constant_module("nan"));
}

TEST(ParserDoubles, AcceptsOtherSpellings) {
  struct Case {
    const char* text;
    double value;
    const char* canonical;
  };
  const Case cases[] = {
      {"1e-05", 1e-05, "1e-05"},
      {"-1e+09", -1e9, "-1000000000.0"},
      {"0.125", 0.125, "0.125"},
      {"0.35355339059327373", 0.35355339059327373, "0.35355339059327373"},
      {"2.0", 2.0, "2.0"},
      {"2.50", 2.5, "2.5"},
      {"1E3", 1000.0, "1000.0"},
      {"1e-5", 1e-05, "1e-05"},
      {"-0.5e1", -5.0, "-5.0"},
      {"007.0", 7.0, "7.0"},
  };
  for (const Case& c : cases) {
    const Module m = parse_module(constant_module(c.text));
    EXPECT_EQ(parsed_constant(m), c.value) << c.text;
    EXPECT_EQ(print_module(m), constant_module(c.canonical)) << c.text;
  }
}

TEST(ParserAttrs, IntegersStayIntegersAndFloatsStayFloats) {
  const Module m = parse_module(R"(module @m {
  func @f() -> (f32[], f32[]) {
    %0 = constant() {value = 2} : f32[]
    %1 = constant() {value = 2.0} : f32[]
    return %0, %1
  }
}
)");
  const Attrs& a0 = m.functions[0].ops[0].attrs;
  const Attrs& a1 = m.functions[0].ops[1].attrs;
  ASSERT_TRUE(std::holds_alternative<int64_t>(a0.at("value")));
  EXPECT_EQ(std::get<int64_t>(a0.at("value")), 2);
  ASSERT_TRUE(std::holds_alternative<double>(a1.at("value")));
  EXPECT_EQ(std::get<double>(a1.at("value")), 2.0);
}

TEST(ParserAttrs, IntegerExtremesAndLists) {
  const Module m = parse_module(R"(module @m {
  weight @w : f32[2] = concat(@a) {big = 9223372036854775807, empty = [], list = [3, -1, 0],
                                   small = -9223372036854775808}
}
)");
  const Attrs& attrs = m.weights.at(0).derivation->attrs;
  EXPECT_EQ(std::get<int64_t>(attrs.at("big")), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(std::get<int64_t>(attrs.at("small")), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(std::get<std::vector<int64_t>>(attrs.at("list")), (std::vector<int64_t>{3, -1, 0}));
  EXPECT_TRUE(std::get<std::vector<int64_t>>(attrs.at("empty")).empty());
}

TEST(ParserAttrs, StringEscapes) {
  const Module m = parse_module(
      R"(module @m { config {s = "a\"b\\c\nd\te\x41\x7f\xff", u = "héllo", z = ""} })");
  EXPECT_EQ(m.config.at("s"), std::string("a\"b\\c\nd\teA\x7f\xff"));
  EXPECT_EQ(m.config.at("u"), "héllo");
  EXPECT_EQ(m.config.at("z"), "");
  // Printing and parsing again gives the same strings.
  EXPECT_EQ(parse_module(print_module(m)).config, m.config);
}

// ---------------------------------------------------------------------------------------
// Structure: names, locations, derivations, config, item order, comments.

TEST(Parser, NumericNamesBecomeUnnamedAndAreRenumbered) {
  const Module m = parse_module(R"(module @m {
  func @f(%7: f32[2], %in: f32[2]) -> (f32[2]) {
    %5 = relu(%7) : f32[2]
    %out = add(%5, %in) : f32[2]
    %03 = neg(%out) : f32[2]
    return %03
  }
}
)");
  const Function& f = m.functions.at(0);
  ASSERT_EQ(f.values.size(), 5u);
  EXPECT_EQ(f.values[0].name, "");
  EXPECT_EQ(f.values[1].name, "in");
  EXPECT_EQ(f.values[2].name, "");
  EXPECT_EQ(f.values[3].name, "out");
  EXPECT_EQ(f.values[4].name, "");
  EXPECT_EQ(f.params, (std::vector<ValueId>{0, 1}));
  EXPECT_EQ(f.results, (std::vector<ValueId>{4}));
  ASSERT_EQ(f.ops.size(), 3u);
  EXPECT_EQ(f.ops[0].operands, (std::vector<ValueId>{0}));
  EXPECT_EQ(f.ops[1].operands, (std::vector<ValueId>{2, 1}));
  EXPECT_EQ(print_module(m), R"(module @m {
  func @f(%0: f32[2], %in: f32[2]) -> (f32[2]) {
    %1 = relu(%0) : f32[2]
    %out = add(%1, %in) : f32[2]
    %2 = neg(%out) : f32[2]
    return %2
  }
}
)");
}

TEST(Parser, RecordsOpLocations) {
  const Module m = parse_module(R"(module @m {
  func @f(%x: f32[2]) -> (f32[2]) {
    %a = relu(%x) : f32[2]
  %b = neg(%a) : f32[2]    # odd indentation
	%c = exp(%b) : f32[2]
    return %c
  }
}
)");
  const Function& f = m.functions.at(0);
  ASSERT_EQ(f.ops.size(), 3u);
  EXPECT_EQ(f.ops[0].loc.line, 3);
  EXPECT_EQ(f.ops[0].loc.col, 5);
  EXPECT_EQ(f.ops[1].loc.line, 4);
  EXPECT_EQ(f.ops[1].loc.col, 3);
  EXPECT_EQ(f.ops[2].loc.line, 5);
  EXPECT_EQ(f.ops[2].loc.col, 2);  // a tab counts as one column
}

TEST(Parser, WeightDerivationAndConfig) {
  const Module m = parse_module(R"(module @m {
  config {b = "2", a = "1"}
  weight @w_q : f32[2,3]
  weight @w_k : f32[2,3]
  weight @w_qk : f32[4,3] = concat(@w_q, @w_k) {axis = 0}
  weight @plain : f32[]
}
)");
  EXPECT_EQ(m.name, "m");
  EXPECT_EQ(m.config, (std::map<std::string, std::string>{{"a", "1"}, {"b", "2"}}));
  ASSERT_EQ(m.weights.size(), 4u);
  const Weight& w = m.weights[2];
  EXPECT_EQ(w.name, "w_qk");
  EXPECT_EQ(w.type, (TensorType{DType::f32, {Dim::constant(4), Dim::constant(3)}}));
  ASSERT_TRUE(w.derivation.has_value());
  EXPECT_EQ(w.derivation->op, "concat");
  EXPECT_EQ(w.derivation->inputs, (std::vector<std::string>{"w_q", "w_k"}));
  EXPECT_EQ(w.derivation->attrs, (Attrs{{"axis", int64_t{0}}}));
  EXPECT_FALSE(m.weights[3].derivation.has_value());
  EXPECT_EQ(m.weights[3].type.rank(), 0);
  EXPECT_EQ(diagnostics_text(verify(m)), "");
}

TEST(Parser, MemoryPlan) {
  const Module m = parse_module(R"(module @m {
  func @f(%x: f32[4]) -> (f32[4]) arena 4096 {
    %a = relu(%x) : f32[4] at 64
    %b = neg(%a) : f32[4]
    return %b
  }
  func @g(%x: f32[4]) -> (f32[4]) {
    return %x
  }
}
)");
  const Function& f = m.functions.at(0);
  EXPECT_EQ(f.arena_bytes, 4096);
  ASSERT_EQ(f.ops.size(), 2u);
  EXPECT_EQ(f.ops[0].arena_offset, 64);
  EXPECT_EQ(f.ops[1].arena_offset, -1);
  EXPECT_EQ(m.functions.at(1).arena_bytes, -1);
}

TEST(Parser, SourceLocations) {
  const Module m = parse_module(R"(module @m {
  source 0 = "llama.cpp"
  source 1 = "layers.0.mlp"
  func @f(%x: f32[4]) -> (f32[4]) {
    %a = relu(%x) : f32[4] src(0:41, 1)
    %b = neg(%a) : f32[4] src(0:1234567)
    %c = exp(%b) : f32[4]
    return %c
  }
}
)");
  ASSERT_EQ(m.sources, (std::vector<std::string>{"llama.cpp", "layers.0.mlp"}));
  const Function& f = m.functions.at(0);
  EXPECT_EQ(f.ops[0].src, (ir::SourceLoc{0, 41, 1}));
  EXPECT_EQ(f.ops[1].src, (ir::SourceLoc{0, 1234567, -1}));
  EXPECT_FALSE(f.ops[2].src.known());
  EXPECT_EQ(m.source_text(f.ops[0].src), "llama.cpp:41 (layers.0.mlp)");
  EXPECT_EQ(m.source_text(f.ops[1].src), "llama.cpp:1234567");
  EXPECT_EQ(m.source_text(f.ops[2].src), "");
  EXPECT_EQ(m.source_text(ir::SourceLoc{2, 1, -1}), "");  // out of range: unknown
}

TEST(Parser, CommentsWhitespaceAndItemOrder) {
  const Module m = parse_module(
      "# leading comment\r\n"
      "module @m{func @f(%x:f32[ S ,2])->(f32[S,2]){%y=relu(%x):f32[S,2] return %y}#c\n"
      "  symbol S max 3 # trailing\n"
      "  config{k=\"v\"}\n"
      "}  # done");
  EXPECT_EQ(print_module(m), R"(module @m {
  config {k = "v"}
  symbol S max 3
  func @f(%x: f32[S,2]) -> (f32[S,2]) {
    %y = relu(%x) : f32[S,2]
    return %y
  }
}
)");
}

TEST(Parser, KeywordsAreNotReserved) {
  // Item keywords and dtype names are ordinary identifiers where a name is expected.
  const Module m = parse_module(R"(module @module {
  symbol max max 2
  weight @weight : f32[3]
  func @func(%return: f32[max,3]) -> (f32[max,3]) {
    %weight = weight() {name = "weight"} : f32[3]
    %f32 = add(%return, %weight) : f32[max,3]
    return %f32
  }
}
)");
  EXPECT_EQ(diagnostics_text(verify(m)), "");
  EXPECT_EQ(m.symbols.at(0).name, "max");
}

TEST(Parser, EmptyResultListIsLeftToTheVerifier) {
  const Module m = parse_module("module @m {\n  func @f() -> () {\n    return\n  }\n}\n");
  ASSERT_EQ(m.functions.size(), 1u);
  EXPECT_TRUE(m.functions[0].results.empty());
  EXPECT_THAT(diagnostics_text(verify(m)), HasSubstr("[V3] function 'f' has no results"));
}

TEST(Parser, ParseAndVerify) {
  const std::string text = R"(module @m {
  func @f(%x: f32[2]) -> (f32[3]) {
    %y = relu(%x) : f32[3]
    return %y
  }
}
)";
  EXPECT_NO_THROW(parse_module(text));
  try {
    parse_and_verify(text, "bad.kir");
    FAIL() << "parse_and_verify accepted an ill-typed module";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "bad.kir:3:5: error: [V8] relu: result type is f32[3], expected f32[2]");
  }
  EXPECT_EQ(parse_and_verify("module @ok {\n}\n").name, "ok");
}

// ---------------------------------------------------------------------------------------
// Malformed input: every error names the file, line, column and offending token.

struct ErrorCase {
  const char* name;
  const char* text;
  const char* error;
};

const ErrorCase kErrors[] = {
    {"EmptyInput", "", "<input>:1:1: error: unexpected end of input, expected 'module'"},
    {"OnlyComments", "# nothing here\n  ",
     "<input>:2:3: error: unexpected end of input, expected 'module'"},
    {"NotAModule", "func @f() -> () {}", "<input>:1:1: error: expected 'module', got 'func'"},
    {"SourceOutOfOrder", "module @m {\n  source 1 = \"a.cpp\"\n}",
     "<input>:2:10: error: source 1 out of order, expected source 0"},
    {"SourceWithoutString", "module @m {\n  source 0 = a\n}",
     "<input>:2:14: error: expected string after 'source 0 =', got 'a'"},
    {"SrcOfUndeclaredSource",
     "module @m {\n  source 0 = \"a.cpp\"\n  func @f(%x: f32[2]) -> (f32[2]) {\n"
     "    %y = relu(%x) : f32[2] src(0:3, 1)\n    return %y\n  }\n}",
     "<input>:4:37: error: source scope 1 is not a declared source (the module has 1)"},
    {"SrcLineZero",
     "module @m {\n  source 0 = \"a.cpp\"\n  func @f(%x: f32[2]) -> (f32[2]) {\n"
     "    %y = relu(%x) : f32[2] src(0:0)\n    return %y\n  }\n}",
     "<input>:4:34: error: source line 0 out of range"},
    {"SrcWithoutColon",
     "module @m {\n  source 0 = \"a.cpp\"\n  func @f(%x: f32[2]) -> (f32[2]) {\n"
     "    %y = relu(%x) : f32[2] src(0)\n    return %y\n  }\n}",
     "<input>:4:33: error: expected ':' after the source file in 'src' of '%y', got ')'"},
    {"MissingModuleName", "module {\n}\n",
     "<input>:1:8: error: expected module name (@NAME) after 'module', got '{'"},
    {"MissingModuleBrace", "module @m\n  symbol S max 4\n}\n",
     "<input>:2:3: error: expected '{' after module name '@m', got 'symbol'"},
    {"StrayTokenAtTopLevel", "module @m {\n  symbol S max 4\n  foo\n}\n",
     "<input>:3:3: error: expected 'config', 'symbol', 'weight', 'source', 'func' or '}', got "
     "'foo'"},
    {"StrayCharacter", "module @m {\n  $\n}\n",
     "<input>:2:3: error: expected 'config', 'symbol', 'weight', 'source', 'func' or '}', got '$'"},
    {"NonAsciiCharacter", "module @m {\n  \xc3\xa9\n}\n",
     "<input>:2:3: error: expected 'config', 'symbol', 'weight', 'source', 'func' or '}', got "
     "'\\xc3'"},
    {"TokenAfterModule", "module @m {\n}\nmodule @n {\n}\n",
     "<input>:3:1: error: expected end of input after the module, got 'module'"},
    {"UnexpectedEndOfInput", "module @m {\n  symbol S max 4\n",
     "<input>:3:1: error: unexpected end of input, expected '}'"},
    {"EndOfInputInFunction", "module @m {\n  func @f(%x: f32[2]) -> (f32[2]) {\n",
     "<input>:3:1: error: unexpected end of input, expected op or 'return' in function '@f'"},
    {"EndOfInputInType", "module @m {\n  weight @w : f32[2,",
     "<input>:2:21: error: unexpected end of input, expected dimension (integer or symbol)"},
    {"SymbolWithoutMax", "module @m {\n  symbol S 4\n}\n",
     "<input>:2:12: error: expected 'max' after symbol 'S', got '4'"},
    {"IntegerOverflow", "module @m {\n  symbol S max 99999999999999999999\n}\n",
     "<input>:2:16: error: integer literal '99999999999999999999' is out of range"},
    {"IntegerUnderflow", "module @m {\n  symbol S max -9223372036854775809\n}\n",
     "<input>:2:16: error: integer literal '-9223372036854775809' is out of range"},
    {"FloatOverflow", "module @m {\n  weight @w : f32[2] = concat(@a) {x = 1e999}\n}\n",
     "<input>:2:40: error: float literal '1e999' is out of range"},
    {"InvalidNumber", "module @m {\n  weight @w : f32[12abc]\n}\n",
     "<input>:2:19: error: invalid number '12abc'"},
    {"InvalidFloat", "module @m {\n  weight @w : f32[2] = concat(@a) {x = 1.e5}\n}\n",
     "<input>:2:40: error: invalid number '1.e5'"},
    {"MissingColonBeforeWeightType", "module @m {\n  weight @w f32[2]\n}\n",
     "<input>:2:13: error: expected ':' after weight '@w', got 'f32'"},
    {"UnknownDtype", "module @m {\n  func @f(%x: f16[2]) -> (f32[2]) {\n    return %x\n  }\n}\n",
     "<input>:2:15: error: unknown dtype 'f16'"},
    {"MissingType", "module @m {\n  func @f(%x: [2]) -> (f32[2]) {\n    return %x\n  }\n}\n",
     "<input>:2:15: error: expected type, got '['"},
    {"MissingShape", "module @m {\n  weight @w : f32 \n}\n",
     "<input>:3:1: error: expected '[' after dtype 'f32', got '}'"},
    {"BadDim", "module @m {\n  weight @w : f32[2.5]\n}\n",
     "<input>:2:19: error: expected dimension (integer or symbol), got '2.5'"},
    {"NegativeDim", "module @m {\n  weight @w : f32[3,-1]\n}\n",
     "<input>:2:21: error: negative dimension '-1'"},
    {"BadDimSeparator", "module @m {\n  weight @w : f32[3;4]\n}\n",
     "<input>:2:20: error: expected ',' or ']' in shape, got ';'"},
    {"MissingColonAfterParameter",
     "module @m {\n  func @f(%src[2]) -> (f32[2]) {\n    return %src\n  }\n}\n",
     "<input>:2:15: error: expected ':' after parameter '%src', got '['"},
    {"ParameterWithoutPercent",
     "module @m {\n  func @f(x: f32[2]) -> (f32[2]) {\n    return %x\n  }\n}\n",
     "<input>:2:11: error: expected parameter name (%NAME) in function '@f', got 'x'"},
    {"MissingArrow", "module @m {\n  func @f(%x: f32[2]) (f32[2]) {\n    return %x\n  }\n}\n",
     "<input>:2:23: error: expected '->' after the parameters of '@f', got '('"},
    {"MissingBodyBrace", "module @m {\n  func @f(%x: f32[2]) -> (f32[2])\n    return %x\n  }\n}\n",
     "<input>:3:5: error: expected '{' before the body of '@f', got 'return'"},
    {"ArenaWithoutSize",
     "module @m {\n  func @f(%x: f32[2]) -> (f32[2]) arena {\n    return %x\n  }\n}\n",
     "<input>:2:41: error: expected integer for 'arena' of '@f', got '{'"},
    {"NegativeArenaSize",
     "module @m {\n  func @f(%x: f32[2]) -> (f32[2]) arena -64 {\n    return %x\n  }\n}\n",
     "<input>:2:41: error: negative arena size '-64'"},
    {"AtWithoutOffset",
     "module @m {\n  func @f(%x: f32[2]) -> (f32[2]) {\n    %y = relu(%x) : f32[2] at\n"
     "    return %y\n  }\n}\n",
     "<input>:4:5: error: expected integer after 'at' in '%y', got 'return'"},
    {"NegativeArenaOffset",
     "module @m {\n  func @f(%x: f32[2]) -> (f32[2]) {\n    %y = relu(%x) : f32[2] at -1\n"
     "    return %y\n  }\n}\n",
     "<input>:3:31: error: negative arena offset '-1'"},
    {"UnknownOp",
     "module @m {\n  func @f(%x: f32[2]) -> (f32[2]) {\n    %y = matmull(%x, %x) : f32[2]\n"
     "    return %y\n  }\n}\n",
     "<input>:3:10: error: unknown op 'matmull'"},
    {"MissingEquals",
     "module @m {\n  func @f(%x: f32[2]) -> (f32[2]) {\n    %y relu(%x) : f32[2]\n"
     "    return %y\n  }\n}\n",
     "<input>:3:8: error: expected '=' after '%y', got 'relu'"},
    {"OperandWithoutPercent",
     "module @m {\n  func @f(%x: f32[2]) -> (f32[2]) {\n    %y = relu(x) : f32[2]\n"
     "    return %y\n  }\n}\n",
     "<input>:3:15: error: expected operand (%NAME) of 'relu', got 'x'"},
    {"MissingColonBeforeResultType",
     "module @m {\n  func @f(%x: f32[2]) -> (f32[2]) {\n    %y = relu(%x) f32[2]\n"
     "    return %y\n  }\n}\n",
     "<input>:3:19: error: expected ':' before the result type of '%y', got 'f32'"},
    {"UndefinedValue",
     "module @m {\n  func @f(%x: f32[2]) -> (f32[2]) {\n    %0 = add(%x, %7) : f32[2]\n"
     "    return %0\n  }\n}\n",
     "<input>:3:18: error: use of undefined value '%7'"},
    {"UseBeforeDefinition",
     "module @m {\n  func @f(%x: f32[2]) -> (f32[2]) {\n    %a = relu(%b) : f32[2]\n"
     "    %b = relu(%x) : f32[2]\n    return %a\n  }\n}\n",
     "<input>:3:15: error: use of undefined value '%b'"},
    {"UndefinedReturnValue",
     "module @m {\n  func @f(%x: f32[2]) -> (f32[2]) {\n    return %nope\n  }\n}\n",
     "<input>:3:12: error: use of undefined value '%nope'"},
    {"DuplicateValue",
     "module @m {\n  func @f(%x: f32[2]) -> (f32[2]) {\n    %3 = relu(%x) : f32[2]\n"
     "    %3 = neg(%x) : f32[2]\n    return %3\n  }\n}\n",
     "<input>:4:5: error: value '%3' is defined twice"},
    {"DuplicateParameter",
     "module @m {\n  func @f(%x: f32[2], %x: f32[2]) -> (f32[2]) {\n    return %x\n  }\n}\n",
     "<input>:2:23: error: value '%x' is defined twice"},
    {"UnterminatedString", "module @m {\n  config {a = \"abc}\n}\n",
     "<input>:2:15: error: unterminated string"},
    {"UnterminatedStringAtEnd", "module @m {\n  config {a = \"abc\\",
     "<input>:2:15: error: unterminated string"},
    {"InvalidEscape", "module @m {\n  config {a = \"ab\\qc\"}\n}\n",
     "<input>:2:18: error: invalid escape '\\q' in string"},
    {"InvalidHexEscape", "module @m {\n  config {a = \"\\x4g\"}\n}\n",
     "<input>:2:16: error: invalid escape '\\x4g' in string"},
    {"ConfigValueNotString", "module @m {\n  config {a = 3}\n}\n",
     "<input>:2:15: error: expected string value for config key 'a', got '3'"},
    {"DuplicateConfigKey", "module @m {\n  config {a = \"1\"}\n  config {a = \"2\"}\n}\n",
     "<input>:3:11: error: config key 'a' is defined twice"},
    {"BadAttributeValue",
     "module @m {\n  func @f(%x: f32[2,3]) -> (f32[2,3]) {\n"
     "    %y = softmax(%x) {axis = last} : f32[2,3]\n    return %y\n  }\n}\n",
     "<input>:3:30: error: expected value for attribute 'axis', got 'last'"},
    {"FloatInIntegerList",
     "module @m {\n  func @f(%x: f32[2,3]) -> (f32[3,2]) {\n"
     "    %y = transpose(%x) {perm = [1, 0.5]} : f32[3,2]\n    return %y\n  }\n}\n",
     "<input>:3:36: error: expected integer in list for attribute 'perm', got '0.5'"},
    {"MissingAttributeSeparator",
     "module @m {\n  func @f(%x: f32[2,3]) -> (f32[2,3]) {\n"
     "    %y = slice(%x) {axis = 1 start = 0} : f32[2,3]\n    return %y\n  }\n}\n",
     "<input>:3:30: error: expected ',' or '}' after attribute 'axis', got 'start'"},
    {"DuplicateAttribute",
     "module @m {\n  func @f(%x: f32[2,3]) -> (f32[2,3]) {\n"
     "    %y = softmax(%x) {axis = 1, axis = 0} : f32[2,3]\n    return %y\n  }\n}\n",
     "<input>:3:33: error: attribute 'axis' is defined twice"},
    {"ReturnTypeMismatch",
     "module @m {\n  func @f(%x: f32[2]) -> (f32[3]) {\n    %y = relu(%x) : f32[2]\n"
     "    return %y\n  }\n}\n",
     "<input>:4:12: error: return value '%y' has type f32[2], but the signature of '@f' "
     "declares f32[3]"},
    {"ReturnCountMismatch",
     "module @m {\n  func @f(%x: f32[2]) -> (f32[2], f32[2]) {\n    return %x\n  }\n}\n",
     "<input>:3:5: error: '@f' returns 1 value(s), but its signature declares 2"},
    {"MissingReturnSeparator",
     "module @m {\n  func @f(%x: f32[2]) -> (f32[2], f32[2]) {\n    return %x %x\n  }\n}\n",
     "<input>:3:15: error: expected ',' or '}' after return value, got '%x'"},
    {"OpAfterReturn",
     "module @m {\n  func @f(%x: f32[2]) -> (f32[2]) {\n    return %x\n    %y = relu(%x) : f32[2]\n"
     "  }\n}\n",
     "<input>:4:5: error: expected ',' or '}' after return value, got '%y'"},
    {"NothingAfterReturn",
     "module @m {\n  func @f(%x: f32[2]) -> (f32[2]) {\n    return ]\n  }\n}\n",
     "<input>:3:12: error: expected return value (%NAME) or '}' after 'return', got ']'"},
    {"ReturnListEndsWithComma",
     "module @m {\n  func @f(%x: f32[2]) -> (f32[2], f32[2]) {\n    return %x,\n  }\n}\n",
     "<input>:4:3: error: expected return value (%NAME) after ',', got '}'"},
    {"DerivationMissingComma", "module @m {\n  weight @w : f32[4] = concat(@a @b) {axis = 0}\n}\n",
     "<input>:2:34: error: expected ',' or ')' in derivation of '@w', got '@b'"},
    {"DerivationMissingOp", "module @m {\n  weight @w : f32[4] = (@a, @b)\n}\n",
     "<input>:2:24: error: expected derivation op after '=' in weight '@w', got '('"},
    {"DerivationBareName", "module @m {\n  weight @w : f32[4] = concat(a)\n}\n",
     "<input>:2:31: error: expected weight name (@NAME) in derivation of '@w', got 'a'"},
};

class ParserErrorTest : public testing::TestWithParam<ErrorCase> {};

TEST_P(ParserErrorTest, ReportsExactLocatedMessage) {
  EXPECT_EQ(parse_error(GetParam().text), GetParam().error);
}

INSTANTIATE_TEST_SUITE_P(Malformed, ParserErrorTest, testing::ValuesIn(kErrors),
                         [](const testing::TestParamInfo<ErrorCase>& tpi) {
                           return std::string(tpi.param.name);
                         });

TEST(ParserErrors, NameTheFile) {
  EXPECT_EQ(
      parse_error("module @m {\n  bogus\n}\n", "models/tiny.kir"),
      "models/tiny.kir:2:3: error: expected 'config', 'symbol', 'weight', 'source', 'func' or '}', "
      "got 'bogus'");
}

TEST(ParserErrors, LongTokensAreShortenedInMessages) {
  const std::string name(100, 'x');
  EXPECT_EQ(
      parse_error("module @m {\n  " + name + "\n}\n"),
      "<input>:2:3: error: expected 'config', 'symbol', 'weight', 'source', 'func' or '}', got '" +
          std::string(40, 'x') + "...'");
}

// True for "<input>:LINE:COL: error: MESSAGE".
bool is_located(std::string_view s) {
  auto skip_number = [&s]() {
    size_t n = 0;
    while (n < s.size() && s[n] >= '0' && s[n] <= '9') ++n;
    s.remove_prefix(n);
    return n > 0;
  };
  auto skip = [&s](std::string_view prefix) {
    if (s.substr(0, prefix.size()) != prefix) return false;
    s.remove_prefix(prefix.size());
    return true;
  };
  return skip("<input>:") && skip_number() && skip(":") && skip_number() && skip(": error: ") &&
         !s.empty();
}

// Every prefix and many random corruptions of a valid module either parse or throw a
// located kiln::Error; whatever parses can be verified and printed without crashing.
TEST(ParserRobustness, NeverCrashesOnCorruptedInput) {
  const std::string text = kRoundTrips[5].text;  // Fused: the richest case
  ASSERT_STREQ(kRoundTrips[5].name, "Fused");
  auto check = [&](const std::string& input) {
    try {
      const Module m = parse_module(input);
      verify(m);
      print_module(m);
    } catch (const Error& e) {
      EXPECT_TRUE(is_located(e.what())) << e.what();
    }
  };
  for (size_t n = 0; n <= text.size(); ++n) check(text.substr(0, n));
  std::mt19937 rng(1234);
  const std::string alphabet = "{}()[],:=-@%#\"\\ \n0123456789.eaxf_\x01\xff";
  for (int i = 0; i < 3000; ++i) {
    std::string mutated = text;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng() % mutated.size();
      switch (rng() % 3) {
        case 0:
          mutated[pos] = alphabet[rng() % alphabet.size()];
          break;
        case 1:
          mutated.erase(pos, 1 + rng() % 8);
          break;
        default:
          mutated.insert(pos, 1, alphabet[rng() % alphabet.size()]);
          break;
      }
      if (mutated.empty()) mutated = "m";
    }
    check(mutated);
  }
}

}  // namespace
}  // namespace kiln::ir
