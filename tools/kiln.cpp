// The `kiln` command-line tool: emit, inspect and run models.
#include <unistd.h>
#include <charconv>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "driver/compile.h"
#include "frontend/models.h"
#include "ir/interpreter.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/pipeline.h"
#include "passes/plan_memory.h"
#include "passes/rewrite.h"
#include "support/error.h"
#include "support/file_io.h"
#include "tools/bridge.h"
#include "tools/cli.h"
#include "tools/dot.h"

namespace kiln::tools {
namespace {

constexpr const char* kMainHelp = R"(kiln: an ahead-of-time compiler for Transformer models

usage: kiln <command> [options]

commands:
  emit MODEL      write a registered model's IR text (.kir)
  inspect FILE    print entry points, weights and op histograms of a module
  opt FILE        run graph passes and print the resulting IR
  run FILE        run a function of a module with the reference interpreter
  compile FILE    compile a module to a static library and header (Halide, AOT)
  translate       generate with a compiled model: greedy, beam search or sampling
  models          list registered models and their configs

FILE may be '-' for standard input. 'kiln <command> --help' describes a command.
)";

constexpr const char* kEmitHelp =
    R"(usage: kiln emit MODEL [--config NAME] [--set key=value]... [-o FILE]

Writes the IR text of a registered model (see 'kiln models').

options:
  --config NAME     config to start from (default: the only config, or base)
  --set key=value   override one config key (repeatable), e.g. --set d_model=256
  -o FILE           output file; '-' or none: standard output
)";

constexpr const char* kInspectHelp = R"(usage: kiln inspect FILE [--ops | --memory | --dot FUNCTION]

Prints the module's entry points with their inputs and outputs, its weights (count,
parameters, bytes) and an op histogram per function.

options:
  --ops             print only the histogram, one 'FUNCTION OP COUNT' line per function and op
  --memory          print each function's memory plan (run 'kiln opt' first): every arena
                    value with offset, size and live range, the peak arena bytes and the
                    sum of all intermediate sizes
  --dot FUNCTION    write FUNCTION as a Graphviz digraph (fused ops drawn as bold boxes),
                    e.g. kiln inspect m.kir --dot forward | dot -Tsvg -o forward.svg
)";

constexpr const char* kCompileHelp =
    R"(usage: kiln compile FILE.kir [--target T] [--weights f32|bf16] [-o DIR] [--name NAME]
                    [--emit=static,shared,ir] [-j N]

Runs the default pipeline, generates and compiles every kernel with Halide, and writes
into DIR a static library libNAME.a and a header NAME.h (C++ class kiln_models::NAME with
typed entry points, over a plain C ABI). Link them with kiln's runtime library only.

options:
  --target T     Halide target string (default: host), e.g.
                 x86-64-linux-avx-avx2-avx512-avx512_skylake-f16c-fma-sse41
  --weights W    f32 (default) or bf16: linear weights converted to bf16 at load time (f32 or
                 bf16 safetensors), products summed in f32 with AVX512-BF16's vdpbf16ps;
                 attention, norms and the rest stay f32. Needs an AVX-512 target, and with
                 'host' a CPU with AVX512-BF16; the library refuses to load on a CPU without it
  -o DIR         output directory (default: .)
  --name NAME    library name, a C identifier (default: the module's name)
  --emit=LIST    comma list of static, shared, ir (default: static); 'shared' also writes
                 libNAME.so with the C ABI, for 'kiln run --compiled DIR'
  -j N           compile N kernels at once, each in a child process (default: one per CPU)
)";

constexpr const char* kOptHelp =
    R"(usage: kiln opt FILE [--passes=default|NAME,NAME,...] [options] [-o FILE]

Runs graph passes on a module and writes the resulting IR text.

options:
  --passes=LIST           'default' (the default) or a comma list of pass names
  --print-ir-after-all    print the IR (to stderr) after every pass that changed it
  --print-ir-after=NAME   print the IR (to stderr) after pass NAME (repeatable)
  --time-passes           print each pass's time (to stderr)
  --verify-each           verify after every pass (on by default in debug builds)
  --debug-passes=LIST     log (to stderr) why the listed passes did or did not fire; LIST
                          is 'all', 'default' or a comma list of pass names (the same as
                          the environment variable KILN_DEBUG_PASSES=LIST)
  --split-input-file      split FILE at lines that are exactly '# -----' and run each part
                          on its own: outputs are separated by '# -----' lines, an error in
                          one part is reported (with its location in FILE) and the next
                          part still runs; the exit status is 1 if any part failed
  -o FILE                 output file; '-' or none: standard output

