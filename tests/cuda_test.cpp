// The CUDA build: tests/gpu/norms.kir, linears.kir, attention.kir, general.kir and
// step_attention.kir compiled for host-cuda-cuda_capability_86 (kiln_add_model ... TARGET
// host-cuda-cuda_capability_86, the highest capability Halide 14 accepts; the driver JIT-compiles
// its PTX for newer GPUs). This binary links no Halide, as gpu_tests. It checks
//   - that every kernel's object in each static library carries PTX for sm_86;
//   - without a CUDA driver (no libcuda.so.1 / libcuda.so): a call is a non-zero status and
//     a message naming the missing driver, through the C ABI and the C++ API, and the model
//     stays usable (never a crash or an abort);
//   - with a CUDA device: every entry point against the reference interpreter, on random
//     inputs of odd sizes. Without a driver (or device) these report "skipped: no CUDA
//     driver" (GTEST_SKIP; ctest counts them as skipped, not passed).
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "cuda_attention.h"
#include "cuda_base.h"
#include "cuda_general.h"
#include "cuda_linears.h"
#include "cuda_norms.h"
#include "cuda_step_attention.h"
#include "device_harness.h"
#include "ir/interpreter.h"
#include "ir/parser.h"
#include "runtime/safetensors.h"

namespace kiln {
namespace {

// Why CUDA cannot run here ("" where a device is usable): the driver library is loaded as
// the generated glue loads it, then asked for devices (cuInit, cuDeviceGetCount).
std::string cuda_unavailable() {
  void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (!lib) lib = dlopen("libcuda.so", RTLD_LAZY | RTLD_LOCAL);
  if (!lib) return "no CUDA driver";
  using Init = int (*)(unsigned);
  using Count = int (*)(int*);
  auto init = reinterpret_cast<Init>(dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<Count>(dlsym(lib, "cuDeviceGetCount"));
  int n = 0;
  if (!init || !count || init(0) != 0 || count(&n) != 0 || n < 1) return "no CUDA device";
  return "";
}

bool cuda_driver_present() {
  for (const char* name : {"libcuda.so.1", "libcuda.so"})
    if (void* lib = dlopen(name, RTLD_LAZY | RTLD_LOCAL)) {
      dlclose(lib);
      return true;
    }
  return false;
}

#define SKIP_WITHOUT_CUDA()                                                    \
  do {                                                                         \
    if (const std::string why = cuda_unavailable(); !why.empty())              \
      GTEST_SKIP() << "skipped: " << why << " (the CUDA build runs on a GPU)"; \
  } while (0)

// The members of a static library (the System V / GNU `ar` format, with its table of long
// names), by name.
std::vector<std::pair<std::string, std::string>> archive_members(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream all;
  all << in.rdbuf();
  const std::string data = all.str();
  if (data.compare(0, 8, "!<arch>\n") != 0) throw std::runtime_error(path + " is not an archive");
  std::vector<std::pair<std::string, std::string>> members;
  std::string long_names;
  for (size_t pos = 8; pos + 60 <= data.size();) {
    const std::string header = data.substr(pos, 60);
    std::string name = header.substr(0, 16);
    const size_t size = std::stoull(header.substr(48, 10));
    if (pos + 60 + size > data.size()) throw std::runtime_error(path + ": a truncated member");
    std::string body = data.substr(pos + 60, size);
    pos += 60 + size + (size % 2);
    name.erase(name.find_last_not_of(' ') + 1);
    if (name == "/" || name == "/SYM64/") continue;  // the symbol table
    if (name == "//") {
      long_names = body;
      continue;
    }
    if (name.size() > 1 && name[0] == '/') {  // "/offset" into the long names
      const size_t offset = std::stoull(name.substr(1));
      name = long_names.substr(offset, long_names.find('\n', offset) - offset);
    }
    if (!name.empty() && name.back() == '/') name.pop_back();
    members.emplace_back(name, std::move(body));
  }
  return members;
}

size_t count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + 1))
    ++n;
  return n;
}

