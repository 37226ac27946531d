// `kiln translate` (run as kiln-run translate, the binary it execs) under hostile input
// (issue 25), over generated families (random permutations, sizes, byte values and
// positions, fixed seeds), with the number translator of examples/numbers compiled as a
// shared library: vocabularies that do not fit the model (shuffled, swapped, a token more
// or less), NaN and infinite weights (the error names the sentence and the step), endless
// and oversized input (bounded reads, messages that quote a prefix and the length), and
// text or tokens that are not UTF-8. Each refusal is exit 1 with one `kiln: error:` line.
// The binary and the model may be given by KILN_RUN and KILN_TRANSLATE_MODEL (the
// sanitizer stage of scripts/test.sh runs an instrumented kiln-run).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kiln/vocab.h"
#include "runtime/library_api.h"
#include "runtime/safetensors.h"
#include "tests/cli_run.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

std::string from_env(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}
const std::string kRunner = from_env("KILN_RUN", KILN_RUN_BINARY);
const std::string kModel = from_env("KILN_TRANSLATE_MODEL", KILN_TRANSLATE_MODEL_DIR);
const std::string kNumbers = std::string(KILN_TEST_DATA_DIR) + "/../examples/numbers/";
// The SentencePiece variant's library: KILN_TRANSLATE_SPM_MODEL, else the one beside
// KILN_TRANSLATE_MODEL (X.kiln: X_spm.kiln, the sanitizer stage's), else this build's.
std::string spm_model() {
  const std::string given = from_env("KILN_TRANSLATE_SPM_MODEL", "");
  if (!given.empty()) return given;
  const std::string model = from_env("KILN_TRANSLATE_MODEL", "");
  if (model.size() > 5 && model.substr(model.size() - 5) == ".kiln")
    return model.substr(0, model.size() - 5) + "_spm.kiln";
  return KILN_TRANSLATE_SPM_MODEL_DIR;
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1)
    out.push_back(text.substr(start, end - start));
  if (start < text.size()) out.push_back(text.substr(start));
  return out;
}

class TranslateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kiln_translate_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::create_directories(dir_);
    src_ = read_lines(kNumbers + "vocab.src.txt");
    tgt_ = read_lines(kNumbers + "vocab.tgt.txt");
    ASSERT_EQ(src_.size(), 24u);
    ASSERT_EQ(tgt_.size(), 13u);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& f) const { return (dir_ / f).string(); }
  std::string write(const std::string& name, const std::vector<std::string>& lines) {
    std::ofstream out(path(name), std::ios::binary);
    for (const std::string& l : lines) out << l << '\n';
    return path(name);
  }
  // kiln-run translate with the numbers model, `weights` and `vocabs` (source, target).
  testing::CliResult translate(std::vector<std::string> args, testing::CliOptions options = {},
                               const std::string& weights = kNumbers +
                                                            "numbers.weights.safetensors") {
    std::vector<std::string> argv = {kRunner, "translate", "--compiled",
                                     kModel,  "--weights", weights};
    argv.insert(argv.end(), args.begin(), args.end());
    return testing::run_argv(argv, options);
  }
  testing::CliResult text(const std::string& src_vocab, const std::string& tgt_vocab,
                          std::vector<std::string> extra = {}, testing::CliOptions options = {},
                          const std::string& weights = kNumbers + "numbers.weights.safetensors") {
    std::vector<std::string> args = {"--src-vocab", src_vocab, "--tgt-vocab", tgt_vocab};
    args.insert(args.end(), extra.begin(), extra.end());
    return translate(args, options, weights);
  }
  // The numbers weights with `change` applied to tensor `name`.
  std::string weights_with(const std::string& name,
                           const std::function<void(std::vector<float>&)>& change) {
    rt::SafeTensors w = rt::SafeTensors::load(kNumbers + "numbers.weights.safetensors");
    std::vector<rt::TensorData> out;
    for (const rt::TensorInfo& t : w.tensors()) {
      std::vector<float> v = w.to_f32(t);
      if (t.name == name) change(v);
      out.push_back(rt::make_f32(t.name, t.shape, v));
    }
    rt::write_safetensors(path("w.safetensors"), out, w.metadata());
    return path("w.safetensors");
  }
  std::filesystem::path dir_;
  std::vector<std::string> src_, tgt_;
};

// The first special token (<pad>, <s>, </s>) a vocabulary in `lines` does not hold at the
// model's id (0, 1, 2), as Vocabulary::check_model reports it; "" when all are in place.
std::string misplaced(const std::string& role, const std::string& file,
                      const std::vector<std::string>& lines) {
  const std::vector<std::pair<std::string, std::string>> specials = {
      {"<pad>", "pad_id"}, {"<s>", "bos_id"}, {"</s>", "eos_id"}};
  for (size_t id = 0; id < specials.size(); ++id) {
    const auto& [token, key] = specials[id];
    const size_t at = std::find(lines.begin(), lines.end(), token) - lines.begin();
    if (at == id) continue;
    return fmt::format(
        "kiln: error: translate: {} vocabulary '{}' has {} at id {} (line {}), the model's {} "
        "is {} (line {} holds {})\n",
        role, file, token, at, at + 1, key, id, id + 1, quote(lines[id]));
  }
  return "";
}