passes:
)";

constexpr const char* kRunHelp =
    R"(usage: kiln run FILE --weights W.safetensors --inputs IN.safetensors [options]

Runs a function with the reference interpreter. Inputs are read by parameter name
(ids as I32 or I64, checked against the vocabulary); outputs are written by result name.

options:
  --weights FILE      weights by state_dict name (required)
  --inputs FILE       inputs by parameter name (required)
  --function NAME     entry point to run (default: forward)
  -o FILE             write the outputs as safetensors; without it, print a summary
  --expect FILE       compare outputs with the same-named tensors of FILE; exit 1 when
                      the max abs error exceeds --atol
  --atol X            tolerance for --expect (default: 1e-4)
  --compiled DIR      run the shared library that 'kiln compile --emit=shared' wrote in
                      DIR instead of the interpreter (FILE is then not needed: pass '-'
                      or omit it)
  --threads N         kernel threads for --compiled (default: the Halide runtime's)
  --repeat N          with --compiled: run N times (outputs from the last run)
  --profile           with --compiled: print the time per entry-point run and per kernel
                      (calls, total, per call, share) to stderr
  --bf16-linear       interpreter only: every linear op rounds its input and weight to bf16
                      first, as a library compiled with '--weights bf16' does (run it on
                      that library's optimized IR, 'kiln compile --emit=ir')
)";

constexpr const char* kTranslateHelp =
    R"(usage: kiln translate --compiled DIR --weights W.safetensors
                      (--inputs IN.safetensors | --src-vocab V --tgt-vocab V [TEXT...])
                      [search options] [-o OUT.safetensors]

Generates target sentences with a compiled model (from 'kiln compile --emit=shared'), over
its prepare and decode_step entry points: greedy search, beam search or sampling.

Input: the source ids of --inputs (tensor 'src', [batch, length], padded with the model's
pad_id), or text with --src-vocab and --tgt-vocab: each TEXT argument, or without any,
each line of standard input, is a source sentence; one line 'SOURCE -> TRANSLATION' is
printed per sentence (and per hypothesis with --num-hypotheses). The vocabularies are
character-level files, one token per line (see examples/numbers/README.md).

Output: with -o, a safetensors file with 'ids' I64 [batch, hypotheses, max_len] (-1 after
each hypothesis), 'lengths' I64 [batch, hypotheses] and 'scores' F32 [batch, hypotheses];
without -o and without vocabularies, each hypothesis's ids and score are printed.

search options:
  --beam N             beam size (default 1: greedy), at most the model's max_beam
  --num-hypotheses N   hypotheses per sentence, at most the beam size (default 1)
  --max-len N          tokens to generate at most, end token included (default: max_len)
  --min-len N          tokens before the end token may be generated (default 0)
  --length-penalty X   scores are divided by length^X (default 0)
  --start-id ID        first decoder token (default: the model's bos_id)
  --end-id ID          end token (default: the model's eos_id)
  --sampling-topk K    sample from the K most likely tokens (0: all); 1 (default): no
                       sampling. Needs --beam 1
  --temperature X      sampling temperature (default 1)
  --seed N             sampling seed (default 0): the same seed gives the same output
  --threads N          kernel threads (default: the Halide runtime's)
  --scores             with text, print each translation's score too
)";

std::string one_positional(const Args& a, const std::string& command, const char* what) {
  if (a.positional.size() != 1)
    fail("{}: expected one {} argument, got {} (see 'kiln {} --help')", command, what,
         a.positional.size(), command);
  return a.positional[0];
}

ir::Module read_module(const std::string& path) {
  std::string text = read_text(path);
  return ir::parse_and_verify(text, path == "-" ? "<stdin>" : path);
}

int cmd_models() {
  for (const auto& m : models::registry()) fmt::print("{}", models::describe(m));
  return 0;
}

int cmd_emit(const std::vector<std::string>& argv) {
  if (wants_help(argv)) return fmt::print("{}", kEmitHelp), 0;
  Args a = Args::parse(argv, {"--config", "--set", "-o"}, {}, "emit");
  std::string model = one_positional(a, "emit", "MODEL");
  std::vector<std::string> sets;
  if (a.options.count("--set")) sets = a.options.at("--set");
  const std::string config =
      a.get("--config").value_or(models::default_config(models::find_model(model)));
  ir::Module m = models::build_model(model, config, sets);
  write_output(a.get("-o").value_or("-"), ir::print_module(m));
  return 0;
}

std::string with_commas(int64_t n) {
  std::string s = std::to_string(n), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

std::string human_bytes(int64_t b) {
  if (b >= (int64_t{1} << 20)) return fmt::format("{:.1f} MiB", b / 1048576.0);
  if (b >= 1024) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{} B", b);
}

// Op kinds and counts of a function, in first-use order of the IR's op list.
std::vector<std::pair<std::string, int>> histogram(const ir::Function& f) {
  std::map<ir::OpKind, int> counts;
  for (const ir::Op& op : f.ops) ++counts[op.kind];
  std::vector<std::pair<std::string, int>> out;
  for (const auto& [k, n] : counts) out.emplace_back(ir::op_name(k), n);
  return out;
}

int cmd_inspect(const std::vector<std::string>& argv) {
  if (wants_help(argv)) return fmt::print("{}", kInspectHelp), 0;
  Args a = Args::parse(argv, {"--dot"}, {"--ops", "--memory"}, "inspect");
  ir::Module m = read_module(one_positional(a, "inspect", "FILE"));
  if (auto fn = a.get("--dot")) {
    const ir::Function* f = m.find_function(*fn);
    if (!f) fail("inspect: module has no function '{}'", *fn);
    fmt::print("{}", to_dot(m, *f));
    return 0;
  }
  if (a.flags.count("--memory")) {
    for (const ir::Function& f : m.functions) {
      if (f.arena_bytes < 0)
        fail("inspect: function '{}' has no memory plan (run 'kiln opt' first)", f.name);
      std::vector<std::string> problems = passes::check_memory_plan(m, f);
      fmt::print("function {}\n{}", f.name, passes::memory_report(m, f));
      fmt::print("plan check: {}\n\n", problems.empty()
                                           ? "sound (no two live values overlap)"
                                           : fmt::format("{} problem(s): {}", problems.size(),
                                                         fmt::join(problems, "; ")));
    }
    return 0;
  }
  if (a.flags.count("--ops")) {
    for (const ir::Function& f : m.functions)
      for (const auto& [op, n] : histogram(f)) fmt::print("{} {} {}\n", f.name, op, n);
    return 0;
  }
  fmt::print("module @{}\n", m.name);
  if (!m.config.empty()) {
    std::string cfg;
    for (const auto& [k, v] : m.config) cfg += fmt::format(" {}={}", k, v);
    fmt::print("config:{}\n", cfg);
  }
  std::string syms;
  for (const auto& s : m.symbols) syms += fmt::format(" {}<={}", s.name, s.max);
  fmt::print("symbols:{}\n", syms);
  int64_t params = 0, bytes = 0, loaded = 0;
  for (const auto& w : m.weights) {
    if (w.derivation) continue;
    ++loaded;
    params += ir::static_numel(w.type);
    bytes += ir::static_numel(w.type) * ir::dtype_size(w.type.dtype);
  }
  fmt::print("weights: {} tensors, {} parameters, {}\n", loaded, with_commas(params),
             human_bytes(bytes));
  for (const ir::Function& f : m.functions) {
    std::string ins, outs;
    for (ir::ValueId p : f.params)
      ins += fmt::format("{}%{}: {}", ins.empty() ? "" : ", ", f.values[p].name,
                         ir::to_string(f.type(p)));
    for (ir::ValueId r : f.results)
      outs += fmt::format("{}%{}: {}", outs.empty() ? "" : ", ", f.values[r].name,
                          ir::to_string(f.type(r)));
    std::set<std::string> used;
    int64_t used_params = 0;
    for (const ir::Op& op : f.ops)
      if (op.kind == ir::OpKind::weight && used.insert(op.str_attr("name")).second)
        used_params += ir::static_numel(f.type(op.result));
    fmt::print("\nentry point {}({}) -> ({})\n", f.name, ins, outs);
    fmt::print("  weights used: {} tensors, {} parameters\n", used.size(),
               with_commas(used_params));
    fmt::print("  ops: {}\n", f.ops.size());
    for (const auto& [op, n] : histogram(f)) fmt::print("    {:<16} {}\n", op, n);
  }
  return 0;
}

// The parts of `text` between lines that are exactly "# -----" (kiln opt
// --split-input-file). Each part starts with one newline per line before it, so that the
// locations the parser reports in it are those of the whole text.
std::vector<std::string> split_input(const std::string& text) {
  std::vector<std::string> parts(1);
  int lines = 0;
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = std::min(text.find('\n', pos), text.size());
    ++lines;
    if (std::string_view(text).substr(pos, end - pos) == "# -----")
      parts.emplace_back(lines, '\n');
    else
      parts.back().append(text, pos, end + 1 - pos);
    pos = end + 1;
  }
  return parts;
}

int cmd_opt(const std::vector<std::string>& argv) {
  if (wants_help(argv)) {
    fmt::print("{}", kOptHelp);
    std::set<std::string> seen;
    for (const passes::PassInfo& p : passes::all_passes())
      if (seen.insert(p.name).second) fmt::print("  {:<22}  {}\n", p.name, p.summary);
    fmt::print("\ndefault pipeline: {}\n", fmt::join(passes::default_pipeline(), ","));
    return 0;
  }
  Args a = Args::parse(
      argv, {"--passes", "--print-ir-after", "--debug-passes", "-o"},
      {"--print-ir-after-all", "--time-passes", "--verify-each", "--split-input-file"}, "opt");
  const std::string path = one_positional(a, "opt", "FILE");
  passes::PipelineOptions options;
  options.print_ir_after_all = a.flags.count("--print-ir-after-all") > 0;
  options.time_passes = a.flags.count("--time-passes") > 0;
  if (a.flags.count("--verify-each")) options.verify_each = true;
  std::vector<std::string> names = passes::parse_pass_list(a.get("--passes").value_or("default"));
  if (a.options.count("--print-ir-after"))
    for (const std::string& n : a.options.at("--print-ir-after")) {
      passes::parse_pass_list(n);  // reject unknown names
      options.print_ir_after.insert(n);
    }
  if (auto list = a.get("--debug-passes")) {
    // 'all', or pass names ('default': those of the default pipeline), each checked.
    std::vector<std::string> debug = {*list};
    if (*list != "all") debug = passes::parse_pass_list(*list);
    passes::set_debug_passes(fmt::format("{}", fmt::join(debug, ",")));
  }
  const std::string output = a.get("-o").value_or("-");
  if (!a.flags.count("--split-input-file")) {
    ir::Module m = read_module(path);
    passes::run_passes(m, names, options);
    write_output(output, ir::print_module(m));
    return 0;
  }
  // Each part on its own; to standard output as each is done, so that its errors and logs
  // come right after the output of the part before.
  const std::string text = read_text(path);
  const std::string file = path == "-" ? "<stdin>" : path;
  const bool to_stdout = output == "-";
  std::string all;
  auto emit = [&](const std::string& s) {
    if (to_stdout)
      write_output(output, s);
    else
      all += s;
  };
  bool failed = false;
  const std::vector<std::string> parts = split_input(text);
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) emit("# -----\n");
    try {
      ir::Module m = ir::parse_and_verify(parts[i], file);
      passes::run_passes(m, names, options);
      emit(ir::print_module(m));
    } catch (const Error& e) {
      print_error(e);
      failed = true;
    }
  }
  if (!to_stdout) write_output(output, all);
  return failed ? 1 : 0;
}

// Compiled libraries run in kiln-run (tools/kiln_run.cpp), an executable beside this one
// that links kiln's runtime but not the compiler: an OpenCL driver such as pocl loads its
// own LLVM, which crashes next to the LLVM that libHalide brings into this process. Replaces
// this process with `kiln-run COMMAND ARGV...`, which takes the same arguments and prints
// the same output and errors; its exit status is kiln's.
[[noreturn]] void exec_runner(const std::string& command, const std::vector<std::string>& argv) {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) fail("{}: cannot find the kiln executable (/proc/self/exe): {}", command, ec.message());
  const std::string runner = (self.parent_path() / "kiln-run").string();
  std::vector<std::string> args = {runner, command};
  args.insert(args.end(), argv.begin(), argv.end());
  std::vector<char*> c_args;
  for (std::string& s : args) c_args.push_back(s.data());
  c_args.push_back(nullptr);
  std::fflush(stdout);
  ::execv(runner.c_str(), c_args.data());
  fail("{}: cannot run '{}', which runs compiled libraries for kiln (installed next to it): {}",
       command, runner, std::strerror(errno));
}

