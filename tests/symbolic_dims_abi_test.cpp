// Symbolic sizes through a library that `kiln compile` wrote (tests/abi/symdims.kir): the
// output shapes the runtime reports (kiln_model_output_shapes) for T+1 and 8*T at lengths 1, 7
// and 33, the results against the interpreter, the header's entry-point comments and maxima
// (a derived symbol such as T+1 is no constant of the generated class), and the errors for
// inputs whose sizes no T gives.
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ir/interpreter.h"
#include "ir/parser.h"
#include "symdims.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class SymbolicDimsLibrary : public ::testing::Test {
 protected:
  void SetUp() override {
    char* error = nullptr;
    model_ = symdims_create(nullptr, &error);  // no weights
    ASSERT_NE(model_, nullptr) << (error ? error : "");
  }
  void TearDown() override { kiln_model_destroy(model_); }

  static kiln_tensor f32(std::vector<float>& data, std::vector<int64_t> shape) {
    kiln_tensor t{};
    t.dtype = KILN_F32;
    t.rank = static_cast<int32_t>(shape.size());
    for (size_t d = 0; d < shape.size(); ++d) t.shape[d] = shape[d];
    t.data = data.data();
    t.capacity = data.size() * 4;
    return t;
  }
  static std::vector<int64_t> shape_of(const kiln_tensor& t) {
    return std::vector<int64_t>(t.shape, t.shape + t.rank);
  }

  // Runs `function` on f32 inputs; returns its outputs, shaped as the runtime reported.
  std::vector<ir::Tensor> run(const char* function, std::vector<ir::Tensor> inputs) {
    std::vector<kiln_tensor> in;
    for (ir::Tensor& t : inputs) in.push_back(f32(t.f, t.shape));
    std::vector<kiln_tensor> out(static_cast<size_t>(kiln_model_num_outputs(model_, function)));
    if (kiln_model_output_shapes(model_, function, in.data(), in.size(), out.data(), out.size()))
      throw std::runtime_error(kiln_model_error(model_));
    std::vector<std::vector<float>> storage;
    for (kiln_tensor& o : out) {
      size_t n = 1;
      for (int32_t d = 0; d < o.rank; ++d) n *= static_cast<size_t>(o.shape[d]);
      storage.emplace_back(n);
      o.data = storage.back().data();
      o.capacity = n * 4;
    }
    if (kiln_model_run(model_, function, in.data(), in.size(), out.data(), out.size()))
      throw std::runtime_error(kiln_model_error(model_));
    std::vector<ir::Tensor> results;
    for (size_t i = 0; i < out.size(); ++i)
      results.push_back(ir::Tensor::from_f32(shape_of(out[i]), storage[i]));
    return results;
  }

  kiln_model* model_ = nullptr;
};

ir::Tensor iota_tensor(std::vector<int64_t> shape, float scale) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * static_cast<float>(i % 17) - 3.0f;
  return ir::Tensor::from_f32(std::move(shape), std::move(v));
}

TEST_F(SymbolicDimsLibrary, OutputShapesAndResultsAtEveryLength) {
  const ir::Module m =
      ir::parse_and_verify(read(std::string(KILN_TEST_DATA_DIR) + "/abi/symdims.kir"));
  for (auto [b, t] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {2, 33}}) {
    const std::vector<ir::Tensor> x = {iota_tensor({b, t, 8}, 0.5f)};
    std::vector<ir::Tensor> got = run("prepend", x);
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[0].shape, (std::vector<int64_t>{b, t + 1, 8}));
    EXPECT_EQ(got[1].shape, (std::vector<int64_t>{b, 8 * t}));
    std::vector<ir::Tensor> want = ir::interpret(m, *m.find_function("prepend"), {}, x);
    EXPECT_EQ(got[0].f, want[0].f) << "T = " << t;
    EXPECT_EQ(got[1].f, want[1].f) << "T = " << t;

    const std::vector<ir::Tensor> yz = {iota_tensor({b, t + 1, 8}, 0.25f),
                                        iota_tensor({b, 8 * t}, 1.0f)};
    got = run("drop", yz);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].shape, (std::vector<int64_t>{b, t, 8}));
    want = ir::interpret(m, *m.find_function("drop"), {}, yz);
    EXPECT_EQ(got[0].f, want[0].f) << "T = " << t;
  }
}

TEST_F(SymbolicDimsLibrary, InputsThatNoLengthGivesAreRefused) {
  auto error = [&](std::vector<ir::Tensor> in) {
    try {
      run("drop", std::move(in));
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error({iota_tensor({2, 6, 8}, 1), iota_tensor({2, 32}, 1)}),
            "input 'y' gives T+1 = 6, but input 'z' gives T = 4");
  EXPECT_EQ(error({iota_tensor({2, 6, 8}, 1), iota_tensor({2, 36}, 1)}),
            "input 'z' has shape [2,36]: dim 1 (8*T) is 36, expected a multiple of 8");
  EXPECT_EQ(error({iota_tensor({2, 35, 8}, 1), iota_tensor({2, 40}, 1)}),
            "input 'y' has shape [2,35,8]: dim 1 (T+1) is 35, above its maximum 34");
  EXPECT_EQ(error({iota_tensor({2, 1, 8}, 1), iota_tensor({2, 40}, 1)}),
            "input 'y' has shape [2,1,8]: dim 1 (T+1) is 1, expected at least 2");
  EXPECT_EQ(error({iota_tensor({2, 6, 8}, 1), iota_tensor({2, 272}, 1)}),
            "input 'z' has shape [2,272]: dim 1 (8*T) is 272, above its maximum 264");
}

// The header names the dims as the IR writes them and declares only the model's symbols.
TEST(SymbolicDimsHeader, NamesAffineDimsAndDeclaresOnlyModelSymbols) {
  const std::string header = read(std::string(KILN_BINARY_DIR) + "/tests/symdims.kiln/symdims.h");
  EXPECT_THAT(header,
              HasSubstr("//   prepend(x: f32[B,T,8]) -> (y: f32[B,T+1,8], f: f32[B,8*T])\n"));
  EXPECT_THAT(header, HasSubstr("//   drop(y: f32[B,T+1,8], z: f32[B,8*T]) -> (d: f32[B,T,8])\n"));
  EXPECT_THAT(header, HasSubstr("// Maxima: B <= 3 T <= 33\n"));
  EXPECT_EQ(kiln_models::symdims::max_T, 33);
  char* error = nullptr;
  kiln_model* m = symdims_create(nullptr, &error);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(kiln_model_symbol_max(m, "T"), 33);
  EXPECT_EQ(kiln_model_symbol_max(m, "T+1"), -1);  // derived, not the model's
  kiln_model_destroy(m);
}

}  // namespace
}  // namespace kiln
