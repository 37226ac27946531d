// kiln/vocab.h under hostile files and text (issue 25), over generated families of inputs
// (random permutations, lengths and byte values, fixed seeds): UTF-8 validation against an
// independent decoder, quoting (a prefix cut at a character boundary, and the length),
// bounded line reading, the limits of a vocabulary file (an endless /dev/zero included),
// tokens that are not UTF-8, and the check of a vocabulary against its model's ids.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kiln/vocab.h"

namespace kiln {
namespace {

using ::testing::HasSubstr;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception, nothing was thrown";
  return "";
}

// UTF-8 of a code point (no checks).
std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// The reference: the first offset where no code point's shortest encoding (surrogates and
// values above U+10FFFF excluded) matches the bytes.
size_t reference_invalid_at(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    bool matched = false;
    for (size_t n = 1; n <= 4 && i + n <= s.size() && !matched; ++n) {
      // decode n bytes generically, then require that re-encoding gives them back
      const unsigned char c = static_cast<unsigned char>(s[i]);
      uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
      for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
      if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) continue;
      if (utf8(cp) == s.substr(i, n)) {
        matched = true;
        i += n;
      }
    }
    if (!matched) return i;
  }
  return std::string::npos;
}

// A random string mixing valid characters of every length with bytes that break UTF-8.
std::string random_text(std::mt19937& rng, size_t chars, int bad_percent) {
  std::string s;
  std::uniform_int_distribution<int> pct(0, 99);
  for (size_t i = 0; i < chars; ++i) {
    if (pct(rng) < bad_percent) {
      static const std::vector<std::string> breakers = {"\x80",
                                                        "\xBF",
                                                        "\xC0\xAF",
                                                        "\xC1\xBF",
                                                        "\xF5\x80\x80\x80",
                                                        "\xFF",
                                                        "\xE2\x82",
                                                        "\xF0\x9F\x98",
                                                        "\xED\xA0\x80",
                                                        "\xE0\x80\x80",
                                                        "\xF4\x90\x80\x80",
                                                        "\xF0\x80\x80\x80",
                                                        "\xC2",
                                                        "\xE2\x28\xA1",
                                                        "\xFE"};
      s += breakers[std::uniform_int_distribution<size_t>(0, breakers.size() - 1)(rng)];
      continue;
    }
    switch (pct(rng) % 4) {
      case 0:
        s += utf8(std::uniform_int_distribution<uint32_t>(0x20, 0x7E)(rng));
        break;
      case 1:
        s += utf8(std::uniform_int_distribution<uint32_t>(0x80, 0x7FF)(rng));
        break;
      case 2: {
        uint32_t cp = std::uniform_int_distribution<uint32_t>(0x800, 0xFFFF)(rng);
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0x2581;
        s += utf8(cp);
        break;
      }
      default:
        s += utf8(std::uniform_int_distribution<uint32_t>(0x10000, 0x10FFFF)(rng));
    }
  }
  return s;
}

TEST(Utf8, AgreesWithAReferenceDecoderOnRandomText) {
  std::mt19937 rng(25);
  int invalid = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const std::string s =
        random_text(rng, std::uniform_int_distribution<size_t>(0, 30)(rng), trial % 3 == 0 ? 0 : 5);
    const size_t want = reference_invalid_at(s);
    EXPECT_EQ(invalid_utf8_at(s), want) << quote(s);
    invalid += want != std::string::npos;
  }
  // Random bytes, every value.
  for (int trial = 0; trial < 3000; ++trial) {
    std::string s(std::uniform_int_distribution<size_t>(1, 8)(rng), '\0');
    for (char& c : s) c = static_cast<char>(std::uniform_int_distribution<int>(0, 255)(rng));
    EXPECT_EQ(invalid_utf8_at(s), reference_invalid_at(s)) << quote(s);
  }
  EXPECT_GT(invalid, 500);
  for (uint32_t cp = 0; cp <= 0x10FFFF; cp += (cp < 0x10000 ? 1 : 97)) {
    const std::string s = utf8(cp);
    EXPECT_EQ(invalid_utf8_at(s), cp >= 0xD800 && cp <= 0xDFFF ? 0 : std::string::npos) << cp;
  }
}

