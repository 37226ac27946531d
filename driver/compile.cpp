// `kiln compile`: the pipeline, lowering, the kernels compiled in parallel child
// processes, the generated header and glue, and the toolchain calls that package them.
#include "driver/compile.h"

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>

#include <fmt/format.h>

#include "codegen/kernels.h"
#include "codegen/lower.h"
#include "driver/generated_code.h"
#include "driver/jobs.h"
#include "ir/printer.h"
#include "passes/pipeline.h"
#include "runtime/bf16_products.h"
#include "runtime/plan.h"
#include "support/error.h"
#include "support/file_io.h"
#include "support/process.h"

namespace kiln::driver {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

fs::path exe_dir() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : p.parent_path();
}

std::string cxx() {
  if (const char* env = std::getenv("CXX"); env && *env) return env;
  return KILN_CXX_COMPILER;
}

// Refuses a library name that is a macro where the generated header is compiled: the
// header's includes preprocessed by the C++ compiler in GNU mode (a superset of the strict
// mode's macros, with `linux` and `unix`, as an application may compile it), before any work.
void check_name_is_no_macro(const std::string& name) {
  ProcessOptions o;
  o.input = "#include <cstdint>\n#include \"kiln/runtime.h\"\n";
  const ProcessResult r = run_process(
      {cxx(), "-std=gnu++17", "-dM", "-E", "-x", "c++", "-I" + runtime_include_dir(), "-"}, o);
  if (!r.error.empty() || r.exit_code() != 0)
    fail("cannot preprocess kiln/runtime.h with '{}' ({}): is a C++ compiler installed?", cxx(),
         r.error.empty() ? describe_wait_status(r.wait_status) : r.error);
  const std::string define = "#define " + name;
  for (size_t at = 0; (at = r.out.find(define, at)) != std::string::npos; ++at) {
    const size_t end = at + define.size();
    if ((at == 0 || r.out[at - 1] == '\n') &&
        (end == r.out.size() || r.out[end] == ' ' || r.out[end] == '(' || r.out[end] == '\n'))
      fail(
          "library name '{}' is a macro of the C/C++ headers that the generated header "
          "includes: choose another with --name",
          name);
  }
}

// The progress line of a bf16 compile: the form of the products, and for auto what this CPU
// would run.
std::string bf16_products_line(const std::string& choice) {
  if (choice == "dot") return "bf16 products: vdpbf16ps (--bf16-products dot)";
  if (choice == "fma") return "bf16 products: f32 FMAs, attention in f32 (--bf16-products fma)";
  const rt::Bf16ProductRates r = rt::measure_bf16_product_rates();
  const std::string here =
      r.dot == 0 ? "this CPU has no AVX512-BF16"
                 : fmt::format(
                       "this CPU does {:.1f} bf16 products per ns with vdpbf16ps, {:.1f} "
                       "with FMAs: it would run {}",
                       r.dot, r.fma, rt::fma_products_faster(r) ? "the FMA form" : "vdpbf16ps");
  return fmt::format(
      "bf16 products: both forms, vdpbf16ps and f32 FMAs (attention in f32), the library "
      "runs the faster one on the CPU it loads on (auto; {}; --bf16-products dot|fma builds "
      "one)",
      here);
}

// Adds `fma`'s entry points to `dot` as their FMA form (rt::Plan::fma_functions) and the kernels
// only that form calls; the kernels of both (the same spec, so the same name) are shared. The
// two lowerings of one module differ in their kernels and steps only.
void add_fma_form(codegen::LoweredModel& dot, codegen::LoweredModel fma) {
  rt::Plan a = dot.plan, b = fma.plan;
  a.functions.clear();
  b.functions.clear();
  a.kernel_names.clear();
  b.kernel_names.clear();
  KILN_ASSERT(rt::serialize_plan(a) == rt::serialize_plan(b),
              "the two forms of a bf16 model's products lowered to different weights or tables");
  std::map<std::string, int32_t> index;
  for (size_t i = 0; i < dot.plan.kernel_names.size(); ++i)
    index.emplace(dot.plan.kernel_names[i], static_cast<int32_t>(i));
  std::vector<int32_t> remap(fma.kernels.size());
  for (size_t i = 0; i < fma.kernels.size(); ++i) {
    const auto [at, added] =
        index.emplace(fma.plan.kernel_names[i], static_cast<int32_t>(dot.kernels.size()));
    if (added) {
      dot.kernels.push_back(fma.kernels[i]);
      dot.plan.kernel_names.push_back(fma.plan.kernel_names[i]);
    }
    remap[i] = at->second;
  }
  for (rt::FunctionDesc& f : fma.plan.functions)
    for (rt::StepDesc& st : f.steps) {
      if (st.kernel >= 0) st.kernel = remap[static_cast<size_t>(st.kernel)];
      for (int32_t& k : st.calls) k = remap[static_cast<size_t>(k)];
    }
  dot.plan.fma_functions = std::move(fma.plan.functions);
}