TEST_F(TranslateTest, TranslatesWithTheShippedVocabularies) {
  const testing::CliResult r = text(kNumbers + "vocab.src.txt", kNumbers + "vocab.tgt.txt",
                                    {"three hundred and twelve", "forty thousand and seventeen"});
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output, "three hundred and twelve -> 312\nforty thousand and seventeen -> 40017\n");
}

// kiln pack-weights (issue 28, point 4): the laid-out weights translate the held-out
// sentences as the checkpoint does, and a library of another layout, a truncated file and a
// missing -o are refused with the reason.
TEST_F(TranslateTest, PackedWeightsTranslateAsTheCheckpoint) {
  const std::string packed = path("numbers.kiln-weights");
  testing::CliResult r =
      testing::run_argv({kRunner, "pack-weights", "--compiled", kModel, "--weights",
                         kNumbers + "numbers.weights.safetensors", "-o", packed});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output, "");
  std::vector<std::string> sources;
  for (const std::string& line : read_lines(kNumbers + "heldout.tsv"))
    if (sources.size() < 100) sources.push_back(line.substr(0, line.find('\t')));
  ASSERT_EQ(sources.size(), 100u);
  const std::string src = kNumbers + "vocab.src.txt", tgt = kNumbers + "vocab.tgt.txt";
  const testing::CliResult want = text(src, tgt, sources);
  ASSERT_EQ(want.status, 0) << want.output;
  const testing::CliResult got = text(src, tgt, sources, {}, packed);
  EXPECT_EQ(got.status, 0) << got.output;
  EXPECT_EQ(got.output, want.output);

  std::ifstream in(packed, std::ios::binary);
  const std::string bytes(std::istreambuf_iterator<char>(in), {});
  std::ofstream(path("cut.kiln-weights"), std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  r = text(src, tgt, {"one"}, {}, path("cut.kiln-weights"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output, HasSubstr(fmt::format(
                            "kiln: error: laid-out weights '{}' are {} bytes, their header says {} "
                            "(truncated or changed): write them again with 'kiln pack-weights'",
                            path("cut.kiln-weights"), bytes.size() / 2, bytes.size())));
  r = testing::run_argv({kRunner, "pack-weights", "--compiled", kModel, "--weights", packed});
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.output, HasSubstr("-o is required"));
}

// The SentencePiece variant of the number translator (examples/numbers/train.py
// --sentencepiece, issue 28): its 500 held-out sentences through kiln translate with the two
// .spm.model files, whole digit strings compared with the references; PyTorch's greedy search
// got 100% (train.py's output, examples/numbers/README.md), and kiln must reach 99%. The
// character vocabularies do not fit it (sizes named).
TEST_F(TranslateTest, SentencePieceNumberTranslatorTranslatesTheHeldOutSentences) {
  std::string input;
  std::vector<std::string> sources, references;
  for (const std::string& line : read_lines(kNumbers + "heldout.tsv")) {
    sources.push_back(line.substr(0, line.find('\t')));
    references.push_back(line.substr(line.find('\t') + 1));
    input += sources.back() + "\n";
  }
  ASSERT_EQ(sources.size(), 500u);
  const std::string weights = kNumbers + "numbers_spm.weights.safetensors";
  const std::string src = kNumbers + "numbers.src.spm.model",
                    tgt = kNumbers + "numbers.tgt.spm.model";
  auto run = [&](const std::string& s, const std::string& t, const std::string& in) {
    return testing::run_argv({kRunner, "translate", "--compiled", spm_model(), "--weights", weights,
                              "--src-vocab", s, "--tgt-vocab", t},
                             {.input = in});
  };
  const testing::CliResult r = run(src, tgt, input);
  ASSERT_EQ(r.status, 0) << r.output.substr(0, 2000);
  const std::vector<std::string> lines = split_lines(r.output);
  ASSERT_EQ(lines.size(), sources.size());
  int correct = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    ASSERT_EQ(lines[i].substr(0, sources[i].size() + 4), sources[i] + " -> ") << lines[i];
    const std::string got = lines[i].substr(sources[i].size() + 4);
    if (got == references[i])
      ++correct;
    else
      std::printf("[ spm ] wrong: %s -> %s (want %s)\n", sources[i].c_str(), got.c_str(),
                  references[i].c_str());
  }
  std::printf("[ spm ] held-out exact match through kiln translate: %d/%zu (%.1f%%)\n", correct,
              sources.size(), 100.0 * correct / static_cast<double>(sources.size()));
  EXPECT_GE(correct, 495);

  const testing::CliResult chars = run(kNumbers + "vocab.src.txt", tgt, "one\n");
  EXPECT_EQ(chars.status, 1);
  EXPECT_THAT(chars.output, HasSubstr("has 24 tokens, the model's src_vocab is 64"));
}