// Each kernel's object (<model>_kiln_*.o: one Halide pipeline per kernel) embeds one PTX
// module for sm_86 with at least one entry; the glue and Halide's runtime none.
TEST(CudaBuild, EveryKernelObjectCarriesPtxForSm86) {
  for (const std::string model : {"cuda_norms", "cuda_linears", "cuda_attention", "cuda_general",
                                  "cuda_step_attention", "cuda_base"}) {
    const std::string path =
        std::string(KILN_CUDA_TEST_DIR) + "/" + model + ".kiln/lib" + model + ".a";
    const auto members = archive_members(path);
    int kernels = 0;
    bool runtime = false, glue = false;
    for (const auto& [name, body] : members) {
      if (name.rfind(model + "_kiln_", 0) == 0) {
        ++kernels;
        EXPECT_EQ(count(body, ".target sm_86"), 1u) << path << ": " << name;
        EXPECT_GE(count(body, ".entry "), 1u) << path << ": " << name;
        EXPECT_EQ(count(body, ".target sm_"), 1u) << path << ": " << name << ": another target";
      } else {
        runtime |= name == "halide_runtime.o";
        glue |= name == model + "_glue.o";
        EXPECT_EQ(count(body, ".target sm_"), 0u) << path << ": " << name;
      }
    }
    EXPECT_GE(kernels, 4) << path;
    EXPECT_TRUE(runtime) << path << ": no halide_runtime.o";
    EXPECT_TRUE(glue) << path << ": no glue";
  }
}

using testing::create_model;
using testing::input_views;
using testing::max_error;
using testing::ModelPtr;
using testing::random_inputs;
ir::Module read_module(const std::string& file) { return testing::read_gpu_kir(file); }

// Within the CPU kernels' tolerance (1e-5 on unit-scale data).
constexpr double kTolerance = 1e-5;

// Without a driver: creating the model succeeds (nothing touches the device before a kernel
// runs), and every call returns a non-zero status with a message naming the missing driver;
// a second call says the same (the model stays usable).
TEST(CudaNoDriver, RunIsAnErrorNamingTheDriver) {
  if (cuda_driver_present()) GTEST_SKIP() << "a CUDA driver is present";
  const ir::Module m = read_module("norms.kir");
  ModelPtr model = create_model(cuda_norms_create);
  ASSERT_NE(model, nullptr);
  const std::vector<ir::Tensor> inputs = random_inputs(m, "norm7", {{"R", 2}}, 1);
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<kiln_tensor> in = input_views(inputs, &bytes);
  std::vector<float> out(14, 0.5f);
  kiln_tensor o{};
  o.dtype = KILN_F32;
  o.rank = 2;
  o.shape[0] = 2;
  o.shape[1] = 7;
  o.data = out.data();
  o.capacity = out.size() * 4;
  for (int attempt = 0; attempt < 2; ++attempt) {
    EXPECT_NE(kiln_model_run(model.get(), "norm7", in.data(), in.size(), &o, 1), 0);
    const std::string error = kiln_model_error(model.get());
    EXPECT_NE(error.find("no CUDA driver (libcuda.so.1 not found: libcuda.so.1"), std::string::npos)
        << error;  // dlerror's text after it
    EXPECT_NE(error.find("failed with status"), std::string::npos) << error;
  }
  // The other libraries (and entry points with several kernels) say the same.
  ModelPtr attention = create_model(cuda_attention_create);
  ASSERT_NE(attention, nullptr);
  const ir::Module am = read_module("attention.kir");
  const std::vector<ir::Tensor> ain =
      random_inputs(am, "causal", {{"B", 1}, {"S", 3}, {"T", 3}, {"V", 2}}, 2);
  std::vector<kiln_tensor> av = input_views(ain, &bytes);
  kiln_tensor ao[1] = {};
  ASSERT_EQ(kiln_model_output_shapes(attention.get(), "causal", av.data(), av.size(), ao, 1), 0)
      << kiln_model_error(attention.get());
  std::vector<float> aout(static_cast<size_t>(ao[0].shape[0] * ao[0].shape[1] * ao[0].shape[2]));
  ao[0].data = aout.data();
  ao[0].capacity = aout.size() * 4;
  EXPECT_NE(kiln_model_run(attention.get(), "causal", av.data(), av.size(), ao, 1), 0);
  EXPECT_NE(std::string(kiln_model_error(attention.get())).find("no CUDA driver"),
            std::string::npos)
      << kiln_model_error(attention.get());
}

// The generated C++ class: the call throws std::runtime_error with the same message.
TEST(CudaNoDriver, CppApiThrowsNamingTheDriver) {
  if (cuda_driver_present()) GTEST_SKIP() << "a CUDA driver is present";
  kiln_models::cuda_norms model(nullptr);
  kiln::Tensor<float> x{{3, 7}, std::vector<float>(21, 0.25f)};
  kiln::Tensor<float> g{{7}, std::vector<float>(7, 1.0f)};
  kiln::Tensor<float> b{{7}, std::vector<float>(7, 0.0f)};
  std::string message;
  try {
    model.norm7(x, g, b);
  } catch (const std::runtime_error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("no CUDA driver (libcuda.so.1 not found"), std::string::npos)
      << "message: '" << message << "'";
}

