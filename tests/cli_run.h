// Running the `kiln` binary (or another program) from a test, from its argv and never
// through a shell: its exit status, the signal that killed it, and what it printed
// (standard output and standard error together unless the options say otherwise).
#pragma once

#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "support/process.h"

namespace kiln::testing {

struct CliResult {
  int status;          // exit status; -1 when killed by a signal or never started
  int signal;          // the signal, when killed by one
  std::string output;  // what it printed (see CliOptions::join_stderr)
  std::string errors;  // its standard error, when not joined to output
};

struct CliOptions {
  bool join_stderr = true;           // standard error into output (else into errors)
  std::string stdout_path;           // standard output to this file instead (e.g. /dev/full)
  std::optional<std::string> input;  // written to its standard input through a pipe, or
  std::string input_path;            // standard input from this file (else /dev/null)
  long long file_size_limit = -1;    // RLIMIT_FSIZE in bytes, SIGXFSZ ignored (-1: none)
  std::vector<std::string> env;      // NAME=VALUE entries
};

inline std::string kiln_binary() { return std::string(KILN_BINARY_DIR) + "/tools/kiln"; }

// Runs `argv`; an argv[0] of "%kiln" stands for the kiln binary.
inline CliResult run_argv(std::vector<std::string> argv, const CliOptions& options = {}) {
  if (!argv.empty() && argv[0] == "%kiln") argv[0] = kiln_binary();
  ProcessOptions p;
  p.join_stderr = options.join_stderr;
  p.output_path = options.stdout_path;
  p.input = options.input;
  p.input_path = options.input_path;
  p.file_size_limit = options.file_size_limit;
  p.env = options.env;
  const ProcessResult r = run_process(argv, p);
  CliResult result{r.exit_code(), r.term_signal(), r.out, r.err};
  if (!r.error.empty()) result.output += r.error;
  return result;
}

// The same with the argv written as one string of words separated by spaces (the paths
// tests use hold none); leading NAME=VALUE words set the environment, as in a shell.
inline CliResult run_cli(const std::string& words, CliOptions options = {}) {
  std::vector<std::string> argv;
  std::istringstream in(words);
  for (std::string w; in >> w;) {
    if (argv.empty() && w.find('=') != std::string::npos && w[0] != '-' && w[0] != '/' &&
        w[0] != '%')
      options.env.push_back(w);
    else
      argv.push_back(w);
  }
  return run_argv(std::move(argv), options);
}

inline CliResult run_cli(const char* words, const CliOptions& options = {}) {
  return run_cli(std::string(words), options);
}

}  // namespace kiln::testing
