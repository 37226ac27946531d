// Generation with a compiled example (llama, gpt2: nn::add_causal_lm; t5: nn::add_seq2seq) against
// its PyTorch twin's search with a KV cache (make_generate_golden.py, NAME.generate.safetensors):
// greedy search for 32 new tokens and beam search (4 beams, 4 hypotheses) on a batch of
// prompts of different lengths (-1 padded), ids identical and beam scores within 1e-4; then
// sampling (top-k 0, top-p 0.9) twice with one seed, which must give the same ids. Exits 1 on
// any difference. Built once per model (MODEL_HEADER and MODEL_CLASS).
//
//   generate_check_MODEL WEIGHTS GENERATE.safetensors
#include <cmath>
#include <cstdio>
#include <exception>
#include <vector>

#include MODEL_HEADER

namespace {

std::vector<int64_t> row(const kiln::Tensor<int64_t>& t, int64_t r) {
  const int64_t width = t.shape.back();
  std::vector<int64_t> out;
  for (int64_t j = 0; j < width; ++j)
    if (t.data[static_cast<size_t>(r * width + j)] >= 0)
      out.push_back(t.data[static_cast<size_t>(r * width + j)]);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s WEIGHTS GENERATE.safetensors\n", argv[0]);
    return 2;
  }
  try {
    kiln_models::MODEL_CLASS model(argv[1]);
    const kiln::Tensor<int64_t> prompts = kiln::read_tensor<int64_t>(argv[2], "prompts");
    const kiln::Tensor<int64_t> greedy = kiln::read_tensor<int64_t>(argv[2], "greedy");
    const kiln::Tensor<int64_t> beam = kiln::read_tensor<int64_t>(argv[2], "beam");
    const kiln::Tensor<float> scores = kiln::read_tensor<float>(argv[2], "beam_scores");
    const int64_t batch = prompts.shape[0];
    bool ok = true;
    kiln::SearchOptions o;
    o.max_decoding_length = 32;
    const auto g = model.generate(prompts, o);
    int same = 0;
    for (int64_t b = 0; b < batch; ++b) same += g[b][0].ids == row(greedy, b);
    std::printf(
        "%s greedy (32 new tokens, %lld prompts or sources of different lengths): %d of %lld as "
        "PyTorch\n",
        argv[0], static_cast<long long>(batch), same, static_cast<long long>(batch));
    ok = ok && same == batch;
    o.beam_size = 4;
    o.num_hypotheses = 4;
    const auto bs = model.generate(prompts, o);
    same = 0;
    double worst = 0;
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < 4; ++h) {
        same += bs[b][h].ids == row(beam, b * 4 + h);
        worst = std::fmax(worst, std::fabs(bs[b][h].score - scores.data[b * 4 + h]));
      }
    std::printf(
        "%s beam 4: %d of %lld hypotheses as the reference beam search, scores within %.2g\n",
        argv[0], same, static_cast<long long>(batch * 4), worst);
    ok = ok && same == batch * 4 && worst <= 1e-4;
    kiln::SearchOptions s;
    s.sampling_top_k = 0;
    s.sampling_top_p = 0.9f;
    s.seed = 42;
    s.max_decoding_length = 32;
    const auto first = model.generate(prompts, s), second = model.generate(prompts, s);
    bool reproducible = true;
    for (int64_t b = 0; b < batch; ++b)
      reproducible = reproducible && first[b][0].ids == second[b][0].ids;
    std::printf("%s sampling (top-p 0.9, seed 42) twice: %s\n", argv[0],
                reproducible ? "the same ids" : "DIFFERENT ids");
    ok = ok && reproducible;
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 1;
  }
}
