// The runtime's two kinds of error text: what the Halide runtime reports about a kernel or a
// device call (per thread, until the next call clears it), and the last error of each
// thread's calls on a model (kiln_model_error).
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace kiln::rt {

// The calling thread's last message from the Halide runtime ("" when none since cleared).
std::string& kernel_error();
// The Halide error handler kiln installs (kiln_hooks::set_error_handler): records the
// message for kernel_error() instead of printing it.
void record_kernel_error(void* user_context, const char* message);
// ": <message>" for the calling thread's kernel error, or "" when there is none.
std::string kernel_error_suffix();

// The last error of each thread's calls on one model.
class ThreadErrors {
 public:
  void set(std::string text);  // "" clears it
  // Valid until this thread's next set().
  const char* get() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::thread::id, std::string> errors_;
};

}  // namespace kiln::rt
