// A whole module compiled in process, for tests that compare compiled code with the
// interpreter on many graphs: the default pipeline, lowering (codegen/lower.h), every
// kernel JIT-compiled by Halide for the host (each kernel once per process, shared by name
// across modules, as a library shares equal kernels), and the runtime's model built from
// the serialized plan and those kernels through kiln_model_create, then run through
// kiln_model_run: what a `kiln compile` library does, without writing objects.
#pragma once

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "codegen/halide_kernels.h"
#include "codegen/kernels.h"
#include "codegen/lower.h"
#include "ir/interpreter.h"
#include "ir/ir.h"
#include "kiln/runtime.h"
#include "passes/pipeline.h"
#include "runtime/plan.h"
#include "runtime/safetensors.h"
#include "support/error.h"

namespace kiln::jit {

// The argv entry point of `spec`'s kernel JIT-compiled for the host, compiled on first use.
inline kiln_kernel_fn jit_kernel(const codegen::KernelSpec& spec) {
  struct Compiled {
    Halide::Internal::JITModule module;
    kiln_kernel_fn fn = nullptr;
  };
  static std::map<std::string, std::unique_ptr<Compiled>> cache;
  const std::string name = codegen::kernel_name(spec);
  auto it = cache.find(name);
  if (it != cache.end()) return it->second->fn;
  const Halide::Target target = codegen::host_target().with_feature(Halide::Target::JIT);
  codegen::KernelPipeline kp = codegen::build_kernel(spec, target);
  Halide::Module module = kp.pipeline.compile_to_module(kp.args, name, target);
  auto c = std::make_unique<Compiled>();
  c->module = Halide::Internal::JITModule(module, module.get_function_by_name(name));
  c->fn = reinterpret_cast<kiln_kernel_fn>(c->module.argv_function());
  return cache.emplace(name, std::move(c)).first->second->fn;
}

// A module after the default pipeline, lowered and JIT-compiled, with its weights.
class JitModel {
 public:
  // `module` as built (the default pipeline runs here); `weights` by name (underived
  // ones are written to a safetensors file that the runtime loads, as an application's).
  JitModel(ir::Module module, const ir::WeightMap& weights, const std::string& weights_path) {
    passes::run_passes(module, passes::default_pipeline(), {});
    module_ = module;
    codegen::LoweredModel lowered = codegen::lower_module(module);
    lowered.plan.target = codegen::resolve_target("host");
    std::vector<kiln_kernel_fn> fns;
    for (const codegen::KernelSpec& spec : lowered.kernels) fns.push_back(jit_kernel(spec));
    kernels_ = static_cast<int>(fns.size());
    // The state_dict tensors the plan loads (the runtime refuses any other).
    std::vector<rt::TensorData> tensors;
    std::vector<std::string> written;
    for (const rt::WeightDesc& w : lowered.plan.weights)
      for (const std::string& name : w.sources) {
        if (std::find(written.begin(), written.end(), name) != written.end()) continue;
        written.push_back(name);
        const ir::Tensor& t = weights.at(name);
        tensors.push_back(rt::make_f32(name, t.shape, t.f));
      }
    if (!tensors.empty()) rt::write_safetensors(weights_path, tensors);
    const std::vector<uint8_t> plan = rt::serialize_plan(lowered.plan);
    char* error = nullptr;
    model_ = kiln_model_create(plan.data(), plan.size(), fns.data(), fns.size(), nullptr,
                               tensors.empty() ? nullptr : weights_path.c_str(), &error);
    if (!model_) {
      std::string message = error ? error : "kiln_model_create failed";
      kiln_free_error(error);
      fail("{}", message);
    }
  }
  ~JitModel() { kiln_model_destroy(model_); }
  JitModel(const JitModel&) = delete;
  JitModel& operator=(const JitModel&) = delete;

  const ir::Module& module() const { return module_; }  // after the pipeline
  kiln_model* model() const { return model_; }          // e.g. for kiln_model_set_profiling
  int kernels() const { return kernels_; }

  // Runs entry point `function` on `inputs` (ir::Tensor, in parameter order).
  std::vector<ir::Tensor> run(const std::string& function, const std::vector<ir::Tensor>& inputs) {
    std::vector<std::vector<uint8_t>> storage;
    std::vector<kiln_tensor> in;
    for (const ir::Tensor& t : inputs) {
      kiln_tensor k{};
      k.rank = static_cast<int32_t>(t.shape.size());
      for (size_t d = 0; d < t.shape.size(); ++d) k.shape[d] = t.shape[d];
      std::vector<uint8_t>& bytes = storage.emplace_back();
      if (t.dtype == ir::DType::f32) {
        k.dtype = KILN_F32;
        bytes.resize(t.f.size() * 4);
        if (!bytes.empty()) std::memcpy(bytes.data(), t.f.data(), bytes.size());
      } else if (t.dtype == ir::DType::boolean) {
        k.dtype = KILN_BOOL;
        for (int64_t v : t.ints) bytes.push_back(v != 0);
      } else {
        k.dtype = KILN_I64;
        bytes.resize(t.ints.size() * 8);
        if (!bytes.empty()) std::memcpy(bytes.data(), t.ints.data(), bytes.size());
      }
      k.data = bytes.data();
      k.capacity = bytes.size();
      in.push_back(k);
    }
    const int n_out = kiln_model_num_outputs(model_, function.c_str());
    if (n_out < 0) fail("no entry point '{}'", function);
    std::vector<kiln_tensor> out(static_cast<size_t>(n_out));
    if (kiln_model_output_shapes(model_, function.c_str(), in.data(), in.size(), out.data(),
                                 out.size()) != 0)
      fail("{}", kiln_model_error(model_));
    std::vector<std::vector<uint8_t>> out_storage;
    for (kiln_tensor& k : out) {
      size_t n = kiln_dtype_size(k.dtype);
      for (int32_t d = 0; d < k.rank; ++d) n *= static_cast<size_t>(k.shape[d]);
      std::vector<uint8_t>& bytes = out_storage.emplace_back(n + 1);  // never empty
      k.data = bytes.data();
      k.capacity = n;
    }
    if (kiln_model_run(model_, function.c_str(), in.data(), in.size(), out.data(), out.size()) != 0)
      fail("{}", kiln_model_error(model_));
    std::vector<ir::Tensor> results;
    for (const kiln_tensor& k : out) {
      std::vector<int64_t> shape(k.shape, k.shape + k.rank);
      int64_t n = 1;
      for (int64_t s : shape) n *= s;
      const uint8_t* data = static_cast<const uint8_t*>(k.data);
      if (k.dtype == KILN_F32) {
        std::vector<float> f(static_cast<size_t>(n));
        if (n) std::memcpy(f.data(), data, static_cast<size_t>(n) * 4);
        results.push_back(ir::Tensor::from_f32(shape, std::move(f)));
      } else if (k.dtype == KILN_BOOL) {
        results.push_back(
            ir::Tensor::from_ints(ir::DType::boolean, shape, std::vector<int64_t>(data, data + n)));
      } else {
        std::vector<int64_t> v(static_cast<size_t>(n));
        if (n) std::memcpy(v.data(), data, static_cast<size_t>(n) * 8);
        results.push_back(ir::Tensor::from_ints(ir::DType::i64, shape, std::move(v)));
      }
    }
    return results;
  }

 private:
  ir::Module module_;
  kiln_model* model_ = nullptr;
  int kernels_ = 0;
};

}  // namespace kiln::jit