int cmd_run(const std::vector<std::string>& argv) {
  if (wants_help(argv)) return fmt::print("{}", kRunHelp), 0;
  Args a = Args::parse(argv, kRunOptions, kRunFlags, "run");
  if (a.get("--compiled")) exec_runner("run", argv);
  std::string weights_path = a.require("--weights", "run");
  std::string inputs_path = a.require("--inputs", "run");
  std::string fname = a.get("--function").value_or("forward");
  for (const char* only : {"--threads", "--repeat", "--profile"})
    if (a.get(only) || a.flags.count(only)) fail("run: {} needs --compiled DIR", only);
  ir::InterpretOptions interpret_options;
  interpret_options.bf16_linear = a.flags.count("--bf16-linear") > 0;
  std::string file = one_positional(a, "run", "FILE");
  int stdin_uses = (file == "-") + (weights_path == "-") + (inputs_path == "-");
  if (stdin_uses > 1) fail("run: only one of FILE, --weights and --inputs can be '-'");
  ir::Module m = read_module(file);
  const ir::Function* f = m.find_function(fname);
  if (!f) {
    std::string known;
    for (const auto& fn : m.functions) known += (known.empty() ? "" : ", ") + fn.name;
    fail("run: module has no function '{}' (functions: {})", fname, known);
  }
  rt::SafeTensors wfile = load_safetensors(weights_path);
  ir::WeightMap weights = load_weight_map(m, wfile);
  rt::SafeTensors ifile = load_safetensors(inputs_path);
  const std::vector<rt::TensorData> data =
      to_tensor_data(*f, ir::interpret(m, *f, weights, load_inputs(*f, ifile), interpret_options));
  return report_outputs(a, data);
}

