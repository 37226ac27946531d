// The generated header and glue (see generated_code.h): the values of the templates'
// placeholders, computed from the plan.
#include "driver/generated_code.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include <fmt/format.h>

#include "driver/templates.h"
#include "support/error.h"

namespace kiln::driver {

namespace {

std::string type_comment(const rt::TensorDesc& t, const rt::Plan& plan) {
  std::string dims;
  for (const rt::DimExpr& d : t.shape) dims += (dims.empty() ? "" : ",") + rt::dim_text(d, plan);
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

// The methods of entry point `f` in the generated class.
std::string methods(const rt::FunctionDesc& f, const rt::Plan& plan) {
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
  std::map<std::string, std::string> values = {
      {"function", f.name}, {"params", params},         {"args", args},        {"inputs", ins},
      {"outputs", outs},    {"out_params", out_params}, {"out_args", out_args}};
  const bool in_place = std::any_of(f.results.begin(), f.results.end(),
                                    [](const rt::TensorDesc& r) { return r.updates_param >= 0; });
  if (in_place) {  // the updated caches must be the caller's cache inputs: no allocating form
    std::string updates;
    for (const auto& r : f.results)
      if (r.updates_param >= 0)
        updates += fmt::format("{}{} is {}", updates.empty() ? "" : ", ", r.name,
                               f.params[static_cast<size_t>(r.updates_param)].name);
    values["updates"] = updates;
    return render("model_method_in_place.h.in", values);
  }
  std::string out;
  if (f.results.size() == 1) {
    out = render("model_method.h.in", {{"function", f.name},
                                       {"params", params},
                                       {"args", args},
                                       {"inputs", ins},
                                       {"outputs", outs},
                                       {"types", types}});
  } else {
    out = render("model_method_tuple.h.in", {{"function", f.name},
                                             {"params", params},
                                             {"args", args},
                                             {"inputs", ins},
                                             {"outputs", outs},
                                             {"types", types},
                                             {"gets", gets}});
  }
  values.erase("inputs");
  values["its"] = f.results.size() == 1 ? "its" : "their";
  return out + render("model_method_into.h.in", values);
}

// The glue's part for a GPU library (`api` "opencl" or "cuda"): the driver library found
// by its versioned name too, and the device memory operations the runtime keeps weights,
// tables and arenas on the device with (kiln_device_ops in kiln/runtime.h). The kernels
// are called directly: their buffers arrive as views of device memory.
std::string gpu_glue(const std::string& api, const std::vector<int>& num_outputs) {
  std::string outputs;
  for (size_t k = 0; k < num_outputs.size(); ++k)
    outputs += fmt::format("{}{}", k ? ", " : "", num_outputs[k]);
  if (num_outputs.empty()) outputs = "0";
  return render(
      "glue_gpu.cpp.in",
      {{"api", api},
       {"api_name", api == "cuda" ? "CUDA" : "OpenCL"},
       {"library", api == "cuda" ? "libcuda.so" : "libOpenCL.so"},
       {"view_alignment", std::string(template_text(api == "cuda" ? "glue_gpu_cuda.cpp.in"
                                                                  : "glue_gpu_opencl.cpp.in"))},
       {"kernel_outputs", outputs}});
}

}  // namespace

bool is_identifier(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

void check_library_name(const std::string& name) {
  // C keywords that C++ does not have (the header is also C).
  static const std::set<std::string> c_keywords = {
      "restrict", "_Alignas",   "_Alignof",  "_Atomic",        "_Bool",         "_Complex",
      "_Generic", "_Imaginary", "_Noreturn", "_Static_assert", "_Thread_local", "_Pragma"};
  const std::string shown = name.size() > 64 ? name.substr(0, 64) + "..." : name;
  if (!is_identifier(name))
    fail(
        "library name '{}' is not a C identifier (letters, digits and _, not starting with a "
        "digit): choose another with --name",
        shown);
  if (is_cpp_keyword(name) || c_keywords.count(name))
    fail(
        "library name '{}' is a C or C++ keyword: the header declares class kiln_models::{} "
        "and {}_create; choose another with --name",
        name, name, name);
  if (name.find("__") != std::string::npos ||
      (name[0] == '_' && name.size() > 1 && std::isupper(static_cast<unsigned char>(name[1]))))
    fail(
        "library name '{}' is reserved by the C++ standard (it contains '__' or starts with '_' "
        "and a capital letter): choose another with --name",
        shown);
  if (name == "kiln" || name == "kiln_models" || name == "std" || name.rfind("kiln_", 0) == 0)
    fail(
        "library name '{}' is one of kiln's own names (kiln, kiln_models, std and the runtime's "
        "kiln_* types): choose another with --name",
        name);
}

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
  std::string entry_points, maxima, constants, all_methods;
  for (const rt::FunctionDesc& f : plan.functions) {
    std::string ins, outs;
    for (const auto& p : f.params) ins += (ins.empty() ? "" : ", ") + type_comment(p, plan);
    for (const auto& r : f.results) outs += (outs.empty() ? "" : ", ") + type_comment(r, plan);
    entry_points += fmt::format("//   {}({}) -> ({})\n", f.name, ins, outs);
  }
  for (const auto& s : plan.symbols) {
    if (s.base >= 0) continue;  // derived from a model symbol (T+1): not declared by the model
    maxima += fmt::format(" {} <= {}", s.name, s.max);
    constants += fmt::format("  static constexpr int64_t max_{} = {};\n", s.name, s.max);
  }
  for (const rt::FunctionDesc& f : plan.functions) {
    check_method_name(f.name, name);
    all_methods += methods(f, plan);
  }
  return render("model.h.in", {{"name", name},
                               {"target", target},
                               {"guard", guard},
                               {"entry_points", entry_points},
                               {"maxima", maxima},
                               {"constants", constants},
                               {"methods", all_methods}});
}

std::string glue_source(const std::string& name, const rt::Plan& plan, const std::string& gpu,
                        const std::vector<int>& num_outputs) {
  const std::vector<uint8_t> blob = rt::serialize_plan(plan);
  std::string bytes, declarations, table;
  for (size_t i = 0; i < blob.size(); ++i)
    bytes += fmt::format("{}{}{}", i ? "," : "", i % 24 ? "" : "\n    ", blob[i]);
  for (const std::string& k : plan.kernel_names) {
    declarations += fmt::format("int {}_argv(void** args);\n", k);
    table += fmt::format("    {}_argv,\n", k);
  }
  std::string gpu_includes;
  if (!gpu.empty())
    gpu_includes = fmt::format(
        "#include <dlfcn.h>\n#include <cstdio>\n\n#include \"HalideRuntime.h\"\n#include \"{}\"\n",
        gpu == "cuda" ? "HalideRuntimeCuda.h" : "HalideRuntimeOpenCL.h");
  return render("glue.cpp.in", {{"name", name},
                                {"gpu_includes", gpu_includes},
                                {"kernel_declarations", declarations},
                                {"gpu_glue", gpu.empty() ? "" : gpu_glue(gpu, num_outputs)},
                                {"plan_size", std::to_string(blob.size())},
                                {"plan_bytes", bytes},
                                {"kernel_table", table},
                                {"load_driver", gpu.empty() ? "" : "  load_driver();\n"},
                                {"release_device", gpu.empty() ? "nullptr" : "release_device"},
                                {"device_ops", gpu.empty() ? "nullptr" : "&kDevice"}});
}

}  // namespace kiln::driver
