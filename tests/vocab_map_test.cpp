// Vocabulary maps (runtime/vocab_map.h, CTranslate2's vmap format): tokens as strings and as
// ids, n-grams, the always-allowed line, the candidates of a batch (padding never inside an
// n-gram), and every refusal naming file:line and the problem.
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "error_of.h"
#include "runtime/vocab_map.h"

namespace kiln::rt {
namespace {

// A toy source and target vocabulary: token -> id.
const std::map<std::string, int64_t> kSource = {{"<pad>", 0}, {"the", 1}, {"cat", 2}, {"sat", 3},
                                                {"on", 4},    {"mat", 5}, {"new", 6}, {"york", 7}};
const std::map<std::string, int64_t> kTarget = {
    {"<pad>", 0}, {"</s>", 1},  {"le", 2},       {"la", 3},      {"chat", 4}, {"assis", 5},
    {"sur", 6},   {"tapis", 7}, {"new-york", 8}, {"nouveau", 9}, {"neuf", 10}};

VocabMap::Tokens strings() {
  auto lookup = [](const std::map<std::string, int64_t>& m) {
    return [&m](const std::string& t) -> int64_t {
      auto it = m.find(t);
      return it == m.end() ? -1 : it->second;
    };
  };
  return {lookup(kSource), lookup(kTarget), 8, 11};
}

VocabMap::Tokens ids(int64_t source_size = 8, int64_t target_size = 11) {
  return {{}, {}, source_size, target_size};
}

std::string error_of(const std::function<void()>& fn) { return testing::error_of(fn); }

TEST(VocabMap, StringTokensUnigramsNgramsAndAlwaysAllowed) {
  const VocabMap map = VocabMap::parse(
      "the\tle la\n"
      "cat\tchat\n"
      "new york\tnew-york\n"
      "new\tnouveau  neuf\n"
      "\t</s>\n"
      "\n"            // empty lines are skipped
      "cat\tle\r\n",  // a repeated source adds to its targets; CRLF
      "m.vmap", strings());
  EXPECT_EQ(map.size(), 4u);
  EXPECT_EQ(map.max_ngram(), 2);
  EXPECT_EQ(map.always(), (std::vector<int64_t>{1}));
  // "the cat <pad>": the, cat and the always line.
  EXPECT_EQ(map.candidates({1, 2, 0}, 1, 3, 0), (std::vector<int64_t>{1, 2, 3, 4}));
  // "new york": the bigram and the unigram new (york alone maps to nothing).
  EXPECT_EQ(map.candidates({6, 7}, 1, 2, 0), (std::vector<int64_t>{1, 8, 9, 10}));
  // york then new: no bigram "new york".
  EXPECT_EQ(map.candidates({7, 6}, 1, 2, 0), (std::vector<int64_t>{1, 9, 10}));
  // A batch: the union of its rows; "new" at a row's end and "york" at the next row's start
  // are no bigram, nor across padding.
  EXPECT_EQ(map.candidates({3, 6, 1, 0, 7, 0}, 2, 3, 0), (std::vector<int64_t>{1, 2, 3, 9, 10}));
  EXPECT_EQ(map.candidates({6, 0, 7, 3}, 1, 4, 0), (std::vector<int64_t>{1, 9, 10}));
  // Nothing of the map in the batch: the always-allowed tokens.
  EXPECT_EQ(map.candidates({3, 4, 5}, 1, 3, 0), (std::vector<int64_t>{1}));
}

TEST(VocabMap, IdTokensAndFiles) {
  const std::string path = ::testing::TempDir() + "vocab_map_ids.vmap";
  {
    std::ofstream out(path, std::ios::binary);
    out << "1\t2 3\n2 3\t5\n1 2 3\t6 7\n5\t10\n";
  }
  const VocabMap map = VocabMap::load(path, ids());
  EXPECT_EQ(map.max_ngram(), 3);
  EXPECT_TRUE(map.always().empty());
  EXPECT_EQ(map.candidates({1, 2, 3}, 1, 3, -1), (std::vector<int64_t>{2, 3, 5, 6, 7}));
  EXPECT_EQ(map.candidates({4, 4}, 1, 2, -1), (std::vector<int64_t>{}));
  // pad_id -1: no padding; a pad id that is a token of the map stops n-grams there.
  EXPECT_EQ(map.candidates({1, 2, 3}, 1, 3, 2), (std::vector<int64_t>{2, 3}));
  std::filesystem::remove(path);
}

TEST(VocabMap, BadFilesNameTheFileAndLine) {
  auto bad = [](const std::string& text, const VocabMap::Tokens& tokens) {
    return error_of([&] { VocabMap::parse(text, "f.vmap", tokens); });
  };
  EXPECT_EQ(bad("the\tle\ncat chat\n", strings()),
            "f.vmap:2: no tab: a line is SOURCE<TAB>TARGETS (an empty SOURCE: always allowed)");
  EXPECT_EQ(bad("the\tle\ndog\tchat\n", strings()),
            "f.vmap:2: source token 'dog' is not in the source vocabulary");
  EXPECT_EQ(bad("\n\nthe\tle chien\n", strings()),
            "f.vmap:3: target token 'chien' is not in the target vocabulary");
  EXPECT_EQ(bad("1\t2\n3\t11\n", ids()), "f.vmap:2: target id 11 is out of range [0, 11)");
  EXPECT_EQ(bad("8\t2\n", ids()), "f.vmap:1: source id 8 is out of range [0, 8)");
  EXPECT_EQ(bad("1\t-2\n", ids()), "f.vmap:1: target id -2 is out of range [0, 11)");
  EXPECT_EQ(bad("1\t2x\n", ids()),
            "f.vmap:1: target token '2x' is not an integer id (the map holds ids: the input is "
            "ids)");
  EXPECT_EQ(bad("the\tle\n", ids()),
            "f.vmap:1: source token 'the' is not an integer id (the map holds ids: the input is "
            "ids)");
  EXPECT_EQ(bad("", ids()), "vocabulary map 'f.vmap' has no entries (lines SOURCE<TAB>TARGETS)");
  EXPECT_EQ(bad("\n\r\n", strings()),
            "vocabulary map 'f.vmap' has no entries (lines SOURCE<TAB>TARGETS)");
  const std::string missing = ::testing::TempDir() + "no_such.vmap";
  EXPECT_EQ(error_of([&] { VocabMap::load(missing, ids()); }),
            "vocabulary map '" + missing + "': cannot open it");
  // Without sizes, ids are not bounded above.
  EXPECT_EQ(VocabMap::parse("1\t99\n", "f.vmap", ids(-1, -1)).candidates({1}, 1, 1, 0),
            (std::vector<int64_t>{99}));
}

}  // namespace
}  // namespace kiln::rt
