// Graphviz export of a function's dataflow graph (see dot.h).
#include "tools/dot.h"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ir/printer.h"

namespace kiln::tools {
namespace {

// A DOT string literal's contents: quotes and backslashes escaped, newlines as \n.
std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

bool is_fused(ir::OpKind kind) {
  return kind == ir::OpKind::attention || kind == ir::OpKind::linear ||
         kind == ir::OpKind::add_layernorm;
}

// The attributes worth showing in a label: a weight's name, a constant's value.
std::string detail(const ir::Op& op) {
  if (op.kind == ir::OpKind::weight && op.has_attr("name")) return op.str_attr("name");
  if (op.kind == ir::OpKind::constant && op.has_attr("value"))
    return ir::print_attr_value(op.attrs.at("value"));
  if (op.kind == ir::OpKind::linear && op.has_attr("act") && op.str_attr("act") != "none")
    return "act " + op.str_attr("act");
  if (op.kind == ir::OpKind::attention && op.has_attr("heads")) {
    std::string s = fmt::format("heads {}", op.int_attr("heads"));
    if (op.has_attr("causal") && op.int_attr("causal") != 0) s += ", causal";
    return s;
  }
  return {};
}

}  // namespace

std::string to_dot(const ir::Module& module, const ir::Function& f) {
  const std::vector<std::string> names = ir::value_names(f);
  // The node of each value: a parameter's or its defining op's.
  std::vector<std::string> node(f.values.size());
  for (size_t i = 0; i < f.params.size(); ++i) node[f.params[i]] = fmt::format("p{}", i);
  for (size_t i = 0; i < f.ops.size(); ++i) node[f.ops[i].result] = fmt::format("n{}", i);

  std::string out = fmt::format("digraph \"{}\" {{\n", escape(f.name));
  out += fmt::format("  label=\"module @{}, func @{}{}\";\n  labelloc=t;\n", escape(module.name),
                     escape(f.name),
                     f.arena_bytes >= 0 ? fmt::format(", arena {} bytes", f.arena_bytes) : "");
  out += "  rankdir=TB;\n  fontname=\"Helvetica\";\n";
  out += "  node [shape=box, fontname=\"Helvetica\", fontsize=10];\n";
  out += "  edge [color=\"#555555\", arrowsize=0.6];\n";

  for (size_t i = 0; i < f.params.size(); ++i) {
    const ir::ValueId p = f.params[i];
    out += fmt::format(
        "  {} [label=\"{}\\n{}\", shape=ellipse, style=filled, fillcolor=\"#cfe2ff\"];\n", node[p],
        escape(names[p]), escape(ir::to_string(f.type(p))));
  }
  for (size_t i = 0; i < f.ops.size(); ++i) {
    const ir::Op& op = f.ops[i];
    std::string label = names[op.result] + " = " + ir::op_name(op.kind);
    if (std::string d = detail(op); !d.empty()) label += "\n" + d;
    label += "\n" + ir::to_string(f.type(op.result));
    if (op.arena_offset >= 0) label += fmt::format("\nat {}", op.arena_offset);
    std::string style;
    if (is_fused(op.kind)) {
      style = ", shape=box3d, style=\"filled,bold\", fillcolor=\"#ffd27f\", penwidth=2";
    } else if (op.operands.empty()) {
      style =
          ", style=filled, fillcolor=\"#e8e8e8\", color=\"#aaaaaa\", fontcolor=\"#666666\", "
          "fontsize=7, height=0.2, margin=\"0.04,0.02\"";
    }
    out += fmt::format("  {} [label=\"{}\"{}];\n", node[op.result], escape(label), style);
  }
  for (size_t i = 0; i < f.results.size(); ++i) {
    const ir::ValueId r = f.results[i];
    out += fmt::format(
        "  r{} [label=\"return {}\\n{}\", shape=ellipse, style=filled, fillcolor=\"#d1f2d9\"];\n",
        i, escape(names[r]), escape(ir::to_string(f.type(r))));
  }

  // Edges: each distinct operand to its user, in operand order; results last.
  for (size_t i = 0; i < f.ops.size(); ++i) {
    const ir::Op& op = f.ops[i];
    for (size_t k = 0; k < op.operands.size(); ++k) {
      const ir::ValueId v = op.operands[k];
      if (std::find(op.operands.begin(), op.operands.begin() + k, v) != op.operands.begin() + k)
        continue;
      if (node[v].empty()) continue;  // a dangling operand: the verifier's business
      out += fmt::format("  {} -> {};\n", node[v], node[op.result]);
    }
  }
  for (size_t i = 0; i < f.results.size(); ++i)
    if (!node[f.results[i]].empty()) out += fmt::format("  {} -> r{};\n", node[f.results[i]], i);
  out += "}\n";
  return out;
}

}  // namespace kiln::tools