int cmd_compile(const std::vector<std::string>& argv) {
  if (wants_help(argv)) return fmt::print("{}", kCompileHelp), 0;
  Args a =
      Args::parse(argv, {"--target", "--weights", "-o", "--name", "--emit", "-j"}, {}, "compile");
  ir::Module m = read_module(one_positional(a, "compile", "FILE"));
  driver::CompileOptions options;
  if (auto j = a.get("-j")) {
    auto [end, ec] = std::from_chars(j->data(), j->data() + j->size(), options.jobs);
    if (ec != std::errc() || end != j->data() + j->size() || options.jobs < 1)
      fail("compile: -j must be a whole number >= 1, got '{}'", *j);
  }
  options.target = a.get("--target").value_or("host");
  options.weights = a.get("--weights").value_or("f32");
  options.out_dir = a.get("-o").value_or(".");
  options.name = a.get("--name").value_or("");
  options.emit_static = false;
  std::string emit = a.get("--emit").value_or("static");
  size_t start = 0;
  while (start <= emit.size()) {
    size_t comma = emit.find(',', start);
    std::string item =
        emit.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item == "static")
      options.emit_static = true;
    else if (item == "shared")
      options.emit_shared = true;
    else if (item == "ir")
      options.emit_ir = true;
    else
      fail("compile: unknown --emit item '{}' (expected static, shared or ir)", item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  options.progress = [](const std::string& line) {
    fmt::print(stderr, "kiln compile: {}\n", line);
  };
  driver::CompileResult r = driver::compile_model(std::move(m), options);
  fmt::print(stderr, "kiln compile: {} kernels in {:.1f} s\n", r.kernels, r.seconds);
  return 0;
}

int cmd_translate(const std::vector<std::string>& argv) {
  if (wants_help(argv)) return fmt::print("{}", kTranslateHelp), 0;
  exec_runner("translate", argv);
}

int dispatch(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    if (args.size() >= 2 && args[0] == "help") return dispatch({args[1], "--help"});
    fmt::print("{}", kMainHelp);
    return args.empty() ? 2 : 0;
  }
  const std::string& cmd = args[0];
  std::vector<std::string> rest(args.begin() + 1, args.end());
  if (cmd == "emit") return cmd_emit(rest);
  if (cmd == "inspect") return cmd_inspect(rest);
  if (cmd == "run") return cmd_run(rest);
  if (cmd == "opt") return cmd_opt(rest);
  if (cmd == "compile") return cmd_compile(rest);
  if (cmd == "translate") return cmd_translate(rest);
  if (cmd == "models") return cmd_models();
  if (cmd == "--version") return fmt::print("kiln 0.1.0\n"), 0;
  fail("unknown command '{}' (see 'kiln --help')", cmd);
}

}  // namespace
}  // namespace kiln::tools

int main(int argc, char** argv) { return kiln::tools::run_main(argc, argv, kiln::tools::dispatch); }
