// Fuzz target: bytes as a safetensors file through SafeTensors::from_bytes, the weight
// checks of runtime/weights.h against the tiny Transformer's expected weights (its golden
// checkpoint's), and the reads a loader does (every tensor's bytes, to_f32 / to_i64 where the dtype
// allows). The corpus is seeded with tests/golden's small files. kiln::Error is the expected
// outcome of a bad file; anything else is a bug.
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/safetensors.h"
#include "runtime/weights.h"
#include "support/error.h"

namespace {

using namespace kiln;

// The state_dict tensors the tiny model loads: those of its golden checkpoint, which the
// tests check against the model (read here so the target needs no compiler layers).
const std::vector<rt::WeightSpec>& tiny_weights() {
  static const std::vector<rt::WeightSpec> specs = [] {
    std::vector<rt::WeightSpec> out;
    const rt::SafeTensors golden = rt::SafeTensors::load(KILN_FUZZ_TINY_WEIGHTS);
    for (const rt::TensorInfo& t : golden.tensors()) out.push_back({t.name, t.dtype, t.shape});
    return out;
  }();
  return specs;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<rt::WeightSpec>& expected = tiny_weights();
  try {
    const rt::SafeTensors file =
        rt::SafeTensors::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz.safetensors");
    const std::vector<std::string> problems = rt::check_weights(file, expected);
    uint64_t sum = 0;  // touch every byte a loader would read
    for (const rt::TensorInfo& t : file.tensors()) {
      for (uint8_t b : file.bytes(t)) sum += b;
      if (t.dtype == rt::DType::f32) sum += file.to_f32(t).size();
      if (t.dtype == rt::DType::i64 || t.dtype == rt::DType::i32) sum += file.to_i64(t).size();
    }
    if (problems.empty()) rt::check_weights_or_throw(file, expected);
    for (const auto& [k, v] : file.metadata()) sum += k.size() + v.size();
    if (sum == 0xFFFFFFFFFFFFFFFFULL) return 1;  // keeps the reads
  } catch (const Error&) {
  }
  return 0;
}
