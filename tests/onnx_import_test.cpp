// kiln import (issue 29): the models exported with Debian's PyTorch at opsets 14 and 17
// (tests/onnx/export_models.py; committed in tests/onnx/models) import, match PyTorch within
// 1e-4 through the interpreter before and after the default pipeline and through the
// compiled library, and fuse as the same models written in the DSL do; bad files get their
// documented errors.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <onnx/onnx_pb.h>

#include "tests/cli_run.h"

namespace kiln::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const std::string kModels = std::string(KILN_TEST_DATA_DIR) + "/onnx/models";

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

fs::path scratch(const std::string& name) {
  fs::path dir =
      fs::temp_directory_path() / ("kiln_onnx_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// "--dim B=4 --dim S=16 ..." from NAME.dims.
std::string dims_of(const std::string& model) {
  std::ifstream in(kModels + "/" + model + ".dims");
  std::string line, out;
  while (std::getline(in, line))
    if (!line.empty()) out += " --dim " + line;
  return out;
}

// `kiln inspect --ops FILE` as op -> count, of the function `forward` (the DSL's models have
// more entry points).
std::map<std::string, int> histogram(const fs::path& kir) {
  CliResult r = run_cli("%kiln inspect --ops " + kir.string());
  EXPECT_EQ(r.status, 0) << r.output << r.errors;
  std::map<std::string, int> h;
  std::istringstream in(r.output);
  std::string fn, op;
  int n = 0;
  while (in >> fn >> op >> n)
    if (fn == "forward") h[op] += n;
  return h;
}

struct Case {
  std::string model;
  int opset;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.model + "_opset" + std::to_string(info.param.opset);
}

class Imported : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case& c = GetParam();
    dir_ = scratch(case_name({c, 0}));
    kir_ = dir_ / "model.kir";
    weights_ = dir_ / "model.safetensors";
    const std::string onnx = kModels + "/" + c.model + "_opset" + std::to_string(c.opset) + ".onnx";
    CliResult r = run_cli("%kiln import " + onnx + " -o " + kir_.string() + dims_of(c.model));
    ASSERT_EQ(r.status, 0) << r.output << r.errors;
    EXPECT_THAT(r.output, HasSubstr("(opset " + std::to_string(c.opset) + ")"));
  }
  void TearDown() override { fs::remove_all(dir_); }

  // `kiln run` of `kir` (or of the compiled library in `compiled`) against PyTorch's outputs.
  void expect_matches(const std::string& what) {
    const Case& c = GetParam();
    CliResult r = run_cli("%kiln run " + what + " --weights " + weights_.string() + " --inputs " +
                          kModels + "/" + c.model + ".inputs.safetensors --expect " + kModels +
                          "/" + c.model + ".expected.safetensors --atol 1e-4");
    ASSERT_EQ(r.status, 0) << r.output << r.errors;
    EXPECT_THAT(r.output, HasSubstr("(match <= 0.0001)"));
    std::printf("[ onnx ] %s %s: %s", case_name({c, 0}).c_str(), what.c_str(), r.output.c_str());
  }

  fs::path optimize() {
    const fs::path opt = dir_ / "model.opt.kir";
    CliResult r = run_cli("%kiln opt " + kir_.string() + " -o " + opt.string());
    EXPECT_EQ(r.status, 0) << r.output << r.errors;
    return opt;
  }

  fs::path dir_, kir_, weights_;
};

// The interpreter, on the IR as imported and after the default pipeline.
TEST_P(Imported, MatchesPyTorchInTheInterpreter) {
  expect_matches(kir_.string());
  expect_matches(optimize().string());
}

