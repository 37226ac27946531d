// Runs a compiled example model's `forward` on the i64 tensors of INPUTS named by
// INPUT_NAMES (comma-separated, in the entry point's parameter order, e.g. "ids" or
// "src,tgt") and compares each named float output with the same-named tensor of EXPECTED
// (PyTorch's); prints the max abs error per output and exits 1 above the tolerance. Built
// once per model (MODEL_HEADER and MODEL_CLASS name the generated header and class).
//
//   check_MODEL WEIGHTS INPUTS EXPECTED TOLERANCE INPUT_NAMES OUTPUT...
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include MODEL_HEADER

int main(int argc, char** argv) {
  constexpr int kFirstOutput = 6;
  if (argc <= kFirstOutput) {
    std::fprintf(stderr, "usage: %s WEIGHTS INPUTS EXPECTED TOLERANCE INPUT_NAMES OUTPUT...\n",
                 argv[0]);
    return 2;
  }
  try {
    kiln_models::MODEL_CLASS model(argv[1]);
    const double tolerance = std::atof(argv[4]);
    std::vector<kiln::Tensor<int64_t>> inputs;
    const std::string names = argv[5];
    for (size_t start = 0; start <= names.size();) {
      size_t comma = names.find(',', start);
      if (comma == std::string::npos) comma = names.size();
      inputs.push_back(kiln::read_tensor<int64_t>(argv[2], names.substr(start, comma - start)));
      start = comma + 1;
    }
    std::vector<kiln::Tensor<float>> got(static_cast<size_t>(argc - kFirstOutput));
    model.run("forward", std::vector<kiln::Input>(inputs.begin(), inputs.end()),
              std::vector<kiln::Output>(got.begin(), got.end()));
    bool ok = true;
    for (int i = kFirstOutput; i < argc; ++i) {
      const kiln::Tensor<float>& out = got[static_cast<size_t>(i - kFirstOutput)];
      kiln::Tensor<float> want = kiln::read_tensor<float>(argv[3], argv[i]);
      if (want.shape != out.shape) {
        std::fprintf(stderr, "%s: shape differs from the expected one\n", argv[i]);
        return 1;
      }
      double err = 0;
      for (size_t j = 0; j < want.data.size(); ++j)
        err = std::fmax(err, std::fabs(static_cast<double>(out.data[j]) - want.data[j]));
      std::printf("compiled %s %s: max abs error %.3g (tolerance %g)\n", argv[0], argv[i], err,
                  tolerance);
      ok = ok && err <= tolerance;
    }
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 1;
  }
}
