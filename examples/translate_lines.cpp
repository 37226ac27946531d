// An application translating text with a kiln-compiled Transformer: reads sentences, one
// per line, from standard input and prints "SOURCE -> TRANSLATION" for each. The model is
// the number translator of examples/numbers ("three hundred and twelve" -> "312"),
// compiled by kiln_add_model; its character-level vocabularies come from the same folder.
//
//   translate_lines WEIGHTS.safetensors SRC_VOCAB TGT_VOCAB [BEAM] < sentences.txt
//
// With REFERENCES (a file of "source<TAB>reference" lines, e.g. examples/numbers/
// heldout.tsv) as the fifth argument it translates their sources instead and reports the
// exact-match accuracy, exiting 1 below 95%.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "kiln/vocab.h"
#include "numbers.h"

namespace {

// Translates `lines` in batches of the compiled maximum.
std::vector<std::string> translate(kiln_models::numbers& model, const kiln::Vocabulary& src_vocab,
                                   const kiln::Vocabulary& tgt_vocab,
                                   const std::vector<std::string>& lines, int beam) {
  const int64_t pad = src_vocab.id("<pad>");
  kiln::SearchOptions options;
  options.beam_size = beam;
  options.max_decoding_length = static_cast<int32_t>(kiln_models::numbers::max_T);
  std::vector<std::string> out;
  for (size_t first = 0; first < lines.size(); first += kiln_models::numbers::max_B) {
    const size_t n = std::min<size_t>(kiln_models::numbers::max_B, lines.size() - first);
    std::vector<std::vector<int64_t>> ids;
    size_t length = 1;
    for (size_t i = 0; i < n; ++i) {
      ids.push_back(src_vocab.encode(lines[first + i]));
      length = std::max(length, ids.back().size());
    }
    kiln::Tensor<int64_t> src{{static_cast<int64_t>(n), static_cast<int64_t>(length)},
                              std::vector<int64_t>(n * length, pad)};
    for (size_t i = 0; i < n; ++i)
      std::copy(ids[i].begin(), ids[i].end(), src.data.begin() + i * length);
    for (const auto& hyps : model.generate(src, options))
      out.push_back(tgt_vocab.decode(hyps[0].ids));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4 || argc > 6) {
    std::fprintf(stderr,
                 "usage: %s WEIGHTS.safetensors SRC_VOCAB TGT_VOCAB [BEAM] [REFERENCES.tsv] "
                 "< sentences\n",
                 argv[0]);
    return 2;
  }
  try {
    kiln_models::numbers model(argv[1]);
    model.set_num_threads(2);
    const kiln::Vocabulary src_vocab = kiln::Vocabulary::load(argv[2]);
    const kiln::Vocabulary tgt_vocab = kiln::Vocabulary::load(argv[3]);
    src_vocab.check_model("source", model.get());  // sizes and special tokens as the model's
    tgt_vocab.check_model("target", model.get());
    const int beam = argc > 4 ? std::atoi(argv[4]) : 1;
    std::vector<std::string> lines, references;
    if (argc > 5) {
      std::ifstream in(argv[5]);
      if (!in) throw std::runtime_error(std::string("cannot read ") + argv[5]);
      std::string line;
      while (std::getline(in, line)) {
        const size_t tab = line.find('\t');
        if (tab == std::string::npos) continue;
        lines.push_back(line.substr(0, tab));
        references.push_back(line.substr(tab + 1));
      }
    } else {
      std::string line;  // bounded: an endless line is an error, not all of memory
      for (int got; (got = kiln::read_line(std::cin, line, kiln::kMaxSentenceBytes)) != 0;) {
        if (got < 0)
          throw std::runtime_error("standard input: line " + std::to_string(lines.size() + 1) +
                                   " is longer than " + std::to_string(kiln::kMaxSentenceBytes) +
                                   " bytes: " + kiln::quote_start(line));
        if (!line.empty()) lines.push_back(line);
      }
    }
    const std::vector<std::string> out = translate(model, src_vocab, tgt_vocab, lines, beam);
    if (references.empty()) {
      for (size_t i = 0; i < lines.size(); ++i)
        std::printf("%s -> %s\n", lines[i].c_str(), out[i].c_str());
      return 0;
    }
    size_t right = 0;
    for (size_t i = 0; i < lines.size(); ++i) {
      if (out[i] == references[i])
        ++right;
      else
        std::printf("miss: %s -> %s (reference %s)\n", lines[i].c_str(), out[i].c_str(),
                    references[i].c_str());
    }
    const double accuracy = lines.empty() ? 0 : 100.0 * right / lines.size();
    std::printf("exact match: %zu of %zu held-out sentences (%.1f%%), beam %d\n", right,
                lines.size(), accuracy, beam);
    return accuracy >= 95.0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "translate_lines: %s\n", e.what());
    return 1;
  }
}
