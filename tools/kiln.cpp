// The `kiln` command-line tool: emit, inspect and run models.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "codegen/compile.h"
#include "frontend/models.h"
#include "ir/interpreter.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "kiln/vocab.h"
#include "passes/pipeline.h"
#include "passes/plan_memory.h"
#include "passes/rewrite.h"
#include "support/error.h"
#include "support/file_io.h"
#include "tools/bridge.h"
#include "tools/compiled.h"
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
                    [--emit=static,shared,ir]

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

// A minimal option parser: positional arguments and --name value / --name=value.
struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::vector<std::string>> options;
  std::set<std::string> flags;

  static Args parse(const std::vector<std::string>& argv, const std::set<std::string>& with_value,
                    const std::set<std::string>& flag_names, const std::string& command) {
    Args a;
    for (size_t i = 0; i < argv.size(); ++i) {
      const std::string& s = argv[i];
      if (s.size() > 1 && s[0] == '-' && s != "-") {
        std::string name = s, value;
        bool has_value = false;
        if (size_t eq = s.find('='); eq != std::string::npos) {
          name = s.substr(0, eq);
          value = s.substr(eq + 1);
          has_value = true;
        }
        if (flag_names.count(name)) {
          if (has_value) fail("{}: option '{}' takes no value", command, name);
          a.flags.insert(name);
        } else if (with_value.count(name)) {
          if (!has_value) {
            if (i + 1 >= argv.size()) fail("{}: option '{}' needs a value", command, name);
            value = argv[++i];
          }
          a.options[name].push_back(value);
        } else {
          fail("{}: unknown option '{}' (see 'kiln {} --help')", command, name, command);
        }
      } else {
        a.positional.push_back(s);
      }
    }
    return a;
  }
  std::optional<std::string> get(const std::string& name) const {
    auto it = options.find(name);
    if (it == options.end()) return std::nullopt;
    return it->second.back();
  }
  std::string require(const std::string& name, const std::string& command) const {
    auto v = get(name);
    if (!v) fail("{}: missing required option '{}' (see 'kiln {} --help')", command, name, command);
    return *v;
  }
};

bool wants_help(const std::vector<std::string>& argv) {
  for (const auto& a : argv)
    if (a == "--help" || a == "-h") return true;
  return false;
}

// Standard output for "-", else the file, written whole or not at all (file_io.h).
void write_output(const std::string& path, const std::string& text) {
  if (path.empty() || path == "-")
    write_stdout(text);
  else
    write_file_atomically(path, text);
}

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

// Prints `e` as the `kiln: error: ...` line, after whatever standard output holds.
void print_error(const Error& e) {
  std::fflush(stdout);
  fmt::print(stderr, "kiln: error: {}\n", e.what());
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

// The value of option `name` as an integer >= 1.
int positive_int(const std::string& value, const char* name) {
  int v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || v < 1)
    fail("run: {} must be a whole number >= 1, got '{}'", name, value);
  return v;
}

