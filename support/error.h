// kiln::Error: the one exception type for errors a user can cause (bad IR text,
// bad weights, bad inputs, DSL misuse). Internal invariants use KILN_ASSERT.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace kiln {

// A user-facing error. The message is lowercase, without a trailing period, and
// names the values that matter, e.g.
//   weight 'generator.weight' has shape [7,16], expected [9,16]
class Error : public std::runtime_error {
 public:
  explicit Error(std::string message) : std::runtime_error(std::move(message)) {}
};

// Throws kiln::Error with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace kiln

// A broken internal invariant: a bug in kiln, never a user's mistake.
#define KILN_ASSERT(cond, msg)                                                     \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      std::fprintf(stderr, "%s:%d: internal error: %s (%s)\n", __FILE__, __LINE__, \
                   std::string(msg).c_str(), #cond);                               \
      std::abort();                                                                \
    }                                                                              \
  } while (0)