// The default pipeline fuses the imported graph as it fuses the DSL's: every attention, every
// residual add + norm, every GEMM with its bias and activation; nothing of them left unfused.
TEST_P(Imported, FusesAsTheDslModel) {
  const Case& c = GetParam();
  const fs::path opt = optimize();
  std::map<std::string, int> h = histogram(opt);
  for (const char* op : {"softmax", "matmul", "reduce_mean", "sqrt", "erf", "tanh"})
    EXPECT_EQ(h[op], 0) << op << " left unfused in " << c.model;
  EXPECT_GT(h["linear"], 0);
  const std::string text = read_text(opt.string());
  // The DSL's models of the same structure (the paper's Transformer and the seed twins are
  // registered; BERT's and GPT-2's counts follow from their two layers).
  std::map<std::string, std::pair<std::string, std::string>> dsl = {
      {"transformer", {"transformer", "tiny"}},
      {"seed0", {"seed0_neginf_fill", ""}},
      {"seed1", {"seed1_custom_layernorm", ""}}};
  if (auto it = dsl.find(c.model); it != dsl.end()) {
    const fs::path emitted = dir_ / "dsl.kir", dsl_opt = dir_ / "dsl.opt.kir";
    const std::string config = it->second.second.empty() ? "" : " --config " + it->second.second;
    ASSERT_EQ(run_cli("%kiln emit " + it->second.first + config + " -o " + emitted.string()).status,
              0);
    ASSERT_EQ(run_cli("%kiln opt " + emitted.string() + " -o " + dsl_opt.string()).status, 0);
    std::map<std::string, int> want = histogram(dsl_opt);
    for (const char* op : {"attention", "add_layernorm", "layernorm"})
      EXPECT_EQ(h[op], want[op]) << op << " in " << c.model << " vs the DSL's " << it->second.first;
  } else if (c.model == "bert") {
    EXPECT_EQ(h["attention"], 2);
    EXPECT_EQ(h["add_layernorm"], 5);  // the embeddings' sum and two per layer
    EXPECT_THAT(text, HasSubstr("{act = \"gelu\"}"));
  } else if (c.model == "gpt2") {
    EXPECT_EQ(h["attention"], 2);
    EXPECT_EQ(h["add_layernorm"] + h["layernorm"], 5);  // two per layer and ln_f
    EXPECT_THAT(text, HasSubstr("{act = \"gelu_tanh\"}"));
  }
}

// The compiled library (kiln compile --emit=shared, run by kiln-run).
TEST_P(Imported, MatchesPyTorchCompiled) {
  const fs::path out = dir_ / "lib";
  CliResult r =
      run_cli("%kiln compile " + kir_.string() + " --emit=shared -j 2 -o " + out.string());
  ASSERT_EQ(r.status, 0) << r.output << r.errors;
  expect_matches("--compiled " + out.string());
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const char* m : {"transformer", "seed0", "seed1", "bert", "gpt2"})
    for (int opset : {14, 17}) out.push_back({m, opset});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Models, Imported, ::testing::ValuesIn(cases()), case_name);

// --- Errors ---------------------------------------------------------------------------------

// A model of one input x : f32[dims] (a string names a dynamic dim) and the nodes given
// (op type, name), chained from x to the output y.
onnx::ModelProto chain_model(const std::vector<std::variant<int64_t, std::string>>& dims,
                             const std::vector<std::pair<std::string, std::string>>& nodes,
                             int64_t opset = 17) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(opset);
  onnx::GraphProto* g = m.mutable_graph();
  g->set_name("g");
  auto* in = g->add_input();
  in->set_name("x");
  auto* tt = in->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  for (const auto& d : dims) {
    auto* dim = tt->mutable_shape()->add_dim();
    if (std::holds_alternative<int64_t>(d))
      dim->set_dim_value(std::get<int64_t>(d));
    else
      dim->set_dim_param(std::get<std::string>(d));
  }
  std::string prev = "x";
  for (size_t i = 0; i < nodes.size(); ++i) {
    auto* n = g->add_node();
    n->set_op_type(nodes[i].first);
    n->set_name(nodes[i].second);
    n->add_input(prev);
    prev = i + 1 == nodes.size() ? "y" : "t" + std::to_string(i);
    n->add_output(prev);
  }
  g->add_output()->set_name("y");
  return m;
}

class ImportErrors : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = scratch("errors"); }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  std::string write(const std::string& name, const onnx::ModelProto& m) {
    return write(name, m.SerializeAsString());
  }
  // kiln import's failure: exit status 1, no signal, the message; no .kir written.
  std::string import_fails(const std::string& path, const std::string& options = "") {
    const std::string kir = (dir_ / "out.kir").string();
    CliResult r = run_cli("%kiln import " + path + " -o " + kir + options);
    EXPECT_EQ(r.status, 1) << r.output << r.errors;
    EXPECT_EQ(r.signal, 0);
    EXPECT_FALSE(fs::exists(kir));
    return r.output;  // standard error joined
  }
  fs::path dir_;
};