TEST(Quote, LongTextIsAPrefixCutAtACharacterAndItsLength) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t chars = trial < 200 ? std::uniform_int_distribution<size_t>(0, 60)(rng)
                                     : std::uniform_int_distribution<size_t>(1, 50000)(rng);
    const std::string s = random_text(rng, chars, trial % 4 == 0 ? 2 : 0);
    const std::string q = quote(s);
    ASSERT_GE(q.size(), 2u);
    EXPECT_EQ(q.front(), '\'');
    EXPECT_EQ(invalid_utf8_at(q), std::string::npos) << "quoting leaves valid UTF-8";
    for (char c : q) EXPECT_GE(static_cast<unsigned char>(c), 0x20);
    if (s.size() <= 48) {
      if (invalid_utf8_at(s) == std::string::npos && s.find('\\') == std::string::npos)
        EXPECT_EQ(q, "'" + s + "'");
      continue;
    }
    const std::string tail = "...' (" + std::to_string(s.size()) + " bytes)";
    ASSERT_TRUE(q.ends_with(tail)) << q;
    EXPECT_LE(q.size(), 4 * 40 + tail.size() + 1) << "a short prefix, whatever the length";
    if (invalid_utf8_at(s) == std::string::npos && s.find('\\') == std::string::npos) {
      const std::string prefix = q.substr(1, q.size() - 1 - tail.size());
      EXPECT_TRUE(s.starts_with(prefix));
      EXPECT_LE(prefix.size(), 40u);
      EXPECT_GT(prefix.size(), 36u) << "cut at most one character short";
    }
  }
  EXPECT_EQ(quote(std::string("a\0b\n\xFF", 5)), "'a\\x00b\\x0A\\xFF'");
}

TEST(ReadLine, StopsAtTheLimitWhateverTheLineLength) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t limit = std::uniform_int_distribution<size_t>(1, 3000)(rng);
    std::vector<std::string> lines(std::uniform_int_distribution<size_t>(1, 6)(rng));
    std::string all;
    for (std::string& l : lines) {
      l = std::string(std::uniform_int_distribution<size_t>(0, 2 * limit)(rng), 'x');
      for (char& c : l) c = static_cast<char>(std::uniform_int_distribution<int>(0x20, 0x7E)(rng));
      all += l + (std::uniform_int_distribution<int>(0, 1)(rng) ? "\r\n" : "\n");
    }
    std::istringstream in(all);
    std::string got;
    for (const std::string& l : lines) {
      const int status = read_line(in, got, limit);
      if (l.size() > limit) {
        EXPECT_EQ(status, -1);
        EXPECT_EQ(got, l.substr(0, limit + 1)) << "the first bytes, for the message";
        break;
      }
      ASSERT_EQ(status, 1);
      EXPECT_EQ(got, l);
    }
  }
  std::ifstream zero("/dev/zero", std::ios::binary);
  std::string got;
  EXPECT_EQ(read_line(zero, got, kMaxTokenBytes), -1);
  EXPECT_EQ(got.size(), kMaxTokenBytes + 1);
}

class VocabFile : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = ::testing::TempDir() + "kiln_vocab_" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  // <pad> <s> </s> then `n` distinct one-character tokens, shuffled by `rng` when given.
  static std::vector<std::string> tokens(size_t n) {
    std::vector<std::string> t = {"<pad>", "<s>", "</s>", "\xE2\x96\x81"};
    for (uint32_t cp = 'a'; t.size() < n + 3; ++cp) t.push_back(utf8(cp == 0x2581 ? 0x2582 : cp));
    return t;
  }
  static std::string lines(const std::vector<std::string>& t) {
    std::string s;
    for (const std::string& x : t) s += x + "\n";
    return s;
  }
};

