// The runtime boundary of a compiled model (kiln/runtime.h): for every dtype an entry
// point takes or returns (f32, i64 with i32 accepted, bool), a call through the C ABI and
// through the generated class with a wrong dtype, a too-small buffer and a correct
// buffer. Every buffer sits between guard bytes: a refused call leaves every byte of
// every output as it was, a correct one writes exactly its result, which matches the
// reference interpreter. The suite runs this file under ASan as well (scripts/test.sh).
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "abi_dtypes.h"
#include "error_of.h"
#include "ir/interpreter.h"
#include "ir/parser.h"

namespace kiln {
namespace {

using testing::error_of;

constexpr uint8_t kPattern = 0xA5;  // what untouched memory holds
constexpr size_t kGuard = 64;       // guard bytes on each side of a buffer

// `bytes` usable bytes between two guards, all filled with kPattern.
struct Guarded {
  explicit Guarded(size_t bytes) : size(bytes), mem(bytes + 2 * kGuard, kPattern) {}
  uint8_t* data() { return mem.data() + kGuard; }
  // Every byte (guards and data) still holds the pattern.
  bool untouched() const {
    for (uint8_t b : mem)
      if (b != kPattern) return false;
    return true;
  }
  bool guards_intact() const {
    for (size_t i = 0; i < kGuard; ++i)
      if (mem[i] != kPattern || mem[kGuard + size + i] != kPattern) return false;
    return true;
  }
  template <typename T>
  std::vector<T> values() const {
    std::vector<T> v(size / sizeof(T));
    std::memcpy(v.data(), mem.data() + kGuard, size);
    return v;
  }
  size_t size;
  std::vector<uint8_t> mem;
};

ir::Module reference_module() {
  std::ifstream in(std::string(KILN_TEST_DATA_DIR) + "/abi/dtypes.kir");
  std::stringstream text;
  text << in.rdbuf();
  return ir::parse_and_verify(text.str(), "dtypes.kir");
}

// The inputs of every entry point, batch 2: x is f32, t i64, m bool.
const std::vector<int64_t> kShape = {2, 5};
const std::vector<float> kX = {1.5f, -2.f, 0.f, 3.25f, -0.5f, 7.f, -1.f, 2.5f, 0.25f, -4.f};
const std::vector<int64_t> kT = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
const std::vector<uint8_t> kM = {1, 0, 0, 1, 1, 0, 1, 0, 1, 1};

std::vector<ir::Tensor> reference(const std::string& function) {
  static const ir::Module m = reference_module();
  const ir::Function& f = *m.find_function(function);
  std::vector<ir::Tensor> inputs;
  for (ir::ValueId p : f.params) {
    const std::string& name = f.values[p].name;
    if (name == "x") inputs.push_back(ir::Tensor::from_f32(kShape, kX));
    if (name == "t") inputs.push_back(ir::Tensor::from_ints(ir::DType::i64, kShape, kT));
    if (name == "m")
      inputs.push_back(ir::Tensor::from_ints(ir::DType::boolean, kShape, {kM.begin(), kM.end()}));
  }
  return ir::interpret(m, f, {}, inputs);
}

kiln_tensor tensor(const char* name, int32_t dtype, const void* data, size_t capacity) {
  kiln_tensor t;
  std::memset(&t, 0, sizeof t);
  t.name = name;
  t.dtype = dtype;
  t.rank = 2;
  t.shape[0] = kShape[0];
  t.shape[1] = kShape[1];
  t.data = const_cast<void*>(data);
  t.capacity = capacity;
  return t;
}

// One result of an entry point: its name, dtype and the bytes it needs at batch 2.
struct Result {
  const char* name;
  int32_t dtype;
  size_t bytes;
};

size_t bytes_of(int32_t dtype) { return 10 * kiln_dtype_size(dtype); }

// A dtype the runtime must refuse in place of `dtype`.
int32_t other_dtype(int32_t dtype) { return dtype == KILN_F32 ? KILN_I64 : KILN_F32; }

class AbiTest : public ::testing::Test {
 protected:
  AbiTest() {
    char* error = nullptr;
    model_ = abi_dtypes_create(nullptr, &error);  // a model without weights needs no file
    EXPECT_NE(model_, nullptr) << (error ? error : "");
    kiln_free_error(error);
  }
  ~AbiTest() override { kiln_model_destroy(model_); }