TEST_F(TranslateTest, VocabulariesThatDoNotFitTheModelAreRefused) {
  const std::string src = kNumbers + "vocab.src.txt", tgt = kNumbers + "vocab.tgt.txt";
  const std::vector<std::string> words = {"two thousand and five"};
  // Swapped.
  testing::CliResult r = text(tgt, src, words);
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output, "kiln: error: translate: the vocabularies are swapped: --src-vocab '" + tgt +
                          "' has 13 tokens and --tgt-vocab '" + src +
                          "' has 24, the model's src_vocab is 24 and its tgt_vocab 13\n");
  std::mt19937 rng(2025);
  for (int trial = 0; trial < 16; ++trial) {
    const bool source = trial % 2 == 0;
    std::vector<std::string> lines = source ? src_ : tgt_;
    const std::string role = source ? "source" : "target";
    std::string want;
    if (trial % 4 < 2) {  // a permutation that moves a special token
      do {
        std::shuffle(lines.begin(), lines.end(), rng);
      } while (misplaced(role, "", lines).empty());
      want = misplaced(role, path("v.txt"), lines);
    } else {  // a token more or less
      const size_t size = lines.size();
      if (trial % 8 < 4) {
        lines.erase(lines.begin() + std::uniform_int_distribution<size_t>(3, size - 1)(rng));
      } else {
        const size_t at = std::uniform_int_distribution<size_t>(0, size)(rng);
        lines.insert(lines.begin() + at, trial % 3 ? "Q" : "\xC3\xA9");
      }
      want = fmt::format(
          "kiln: error: translate: {} vocabulary '{}' has {} tokens, the model's {} "
          "is {}\n",
          role, path("v.txt"), lines.size(), source ? "src_vocab" : "tgt_vocab", size);
    }
    const std::string v = write("v.txt", lines);
    r = source ? text(v, tgt, words) : text(src, v, words);
    EXPECT_EQ(r.status, 1) << trial;
    EXPECT_EQ(r.output, want) << trial;
  }
}

TEST_F(TranslateTest, NonFiniteLogitsAreAnErrorNamingTheSentenceAndStep) {
  const std::string src = kNumbers + "vocab.src.txt", tgt = kNumbers + "vocab.tgt.txt";
  const std::vector<std::string> examples = read_lines(kNumbers + "examples.txt");
  const float kNan = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  std::mt19937 rng(31);
  // A NaN or +inf in the generator's bias: token v's logit, every row, the first step. The
  // seven sentences are one batch, sorted by length: the error names its first row, the
  // shortest sentence (the first of the shortest).
  size_t shortest = 0;
  for (size_t i = 0; i < examples.size(); ++i)
    if (examples[i].size() < examples[shortest].size()) shortest = i;
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t v = std::uniform_int_distribution<int64_t>(0, 12)(rng);
    const float value = trial % 2 ? kInf : kNan;
    const std::string w =
        weights_with("generator.bias", [&](std::vector<float>& b) { b[v] = value; });
    const std::string beam = trial % 3 == 0 ? "2" : "1";
    const testing::CliResult r = text(src, tgt, {"--beam", beam, "--max-batch-tokens", "1000"},
                                      {.input_path = kNumbers + "examples.txt"}, w);
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.output, fmt::format("kiln: error: translate: sentence {} {}: non-finite logit at "
                                    "step 0 of batch row 0: token {} has logit {} (the model's "
                                    "weights or its input hold NaN or infinity)\n",
                                    shortest + 1, quote(examples[shortest]), v, value));
  }
  // NaN in the source embedding of 'x' ("six"), in one sentence of 40 (two batches or more):
  // that sentence, named by its place in the input (and its row in the batch it ran in).
  std::vector<std::string> plain, with_x;
  for (const std::string& line : read_lines(kNumbers + "heldout.tsv")) {
    const std::string s = line.substr(0, line.find('\t'));
    (s.find('x') == std::string::npos ? plain : with_x).push_back(s);
  }
  ASSERT_GE(plain.size(), 40u);
  ASSERT_FALSE(with_x.empty());
  const int64_t x = std::find(src_.begin(), src_.end(), "x") - src_.begin();
  const std::string w = weights_with("src_embed.weight", [&](std::vector<float>& e) {
    for (int d = 0; d < 64; ++d) e[x * 64 + d] = kNan;
  });
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<std::string> batch(plain.begin() + trial, plain.begin() + trial + 40);
    const size_t k = std::uniform_int_distribution<size_t>(0, 39)(rng);
    batch[k] = with_x[static_cast<size_t>(trial) % with_x.size()];
    std::string input;
    for (const std::string& s : batch) input += s + "\n";
    const testing::CliResult r = text(src, tgt, {}, {.input = input}, w);
    EXPECT_EQ(r.status, 1);
    const std::string head = fmt::format(
        "kiln: error: translate: sentence {} {}: non-finite logit at step 0 of batch row ", k + 1,
        quote(batch[k]));
    const std::string tail =
        ": token 0 has logit nan (the model's weights or its input hold NaN or infinity)\n";
    ASSERT_GT(r.output.size(), head.size() + tail.size()) << r.output;
    EXPECT_EQ(r.output.substr(0, head.size()), head);
    EXPECT_EQ(r.output.substr(r.output.size() - tail.size()), tail);
    const std::string row =
        r.output.substr(head.size(), r.output.size() - head.size() - tail.size());
    EXPECT_TRUE(!row.empty() && row.size() <= 2 && std::all_of(row.begin(), row.end(), [](char c) {
      return c >= '0' && c <= '9';
    })) << r.output;
  }
  // Source ids (--inputs) instead of text: the row of 'src' that holds the token, over two
  // chunks.
  for (int trial = 0; trial < 4; ++trial) {
    const int64_t batch = std::uniform_int_distribution<int64_t>(1, 40)(rng);
    const int64_t k = std::uniform_int_distribution<int64_t>(0, batch - 1)(rng);
    std::vector<int64_t> ids(static_cast<size_t>(batch * 3));
    for (int64_t& id : ids) {
      id = std::uniform_int_distribution<int64_t>(3, 22)(rng);
      if (id == x) id = 23;
    }
    ids[k * 3 + std::uniform_int_distribution<int64_t>(0, 2)(rng)] = x;
    rt::write_safetensors(path("in.safetensors"), {rt::make_i64("src", {batch, 3}, ids)});
    const testing::CliResult r = translate({"--inputs", path("in.safetensors")}, {}, w);
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.output, fmt::format("kiln: error: translate: row {} of 'src': non-finite logit at "
                                    "step 0 of batch row {}: token 0 has logit nan (the model's "
                                    "weights or its input hold NaN or infinity)\n",
                                    k, k % 32));
  }
  // NaN in the target embedding of a digit: the first step that feeds it, and the first
  // sentence that does at that step.
  const testing::CliResult clean = text(src, tgt, {}, {.input_path = kNumbers + "examples.txt"});
  ASSERT_EQ(clean.status, 0) << clean.output;
  std::vector<std::string> outputs;
  for (const std::string& line : read_lines(kNumbers + "examples.txt")) {
    const size_t at = clean.output.find(line + " -> ");
    ASSERT_NE(at, std::string::npos);
    const size_t begin = at + line.size() + 4;
    outputs.push_back(clean.output.substr(begin, clean.output.find('\n', begin) - begin));
  }
  // The seven sentences run as one batch sorted by length (stable): row r holds sentence
  // order[r].
  std::vector<size_t> order(examples.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return examples[a].size() < examples[b].size(); });
  for (char digit : std::string("0123456789")) {
    size_t step = std::string::npos, row = 0;
    for (size_t r = 0; r < order.size(); ++r) {
      const size_t j = outputs[order[r]].find(digit);
      if (j != std::string::npos && j + 1 < step) step = j + 1, row = r;
    }
    if (step == std::string::npos) continue;
    const int64_t id = std::find(tgt_.begin(), tgt_.end(), std::string(1, digit)) - tgt_.begin();
    const std::string wd = weights_with("tgt_embed.weight", [&](std::vector<float>& e) {
      for (int d = 0; d < 64; ++d) e[id * 64 + d] = kNan;
    });
    const testing::CliResult r = text(src, tgt, {"--max-batch-tokens", "1000"},
                                      {.input_path = kNumbers + "examples.txt"}, wd);
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.output,
              fmt::format("kiln: error: translate: sentence {} {}: non-finite logit at step {} of "
                          "batch row {}: token 0 has logit nan (the model's weights or its input "
                          "hold NaN or infinity)\n",
                          order[row] + 1, quote(examples[order[row]]), step, row))
        << digit;
  }
}