TEST_F(VocabFile, EndlessAndOversizedFilesAreRefusedWithFileAndLine) {
  EXPECT_EQ(error_of([] { Vocabulary::load("/dev/zero"); }),
            "/dev/zero:1: line is longer than 4096 bytes (the limit for a token): "
            "'\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00"
            "\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00"
            "\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00...'");
  std::mt19937 rng(3);
  for (int trial = 0; trial < 12; ++trial) {
    std::vector<std::string> t = tokens(30);
    const size_t at = std::uniform_int_distribution<size_t>(0, t.size())(rng);
    const size_t length =
        trial == 0 ? 20'000'000 : std::uniform_int_distribution<size_t>(4097, 300000)(rng);
    t.insert(t.begin() + at, std::string(length, 'q'));
    const std::string path = write("long", lines(t));
    const std::string e = error_of([&] { Vocabulary::load(path); });
    EXPECT_EQ(e, path + ":" + std::to_string(at + 1) +
                     ": line is longer than 4096 bytes (the limit for a token): "
                     "'qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq...'");
  }
  // Lines within the limit that are no token: quoted as a prefix and the length.
  for (int trial = 0; trial < 12; ++trial) {
    std::vector<std::string> t = tokens(20);
    const size_t at = std::uniform_int_distribution<size_t>(0, t.size())(rng);
    const size_t length = std::uniform_int_distribution<size_t>(49, 4096)(rng);
    t.insert(t.begin() + at, std::string(length, 'w'));
    const std::string path = write("word", lines(t));
    EXPECT_EQ(error_of([&] { Vocabulary::load(path); }),
              path + ":" + std::to_string(at + 1) +
                  ": token 'wwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwwww...' (" +
                  std::to_string(length) + " bytes) is neither one character nor <special>");
  }
  // More lines than kMaxVocabularyTokens, every one a different token.
  std::string many;
  for (int64_t i = 0; i <= kMaxVocabularyTokens; ++i) many += "<" + std::to_string(i) + ">\n";
  const std::string path = write("many", many);
  EXPECT_EQ(error_of([&] { Vocabulary::load(path); }),
            "vocabulary '" + path + "' has more than 1048576 tokens (the limit)");
  const std::string empty = write("empty", "");
  EXPECT_EQ(error_of([&] { Vocabulary::load(empty); }), "vocabulary '" + empty + "' is empty");
  EXPECT_EQ(error_of([&] { Vocabulary::load(::testing::TempDir()); }),
            "cannot read vocabulary '" + ::testing::TempDir() + "': Is a directory");
}

TEST_F(VocabFile, TokensThatAreNotUtf8AreRefusedWithTheirLine) {
  std::mt19937 rng(5);
  const std::vector<std::string> breakers = {"\x80",
                                             "\xC0\xAF",
                                             "\xFF",
                                             "\xE2\x82",
                                             "\xED\xA0\x80",
                                             "\xF4\x90\x80\x80",
                                             "\xF0\x80\x80\x80",
                                             "\xC2",
                                             "\xFE"};
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<std::string> t = tokens(25);
    std::shuffle(t.begin(), t.end(), rng);
    const std::string& bad = breakers[static_cast<size_t>(trial) % breakers.size()];
    const bool special = trial % 2 == 1;  // inside <...> or alone
    const std::string token = special ? "<x" + bad + ">" : bad;
    const size_t at = std::uniform_int_distribution<size_t>(0, t.size())(rng);
    t.insert(t.begin() + at, token);
    const std::string path = write("utf8", lines(t));
    const std::string e = error_of([&] { Vocabulary::load(path); });
    EXPECT_THAT(e, ::testing::StartsWith(path + ":" + std::to_string(at + 1) + ": token " +
                                         quote(token) + " is not valid UTF-8 (byte " +
                                         std::to_string(special ? 2 : 0) + ")"));
  }
}

TEST_F(VocabFile, TextThatIsNotUtf8OrOutsideTheVocabularyNamesItsPlace) {
  const std::vector<std::string> t = tokens(26);
  const Vocabulary v = Vocabulary::load(write("abc", lines(t)));
  std::mt19937 rng(9);
  for (int trial = 0; trial < 50; ++trial) {
    std::string s(std::uniform_int_distribution<size_t>(1, 2000)(rng), 'a');
    for (char& c : s) c = static_cast<char>('a' + rng() % 22);
    const size_t at = std::uniform_int_distribution<size_t>(0, s.size())(rng);
    s.insert(at, trial % 2 ? "\xC3" : "\x9F");
    EXPECT_EQ(error_of([&] { v.encode(s); }),
              quote(s) + " is not valid UTF-8 (byte " + std::to_string(at) + ")");
    s.erase(at, 1);
    s.insert(at, "Z");
    EXPECT_EQ(error_of([&] { v.encode(s); }), "character 'Z' at column " + std::to_string(at + 1) +
                                                  " of " + quote(s) + " is not in the vocabulary");
    EXPECT_LT(quote(s).size(), 80u);
  }
}

