// Running the `kiln` binary from a test: a shell command line, its exit status and what it
// printed (standard output and standard error together, unless the command redirects).
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace kiln::testing {

struct CliResult {
  int status;          // exit status; -1 when killed by a signal
  int signal;          // the signal, when killed by one
  std::string output;  // what reached the pipe
};

inline std::string kiln_binary() { return std::string(KILN_BINARY_DIR) + "/tools/kiln"; }

// Runs `command` with bash; "%kiln" in it stands for the kiln binary. Standard error
// joins standard output unless the command itself redirects it (`2>&1 >FILE` sends only
// standard output elsewhere).
inline CliResult run_shell(std::string command, bool join_stderr = true) {
  for (size_t at; (at = command.find("%kiln")) != std::string::npos;)
    command.replace(at, 5, kiln_binary());
  const std::string full = "bash -c '" + command + "'" + (join_stderr ? " 2>&1" : "");
  FILE* p = popen(full.c_str(), "r");
  CliResult r{-1, 0, {}};
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int st = pclose(p);
  if (WIFEXITED(st)) {
    r.status = WEXITSTATUS(st);
    // bash reports a child killed by a signal as 128 + the signal.
    if (r.status > 128) r.signal = r.status - 128;
  } else if (WIFSIGNALED(st)) {
    r.signal = WTERMSIG(st);
  }
  return r;
}

}  // namespace kiln::testing