TEST_F(TranslateTest, EndlessAndHugeInputIsRefusedAfterBoundedReads) {
  const std::string src = kNumbers + "vocab.src.txt", tgt = kNumbers + "vocab.tgt.txt";
  const std::string zeros40 = [] {
    std::string s;
    for (int i = 0; i < 40; ++i) s += "\\x00";
    return s;
  }();
  testing::CliResult r = text(src, tgt, {}, {.input_path = "/dev/zero"});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output,
            "kiln: error: translate: standard input: line 1 is longer than 1048576 bytes (the "
            "limit for a sentence): '" +
                zeros40 + "...'\n");
  r = text("/dev/zero", tgt, {"one"});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output,
            "kiln: error: translate: /dev/zero:1: line is longer than 4096 bytes (the limit for a "
            "token): '" +
                zeros40 + "...'\n");
  // `yes one |`: more lines than one run takes.
  std::string many;
  for (int i = 0; i <= 100000; ++i) many += "one\n";
  r = text(src, tgt, {}, {.input = many});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output,
            "kiln: error: translate: standard input has more than 100000 lines (the limit for one "
            "run; split it)\n");
  // A bad sentence stops the reading: `yes $'\xff' |` is refused at its first line.
  std::string bad;
  for (int i = 0; i <= 100000; ++i) bad += "\xff\n";
  r = text(src, tgt, {}, {.input = bad});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output, "kiln: error: translate: sentence 1: '\\xFF' is not valid UTF-8 (byte 0)\n");
  std::mt19937 rng(77);
  for (int trial = 0; trial < 6; ++trial) {
    // A line above 1 MiB among good ones.
    std::vector<std::string> lines(std::uniform_int_distribution<size_t>(0, 5)(rng), "ten");
    const size_t at = lines.size();
    const size_t length = std::uniform_int_distribution<size_t>((1 << 20) + 1, 3 << 20)(rng);
    lines.push_back(std::string(length, 'e'));
    lines.push_back("one");
    std::string input;
    for (const std::string& l : lines) input += l + "\n";
    r = text(src, tgt, {}, {.input = input});
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.output, fmt::format("kiln: error: translate: standard input: line {} is longer "
                                    "than 1048576 bytes (the limit for a sentence): '{}...'\n",
                                    at + 1, std::string(40, 'e')));
    // A long sentence within the limit: above the model's max_len, quoted as prefix and length.
    const size_t chars = std::uniform_int_distribution<size_t>(81, 1 << 20)(rng);
    std::string sentence;
    while (sentence.size() < chars) sentence += "seven ";
    sentence.resize(chars);
    r = text(src, tgt, {}, {.input = "one\n" + sentence + "\n"});
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.output, fmt::format("kiln: error: translate: sentence 2 has {} characters, the "
                                    "model reads at most 80 (max_len): {}\n",
                                    chars, quote(sentence)));
    EXPECT_LT(r.output.size(), 200u);
    // A character outside the vocabulary at the end of a long TEXT argument.
    std::string arg(std::uniform_int_distribution<size_t>(100, 100000)(rng), 'o');
    arg += "Q";
    r = text(src, tgt, {arg});
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.output, fmt::format("kiln: error: translate: sentence 1: character 'Q' at column "
                                    "{} of {} is not in the vocabulary\n",
                                    arg.size(), quote(arg)));
    EXPECT_LT(r.output.size(), 200u);
  }
}