// A vocabulary against its model's ids: random permutations (a special token moved), sizes
// off by a few tokens either way, and the good one.
TEST_F(VocabFile, ModelChecksNameTheSizeOrWhichSpecialTokenSitsWhere) {
  std::mt19937 rng(13);
  for (int trial = 0; trial < 60; ++trial) {
    const size_t n = std::uniform_int_distribution<size_t>(5, 40)(rng);
    std::vector<std::string> t = tokens(n);
    const int64_t size = static_cast<int64_t>(t.size());
    const bool source = trial % 2 == 0;
    const std::string role = source ? "source" : "target";
    const std::string key = source ? "src_vocab" : "tgt_vocab";
    std::vector<std::string> shuffled = t;
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    const std::string path = write("model", lines(shuffled));
    const Vocabulary v = Vocabulary::load(path);
    auto id_of = [&](const std::string& tok) {
      return static_cast<int64_t>(std::find(shuffled.begin(), shuffled.end(), tok) -
                                  shuffled.begin());
    };
    // The model's ids where the file has them: accepted.
    v.check_model(role, size, id_of("<pad>"), id_of("<s>"), id_of("</s>"));
    // Another size.
    const int64_t other =
        size + (trial % 3 == 0 ? -1 : std::uniform_int_distribution<int>(1, 5)(rng));
    EXPECT_EQ(
        error_of([&] { v.check_model(role, other, id_of("<pad>"), id_of("<s>"), id_of("</s>")); }),
        role + " vocabulary '" + path + "' has " + std::to_string(size) + " tokens, the model's " +
            key + " is " + std::to_string(other));
    // A special token's id moved: the one the role requires, or any other it holds.
    const std::vector<std::pair<std::string, std::string>> specials = {
        {"<pad>", "pad_id"}, {"<s>", "bos_id"}, {"</s>", "eos_id"}};
    const size_t which = static_cast<size_t>(trial / 2) % 3;
    const auto& [tok, id_key] = specials[which];
    int64_t moved = std::uniform_int_distribution<int64_t>(0, size - 1)(rng);
    if (moved == id_of(tok)) moved = (moved + 1) % size;
    int64_t ids[3] = {id_of("<pad>"), id_of("<s>"), id_of("</s>")};
    ids[which] = moved;
    EXPECT_EQ(error_of([&] { v.check_model(role, size, ids[0], ids[1], ids[2]); }),
              role + " vocabulary '" + path + "' has " + tok + " at id " +
                  std::to_string(id_of(tok)) + " (line " + std::to_string(id_of(tok) + 1) +
                  "), the model's " + id_key + " is " + std::to_string(moved) + " (line " +
                  std::to_string(moved + 1) + " holds " + quote(shuffled[moved]) + ")");
  }
  // A required token missing: <pad> from a source vocabulary, </s> from a target one.
  const std::vector<std::string> t = tokens(10);
  std::vector<std::string> no_pad(t.begin() + 1, t.end());
  const std::string path = write("nopad", lines(no_pad));
  const Vocabulary v = Vocabulary::load(path);
  EXPECT_EQ(error_of([&] { v.check_model("source", 12, 0, 0, 1); }),
            "source vocabulary '" + path +
                "' has no <pad> token; the model's pad_id is 0 (line 1 "
                "holds '<s>')");
  v.check_model("target", 12, 0, 0, 1);  // a target vocabulary may do without <pad>
  EXPECT_EQ(error_of([&] { v.check_model("target", 12, -1, 0, 40); }),
            "target vocabulary '" + path +
                "' has </s> at id 1 (line 2), the model's eos_id is 40 "
                "(the vocabulary has 12 tokens)");
  v.check_model("target", -1, -1, -1, -1);  // a model without these keys: nothing to check
}

}  // namespace
}  // namespace kiln
