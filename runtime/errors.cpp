// Kernel errors per thread and a model's per-thread call errors (see errors.h).
#include "runtime/errors.h"

namespace kiln::rt {

std::string& kernel_error() {
  thread_local std::string text;
  return text;
}

void record_kernel_error(void*, const char* message) { kernel_error() = message ? message : ""; }

std::string kernel_error_suffix() {
  const std::string& text = kernel_error();
  return text.empty() ? "" : ": " + text;
}

void ThreadErrors::set(std::string text) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (text.empty())
    errors_.erase(std::this_thread::get_id());
  else
    errors_[std::this_thread::get_id()] = std::move(text);
}

const char* ThreadErrors::get() const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = errors_.find(std::this_thread::get_id());
  return it == errors_.end() ? "" : it->second.c_str();
}

}  // namespace kiln::rt