  // The inputs of `function` as the C ABI takes them.
  std::vector<kiln_tensor> inputs(const std::string& function) const {
    std::vector<kiln_tensor> in;
    for (int i = 0; i < kiln_model_num_inputs(model_, function.c_str()); ++i) {
      const std::string name = kiln_model_input_name(model_, function.c_str(), i);
      if (name == "x") in.push_back(tensor("x", KILN_F32, kX.data(), bytes_of(KILN_F32)));
      if (name == "t") in.push_back(tensor("t", KILN_I64, kT.data(), bytes_of(KILN_I64)));
      if (name == "m") in.push_back(tensor("m", KILN_BOOL, kM.data(), bytes_of(KILN_BOOL)));
    }
    return in;
  }

  int run(const std::string& function, const std::vector<kiln_tensor>& in,
          std::vector<kiln_tensor>& out) {
    return kiln_model_run(model_, function.c_str(), in.data(), in.size(), out.data(), out.size());
  }

  // Fresh guarded buffers in `buffers`, one per result, and the kiln_tensors that point at
  // them with the right dtype and capacity (a test spoils one before the call).
  std::vector<kiln_tensor> outputs(const std::vector<Result>& results,
                                   std::vector<Guarded>& buffers) {
    buffers.clear();
    for (const Result& r : results) buffers.emplace_back(r.bytes);
    std::vector<kiln_tensor> out;
    for (size_t i = 0; i < results.size(); ++i)
      out.push_back(tensor(results[i].name, results[i].dtype, buffers[i].data(), results[i].bytes));
    return out;
  }

