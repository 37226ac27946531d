// Glue between IR modules and safetensors files (see bridge.h).
#include "tools/bridge.h"

#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "support/error.h"

namespace kiln::tools {

namespace {
rt::DType to_rt(ir::DType d) {
  switch (d) {
    case ir::DType::f32:
      return rt::DType::f32;
    case ir::DType::i32:
      return rt::DType::i32;
    case ir::DType::i64:
      return rt::DType::i64;
    case ir::DType::boolean:
      return rt::DType::boolean;
  }
  return rt::DType::f32;
}

std::vector<int64_t> static_shape(const ir::TensorType& t) {
  std::vector<int64_t> s;
  for (const ir::Dim& d : t.shape) s.push_back(d.value);
  return s;
}
}  // namespace

std::vector<rt::WeightSpec> expected_weights(const ir::Module& module) {
  std::vector<rt::WeightSpec> out;
  for (const ir::Weight& w : module.weights)
    if (!w.derivation) out.push_back({w.name, to_rt(w.type.dtype), static_shape(w.type)});
  return out;
}

ir::WeightMap load_weight_map(const ir::Module& module, const rt::SafeTensors& file) {
  rt::check_weights_or_throw(file, expected_weights(module));
  ir::WeightMap weights;
  for (const ir::Weight& w : module.weights) {
    if (w.derivation) continue;
    const rt::TensorInfo& t = file.at(w.name);
    weights[w.name] = ir::Tensor::from_f32(t.shape, file.to_f32(t));
  }
  ir::materialize_weights(module, weights);
  return weights;
}

std::vector<ir::Tensor> load_inputs(const ir::Function& function, const rt::SafeTensors& file) {
  std::vector<ir::Tensor> inputs;
  for (ir::ValueId p : function.params) {
    const ir::Value& v = function.values[p];
    const rt::TensorInfo* t = file.find(v.name);
    if (!t)
      fail("inputs '{}' have no tensor '{}' for parameter %{}: {} of function '{}'", file.label(),
           v.name, v.name, ir::to_string(v.type), function.name);
    if (v.type.dtype == ir::DType::f32) {
      if (t->dtype != rt::DType::f32)
        fail("input '{}' has dtype {}, expected F32", v.name, rt::dtype_name(t->dtype));
      inputs.push_back(ir::Tensor::from_f32(t->shape, file.to_f32(*t)));
    } else if (ir::is_integer(v.type.dtype)) {
      if (t->dtype != rt::DType::i64 && t->dtype != rt::DType::i32)
        fail("input '{}' has dtype {}, expected I64 or I32", v.name, rt::dtype_name(t->dtype));
      inputs.push_back(ir::Tensor::from_ints(v.type.dtype, t->shape, file.to_i64(*t)));
    } else {
      fail("input '{}' of type {} cannot be read from safetensors", v.name, ir::to_string(v.type));
    }
  }
  return inputs;
}

std::vector<rt::TensorData> to_tensor_data(const ir::Function& function,
                                           const std::vector<ir::Tensor>& results) {
  std::vector<rt::TensorData> out;
  for (size_t i = 0; i < results.size(); ++i) {
    const ir::Value& v = function.values[function.results[i]];
    std::string name = v.name.empty() ? "result" + std::to_string(i) : v.name;
    const ir::Tensor& t = results[i];
    if (t.dtype == ir::DType::f32) {
      out.push_back(rt::make_f32(name, t.shape, t.f));
    } else if (t.dtype == ir::DType::boolean) {  // BOOL, one byte each, as compiled code writes
      rt::TensorData d{name, rt::DType::boolean, t.shape, {}};
      for (int64_t v : t.ints) d.data.push_back(v != 0);
      out.push_back(std::move(d));
    } else {
      out.push_back(rt::make_i64(name, t.shape, t.ints));
    }
  }
  return out;
}

}  // namespace kiln::tools
