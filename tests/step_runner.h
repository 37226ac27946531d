// Running a seq2seq library's entry points on ir::Tensor inputs (decode_test, int8_test):
// the compiled model through kiln::Model::run with decode_step's caches updated in place, as
// the interpreter's results would be returned.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ir/interpreter.h"
#include "kiln/runtime.h"

namespace kiln::testing {

// Runs an entry point on inputs in parameter order; returns its results in order.
using Runner =
    std::function<std::vector<ir::Tensor>(const std::string&, const std::vector<ir::Tensor>&)>;

// The compiled model through kiln::Model::run; decode_step's caches are passed as input and
// output with the same buffer (as the runtime requires) and returned updated.
inline Runner compiled(kiln::Model& model, int64_t layers) {
  return [&model, layers](const std::string& fn, const std::vector<ir::Tensor>& in) {
    std::vector<kiln::Tensor<float>> f(in.size());
    std::vector<kiln::Tensor<int64_t>> ints(in.size());
    std::vector<kiln::Input> inputs;
    for (size_t i = 0; i < in.size(); ++i) {
      if (in[i].dtype == ir::DType::f32) {
        f[i] = {in[i].shape, in[i].f};
        inputs.emplace_back(f[i]);
      } else {
        ints[i] = {in[i].shape, in[i].ints};
        inputs.emplace_back(ints[i]);
      }
    }
    const int n_out = kiln_model_num_outputs(model.get(), fn.c_str());
    std::vector<kiln::Tensor<float>> fresh(static_cast<size_t>(n_out));
    std::vector<kiln::Output> outputs;
    std::vector<kiln::Tensor<float>*> where;
    for (int o = 0; o < n_out; ++o) {
      kiln::Tensor<float>* t = &fresh[o];
      // decode_step's caches in place (decode_step_restricted's are before its `vocab`).
      const size_t caches = in.size() - 2 * layers - (fn == "decode_step_restricted" ? 1 : 0);
      if (fn.rfind("decode_step", 0) == 0 && o >= 1) t = &f[caches + (o - 1)];
      outputs.emplace_back(t);
      where.push_back(t);
    }
    model.run(fn.c_str(), inputs, outputs);
    std::vector<ir::Tensor> out;
    for (kiln::Tensor<float>* t : where) out.push_back(ir::Tensor::from_f32(t->shape, t->data));
    return out;
  };
}

inline ir::Tensor ids(std::vector<int64_t> shape, std::vector<int64_t> data) {
  return ir::Tensor::from_ints(ir::DType::i64, std::move(shape), std::move(data));
}

}  // namespace kiln::testing
