// `kiln compile`: pipeline, lowering, Halide kernels, glue code and packaging.
#include "codegen/compile.h"

#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>

#include <fmt/format.h>

#include "codegen/kernels.h"
#include "codegen/lower.h"
#include "ir/printer.h"
#include "passes/pipeline.h"
#include "runtime/plan.h"
#include "support/error.h"
#include "support/file_io.h"

namespace kiln::codegen {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

bool is_identifier(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

fs::path exe_dir() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : p.parent_path();
}

void run_command(const std::string& cmd, const std::string& what) {
  int status = std::system(cmd.c_str());
  if (status != 0) fail("{} failed (exit status {}): {}", what, status, cmd);
}

// Runs `work` (a Halide/LLVM compile) in a child process. LLVM ends the process on some
// errors (e.g. "LLVM ERROR: IO failure on output stream" when a disk is full); in a child,
// that becomes this function's kiln::Error naming `what`, and kiln can clean up.
void in_child_process(const std::string& what, const std::function<void()>& work) {
  std::fflush(stdout);
  std::fflush(stderr);
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) fail("{}: cannot create a pipe: {}", what, std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid < 0) fail("{}: cannot fork: {}", what, std::strerror(errno));
  if (pid == 0) {
    ::close(pipe_fds[0]);
    int status = 0;
    try {
      work();
    } catch (const std::exception& e) {
      const std::string message = e.what();
      [[maybe_unused]] ssize_t n = ::write(pipe_fds[1], message.data(), message.size());
      status = 1;
    }
    ::_exit(status);
  }
  ::close(pipe_fds[1]);
  std::string message;
  char buffer[4096];
  for (ssize_t n; (n = ::read(pipe_fds[0], buffer, sizeof buffer)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    message.append(buffer, static_cast<size_t>(n));
  }
  ::close(pipe_fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
  if (!message.empty()) fail("{}", message);
  if (WIFSIGNALED(status))
    fail("{} failed: the compiler was killed by signal {} ({}); see its message above", what,
         WTERMSIG(status), strsignal(WTERMSIG(status)));
  fail("{} failed (LLVM exit status {}); see its message above", what, WEXITSTATUS(status));
}

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string cxx() {
  if (const char* env = std::getenv("CXX"); env && *env) return env;
  return KILN_CXX_COMPILER;
}

std::string type_comment(const rt::TensorDesc& t, const rt::Plan& plan) {
  std::string dims;
  for (const rt::DimExpr& d : t.shape) {
    if (!dims.empty()) dims += ",";
    int s = d.single_symbol();
    dims += s >= 0 ? plan.symbols[s].name : std::to_string(d.coeff);
  }
  const char* ty = t.type == KILN_F32 ? "f32" : t.type == KILN_I64 ? "i64" : "bool";
  return fmt::format("{}: {}[{}]", t.name, ty, dims);
}

// The C++ element type of a result in the generated class (bool as one byte, 0 or 1).
const char* cxx_element(kiln_dtype type) {
  switch (type) {
    case KILN_F32:
      return "float";
    case KILN_I64:
      return "int64_t";
    case KILN_BOOL:
      return "uint8_t";
    default:
      break;
  }
  KILN_ASSERT(false, "unknown element type");
  return "";
}

// The glue's part for a GPU library (`api` "opencl" or "cuda"): the driver library found
// by its versioned name too, and the device memory operations the runtime keeps weights,
// tables and arenas on the device with (kiln_device_ops in kiln/runtime.h). The kernels
// are called directly: their buffers arrive as views of device memory. `num_outputs[k]`:
// how many of kernel k's buffers (the last) it writes.
std::string gpu_glue(const std::string& api, const std::vector<int>& num_outputs) {
  const std::string lib = api == "cuda" ? "libcuda.so" : "libOpenCL.so";
  std::string out = fmt::format(
      "namespace {{\n\n"
      "// The device driver: Halide's runtime takes its symbols from the process when they are\n"
      "// there, else it opens {1}, which only the development package installs; so the\n"
      "// driver package's {1}.1 is loaded first, its symbols global (several models in one\n"
      "// application each do this, harmlessly), else {1}. Where neither exists, every device\n"
      "// allocation fails with a message naming the missing driver (Halide's own says only\n"
      "// that it found no system libraries); every run starts with one.\n"
      "const char* driver_error() {{\n"
      "  static const char* const error = []() -> const char* {{\n"
      "    if (dlopen(\"{1}.1\", RTLD_LAZY | RTLD_GLOBAL)) return nullptr;\n"
      "    static char message[512];  // written before dlerror's text is overwritten\n"
      "    const char* why = dlerror();\n"
      "    snprintf(message, sizeof message, \"no {2} driver ({1}.1 not found: %s)\",\n"
      "             why ? why : \"dlopen failed\");\n"
      "    if (dlopen(\"{1}\", RTLD_LAZY | RTLD_GLOBAL)) return nullptr;\n"
      "    return message;\n"
      "  }}();\n"
      "  return error;\n}}\n\n"
      "void load_driver() {{ (void)driver_error(); }}\n\n"
      "void release_device() {{ halide_device_release(nullptr, halide_{0}_device_interface()); "
      "}}\n\n"
      "int device_malloc(void* user_context, halide_buffer_t* buf,\n"
      "                  const halide_device_interface_t* device_interface) {{\n"
      "  if (const char* error = driver_error()) {{\n"
      "    halide_error(user_context, error);\n"
      "    return -1;\n"
      "  }}\n"
      "  return halide_device_malloc(user_context, buf, device_interface);\n}}\n\n"
      "const halide_device_interface_t* device_interface() {{ return "
      "halide_{0}_device_interface(); }}\n\n",
      api, lib, api == "cuda" ? "CUDA" : "OpenCL");
  if (api == "cuda") {
    out +=
        "// CUDA views are device pointers plus an offset: any element offset will do.\n"
        "int64_t view_alignment() { return 1; }\n\n";
  } else {
    out +=
        "// Halide passes an OpenCL view at an offset as a sub-buffer, whose origin must be a\n"
        "// multiple of CL_DEVICE_MEM_BASE_ADDR_ALIGN (bits): the largest over every device,\n"
        "// 0 when no device answers.\n"
        "int64_t view_alignment() {\n"
        "  if (driver_error()) return 0;\n"
        "  using GetPlatforms = int32_t (*)(uint32_t, void**, uint32_t*);\n"
        "  using GetDevices = int32_t (*)(void*, uint64_t, uint32_t, void**, uint32_t*);\n"
        "  using GetInfo = int32_t (*)(void*, uint32_t, size_t, void*, size_t*);\n"
        "  auto platforms = reinterpret_cast<GetPlatforms>(dlsym(RTLD_DEFAULT, "
        "\"clGetPlatformIDs\"));\n"
        "  auto devices = reinterpret_cast<GetDevices>(dlsym(RTLD_DEFAULT, \"clGetDeviceIDs\"));\n"
        "  auto info = reinterpret_cast<GetInfo>(dlsym(RTLD_DEFAULT, \"clGetDeviceInfo\"));\n"
        "  if (!platforms || !devices || !info) return 0;\n"
        "  void* platform[16];\n"
        "  uint32_t num_platforms = 0;\n"
        "  if (platforms(16, platform, &num_platforms) != 0) return 0;\n"
        "  int64_t bits = 0;\n"
        "  for (uint32_t p = 0; p < num_platforms && p < 16; ++p) {\n"
        "    void* device[16];\n"
        "    uint32_t num_devices = 0;\n"
        "    if (devices(platform[p], 0xFFFFFFFF /* CL_DEVICE_TYPE_ALL */, 16, device, "
        "&num_devices) != 0)\n"
        "      continue;\n"
        "    for (uint32_t d = 0; d < num_devices && d < 16; ++d) {\n"
        "      uint32_t align = 0;\n"
        "      if (info(device[d], 0x1019 /* CL_DEVICE_MEM_BASE_ADDR_ALIGN */, sizeof align, "
        "&align, nullptr) == 0 && align > bits)\n"
        "        bits = align;\n"
        "    }\n"
        "  }\n"
        "  return bits / 8;\n}\n\n";
  }
  out += "const int32_t kKernelOutputs[] = {";
  for (size_t k = 0; k < num_outputs.size(); ++k)
    out += fmt::format("{}{}", k ? ", " : "", num_outputs[k]);
  if (num_outputs.empty()) out += "0";
  out +=
      "};\n\n"
      "const kiln_device_ops kDevice = {device_interface,   device_malloc,\n"
      "                                 halide_device_free, halide_copy_to_device,\n"
      "                                 halide_copy_to_host, halide_device_crop,\n"
      "                                 halide_device_release_crop, halide_buffer_copy,\n"
      "                                 view_alignment,     kKernelOutputs};\n\n"
      "}  // namespace\n\n";
  return out;
}

std::string glue_source(const std::string& name, const rt::Plan& plan, const std::string& gpu,
                        const std::vector<int>& num_outputs) {
  std::vector<uint8_t> blob = rt::serialize_plan(plan);
  std::string out = fmt::format(
      "// Generated by kiln compile for model '{0}': the plan and the C ABI glue. Do not edit.\n"
      "#include <cstdint>\n\n#include \"kiln/runtime.h\"\n"
      "#include \"{0}.h\"  // compiled here too, so a header that does not compile fails kiln "
      "compile\n",
      name);
  if (!gpu.empty())
    out += fmt::format(
        "#include <dlfcn.h>\n#include <cstdio>\n\n#include \"HalideRuntime.h\"\n#include \"{}\"\n",
        gpu == "cuda" ? "HalideRuntimeCuda.h" : "HalideRuntimeOpenCL.h");
  out += "\nextern \"C\" {\n";
  for (const std::string& k : plan.kernel_names)
    out += fmt::format("int {}_argv(void** args);\n", k);
  out +=
      "int halide_set_num_threads(int n);\n"
      "kiln_halide_error_handler halide_set_error_handler(kiln_halide_error_handler handler);\n"
      "kiln_do_par_for_fn halide_set_custom_do_par_for(kiln_do_par_for_fn do_par_for);\n"
      "}\n\n";
  if (!gpu.empty()) out += gpu_glue(gpu, num_outputs);
  out += "namespace {\n";
  out += fmt::format("const uint8_t kPlan[{}] = {{", blob.size());
  for (size_t i = 0; i < blob.size(); ++i)
    out += fmt::format("{}{}{}", i ? "," : "", i % 24 ? "" : "\n    ", blob[i]);
  out += "};\n\nconst kiln_kernel_fn kKernels[] = {\n";
  for (const std::string& k : plan.kernel_names) out += fmt::format("    {}_argv,\n", k);
  out += "};\n}  // namespace\n\n";
  out += fmt::format(
      "extern \"C\" kiln_model* {0}_create(const char* weights_path, char** error) {{\n"
      "{2}"
      "  static const kiln_hooks hooks = {{halide_set_num_threads, halide_set_error_handler,\n"
      "                                  halide_set_custom_do_par_for, {1}, {3}}};\n"
      "  return kiln_model_create(kPlan, sizeof kPlan, kKernels, sizeof kKernels / sizeof "
      "kKernels[0],\n"
      "                           &hooks, weights_path, error);\n}}\n",
      name, gpu.empty() ? "nullptr" : "release_device", gpu.empty() ? "" : "  load_driver();\n",
      gpu.empty() ? "nullptr" : "&kDevice");
  return out;
}

// C++20 keywords and alternative tokens: they cannot name a parameter or a method.
bool is_cpp_keyword(const std::string& s) {
  static const std::set<std::string> keywords = {"alignas",       "alignof",     "and",
                                                 "and_eq",        "asm",         "auto",
                                                 "bitand",        "bitor",       "bool",
                                                 "break",         "case",        "catch",
                                                 "char",          "char8_t",     "char16_t",
                                                 "char32_t",      "class",       "compl",
                                                 "concept",       "const",       "consteval",
                                                 "constexpr",     "constinit",   "const_cast",
                                                 "continue",      "co_await",    "co_return",
                                                 "co_yield",      "decltype",    "default",
                                                 "delete",        "do",          "double",
                                                 "dynamic_cast",  "else",        "enum",
                                                 "explicit",      "export",      "extern",
                                                 "false",         "float",       "for",
                                                 "friend",        "goto",        "if",
                                                 "inline",        "int",         "long",
                                                 "mutable",       "namespace",   "new",
                                                 "noexcept",      "not",         "not_eq",
                                                 "nullptr",       "operator",    "or",
                                                 "or_eq",         "private",     "protected",
                                                 "public",        "register",    "reinterpret_cast",
                                                 "requires",      "return",      "short",
                                                 "signed",        "sizeof",      "static",
                                                 "static_assert", "static_cast", "struct",
                                                 "switch",        "template",    "this",
                                                 "thread_local",  "throw",       "true",
                                                 "try",           "typedef",     "typeid",
                                                 "typename",      "union",       "unsigned",
                                                 "using",         "virtual",     "void",
                                                 "volatile",      "wchar_t",     "while",
                                                 "xor",           "xor_eq"};
  return keywords.count(s) > 0;
}

// A C++ parameter name for input or output `name` of a generated method: the name itself
// when it can be one, else `fallback` (the C ABI still takes inputs by their real names).
// Names the signature itself uses (kiln, std) are avoided, and so are repeats.
std::string parameter_name(const std::string& name, const std::string& fallback,
                           std::set<std::string>* taken) {
  std::string out = name;
  if (!is_identifier(out) || is_cpp_keyword(out) || out == "kiln" || out == "std" ||
      out.rfind("__", 0) == 0 || taken->count(out))
    out = fallback;
  while (taken->count(out)) out += "_";
  taken->insert(out);
  return out;
}

// Entry points become methods of a class deriving from kiln::Model: their names must be
// C++ identifiers that clash with nothing there.
void check_method_name(const std::string& function, const std::string& class_name) {
  static const std::set<std::string> model_members = {"run",           "get",     "set_num_threads",
                                                      "set_profiling", "profile", "check",
                                                      "create",        "model_",  "Deleter"};
  if (!is_identifier(function) || is_cpp_keyword(function))
    fail(
        "entry point '{}' cannot be a C++ method name (the generated class has one method "
        "per entry point): rename the function",
        function);
  if (model_members.count(function) || function == class_name || function.rfind("max_", 0) == 0)
    fail(
        "entry point '{}' clashes with a member of the generated class {} (kiln::Model's run, get, "
        "set_num_threads, set_profiling, profile, the constructor, the max_* constants): rename "
        "the "
        "function",
        function, class_name);
}

std::string header_source(const std::string& name, const rt::Plan& plan,
                          const std::string& target) {
  std::string guard = "KILN_MODEL_" + name + "_H_";
  for (char& c : guard) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  std::string out = fmt::format(
      "// Generated by kiln compile: model '{0}' for target {1}. Do not edit.\n"
      "// Link lib{0}.a with kiln's runtime library (CMake: kiln_add_model, or kiln::runtime).\n"
      "// Threads: one model object may be used from several threads at once; each call\n"
      "// computes what it computes alone (see kiln_model_run in kiln/runtime.h).\n"
      "//\n// Entry points:\n",
      name, target);
  for (const rt::FunctionDesc& f : plan.functions) {
    std::string ins, outs;
    for (const auto& p : f.params) ins += (ins.empty() ? "" : ", ") + type_comment(p, plan);
    for (const auto& r : f.results) outs += (outs.empty() ? "" : ", ") + type_comment(r, plan);
    out += fmt::format("//   {}({}) -> ({})\n", f.name, ins, outs);
  }
  out += "// Maxima:";
  for (const auto& s : plan.symbols) out += fmt::format(" {} <= {}", s.name, s.max);
  out += fmt::format("\n#ifndef {0}\n#define {0}\n\n#include \"kiln/runtime.h\"\n\n", guard);
  out += fmt::format(
      "#ifdef __cplusplus\nextern \"C\" {{\n#endif\n\n"
      "/* Loads the weights (safetensors, by state_dict name) and returns the model, or NULL\n"
      " * with a message in *error (free it with kiln_free_error). Run entry points with\n"
      " * kiln_model_run; free with kiln_model_destroy. */\n"
      "kiln_model* {0}_create(const char* weights_path, char** error);\n\n"
      "#ifdef __cplusplus\n}}  /* extern \"C\" */\n\n"
      "namespace kiln_models {{\n\n"
      "class {0} : public kiln::Model {{\n public:\n",
      name);
  for (const auto& s : plan.symbols)
    out += fmt::format("  static constexpr int64_t max_{} = {};\n", s.name, s.max);
  out += fmt::format(
      "\n  /* Loads weights; throws std::runtime_error naming any problem. */\n"
      "  explicit {0}(const char* weights_path) : kiln::Model(create(weights_path)) {{}}\n",
      name);
  for (const rt::FunctionDesc& f : plan.functions) {
    check_method_name(f.name, name);
    std::string params, args, ins, outs;
    std::set<std::string> taken = {"out"};  // the local that the allocating method returns
    for (size_t i = 0; i < f.params.size(); ++i) {
      const std::string p = parameter_name(f.params[i].name, fmt::format("input{}", i), &taken);
      params += (params.empty() ? "" : ", ") + fmt::format("const kiln::Input& {}", p);
      args += (args.empty() ? "" : ", ") + p;
      ins += (ins.empty() ? "" : ", ") + type_comment(f.params[i], plan);
    }
    for (const auto& r : f.results) outs += (outs.empty() ? "" : ", ") + type_comment(r, plan);
    // Each output is a kiln::Tensor of its element type; the outputs as out-parameters
    // too, reusing the caller's storage (kiln::Model::run).
    std::string out_params, out_args, types, gets;
    for (size_t i = 0; i < f.results.size(); ++i) {
      const std::string r = parameter_name(f.results[i].name, fmt::format("output{}", i), &taken);
      const std::string type = fmt::format("kiln::Tensor<{}>", cxx_element(f.results[i].type));
      out_params += fmt::format(", {}& {}", type, r);
      out_args += (out_args.empty() ? "" : ", ") + r;
      types += (types.empty() ? "" : ", ") + type;
      gets += fmt::format("{}std::get<{}>(out)", gets.empty() ? "" : ", ", i);
    }
    const bool in_place = std::any_of(f.results.begin(), f.results.end(),
                                      [](const rt::TensorDesc& r) { return r.updates_param >= 0; });
    if (in_place) {  // the updated caches must be the caller's cache inputs: no allocating form
      std::string updates;
      for (const auto& r : f.results)
        if (r.updates_param >= 0)
          updates += fmt::format("{}{} is {}", updates.empty() ? "" : ", ", r.name,
                                 f.params[static_cast<size_t>(r.updates_param)].name);
      out += fmt::format(
          "\n  /* {0}({2}) -> ({3})\n"
          "   * Updates its caches in place: pass the same tensors as the inputs and the outputs\n"
          "   * ({5}). Generation (kiln::Model::generate) drives it for you. */\n"
          "  void {0}({1}{4}) {{ run(\"{0}\", {{{6}}}, {{{7}}}); }}\n",
          f.name, params, ins, outs, out_params, updates, args, out_args);
      continue;
    }
    if (f.results.size() == 1)
      out += fmt::format(
          "\n  /* {0}({2}) -> {3} */\n"
          "  {5} {0}({1}) {{\n"
          "    {5} out;\n"
          "    run(\"{0}\", {{{4}}}, {{out}});\n"
          "    return out;\n"
          "  }}\n",
          f.name, params, ins, outs, args, types);
    else
      out += fmt::format(
          "\n  /* {0}({2}) -> ({3}) */\n"
          "  std::tuple<{5}> {0}({1}) {{\n"
          "    std::tuple<{5}> out;\n"
          "    run(\"{0}\", {{{4}}}, {{{6}}});\n"
          "    return out;\n"
          "  }}\n",
          f.name, params, ins, outs, args, types, gets);
    out += fmt::format(
        "  /* The same into {3}, reusing {5} storage: no allocation once large enough. */\n"
        "  void {0}({1}{2}) {{ run(\"{0}\", {{{4}}}, {{{6}}}); }}\n",
        f.name, params, out_params, outs, args, f.results.size() == 1 ? "its" : "their", out_args);
  }
  out += fmt::format(
      "\n private:\n"
      "  static kiln_model* create(const char* path) {{\n"
      "    char* error = nullptr;\n"
      "    kiln_model* m = {0}_create(path, &error);\n"
      "    return kiln::checked_model(m, error);\n  }}\n}};\n\n"
      "}}  // namespace kiln_models\n#endif /* __cplusplus */\n\n#endif /* {1} */\n",
      name, guard);
  return out;
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
  const auto start = Clock::now();
  auto progress = [&](const std::string& line) {
    if (options.progress) options.progress(line);
  };
  CompileResult result;
  const std::string name = options.name.empty() ? module.name : options.name;
  if (!is_identifier(name)) fail("library name '{}' is not a C identifier (use --name)", name);
  const std::string target = resolve_target(options.target);
  if (options.weights != "f32" && options.weights != "bf16")
    fail("unknown weight type '{}' (use f32 or bf16)", options.weights);
  const bool bf16 = options.weights == "bf16";
  if (bf16)
    if (std::string problem = bf16_target_problem(options.target); !problem.empty())
      fail("{}", problem);

  const std::string gpu = gpu_api(options.target);
  if (bf16 && !gpu.empty())
    fail("bf16 weights are for the CPU (AVX512-BF16); target '{}' runs kernels on the GPU",
         options.target);

  auto t = Clock::now();
  passes::run_passes(module, passes::default_pipeline());
  progress(fmt::format("optimized the graph ({:.2f} s)", since(t)));
  LoweredModel lowered = lower_module(module, LowerOptions{bf16});
  if (!gpu.empty()) {
    // Before the slow part: every kernel needs a GPU schedule (kernels.h).
    for (const rt::FunctionDesc& f : lowered.plan.functions)
      for (const rt::StepDesc& st : f.steps) {
        if (st.kernel < 0) continue;
        const std::string kind =
            kind_without_gpu_schedule(lowered.kernels[static_cast<size_t>(st.kernel)]);
        if (!kind.empty())
          fail(
              "target '{}' runs kernels on the GPU, but {} kernels have no GPU schedule yet "
              "(entry point '{}', {})",
              options.target, kind, f.name, st.op);
      }
  }
  std::vector<int> num_outputs;
  for (const KernelSpec& k : lowered.kernels) num_outputs.push_back(kernel_num_outputs(k));
  for (const rt::FunctionDesc& f : lowered.plan.functions)
    check_method_name(f.name, name);  // before the slow part
  // The runtime refuses the library on a CPU without its target's features (and, with bf16
  // kernels, without AVX512-BF16).
  lowered.plan.target = bf16 ? target + "-" + kBf16Feature : target;
  // Kernel symbols carry the library name: two models can link into one application.
  for (std::string& k : lowered.plan.kernel_names) k = name + "_" + k;
  size_t steps = 0;
  for (const auto& f : lowered.plan.functions) steps += f.steps.size();
  progress(fmt::format("lowered {} entry point(s) to {} kernel calls of {} kernels",
                       lowered.plan.functions.size(), steps, lowered.kernels.size()));

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

  std::vector<std::string> objects;
  for (size_t i = 0; i < lowered.kernels.size(); ++i) {
    t = Clock::now();
    const std::string& kname = lowered.plan.kernel_names[i];
    std::string obj = (work / (kname + ".o")).string();
    in_child_process(fmt::format("compiling kernel {}", kname),
                     [&] { compile_kernel(lowered.kernels[i], target, kname, obj); });
    objects.push_back(obj);
    progress(fmt::format("[{}/{}] kernel {} ({:.2f} s)", i + 1, lowered.kernels.size(), kname,
                         since(t)));
  }
  t = Clock::now();
  std::string runtime_obj = (work / "halide_runtime.o").string();
  in_child_process("compiling the Halide runtime", [&] { compile_runtime(target, runtime_obj); });
  objects.push_back(runtime_obj);
  progress(fmt::format("halide runtime ({:.2f} s)", since(t)));

  t = Clock::now();
  const std::string header = name + ".h";
  write_file_atomically((work / header).string(), header_source(name, lowered.plan, target));
  fs::path glue = work / (name + "_glue.cpp");
  write_file_atomically(glue.string(), glue_source(name, lowered.plan, gpu, num_outputs));
  std::string glue_obj = (work / (name + "_glue.o")).string();
  // A GPU library's glue calls Halide's runtime (HalideRuntime.h, from the compiler's Halide).
  const std::string halide_include =
      gpu.empty() ? "" : " -I" + quote(KILN_HALIDE_RUNTIME_INCLUDE_DIR);
  run_command(fmt::format("{} -std=c++17 -O2 -fPIC -c {} -I{} -I{}{} -o {}", quote(cxx()),
                          quote(glue.string()), quote(runtime_include_dir()), quote(work.string()),
                          halide_include, quote(glue_obj)),
              "compiling the generated glue and header");
  objects.push_back(glue_obj);
  progress(fmt::format("glue code and header ({:.2f} s)", since(t)));

  std::string object_list;
  for (const std::string& o : objects) object_list += " " + quote(o);
  std::vector<std::string> outputs = {header};
  if (options.emit_static) {
    outputs.push_back("lib" + name + ".a");
    run_command(fmt::format("ar rcs {}{}", quote((work / outputs.back()).string()), object_list),
                "archiving");
  }
  if (options.emit_shared) {
    outputs.push_back("lib" + name + ".so");
    run_command(
        fmt::format("{} -shared -o {}{} -Wl,--whole-archive {} -Wl,--no-whole-archive -lfmt "
                    "-lpthread -ldl",
                    quote(cxx()), quote((work / outputs.back()).string()), object_list,
                    quote(runtime_library())),
        "linking the shared library");
  }
  if (options.emit_ir) {
    outputs.push_back(name + ".kir");
    write_file_atomically((work / outputs.back()).string(), ir::print_module(module));
  }
  // All built: move each into place (the header last, so a build system that watches it
  // sees the libraries first).
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

}  // namespace kiln::codegen
