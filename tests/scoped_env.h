// An environment variable set for a test's scope: the value it had (or its absence) comes back
// when the scope ends, whatever the test did to it meanwhile.
#pragma once

#include <cstdlib>
#include <string>

namespace kiln::testing {

class ScopedEnv {
 public:
  explicit ScopedEnv(std::string name) : name_(std::move(name)) {
    const char* before = std::getenv(name_.c_str());
    had_ = before != nullptr;
    if (had_) before_ = before;
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_.c_str(), before_.c_str(), 1);
    else
      unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

  // Sets the variable to `value`; the empty string unsets it.
  void set(const std::string& value) {
    if (value.empty())
      unsetenv(name_.c_str());
    else
      setenv(name_.c_str(), value.c_str(), 1);
  }

 private:
  std::string name_, before_;
  bool had_ = false;
};

}  // namespace kiln::testing
