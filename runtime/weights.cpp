// Checking a checkpoint against expected weights (see weights.h).
#include "runtime/weights.h"

#include <set>

#include <fmt/format.h>

#include "support/error.h"

namespace kiln::rt {

std::string shape_string(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ","));
}

std::vector<std::string> check_weights(const SafeTensors& file,
                                       const std::vector<WeightSpec>& expected) {
  std::vector<std::string> problems;
  std::set<std::string> wanted;
  for (const WeightSpec& w : expected) {
    wanted.insert(w.name);
    const TensorInfo* t = file.find(w.name);
    if (!t) {
      problems.push_back(fmt::format("missing tensor '{}' (expected {} {})", w.name,
                                     dtype_name(w.dtype), shape_string(w.shape)));
      continue;
    }
    if (t->dtype != w.dtype && !(w.or_bf16 && t->dtype == DType::bf16))
      problems.push_back(fmt::format("tensor '{}' has dtype {}, expected {}{}", w.name,
                                     dtype_name(t->dtype), dtype_name(w.dtype),
                                     w.or_bf16 ? " or BF16" : ""));
    if (t->shape != w.shape)
      problems.push_back(fmt::format("tensor '{}' has shape {}, expected {}", w.name,
                                     shape_string(t->shape), shape_string(w.shape)));
  }
  for (const TensorInfo& t : file.tensors())
    if (!wanted.count(t.name))
      problems.push_back(fmt::format("unexpected tensor '{}' {} {}", t.name, dtype_name(t.dtype),
                                     shape_string(t.shape)));
  return problems;
}

void check_weights_or_throw(const SafeTensors& file, const std::vector<WeightSpec>& expected) {
  std::vector<std::string> problems = check_weights(file, expected);
  if (problems.empty()) return;
  std::string msg = fmt::format("weights '{}' do not match the model ({} problem{}):", file.label(),
                                problems.size(), problems.size() == 1 ? "" : "s");
  for (const std::string& p : problems) msg += "\n  " + p;
  throw Error(msg);
}

}  // namespace kiln::rt
