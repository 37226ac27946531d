// Profiling tallies and their report (see profile.h).
#include "runtime/profile.h"

#include <algorithm>

#include <fmt/format.h>

namespace kiln::rt {

void Profile::set(bool on, size_t num_kernels) {
  std::lock_guard<std::mutex> lock(mutex_);
  on_ = on;
  if (on_) {
    started_ = true;
    kernel_time_.assign(num_kernels, {});
    run_time_.clear();
    builtin_time_.clear();
  }
}

bool Profile::on() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return on_;
}

void Profile::add_run(const std::string& function, const std::vector<Tally>& kernels,
                      double seconds, const std::map<std::string, BuiltinTally>& builtins) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!on_ || kernel_time_.size() != kernels.size()) return;  // stopped meanwhile
  for (size_t k = 0; k < kernels.size(); ++k) {
    kernel_time_[k].calls += kernels[k].calls;
    kernel_time_[k].seconds += kernels[k].seconds;
  }
  Tally& t = run_time_[function];
  t.calls += 1;
  t.seconds += seconds;
  for (const auto& [step, b] : builtins) {
    BuiltinTally& to = builtin_time_[function + ": " + step];
    to.calls += b.calls;
    to.seconds += b.seconds;
    to.experts_run += b.experts_run;
    to.expert_rows += b.expert_rows;
  }
}

std::string Profile::report(const std::vector<std::string>& kernel_names) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!started_) return "";  // (a model of builtin steps only has no kernels to tally)
  std::string out;
  double in_kernels = 0;
  for (const Tally& t : kernel_time_) in_kernels += t.seconds;
  for (const auto& [name, t] : run_time_)
    out += fmt::format("kiln profile: '{}' ran {} time(s), {:.3f} ms per run\n", name, t.calls,
                       1e3 * t.seconds / static_cast<double>(std::max<int64_t>(t.calls, 1)));
  if (run_time_.empty()) return out + "kiln profile: nothing ran while profiling\n";
  std::vector<size_t> order;
  for (size_t k = 0; k < kernel_time_.size(); ++k)
    if (kernel_time_[k].calls) order.push_back(k);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return kernel_time_[a].seconds > kernel_time_[b].seconds;
  });
  size_t width = 6;
  for (size_t k : order) width = std::max(width, kernel_names[k].size());
  out += fmt::format("{:<{}}  {:>7}  {:>10}  {:>12}  {:>6}\n", "kernel", width, "calls", "total ms",
                     "ms per call", "share");
  for (size_t k : order) {
    const Tally& t = kernel_time_[k];
    out += fmt::format("{:<{}}  {:>7}  {:>10.3f}  {:>12.4f}  {:>5.1f}%\n", kernel_names[k], width,
                       t.calls, 1e3 * t.seconds, 1e3 * t.seconds / static_cast<double>(t.calls),
                       in_kernels > 0 ? 100.0 * t.seconds / in_kernels : 0.0);
  }
  // Builtin steps, e.g. "kiln profile: builtin 'forward: moe_ffn %9' ran 2 time(s), 0.153 ms
  // per run, 6 experts run over 14 expert rows".
  for (const auto& [step, b] : builtin_time_)
    out += fmt::format(
        "kiln profile: builtin '{}' ran {} time(s), {:.3f} ms per run, {} experts run over {} "
        "expert rows\n",
        step, b.calls, 1e3 * b.seconds / static_cast<double>(std::max<int64_t>(b.calls, 1)),
        b.experts_run, b.expert_rows);
  return out;
}

}  // namespace kiln::rt
