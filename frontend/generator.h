// Models written outside kiln: a user's source file that defines one model with
// KILN_MODEL, linked with kiln's generator main (kiln::generator_main), is a small
// program that writes the model's IR (.kir). kiln_add_model(NAME SOURCES file.cpp ...)
// builds and runs that program, then compiles the .kir into the library NAME links,
// as Halide's add_halide_generator + add_halide_library do:
//
//   // classifier.cpp
//   #include "frontend/generator.h"
//   KILN_MODEL(classifier, "a linear classifier over mean-pooled embeddings",
//              {{"small", {{"vocab", 50}, {"dim", 16}, {"classes", 3}, {"max_len", 32}}}}) {
//     const int64_t vocab = kiln::models::config_value(config, "vocab"), ...;
//     kiln::dsl::ModelBuilder mb("classifier");
//     ...
//     return mb.finish();
//   }
//
//   # CMakeLists.txt
//   kiln_add_model(classifier SOURCES classifier.cpp CONFIG small SET max_len=64)
//
// The program's options (`classifier_generator --help`):
//   --config NAME     config to start from (default: the only config, or "base")
//   --set key=value   override one config key (repeatable)
//   -o FILE           output .kir ('-' or none: standard output)
//   --list            print the model's name, description and configs
// Unknown configs and keys, and errors of the model's DSL code, are reported on standard
// error naming what is wrong (exit status 1).
//
// KILN_MODEL only defines the function kiln::generator::model() below, which the
// generator main calls: no static constructor runs (kiln registers nothing implicitly).
#pragma once

#include "frontend/dsl.h"
#include "frontend/model_info.h"
#include "frontend/nn.h"

namespace kiln::generator {

// The model of this generator program; defined by the user's source (KILN_MODEL).
models::ModelInfo model();

// The generator main's work for `argv` (options above): writes the IR or the listing,
// reports errors on standard error, returns the exit status.
int run(const models::ModelInfo& model, int argc, const char* const* argv);

}  // namespace kiln::generator

// KILN_MODEL(name, "description", {{"config", {{"key", value}, ...}}, ...}) { body }
// defines the model `name`: the body builds it from `config` (a kiln::models::Config,
// the chosen config with --set overrides applied) and returns the kiln::ir::Module.
// Compiled with KILN_MODEL_REGISTRY defined (kiln's own build of the seed models,
// frontend/CMakeLists.txt), it defines `kiln::models::ModelInfo kiln_model_info_<name>()`
// instead, which kiln's registry (models.cpp) lists.
#ifdef KILN_MODEL_REGISTRY
#define KILN_MODEL(name, description, ...)                                                      \
  static ::kiln::ir::Module kiln_build_model_##name(const ::kiln::models::Config& config);      \
  ::kiln::models::ModelInfo kiln_model_info_##name() {                                          \
    return {#name, description, ::kiln::models::Configs __VA_ARGS__, &kiln_build_model_##name}; \
  }                                                                                             \
  static ::kiln::ir::Module kiln_build_model_##name(const ::kiln::models::Config& config)
#else
#define KILN_MODEL(name, description, ...)                                                      \
  static ::kiln::ir::Module kiln_build_model_##name(const ::kiln::models::Config& config);      \
  ::kiln::models::ModelInfo kiln::generator::model() {                                          \
    return {#name, description, ::kiln::models::Configs __VA_ARGS__, &kiln_build_model_##name}; \
  }                                                                                             \
  static ::kiln::ir::Module kiln_build_model_##name(const ::kiln::models::Config& config)
#endif
