// An application using a kiln-compiled Transformer: loads weights, runs `encode` and the
// teacher-forced `forward` on a batch of ids, prints each position's best next token,
// and (given expected outputs) reports the largest difference from them.
//
//   translate WEIGHTS.safetensors INPUTS.safetensors [EXPECTED.safetensors]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>

#include "tiny_transformer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: %s WEIGHTS.safetensors INPUTS.safetensors [EXPECTED.safetensors]\n",
                 argv[0]);
    return 2;
  }
  try {
    kiln_models::tiny_transformer model(argv[1]);
    model.set_num_threads(2);
    kiln::Tensor<int64_t> src = kiln::read_tensor<int64_t>(argv[2], "src");
    kiln::Tensor<int64_t> tgt = kiln::read_tensor<int64_t>(argv[2], "tgt");

    kiln::Tensor<float> memory = model.encode(src);
    kiln::Tensor<float> logits = model.forward(src, tgt);
    const int64_t B = logits.shape[0], T = logits.shape[1], V = logits.shape[2];
    for (int64_t b = 0; b < B; ++b) {
      std::printf("batch %lld: next tokens", static_cast<long long>(b));
      for (int64_t t = 0; t < T; ++t) {
        const float* row = &logits.data[(b * T + t) * V];
        std::printf(" %lld", static_cast<long long>(std::max_element(row, row + V) - row));
      }
      std::printf("\n");
    }
    if (argc > 3) {
      double worst = 0;
      const std::pair<const char*, const kiln::Tensor<float>*> outputs[] = {{"logits", &logits},
                                                                            {"memory", &memory}};
      for (const auto& [name, got] : outputs) {
        kiln::Tensor<float> want = kiln::read_tensor<float>(argv[3], name);
        if (want.shape != got->shape) {
          std::fprintf(stderr, "%s: shape differs from the expected one\n", name);
          return 1;
        }
        double err = 0;
        for (size_t i = 0; i < want.data.size(); ++i)
          err = std::max(err, std::abs(static_cast<double>(got->data[i]) - want.data[i]));
        std::printf("%s: max abs error %.3g\n", name, err);
        worst = std::max(worst, err);
      }
      if (!(worst <= 1e-4)) {
        std::fprintf(stderr, "error above 1e-4\n");
        return 1;
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "translate: %s\n", e.what());
    return 1;
  }
  return 0;
}
