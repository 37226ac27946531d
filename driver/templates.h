// The template files of the generated header and glue (driver/templates/*.in), embedded
// into kiln at build time, and their rendering: each @name@ in a template is replaced by
// the value given for `name` (in one pass: values are not scanned again).
#pragma once

#include <map>
#include <string>
#include <string_view>

namespace kiln::driver {

// The text of template `file` (e.g. "model.h.in").
std::string_view template_text(std::string_view file);

// `file`'s text with its placeholders replaced by `values`. A placeholder without a value,
// or a value no placeholder uses, is a bug in kiln (KILN_ASSERT).
std::string render(std::string_view file, const std::map<std::string, std::string>& values);

}  // namespace kiln::driver
