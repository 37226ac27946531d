// A compiled model's shared library (`kiln compile --emit=shared`: lib<name>.so, which carries
// its own copy of the runtime) opened with dlopen and its C ABI resolved from that handle:
// what kiln-run (tools/compiled.cpp) and the Python module (python/kiln_module.cpp) call,
// neither linking the runtime or libHalide itself. Header-only; throws kiln::Error.
#pragma once

#include <dlfcn.h>

#include <filesystem>
#include <string>
#include <vector>

#include "kiln/runtime.h"
#include "support/error.h"

namespace kiln::rt {

// Sentences' ids [n, length] (row-major; borrowed, not copied) as the `src` tensor that
// kiln_generate and kiln_generator_add take.
inline kiln_tensor generation_src(int64_t* ids, int64_t n, int64_t length) {
  kiln_tensor in{};
  in.name = "src";
  in.dtype = KILN_I64;
  in.rank = 2;
  in.shape[0] = n;
  in.shape[1] = length;
  in.data = ids;
  in.capacity = static_cast<size_t>(n * length) * sizeof(int64_t);
  return in;
}

// The C ABI (kiln/runtime.h) of one library, and the create function of its model.
struct LibraryApi {
  kiln_model* (*create)(const char*, char**) = nullptr;  // <name>_create
  void (*destroy)(kiln_model*) = nullptr;
  void (*free_error)(char*) = nullptr;
  int (*num_inputs)(const kiln_model*, const char*) = nullptr;
  int (*num_outputs)(const kiln_model*, const char*) = nullptr;
  const char* (*input_name)(const kiln_model*, const char*, int) = nullptr;
  int (*output_updates)(const kiln_model*, const char*, int) = nullptr;
  const char* const* (*functions)(const kiln_model*) = nullptr;
  int (*tensor_type)(const kiln_model*, const char*, int, int, kiln_tensor_type*) = nullptr;
  int (*output_shapes)(kiln_model*, const char*, const kiln_tensor*, size_t, kiln_tensor*,
                       size_t) = nullptr;
  int (*run)(kiln_model*, const char*, const kiln_tensor*, size_t, kiln_tensor*, size_t) = nullptr;
  const char* (*error)(const kiln_model*) = nullptr;
  int (*set_num_threads)(kiln_model*, int) = nullptr;
  int (*set_profiling)(kiln_model*, int) = nullptr;
  const char* (*profile)(kiln_model*) = nullptr;
  void (*search_options_init)(kiln_search_options*) = nullptr;
  int (*generate)(kiln_model*, const kiln_tensor*, const kiln_search_options*,
                  kiln_generation*) = nullptr;
  void (*generation_free)(kiln_generation*) = nullptr;
  int64_t (*symbol_max)(const kiln_model*, const char*) = nullptr;
  const char* (*config)(const kiln_model*, const char*) = nullptr;
  // Optional (nullptr in a library from a kiln before it): kiln_model_save_weights.
  int (*save_weights)(kiln_model*, const char*) = nullptr;
  // Optional, all or none (nullptr in a library from a kiln before them): kiln_generator_*.
  kiln_generator* (*generator_create)(kiln_model*, const kiln_search_options*) = nullptr;
  int (*generator_add)(kiln_generator*, const kiln_tensor*, int32_t, int64_t*) = nullptr;
  int64_t (*generator_step)(kiln_generator*) = nullptr;
  int (*generator_cancel)(kiln_generator*, int64_t) = nullptr;
  int64_t (*generator_finished)(kiln_generator*, int64_t*, int64_t) = nullptr;
  int (*generator_take)(kiln_generator*, int64_t, kiln_generation*) = nullptr;
  void (*generator_free)(kiln_generator*) = nullptr;
};

// An opened library: its path, model name (lib<name>.so) and C ABI. The handle stays open
// for the process's life (models and the functions they return point into it).
struct Library {
  std::string path;
  std::string name;
  LibraryApi api;
};

// `path` is a lib<name>.so, or a directory holding exactly one (what `kiln compile
// --emit=shared -o DIR` writes). `command` prefixes errors ("run --compiled").
inline Library open_library(const std::string& path, const std::string& command) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path lib = path;
  if (fs::is_directory(lib, ec)) {
    std::vector<fs::path> libs;
    for (const auto& e : fs::directory_iterator(lib, ec)) {
      const std::string n = e.path().filename().string();
      if (n.size() > 6 && n.rfind("lib", 0) == 0 && n.substr(n.size() - 3) == ".so")
        libs.push_back(e.path());
    }
    if (ec) fail("{}: cannot read directory '{}': {}", command, path, ec.message());
    if (libs.size() != 1)
      fail("{}: expected one lib*.so in '{}' (from kiln compile --emit=shared), found {}", command,
           path, libs.size());
    lib = libs[0];
  } else if (!fs::exists(lib, ec)) {
    fail(
        "{}: '{}' does not exist (give the directory 'kiln compile --emit=shared' wrote, or its "
        "lib*.so)",
        command, path);
  }
  const std::string file = lib.filename().string();
  if (file.size() <= 6 || file.rfind("lib", 0) != 0 || file.substr(file.size() - 3) != ".so")
    fail("{}: '{}' is not a lib<name>.so from kiln compile --emit=shared", command, lib.string());
  Library l;
  l.path = lib.string();
  l.name = file.substr(3, file.size() - 6);
  void* handle = dlopen(fs::absolute(lib).c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) fail("{}: cannot load '{}': {}", command, l.path, dlerror());
  auto resolve = [&](const std::string& symbol, auto* out) {
    void* p = dlsym(handle, symbol.c_str());
    if (!p) fail("'{}' does not export '{}': not a kiln model library", l.path, symbol);
    *out = reinterpret_cast<std::remove_reference_t<decltype(*out)>>(p);
  };
  LibraryApi& a = l.api;
  resolve(l.name + "_create", &a.create);
  resolve("kiln_model_destroy", &a.destroy);
  resolve("kiln_free_error", &a.free_error);
  resolve("kiln_model_num_inputs", &a.num_inputs);
  resolve("kiln_model_num_outputs", &a.num_outputs);
  resolve("kiln_model_input_name", &a.input_name);
  resolve("kiln_model_output_updates", &a.output_updates);
  resolve("kiln_model_functions", &a.functions);
  resolve("kiln_model_tensor_type", &a.tensor_type);
  resolve("kiln_model_output_shapes", &a.output_shapes);
  resolve("kiln_model_run", &a.run);
  resolve("kiln_model_error", &a.error);
  resolve("kiln_model_set_num_threads", &a.set_num_threads);
  resolve("kiln_model_set_profiling", &a.set_profiling);
  resolve("kiln_model_profile", &a.profile);
  resolve("kiln_search_options_init", &a.search_options_init);
  resolve("kiln_generate", &a.generate);
  resolve("kiln_generation_free", &a.generation_free);
  resolve("kiln_model_symbol_max", &a.symbol_max);
  resolve("kiln_model_config", &a.config);
  a.save_weights =
      reinterpret_cast<decltype(a.save_weights)>(dlsym(handle, "kiln_model_save_weights"));
  if (dlsym(handle, "kiln_generator_create")) {
    resolve("kiln_generator_create", &a.generator_create);
    resolve("kiln_generator_add", &a.generator_add);
    resolve("kiln_generator_step", &a.generator_step);
    resolve("kiln_generator_cancel", &a.generator_cancel);
    resolve("kiln_generator_finished", &a.generator_finished);
    resolve("kiln_generator_take", &a.generator_take);
    resolve("kiln_generator_free", &a.generator_free);
  }
  return l;
}

}  // namespace kiln::rt
