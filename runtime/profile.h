// Profiling of a model's runs (kiln_model_set_profiling, kiln_model_profile): per kernel,
// calls and seconds; per entry point, runs and seconds; per builtin step that counts its work
// (moe_ffn), calls, seconds, experts run and their rows; and the report as text.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace kiln::rt {

struct Tally {
  int64_t calls = 0;
  double seconds = 0;
};

// A builtin step's tally (by its step's op text): calls and seconds, and for moe_ffn the
// experts run and the rows they took (runtime/builtins.h, MoeWork).
struct BuiltinTally {
  int64_t calls = 0;
  double seconds = 0;
  int64_t experts_run = 0;
  int64_t expert_rows = 0;
};

// The one written state that calls on a model share: tallies behind a mutex, added to once
// per run (each run times its kernels in tallies of its own).
class Profile {
 public:
  // On: clears the tallies (for `num_kernels` kernels) and times the runs that follow.
  void set(bool on, size_t num_kernels);
  bool on() const;
  // Adds one run of entry point `function`: its kernels' tallies and its seconds (dropped
  // where profiling stopped or started again meanwhile).
  // `builtins`: the run's builtin steps that count their work (moe_ffn), by step.
  void add_run(const std::string& function, const std::vector<Tally>& kernels, double seconds,
               const std::map<std::string, BuiltinTally>& builtins = {});
  // The tallies as text (kiln_model_profile), kernels named by `kernel_names`; "" when
  // profiling was never on.
  std::string report(const std::vector<std::string>& kernel_names) const;

 private:
  mutable std::mutex mutex_;  // guards the members below
  bool on_ = false;
  bool started_ = false;  // profiling was on at some point
  std::vector<Tally> kernel_time_;
  std::map<std::string, Tally> run_time_;
  std::map<std::string, BuiltinTally> builtin_time_;
};

}  // namespace kiln::rt
