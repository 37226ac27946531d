// Fuzz target: IR text through the parser and the verifier, and a module that verifies
// through the reference interpreter (every symbol bound to 1..3, weights zero, inputs
// small values) and the default pipeline. The input is the .kir text itself, so the
// corpus is readable and seeded with tests/passes/**/*.kir; the symbol sizes and input
// values come from a hash of it. kiln::Error is the expected outcome of bad input;
// anything else (a KILN_ASSERT, a signal, a sanitizer report) is a bug.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ir/interpreter.h"
#include "ir/parser.h"
#include "passes/pipeline.h"
#include "support/error.h"

namespace {

using namespace kiln;

// The most elements of any value the interpreter is asked to compute: keeps one run in
// milliseconds (matmul and attention cost the product of such sizes).
constexpr int64_t kMaxElements = 1 << 14;

// splitmix64: the values of the inputs, from a seed.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
};

// The shape of `type` with symbols bound; false when a dim is unknown or it is too big.
bool bind_shape(const ir::TensorType& type, const std::map<std::string, int64_t>& symbols,
                std::vector<int64_t>* shape) {
  int64_t n = 1;
  shape->clear();
  for (const ir::Dim& d : type.shape) {
    int64_t v = d.value;
    if (d.is_symbolic()) {
      auto it = symbols.find(d.symbol);
      if (it == symbols.end()) return false;
      v = d.at(it->second);
    }
    if (v < 0 || __builtin_mul_overflow(n, v, &n) || n > kMaxElements) return false;
    shape->push_back(v);
  }
  return true;
}

ir::Tensor make_tensor(const ir::TensorType& type, const std::vector<int64_t>& shape, Rng& rng) {
  ir::Tensor t = ir::Tensor::zeros(type.dtype, shape);
  for (float& f : t.f) f = static_cast<float>(static_cast<int64_t>(rng.next() % 9) - 4) / 2;
  for (int64_t& i : t.ints)
    i = static_cast<int64_t>(rng.next() % (type.dtype == ir::DType::boolean ? 2 : 4));
  return t;
}

// Runs every function of `m` whose values all fit kMaxElements; kiln::Error is fine.
void interpret_all(const ir::Module& m, uint64_t seed) {
  Rng rng{seed};
  std::map<std::string, int64_t> symbols;
  for (const ir::Symbol& s : m.symbols)
    symbols[s.name] = 1 + static_cast<int64_t>(rng.next() % 3 % static_cast<uint64_t>(s.max));
  ir::WeightMap weights;
  std::vector<int64_t> shape;
  for (const ir::Weight& w : m.weights) {
    if (w.derivation) continue;
    if (!bind_shape(w.type, symbols, &shape)) return;
    weights[w.name] = ir::Tensor::zeros(w.type.dtype, shape);
  }
  try {
    ir::materialize_weights(m, weights);
  } catch (const Error&) {
    return;
  }
  for (const ir::Function& f : m.functions) {
    bool small = true;
    for (const ir::Value& v : f.values) small = small && bind_shape(v.type, symbols, &shape);
    if (!small) continue;
    std::vector<ir::Tensor> inputs;
    for (ir::ValueId p : f.params) {
      bind_shape(f.type(p), symbols, &shape);
      inputs.push_back(make_tensor(f.type(p), shape, rng));
    }
    try {
      ir::interpret(m, f, weights, inputs);
    } catch (const Error&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  uint64_t seed = 1469598103934665603ULL;  // FNV-1a of the text
  for (uint8_t c : text) seed = (seed ^ c) * 1099511628211ULL;
  ir::Module m;
  try {
    m = ir::parse_and_verify(text, "fuzz.kir");
  } catch (const Error&) {
    return 0;
  }
  interpret_all(m, seed);
  try {
    passes::run_passes(m, passes::default_pipeline());
  } catch (const Error&) {
    return 0;
  }
  interpret_all(m, seed);
  return 0;
}