TEST(CudaRun, NormsElementwiseAndGather) {
  SKIP_WITHOUT_CUDA();
  const ir::Module m = read_module("norms.kir");
  ModelPtr model = create_model(cuda_norms_create);
  ASSERT_NE(model, nullptr);
  for (int64_t rows : {1, 7, 33, 129})
    for (const char* f : {"norm7", "norm129", "chain"})
      EXPECT_LE(max_error(model.get(), m, f, random_inputs(m, f, {{"R", rows}}, 3 + rows)),
                kTolerance)
          << f << " with " << rows << " rows";
  for (auto [b, s] : {std::pair<int64_t, int64_t>{1, 1}, {1, 7}, {3, 33}, {2, 5}}) {
    for (const char* f : {"residual", "positions"})
      EXPECT_LE(max_error(model.get(), m, f, random_inputs(m, f, {{"B", b}, {"S", s}}, 5 + b * s)),
                kTolerance)
          << f << " with B=" << b << " S=" << s;
    EXPECT_LE(max_error(model.get(), m, "lookup",
                        random_inputs(m, "lookup", {{"B", b}, {"S", s}, {"V", 9}}, 13)),
              0.0)
        << "lookup with B=" << b << " S=" << s;
  }
}

TEST(CudaRun, Linear) {
  SKIP_WITHOUT_CUDA();
  const ir::Module m = read_module("linears.kir");
  const std::string path = std::string(KILN_CUDA_TEST_DIR) + "/cuda_linears.weights.safetensors";
  const ir::WeightMap weights = testing::write_random_weights(m, 17, path);
  ModelPtr model = create_model(cuda_linears_create, path.c_str());
  ASSERT_NE(model, nullptr);
  for (int64_t rows : {1, 7, 33, 129})
    for (const char* f : {"k7_n5", "k33_n70_relu", "k64_n64_gelu", "k129_n128"})
      EXPECT_LE(
          max_error(model.get(), m, f, random_inputs(m, f, {{"M", rows}}, 21 + rows), weights),
          kTolerance)
          << f << " with " << rows << " rows";
}

// Every attention variant at lengths 1, 7 and 33, batches 1 and 3, random padding; batch
// row 0's keys all padded in the fill_inf cases (NaN rows, as the interpreter's).
TEST(CudaRun, Attention) {
  SKIP_WITHOUT_CUDA();
  const ir::Module m = read_module("attention.kir");
  ModelPtr model = create_model(cuda_attention_create);
  ASSERT_NE(model, nullptr);
  uint32_t seed = 31;
  for (const std::string f :
       {"self_kpad", "causal_kpad", "causal", "qpad", "fill_inf", "fill_inf_kpad", "cross"}) {
    const bool fill_inf = f.rfind("fill_inf", 0) == 0;
    for (int64_t b : {1, 3})
      for (int64_t s : {1, 7, 33})
        for (int64_t t : {1, 7, 33}) {
          if (t != s && f != "qpad" && f != "cross") continue;
          std::vector<ir::Tensor> inputs =
              random_inputs(m, f, {{"B", b}, {"S", s}, {"T", t}, {"V", 2}}, ++seed);
          if (fill_inf)
            for (int64_t j = 0; j < s; ++j) inputs[3].ints[static_cast<size_t>(j)] = 1;
          EXPECT_LE(max_error(model.get(), m, f, inputs), kTolerance)
              << f << " with B=" << b << " S=" << s << " T=" << t;
        }
  }
}

