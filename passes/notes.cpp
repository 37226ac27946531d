// Lost-fusion notes (see notes.h): a per-thread collector and the formatting.
#include "passes/notes.h"

#include <algorithm>
#include <tuple>

#include <fmt/format.h>

#include "passes/rewrite.h"

namespace kiln::passes {
namespace {

thread_local LostFusionCollector* current_collector = nullptr;

}  // namespace

LostFusionCollector::LostFusionCollector() : outer_(current_collector) { current_collector = this; }

LostFusionCollector::~LostFusionCollector() { current_collector = outer_; }

void note_lost_fusion(const ir::Function& f, const ir::Op& anchor, const char* pass,
                      std::string_view what, std::string reason) {
  if (!current_collector) return;
  current_collector->notes_.push_back(LostFusion{f.name, value_label(f, anchor.result), anchor.src,
                                                 anchor.loc, pass, std::string(what),
                                                 std::move(reason)});
}

std::vector<std::string> format_lost_fusions(const ir::Module& module,
                                             const std::vector<LostFusion>& notes,
                                             std::string_view ir_file) {
  // (file, line, text): lines sort by number, not as text.
  std::vector<std::tuple<std::string, int64_t, std::string>> keyed;
  for (const LostFusion& n : notes) {
    std::string place = module.source_text(n.src);
    std::string file;
    int64_t line = 0;
    if (!place.empty()) {
      file = module.sources[n.src.file];
      line = n.src.line;
    } else if (n.loc.line > 0) {
      file = ir_file.empty() ? std::string("line") : std::string(ir_file);
      line = n.loc.line;
      place = ir_file.empty() ? fmt::format("line {}:{}", n.loc.line, n.loc.col)
                              : fmt::format("{}:{}:{}", ir_file, n.loc.line, n.loc.col);
    } else {
      place = fmt::format("function '{}', {}", n.function, n.value);
    }
    keyed.emplace_back(
        std::move(file), line,
        fmt::format("note: {}: {} left unfused: {} [{}]", place, n.what, n.reason, n.pass));
  }
  std::sort(keyed.begin(), keyed.end());
  std::vector<std::string> lines;
  for (auto& k : keyed)
    if (lines.empty() || lines.back() != std::get<2>(k)) lines.push_back(std::move(std::get<2>(k)));
  return lines;
}

}  // namespace kiln::passes
