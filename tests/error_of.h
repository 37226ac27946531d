// error_of: the message of the exception a test expects a call to throw.
#pragma once

#include <exception>
#include <string>

#include <gtest/gtest.h>

#include "support/error.h"

namespace kiln::testing {

// The message of the `E` thrown by `fn` (kiln::Error by default; std::exception for the
// runtime's C++ wrapper). A different exception, or none, is a test failure and gives "".
template <typename E = kiln::Error, typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    if (dynamic_cast<const E*>(&e)) return e.what();
    ADD_FAILURE() << "expected another exception type, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected an exception, nothing was thrown";
  return "";
}

}  // namespace kiln::testing
