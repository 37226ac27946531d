// The C++ that `kiln compile` writes beside the kernels, from the templates in
// driver/templates/: the model's header (the C ABI `NAME_create` and the C++ class
// kiln_models::NAME with one typed method per entry point) and the glue (the serialized
// plan, the kernel table, and for a GPU target the device driver's loading and memory
// operations).
#pragma once

#include <string>
#include <vector>

#include "runtime/plan.h"

namespace kiln::driver {

// Whether `s` is a C identifier (a library name must be one).
bool is_identifier(const std::string& s);

// The library name becomes the C function NAME_create, the C++ class kiln_models::NAME and
// the files libNAME.a and NAME.h: throws kiln::Error, before any work, when it is no C
// identifier, a C or C++ keyword, an identifier the C++ standard reserves (__x, _X), or a
// name of kiln's own (kiln, kiln_models, std, kiln_*: the runtime's C types). Anything else
// that the header's C++ rejects (a macro of a standard header, say) fails kiln compile's
// first step, the header's compile.
void check_library_name(const std::string& name);

// Entry points become methods of a class deriving from kiln::Model: throws kiln::Error when
// `function` is no C++ identifier or clashes with a member of class `class_name`.
void check_method_name(const std::string& function, const std::string& class_name);

// NAME.h for the library `name` built from `plan` for `target`.
std::string header_source(const std::string& name, const rt::Plan& plan, const std::string& target);

// NAME_glue.cpp; `gpu` is "", "opencl" or "cuda"; `num_outputs[k]`: how many of kernel k's
// buffers (the last) it writes.
std::string glue_source(const std::string& name, const rt::Plan& plan, const std::string& gpu,
                        const std::vector<int>& num_outputs);

}  // namespace kiln::driver
