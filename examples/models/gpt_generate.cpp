// Greedy generation with the compiled GPT example: appends the argmax of the last
// position's logits to the prompt, N times (the whole prefix recomputed each step), and
// compares the tokens with PyTorch's ("greedy" in the file, next to "prompt").
//
//   gpt_generate WEIGHTS GREEDY.safetensors
#include <algorithm>
#include <cstdio>
#include <exception>

#include "gpt.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s WEIGHTS GREEDY.safetensors\n", argv[0]);
    return 2;
  }
  try {
    kiln_models::gpt model(argv[1]);
    kiln::Tensor<int64_t> ids = kiln::read_tensor<int64_t>(argv[2], "prompt");
    const kiln::Tensor<int64_t> want = kiln::read_tensor<int64_t>(argv[2], "greedy");
    kiln::Tensor<float> logits;
    std::printf("greedy:");
    bool ok = true;
    for (int64_t step = 0; step < want.shape[1]; ++step) {
      model.forward(ids, logits);
      const int64_t length = ids.shape[1], vocab = logits.shape[2];
      const float* last = &logits.data[static_cast<size_t>((length - 1) * vocab)];
      const int64_t next = std::max_element(last, last + vocab) - last;
      std::printf(" %lld", static_cast<long long>(next));
      ok = ok && next == want.data[static_cast<size_t>(step)];
      ids.data.push_back(next);
      ids.shape[1] = length + 1;
    }
    std::printf(ok ? " (as PyTorch)\n" : " (differs from PyTorch)\n");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 1;
  }
}