  kiln_model* model_ = nullptr;
};

// Every result of `function` matches the interpreter, element by element (elementwise
// kernels of these ops are exact).
void expect_matches_reference(const std::string& function, std::vector<Guarded>& buffers) {
  std::vector<ir::Tensor> want = reference(function);
  ASSERT_EQ(want.size(), buffers.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(buffers[i].guards_intact()) << function << " output " << i;
    switch (want[i].dtype) {
      case ir::DType::f32:
        EXPECT_EQ(buffers[i].values<float>(), want[i].f);
        break;
      case ir::DType::i64:
        EXPECT_EQ(buffers[i].values<int64_t>(), want[i].ints);
        break;
      default: {
        std::vector<uint8_t> got = buffers[i].values<uint8_t>();
        EXPECT_EQ(std::vector<int64_t>(got.begin(), got.end()), want[i].ints);
      }
    }
  }
}

const std::vector<std::pair<std::string, std::vector<Result>>>& entry_points() {
  static const std::vector<std::pair<std::string, std::vector<Result>>> all = {
      {"floats", {{"y", KILN_F32, 40}}},
      {"ids", {{"u", KILN_I64, 80}}},
      {"masks", {{"n", KILN_BOOL, 10}}},
      {"pair", {{"y", KILN_F32, 40}, {"z", KILN_F32, 40}}},
      {"mixed", {{"s", KILN_F32, 40}, {"i", KILN_I64, 80}, {"b", KILN_BOOL, 10}}},
  };
  return all;
}

// The dtypes output_shapes reports are the results' real ones.
TEST_F(AbiTest, OutputShapesReportEachResultsDtype) {
  for (const auto& [function, results] : entry_points()) {
    std::vector<kiln_tensor> in = inputs(function), out(results.size());
    ASSERT_EQ(kiln_model_output_shapes(model_, function.c_str(), in.data(), in.size(), out.data(),
                                       out.size()),
              0)
        << kiln_model_error(model_);
    for (size_t i = 0; i < results.size(); ++i) {
      EXPECT_STREQ(out[i].name, results[i].name);
      EXPECT_EQ(out[i].dtype, results[i].dtype) << function << " " << results[i].name;
      EXPECT_EQ(std::vector<int64_t>(out[i].shape, out[i].shape + out[i].rank), kShape);
    }
  }
}

// For each output of each entry point: a wrong dtype and a buffer one byte too small are
// refused, naming the output, and no byte of any output buffer changes; the correct
// buffers get exactly the interpreter's results.
TEST_F(AbiTest, OutputsOfEveryDtypeAreCheckedBeforeAnyWrite) {
  for (const auto& [function, results] : entry_points()) {
    const std::vector<kiln_tensor> in = inputs(function);
    std::vector<Guarded> buffers;
    for (size_t spoiled = 0; spoiled < results.size(); ++spoiled) {
      const Result& r = results[spoiled];
      SCOPED_TRACE(function + " output " + r.name);

      std::vector<kiln_tensor> out = outputs(results, buffers);
      out[spoiled].dtype = other_dtype(r.dtype);
      EXPECT_NE(run(function, in, out), 0);
      EXPECT_EQ(std::string(kiln_model_error(model_)),
                std::string("output '") + r.name + "' is " + dtype_name(r.dtype) +
                    ", given a buffer of " + dtype_name(other_dtype(r.dtype)));
      for (const Guarded& b : buffers) EXPECT_TRUE(b.untouched());

      out = outputs(results, buffers);
      out[spoiled].capacity = r.bytes - 1;
      EXPECT_NE(run(function, in, out), 0);
      EXPECT_EQ(std::string(kiln_model_error(model_)),
                std::string("output '") + r.name + "' of shape [2,5] needs " +
                    std::to_string(r.bytes) + " bytes of " + dtype_name(r.dtype) +
                    ", its buffer holds " + std::to_string(r.bytes - 1));
      for (const Guarded& b : buffers) EXPECT_TRUE(b.untouched());
    }
    std::vector<kiln_tensor> out = outputs(results, buffers);
    ASSERT_EQ(run(function, in, out), 0) << kiln_model_error(model_);
    expect_matches_reference(function, buffers);
  }
}

// Inputs of every dtype: a wrong dtype, a buffer smaller than its shape, and a bool that
// is not 0 or 1 are refused before any output is written.
TEST_F(AbiTest, InputsOfEveryDtypeAreCheckedBeforeAnyWrite) {
  const std::vector<Result>& results = entry_points().back().second;  // mixed
  struct Case {
    size_t input;
    int32_t dtype;
    size_t capacity;
    std::string error;
  };
  const std::vector<uint8_t> bad_mask = {1, 0, 2, 1, 1, 0, 1, 0, 1, 1};
  const std::vector<Case> cases = {
      {0, KILN_I64, 80, "input 'x' is i64, expected f32"},
      {0, KILN_F32, 39, "input 'x' of shape [2,5] needs 40 bytes of f32, its buffer holds 39"},
      {1, KILN_F32, 40, "input 't' is f32, expected i64 or i32"},
      {1, KILN_BOOL, 10, "input 't' is bool, expected i64 or i32"},
      {1, KILN_I64, 79, "input 't' of shape [2,5] needs 80 bytes of i64, its buffer holds 79"},
      {2, KILN_I64, 80, "input 'm' is i64, expected bool"},
      {2, KILN_BOOL, 9, "input 'm' of shape [2,5] needs 10 bytes of bool, its buffer holds 9"},
      {2, 7, 10, "input 'm' is an unknown dtype, expected bool"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.error);
    std::vector<kiln_tensor> in = inputs("mixed");
    in[c.input].dtype = c.dtype;
    in[c.input].capacity = c.capacity;
    std::vector<Guarded> buffers;
    std::vector<kiln_tensor> out = outputs(results, buffers);
    EXPECT_NE(run("mixed", in, out), 0);
    EXPECT_EQ(std::string(kiln_model_error(model_)), c.error);
    for (const Guarded& b : buffers) EXPECT_TRUE(b.untouched());
  }
  std::vector<kiln_tensor> in = inputs("mixed");
  in[2].data = const_cast<uint8_t*>(bad_mask.data());
  std::vector<Guarded> buffers;
  std::vector<kiln_tensor> out = outputs(results, buffers);
  EXPECT_NE(run("mixed", in, out), 0);
  EXPECT_EQ(std::string(kiln_model_error(model_)),
            "input 'm' holds 2 at element 2; bool elements must be 0 or 1");
  for (const Guarded& b : buffers) EXPECT_TRUE(b.untouched());
}

// A zero-length input (no elements, no data) is refused for its shape, not its data.
TEST_F(AbiTest, ZeroLengthInputNamesItsShape) {
  for (int64_t d : {0, 1}) {
    std::vector<kiln_tensor> in = inputs("floats");
    in[0].shape[d] = 0;
    in[0].data = nullptr;
    in[0].capacity = 0;
    std::vector<Guarded> buffers;
    std::vector<kiln_tensor> out = outputs(entry_points()[0].second, buffers);
    EXPECT_NE(run("floats", in, out), 0);
    EXPECT_EQ(std::string(kiln_model_error(model_)),
              d == 0 ? "input 'x' has shape [0,5]: dim 0 (B) is 0, expected at least 1"
                     : "input 'x' has shape [2,0]: dim 1 is 0, expected 5");
    for (const Guarded& b : buffers) EXPECT_TRUE(b.untouched());
  }
}

// Ids may come as i32: converted, with the same result as i64.
TEST_F(AbiTest, I32IdsAreAcceptedForI64Inputs) {
  const std::vector<int32_t> t32(kT.begin(), kT.end());
  std::vector<kiln_tensor> in = {tensor("t", KILN_I32, t32.data(), 40)};
  std::vector<Guarded> buffers;
  std::vector<kiln_tensor> out = outputs(entry_points()[1].second, buffers);
  ASSERT_EQ(run("ids", in, out), 0) << kiln_model_error(model_);
  expect_matches_reference("ids", buffers);
  in[0].capacity = 39;  // i32 needs 4 bytes an element, not 8
  out = outputs(entry_points()[1].second, buffers);
  EXPECT_NE(run("ids", in, out), 0);
  EXPECT_EQ(std::string(kiln_model_error(model_)),
            "input 't' of shape [2,5] needs 40 bytes of i32, its buffer holds 39");
  for (const Guarded& b : buffers) EXPECT_TRUE(b.untouched());
}

// NULL where a pointer is needed is an error, never a dereference.
TEST_F(AbiTest, NullArgumentsAreRefused) {
  std::vector<kiln_tensor> in = inputs("floats");
  std::vector<Guarded> buffers;
  std::vector<kiln_tensor> out = outputs(entry_points()[0].second, buffers);
  EXPECT_NE(kiln_model_run(nullptr, "floats", in.data(), 1, out.data(), 1), 0);
  EXPECT_STREQ(kiln_model_error(nullptr), "kiln: no model (NULL)");
  EXPECT_NE(kiln_model_run(model_, nullptr, in.data(), 1, out.data(), 1), 0);
  EXPECT_EQ(std::string(kiln_model_error(model_)),
            "model 'abi_dtypes': no entry point name given (NULL)");
  EXPECT_NE(kiln_model_run(model_, "floats", nullptr, 1, out.data(), 1), 0);
  EXPECT_EQ(std::string(kiln_model_error(model_)), "entry point 'floats': inputs is null");
  EXPECT_NE(kiln_model_run(model_, "floats", in.data(), 1, nullptr, 1), 0);
  EXPECT_EQ(std::string(kiln_model_error(model_)), "entry point 'floats': outputs is null");
  EXPECT_NE(kiln_model_output_shapes(model_, "floats", in.data(), 1, nullptr, 1), 0);
  EXPECT_EQ(std::string(kiln_model_error(model_)), "entry point 'floats': outputs is null");
  in[0].data = nullptr;
  EXPECT_NE(kiln_model_run(model_, "floats", in.data(), 1, out.data(), 1), 0);
  EXPECT_EQ(std::string(kiln_model_error(model_)), "input 'x' has no data");
  for (const Guarded& b : buffers) EXPECT_TRUE(b.untouched());
  EXPECT_EQ(kiln_model_num_inputs(nullptr, "floats"), -1);
  EXPECT_EQ(kiln_model_num_outputs(model_, nullptr), -1);
  EXPECT_EQ(kiln_model_input_name(nullptr, "floats", 0), nullptr);
  ASSERT_NE(kiln_model_functions(nullptr), nullptr);
  EXPECT_EQ(kiln_model_functions(nullptr)[0], nullptr);
}

// A CPU library has no device: no device interface, and device tensors (kiln_model_run_device,
// tests/device_test.cpp runs them on a GPU library) are an error naming the target, with nothing
// written.
TEST_F(AbiTest, DeviceTensorsAreRefusedByACpuLibrary) {
  EXPECT_EQ(kiln_model_device_interface(model_), nullptr);
  EXPECT_EQ(kiln_model_device_interface(nullptr), nullptr);
  std::vector<kiln_tensor> in = inputs("floats");
  std::vector<Guarded> buffers;
  std::vector<kiln_tensor> out = outputs(entry_points()[0].second, buffers);
  const std::string cpu = "model 'abi_dtypes' was compiled for the CPU (target ";
  const std::string need =
      "): device tensors for entry point 'floats' need a library compiled for a GPU target";
  EXPECT_NE(kiln_model_run_device(model_, "floats", in.data(), 1, out.data(), 1), 0);
  EXPECT_THAT(std::string(kiln_model_error(model_)), ::testing::StartsWith(cpu));
  EXPECT_THAT(std::string(kiln_model_error(model_)), ::testing::HasSubstr(need));
  EXPECT_NE(kiln_model_output_shapes_device(model_, "floats", in.data(), 1, out.data(), 1), 0);
  EXPECT_THAT(std::string(kiln_model_error(model_)), ::testing::HasSubstr(need));
  EXPECT_NE(kiln_model_run_device(nullptr, "floats", in.data(), 1, out.data(), 1), 0);
  for (const Guarded& b : buffers) EXPECT_TRUE(b.untouched());
  kiln_models::abi_dtypes model(nullptr);
  EXPECT_EQ(model.device_interface(), nullptr);
  try {
    model.run_device("floats", {}, {});
    ADD_FAILURE() << "a CPU library ran device tensors";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(std::string(e.what()), ::testing::HasSubstr(need));
  }
}

// The generated class returns each result as a Tensor of its real element type.
TEST(AbiClass, ReturnsTypedTensorsMatchingTheInterpreter) {
  kiln_models::abi_dtypes model(nullptr);
  const kiln::Tensor<float> x{kShape, kX};
  const kiln::Tensor<int64_t> t{kShape, kT};
  const kiln::Tensor<uint8_t> m{kShape, kM};
  static_assert(std::is_same_v<decltype(model.floats(x)), kiln::Tensor<float>>);
  static_assert(std::is_same_v<decltype(model.ids(t)), kiln::Tensor<int64_t>>);
  static_assert(std::is_same_v<decltype(model.masks(m)), kiln::Tensor<uint8_t>>);
  EXPECT_EQ(model.floats(x).data, reference("floats")[0].f);
  EXPECT_EQ(model.ids(t).data, reference("ids")[0].ints);
  const kiln::Tensor<uint8_t> n = model.masks(m);
  EXPECT_EQ(n.shape, kShape);
  EXPECT_EQ(std::vector<int64_t>(n.data.begin(), n.data.end()), reference("masks")[0].ints);
  auto [s, i, b] = model.mixed(x, t, m);
  std::vector<ir::Tensor> want = reference("mixed");
  EXPECT_EQ(s.data, want[0].f);
  EXPECT_EQ(i.data, want[1].ints);
  EXPECT_EQ(std::vector<int64_t>(b.data.begin(), b.data.end()), want[2].ints);
  const kiln::Tensor<int32_t> t32{kShape, {kT.begin(), kT.end()}};
  EXPECT_EQ(model.ids(t32).data, reference("ids")[0].ints);
}

// Through the class: an output tensor of the wrong element type, an input whose shape
// is larger than its data, and an input of the wrong dtype throw and leave every output
// tensor as it was.
TEST(AbiClass, WrongTensorsThrowAndLeaveOutputsUntouched) {
  kiln_models::abi_dtypes model(nullptr);
  const kiln::Tensor<float> x{kShape, kX};
  const kiln::Tensor<int64_t> t{kShape, kT};
  const kiln::Tensor<uint8_t> m{kShape, kM};
  const kiln::Tensor<float> f_before{{7}, std::vector<float>(7, -1.f)};
  const kiln::Tensor<int64_t> i_before{{3}, {1, 2, 3}};
  const kiln::Tensor<uint8_t> b_before{{2}, {9, 9}};
  kiln::Tensor<float> f = f_before;
  kiln::Tensor<int64_t> i = i_before;
  kiln::Tensor<uint8_t> b = b_before;
  auto expect_untouched = [&] {
    EXPECT_EQ(f.shape, f_before.shape);
    EXPECT_EQ(f.data, f_before.data);
    EXPECT_EQ(i.shape, i_before.shape);
    EXPECT_EQ(i.data, i_before.data);
    EXPECT_EQ(b.shape, b_before.shape);
    EXPECT_EQ(b.data, b_before.data);
  };
  EXPECT_EQ(error_of<std::exception>([&] { model.run("ids", {t}, {f}); }),
            "kiln: output 'u' of 'ids' is i64, given a f32 tensor");
  EXPECT_EQ(error_of<std::exception>([&] { model.run("floats", {x}, {b}); }),
            "kiln: output 'y' of 'floats' is f32, given a bool tensor");
  EXPECT_EQ(error_of<std::exception>([&] { model.run("masks", {m}, {i}); }),
            "kiln: output 'n' of 'masks' is bool, given a i64 tensor");
  // The third output's type is wrong: the first two are not touched either.
  EXPECT_EQ(error_of<std::exception>([&] {
              model.run("mixed", {x, t, m}, {f, i, i});
            }),
            "kiln: output 'b' of 'mixed' is bool, given a i64 tensor");
  expect_untouched();
  const kiln::Tensor<int64_t> short_t{kShape, {3, 1, 4, 1, 5, 9, 2}};  // 7 of 10 elements
  EXPECT_EQ(error_of<std::exception>([&] { model.ids(short_t, i); }),
            "input 't' of shape [2,5] needs 80 bytes of i64, its buffer holds 56");
  const kiln::Tensor<float> short_x{kShape, {1.f}};
  EXPECT_EQ(error_of<std::exception>([&] { model.mixed(short_x, t, m, f, i, b); }),
            "input 'x' of shape [2,5] needs 40 bytes of f32, its buffer holds 4");
  const kiln::Tensor<uint8_t> short_m{kShape, {}};
  EXPECT_EQ(error_of<std::exception>([&] { model.masks(short_m, b); }),
            "input 'm' of shape [2,5] needs 10 bytes of bool, its buffer holds 0");
  EXPECT_EQ(error_of<std::exception>([&] { model.masks(t, b); }),
            "input 'm' is i64, expected bool");
  EXPECT_EQ(error_of<std::exception>([&] { model.ids(x, i); }),
            "input 't' is f32, expected i64 or i32");
  expect_untouched();
  // The right tensors are filled, reshaped from what they held.
  model.mixed(x, t, m, f, i, b);
  std::vector<ir::Tensor> want = reference("mixed");
  EXPECT_EQ(f.shape, kShape);
  EXPECT_EQ(f.data, want[0].f);
  EXPECT_EQ(i.data, want[1].ints);
  EXPECT_EQ(std::vector<int64_t>(b.data.begin(), b.data.end()), want[2].ints);
}

// What kiln_model_run says of an output that shares bytes with an input or another output.
std::string overlap_error(const std::string& output, const char* what, const std::string& other,
                          size_t out_from, size_t out_to, size_t other_from, size_t other_to) {
  return "output '" + output + "' overlaps " + what + " '" + other + "' (its bytes [" +
         std::to_string(out_from) + ", " + std::to_string(out_to) + ") are bytes [" +
         std::to_string(other_from) + ", " + std::to_string(other_to) + ") of '" + other +
         "'): an output must not share memory with an input or another output (a cache " +
         "updated in place is the one exception)";
}

// A generated family of placements: every input and output of every entry point at random
// offsets (aligned to its element) in one guarded block, ids as i64 or i32. Where an output
// shares a byte with an input or an earlier output, the call is refused naming the first such
// pair (outputs in order, each against the inputs in order, then the earlier outputs) and the
// bytes they share, and no byte of the block changes; where none does (tensors may touch), the
// call runs and writes exactly the interpreter's results into exactly the outputs' bytes.
TEST_F(AbiTest, OutputsOverlappingInputsOrEachOtherAreRefused) {
  std::mt19937 rng(25);
  int refused = 0, ran = 0, partial = 0;
  const std::vector<int32_t> t32(kT.begin(), kT.end());
  for (const auto& [function, results] : entry_points()) {
    const std::vector<kiln_tensor> proto = inputs(function);
    for (int sample = 0; sample < 300; ++sample) {
      std::vector<kiln_tensor> in = proto;
      for (kiln_tensor& t : in)
        if (t.dtype == KILN_I64 && rng() % 2) t = tensor("t", KILN_I32, t32.data(), 40);
      struct Placed {
        std::string name;
        size_t bytes, at;
      };
      std::vector<Placed> placed;  // inputs, then outputs
      size_t total = 0;
      for (const kiln_tensor& t : in) {
        placed.push_back({t.name, t.capacity, 0});
        total += t.capacity;
      }
      for (const Result& r : results) {
        placed.push_back({r.name, r.bytes, 0});
        total += r.bytes;
      }
      const size_t block = (total * 3 / 2 + 7) / 8 * 8;
      for (size_t i = 0; i < placed.size(); ++i) {
        const size_t align = i < in.size() ? kiln_dtype_size(in[i].dtype)
                                           : kiln_dtype_size(results[i - in.size()].dtype);
        placed[i].at = rng() % ((block - placed[i].bytes) / align + 1) * align;
      }
      auto overlap = [&](size_t a, size_t b) {
        return placed[a].at < placed[b].at + placed[b].bytes &&
               placed[b].at < placed[a].at + placed[a].bytes;
      };
      bool inputs_overlap = false;  // allowed, but their values would clash here
      for (size_t a = 0; a < in.size(); ++a)
        for (size_t b = 0; b < a; ++b) inputs_overlap = inputs_overlap || overlap(a, b);
      if (inputs_overlap) continue;
      std::string want;
      for (size_t r = in.size(); r < placed.size() && want.empty(); ++r)
        for (size_t o = 0; o < r && want.empty(); ++o)
          if (overlap(r, o)) {
            const size_t lo = std::max(placed[r].at, placed[o].at),
                         hi = std::min(placed[r].at + placed[r].bytes,
                                       placed[o].at + placed[o].bytes);
            want = overlap_error(placed[r].name, o < in.size() ? "input" : "output", placed[o].name,
                                 lo - placed[r].at, hi - placed[r].at, lo - placed[o].at,
                                 hi - placed[o].at);
            partial += hi - lo < placed[r].bytes || hi - lo < placed[o].bytes;
          }
      Guarded mem(block);
      for (size_t i = 0; i < in.size(); ++i) {
        std::memcpy(mem.data() + placed[i].at, in[i].data, in[i].capacity);
        in[i].data = mem.data() + placed[i].at;
      }
      std::vector<kiln_tensor> out;
      for (size_t r = 0; r < results.size(); ++r) {
        const Placed& p = placed[in.size() + r];
        out.push_back(tensor(results[r].name, results[r].dtype, mem.data() + p.at, p.bytes));
      }
      const std::vector<uint8_t> before = mem.mem;
      SCOPED_TRACE(function + " sample " + std::to_string(sample));
      if (!want.empty()) {
        EXPECT_NE(run(function, in, out), 0);
        EXPECT_EQ(std::string(kiln_model_error(model_)), want);
        EXPECT_EQ(mem.mem, before) << "a refused call wrote";
        ++refused;
        continue;
      }
      ASSERT_EQ(run(function, in, out), 0) << kiln_model_error(model_);
      ++ran;
      std::vector<uint8_t> expected = before;
      const std::vector<ir::Tensor> ref = reference(function);
      for (size_t r = 0; r < results.size(); ++r) {
        const Placed& p = placed[in.size() + r];
        std::vector<uint8_t> bytes(p.bytes);
        if (ref[r].dtype == ir::DType::f32) {
          std::memcpy(bytes.data(), ref[r].f.data(), p.bytes);
        } else if (ref[r].dtype == ir::DType::i64) {
          std::memcpy(bytes.data(), ref[r].ints.data(), p.bytes);
        } else {
          for (size_t e = 0; e < p.bytes; ++e) bytes[e] = static_cast<uint8_t>(ref[r].ints[e]);
        }
        std::copy(bytes.begin(), bytes.end(), expected.begin() + kGuard + p.at);
      }
      EXPECT_EQ(mem.mem, expected) << "results, or bytes outside them";
    }
  }
  std::printf("[ alias ] %d placements refused (%d partial overlaps), %d disjoint ones ran\n",
              refused, partial, ran);
  EXPECT_GE(refused, 300);
  EXPECT_GE(partial, 100);
  EXPECT_GE(ran, 100);
}

// The C++ API: an output tensor that is an input (`model.floats(x, x)`), holds an input's
// memory at any offset (an Input viewing part of it), or is given twice, throws before that
// tensor changes. Reshaping such an output would free or move the input's storage under the
// call (ASan's stage runs this): a generated family of storage sizes, offsets, element types
// and entry points, with random 0/1 bytes (valid for every dtype's checks).
TEST(AbiClass, AnOutputSharingAnInputsMemoryThrowsBeforeItIsTouched) {
  kiln_models::abi_dtypes model(nullptr);
  std::mt19937 rng(2500);
  const std::string not_shared =
      "'): an output must not share memory with an input or another output (a cache updated in "
      "place is the one exception)";
  int by_wrapper = 0, by_runtime = 0;
  for (int sample = 0; sample < 400; ++sample) {
    SCOPED_TRACE("sample " + std::to_string(sample));
    // The output tensor (the storage) and the input viewing it, of any element types.
    const int out_kind = static_cast<int>(rng() % 3), in_kind = static_cast<int>(rng() % 3);
    const size_t out_elem = out_kind == 0 ? 4 : out_kind == 1 ? 8 : 1;
    const int32_t in_dtype = in_kind == 0 ? KILN_F32 : in_kind == 1 ? KILN_I64 : KILN_BOOL;
    const size_t in_bytes = 10 * kiln_dtype_size(in_dtype);
    const size_t elements = (in_bytes + out_elem - 1) / out_elem + (rng() % 4 ? rng() % 12 : 0);
    std::vector<uint8_t> bytes(elements * out_elem);
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng() % 2);
    const size_t offset = rng() % ((bytes.size() - in_bytes) / kiln_dtype_size(in_dtype) + 1) *
                          kiln_dtype_size(in_dtype);
    std::vector<int64_t> shape = {static_cast<int64_t>(elements)};
    if (elements == 10 && rng() % 2) shape = kShape;
    kiln::Tensor<float> f;
    kiln::Tensor<int64_t> i;
    kiln::Tensor<uint8_t> b;
    // The storage (the output of kind out_kind) holds `bytes`; the other two stay empty.
    auto fill = [&](auto& t) {
      t.shape = shape;
      t.data.resize(elements);
      std::memcpy(t.data.data(), bytes.data(), bytes.size());
      return static_cast<const void*>(t.data.data());
    };
    const void* storage = out_kind == 0 ? fill(f) : out_kind == 1 ? fill(i) : fill(b);
    auto storage_intact = [&] {
      auto same = [&](const auto& t) {
        return t.shape == shape && t.data.size() == elements &&
               std::memcmp(t.data.data(), bytes.data(), bytes.size()) == 0;
      };
      return out_kind == 0 ? same(f) : out_kind == 1 ? same(i) : same(b);
    };
    const kiln::Input view(static_cast<const uint8_t*>(storage) + offset, in_dtype, kShape,
                           in_bytes);
    const char* in_name = in_kind == 0 ? "x" : in_kind == 1 ? "t" : "m";
    const char* out_name = out_kind == 0 ? "s" : out_kind == 1 ? "i" : "b";
    // The other inputs and outputs, apart.
    const kiln::Tensor<float> x{kShape, std::vector<float>(10, 1.f)};
    const kiln::Tensor<int64_t> t{kShape, std::vector<int64_t>(10, 1)};
    const kiln::Tensor<uint8_t> m{kShape, std::vector<uint8_t>(10, 1)};
    kiln::Tensor<float> f2;
    kiln::Tensor<int64_t> i2;
    kiln::Tensor<uint8_t> b2;
    std::vector<kiln::Input> ins = {x, t, m};
    ins[static_cast<size_t>(in_kind)] = view;
    std::vector<kiln::Output> outs = {out_kind == 0 ? kiln::Output(f) : kiln::Output(f2),
                                      out_kind == 1 ? kiln::Output(i) : kiln::Output(i2),
                                      out_kind == 2 ? kiln::Output(b) : kiln::Output(b2)};
    // Left as it is only where it is exactly the input and already of the result's shape:
    // then the runtime refuses it, naming the bytes.
    const bool exact = offset == 0 && shape == kShape;
    const std::string shared = std::to_string(std::min(in_bytes, out_elem * 10));
    const std::string want =
        exact
            ? "output '" + std::string(out_name) + "' overlaps input '" + in_name +
                  "' (its bytes [0, " + shared + ") are bytes [0, " + shared + ") of '" + in_name +
                  not_shared
            : "kiln: output '" + std::string(out_name) + "' of 'mixed' shares memory with input '" +
                  in_name + "': pass a separate tensor (an output is written while the inputs " +
                  "are read)";
    EXPECT_EQ(error_of<std::exception>([&] { model.run("mixed", ins, outs); }), want);
    (exact ? by_runtime : by_wrapper) += 1;
    EXPECT_TRUE(storage_intact()) << "the shared tensor changed";
    // The wrapper refuses before binding any output; the runtime's refusal comes after the
    // others were reshaped (as for any error the runtime finds), never written.
    if (!exact) EXPECT_TRUE(f2.data.empty() && i2.data.empty() && b2.data.empty());
  }
  std::printf("[ alias ] C++ API: %d refused by the wrapper, %d by the runtime\n", by_wrapper,
              by_runtime);
  EXPECT_GE(by_wrapper, 300);
  EXPECT_GE(by_runtime, 8);
  // model.floats(x, x) and model.ids(t, t): the same tensor in and out.
  kiln::Tensor<float> x{kShape, kX};
  EXPECT_EQ(
      error_of<std::exception>([&] { model.floats(x, x); }),
      "output 'y' overlaps input 'x' (its bytes [0, 40) are bytes [0, 40) of 'x" + not_shared);
  EXPECT_EQ(x.data, kX);
  kiln::Tensor<int64_t> t{kShape, kT};
  EXPECT_EQ(
      error_of<std::exception>([&] { model.ids(t, t); }),
      "output 'u' overlaps input 't' (its bytes [0, 80) are bytes [0, 80) of 't" + not_shared);
  EXPECT_EQ(t.data, kT);
  // The same tensor for two outputs, of any shape it held (reshaping it for the second would
  // free the first's memory).
  for (size_t held : {0, 3, 10, 40}) {
    kiln::Tensor<float> y{{static_cast<int64_t>(held)}, std::vector<float>(held, 2.f)};
    const kiln::Tensor<float> y_before = y;
    EXPECT_EQ(error_of<std::exception>([&] { model.pair(x, y, y); }),
              "kiln: outputs 'y' and 'z' of 'pair' are the same tensor: pass a tensor for each");
    EXPECT_EQ(y.shape, y_before.shape);
    EXPECT_EQ(y.data, y_before.data);
  }
  // Apart, they run.
  kiln::Tensor<float> y, z;
  model.pair(x, y, z);
  EXPECT_EQ(y.data, reference("pair")[0].f);
  EXPECT_EQ(z.data, reference("pair")[1].f);
}

}  // namespace
}  // namespace kiln