int cmd_run(const std::vector<std::string>& argv) {
  if (wants_help(argv)) return fmt::print("{}", kRunHelp), 0;
  Args a = Args::parse(argv,
                       {"--weights", "--inputs", "--function", "-o", "--expect", "--atol",
                        "--compiled", "--threads", "--repeat"},
                       {"--profile", "--bf16-linear"}, "run");
  std::string weights_path = a.require("--weights", "run");
  std::string inputs_path = a.require("--inputs", "run");
  std::string fname = a.get("--function").value_or("forward");
  std::vector<rt::TensorData> data;
  if (auto dir = a.get("--compiled")) {
    if (a.positional.size() > 1 || (a.positional.size() == 1 && a.positional[0] != "-"))
      fail("run: with --compiled, FILE is not used (got '{}')", a.positional[0]);
    rt::SafeTensors ifile = load_safetensors(inputs_path);
    CompiledRunOptions options;
    if (auto t = a.get("--threads")) options.threads = positive_int(*t, "--threads");
    if (auto r = a.get("--repeat")) options.repeat = positive_int(*r, "--repeat");
    options.profile = a.flags.count("--profile") > 0;
    data = run_compiled(*dir, fname, weights_path, ifile, options);
  } else {
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
    data = to_tensor_data(*f,
                          ir::interpret(m, *f, weights, load_inputs(*f, ifile), interpret_options));
  }
  // Outputs as f32 for summaries and comparisons (integer outputs are summarized by shape).
  auto floats = [](const rt::TensorData& t) {
    std::vector<float> v(t.data.size() / 4);
    std::memcpy(v.data(), t.data.data(), v.size() * 4);
    return v;
  };

  if (auto out = a.get("-o")) {
    rt::write_safetensors(*out, data);
    fmt::print(stderr, "wrote {} output(s) to {}\n", data.size(), *out);
  } else if (!a.get("--expect")) {
    for (const rt::TensorData& t : data) {
      if (t.dtype != rt::DType::f32) {
        fmt::print("{}: {} {}\n", t.name, rt::dtype_name(t.dtype), rt::shape_string(t.shape));
        continue;
      }
      std::vector<float> v = floats(t);
      double lo = INFINITY, hi = -INFINITY, sum = 0;
      for (float x : v) lo = std::min<double>(lo, x), hi = std::max<double>(hi, x), sum += x;
      fmt::print("{}: f32{} min {:.6g} max {:.6g} mean {:.6g}\n", t.name, rt::shape_string(t.shape),
                 lo, hi, v.empty() ? 0.0 : sum / v.size());
    }
  }
  if (auto expect_path = a.get("--expect")) {
    double atol = 1e-4;
    if (auto s = a.get("--atol")) {
      try {
        atol = std::stod(*s);
      } catch (...) {
        fail("run: --atol needs a number, got '{}'", *s);
      }
    }
    rt::SafeTensors expected = load_safetensors(*expect_path);
    bool ok = true;
    for (const rt::TensorData& t : data) {
      const rt::TensorInfo& e = expected.at(t.name);
      if (e.shape != t.shape)
        fail("run: output '{}' has shape {}, expected {}", t.name, rt::shape_string(t.shape),
             rt::shape_string(e.shape));
      if (t.dtype != rt::DType::f32) {
        // Ids and masks: exact. The expected tensor may be I64 or I32 for ids.
        std::vector<int64_t> got(t.data.size() / rt::dtype_size(t.dtype));
        for (size_t j = 0; j < got.size(); ++j)
          got[j] = t.dtype == rt::DType::i64 ? reinterpret_cast<const int64_t*>(t.data.data())[j]
                                             : t.data[j];
        std::vector<int64_t> want;
        if (e.dtype == rt::DType::boolean || e.dtype == rt::DType::u8) {
          std::span<const uint8_t> b = expected.bytes(e);
          want.assign(b.begin(), b.end());
        } else {
          want = expected.to_i64(e);
        }
        int64_t differ = 0;
        for (size_t j = 0; j < got.size(); ++j) differ += got[j] != want[j];
        ok &= differ == 0;
        fmt::print("{}: {} of {} elements differ vs {} ({})\n", t.name, differ, got.size(),
                   *expect_path, differ == 0 ? "match" : "MISMATCH");
        continue;
      }
      // NaN or an infinity matches only the same value in the expected tensor.
      std::vector<float> want = expected.to_f32(e), got = floats(t);
      double err = 0;
      int64_t non_finite = 0;
      for (size_t j = 0; j < want.size() && j < got.size(); ++j) {
        if (!std::isfinite(got[j]) || !std::isfinite(want[j])) {
          const bool same = (std::isnan(got[j]) && std::isnan(want[j])) || got[j] == want[j];
          non_finite += !same;
          continue;
        }
        err = std::max(err, std::abs(static_cast<double>(got[j]) - want[j]));
      }
      bool pass = err <= atol && non_finite == 0;
      ok &= pass;
      if (non_finite)
        fmt::print("{}: {} NaN or infinite element(s) where {} has another value (MISMATCH)\n",
                   t.name, non_finite, *expect_path);
      fmt::print("{}: max abs error {:.3g} vs {} ({} <= {:g})\n", t.name, err, *expect_path,
                 pass ? "match" : "MISMATCH", atol);
    }
    return ok ? 0 : 1;
  }
  return 0;
}

