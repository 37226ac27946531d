// Greedy generation with a compiled seed model: starting from "prompt" [N, P] (the start
// token) and the source batch "src" [N, S] (right-padded), appends the argmax of the last
// position's logits to every row, as many times as "greedy" [N, steps] has columns (the whole
// target recomputed with `forward` each step), and compares the tokens with PyTorch's. Built
// once per model (MODEL_HEADER and MODEL_CLASS name the generated header and class).
//
//   greedy_MODEL WEIGHTS GREEDY.safetensors
#include <algorithm>
#include <cstdio>
#include <exception>
#include <vector>

#include MODEL_HEADER

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s WEIGHTS GREEDY.safetensors\n", argv[0]);
    return 2;
  }
  try {
    kiln_models::MODEL_CLASS model(argv[1]);
    const kiln::Tensor<int64_t> src = kiln::read_tensor<int64_t>(argv[2], "src");
    const kiln::Tensor<int64_t> prompt = kiln::read_tensor<int64_t>(argv[2], "prompt");
    const kiln::Tensor<int64_t> want = kiln::read_tensor<int64_t>(argv[2], "greedy");
    const int64_t rows = prompt.shape[0], steps = want.shape[1];
    std::vector<std::vector<int64_t>> tgt(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < prompt.shape[1]; ++j)
        tgt[r].push_back(prompt.data[static_cast<size_t>(r * prompt.shape[1] + j)]);
    kiln::Tensor<float> logits;
    bool ok = true;
    for (int64_t step = 0; step < steps; ++step) {
      const int64_t length = static_cast<int64_t>(tgt[0].size());
      kiln::Tensor<int64_t> ids;
      ids.shape = {rows, length};
      for (const std::vector<int64_t>& row : tgt)
        ids.data.insert(ids.data.end(), row.begin(), row.end());
      model.run("forward", {src, ids}, {logits});
      const int64_t vocab = logits.shape[2];
      for (int64_t r = 0; r < rows; ++r) {
        const float* last = &logits.data[static_cast<size_t>(((r * length) + length - 1) * vocab)];
        const int64_t next = std::max_element(last, last + vocab) - last;
        ok = ok && next == want.data[static_cast<size_t>(r * steps + step)];
        tgt[r].push_back(next);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      std::printf("greedy %s row %lld:", argv[0], static_cast<long long>(r));
      for (size_t j = static_cast<size_t>(prompt.shape[1]); j < tgt[r].size(); ++j)
        std::printf(" %lld", static_cast<long long>(tgt[r][j]));
      std::printf("\n");
    }
    std::printf(ok ? "greedy %s: as PyTorch\n" : "greedy %s: differs from PyTorch\n", argv[0]);
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 1;
  }
}
