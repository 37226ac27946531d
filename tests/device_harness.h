// Compiled kernels on a device against the reference interpreter, for the GPU test binary
// (device_test.cpp: OpenCL and CUDA), which links no libHalide: the .kir files of
// tests/gpu, random inputs and weights, and an entry point run through the C ABI compared with
// the interpreter on the same inputs.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ir/interpreter.h"
#include "ir/parser.h"
#include "kiln/runtime.h"
#include "runtime/safetensors.h"

namespace kiln::testing {

// tests/gpu/`file`, parsed and verified.
inline ir::Module read_gpu_kir(const std::string& file) {
  std::ifstream in(std::string(KILN_TEST_DATA_DIR) + "/gpu/" + file);
  std::stringstream text;
  text << in.rdbuf();
  return ir::parse_and_verify(text.str(), file);
}

// Random inputs for `function` of `m`, its symbols bound to `sizes` (by name): f32 in
// [-1, 1), ids and bools in [0, V).
inline std::vector<ir::Tensor> random_inputs(const ir::Module& m, const std::string& function,
                                             const std::map<std::string, int64_t>& sizes,
                                             uint32_t seed) {
  const ir::Function& f = *m.find_function(function);
  std::mt19937 rng(seed);
  std::vector<ir::Tensor> inputs;
  for (ir::ValueId p : f.params) {
    const ir::TensorType& type = f.type(p);
    std::vector<int64_t> shape;
    for (const ir::Dim& d : type.shape)
      shape.push_back(d.is_symbolic() ? d.at(sizes.at(d.symbol)) : d.value);
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    if (type.dtype == ir::DType::f32) {
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      std::vector<float> v(static_cast<size_t>(n));
      for (float& x : v) x = u(rng);
      inputs.push_back(ir::Tensor::from_f32(shape, v));
    } else {
      std::uniform_int_distribution<int64_t> u(0, sizes.at("V") - 1);
      std::vector<int64_t> v(static_cast<size_t>(n));
      for (int64_t& x : v) x = u(rng);
      inputs.push_back(ir::Tensor::from_ints(type.dtype, shape, v));
    }
  }
  return inputs;
}

// Random weights in [-1, 1) for every weight of `m`, written to `path`; the interpreter's copy.
inline ir::WeightMap write_random_weights(const ir::Module& m, uint32_t seed,
                                          const std::string& path) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  ir::WeightMap weights;
  std::vector<rt::TensorData> tensors;
  for (const ir::Weight& w : m.weights) {
    std::vector<int64_t> shape;
    for (const ir::Dim& d : w.type.shape) shape.push_back(d.value);
    std::vector<float> v(static_cast<size_t>(ir::static_numel(w.type)));
    for (float& x : v) x = u(rng);
    weights[w.name] = ir::Tensor::from_f32(shape, v);
    tensors.push_back(rt::make_f32(w.name, shape, v));
  }
  rt::write_safetensors(path, tensors);
  return weights;
}

// The C ABI's view of `inputs` (bool inputs as a byte each, kept in `bytes`).
inline std::vector<kiln_tensor> input_views(const std::vector<ir::Tensor>& inputs,
                                            std::vector<std::vector<uint8_t>>* bytes) {
  std::vector<kiln_tensor> in(inputs.size());
  bytes->assign(inputs.size(), {});
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ir::Tensor& t = inputs[i];
    in[i] = kiln_tensor{};
    in[i].rank = static_cast<int32_t>(t.shape.size());
    for (size_t d = 0; d < t.shape.size(); ++d) in[i].shape[d] = t.shape[d];
    if (t.dtype == ir::DType::f32) {
      in[i].dtype = KILN_F32;
      in[i].data = const_cast<float*>(t.f.data());
      in[i].capacity = static_cast<size_t>(t.numel()) * 4;
    } else if (t.dtype == ir::DType::boolean) {
      in[i].dtype = KILN_BOOL;
      for (int64_t x : t.ints) (*bytes)[i].push_back(x != 0 ? 1 : 0);
      in[i].data = (*bytes)[i].data();
      in[i].capacity = (*bytes)[i].size();
    } else {
      in[i].dtype = KILN_I64;
      in[i].data = const_cast<int64_t*>(t.ints.data());
      in[i].capacity = static_cast<size_t>(t.numel()) * 8;
    }
  }
  return in;
}