TEST_F(TranslateTest, TextAndTokensThatAreNotUtf8AreRefused) {
  const std::string src = kNumbers + "vocab.src.txt", tgt = kNumbers + "vocab.tgt.txt";
  const std::vector<std::string> examples = read_lines(kNumbers + "examples.txt");
  std::mt19937 rng(101);
  for (int trial = 0; trial < 10; ++trial) {
    // A byte that breaks UTF-8, anywhere in one sentence of several.
    std::vector<std::string> lines = examples;
    const size_t k = std::uniform_int_distribution<size_t>(0, lines.size() - 1)(rng);
    const size_t at = std::uniform_int_distribution<size_t>(0, lines[k].size())(rng);
    const char bad = static_cast<char>(std::uniform_int_distribution<int>(0x80, 0xFF)(rng));
    lines[k].insert(at, 1, bad);
    std::string input;
    for (const std::string& l : lines) input += l + "\n";
    testing::CliResult r = text(src, tgt, {}, {.input = input});
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.output, fmt::format("kiln: error: translate: sentence {}: {} is not valid UTF-8 "
                                    "(byte {})\n",
                                    k + 1, quote(lines[k]), at));
    // A vocabulary token that is not UTF-8, at a random line.
    std::vector<std::string> vocab = src_;
    const size_t line = std::uniform_int_distribution<size_t>(3, vocab.size() - 1)(rng);
    vocab[line] = std::string(1, bad);
    const std::string v = write("v.txt", vocab);
    r = text(v, tgt, {"one"});
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.output, fmt::format("kiln: error: translate: {}:{}: token {} is not valid UTF-8 "
                                    "(byte 0)\n",
                                    v, line + 1, quote(vocab[line])));
  }
}

// Only -1 means "the model's bos_id / eos_id": the CLI refuses every other negative id; and
// every refused value is quoted short.
TEST_F(TranslateTest, OptionValuesAreCheckedAndQuotedShort) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 6; ++trial) {
    const int64_t id = trial == 0   ? std::numeric_limits<int64_t>::min()
                       : trial == 1 ? -2
                                    : -static_cast<int64_t>(rng() % 1000000) - 2;
    const std::string option = trial % 2 ? "--end-id" : "--start-id";
    const testing::CliResult r =
        translate({"--inputs", "x.safetensors", option, std::to_string(id)});
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.output, fmt::format("kiln: error: translate: {} must be a whole number in [-1, "
                                    "9223372036854775807], got '{}'\n",
                                    option, id));
  }
  // A huge option value or argument is quoted as a prefix and its length.
  for (size_t length : {49, 1000, 100000}) {
    const std::string value(length, '7');
    testing::CliResult r = translate({"--inputs", "x.safetensors", "--beam", value + "x"});
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.output, fmt::format("kiln: error: translate: --beam must be a whole number in [0, "
                                    "2147483647], got {}\n",
                                    quote(value + "x")));
    r = translate({"--inputs", "x.safetensors", "--" + value});
    EXPECT_EQ(r.output,
              fmt::format("kiln: error: translate: unknown option {} (see 'kiln translate "
                          "--help')\n",
                          quote("--" + value)));
    EXPECT_LT(r.output.size(), 200u);
  }
}

// The batcher's options: a budget below 1, no worker or more workers than kernel threads
// are errors naming the option.
TEST_F(TranslateTest, BatchOptionsAreChecked) {
  for (const std::string& v : {"0", "-3", "2x", ""}) {
    const testing::CliResult r = translate({"--inputs", "x.safetensors", "--max-batch-tokens", v});
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.output, fmt::format("kiln: error: translate: --max-batch-tokens must be a whole "
                                    "number in [1, 9223372036854775807], got '{}'\n",
                                    v));
  }
  for (const std::string& v : {"0", "-1", "1025"}) {
    const testing::CliResult r = translate({"--inputs", "x.safetensors", "--inter-threads", v});
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.output, fmt::format("kiln: error: translate: --inter-threads must be a whole "
                                    "number in [1, 1024], got '{}'\n",
                                    v));
  }
  const testing::CliResult r =
      translate({"--inputs", "x.safetensors", "--threads", "2", "--inter-threads", "3"});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output,
            "kiln: error: translate: --inter-threads 3 is more than the 2 kernel threads "
            "(--threads), which the workers share: give at most 2\n");
}

