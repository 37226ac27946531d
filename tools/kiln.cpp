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
#include "kiln_version.h"
#include "passes/pipeline.h"
#include "passes/plan_memory.h"
#include "passes/rewrite.h"
#include "support/error.h"
#include "support/file_io.h"
#include "tools/bridge.h"
#include "tools/cli.h"
#include "tools/dot.h"
#include "tools/import_cmd.h"

namespace kiln::tools {
namespace {

constexpr const char* kMainHelp = R"(kiln: an ahead-of-time compiler for Transformer models

usage: kiln <command> [options]

commands:
  emit MODEL      write a registered model's IR text (.kir)
  import MODEL    read an ONNX model into kiln IR (.kir) and a weights file
  inspect FILE    print entry points, weights and op histograms of a module
  opt FILE        run graph passes and print the resulting IR
  run FILE        run a function of a module with the reference interpreter
  compile FILE    compile a module to a static library and header (Halide, AOT)
  translate       generate with a compiled encoder–decoder: greedy, beam search or sampling
  generate        continue prompts with a compiled decoder-only model (token ids)
  serve           serve a compiled model over HTTP (the Open Inference Protocol, KServe v2)
  pack-weights    lay out a compiled model's weights in one file that processes map and share
  models          list registered models and their configs
  --version       print kiln's version

FILE may be '-' for standard input. 'kiln <command> --help' describes a command.
)";

ir::Module read_module(const std::string& path) {
  std::string text = read_text(path);
  return ir::parse_and_verify(text, path == "-" ? "<stdin>" : path);
}

// The lost-fusion notes of a pipeline run (passes/notes.h), on stderr after its output.
void print_notes(const ir::Module& m, const std::vector<passes::LostFusion>& lost,
                 const std::string& ir_file) {
  std::fflush(stdout);
  for (const std::string& line : passes::format_lost_fusions(m, lost, ir_file))
    fmt::print(stderr, "{}\n", line);
}

int cmd_models() {
  for (const auto& m : models::registry()) fmt::print("{}", models::describe(m));
  return 0;
}

int cmd_emit(const std::vector<std::string>& argv) {
  std::string model, config, output = "-";
  std::vector<std::string> sets;
  auto app = make_command("emit", "MODEL [--config NAME] [--set key=value]... [-o FILE]",
                          "Writes the IR text of a registered model (see 'kiln models').");
  app->add_option("MODEL", model, "a registered model")->required();
  app->add_option("--config", config, "config to start from (default: the only config, or base)")
      ->type_name("NAME");
  app->add_option("--set", sets, "override one config key (repeatable), e.g. --set d_model=256")
      ->type_name("key=value")
      ->allow_extra_args(false);
  app->add_option("-o", output, "output file; '-' or none: standard output")->type_name("FILE");
  if (!parse_command(*app, argv)) return 0;
  if (config.empty()) config = models::default_config(models::find_model(model));
  ir::Module m = models::build_model(model, config, sets);
  write_output(output, ir::print_module(m));
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
  std::string file, dot;
  bool ops = false, memory = false;
  auto app = make_command(
      "inspect", "FILE [--ops | --memory | --dot FUNCTION]",
      "Prints the module's entry points with their inputs and outputs, its weights (count,\n"
      "parameters, bytes) and an op histogram per function.");
  app->add_option("FILE", file, "the module ('-': standard input)")->required();
  app->add_flag("--ops", ops,
                "print only the histogram, one 'FUNCTION OP COUNT' line per function and op");
  app->add_flag("--memory", memory,
                "print each function's memory plan (run 'kiln opt' first): every arena value "
                "with offset, size and live range, the peak arena bytes and the sum of all "
                "intermediate sizes; exit 1 when a plan is unsound");
  app->add_option("--dot", dot,
                  "write FUNCTION as a Graphviz digraph (fused ops drawn as bold boxes), e.g. "
                  "kiln inspect m.kir --dot forward | dot -Tsvg -o forward.svg")
      ->type_name("FUNCTION");
  if (!parse_command(*app, argv)) return 0;
  ir::Module m = read_module(file);
  if (!dot.empty()) {
    const ir::Function* f = m.find_function(dot);
    if (!f) fail("inspect: module has no function '{}'", dot);
    fmt::print("{}", to_dot(m, *f));
    return 0;
  }
  if (memory) {
    // A check that finds a problem fails: every function's report is printed, then one
    // error line names the unsound plans (exit 1).
    std::vector<std::string> unsound;
    for (const ir::Function& f : m.functions) {
      if (f.arena_bytes < 0)
        fail("inspect: function '{}' has no memory plan (run 'kiln opt' first)", f.name);
      std::vector<std::string> problems = passes::check_memory_plan(m, f);
      fmt::print("function {}\n{}", f.name, passes::memory_report(m, f));
      fmt::print("plan check: {}\n\n", problems.empty()
                                           ? "sound (no two live values overlap)"
                                           : fmt::format("{} problem(s): {}", problems.size(),
                                                         fmt::join(problems, "; ")));
      if (!problems.empty())
        unsound.push_back(fmt::format("'{}' ({}: {})", f.name, problems.size(), problems[0]));
    }
    std::fflush(stdout);
    if (!unsound.empty())
      fail("inspect: the memory plan of function {} is unsound (run 'kiln opt' to plan it again)",
           fmt::join(unsound, ", "));
    return 0;
  }
  if (ops) {
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
  std::string path, passes = "default", debug_passes, output = "-";
  std::vector<std::string> print_after;
  bool split = false, verify_each = false;
  passes::PipelineOptions options;
  auto app = make_command(
      "opt",
      "FILE [--passes=default|NAME,...] [--print-ir-after-all] [--print-ir-after=NAME]\n"
      "[--time-passes] [--debug-passes=NAME,...|all] [--split-input-file] [-o FILE]",
      "Runs graph passes on a module and writes the resulting IR text.");
  app->add_option("FILE", path, "the module ('-': standard input)")->required();
  app->add_option("--passes", passes,
                  "'default' (the default pipeline) or a comma list of pass names")
      ->type_name("LIST")
      ->capture_default_str();
  app->add_flag("--print-ir-after-all", options.print_ir_after_all,
                "print the IR (to stderr) after every pass that changed it");
  app->add_option("--print-ir-after", print_after,
                  "print the IR (to stderr) after pass NAME (repeatable)")
      ->type_name("NAME")
      ->allow_extra_args(false);
  app->add_flag("--time-passes", options.time_passes, "print each pass's time (to stderr)");
  app->add_flag("--verify-each", verify_each,
                "verify after every pass (on by default in debug builds)");
  app->add_option("--debug-passes", debug_passes,
                  "log (to stderr) why the listed passes did or did not fire; LIST is 'all', "
                  "'default' or a comma list of pass names (the same as the environment "
                  "variable KILN_DEBUG_PASSES=LIST)")
      ->type_name("LIST");
  app->add_flag("--split-input-file", split,
                "split FILE at lines that are exactly '# -----' and run each part on its own: "
                "outputs are separated by '# -----' lines, an error in one part is reported "
                "(with its location in FILE) and the next part still runs; the exit status is "
                "1 if any part failed");
  app->add_option("-o", output, "output file; '-' or none: standard output")->type_name("FILE");
  std::string footer = "passes:\n";
  std::set<std::string> seen;
  for (const passes::PassInfo& p : passes::all_passes())
    if (seen.insert(p.name).second) footer += fmt::format("  {:<22}  {}\n", p.name, p.summary);
  footer += fmt::format("\ndefault pipeline: {}\n", fmt::join(passes::default_pipeline(), ","));
  app->footer(footer);
  if (!parse_command(*app, argv)) return 0;
  if (verify_each) options.verify_each = true;
  std::vector<std::string> names = passes::parse_pass_list(passes);
  for (const std::string& n : print_after) {
    passes::parse_pass_list(n);  // reject unknown names
    options.print_ir_after.insert(n);
  }
  if (!debug_passes.empty()) {
    // 'all', or pass names ('default': those of the default pipeline), each checked.
    std::vector<std::string> debug = {debug_passes};
    if (debug_passes != "all") debug = passes::parse_pass_list(debug_passes);
    passes::set_debug_passes(fmt::format("{}", fmt::join(debug, ",")));
  }
  if (!split) {
    ir::Module m = read_module(path);
    const std::vector<passes::LostFusion> lost = passes::run_passes(m, names, options);
    write_output(output, ir::print_module(m));
    print_notes(m, lost, path == "-" ? "<stdin>" : path);
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
      const std::vector<passes::LostFusion> lost = passes::run_passes(m, names, options);
      emit(ir::print_module(m));
      print_notes(m, lost, file);
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
  RunArgs a;
  if (!parse_command(*run_command(a), argv)) return 0;
  if (!a.compiled.empty()) exec_runner("run", argv);
  ir::InterpretOptions interpret_options;
  interpret_options.bf16_linear = a.bf16_linear;
  if (!a.bf16_products.empty() && !a.bf16_linear && !a.int8_linear)
    fail("run: --bf16-products needs --bf16-linear or --int8-linear");
  interpret_options.bf16_attention = (a.bf16_linear || a.int8_linear) && a.bf16_products != "fma";
  interpret_options.int8_linear = a.int8_linear;
  interpret_options.max_bytes = parse_byte_size(a.max_memory).value();  // checked by CLI11
  if (a.file.empty()) fail("run: FILE is required (see 'kiln run --help')");
  const std::string& file = a.file;
  const std::string& weights_path = a.weights;
  const std::string& inputs_path = a.inputs;
  const std::string& fname = a.function;
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
  std::string file, emit = "static";
  driver::CompileOptions options;
  auto app = make_command(
      "compile",
      "FILE.kir [--target T] [--weights f32|bf16|int8 [--bf16-products auto|dot|fma]\n"
      "[--bf16-activations on|off]] [-o DIR] [--name NAME] [--emit=static,shared,ir] [-j N]",
      "Runs the default pipeline, generates and compiles every kernel with Halide, and writes\n"
      "into DIR a static library libNAME.a and a header NAME.h (C++ class kiln_models::NAME "
      "with\ntyped entry points, over a plain C ABI). Link them with kiln's runtime library "
      "only.");
  app->add_option("FILE", file, "the module ('-': standard input)")->required();
  app->add_option("--target", options.target,
                  "Halide target string, e.g. "
                  "x86-64-linux-avx-avx2-avx512-avx512_skylake-f16c-fma-sse41")
      ->type_name("T")
      ->capture_default_str();
  app->add_option("--weights", options.weights,
                  "f32, bf16 or int8. bf16: linear weights converted to bf16 at load time (f32 or "
                  "bf16 safetensors), each linear's input rounded to bf16, products summed in f32 "
                  "(see --bf16-products). int8: "
                  "linear weights quantized per output row at load time (symmetric, scale "
                  "max|row|/127), each row of a linear's input quantized the same way as it runs, "
                  "products summed exactly in int32 with AVX512-VNNI's vpdpbusd, scaled back in "
                  "f32; attention as with bf16 (see --bf16-products). Norms and the rest stay "
                  "f32. Both need an AVX-512 target, and with 'host' a CPU with AVX512-BF16 "
                  "(bf16) or AVX512-VNNI (int8); the library refuses to load on a CPU without it")
      ->type_name("W")
      ->capture_default_str();
  app->add_option("--bf16-products", options.bf16_products,
                  "with --weights bf16, what the products run on: 'dot', AVX512-BF16's vdpbf16ps "
                  "(32 products an instruction), and attention's two products in bf16 too; "
                  "'fma', f32 FMAs on the widened weights (16), attention in f32; 'auto', both "
                  "forms in the library, which runs the one that does more products per ns on the "
                  "CPU it loads on (measured when the model is created, about a millisecond: fma "
                  "on Intel Sapphire/Emerald Rapids, dot on AMD Zen 4; the environment variable "
                  "KILN_BF16_PRODUCTS=dot|fma chooses instead). The same numbers either way but "
                  "for the order of the sums, and attention's rounding. With --weights int8 the "
                  "same choice for attention alone (the linears are int8 either way): 'dot' "
                  "bf16 (the library then needs AVX512-BF16 too), 'fma' f32, 'auto' both, f32 "
                  "where the CPU lacks AVX512-BF16")
      ->type_name("P")
      ->check(CLI::IsMember({"auto", "dot", "fma"}))
      ->capture_default_str();
  std::string activations = "on";
  app->add_option("--bf16-activations", activations,
                  "with --weights bf16: 'on', an activation that only bf16 kernels read (a "
                  "linear's input, attention's q, k and v) is written in bf16, rounded, by the "
                  "kernel that computes it, and read as it is (half the bytes between the two; "
                  "the same numbers, as each reader rounds its input to bf16 anyway); 'off', "
                  "every activation in f32")
      ->type_name("on|off")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app->add_option("-o", options.out_dir, "output directory")
      ->type_name("DIR")
      ->capture_default_str();
  app->add_option("--name", options.name,
                  "library name, a C identifier (default: the module's "
                  "name)")
      ->type_name("NAME");
  app->add_option("--emit", emit,
                  "comma list of static, shared, ir; 'shared' also writes libNAME.so with the C "
                  "ABI, for 'kiln run --compiled DIR'")
      ->type_name("LIST")
      ->capture_default_str();
  app->add_option("-j", options.jobs,
                  "compile N kernels at once, each in a child process (default: one per CPU)")
      ->type_name("N")
      ->check(at_least(1));
  if (!parse_command(*app, argv)) return 0;
  options.bf16_activations = activations == "on";
  ir::Module m = read_module(file);
  options.emit_static = false;
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
  options.note = [](const std::string& line) { fmt::print(stderr, "{}\n", line); };
  options.ir_file = file == "-" ? "<stdin>" : file;
  driver::CompileResult r = driver::compile_model(std::move(m), options);
  fmt::print(stderr, "kiln compile: {} kernels in {:.1f} s\n", r.kernels, r.seconds);
  return 0;
}

// kiln-run parses the options (the same declaration, tools/cli.cpp) and reports their
// errors; kiln answers --help itself, so that help needs no kiln-run.
int cmd_translate(const std::vector<std::string>& argv) {
  TranslateArgs a;
  try {
    if (!parse_command(*translate_command(a), argv)) return 0;
  } catch (const Error&) {  // kiln-run reports it
  }
  exec_runner("translate", argv);
}

int cmd_generate(const std::vector<std::string>& argv) {
  GenerateArgs a;
  try {
    if (!parse_command(*generate_command(a), argv)) return 0;
  } catch (const Error&) {  // kiln-run reports it
  }
  exec_runner("generate", argv);
}

int cmd_pack_weights(const std::vector<std::string>& argv) {
  PackWeightsArgs a;
  try {
    if (!parse_command(*pack_weights_command(a), argv)) return 0;
  } catch (const Error&) {  // kiln-run reports it
  }
  exec_runner("pack-weights", argv);
}

// kiln serve: kiln-run declares, parses and answers all of it, --help included (tools/serve.cpp).
[[noreturn]] void cmd_serve(const std::vector<std::string>& argv) { exec_runner("serve", argv); }

int dispatch(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    if (args.size() >= 2 && args[0] == "help") return dispatch({args[1], "--help"});
    fmt::print("{}", kMainHelp);
    return args.empty() ? 2 : 0;
  }
  const std::string& cmd = args[0];
  std::vector<std::string> rest(args.begin() + 1, args.end());
  if (cmd == "emit") return cmd_emit(rest);
  if (cmd == "import") return cmd_import(rest);
  if (cmd == "inspect") return cmd_inspect(rest);
  if (cmd == "run") return cmd_run(rest);
  if (cmd == "opt") return cmd_opt(rest);
  if (cmd == "compile") return cmd_compile(rest);
  if (cmd == "translate") return cmd_translate(rest);
  if (cmd == "generate") return cmd_generate(rest);
  if (cmd == "serve") cmd_serve(rest);
  if (cmd == "pack-weights") return cmd_pack_weights(rest);
  if (cmd == "models") return cmd_models();
  if (cmd == "--version") return fmt::print("kiln {}\n", KILN_VERSION), 0;
  fail("unknown command '{}' (see 'kiln --help')", cmd);
}

}  // namespace
}  // namespace kiln::tools

int main(int argc, char** argv) { return kiln::tools::run_main(argc, argv, kiln::tools::dispatch); }