TEST_F(ImportErrors, EveryUnsupportedOperatorIsListedAtOnce) {
  const std::string path = write(
      "unsupported.onnx",
      chain_model({int64_t{2}, int64_t{3}}, {{"Relu", "r"}, {"Foo", "foo1"}, {"Bar", "bar1"}}));
  EXPECT_THAT(import_fails(path),
              HasSubstr("2 nodes with operators kiln does not import (opset 17): 'foo1' (Foo), "
                        "'bar1' (Bar)"));
}

TEST_F(ImportErrors, ADynamicDimWithoutAMaximumAsksForDim) {
  const std::string path =
      write("dynamic.onnx", chain_model({std::string("N"), int64_t{3}}, {{"Relu", "r"}}));
  EXPECT_THAT(import_fails(path),
              HasSubstr("graph input 'x' dim 0 is the dynamic size 'N', which needs a maximum: "
                        "pass --dim N=MAX"));
  // With it, the model imports.
  CliResult ok =
      run_cli("%kiln import " + path + " -o " + (dir_ / "ok.kir").string() + " --dim N=8");
  EXPECT_EQ(ok.status, 0) << ok.output;
  EXPECT_THAT(read_text((dir_ / "ok.kir").string()), HasSubstr("symbol N max 8"));
  EXPECT_THAT(import_fails(path, " --dim M=8 --dim N=8"),
              HasSubstr("--dim M: no graph input has a dynamic dim named 'M'"));
  EXPECT_THAT(import_fails(path, " --dim N=0"), HasSubstr("--dim 'N=0' must be NAME=MAX"));
}

TEST_F(ImportErrors, CorruptedFilesAreRefused) {
  const std::string good = read_text(kModels + "/bert_opset17.onnx");
  ASSERT_GT(good.size(), 1000u);
  EXPECT_THAT(
      import_fails(write("truncated.onnx", good.substr(0, good.size() / 2)), dims_of("bert")),
      HasSubstr("not a valid ONNX model (the protobuf does not parse: truncated or corrupt)"));
  EXPECT_THAT(import_fails(write("garbage.onnx", std::string(4096, '\xff'))),
              HasSubstr("not a valid ONNX model"));
  EXPECT_THAT(import_fails(write("empty.onnx", "")), HasSubstr("the model has no graph"));
  // An initializer whose data does not fill its shape.
  onnx::ModelProto m = chain_model({int64_t{2}, int64_t{4}}, {});
  onnx::GraphProto* g = m.mutable_graph();
  auto* w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(4);
  w->add_dims(4);
  w->set_raw_data(std::string(10, '\0'));
  auto* n = g->add_node();
  n->set_op_type("MatMul");
  n->set_name("mm");
  n->add_input("x");
  n->add_input("w");
  n->add_output("y");
  EXPECT_THAT(import_fails(write("sizes.onnx", m)),
              HasSubstr("initializer 'w': raw data has 10 bytes, shape [4,4] of FLOAT needs 64"));
  // Absurd dims.
  w->clear_dims();
  w->add_dims(int64_t{1} << 40);
  w->add_dims(int64_t{1} << 40);
  EXPECT_THAT(import_fails(write("absurd.onnx", m)), HasSubstr("has more than 2^32 elements"));
}

TEST_F(ImportErrors, OpsetsOutsideThirteenToSeventeenAreRefused) {
  const std::string path =
      write("opset11.onnx", chain_model({int64_t{2}, int64_t{3}}, {{"Relu", "r"}}, 11));
  EXPECT_THAT(import_fails(path),
              HasSubstr("opset 11 is not supported: kiln imports opsets 13 to 17"));
}

TEST_F(ImportErrors, ANodeKilnCannotMapNamesItself) {
  // Softmax of a rank-2 input is fine; a Gather along axis 1 by run-time indices is not.
  onnx::ModelProto m = chain_model({int64_t{2}, int64_t{3}}, {});
  onnx::GraphProto* g = m.mutable_graph();
  auto* ids = g->add_input();
  ids->set_name("ids");
  auto* tt = ids->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::INT64);
  tt->mutable_shape()->add_dim()->set_dim_value(2);
  auto* n = g->add_node();
  n->set_op_type("Gather");
  n->set_name("/embed/Gather");
  n->add_input("x");
  n->add_input("ids");
  n->add_output("y");
  auto* a = n->add_attribute();
  a->set_name("axis");
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(1);
  EXPECT_THAT(import_fails(write("gather.onnx", m)),
              HasSubstr("node '/embed/Gather' (Gather, opset 17): Gather along axis 1 by run-time "
                        "indices is not supported (axis 0 only)"));
}

}  // namespace
}  // namespace kiln::testing