// A file of a few hundred sentences of mixed lengths (the held-out set, whose references the
// model translates exactly) translated in batches grouped by length, small token budgets and
// two workers included, prints what translating each sentence alone prints, line for line
// and in the input's order: the same translations, and with beam search the same hypotheses
// and scores.
TEST_F(TranslateTest, BatchesGiveTheSameTranslationsInTheInputOrder) {
  const std::string src = kNumbers + "vocab.src.txt", tgt = kNumbers + "vocab.tgt.txt";
  std::vector<std::string> sources, expected;
  for (const std::string& line : read_lines(kNumbers + "heldout.tsv")) {
    const size_t tab = line.find('\t');
    sources.push_back(line.substr(0, tab));
    expected.push_back(line.substr(0, tab) + " -> " + line.substr(tab + 1));
  }
  // 300 of them, short ones (tens, hundreds) among the long ones.
  sources.resize(280);
  expected.resize(280);
  const std::vector<std::pair<int, std::string>> short_ones = {
      {5, "five"},
      {12, "twelve"},
      {40, "forty"},
      {99, "ninety-nine"},
      {100, "one hundred"},
      {101, "one hundred and one"},
      {310, "three hundred and ten"},
      {999, "nine hundred and ninety-nine"},
      {7, "seven"},
      {70, "seventy"},
      {17, "seventeen"},
      {700, "seven hundred"},
      {1000, "one thousand"},
      {2000, "two thousand"},
      {19, "nineteen"},
      {90, "ninety"},
      {9, "nine"},
      {13, "thirteen"},
      {600, "six hundred"},
      {15, "fifteen"}};
  for (const auto& [n, w] : short_ones) {
    const size_t at = static_cast<size_t>(n * 7919) % sources.size();
    sources.insert(sources.begin() + static_cast<std::ptrdiff_t>(at), w);
    expected.insert(expected.begin() + static_cast<std::ptrdiff_t>(at),
                    w + " -> " + std::to_string(n));
  }
  ASSERT_EQ(sources.size(), 300u);
  const std::string input = write("sources.txt", sources);
  auto run = [&](std::vector<std::string> extra) {
    const testing::CliResult r = text(src, tgt, extra, {.input_path = input});
    EXPECT_EQ(r.status, 0) << r.output;
    return r.output;
  };
  // Each sentence alone (a budget of 1 token): the reference.
  const std::string alone = run({"--max-batch-tokens", "1", "--inter-threads", "1"});
  std::string want;
  for (const std::string& e : expected) want += e + "\n";
  EXPECT_EQ(alone, want);
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--max-batch-tokens", "60", "--inter-threads", "2"},
        std::vector<std::string>{"--max-batch-tokens", "200", "--inter-threads", "2"},
        std::vector<std::string>{"--max-batch-tokens", "100000", "--inter-threads", "1"},
        std::vector<std::string>{"--max-batch-tokens", "100000", "--inter-threads", "2",
                                 "--threads", "2"},
        std::vector<std::string>{}}) {
    const std::string got = run(extra);
    const std::vector<std::string> got_lines = split_lines(got);
    const std::vector<std::string> alone_lines = split_lines(alone);
    ASSERT_EQ(got_lines.size(), alone_lines.size()) << fmt::format("{}", fmt::join(extra, " "));
    for (size_t i = 0; i < got_lines.size(); ++i)
      EXPECT_EQ(got_lines[i], alone_lines[i])
          << "line " << i + 1 << " with " << fmt::format("{}", fmt::join(extra, " "));
  }
  // Beam search, two hypotheses each, with scores: the same hypotheses; the scores the same
  // up to float rounding (a sentence padded to another length sums its attention in another
  // order: printed with 4 decimals, the last may differ by one).
  const std::vector<std::string> beam = {"--beam", "3", "--num-hypotheses", "2", "--scores"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), beam.begin(), beam.end());
    return extra;
  };
  const std::vector<std::string> beam_alone =
      split_lines(run(with({"--max-batch-tokens", "1", "--inter-threads", "1"})));
  ASSERT_EQ(beam_alone.size(), 600u);
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--max-batch-tokens", "150", "--inter-threads", "2"},
        std::vector<std::string>{}}) {
    const std::vector<std::string> got = split_lines(run(with(extra)));
    ASSERT_EQ(got.size(), beam_alone.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const size_t a = got[i].rfind("  (score "), b = beam_alone[i].rfind("  (score ");
      ASSERT_NE(a, std::string::npos) << got[i];
      ASSERT_NE(b, std::string::npos) << beam_alone[i];
      EXPECT_EQ(got[i].substr(0, a), beam_alone[i].substr(0, b)) << "line " << i + 1;
      EXPECT_NEAR(std::stod(got[i].substr(a + 9)), std::stod(beam_alone[i].substr(b + 9)), 1.5e-4)
          << "line " << i + 1;
    }
  }
}