// The general kernels (tests/gpu/general.kir: softmax, reductions, argmax, matmuls) at rows and
// columns of 1, 7, 33, 129 and 300, as GpuOpenCLGeneral runs them on pocl; argmax on values in
// steps of 1/4 (ties).
TEST(CudaRun, General) {
  SKIP_WITHOUT_CUDA();
  const ir::Module m = read_module("general.kir");
  ModelPtr model = create_model(cuda_general_create);
  ASSERT_NE(model, nullptr);
  const std::vector<std::map<std::string, int64_t>> sizes = {
      {{"B", 1}, {"R", 1}, {"C", 1}, {"V", 1000}},
      {{"B", 3}, {"R", 7}, {"C", 33}, {"V", 1000}},
      {{"B", 2}, {"R", 33}, {"C", 7}, {"V", 1000}},
      {{"B", 1}, {"R", 129}, {"C", 129}, {"V", 1000}},
      {{"B", 2}, {"R", 7}, {"C", 300}, {"V", 1000}},
      {{"B", 3}, {"R", 129}, {"C", 300}, {"V", 1000}}};
  uint32_t seed = 70;
  for (const char* f : {"softmax", "reduce", "argmax", "reduce_i64", "matmul", "linear"})
    for (const auto& s : sizes) {
      std::vector<ir::Tensor> inputs = random_inputs(m, f, s, ++seed);
      if (std::string(f) == "argmax")
        for (float& v : inputs[0].f) v = std::round(v * 4) / 4;
      EXPECT_LE(max_error(model.get(), m, f, inputs), kTolerance)
          << f << " with B=" << s.at("B") << " R=" << s.at("R") << " C=" << s.at("C");
    }
}

// Single-query decoding attention at 1, 7, 33 and 129 keys and 1, 4 and 9 hypotheses, random
// cache slots and source sentences, random key padding with sentence 0 wholly padded and read by
// hypothesis 0 (as gpu_test.cpp's GpuOpenCL.StepAttention).
TEST(CudaRun, StepAttention) {
  SKIP_WITHOUT_CUDA();
  const ir::Module m = read_module("step_attention.kir");
  ModelPtr model = create_model(cuda_step_attention_create);
  ASSERT_NE(model, nullptr);
  constexpr int64_t kSlots = 5, kSentences = 3;
  uint32_t seed = 101;
  for (int64_t keys : {1, 7, 33, 129})
    for (int64_t n : {1, 4, 9}) {
      const int64_t positions = std::min<int64_t>(keys + 2, 129);  // cache rows: T >= P
      std::mt19937 rng(++seed);
      for (const char* f : {"cache", "cache_dv", "cache_wide"}) {
        std::vector<ir::Tensor> inputs = random_inputs(
            m, f, {{"N", n}, {"P", keys}, {"T", positions}, {"C", kSlots}, {"V", 2}}, ++seed);
        std::uniform_int_distribution<int64_t> slot(0, kSlots - 1);
        for (int64_t& r : inputs[3].ints) r = slot(rng);
        EXPECT_LE(max_error(model.get(), m, f, inputs), kTolerance)
            << f << " with N=" << n << " P=" << keys << " T=" << positions;
      }
      for (const char* f : {"memory", "memory_dv"}) {
        std::vector<ir::Tensor> inputs =
            random_inputs(m, f, {{"N", n}, {"B", kSentences}, {"S", keys}, {"V", 2}}, ++seed);
        std::uniform_int_distribution<int64_t> sentence(0, kSentences - 1);
        for (int64_t& r : inputs[3].ints) r = sentence(rng);
        inputs[3].ints[0] = 0;
        for (int64_t j = 0; j < keys; ++j) inputs[4].ints[static_cast<size_t>(j)] = 1;
        EXPECT_LE(max_error(model.get(), m, f, inputs), kTolerance)
            << f << " with N=" << n << " S=" << keys;
      }
    }
}

// The base model (MODEL transformer CONFIG base) compiled for CUDA: its weights, random and
// small (uniform in ±0.05, so the model is well conditioned and f32 rounding stays small),
// written to the build folder (~373 MB) by each test that uses them: the plain ones (the
// runtime derives the rest).
const ir::Module& base_module() {
  static const ir::Module m = [] {
    std::ifstream in(KILN_CUDA_BASE_KIR);
    std::stringstream text;
    text << in.rdbuf();
    return ir::parse_and_verify(text.str(), KILN_CUDA_BASE_KIR);
  }();
  return m;
}

ir::WeightMap base_weights(std::string* path) {
  const ir::Module& m = base_module();
  std::mt19937 rng(2017);
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  ir::WeightMap weights;
  for (const ir::Weight& w : m.weights) {
    if (w.derivation) continue;
    std::vector<int64_t> shape;
    for (const ir::Dim& d : w.type.shape) shape.push_back(d.value);
    std::vector<float> v(static_cast<size_t>(ir::static_numel(w.type)));
    for (float& x : v) x = u(rng);
    weights[w.name] = ir::Tensor::from_f32(shape, std::move(v));
  }
  *path = std::string(KILN_CUDA_TEST_DIR) + "/cuda_base.weights.safetensors";
  std::vector<rt::TensorData> tensors;
  for (const auto& [name, t] : weights) tensors.push_back(rt::make_f32(name, t.shape, t.f));
  rt::write_safetensors(*path, tensors);
  ir::materialize_weights(m, weights);
  return weights;
}

