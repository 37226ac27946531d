// What the two executables of the CLI share: `kiln` and `kiln-run` (which runs compiled model
// libraries for `kiln run --compiled` and `kiln translate`, and links no compiler: see
// tools/kiln_run.cpp). Option parsing, input and output files, the error line, and the
// report of a run's outputs. Needs only kiln's runtime.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "runtime/safetensors.h"
#include "support/error.h"

namespace kiln::tools {

// A minimal option parser: positional arguments and --name value / --name=value.
struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::vector<std::string>> options;
  std::set<std::string> flags;

  // Options not in `with_value` or `flag_names` are errors naming `command`.
  static Args parse(const std::vector<std::string>& argv, const std::set<std::string>& with_value,
                    const std::set<std::string>& flag_names, const std::string& command);
  // The last value of option `name`, if given.
  std::optional<std::string> get(const std::string& name) const;
  // The value of option `name`, or an error naming it.
  std::string require(const std::string& name, const std::string& command) const;
};

// kiln run's options (kiln parses them, and kiln-run again for --compiled).
inline const std::set<std::string> kRunOptions = {"--weights",  "--inputs",  "--function",
                                                  "-o",         "--expect",  "--atol",
                                                  "--compiled", "--threads", "--repeat"};
inline const std::set<std::string> kRunFlags = {"--profile", "--bf16-linear"};

// Whether `argv` asks for help (--help or -h).
bool wants_help(const std::vector<std::string>& argv);

// Standard output for "" or "-", else the file, written whole or not at all (file_io.h).
void write_output(const std::string& path, const std::string& text);

// Prints `e` as the `kiln: error: ...` line, after whatever standard output holds.
void print_error(const Error& e);

// Reads a whole file, "-" meaning standard input; throws kiln::Error naming the path.
std::string read_text(const std::string& path);
std::vector<uint8_t> read_bytes(const std::string& path);
// SafeTensors from a path or "-".
rt::SafeTensors load_safetensors(const std::string& path);

// What `kiln run` does with the outputs of a run (the interpreter's or a compiled
// library's), by its options: -o writes them; --expect FILE compares them with FILE's
// tensors within --atol (exit status 1 on a mismatch); else a summary is printed.
// Returns the exit status.
int report_outputs(const Args& a, const std::vector<rt::TensorData>& data);

// The body of main for kiln and kiln-run: runs `dispatch` on the arguments after the
// program name; a kiln::Error becomes the `kiln: error:` line and exit status 1, any other
// exception `kiln: internal error:` and 70; what was printed must reach its destination.
int run_main(int argc, char** argv, int (*dispatch)(const std::vector<std::string>&));

}  // namespace kiln::tools