// Source ids (--inputs, padded with the model's pad_id) in batches: the same ids, lengths and
// scores (-o) as each row alone, in the rows' order.
TEST_F(TranslateTest, BatchesOfSourceIdsGiveTheSameIds) {
  const kiln::Vocabulary vocab = kiln::Vocabulary::load(kNumbers + "vocab.src.txt");
  std::vector<std::vector<int64_t>> rows;
  for (const std::string& line : read_lines(kNumbers + "heldout.tsv"))
    if (rows.size() < 90) rows.push_back(vocab.encode(line.substr(0, line.find('\t'))));
  rows.push_back(vocab.encode("six"));
  rows.push_back(vocab.encode("forty-one"));
  size_t width = 0;
  for (const auto& r : rows) width = std::max(width, r.size());
  std::vector<int64_t> ids(rows.size() * width, 0);  // pad_id 0
  for (size_t i = 0; i < rows.size(); ++i)
    std::copy(rows[i].begin(), rows[i].end(), ids.begin() + static_cast<std::ptrdiff_t>(i * width));
  rt::write_safetensors(
      path("in.safetensors"),
      {rt::make_i64("src", {static_cast<int64_t>(rows.size()), static_cast<int64_t>(width)}, ids)});
  auto run = [&](const std::string& out, std::vector<std::string> extra) {
    std::vector<std::string> args = {"--inputs", path("in.safetensors"), "-o", path(out)};
    args.insert(args.end(), extra.begin(), extra.end());
    const testing::CliResult r = translate(args);
    EXPECT_EQ(r.status, 0) << r.output;
    return rt::SafeTensors::load(path(out));
  };
  const rt::SafeTensors alone = run("alone.safetensors", {"--max-batch-tokens", "1"});
  const rt::SafeTensors batched =
      run("batched.safetensors", {"--max-batch-tokens", "300", "--inter-threads", "2"});
  for (const char* name : {"ids", "lengths"}) {
    EXPECT_EQ(batched.at(name).shape, alone.at(name).shape) << name;
    EXPECT_EQ(batched.to_i64(batched.at(name)), alone.to_i64(alone.at(name))) << name;
  }
  // Scores up to float rounding (measured: 1e-6 relative).
  const std::vector<float> got = batched.to_f32(batched.at("scores")),
                           want = alone.to_f32(alone.at("scores"));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-5 * std::max(1.0f, std::abs(want[i]))) << "row " << i;
  EXPECT_EQ(alone.at("ids").shape[0], static_cast<int64_t>(rows.size()));
  // Row 90 ("six") generated "6" and its end token.
  EXPECT_EQ(alone.to_i64(alone.at("lengths"))[90], 1);
}

