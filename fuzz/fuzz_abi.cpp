// Fuzz target: the compiled tiny Transformer (golden_tiny, built by kiln_add_model) called
// through the C ABI, kiln_model_output_shapes and kiln_model_run, with fuzzer-chosen
// entry point, input and output counts, names, dtypes, ranks, shapes, capacities and
// contents. Every buffer is allocated with exactly the capacity the call is told, so
// AddressSanitizer catches a read or write past it. A refused call (non-zero, with an
// error message) is the expected outcome of bad arguments; a crash or sanitizer report is
// a bug. The model is created once from tests/golden/tiny.weights.safetensors.
// KILN_FUZZ_VERBOSE=1 prints each call's status and error.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "golden_tiny.h"

namespace {

kiln_model* model() {
  static kiln_model* m = [] {
    char* error = nullptr;
    kiln_model* created = golden_tiny_create(KILN_FUZZ_TINY_WEIGHTS, &error);
    if (!created) {
      std::fprintf(stderr, "fuzz_abi: cannot create the model: %s\n", error ? error : "?");
      std::abort();
    }
    return created;
  }();
  return m;
}

struct Buffer {
  std::unique_ptr<uint8_t, decltype(&std::free)> data{nullptr, &std::free};
};

// Fills `t` from the input: name, dtype, rank, shape and a buffer of the chosen capacity.
void make_tensor(kiln::fuzz::FuzzInput& in, const char* const* names, size_t num_names,
                 kiln_tensor* t, Buffer* buffer, bool fill) {
  std::memset(t, 0, sizeof *t);
  const int64_t which = in.range(0, static_cast<int64_t>(num_names) + 1);
  t->name = which < static_cast<int64_t>(num_names)    ? names[which]
            : which == static_cast<int64_t>(num_names) ? nullptr
                                                       : "bogus";
  t->dtype = static_cast<int32_t>(in.range(-1, 4));
  t->rank = static_cast<int32_t>(in.range(-1, KILN_MAX_RANK + 1));
  for (int d = 0; d < KILN_MAX_RANK; ++d) {
    const uint8_t kind = in.byte();
    t->shape[d] = kind < 200 ? kind % 9 : kind < 250 ? in.range(-3, 40) : in.i64();
  }
  const size_t capacity = static_cast<size_t>(in.range(0, 4096));
  const bool null_data = in.byte() == 0xFF;
  t->capacity = capacity;
  if (!null_data && capacity > 0) {
    buffer->data.reset(static_cast<uint8_t*>(std::malloc(capacity)));
    t->data = buffer->data.get();
    if (fill) {
      // Token ids mostly in range: small little-endian values, then the fuzzer's bytes.
      std::memset(t->data, 0, capacity);
      const size_t got = in.take(t->data, capacity < 64 ? capacity : 64);
      for (size_t i = got; i < capacity; ++i) buffer->data.get()[i] = (i % 8 == 0) ? i % 7 : 0;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::fuzz::FuzzInput in(data, size);
  kiln_model* m = model();
  static const char* const kFunctions[] = {"forward", "encode", "nope"};
  const char* function = kFunctions[in.range(0, 2)];
  static const char* const kInputNames[] = {"src", "tgt"};
  static const char* const kOutputNames[] = {"logits", "memory"};

  const size_t num_inputs = static_cast<size_t>(in.range(0, 3));
  const size_t num_outputs = static_cast<size_t>(in.range(0, 2));
  std::vector<kiln_tensor> inputs(num_inputs), outputs(num_outputs);
  std::vector<Buffer> in_buffers(num_inputs), out_buffers(num_outputs);
  for (size_t i = 0; i < num_inputs; ++i)
    make_tensor(in, kInputNames, 2, &inputs[i], &in_buffers[i], /*fill=*/true);
  for (size_t i = 0; i < num_outputs; ++i)
    make_tensor(in, kOutputNames, 2, &outputs[i], &out_buffers[i], /*fill=*/false);

  // Sometimes take the output shapes the model gives, so that runs get past the checks.
  if (in.byte() % 2 == 0 && num_outputs > 0) {
    std::vector<kiln_tensor> shaped = outputs;
    if (kiln_model_output_shapes(m, function, inputs.data(), num_inputs, shaped.data(),
                                 num_outputs) == 0) {
      for (size_t i = 0; i < num_outputs; ++i) {
        outputs[i].name = shaped[i].name;
        outputs[i].dtype = shaped[i].dtype;
        outputs[i].rank = shaped[i].rank;
        std::memcpy(outputs[i].shape, shaped[i].shape, sizeof outputs[i].shape);
      }
    }
  }
  const int status = kiln_model_run(m, function, inputs.data(), num_inputs,
                                    num_outputs ? outputs.data() : nullptr, num_outputs);
  static const bool verbose = std::getenv("KILN_FUZZ_VERBOSE") != nullptr;
  if (verbose)
    std::fprintf(stderr, "fuzz_abi: %s -> %d %s\n", function, status, kiln_model_error(m));
  if (status != 0 && std::strlen(kiln_model_error(m)) == 0) {
    std::fprintf(stderr, "fuzz_abi: a refused call without an error message\n");
    std::abort();
  }
  return 0;
}
