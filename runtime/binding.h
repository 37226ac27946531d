// Binding an entry point's inputs and checking its inputs and outputs against the plan:
// names or positions to parameters, dtypes, ranks, shapes against the symbols' maxima and
// each other, capacities, bool and id values, and the outputs' dtypes, shapes and room. A
// call that fails any check is refused before anything is written.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/runtime.h"
#include "runtime/plan.h"

namespace kiln::rt {

// The entry point `name` of `plan`; throws naming the entry points there are.
const FunctionDesc& find_function(const Plan& plan, const char* name);

// Binds `f`'s parameters to `inputs` (by name, or by position where a name is NULL) into
// `ordered`, checks them, and returns the symbols' values (1 for a symbol no input uses).
std::vector<int64_t> bind(const Plan& plan, const FunctionDesc& f, const kiln_tensor* inputs,
                          size_t n, std::vector<const kiln_tensor*>* ordered);

// A result's shape for the bound symbols.
std::vector<int64_t> result_shape(const TensorDesc& result, const std::vector<int64_t>& syms);

// Fills each output's name, dtype, rank and shape (kiln_model_output_shapes).
void describe_outputs(const FunctionDesc& f, const std::vector<int64_t>& syms, kiln_tensor* outputs,
                      size_t n_out);

// Checks the caller's outputs of a run (dtype, shape, capacity, data, a cache output's
// buffer being its input's) and returns each one's data and bytes.
void check_outputs(const FunctionDesc& f, const std::vector<int64_t>& syms,
                   const std::vector<const kiln_tensor*>& ordered, kiln_tensor* outputs,
                   size_t n_out, std::vector<uint8_t*>* data, std::vector<int64_t>* bytes);

// A tensor's bytes [begin, end) in one address space: `space` 0 is host memory; a device
// tensor's is its device allocation (kiln_device_ops::allocation), begin its byte offset there.
struct Span {
  uint64_t space = 0, begin = 0, end = 0;
};

// The bytes a call reads of each bound input (its shape in the caller's dtype) in host memory.
std::vector<Span> host_spans(const std::vector<const kiln_tensor*>& ordered);

// Refuses a call whose outputs share bytes with its inputs or with each other (kernels would
// read what an earlier kernel of the call already overwrote, or write one result over
// another), naming both tensors and the bytes they share. The one overlap allowed is an
// output that updates its input in place (a cache): check_outputs has made sure it is the
// same buffer. Inputs may share memory with each other: they are only read.
void check_disjoint(const FunctionDesc& f, const std::vector<Span>& params,
                    const std::vector<Span>& results);

// Elements of a validated shape (every dim >= 1 and at most its maximum or constant).
int64_t numel_of(const std::vector<int64_t>& shape);

}  // namespace kiln::rt
