// Profiling of a model's runs (kiln_model_set_profiling, kiln_model_profile): per kernel,
// calls and seconds; per entry point, runs and seconds; and the report as text.
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

// The one written state that calls on a model share: tallies behind a mutex, added to once
// per run (each run times its kernels in tallies of its own).
class Profile {
 public:
  // On: clears the tallies (for `num_kernels` kernels) and times the runs that follow.
  void set(bool on, size_t num_kernels);
  bool on() const;
  // Adds one run of entry point `function`: its kernels' tallies and its seconds (dropped
  // where profiling stopped or started again meanwhile).
  void add_run(const std::string& function, const std::vector<Tally>& kernels, double seconds);
  // The tallies as text (kiln_model_profile), kernels named by `kernel_names`; "" when
  // profiling was never on.
  std::string report(const std::vector<std::string>& kernel_names) const;

 private:
  mutable std::mutex mutex_;  // guards the three below
  bool on_ = false;
  std::vector<Tally> kernel_time_;
  std::map<std::string, Tally> run_time_;
};

}  // namespace kiln::rt
