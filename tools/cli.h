// What the two executables of the CLI share: `kiln` and `kiln-run` (which runs compiled model
// libraries for `kiln run --compiled` and `kiln translate`, and links no compiler: see
// tools/kiln_run.cpp). The command line (CLI11: every option's name, type, range, default and
// help declared once, in the command's declaration), input and output files, the error line,
// and the report of a run's outputs. Needs only kiln's runtime.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "kiln/runtime.h"
#include "runtime/safetensors.h"
#include "support/error.h"
#include "tools/compiled.h"

namespace kiln::tools {

// ---- The command line ----------------------------------------------------------------------

// A command's CLI::App, `kiln NAME`, with kiln's help layout: "usage: " and `usage` (the
// lines after the first indented to line up), `description`, then each option group with
// every option's names, value name, help and default ("(default: X)" where the option shows
// its captured default). Options taking a value take one per occurrence, and the last one
// given counts; `-h` and `--help` print the help.
std::unique_ptr<CLI::App> make_command(const std::string& name, const std::string& usage,
                                       const std::string& description);

// Parses `argv` (the arguments after the command name) into `app`'s options. Returns false
// when they ask for help (printed to standard output: the caller exits 0). Every other
// problem, CLI11's own included, is a kiln::Error naming the command, the option and the
// value: `run: --atol must be a number, got '1e-4junk'`, `emit: unknown option '--bogus'
// (see 'kiln emit --help')`, `run: --profile needs --compiled DIR`.
bool parse_command(CLI::App& app, const std::vector<std::string>& argv);

// Strict numbers: the whole value must be the number, so `2x` and `1e-4junk` are refused.
// A whole number in [lo, hi].
CLI::Validator whole_number(int64_t lo, int64_t hi);
// A whole number in [lo, INT32_MAX] (an int), the message saying ">= lo".
CLI::Validator at_least(int64_t lo);
// A finite number.
CLI::Validator finite_number();
// A size in bytes: digits with an optional binary suffix K, M, G or T (2^10 ... 2^40), e.g.
// "512M", "8G"; nullopt for anything else, 0, or above 2^62.
std::optional<int64_t> parse_byte_size(const std::string& text);
CLI::Validator byte_size();

// kiln run's options (kiln parses them, and kiln-run again for --compiled).
struct RunArgs {
  std::string file;                     // FILE, '-' for standard input; unused with --compiled
  std::string weights, inputs;          // --weights, --inputs
  std::string function = "forward";     // --function
  std::string output;                   // -o
  std::string expect;                   // --expect
  double atol = 1e-4;                   // --atol
  std::string compiled;                 // --compiled DIR
  CompiledRunOptions compiled_options;  // --threads, --repeat, --profile
  bool bf16_linear = false;             // --bf16-linear
  std::string bf16_products;            // --bf16-products (with --bf16-linear, --int8-linear)
  bool int8_linear = false;             // --int8-linear
  std::string max_memory = "8G";        // --max-memory (interpreter only)
};
std::unique_ptr<CLI::App> run_command(RunArgs& args);

// kiln translate's options (kiln-run runs it). The search options are bound to `search`,
// which kiln_search_options_init fills: the C ABI's defaults are the CLI's and its help's.
// What kiln translate and kiln generate share: a compiled model, its weights and the search.
struct GeneratorArgs {
  std::string compiled, weights;               // --compiled DIR, --weights
  std::string output;                          // -o
  int threads = CompiledRunOptions{}.threads;  // --threads
  bool scores = false;                         // --scores
  kiln_search_options search;                  // --beam, --max-len, ...
  GeneratorArgs() { kiln_search_options_init(&search); }
};

struct TranslateArgs : GeneratorArgs {
  std::string inputs;                // --inputs
  std::string src_vocab, tgt_vocab;  // --src-vocab, --tgt-vocab
  std::string vocab_map;             // --vocab-map (runtime/vocab_map.h)
  std::vector<std::string> text;     // TEXT...
  // The batching of the sentences (runtime/batcher.h); the defaults are the setting measured
  // fastest on 2 cores (bench/README.md, "kiln translate on a whole file").
  int64_t max_batch_tokens = 1024;   // --max-batch-tokens
  int inter_threads = 2;             // --inter-threads
  bool inter_threads_given = false;  // --inter-threads was on the command line
};
std::unique_ptr<CLI::App> translate_command(TranslateArgs& args);

// kiln generate's options (kiln-run runs it): a decoder-only model continues prompts of
// token ids, an encoder–decoder generates from sources of token ids. Search options as
// translate's, with --stop-id.
struct GenerateArgs : GeneratorArgs {
  std::vector<std::string> prompts;  // PROMPT...
  bool stream = false;               // --stream
  std::vector<int64_t> stop_ids;     // --stop-id
  std::string tokenizer;             // --tokenizer: text prompts and output
};
std::unique_ptr<CLI::App> generate_command(GenerateArgs& args);

// kiln pack-weights's options (kiln-run runs it): a compiled model's weights, laid out as its
// kernels read them, written to one file that processes map and share.
struct PackWeightsArgs {
  std::string compiled, weights, output;  // --compiled DIR, --weights, -o
};
std::unique_ptr<CLI::App> pack_weights_command(PackWeightsArgs& args);

// ---- Files and output ----------------------------------------------------------------------

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
int report_outputs(const RunArgs& a, const std::vector<rt::TensorData>& data);

// The body of main for kiln and kiln-run: runs `dispatch` on the arguments after the
// program name; a kiln::Error becomes the `kiln: error:` line and exit status 1, any other
// exception `kiln: internal error:` and 70; what was printed must reach its destination.
int run_main(int argc, char** argv, int (*dispatch)(const std::vector<std::string>&));

}  // namespace kiln::tools