// Runs `function` of the compiled model and the interpreter on the same inputs; the largest
// difference relative to max(1, |reference|) over all outputs. i64 outputs must be equal (else
// INFINITY); NaN where the reference has NaN (attention's fill_inf rows) is a match.
inline double max_error(kiln_model* model, const ir::Module& m, const std::string& function,
                        const std::vector<ir::Tensor>& inputs, const ir::WeightMap& weights = {}) {
  const std::vector<ir::Tensor> want =
      ir::interpret(m, *m.find_function(function), weights, inputs);
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<kiln_tensor> in = input_views(inputs, &bytes);
  std::vector<kiln_tensor> out(want.size());
  EXPECT_EQ(kiln_model_output_shapes(model, function.c_str(), in.data(), in.size(), out.data(),
                                     out.size()),
            0)
      << kiln_model_error(model);
  std::vector<std::vector<float>> data(out.size());
  std::vector<std::vector<int64_t>> ints(out.size());  // i64 outputs (argmax, i64 reductions)
  for (size_t r = 0; r < out.size(); ++r) {
    int64_t n = 1;
    for (int32_t d = 0; d < out[r].rank; ++d) n *= out[r].shape[d];
    if (want[r].dtype == ir::DType::i64) {
      EXPECT_EQ(out[r].dtype, KILN_I64);
      ints[r].assign(static_cast<size_t>(n), -12345);  // unwritten: a mismatch
      out[r].data = ints[r].data();
      out[r].capacity = ints[r].size() * sizeof(int64_t);
      continue;
    }
    EXPECT_EQ(out[r].dtype, KILN_F32);
    data[r].assign(static_cast<size_t>(n), 1e30f);  // unwritten: a large error, not NaN
    out[r].data = data[r].data();
    out[r].capacity = data[r].size() * sizeof(float);
  }
  const int status =
      kiln_model_run(model, function.c_str(), in.data(), in.size(), out.data(), out.size());
  EXPECT_EQ(status, 0) << kiln_model_error(model);
  if (status != 0) return INFINITY;
  double worst = 0;
  for (size_t r = 0; r < out.size(); ++r) {
    if (want[r].dtype == ir::DType::i64) {  // exactly
      EXPECT_EQ(ints[r], want[r].ints) << function << " result " << r;
      if (ints[r] != want[r].ints) worst = INFINITY;
      continue;
    }
    EXPECT_EQ(data[r].size(), want[r].f.size());
    for (size_t e = 0; e < data[r].size() && e < want[r].f.size(); ++e) {
      const double ref = want[r].f[e];
      if (std::isnan(ref) && std::isnan(data[r][e])) continue;
      const double err = std::fabs(data[r][e] - ref) / std::max(1.0, std::fabs(ref));
      if (!(err <= worst)) worst = std::isnan(err) ? INFINITY : err;
    }
  }
  return worst;
}

struct ModelDeleter {
  void operator()(kiln_model* m) const { kiln_model_destroy(m); }
};
using ModelPtr = std::unique_ptr<kiln_model, ModelDeleter>;

// A model of a compiled library (`create_fn`: its NAME_create), the error reported on failure.
template <typename Create>
ModelPtr create_model(Create create_fn, const char* weights = nullptr) {
  char* error = nullptr;
  ModelPtr m(create_fn(weights, &error));
  EXPECT_NE(m, nullptr) << (error ? error : "");
  kiln_free_error(error);
  return m;
}

}  // namespace kiln::testing