int cmd_compile(const std::vector<std::string>& argv) {
  if (wants_help(argv)) return fmt::print("{}", kCompileHelp), 0;
  Args a = Args::parse(argv, {"--target", "--weights", "-o", "--name", "--emit"}, {}, "compile");
  ir::Module m = read_module(one_positional(a, "compile", "FILE"));
  codegen::CompileOptions options;
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
  codegen::CompileResult r = codegen::compile_model(std::move(m), options);
  fmt::print(stderr, "kiln compile: {} kernels in {:.1f} s\n", r.kernels, r.seconds);
  return 0;
}

// The value of option `name` as an integer in [lo, hi].
int64_t int_option(const std::string& value, const char* name, int64_t lo, int64_t hi) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || v < lo || v > hi)
    fail("translate: {} must be a whole number in [{}, {}], got '{}'", name, lo, hi, value);
  return v;
}

double float_option(const std::string& value, const char* name) {
  double v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size() || !std::isfinite(v))
    fail("translate: {} must be a number, got '{}'", name, value);
  return v;
}

kiln::Vocabulary load_vocab(const std::string& path) {
  try {
    return kiln::Vocabulary::load(path);
  } catch (const std::runtime_error& e) {
    fail("translate: {}", e.what());
  }
}

int cmd_translate(const std::vector<std::string>& argv) {
  if (wants_help(argv)) return fmt::print("{}", kTranslateHelp), 0;
  Args a = Args::parse(
      argv,
      {"--compiled", "--weights", "--inputs", "--src-vocab", "--tgt-vocab", "-o", "--beam",
       "--num-hypotheses", "--max-len", "--min-len", "--length-penalty", "--start-id", "--end-id",
       "--sampling-topk", "--temperature", "--seed", "--threads"},
      {"--scores"}, "translate");
  const std::string dir = a.require("--compiled", "translate");
  const std::string weights = a.require("--weights", "translate");
  GenerateOptions o;
  constexpr int64_t kMaxInt = INT32_MAX;
  if (auto v = a.get("--beam"))
    o.beam_size = static_cast<int32_t>(int_option(*v, "--beam", 0, kMaxInt));
  if (auto v = a.get("--num-hypotheses"))
    o.num_hypotheses = static_cast<int32_t>(int_option(*v, "--num-hypotheses", 0, kMaxInt));
  if (auto v = a.get("--max-len"))
    o.max_decoding_length = static_cast<int32_t>(int_option(*v, "--max-len", 1, kMaxInt));
  if (auto v = a.get("--min-len"))
    o.min_decoding_length = static_cast<int32_t>(int_option(*v, "--min-len", 0, kMaxInt));
  if (auto v = a.get("--length-penalty"))
    o.length_penalty = static_cast<float>(float_option(*v, "--length-penalty"));
  if (auto v = a.get("--start-id")) o.start_id = int_option(*v, "--start-id", 0, INT64_MAX);
  if (auto v = a.get("--end-id")) o.end_id = int_option(*v, "--end-id", 0, INT64_MAX);
  if (auto v = a.get("--sampling-topk"))
    o.sampling_top_k = static_cast<int32_t>(int_option(*v, "--sampling-topk", 0, kMaxInt));
  if (auto v = a.get("--temperature"))
    o.sampling_temperature = static_cast<float>(float_option(*v, "--temperature"));
  if (auto v = a.get("--seed"))
    o.seed = static_cast<uint64_t>(int_option(*v, "--seed", 0, INT64_MAX));
  if (auto v = a.get("--threads"))
    o.threads = static_cast<int>(int_option(*v, "--threads", 1, 1024));

  const bool text = a.get("--src-vocab") || a.get("--tgt-vocab");
  if (text && !(a.get("--src-vocab") && a.get("--tgt-vocab")))
    fail("translate: --src-vocab and --tgt-vocab go together");
  if (text == a.get("--inputs").has_value())
    fail("translate: give either --inputs IN.safetensors or --src-vocab and --tgt-vocab");
  if (!text && !a.positional.empty())
    fail("translate: TEXT arguments need --src-vocab and --tgt-vocab (got '{}')", a.positional[0]);

  std::vector<std::vector<int64_t>> sentences;
  std::vector<std::string> lines;
  std::optional<kiln::Vocabulary> src_vocab, tgt_vocab;
  std::vector<int64_t> src;
  int64_t batch = 0, length = 0;
  if (text) {
    src_vocab = load_vocab(*a.get("--src-vocab"));
    tgt_vocab = load_vocab(*a.get("--tgt-vocab"));
    lines = a.positional;
    if (lines.empty()) {
      std::string line;
      while (std::getline(std::cin, line)) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        lines.push_back(line);
      }
    }
    const int64_t pad = src_vocab->id("<pad>");
    if (pad < 0) fail("translate: the source vocabulary has no <pad> token");
    for (size_t i = 0; i < lines.size(); ++i) {
      try {
        sentences.push_back(src_vocab->encode(lines[i]));
      } catch (const std::runtime_error& e) {
        fail("translate: sentence {}: {}", i + 1, e.what());
      }
      if (sentences.back().empty()) fail("translate: sentence {} is empty", i + 1);
      length = std::max<int64_t>(length, static_cast<int64_t>(sentences.back().size()));
    }
    batch = static_cast<int64_t>(sentences.size());
    src.assign(static_cast<size_t>(batch * length), pad);
    for (int64_t b = 0; b < batch; ++b)
      std::copy(sentences[b].begin(), sentences[b].end(), src.begin() + b * length);
  } else {
    rt::SafeTensors ifile = load_safetensors(*a.get("--inputs"));
    const rt::TensorInfo* t = ifile.find("src");
    if (!t) fail("translate: inputs '{}' have no tensor 'src'", ifile.label());
    if (t->shape.size() != 2)
      fail("translate: 'src' must be [batch, length], got rank {}", t->shape.size());
    batch = t->shape[0];
    length = t->shape[1];
    src = ifile.to_i64(*t);
  }
  Generated g = generate_compiled(dir, weights, src, batch, length, o);
  if (auto out = a.get("-o")) {
    std::vector<rt::TensorData> data;
    data.push_back(rt::make_i64("ids", {g.batch, g.hypotheses, g.max_length}, g.ids));
    data.push_back(rt::make_i64("lengths", {g.batch, g.hypotheses}, g.lengths));
    data.push_back(rt::make_f32("scores", {g.batch, g.hypotheses}, g.scores));
    rt::write_safetensors(*out, data);
    return 0;
  }
  std::string printed;
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t h = 0; h < g.hypotheses; ++h) {
      const int64_t at = b * g.hypotheses + h;
      std::vector<int64_t> ids(g.ids.begin() + at * g.max_length,
                               g.ids.begin() + at * g.max_length + g.lengths[at]);
      if (text) {
        std::string translation;
        try {
          translation = tgt_vocab->decode(ids);
        } catch (const std::runtime_error& e) {
          fail("translate: the model generated {}", e.what());
        }
        printed += fmt::format("{}{} -> {}", h ? "  " : "", h ? "" : lines[b], translation);
        if (a.flags.count("--scores") || g.hypotheses > 1)
          printed += fmt::format("  (score {:.4f})", g.scores[at]);
        printed += "\n";
      } else {
        printed += fmt::format("sentence {} hypothesis {}: score {:.6f} ids [{}]\n", b, h,
                               g.scores[at], fmt::join(ids, ", "));
      }
    }
  write_output("-", printed);
  return 0;
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

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    const int status = kiln::tools::dispatch(args);
    kiln::write_stdout("");  // what was printed reached its destination, or exit 1
    return status;
  } catch (const kiln::Error& e) {
    kiln::tools::print_error(e);
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "kiln: internal error: {}\n", e.what());
    return 70;
  }
}
