// Looking up and rendering the embedded templates (see templates.h).
#include "driver/templates.h"

#include <cctype>
#include <set>
#include <utility>

#include "support/error.h"

namespace kiln::driver {
namespace templates_data {
// In templates_data.cpp, which embed_templates.cmake writes.
extern const std::pair<std::string_view, std::string_view> kFiles[];
extern const int kNumFiles;
}  // namespace templates_data

std::string_view template_text(std::string_view file) {
  for (int i = 0; i < templates_data::kNumFiles; ++i)
    if (templates_data::kFiles[i].first == file) return templates_data::kFiles[i].second;
  KILN_ASSERT(false, "no template named " + std::string(file));
  return {};
}

std::string render(std::string_view file, const std::map<std::string, std::string>& values) {
  const std::string_view text = template_text(file);
  std::string out;
  std::set<std::string> used;
  size_t at = 0;
  while (at < text.size()) {
    const size_t open = text.find('@', at);
    if (open == std::string_view::npos) break;
    size_t end = open + 1;
    while (end < text.size() &&
           (std::islower(static_cast<unsigned char>(text[end])) || text[end] == '_'))
      ++end;
    if (end == open + 1 || end >= text.size() || text[end] != '@') {  // a plain '@'
      out.append(text.substr(at, open + 1 - at));
      at = open + 1;
      continue;
    }
    const std::string name(text.substr(open + 1, end - open - 1));
    const auto value = values.find(name);
    KILN_ASSERT(value != values.end(),
                "template " + std::string(file) + " has no value for @" + name + "@");
    out.append(text.substr(at, open - at));
    out += value->second;
    used.insert(name);
    at = end + 1;
  }
  out.append(text.substr(at));
  for (const auto& [name, value] : values)
    KILN_ASSERT(used.count(name), "template " + std::string(file) + " has no @" + name + "@");
  return out;
}

}  // namespace kiln::driver
