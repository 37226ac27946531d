// Binding an entry point's inputs and checking inputs and outputs (see binding.h).
#include "runtime/binding.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "runtime/weights.h"
#include "support/error.h"

namespace kiln::rt {

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const FunctionDesc& find_function(const Plan& plan, const char* name) {
  if (!name) fail("model '{}': no entry point name given (NULL)", plan.model);
  for (const FunctionDesc& f : plan.functions)
    if (f.name == name) return f;
  std::vector<std::string> names;
  for (const FunctionDesc& f : plan.functions) names.push_back(f.name);
  fail("model '{}' has no entry point '{}' (entry points: {})", plan.model, name,
       fmt::join(names, ", "));
}

std::vector<int64_t> bind(const Plan& plan, const FunctionDesc& f, const kiln_tensor* inputs,
                          size_t n, std::vector<const kiln_tensor*>* ordered) {
  if (n != f.params.size())
    fail("entry point '{}' takes {} inputs, got {}", f.name, f.params.size(), n);
  if (n && !inputs) fail("entry point '{}': inputs is null", f.name);
  ordered->assign(f.params.size(), nullptr);
  for (size_t i = 0; i < n; ++i) {
    size_t slot = i;
    if (inputs[i].name) {
      slot = f.params.size();
      for (size_t p = 0; p < f.params.size(); ++p)
        if (f.params[p].name == inputs[i].name) slot = p;
      if (slot == f.params.size())
        fail("entry point '{}' has no input '{}'", f.name, inputs[i].name);
    }
    if ((*ordered)[slot]) fail("input '{}' is given twice", f.params[slot].name);
    (*ordered)[slot] = &inputs[i];
  }
  std::vector<int64_t> syms(plan.symbols.size(), -1);
  std::vector<std::string> bound_by(plan.symbols.size());  // the input that bound each
  for (size_t p = 0; p < f.params.size(); ++p) {
    const auto& want = f.params[p];
    const kiln_tensor& t = *(*ordered)[p];
    // An i64 parameter (ids) also takes i32.
    const bool ok_type = t.dtype == want.type || (want.type == KILN_I64 && t.dtype == KILN_I32);
    if (!ok_type)
      fail("input '{}' is {}, expected {}", want.name, kiln::dtype_name(t.dtype),
           want.type == KILN_I64 ? "i64 or i32" : kiln::dtype_name(want.type));
    if (t.rank != static_cast<int32_t>(want.shape.size()) || t.rank < 0 || t.rank > KILN_MAX_RANK)
      fail("input '{}' has rank {}, expected {}", want.name, t.rank, want.shape.size());
    std::vector<int64_t> shape(t.shape, t.shape + t.rank);
    for (size_t d = 0; d < want.shape.size(); ++d) {
      const auto& dim = want.shape[d];
      int s = dim.scaled_symbol();
      if (s < 0) {
        if (shape[d] != dim.coeff)
          fail("input '{}' has shape {}: dim {} is {}, expected {}", want.name, shape_string(shape),
               d, shape[d], dim.coeff);
        continue;
      }
      const auto& sym = plan.symbols[s];
      // coeff·symbol (64*T, 2*(T+1)): the symbol's value is the size over coeff.
      const std::string name = dim.coeff == 1 ? sym.name
                               : sym.base < 0 ? fmt::format("{}*{}", dim.coeff, sym.name)
                                              : fmt::format("{}*({})", dim.coeff, sym.name);
      if (shape[d] < dim.coeff)
        fail("input '{}' has shape {}: dim {} ({}) is {}, expected at least {}", want.name,
             shape_string(shape), d, name, shape[d], dim.coeff);
      if (shape[d] % dim.coeff != 0)
        fail("input '{}' has shape {}: dim {} ({}) is {}, expected a multiple of {}", want.name,
             shape_string(shape), d, name, shape[d], dim.coeff);
      const int64_t value = shape[d] / dim.coeff;
      if (value > sym.max)
        fail("input '{}' has shape {}: dim {} ({}) is {}, above its maximum {}", want.name,
             shape_string(shape), d, name, shape[d], sym.max * dim.coeff);
      if (sym.base >= 0 && value < sym.scale + sym.offset)
        fail("input '{}' has shape {}: dim {} ({}) is {}, expected at least {}", want.name,
             shape_string(shape), d, name, shape[d], (sym.scale + sym.offset) * dim.coeff);
      if (syms[s] >= 0 && syms[s] != value)
        fail("input '{}' has shape {}: dim {} ({}) is {}, but {} is {} in an earlier input",
             want.name, shape_string(shape), d, name, shape[d], sym.name, syms[s]);
      if (syms[s] < 0) bound_by[s] = want.name;
      syms[s] = value;
    }
    const int64_t n_el = numel_of(shape);
    const uint64_t bytes = static_cast<uint64_t>(n_el) * kiln_dtype_size(t.dtype);
    if (t.capacity < bytes)
      fail("input '{}' of shape {} needs {} bytes of {}, its buffer holds {}", want.name,
           shape_string(shape), bytes, kiln::dtype_name(t.dtype), t.capacity);
    if (!t.data) fail("input '{}' has no data", want.name);
    if (t.dtype == KILN_BOOL)
      for (int64_t e = 0; e < n_el; ++e)
        if (uint8_t v = static_cast<const uint8_t*>(t.data)[e]; v > 1)
          fail("input '{}' holds {} at element {}; bool elements must be 0 or 1", want.name, v, e);
  }
  // A symbol derived from another (T+1) gives its base when only it is bound; then every
  // derived symbol follows from its base and must equal what an input gave it.
  for (size_t s = 0; s < syms.size(); ++s) {
    const SymbolDesc& d = plan.symbols[s];
    if (d.base < 0 || syms[s] < 0 || syms[d.base] >= 0) continue;
    if ((syms[s] - d.offset) % d.scale != 0)
      fail("input '{}' gives {} = {}, which no value of {} gives", bound_by[s], d.name, syms[s],
           plan.symbols[d.base].name);
    syms[d.base] = (syms[s] - d.offset) / d.scale;
    bound_by[d.base] = bound_by[s];
  }
  for (size_t s = 0; s < syms.size(); ++s)
    if (plan.symbols[s].base < 0 && syms[s] < 0) syms[s] = 1;  // no input of this entry point
  for (size_t s = 0; s < syms.size(); ++s) {
    const SymbolDesc& d = plan.symbols[s];
    if (d.base < 0) continue;
    const int64_t want = d.scale * syms[d.base] + d.offset;
    if (syms[s] >= 0 && syms[s] != want)
      fail("input '{}' gives {} = {}, but input '{}' gives {} = {}", bound_by[s], d.name, syms[s],
           bound_by[d.base], plan.symbols[d.base].name, syms[d.base]);
    syms[s] = want;
  }
  for (const auto& c : f.checks)
    if (int64_t lhs = c.lhs.eval(syms), rhs = c.rhs.eval(syms); lhs > rhs)
      fail("entry point '{}': {} ({} > {})", f.name, c.what, lhs, rhs);
  // Ids and indices, once every size they are checked against is bound.
  for (size_t p = 0; p < f.params.size(); ++p) {
    const auto& want = f.params[p];
    const kiln_tensor& t = *(*ordered)[p];
    std::vector<int64_t> shape(t.shape, t.shape + t.rank);
    const int64_t n_el = numel_of(shape);
    for (const auto& [limit_expr, what, lowest] : want.id_limits)
      for (int64_t e = 0, limit = limit_expr.eval(syms); e < n_el; ++e) {
        int64_t id = t.dtype == KILN_I64 ? static_cast<const int64_t*>(t.data)[e]
                                         : static_cast<const int32_t*>(t.data)[e];
        if (id < lowest || id >= limit) {
          std::string index;
          for (int64_t r = e, d = t.rank - 1; d >= 0; --d) {
            index = std::to_string(r % shape[d]) + (index.empty() ? "" : ",") + index;
            r /= shape[d];
          }
          fail("{} {} at '{}'[{}] is out of range [{}, {})", what, id, want.name, index, lowest,
               limit);
        }
      }
  }
  return syms;
}

std::vector<int64_t> result_shape(const TensorDesc& r, const std::vector<int64_t>& syms) {
  std::vector<int64_t> s;
  for (const auto& d : r.shape) s.push_back(d.eval(syms));
  return s;
}

void describe_outputs(const FunctionDesc& f, const std::vector<int64_t>& syms, kiln_tensor* outputs,
                      size_t n_out) {
  if (n_out != f.results.size())
    fail("entry point '{}' has {} outputs, got room for {}", f.name, f.results.size(), n_out);
  for (size_t i = 0; i < n_out; ++i) {
    std::vector<int64_t> s = result_shape(f.results[i], syms);
    outputs[i].name = f.results[i].name.c_str();
    outputs[i].dtype = f.results[i].type;
    outputs[i].rank = static_cast<int32_t>(s.size());
    for (size_t d = 0; d < s.size(); ++d) outputs[i].shape[d] = s[d];
  }
}

void check_outputs(const FunctionDesc& f, const std::vector<int64_t>& syms,
                   const std::vector<const kiln_tensor*>& ordered, kiln_tensor* outputs,
                   size_t n_out, std::vector<uint8_t*>* data, std::vector<int64_t>* bytes) {
  std::vector<uint8_t*>& result_data = *data;
  std::vector<int64_t>& result_bytes = *bytes;
  result_data.assign(n_out, nullptr);
  result_bytes.assign(n_out, 0);
  // Every output is checked before any kernel runs: a refused call writes nothing.
  if (n_out && !outputs) fail("entry point '{}': outputs is null", f.name);
  for (size_t r = 0; r < n_out; ++r) {
    const std::string& name = f.results[r].name;
    if (outputs[r].dtype != f.results[r].type)
      fail("output '{}' is {}, given a buffer of {}", name, kiln::dtype_name(f.results[r].type),
           kiln::dtype_name(outputs[r].dtype));
    std::vector<int64_t> want = result_shape(f.results[r], syms);
    std::vector<int64_t> got(outputs[r].shape,
                             outputs[r].shape + std::clamp(outputs[r].rank, 0, KILN_MAX_RANK));
    if (got != want)
      fail("output '{}' has shape {}, expected {}", name, shape_string(got), shape_string(want));
    result_bytes[r] = numel_of(want) * static_cast<int64_t>(kiln_dtype_size(f.results[r].type));
    if (outputs[r].capacity < static_cast<uint64_t>(result_bytes[r]))
      fail("output '{}' of shape {} needs {} bytes of {}, its buffer holds {}", name,
           shape_string(want), result_bytes[r], kiln::dtype_name(outputs[r].dtype),
           outputs[r].capacity);
    if (!outputs[r].data) fail("output '{}' has no data", name);
    result_data[r] = static_cast<uint8_t*>(outputs[r].data);
    if (const int32_t p = f.results[r].updates_param; p >= 0 && outputs[r].data != ordered[p]->data)
      fail("output '{}' updates input '{}' in place: pass the same buffer for both", name,
           f.params[p].name);
  }
}

std::vector<Span> host_spans(const std::vector<const kiln_tensor*>& ordered) {
  std::vector<Span> spans;
  for (const kiln_tensor* t : ordered) {
    const uint64_t at = reinterpret_cast<uintptr_t>(t->data);
    const int64_t n = numel_of(std::vector<int64_t>(t->shape, t->shape + t->rank));
    spans.push_back({0, at, at + static_cast<uint64_t>(n) * kiln_dtype_size(t->dtype)});
  }
  return spans;
}

void check_disjoint(const FunctionDesc& f, const std::vector<Span>& params,
                    const std::vector<Span>& results) {
  KILN_ASSERT(params.size() == f.params.size() && results.size() == f.results.size(),
              "a span per input and output");
  auto overlap = [](const Span& a, const Span& b) {
    return a.space == b.space && a.begin < b.end && b.begin < a.end;
  };
  // Output `r` shares bytes with `other` (`what`, named `other_name`).
  auto refuse = [&](size_t r, const Span& other, const char* what, const std::string& other_name) {
    const Span& a = results[r];
    const uint64_t lo = std::max(a.begin, other.begin), hi = std::min(a.end, other.end);
    fail(
        "output '{}' overlaps {} '{}' (its bytes [{}, {}) are bytes [{}, {}) of '{}'): an "
        "output must not share memory with an input or another output (a cache updated in "
        "place is the one exception)",
        f.results[r].name, what, other_name, lo - a.begin, hi - a.begin, lo - other.begin,
        hi - other.begin, other_name);
  };
  for (size_t r = 0; r < results.size(); ++r) {
    for (size_t p = 0; p < params.size(); ++p)
      if (overlap(results[r], params[p]) && f.results[r].updates_param != static_cast<int32_t>(p))
        refuse(r, params[p], "input", f.params[p].name);
    for (size_t o = 0; o < r; ++o)
      if (overlap(results[r], results[o])) refuse(r, results[o], "output", f.results[o].name);
  }
}

}  // namespace kiln::rt
