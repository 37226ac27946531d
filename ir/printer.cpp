// Printer of the IR text form (grammar in printer.h).
#include "ir/printer.h"

#include <cctype>
#include <cmath>

#include <fmt/format.h>

namespace kiln::ir {
namespace {

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20)
          out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
        else
          out += c;
    }
  }
  return out + "\"";
}

// `@name`, or `@"name"` when the name has characters outside [A-Za-z0-9_.] (a weight named
// by an importer after its ONNX initializer, e.g. `@"onnx::MatMul_312"`).
std::string global_name(const std::string& name) {
  bool plain = !name.empty();
  for (char c : name)
    plain = plain && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.');
  return "@" + (plain ? name : quote(name));
}

std::string print_attrs(const Attrs& attrs) {
  if (attrs.empty()) return {};
  std::string out = " {";
  bool first = true;
  for (const auto& [key, value] : attrs) {
    if (!first) out += ", ";
    first = false;
    out += key + " = " + print_attr_value(value);
  }
  return out + "}";
}

}  // namespace

std::vector<std::string> value_names(const Function& f) {
  std::vector<std::string> names(f.values.size());
  int next = 0;
  auto assign = [&](ValueId id) {
    if (names[id].empty())
      names[id] = f.values[id].name.empty() ? std::to_string(next++) : f.values[id].name;
  };
  for (ValueId p : f.params) assign(p);
  for (const Op& op : f.ops) assign(op.result);
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i].empty())
      names[i] = f.values[i].name.empty() ? "?" + std::to_string(i) : f.values[i].name;
    names[i] = "%" + names[i];
  }
  return names;
}

std::string print_attr_value(const AttrValue& value) {
  if (const int64_t* i = std::get_if<int64_t>(&value)) return std::to_string(*i);
  if (const double* d = std::get_if<double>(&value)) {
    if (std::isnan(*d)) return "nan";
    if (std::isinf(*d)) return *d > 0 ? "inf" : "-inf";
    std::string s = fmt::format("{}", *d);  // shortest text that reads back exactly
    if (s.find_first_of(".e") == std::string::npos) s += ".0";
    return s;
  }
  if (const std::string* s = std::get_if<std::string>(&value)) return quote(*s);
  const auto& list = std::get<std::vector<int64_t>>(value);
  std::string out = "[";
  for (size_t i = 0; i < list.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(list[i]);
  }
  return out + "]";
}

std::string print_function(const Module&, const Function& f, int indent) {
  const std::string pad(indent, ' ');
  const std::vector<std::string> names = value_names(f);
  std::string out = pad + "func @" + f.name + "(";
  for (size_t i = 0; i < f.params.size(); ++i) {
    if (i) out += ", ";
    out += names[f.params[i]] + ": " + to_string(f.type(f.params[i]));
  }
  out += ") -> (";
  for (size_t i = 0; i < f.results.size(); ++i) {
    if (i) out += ", ";
    out += to_string(f.type(f.results[i]));
  }
  out += ")";
  if (f.arena_bytes >= 0) out += " arena " + std::to_string(f.arena_bytes);
  out += " {\n";
  for (const Op& op : f.ops) {
    out += pad + "  " + names[op.result] + " = " + op_name(op.kind) + "(";
    for (size_t i = 0; i < op.operands.size(); ++i) {
      if (i) out += ", ";
      out += names[op.operands[i]];
    }
    out += ")" + print_attrs(op.attrs) + " : " + to_string(f.type(op.result));
    if (op.fused) out += " fused";
    if (op.arena_offset >= 0) out += " at " + std::to_string(op.arena_offset);
    if (op.src.known()) {
      out += fmt::format(" src({}:{}", op.src.file, op.src.line);
      if (op.src.scope >= 0) out += fmt::format(", {}", op.src.scope);
      out += ")";
    }
    out += "\n";
  }
  out += pad + "  return";
  for (size_t i = 0; i < f.results.size(); ++i) out += (i ? ", " : " ") + names[f.results[i]];
  out += "\n" + pad + "}\n";
  return out;
}

std::string print_module(const Module& m) {
  std::string out = "module @" + m.name + " {\n";
  if (!m.config.empty()) {
    out += "  config {";
    bool first = true;
    for (const auto& [k, v] : m.config) {
      if (!first) out += ", ";
      first = false;
      out += k + " = " + quote(v);
    }
    out += "}\n";
  }
  for (const Symbol& s : m.symbols) out += fmt::format("  symbol {} max {}\n", s.name, s.max);
  for (const Weight& w : m.weights) {
    out += "  weight " + global_name(w.name) + " : " + to_string(w.type);
    if (w.derivation) {
      out += " = " + w.derivation->op + "(";
      for (size_t i = 0; i < w.derivation->inputs.size(); ++i)
        out += (i ? ", " : "") + global_name(w.derivation->inputs[i]);
      out += ")" + print_attrs(w.derivation->attrs);
    }
    out += "\n";
  }
  for (size_t i = 0; i < m.sources.size(); ++i)
    out += fmt::format("  source {} = {}\n", i, quote(m.sources[i]));
  for (const Function& f : m.functions) out += print_function(m, f);
  out += "}\n";
  return out;
}

}  // namespace kiln::ir