// Ids in [1, vocab): no padding.
kiln::Tensor<int64_t> ids(int64_t batch, int64_t len, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> u(1, vocab - 1);
  kiln::Tensor<int64_t> t{{batch, len}, std::vector<int64_t>(static_cast<size_t>(batch * len))};
  for (int64_t& x : t.data) x = u(rng);
  return t;
}

// Without a driver, the base model loads (weights checked and laid out on the host) and its
// forward and encode fail naming the driver, through the C++ API and the C ABI.
TEST(CudaNoDriver, BaseModelForwardIsAnErrorNamingTheDriver) {
  if (cuda_driver_present()) GTEST_SKIP() << "a CUDA driver is present";
  std::string path;
  (void)base_weights(&path);
  kiln_models::cuda_base model(path.c_str());
  const kiln::Tensor<int64_t> src = ids(1, 5, 32000, 1), tgt = ids(1, 4, 32000, 2);
  for (const char* entry : {"forward", "encode"}) {
    std::string message;
    try {
      if (std::string(entry) == "forward")
        (void)model.forward(src, tgt);
      else
        (void)model.encode(src);
    } catch (const std::runtime_error& e) {
      message = e.what();
    }
    EXPECT_NE(message.find("no CUDA driver (libcuda.so.1 not found"), std::string::npos)
        << entry << ": '" << message << "'";
  }
  kiln_tensor in[2] = {};
  for (int i = 0; i < 2; ++i) {
    const kiln::Tensor<int64_t>& t = i == 0 ? src : tgt;
    in[i].dtype = KILN_I64;
    in[i].rank = 2;
    in[i].shape[0] = t.shape[0];
    in[i].shape[1] = t.shape[1];
    in[i].data = const_cast<int64_t*>(t.data.data());
    in[i].capacity = t.data.size() * 8;
  }
  std::vector<float> logits(4 * 32000);
  kiln_tensor out{};
  out.dtype = KILN_F32;
  out.rank = 3;
  out.shape[0] = 1;
  out.shape[1] = 4;
  out.shape[2] = 32000;
  out.data = logits.data();
  out.capacity = logits.size() * 4;
  EXPECT_NE(kiln_model_run(model.get(), "forward", in, 2, &out, 1), 0);
  EXPECT_NE(std::string(kiln_model_error(model.get())).find("no CUDA driver"), std::string::npos)
      << kiln_model_error(model.get());
}

// With a device: the base model's forward and encode against the interpreter on random
// weights, batches 1 and 2, lengths 1, 7 and 33.
TEST(CudaRun, BaseModelAgainstInterpreter) {
  SKIP_WITHOUT_CUDA();
  std::string path;
  const ir::WeightMap weights = base_weights(&path);
  const ir::Module& m = base_module();
  kiln_models::cuda_base model(path.c_str());
  double worst = 0;
  for (int64_t batch : {1, 2})
    for (int64_t len : {1, 7, 33}) {
      const kiln::Tensor<int64_t> src = ids(batch, len, 32000, static_cast<uint32_t>(len));
      const kiln::Tensor<int64_t> tgt = ids(batch, len, 32000, static_cast<uint32_t>(len + 99));
      const std::vector<ir::Tensor> inputs = {
          ir::Tensor::from_ints(ir::DType::i64, src.shape, src.data),
          ir::Tensor::from_ints(ir::DType::i64, tgt.shape, tgt.data)};
      for (const char* entry : {"forward", "encode"}) {
        const bool fwd = std::string(entry) == "forward";
        const std::vector<ir::Tensor> want = ir::interpret(
            m, *m.find_function(entry), weights, fwd ? inputs : std::vector<ir::Tensor>{inputs[0]});
        const kiln::Tensor<float> got = fwd ? model.forward(src, tgt) : model.encode(src);
        ASSERT_EQ(got.shape, want[0].shape) << entry;
        for (size_t i = 0; i < got.data.size(); ++i)
          worst = std::max(worst, std::fabs(got.data[i] - want[0].f[i]) /
                                      std::max(1.0, std::fabs(static_cast<double>(want[0].f[i]))));
      }
    }
  std::printf("[ cuda ] base model vs interpreter: max error %.3g\n", worst);
  EXPECT_LE(worst, 1e-4);
}

}  // namespace
}  // namespace kiln
