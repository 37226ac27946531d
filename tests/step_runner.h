// Running a seq2seq library's entry points on ir::Tensor inputs (decode_test, int8_test,
// bf16_test): the compiled model through kiln::Model::run with decode_step's caches updated in
// place, as the interpreter's results would be returned; and the check that a restricted step
// gives the full step's logits at its ids.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

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

// decode_step_restricted against decode_step through the same runner (a library, or the
// interpreter with the library's rounding), on the transformer `m` (its config): prepare, then
// 3 steps of 3 hypotheses moved between rows each step, and at each step every restricted
// logit EQUAL to the full step's at its id, for 3 random ids, every id shuffled, and V random
// ids with repeats. Adds the logits compared to `compared`.
inline void expect_restricted_steps_equal_full_through(const ir::Module& m, const Runner& runner,
                                                       const std::string& label,
                                                       int64_t& compared) {
  auto config = [&](const char* key) { return std::stoll(m.config.at(key)); };
  const int64_t B = 3, S = 5, T = 3, V = config("tgt_vocab"), D = config("d_model");
  const int64_t L = config("dec_layers"), pad = config("pad_id");
  std::mt19937 rng(7);
  auto token = [&](int64_t vocab) {  // any id but pad_id
    int64_t v = std::uniform_int_distribution<int64_t>(0, vocab - 2)(rng);
    return v >= pad ? v + 1 : v;
  };
  std::vector<int64_t> src(B * S);
  for (int64_t& id : src) id = token(config("src_vocab"));
  const std::vector<ir::Tensor> mem = runner("prepare", {ids({B, S}, src)});
  std::vector<ir::Tensor> cache(2 * L, ir::Tensor::zeros(ir::DType::f32, {T, B, D}));
  std::vector<std::vector<int64_t>> slots(B);
  std::vector<int64_t> order(B);
  std::iota(order.begin(), order.end(), 0);
  for (int64_t t = 0; t < T; ++t) {
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<int64_t> tok(B), rows(B * (t + 1)), src_row(B);
    for (int64_t r = 0; r < B; ++r) {
      const int64_t b = order[r];
      tok[r] = token(V);
      for (int64_t j = 0; j < t; ++j) rows[r * (t + 1) + j] = slots[b][j];
      rows[r * (t + 1) + t] = r;
      src_row[r] = b;
    }
    std::vector<ir::Tensor> in = {ids({B, 1}, tok), ids({1}, {t}), ids({B, t + 1}, rows),
                                  ids({B}, src_row), ids({B, S}, src)};
    in.insert(in.end(), mem.begin(), mem.end());
    in.insert(in.end(), cache.begin(), cache.end());
    const std::vector<ir::Tensor> full = runner("decode_step", in);
    ASSERT_EQ(full[0].shape, (std::vector<int64_t>{B, 1, V}));
    std::vector<int64_t> shuffled(static_cast<size_t>(V));
    std::iota(shuffled.begin(), shuffled.end(), 0);
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    std::vector<int64_t> few(3), many(static_cast<size_t>(V));
    for (int64_t& id : few) id = std::uniform_int_distribution<int64_t>(0, V - 1)(rng);
    for (int64_t& id : many) id = std::uniform_int_distribution<int64_t>(0, V - 1)(rng);
    for (const std::vector<int64_t>& vocab : {few, shuffled, many}) {
      const int64_t R = static_cast<int64_t>(vocab.size());
      std::vector<ir::Tensor> in_r = in;  // the caches as before this step
      in_r.push_back(ids({R}, vocab));
      const std::vector<ir::Tensor> got = runner("decode_step_restricted", in_r);
      ASSERT_EQ(got[0].shape, (std::vector<int64_t>{B, 1, R})) << label;
      for (int64_t r = 0; r < B; ++r)
        for (int64_t j = 0; j < R; ++j) {
          ASSERT_EQ(got[0].f[r * R + j], full[0].f[r * V + vocab[j]])
              << label << ": step " << t << ", row " << r << ", id " << vocab[j] << " (R " << R
              << ")";
          ++compared;
        }
    }
    for (int64_t r = 0; r < B; ++r) slots[order[r]].push_back(r);
    std::copy(full.begin() + 1, full.end(), cache.begin());
  }
}

// The check above through each of `runners` (what it is, the runner), printing "[ tag ] label,
// what: N restricted logits equal to the full step's" for each; stops at the first failure.
inline void expect_restricted_steps_equal_full(
    const ir::Module& m, const std::vector<std::pair<const char*, const Runner*>>& runners,
    const char* tag, const std::string& label) {
  for (const auto& [what, runner] : runners) {
    int64_t compared = 0;
    expect_restricted_steps_equal_full_through(m, *runner, label + " " + what, compared);
    if (::testing::Test::HasFatalFailure()) return;
    std::printf("[ %s ] %s, %s: %lld restricted logits equal to the full step's\n", tag,
                label.c_str(), what, static_cast<long long>(compared));
  }
}

}  // namespace kiln::testing