CompileResult compile(ir::Module module, const CompileOptions& options, JobRunner& runner) {
  const auto start = Clock::now();
  auto progress = [&](const std::string& line) {
    if (options.progress) options.progress(line);
  };
  CompileResult result;
  const std::string name = options.name.empty() ? module.name : options.name;
  check_library_name(name);
  check_name_is_no_macro(name);
  const std::string target = codegen::resolve_target(options.target);
  if (options.weights != "f32" && options.weights != "bf16" && options.weights != "int8")
    fail("unknown weight type '{}' (use f32, bf16 or int8)", options.weights);
  const bool bf16 = options.weights == "bf16", int8 = options.weights == "int8";
  if (bf16)
    if (std::string problem = codegen::bf16_target_problem(options.target); !problem.empty())
      fail("{}", problem);
  if (int8)
    if (std::string problem = codegen::int8_target_problem(options.target); !problem.empty())
      fail("{}", problem);

  // Checked whatever the weights. With bf16 weights: one form of the products, or with auto
  // both, the runtime running the one for the CPU it loads on (runtime/bf16_products.h). With
  // int8 weights the same choice for attention's two products (the linears are int8 in both
  // forms): bf16 on vdpbf16ps (dot) or f32 (fma); auto builds both where the target can run
  // vdpbf16ps, and the library, which needs only AVX512-VNNI, runs f32 attention on a CPU
  // without AVX512-BF16.
  if (options.bf16_products != "auto" && options.bf16_products != "dot" &&
      options.bf16_products != "fma")
    fail("unknown bf16 products '{}' (use auto, dot or fma)", options.bf16_products);
  std::string products = options.bf16_products;
  if (int8 && products != "fma" && !codegen::bf16_target_problem(options.target).empty()) {
    // (int8 already needs an AVX-512 target: what is missing is the host CPU's AVX512-BF16.)
    if (products == "dot")
      fail(
          "int8 weights with --bf16-products dot run attention on AVX512-BF16, which this CPU "
          "lacks; use --bf16-products auto or fma (attention in f32), or compile for another "
          "machine's target");
    products = "fma";  // auto where the target cannot run vdpbf16ps: attention in f32 only
  }
  const bool bf16_fma = (bf16 || int8) && products == "fma";
  const bool both_forms = (bf16 || int8) && products == "auto";
  if (bf16) progress(bf16_products_line(products));
  if (int8)
    progress(products == "dot" ? "int8 attention: bf16 products on vdpbf16ps (--bf16-products dot)"
             : products == "fma"
                 ? fmt::format("int8 attention: f32{}", options.bf16_products == "fma"
                                                            ? " (--bf16-products fma)"
                                                            : " (this CPU has no AVX512-BF16)")
                 : "int8 attention: both forms, bf16 products on vdpbf16ps and "
                   "f32, the library runs f32 attention where the CPU it loads on "
                   "lacks AVX512-BF16 or does more products per ns on FMAs "
                   "(auto; --bf16-products dot|fma builds one)");

  const std::string gpu = codegen::gpu_api(options.target);
  if ((bf16 || int8) && !gpu.empty())
    fail("{} weights are for the CPU ({}); target '{}' runs kernels on the GPU", options.weights,
         bf16 ? "AVX512-BF16" : "AVX512-VNNI", options.target);
  const int jobs = options.jobs > 0 ? options.jobs : default_jobs();

  auto t = Clock::now();
  const std::vector<passes::LostFusion> lost =
      passes::run_passes(module, passes::default_pipeline());
  if (options.note)
    for (const std::string& line : passes::format_lost_fusions(module, lost, options.ir_file))
      options.note(line);
  progress(fmt::format("optimized the graph ({:.2f} s)", since(t)));
  runner.check_interrupt();
  const bool bf16_acts = options.bf16_activations;
  codegen::LoweredModel lowered = codegen::lower_module(
      module, codegen::LowerOptions{bf16, int8, !gpu.empty(), bf16_fma, bf16_acts});
  if (both_forms)
    add_fma_form(lowered, codegen::lower_module(
                              module, codegen::LowerOptions{bf16, int8, false, true, bf16_acts}));
  // What the products run on, for kiln_model_config(model, "bf16_products"): with both forms
  // the runtime puts the one it chose in place of "auto".
  if (bf16 || int8) lowered.plan.config.emplace_back("bf16_products", products);
  runner.check_interrupt();
  if (!gpu.empty()) {
    // Before the slow part: every kernel needs a GPU schedule (kernels.h).
    for (const rt::FunctionDesc& f : lowered.plan.functions)
      for (const rt::StepDesc& st : f.steps) {
        if (st.builtin == rt::Builtin::moe_ffn)
          fail(
              "target '{}' runs kernels on the GPU, but moe_ffn runs on the host and has no GPU "
              "lowering yet (entry point '{}', {})",
              options.target, f.name, st.op);
        if (st.kernel < 0) continue;
        const std::string kind =
            codegen::kind_without_gpu_schedule(lowered.kernels[static_cast<size_t>(st.kernel)]);
        if (!kind.empty())
          fail(
              "target '{}' runs kernels on the GPU, but {} kernels have no GPU schedule yet "
              "(entry point '{}', {})",
              options.target, kind, f.name, st.op);
      }
  }
  std::vector<int> num_outputs;
  for (const codegen::KernelSpec& k : lowered.kernels)
    num_outputs.push_back(codegen::kernel_num_outputs(k));
  for (const rt::FunctionDesc& f : lowered.plan.functions)
    check_method_name(f.name, name);  // before the slow part
  // The runtime refuses the library on a CPU without its target's features (and, with bf16
  // kernels, without AVX512-BF16; with int8 kernels, without AVX512-VNNI, and without
  // AVX512-BF16 too where attention runs only in bf16).
  lowered.plan.target = bf16 || (int8 && products == "dot") ? target + "-" + codegen::kBf16Feature
                        : int8                              ? target + "-" + codegen::kInt8Feature
                                                            : target;
  // Kernel symbols carry the library name: two models can link into one application.
  for (std::string& k : lowered.plan.kernel_names) k = name + "_" + k;
  size_t steps = 0;
  for (const auto& f : lowered.plan.functions) steps += f.steps.size();
  progress(fmt::format("lowered {} entry point(s) to {} kernel calls of {} kernels{}",
                       lowered.plan.functions.size(), steps, lowered.kernels.size(),
                       both_forms ? " (both forms of the bf16 products)" : ""));

  // Everything is built in a staging directory inside the output directory and moved into
  // place file by file only once all of it exists: a failed compile leaves the output
  // directory as it was (an earlier run's library included).
  fs::path out_dir(options.out_dir);
  std::error_code ec;
  // A directory this call creates is removed again if the compile fails (and it is empty).
  struct RemoveIfCreated {
    fs::path dir;
    bool keep = false;
    ~RemoveIfCreated() {
      std::error_code ignored;
      if (!keep && !dir.empty()) fs::remove(dir, ignored);
    }
  } created{fs::exists(out_dir) ? fs::path() : out_dir};
  fs::create_directories(out_dir, ec);
  if (ec) fail("cannot create output directory '{}': {}", out_dir.string(), ec.message());
  const StagingDir stage(out_dir, name);
  const fs::path work = stage.path();

  // The header and the glue (which includes it, so that a header that does not compile
  // fails here), compiled first: a name the header's C++ rejects fails in seconds, not
  // after every kernel.
  const std::string header = name + ".h";
  write_file_atomically((work / header).string(), header_source(name, lowered.plan, target));
  const fs::path glue = work / (name + "_glue.cpp");
  write_file_atomically(glue.string(), glue_source(name, lowered.plan, gpu, num_outputs));
  const std::string glue_obj = (work / (name + "_glue.o")).string();
  std::vector<std::string> glue_command = {cxx(),
                                           "-std=c++17",
                                           "-O2",
                                           "-fPIC",
                                           "-c",
                                           glue.string(),
                                           "-I" + runtime_include_dir(),
                                           "-I" + work.string()};
  // A GPU library's glue calls Halide's runtime (HalideRuntime.h, from the compiler's Halide).
  if (!gpu.empty()) glue_command.push_back("-I" + std::string(KILN_HALIDE_RUNTIME_INCLUDE_DIR));
  glue_command.insert(glue_command.end(), {"-o", glue_obj});
  // The first job of the batch below: while it runs, kernels start beside it (and are
  // killed when it fails).
  std::vector<Job> compiles;
  compiles.push_back(
      {fmt::format("compiling the generated header and glue of library '{}'", name),
       {},
       glue_command,
       "",
       [&](double seconds) { progress(fmt::format("glue code and header ({:.2f} s)", seconds)); }});

  // The kernels and Halide's runtime, each in a child process, `jobs` at once. The objects
  // keep this order in the archive whatever order they finish in.
  std::vector<std::string> objects;
  size_t finished = 0;
  for (size_t i = 0; i < lowered.kernels.size(); ++i) {
    const std::string& kname = lowered.plan.kernel_names[i];
    const std::string obj = (work / (kname + ".o")).string();
    objects.push_back(obj);
    Job job;
    job.what = fmt::format("compiling kernel {}", kname);
    job.work = [&, i, kname, obj] {
      const codegen::KernelOutput out =
          codegen::compile_kernel(lowered.kernels[i], target, kname, obj);
      if (out.llvm_assembly.empty()) return;
      run_program({"llc-14", "-O3", "-mcpu=" + out.llc_cpu, "-relocation-model=pic",
                   "-filetype=obj", out.llvm_assembly, "-o", obj},
                  fmt::format("compiling {} kernel {} with llc-14", options.weights, kname),
                  "is Debian's llvm-14 installed?");
      std::remove(out.llvm_assembly.c_str());
    };
    job.done = [&, kname](double seconds) {
      progress(fmt::format("[{}/{}] kernel {} ({:.2f} s)", ++finished, lowered.kernels.size(),
                           kname, seconds));
    };
    compiles.push_back(std::move(job));
  }
  const std::string runtime_obj = (work / "halide_runtime.o").string();
  objects.push_back(runtime_obj);
  compiles.push_back(
      {"compiling the Halide runtime",
       [&] { codegen::compile_runtime(target, runtime_obj); },
       {},
       "",
       [&](double seconds) { progress(fmt::format("halide runtime ({:.2f} s)", seconds)); }});
  runner.run(std::move(compiles), jobs);
  objects.push_back(glue_obj);

  std::vector<std::string> outputs = {header};
  std::vector<Job> packaging;
  if (options.emit_static) {
    outputs.push_back("lib" + name + ".a");
    std::vector<std::string> ar = {"ar", "rcs", (work / outputs.back()).string()};
    ar.insert(ar.end(), objects.begin(), objects.end());
    packaging.push_back({"archiving", {}, ar, "", {}});
  }
  if (options.emit_shared) {
    outputs.push_back("lib" + name + ".so");
    std::vector<std::string> link = {cxx(), "-shared", "-o", (work / outputs.back()).string()};
    link.insert(link.end(), objects.begin(), objects.end());
    link.insert(link.end(), {"-Wl,--whole-archive", runtime_library(), "-Wl,--no-whole-archive",
                             "-lfmt", "-lpthread", "-ldl"});
    packaging.push_back({"linking the shared library", {}, link, "", {}});
  }
  runner.run(std::move(packaging), jobs);
  if (options.emit_ir) {
    outputs.push_back(name + ".kir");
    write_file_atomically((work / outputs.back()).string(), ir::print_module(module));
  }
  runner.check_interrupt();
  // All built: move each into place (the header last, so a build system that watches it
  // sees the libraries first), holding the output directory's lock, so that a concurrent
  // compile of the same library publishes its whole set before or after this one.
  const FileLock publishing = stage.lock_output();
  for (size_t i = outputs.size(); i-- > 0;) {
    const std::string path = stage.publish(outputs[i]).string();
    if (i == 0)
      result.header = path;
    else if (outputs[i].ends_with(".a"))
      result.static_library = path;
    else if (outputs[i].ends_with(".so"))
      result.shared_library = path;
    else
      result.ir_file = path;
    if (i > 0) progress("wrote " + path);
  }
  created.keep = true;
  result.kernels = static_cast<int>(lowered.kernels.size());
  result.seconds = since(start);
  return result;
}

}  // namespace

std::string runtime_include_dir() {
  fs::path installed = exe_dir() / ".." / "include";
  if (fs::exists(installed / "kiln" / "runtime.h")) return fs::canonical(installed).string();
  return KILN_BUILD_RUNTIME_INCLUDE;
}

std::string runtime_library() {
  fs::path installed = exe_dir() / ".." / "lib" / "libkiln_runtime.a";
  if (fs::exists(installed)) return fs::canonical(installed).string();
  return KILN_BUILD_RUNTIME_LIBRARY;
}

CompileResult compile_model(ir::Module module, const CompileOptions& options) {
  int interrupted = 0;
  CompileResult result;
  {
    JobRunner runner;
    try {
      result = compile(std::move(module), options, runner);
    } catch (const Interrupted& i) {
      interrupted = i.signal;  // the children are gone and the staging directory removed
    }
  }  // SIGINT and SIGTERM have their former dispositions again
  if (interrupted) {
    ::raise(interrupted);
    fail("interrupted by signal {}", interrupted);  // only if the signal did not end kiln
  }
  return result;
}

}  // namespace kiln::driver