// kiln translate --vocab-map (vocabulary restriction): each batch chooses among the
// candidates of its own sources. The output is kiln_generate's, called through the library's
// C ABI with the candidates this test finds itself (the map's n-grams in the sentences, the
// always line), for the text map (characters) and the same map in ids (--inputs); and it
// differs from the unrestricted translation, which needs a digit the map does not allow.
TEST_F(TranslateTest, VocabularyMapRestrictsEachBatchAsTheCApiDoes) {
  const kiln::Vocabulary src_vocab = kiln::Vocabulary::load(kNumbers + "vocab.src.txt");
  const kiln::Vocabulary tgt_vocab = kiln::Vocabulary::load(kNumbers + "vocab.tgt.txt");
  const std::vector<std::string> sentences = {"three hundred and twelve",
                                              "forty thousand and seventeen", "six"};
  // SOURCE (characters, an n-gram as a string) -> target digits; "" is the always line.
  const std::vector<std::pair<std::string, std::string>> entries = {
      {"th", "3"}, {"s", "6 7"}, {"fo", "4 5"}, {"", "0 1"}, {"z", "9"}, {"nd", "8"}};
  auto spaced = [](const std::string& chars) {
    std::string out;
    for (char c : chars) out += out.empty() ? std::string(1, c) : std::string(" ") + c;
    return out;
  };
  std::vector<std::string> text_lines, id_lines;
  for (const auto& [source, targets] : entries) {
    text_lines.push_back(spaced(source) + "\t" + targets);
    std::string ids, tids;
    for (char c : source)
      ids += (ids.empty() ? "" : " ") + std::to_string(src_vocab.id(std::string(1, c)));
    for (char c : targets)
      if (c != ' ')
        tids += (tids.empty() ? "" : " ") + std::to_string(tgt_vocab.id(std::string(1, c)));
    id_lines.push_back(ids + "\t" + tids);
  }
  const std::string text_map = write("text.vmap", text_lines);
  const std::string id_map = write("ids.vmap", id_lines);
  // The allowed target ids of a batch of sentences, found here.
  auto candidates = [&](const std::vector<std::string>& batch) {
    std::set<int64_t> out;
    for (const auto& [source, targets] : entries) {
      bool found = source.empty();
      for (const std::string& s : batch) found = found || s.find(source) != std::string::npos;
      if (found)
        for (char c : targets)
          if (c != ' ') out.insert(tgt_vocab.id(std::string(1, c)));
    }
    return std::vector<int64_t>(out.begin(), out.end());
  };
  // kiln_generate through the library's C ABI on `batch`, restricted to `allowed` (empty:
  // unrestricted): each sentence's ids.
  const rt::Library lib = rt::open_library(kModel, "test");
  char* error = nullptr;
  kiln_model* model = lib.api.create((kNumbers + "numbers.weights.safetensors").c_str(), &error);
  ASSERT_NE(model, nullptr) << (error ? error : "");
  auto generate = [&](const std::vector<std::string>& batch, const std::vector<int64_t>& allowed) {
    size_t width = 0;
    std::vector<std::vector<int64_t>> rows;
    for (const std::string& s : batch) {
      rows.push_back(src_vocab.encode(s));
      width = std::max(width, rows.back().size());
    }
    std::vector<int64_t> ids(rows.size() * width, 0);  // pad_id 0
    for (size_t i = 0; i < rows.size(); ++i)
      std::copy(rows[i].begin(), rows[i].end(),
                ids.begin() + static_cast<std::ptrdiff_t>(i * width));
    kiln_search_options o;
    lib.api.search_options_init(&o);
    o.vocabulary = allowed.empty() ? nullptr : allowed.data();
    o.num_vocabulary = static_cast<int32_t>(allowed.size());
    const kiln_tensor in = rt::generation_src(ids.data(), static_cast<int64_t>(rows.size()),
                                              static_cast<int64_t>(width));
    kiln_generation g;
    EXPECT_EQ(lib.api.generate(model, &in, &o, &g), 0) << lib.api.error(model);
    std::vector<std::vector<int64_t>> out;
    for (int64_t b = 0; b < g.batch; ++b)
      out.emplace_back(g.ids + b * g.max_length, g.ids + b * g.max_length + g.lengths[b]);
    lib.api.generation_free(&g);
    return out;
  };
  // What translate -o gave: each sentence's ids.
  auto translated = [&](const rt::SafeTensors& f) {
    const std::vector<int64_t> ids = f.to_i64(f.at("ids")), lengths = f.to_i64(f.at("lengths"));
    const int64_t max_length = f.at("ids").shape[2];
    std::vector<std::vector<int64_t>> out;
    for (size_t b = 0; b < lengths.size(); ++b)
      out.emplace_back(ids.begin() + static_cast<std::ptrdiff_t>(b * max_length),
                       ids.begin() + static_cast<std::ptrdiff_t>(b * max_length + lengths[b]));
    return out;
  };
  const std::vector<int64_t> together = candidates(sentences);
  EXPECT_EQ(together.size(), 8u);  // 0 1 3 4 5 6 7 8: not 2 (nor 9: no z)
  const auto want = generate(sentences, together);
  EXPECT_NE(want, generate(sentences, {})) << "the map changed nothing";
  for (const auto& ids : want)
    for (int64_t id : ids) EXPECT_TRUE(std::count(together.begin(), together.end(), id)) << id;
  // Each sentence alone (a budget of 1 token): its own candidates.
  std::vector<std::vector<int64_t>> want_alone;
  for (const std::string& s : sentences) want_alone.push_back(generate({s}, candidates({s}))[0]);
  lib.api.destroy(model);

  const std::string src = kNumbers + "vocab.src.txt", tgt = kNumbers + "vocab.tgt.txt";
  for (const std::vector<std::string>& budget :
       {std::vector<std::string>{}, std::vector<std::string>{"--inter-threads", "2"}}) {
    std::vector<std::string> args = {"--vocab-map", text_map, "-o", path("text.safetensors")};
    args.insert(args.end(), sentences.begin(), sentences.end());
    args.insert(args.end(), budget.begin(), budget.end());
    testing::CliResult r = text(src, tgt, args);
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(translated(rt::SafeTensors::load(path("text.safetensors"))), want);
  }
  {
    std::vector<std::string> args = {
        "--vocab-map", text_map, "-o", path("alone.safetensors"), "--max-batch-tokens", "1"};
    args.insert(args.end(), sentences.begin(), sentences.end());
    testing::CliResult r = text(src, tgt, args);
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(translated(rt::SafeTensors::load(path("alone.safetensors"))), want_alone);
  }
  // Source ids (--inputs) with the map in ids.
  {
    size_t width = 0;
    std::vector<std::vector<int64_t>> rows;
    for (const std::string& s : sentences) {
      rows.push_back(src_vocab.encode(s));
      width = std::max(width, rows.back().size());
    }
    std::vector<int64_t> ids(rows.size() * width, 0);
    for (size_t i = 0; i < rows.size(); ++i)
      std::copy(rows[i].begin(), rows[i].end(),
                ids.begin() + static_cast<std::ptrdiff_t>(i * width));
    rt::write_safetensors(path("in.safetensors"),
                          {rt::make_i64("src", {3, static_cast<int64_t>(width)}, ids)});
    testing::CliResult r = translate(
        {"--inputs", path("in.safetensors"), "--vocab-map", id_map, "-o", path("ids.safetensors")});
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(translated(rt::SafeTensors::load(path("ids.safetensors"))), want);
    // A text map with ids input: its tokens are not ids.
    r = translate({"--inputs", path("in.safetensors"), "--vocab-map", text_map});
    EXPECT_EQ(r.status, 1);
    EXPECT_EQ(r.output, "kiln: error: translate: --vocab-map: " + text_map +
                            ":1: source token 't' is not an integer id (the map holds ids: the "
                            "input is ids)\n");
  }
  // A bad map: the file and line.
  const std::string bad = write("bad.vmap", {"t\t3", "q\t7"});
  testing::CliResult r = text(src, tgt, {"--vocab-map", bad, "six"});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.output, "kiln: error: translate: --vocab-map: " + bad +
                          ":2: source token 'q' is not in the source vocabulary\n");
}

}  // namespace
}  // namespace kiln
