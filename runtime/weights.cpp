// Checking a checkpoint against expected weights (see weights.h), and loading a model's
// weights and building its tables (model.h).
#include "runtime/weights.h"

#include <cstring>
#include <map>
#include <set>
#include <span>

#include <fmt/format.h>

#include "runtime/model.h"
#include "support/error.h"
#include "support/sinusoid.h"

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

std::vector<AlignedBytes> load_weights(const Plan& plan, const std::string& path) {
  std::vector<AlignedBytes> weights;
  SafeTensors file = SafeTensors::load(path);
  std::vector<WeightSpec> expected;
  std::map<std::string, bool> seen;
  for (const auto& w : plan.weights)
    for (size_t i = 0; i < w.sources.size(); ++i)
      if (!seen[w.sources[i]]) {
        seen[w.sources[i]] = true;
        expected.push_back({w.sources[i], DType::f32, w.source_shapes[i], true});
      }
  check_weights_or_throw(file, expected);
  weights.resize(plan.weights.size());
  for (size_t wi = 0; wi < plan.weights.size(); ++wi) {
    const auto& w = plan.weights[wi];
    // Concatenation along axis 0, straight from the file's bytes into the laid-out weight
    // (a linear weight as its kernel reads it): each source is a block of rows.
    // Each source is f32 or bf16 (checked above), converted to what the kernels read.
    int64_t numel = 1, source_numel = 0;
    for (int64_t d : w.shape) numel *= d;
    std::vector<std::span<const uint8_t>> parts;
    std::vector<bool> part_bf16;
    for (const std::string& s : w.sources) {
      const TensorInfo& info = file.at(s);
      parts.push_back(file.bytes(info));
      part_bf16.push_back(info.dtype == DType::bf16);
      source_numel += static_cast<int64_t>(parts.back().size() / (part_bf16.back() ? 2 : 4));
    }
    // A linear weight W[N, K] (its sources are blocks of rows of K; the bf16 layout pads
    // N to a multiple of 64 and K to even, the int8 one to a multiple of 4).
    const int64_t K = w.transpose && !w.source_shapes.empty() && !w.source_shapes[0].empty()
                          ? w.source_shapes[0].back()
                          : 1;
    const int64_t group = w.bf16 ? 2 : w.int8 ? 4 : 0;  // K adjacent in the packed layout
    if (group ? (K < 1 || source_numel % K != 0 || (source_numel / K + 63) / 64 != w.shape[0] ||
                 (K + group - 1) / group != w.shape[1])
              : source_numel != numel)
      fail("weight '{}' has {} elements, the plan expects {}", w.name, source_numel,
           group ? fmt::format("[N, K] with N/64 = {}, K/{} = {} (rounded up)", w.shape[0], group,
                               w.shape[1])
                 : std::to_string(numel));
    const int64_t bytes = weight_bytes(w);
    weights[wi].allocate(bytes);
    if (group) std::memset(weights[wi].data.get(), 0, static_cast<size_t>(bytes));
    if (w.transpose) {
      // Stored as [K, N], [N/panel, K, panel], [Np/64, Kp/2, 64, 2] or int8 (the plan is
      // validated) from W[N, K].
      int64_t row = 0;
      for (size_t pi = 0; pi < parts.size(); ++pi) {
        const bool b = part_bf16[pi];
        const int64_t rows = static_cast<int64_t>(parts[pi].size() / (b ? 2 : 4)) / K;
        if (w.bf16) {
          lay_out_linear_weight_bf16_rows(parts[pi].data(), row, rows, source_numel / K, K,
                                          reinterpret_cast<uint16_t*>(weights[wi].data.get()), b);
        } else if (w.int8) {
          const int64_t bad = lay_out_linear_weight_int8_rows(
              parts[pi].data(), row, rows, source_numel / K, K, weights[wi].data.get(), b);
          if (bad >= 0)
            fail(
                "weight '{}' (from '{}'): row {} has a value that is not finite (NaN or "
                "infinite): int8 weights are quantized by each row's largest magnitude",
                w.name, w.sources[pi], bad - row);
        } else {
          lay_out_linear_weight_rows(parts[pi].data(), row, rows, numel / K, K, w.panel,
                                     reinterpret_cast<float*>(weights[wi].data.get()), b);
        }
        row += rows;
      }
    } else {
      float* out = reinterpret_cast<float*>(weights[wi].data.get());
      for (size_t pi = 0; pi < parts.size(); ++pi) {
        const int64_t n = static_cast<int64_t>(parts[pi].size() / (part_bf16[pi] ? 2 : 4));
        if (part_bf16[pi])
          for (int64_t i = 0; i < n; ++i) {
            uint16_t b;
            std::memcpy(&b, parts[pi].data() + 2 * i, 2);
            out[i] = bf16_to_f32(b);
          }
        else
          std::memcpy(out, parts[pi].data(), parts[pi].size());
        out += n;
      }
    }
  }
  return weights;
}

std::vector<AlignedBytes> build_tables(const Plan& plan) {
  std::vector<AlignedBytes> tables;
  tables.resize(plan.tables.size());
  for (size_t ti = 0; ti < plan.tables.size(); ++ti) {
    const auto& t = plan.tables[ti];
    if (t.kind != "sinusoid") fail("unknown table kind '{}'", t.kind);
    tables[ti].allocate(t.rows * t.dim * 4);
    fill_sinusoid_table(t.rows, t.dim, reinterpret_cast<float*>(tables[ti].data.get()));
  }
  return tables;
}

}  // namespace kiln::rt
